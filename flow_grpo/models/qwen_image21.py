"""Qwen-Image 2.1 adapter (``QwenImage21Pipeline`` folder): a Qwen3-VL text encoder, a 16x VAE whose latents the
transformer consumes unpatched (one token per latent pixel, grouped 2x2 into the text encoder's image slots).

Text: ``QwenImage21Pipeline._get_qwen_prompt_embeds`` (its raw ChatML template with the system prompt, the last
decoder layer's output before the final norm, the system tokens dropped) run one prompt at a time and cached,
stored zero-padded to ``max_sequence_length`` with a mask (so ``PromptEmbeds`` rows stack). Padding is *not*
neutral in this transformer: the target image's RoPE frame position is the text length, padding included (the
pipeline's batched calls, which right-pad to the longest prompt, shift it for the shorter prompts). So each forward
runs the rows of one text length together on the unpadded text: a prompt's conditioning is the pipeline's
single-prompt one, bit for bit, whatever batch it is in, and a prompt's G samples are still one call. A prompt
longer than ``max_sequence_length`` is refused (the pipeline does not truncate).

Model space: packed latents (B, h w, C) (``_pack_latents``: a spatial flatten), h, w = H / 16, W / 16, both even.
Sigmas: the folder's ``sample_sigmas`` if it fixes them (then ``num_steps`` must be their count), else
``linspace(1, 1/K, K)``, with the resolution-dependent ``mu`` over the h w tokens. Timestep fed =
``(1000 sigma) / 1000`` in fp32 (the pipeline's ``t / 1000``). CFG (``cfg=True``, the pipeline's ``true_cfg_scale``
with a negative prompt): two passes, ``v_u + w (v_c - v_u)``, no norm rescale; Qwen-Image 2.1 is released to be
sampled without guidance. The pipeline's text KV cache (``use_kv_cache``) reuses the text keys across steps; the
adapter always runs the full forward (what training differentiates).
"""
from __future__ import annotations

import numpy as np
import torch

from .base import FlowModelAdapter, PromptEmbeds
from .sd3 import _calculate_shift
from .tiny import build_tiny_qwen_image21_pipeline


class QwenImage21Adapter(FlowModelAdapter):
    kind = "qwen_image21"
    pipeline_cls_name = "QwenImage21Pipeline"
    tiny = {"qwen_image21": build_tiny_qwen_image21_pipeline}
    evidence = ("tests/flow_grpo/test_models_qwen_image21.py::test_qwen_image21_matches_pipeline_call",
                "tests/flow_grpo/test_trainer_generators.py::test_generator_trains_lora_two_epochs",
                "flow", "per-prompt pipeline calls (its batched call pads)")
    release_max_sequence_length = 512  # a fixed text length of our own: the pipeline has no such setting

    def __init__(self, pipe, device="cpu", dtype=torch.float32, max_sequence_length: int | None = None,
                 negative_prompt: str = " "):
        super().__init__(pipe, device=device, dtype=dtype, max_sequence_length=max_sequence_length)
        self.negative_prompt = negative_prompt
        self._current_hw: tuple[int, int] | None = None

    # ----------------------------------------------------------------- prompts
    def _encode_one(self, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
        pe, _, image_pad = self.pipe._get_qwen_prompt_embeds([prompt], None, self.device)
        n, length = pe.shape[1], self.max_sequence_length
        if n > length:
            raise ValueError(f"prompt {prompt[:60]!r} is {n} text tokens, more than max_sequence_length={length} "
                             "(the pipeline does not truncate): raise model.max_sequence_length")
        assert not image_pad.any()  # text-to-image prompts carry no image slots
        mask = torch.zeros(1, length, dtype=torch.long, device=pe.device)
        mask[:, :n] = 1
        return torch.cat([pe, pe.new_zeros(1, length - n, pe.shape[2])], dim=1).to(self.dtype), mask

    def _encode_uncached(self, prompts: list[str]) -> PromptEmbeds:
        (prompt,) = prompts
        return self._embeds_with_negative(prompt)

    # ----------------------------------------------------------------- latents
    def latent_hw(self, height: int, width: int) -> tuple[int, int]:
        f = self.pipe.vae_scale_factor  # 16
        if height % (2 * f) or width % (2 * f):
            raise ValueError(f"Qwen-Image 2.1: height/width must be multiples of {2 * f}, got ({height}, {width})")
        return height // f, width // f

    def noise_shape(self, height: int, width: int) -> tuple[int, ...]:
        h, w = self.latent_hw(height, width)
        return (self.transformer.config.in_channels, h, w)

    def pack(self, latents: torch.Tensor) -> torch.Tensor:
        b, c, h, w = latents.shape
        return latents.reshape(b, c, h * w).transpose(1, 2).contiguous()

    def unpack(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
        h, w = self.latent_hw(height, width)
        b, n, c = latents.shape
        if n != h * w:
            raise ValueError(f"packed latents have {n} tokens, expected {h * w} for {height}x{width}")
        return latents.transpose(1, 2).reshape(b, c, h, w)

    def set_resolution(self, height: int, width: int) -> None:
        self._current_hw = self.latent_hw(height, width)

    def _token_hw(self, n: int) -> tuple[int, int]:
        hw = self._current_hw
        if hw is None or hw[0] * hw[1] != n:
            side = int(round(n ** 0.5))
            if side * side != n:
                raise ValueError("non-square Qwen-Image 2.1 latents: call set_resolution(height, width) first")
            hw = (side, side)
        return hw

    # ----------------------------------------------------------------- schedule
    def sigmas(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        sched = self._fresh_scheduler()
        fixed = self.pipe.config.get("sample_sigmas")
        if fixed is not None and len(fixed) != num_steps:
            raise ValueError(f"this Qwen-Image 2.1 folder fixes its sigmas ({len(fixed)} steps: sample_sigmas in "
                             f"model_index.json); sample.num_steps={num_steps} must be {len(fixed)}")
        sig = list(fixed) if fixed is not None else np.linspace(1.0, 1 / num_steps, num_steps)
        h, w = self.latent_hw(height, width)
        c = sched.config
        mu = _calculate_shift(h * w, c.get("base_image_seq_len", 256), c.get("max_image_seq_len", 4096),
                              c.get("base_shift", 0.5), c.get("max_shift", 1.15))
        kwargs = {"mu": mu} if c.get("use_dynamic_shifting", False) else {}
        sched.set_timesteps(sigmas=sig, device="cpu", **kwargs)
        return sched.sigmas.detach().to(torch.float32).cpu().clone()

    def timestep(self, sigma, batch: int) -> torch.Tensor:
        n = float(self.pipe.scheduler.config.num_train_timesteps)
        return (self._sigma_vec(sigma, batch) * n) / n

    # ----------------------------------------------------------------- model
    def _forward(self, x, t, pe, mask) -> torch.Tensor:
        """One transformer call per distinct text length in the batch, each on the unpadded text (see the module
        docstring: padding would move the image's RoPE frame position). A prompt's G samples share one call."""
        lengths = mask.sum(1) if mask is not None else torch.full((x.shape[0],), pe.shape[1], device=x.device)
        groups = list(dict.fromkeys(int(n) for n in lengths.tolist()))
        if len(groups) == 1:
            return self._call(x, t, pe[:, :groups[0]])
        out = torch.empty_like(x)
        for n in groups:
            idx = (lengths == n).nonzero(as_tuple=True)[0]
            out[idx] = self._call(x[idx], t[idx], pe[idx, :n])
        return out

    def _call(self, x, t, pe) -> torch.Tensor:
        b, n, _ = x.shape
        rows, cols = self._token_hw(n)
        # the text encoder's slots (none are image slots here) followed by one slot per 2x2 group of target tokens
        img_mask = torch.cat([torch.zeros(b, pe.shape[1], dtype=torch.bool, device=x.device),
                              torch.ones(b, n // 4, dtype=torch.bool, device=x.device)], dim=1)
        return self.model(hidden_states=x, timestep=t, encoder_hidden_states=pe, img_shapes=[[(1, rows, cols)]] * b,
                          img_mask=img_mask, return_dict=False)[0][:, -n:]

    def predict_velocity(self, latents, sigma, embeds: PromptEmbeds, guidance_scale: float = 4.0,
                         cfg: bool = False) -> torch.Tensor:
        b = latents.shape[0]
        if len(embeds) != b:
            raise ValueError(f"embeds batch {len(embeds)} != latents batch {b}")
        x, t = latents.to(self.dtype).contiguous(), self.timestep(sigma, b)
        v = self._forward(x, t, embeds.prompt_embeds, embeds.prompt_mask)
        if cfg:
            if embeds.neg_prompt_embeds is None:
                raise ValueError("cfg=True needs negative embeddings")
            v_u = self._forward(x, t, embeds.neg_prompt_embeds, embeds.neg_prompt_mask)
            v = v_u + guidance_scale * (v - v_u)
        return v.float()

    # ----------------------------------------------------------------- decode
    @torch.no_grad()
    def decode(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Packed latents -> uint8 images (B, H, W, 3): unpack to (B, C, 1, h, w), ``x std + mean`` with the VAE's
        per-channel statistics (the pipeline's rounding), decode one frame. The Qwen-Image 2.1 VAE decodes RGBA
        (``out_channels=4``; the pipeline returns RGBA): the rewards get it composited over white,
        ``rgb a + (1 - a)`` in [0, 1] before rounding (an RGB VAE's output is used as is)."""
        cfg = self.vae.config
        lat = self.unpack(latents, height, width).unsqueeze(2).to(self.vae.dtype)
        mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(lat.device, lat.dtype)
        std = torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(lat.device, lat.dtype)
        img = self.vae.decode(lat * std + mean, return_dict=False)[0][:, :, 0]
        img = (img.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1)
        return (over_white(img) * 255).round().to(torch.uint8).contiguous()


def over_white(img: torch.Tensor) -> torch.Tensor:
    """(..., 4) RGBA in [0, 1] -> (..., 3) RGB composited over white, ``rgb a + (1 - a)``; (..., 3) unchanged."""
    if img.shape[-1] == 3:
        return img
    rgb, a = img[..., :3], img[..., 3:]
    return rgb * a + (1 - a)
