"""Qwen-Image adapter (``QwenImagePipeline`` folder): a Qwen2.5-VL language model as text encoder, FLUX-style 2x2
packed latent tokens, true CFG with the pipeline's norm rescaling.

Text: ``QwenImagePipeline.encode_prompt`` (the chat template with its system prompt, the last hidden state, the
template's first 34 tokens dropped) run one prompt at a time and cached, then zero-padded to ``max_sequence_length``
tokens with a mask (``PromptEmbeds.prompt_mask``). The fixed length makes a prompt's conditioning independent of
the batch it is in (the pipeline pads to the longest prompt of its batch), so the rollout's and the training
path's chunks see identical inputs; masked padding changes the velocity only by rounding (checked in the tests).
The cost is attention over ``max_sequence_length`` text tokens: lower ``max_sequence_length`` (the pipeline
truncates at it too) to trade it against prompt length.
"""
from __future__ import annotations

import torch

from .base import PromptEmbeds
from .flux import FluxAdapter
from .tiny import build_tiny_qwen_image_pipeline


class QwenImageAdapter(FluxAdapter):
    """Qwen-Image. Model-space latents are packed tokens (B, (h/2)(w/2), 4C) as FLUX (same packing); sigmas are
    FLUX's ``linspace(1, 1/K, K)`` with the resolution-dependent ``mu`` (the folder's scheduler applies its
    exponential time shift and ``shift_terminal``). Timestep fed = ``(1000 sigma) / 1000`` in fp32, exactly what
    the pipeline feeds (it divides the scheduler's timestep by 1000; 1 ulp off sigma for some sigmas).

    CFG (``cfg=True``, the pipeline's ``true_cfg_scale``): two forward passes (cond, then uncond with the embedded
    ``negative_prompt``, default " " as in diffusers' Qwen-Image examples), ``c = v_u + w (v_c - v_u)``, then
    rescaled per token to the conditional norm, ``v = c ||v_c|| / ||c||`` (norms over the channel dim)."""

    kind = "qwen_image"
    pipeline_cls_name = "QwenImagePipeline"
    tiny = {"qwen_image": build_tiny_qwen_image_pipeline}
    evidence = ("tests/flow_grpo/test_models_qwen_image.py::test_qwen_image_batched_loop_matches_pipeline_call_bitwise",
                "tests/flow_grpo/test_trainer_video.py::test_tiny_qwen_image_trains_lora",
                "flow", "from the prompt string within 5e-6 (padding rounding)")
    release_max_sequence_length = 512  # QwenImagePipeline.__call__ default (it refuses more than 1024)
    max_sequence_length_cap = 1024
    supports_cfg = True

    def __init__(self, pipe, device="cpu", dtype=torch.float32, max_sequence_length: int | None = None,
                 negative_prompt: str = " "):
        if pipe.transformer.config.guidance_embeds:
            raise ValueError("QwenImageAdapter: guidance-distilled Qwen-Image transformers (guidance_embeds=True) "
                             "are not supported")
        super().__init__(pipe, device=device, dtype=dtype, max_sequence_length=max_sequence_length)
        if not 0 < self.max_sequence_length <= self.max_sequence_length_cap:
            raise ValueError(f"max_sequence_length must be in 1..{self.max_sequence_length_cap} "
                             f"({self.pipeline_cls_name}), got {self.max_sequence_length}")
        self.negative_prompt = negative_prompt
        self._neg: tuple[torch.Tensor, torch.Tensor] | None = None  # the padded negative embedding, encoded once

    # ----------------------------------------------------------------- prompts
    def _encode_one(self, prompt: str) -> torch.Tensor:
        pe, _ = self.pipe.encode_prompt(prompt=[prompt], device=self.device,
                                        max_sequence_length=self.max_sequence_length)
        return pe.to(self.dtype)  # (1, L, D), L <= max_sequence_length, every token valid

    def _pad(self, pe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n, length = pe.shape[1], self.max_sequence_length
        mask = torch.zeros(1, length, dtype=torch.long, device=pe.device)
        mask[:, :n] = 1
        return torch.cat([pe, pe.new_zeros(1, length - n, pe.shape[2])], dim=1), mask

    def _encode_uncached(self, prompts: list[str]) -> PromptEmbeds:
        (prompt,) = prompts
        pe, mask = self._pad(self._encode_one(prompt))
        if self._neg is None:
            self._neg = self._pad(self._encode_one(self.negative_prompt))
        npe, nmask = self._neg
        return PromptEmbeds(prompt_embeds=pe, pooled=None, neg_prompt_embeds=npe, prompt_mask=mask,
                            neg_prompt_mask=nmask)

    def clear_prompt_cache(self) -> None:
        super().clear_prompt_cache()
        self._neg = None

    # ----------------------------------------------------------------- model
    def _forward(self, x, t, embeds: torch.Tensor, mask, img_shapes) -> torch.Tensor:
        return self.model(hidden_states=x, timestep=t, guidance=None, encoder_hidden_states_mask=mask,
                          encoder_hidden_states=embeds, img_shapes=img_shapes, return_dict=False)[0]

    def predict_velocity(self, latents, sigma, embeds: PromptEmbeds, guidance_scale: float = 4.0,
                         cfg: bool = False) -> torch.Tensor:
        b, n, _ = latents.shape
        if len(embeds) != b:
            raise ValueError(f"embeds batch {len(embeds)} != latents batch {b}")
        rows, cols = self._token_hw(n)
        img_shapes = [[(1, rows, cols)]] * b
        scale = float(self.pipe.scheduler.config.num_train_timesteps)
        t = (self._sigma_vec(sigma, b) * scale) / scale
        x = latents.to(self.dtype)
        v = self._forward(x, t, embeds.prompt_embeds, embeds.prompt_mask, img_shapes)
        if cfg:
            if embeds.neg_prompt_embeds is None:
                raise ValueError("cfg=True needs negative embeddings")
            v_u = self._forward(x, t, embeds.neg_prompt_embeds, embeds.neg_prompt_mask, img_shapes)
            comb = v_u + guidance_scale * (v - v_u)
            v = comb * (torch.norm(v, dim=-1, keepdim=True) / torch.norm(comb, dim=-1, keepdim=True))
        return v.float()

    # ----------------------------------------------------------------- decode
    @torch.no_grad()
    def decode(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Packed latents -> uint8 images (B, H, W, 3): unpack, de-normalise with the VAE's per-channel
        ``latents_mean`` / ``latents_std`` (as the pipeline, ``x / (1 / std) + mean``), decode one frame."""
        cfg = self.vae.config
        lat = self.unpack(latents, height, width).unsqueeze(2).to(self.vae.dtype)  # (B, C, 1, h, w)
        mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(lat.device, lat.dtype)
        inv_std = 1.0 / torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(lat.device, lat.dtype)
        img = self.vae.decode(lat / inv_std + mean, return_dict=False)[0][:, :, 0]
        img = (img.float() / 2 + 0.5).clamp(0, 1)
        return (img * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()
