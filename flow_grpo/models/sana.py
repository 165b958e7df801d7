"""SANA adapter (``SanaPipeline`` folder): Gemma-2 text encoder with SANA's "complex human instruction", the 32x
deep-compression VAE (``AutoencoderDC``), a linear-attention transformer whose text cross-attention is masked.

Text: ``SanaPipeline.encode_prompt`` with ``__call__``'s defaults (its complex human instruction prepended to the
prompt, the first token and the last ``max_sequence_length - 1`` kept; the negative prompt ``""`` without the
instruction), one prompt at a time; both come with their attention masks, which the transformer's cross-attention
uses, so padding is neutral and rows batch freely. ``complex_human_instruction=None`` drops the instruction.

Model space: (B, C, h, w), h, w = H / 32, W / 32 (no packing: patch size 1 in the releases). Sigmas: the folder
scheduler's own grid (``set_timesteps(K)``; released folders ship ``DPMSolverMultistepScheduler`` with flow sigmas,
of which the samplers take the Euler/SDE steps on the same grid, its first sigma snapped to 1: see ``sigmas``). Timestep
fed = ``1000 sigma`` (an integer where the scheduler's timesteps are) times the transformer's ``timestep_scale``.
CFG: one pass on ``[uncond; cond]``, ``v_u + w (v_c - v_u)`` in fp32, as the pipeline; a learned-sigma output
(``out_channels = 2 C``) keeps its first half. The pipeline's resolution binning (``use_resolution_binning``: the
requested size snapped to a trained aspect-ratio bin, the image resized back) is not done: the adapter generates at
the size it is given.
"""
from __future__ import annotations

import inspect

import torch

from .base import FlowModelAdapter, PromptEmbeds
from .tiny import build_tiny_sana_pipeline


def _call_default(pipe, name: str):
    return inspect.signature(type(pipe).__call__).parameters[name].default


class SanaAdapter(FlowModelAdapter):
    kind = "sana"
    pipeline_cls_name = "SanaPipeline"
    tiny = {"sana": build_tiny_sana_pipeline}
    evidence = ("tests/flow_grpo/test_models_sana.py::test_sana_matches_pipeline_call_bitwise",
                "tests/flow_grpo/test_trainer_generators.py::test_generator_trains_lora_two_epochs",
                "flow", "no resolution binning")
    release_max_sequence_length = 300  # SanaPipeline.__call__ default

    def __init__(self, pipe, device="cpu", dtype=torch.float32, max_sequence_length: int | None = None,
                 negative_prompt: str = "", complex_human_instruction="release"):
        super().__init__(pipe, device=device, dtype=dtype, max_sequence_length=max_sequence_length)
        self.negative_prompt = negative_prompt
        self.complex_human_instruction = (_call_default(pipe, "complex_human_instruction")
                                          if complex_human_instruction == "release" else complex_human_instruction)
        sched = self._fresh_scheduler()
        sched.set_timesteps(2, device="cpu")
        self.integer_timesteps = not sched.timesteps.is_floating_point()

    def _encode_uncached(self, prompts: list[str]) -> PromptEmbeds:
        pe, mask, npe, nmask = self.pipe.encode_prompt(
            prompts, True, negative_prompt=self.negative_prompt, device=self.device,
            max_sequence_length=self.max_sequence_length, complex_human_instruction=self.complex_human_instruction)
        return PromptEmbeds(prompt_embeds=pe.to(self.dtype), pooled=None, neg_prompt_embeds=npe.to(self.dtype),
                            prompt_mask=mask, neg_prompt_mask=nmask)

    def sigmas(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        """The scheduler's grid (as ``SanaPipeline.__call__``: no resolution-dependent shift). DPM-Solver's flow
        sigmas start at the shifted ``1 - 1/N`` (N = num_train_timesteps; 0.99967 at shift 3), the grid's
        discretisation of sigma = 1: a first sigma within ``1/N`` of 1 is snapped to 1, because the Flow-GRPO SDE's
        ``g = a sqrt(sigma / (1 - sigma))`` takes its sigma = 1 form only there (at 0.99967 its first step would have
        a std of ~55a). The timestep fed there stays the scheduler's (999); see ``WanAdapter.sigmas``."""
        sched = self._fresh_scheduler()
        sched.set_timesteps(num_steps, device="cpu")
        sig = sched.sigmas.detach().to(torch.float32).cpu().clone()
        if 0 < 1 - float(sig[0]) <= 1 / float(sched.config.num_train_timesteps):
            sig[0] = 1.0
        return sig

    def timestep(self, sigma, batch: int) -> torch.Tensor:
        s, n = self._sigma_vec(sigma, batch), float(self.pipe.scheduler.config.num_train_timesteps)
        t = (s.double() * n).long().clamp(max=int(n) - 1) if self.integer_timesteps else s * n
        return t * self.transformer.config.timestep_scale

    def predict_velocity(self, latents, sigma, embeds: PromptEmbeds, guidance_scale: float = 4.5,
                         cfg: bool = False) -> torch.Tensor:
        b = latents.shape[0]
        if len(embeds) != b:
            raise ValueError(f"embeds batch {len(embeds)} != latents batch {b}")
        if latents.ndim != 4:
            raise ValueError(f"SANA latents must be (B, C, h, w), got shape {tuple(latents.shape)}")
        t, x = self.timestep(sigma, b), latents.to(self.dtype)
        pe, mask = embeds.prompt_embeds, embeds.prompt_mask
        if cfg:
            if embeds.neg_prompt_embeds is None:
                raise ValueError("cfg=True needs negative embeddings")
            x, t = torch.cat([x, x]), torch.cat([t, t])
            pe = torch.cat([embeds.neg_prompt_embeds, pe])
            mask = torch.cat([embeds.neg_prompt_mask, mask])
        v = self.model(x, encoder_hidden_states=pe, encoder_attention_mask=mask, timestep=t, return_dict=False)[0]
        v = v.float()
        if cfg:
            v_u, v_c = v.chunk(2)
            v = v_u + guidance_scale * (v_c - v_u)
        if self.transformer.config.out_channels // 2 == latents.shape[1]:  # learned sigma: the velocity half
            v = v.chunk(2, dim=1)[0]
        return v
