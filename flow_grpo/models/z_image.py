"""Z-Image adapter (``ZImagePipeline`` folder: Z-Image and Z-Image-Turbo): a Qwen3 text encoder, a single-stream
transformer fed lists of per-sample latents and caption features, and the FLUX.1 VAE.

Text: ``ZImagePipeline.encode_prompt`` (Qwen3 chat template with ``enable_thinking=True``, the second-to-last
hidden state, the padding dropped) run one prompt at a time and cached, stored zero-padded to
``max_sequence_length`` with a mask (``PromptEmbeds.prompt_mask``); each forward hands the transformer the unpadded
rows, as the pipeline does, so nothing depends on the padding.

Model space: the VAE latents (B, C, h, w) themselves (the transformer patchifies 2x2 internally; h, w must be even).
The transformer predicts the negative velocity at time ``1 - sigma``: the timestep fed is ``(1000 - 1000 sigma) /
1000`` (fp32, the pipeline's ``(1000 - t) / 1000``) and ``v = -output``.

CFG (``cfg=True``): one forward on [cond; uncond] (the pipeline's batch layout), then ``v_c + w (v_c - v_u)`` (Z-Image's
form: ``w = 0`` is no guidance, standard CFG scale ``1 + w``), optionally with the pipeline's norm cap
(``cfg_normalization``: ``||v|| <= c ||v_c||`` per sample) and truncation (``cfg_truncation``: no guidance where
``1 - sigma > t``); both default off as in ``ZImagePipeline.__call__``. Z-Image-Turbo is sampled without CFG
(``guidance_scale=0``, 8-9 steps).
"""
from __future__ import annotations

import numpy as np
import torch

from .base import FlowModelAdapter, PromptEmbeds
from .sd3 import _calculate_shift
from .tiny import build_tiny_z_image_pipeline


class ZImageAdapter(FlowModelAdapter):
    kind = "z_image"
    pipeline_cls_name = "ZImagePipeline"
    tiny = {"z_image": build_tiny_z_image_pipeline}
    evidence = ("tests/flow_grpo/test_models_z_image.py::test_z_image_matches_pipeline_call_bitwise",
                "tests/flow_grpo/test_trainer_generators.py::test_generator_trains_lora_two_epochs",
                "flow", "Z-Image(-Turbo)")
    release_max_sequence_length = 512  # ZImagePipeline.__call__ default

    def __init__(self, pipe, device="cpu", dtype=torch.float32, max_sequence_length: int | None = None,
                 negative_prompt: str = "", cfg_normalization: float = 0.0, cfg_truncation: float = 1.0):
        super().__init__(pipe, device=device, dtype=dtype, max_sequence_length=max_sequence_length)
        self.negative_prompt = negative_prompt  # the pipeline's default negative prompt is ""
        self.cfg_normalization = float(cfg_normalization)
        self.cfg_truncation = float(cfg_truncation)

    # ----------------------------------------------------------------- prompts
    def _encode_one(self, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
        (pe,), _ = self.pipe.encode_prompt(prompt=[prompt], device=self.device, do_classifier_free_guidance=False,
                                           max_sequence_length=self.max_sequence_length)
        n, length = pe.shape[0], self.max_sequence_length
        mask = torch.zeros(1, length, dtype=torch.bool, device=pe.device)
        mask[:, :n] = True
        padded = torch.cat([pe, pe.new_zeros(length - n, pe.shape[1])]).unsqueeze(0)
        return padded.to(self.dtype), mask

    def _encode_uncached(self, prompts: list[str]) -> PromptEmbeds:
        (prompt,) = prompts
        return self._embeds_with_negative(prompt)

    # ----------------------------------------------------------------- latents / schedule
    def noise_shape(self, height: int, width: int) -> tuple[int, ...]:
        h, w = self.latent_hw(height, width)
        if h % 2 or w % 2:
            raise ValueError(f"Z-Image patchifies 2x2 latents: height/width must be multiples of "
                             f"{2 * self.pipe.vae_scale_factor}, got ({height}, {width})")
        return (self.transformer.in_channels, h, w)

    def sigmas(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        """linspace(1, 1/K, K) through the folder's scheduler, with the resolution-dependent ``mu`` when it uses
        dynamic shifting (the pipeline always passes ``mu``; a fixed-shift scheduler ignores it)."""
        sched = self._fresh_scheduler()
        _, h, w = self.noise_shape(height, width)
        kwargs = {}
        if sched.config.get("use_dynamic_shifting", False):
            c = sched.config
            kwargs["mu"] = _calculate_shift((h // 2) * (w // 2), c.get("base_image_seq_len", 256),
                                            c.get("max_image_seq_len", 4096), c.get("base_shift", 0.5),
                                            c.get("max_shift", 1.15))
        sched.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps).tolist(), device="cpu", **kwargs)
        return sched.sigmas.detach().to(torch.float32).cpu().clone()

    def timestep(self, sigma, batch: int) -> torch.Tensor:
        n = float(self.pipe.scheduler.config.num_train_timesteps)
        return (n - self._sigma_vec(sigma, batch) * n) / n

    # ----------------------------------------------------------------- model
    @staticmethod
    def _rows(pe: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
        return [pe[i][mask[i].bool()] for i in range(pe.shape[0])]

    def predict_velocity(self, latents, sigma, embeds: PromptEmbeds, guidance_scale: float = 5.0,
                         cfg: bool = False) -> torch.Tensor:
        b = latents.shape[0]
        if len(embeds) != b:
            raise ValueError(f"embeds batch {len(embeds)} != latents batch {b}")
        if latents.ndim != 4:
            raise ValueError(f"Z-Image latents must be (B, C, h, w), got shape {tuple(latents.shape)}")
        t = self.timestep(sigma, b)
        caps = self._rows(embeds.prompt_embeds, embeds.prompt_mask)
        x = latents.to(self.dtype)
        if cfg:
            if embeds.neg_prompt_embeds is None:
                raise ValueError("cfg=True needs negative embeddings")
            # the pipeline's truncation: no guidance at steps with 1 - sigma above cfg_truncation (per sample)
            cfg = bool((t <= self.cfg_truncation).all()) if self.cfg_truncation <= 1 else True
        if cfg:
            x, t = x.repeat(2, 1, 1, 1), t.repeat(2)
            caps = caps + self._rows(embeds.neg_prompt_embeds, embeds.neg_prompt_mask)
        out = self.model(list(x.unsqueeze(2).unbind(0)), t, caps, return_dict=False)[0]
        out = torch.stack([o.float() for o in out]).squeeze(2)
        if cfg:
            pos, neg = out[:b], out[b:]
            pred = pos + guidance_scale * (pos - neg)
            if self.cfg_normalization > 0:
                pos_norm = torch.linalg.vector_norm(pos.flatten(1), dim=1)
                new_norm = torch.linalg.vector_norm(pred.flatten(1), dim=1)
                cap = pos_norm * self.cfg_normalization
                scale = torch.where(new_norm > cap, cap / new_norm, torch.ones_like(new_norm))
                pred = pred * scale.view(-1, 1, 1, 1)
            out = pred
        return -out
