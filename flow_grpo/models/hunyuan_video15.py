"""HunyuanVideo 1.5 text-to-video adapter (``HunyuanVideo15Pipeline`` folder): a Qwen2.5-VL text model (its
third-last hidden states after the system prompt's tokens) plus a ByT5 encoder of the prompt's quoted glyph text,
a 16x/4x causal video VAE, and a transformer fed the noisy latents next to an (all-zero, text-to-video) condition.

Text: ``HunyuanVideo15Pipeline.encode_prompt`` one prompt at a time: the Qwen2.5-VL sequence (1000 tokens, masked)
and the ByT5 sequence (256 tokens, masked; all zeros with a zero mask when the prompt quotes no text), stored as
``prompt_embeds`` / ``prompt_mask`` and ``prompt_embeds_2`` / ``prompt_mask_2``; the negative prompt (default ``""``,
as the pipeline's ``None``) likewise. Masks make padding neutral: rows batch freely.

Model space: (B, C, F', h, w), F' = (frames - 1) / 4 + 1, h, w = H / 16, W / 16 (patch 1). The transformer input
is ``cat([x, zeros(C), zeros(1)], channels)`` (text-to-video: no first-frame condition, mask 0) and ``image_embeds``
zeros (B, 729, image_embed_dim), as ``__call__``. Sigmas: the folder scheduler's ``set_timesteps(sigmas=linspace(1,
0, K+1)[:-1])`` (its fixed shift applied), as the pipeline. Timestep fed = ``1000 sigma`` in the model dtype.
CFG: the folder's ``guider`` (``ClassifierFreeGuidance``) is what the pipeline combines with; the adapter does its
plain formula, cond pass then uncond pass, ``v_u + w (v_c - v_u)`` with the sampler's ``w``, and refuses a guider
with rescale, the original formulation or a step range (they would make another velocity). Image-to-video
(``HunyuanVideo15ImageToVideoPipeline``) is not covered. ``decode``: ``x / scaling_factor`` through the VAE.
"""
from __future__ import annotations

import torch

from .base import PromptEmbeds
from .wan import WanAdapter
from .tiny import build_tiny_hunyuan_video15_pipeline


class HunyuanVideo15Adapter(WanAdapter):
    """Video geometry (``num_frames`` = 1 + 4k, ``set_num_frames``) and the video decode layout are Wan's; the rest
    is HunyuanVideo 1.5's (module docstring)."""

    kind = "hunyuan_video15"
    pipeline_cls_name = "HunyuanVideo15Pipeline"
    tiny = {"hunyuan_video15": build_tiny_hunyuan_video15_pipeline}
    evidence = ("tests/flow_grpo/test_models_hunyuan_video15.py::test_hunyuan_video15_matches_pipeline_call_bitwise",
                "tests/flow_grpo/test_trainer_generators.py::test_generator_trains_lora_two_epochs",
                "flow", "T2V; I2V not covered")
    release_max_sequence_length = 1000  # the pipeline's tokenizer_max_length (fixed: not an adapter setting)
    release_num_frames = 121  # HunyuanVideo15Pipeline.__call__ default

    def __init__(self, pipe, device="cpu", dtype=torch.float32, max_sequence_length: int | None = None,
                 num_frames: int | None = None, negative_prompt: str = ""):
        if max_sequence_length not in (None, self.release_max_sequence_length):
            raise ValueError(f"HunyuanVideo 1.5: the text length is the pipeline's ({self.release_max_sequence_length}"
                             f" Qwen2.5-VL tokens, 256 ByT5 tokens), got max_sequence_length={max_sequence_length}")
        g, odd = pipe.guider, {}
        if g.guidance_rescale != 0.0:
            odd["guidance_rescale"] = g.guidance_rescale
        if g.use_original_formulation:
            odd["use_original_formulation"] = True
        if (g._start, g._stop) != (0.0, 1.0):
            odd["start/stop"] = (g._start, g._stop)
        if not g._enabled:
            odd["enabled"] = False
        if odd:
            raise ValueError(f"HunyuanVideo 1.5: the folder's guider has settings the adapter does not reproduce: "
                             f"{odd} (plain CFG only)")
        super().__init__(pipe, device=device, dtype=dtype, max_sequence_length=None, num_frames=num_frames,
                         negative_prompt=negative_prompt)

    def _frozen_modules(self) -> list[torch.nn.Module]:
        return [self.vae, self.pipe.text_encoder, self.pipe.text_encoder_2]

    # ----------------------------------------------------------------- geometry / text
    def latent_hw(self, height: int, width: int) -> tuple[int, int]:
        f, p = self.pipe.vae_scale_factor_spatial, self.transformer.config.patch_size
        if height % (f * p) or width % (f * p):
            raise ValueError(f"height/width ({height}, {width}) must be multiples of {f * p} (VAE x patch)")
        return height // f, width // f

    def noise_shape(self, height: int, width: int) -> tuple[int, ...]:
        h, w = self.latent_hw(height, width)
        return (self.pipe.num_channels_latents, self.latent_frames(), h, w)

    def _encode_uncached(self, prompts: list[str]) -> PromptEmbeds:
        def enc(p):
            return self.pipe.encode_prompt(prompt=p, device=self.device, dtype=self.dtype, batch_size=len(p))

        pe, m, pe2, m2 = enc(prompts)
        npe, nm, npe2, nm2 = enc([self.negative_prompt] * len(prompts))
        return PromptEmbeds(prompt_embeds=pe, pooled=None, neg_prompt_embeds=npe, prompt_mask=m, neg_prompt_mask=nm,
                            prompt_embeds_2=pe2, prompt_mask_2=m2, neg_prompt_embeds_2=npe2, neg_prompt_mask_2=nm2)

    # ----------------------------------------------------------------- schedule / model
    def sigmas(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        import numpy as np

        sched = self._fresh_scheduler()
        sched.set_timesteps(sigmas=np.linspace(1.0, 0.0, num_steps + 1)[:-1], device="cpu")
        return sched.sigmas.detach().to(torch.float32).cpu().clone()

    def timestep(self, sigma, batch: int) -> torch.Tensor:
        return self._sigma_vec(sigma, batch) * float(self.pipe.scheduler.config.num_train_timesteps)

    def _forward(self, x, t, pe, mask, pe2, mask2) -> torch.Tensor:
        b = x.shape[0]
        cond = torch.zeros_like(x)
        mask_c = torch.zeros(b, 1, *x.shape[2:], dtype=x.dtype, device=x.device)
        image_embeds = torch.zeros(b, self.pipe.vision_num_semantic_tokens, self.pipe.vision_states_dim,
                                   dtype=x.dtype, device=x.device)
        return self.model(hidden_states=torch.cat([x, cond, mask_c], dim=1), image_embeds=image_embeds,
                          timestep=t.to(x.dtype), encoder_hidden_states=pe, encoder_attention_mask=mask,
                          encoder_hidden_states_2=pe2, encoder_attention_mask_2=mask2, return_dict=False)[0]

    def predict_velocity(self, latents, sigma, embeds: PromptEmbeds, guidance_scale: float = 6.0,
                         cfg: bool = False) -> torch.Tensor:
        b = latents.shape[0]
        if len(embeds) != b:
            raise ValueError(f"embeds batch {len(embeds)} != latents batch {b}")
        if latents.ndim != 5:
            raise ValueError(f"HunyuanVideo 1.5 latents must be (B, C, F, h, w), got shape {tuple(latents.shape)}")
        t, x = self.timestep(sigma, b), latents.to(self.dtype)
        v = self._forward(x, t, embeds.prompt_embeds, embeds.prompt_mask, embeds.prompt_embeds_2, embeds.prompt_mask_2)
        if cfg:
            if embeds.neg_prompt_embeds is None:
                raise ValueError("cfg=True needs negative embeddings")
            v_u = self._forward(x, t, embeds.neg_prompt_embeds, embeds.neg_prompt_mask, embeds.neg_prompt_embeds_2,
                                embeds.neg_prompt_mask_2)
            v = v_u + guidance_scale * (v - v_u)
        return v.float()

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """(B, C, F', h, w) -> uint8 videos (B, F, H, W, 3): ``x / scaling_factor`` through the VAE, as ``__call__``,
        one video at a time: the VAE's causal mid-block attention mask is (B, L, L) against (B, 1, L, L) queries, so
        in diffusers 0.42.1 a batch of more than one fails to broadcast (the pipeline's own decode too)."""
        lat = latents.to(self.vae.dtype) / self.vae.config.scaling_factor
        video = torch.cat([self.vae.decode(lat[i:i + 1], return_dict=False)[0] for i in range(lat.shape[0])])
        video = (video.float() / 2 + 0.5).clamp(0, 1)
        return (video * 255).round().to(torch.uint8).permute(0, 2, 3, 4, 1).contiguous()

    def save_lora(self, directory: str) -> None:
        """``pytorch_lora_weights.safetensors`` (with its LoRA metadata) through the transformer's
        ``save_lora_adapter``: ``HunyuanVideo15Pipeline`` has no LoRA loader mixin in diffusers 0.42; load it with
        ``pipe.transformer.load_lora_adapter(directory, prefix=None)`` (the keys carry no ``transformer.`` prefix)."""
        self.transformer.save_lora_adapter(directory, adapter_name="default",
                                           weight_name="pytorch_lora_weights.safetensors")
