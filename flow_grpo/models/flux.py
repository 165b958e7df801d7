"""FLUX.1 adapter (``FluxPipeline`` folder): 2x2-packed latent tokens, embedded (distilled) guidance."""
from __future__ import annotations

import numpy as np
import torch

from .base import FlowModelAdapter, PromptEmbeds
from .sd3 import _calculate_shift
from .tiny import build_tiny_flux_pipeline


class FluxAdapter(FlowModelAdapter):
    """Model-space latents are packed tokens (B, (h/2)(w/2), 4C). FLUX-dev is guidance-distilled: the guidance
    scale is an input (``guidance_embeds=True``), there is no CFG branch; ``cfg=True`` raises. Timestep fed = sigma."""

    kind = "flux"
    pipeline_cls_name = "FluxPipeline"
    tiny = {"flux": build_tiny_flux_pipeline}
    evidence = ("tests/flow_grpo/test_models.py::test_adapter_ode_matches_diffusers_pipeline",
                "tests/flow_grpo/test_distributed_presets.py::test_every_preset_on_two_processes_matches_one_process",
                "every preset, 1 and 2 processes", "full fine-tune + FSDP2 tested (2 CPU processes)")
    release_max_sequence_length = 512  # FluxPipeline.__call__ default (FLUX.1-dev)
    supports_cfg = False  # embedded guidance (also FluxKontextAdapter, a subclass)

    def __init__(self, pipe, device="cpu", dtype=torch.float32, max_sequence_length: int | None = None):
        super().__init__(pipe, device=device, dtype=dtype, max_sequence_length=max_sequence_length)
        self._img_ids_cache: dict[tuple[int, int], torch.Tensor] = {}

    def _encode_uncached(self, prompts: list[str]) -> PromptEmbeds:
        pe, pooled, text_ids = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=prompts, device=self.device, num_images_per_prompt=1,
            max_sequence_length=self.max_sequence_length,
        )
        return PromptEmbeds(prompt_embeds=pe.to(self.dtype), pooled=pooled.to(self.dtype), text_ids=text_ids)

    def noise_shape(self, height: int, width: int) -> tuple[int, ...]:
        h, w = self.latent_hw(height, width)
        if h % 2 or w % 2:
            raise ValueError(f"FLUX packs 2x2 latent patches: latent size ({h}, {w}) must be even "
                             f"(height/width multiples of {2 * self.pipe.vae_scale_factor})")
        return (self.transformer.config.in_channels // 4, h, w)

    def pack(self, latents: torch.Tensor) -> torch.Tensor:
        """(B, C, h, w) -> (B, (h/2)(w/2), 4C)."""
        b, c, h, w = latents.shape
        x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(b, (h // 2) * (w // 2), c * 4)

    def unpack(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """(B, (h/2)(w/2), 4C) -> (B, C, h, w)."""
        h, w = self.latent_hw(height, width)
        b, n, c4 = latents.shape
        if n != (h // 2) * (w // 2):
            raise ValueError(f"packed latents have {n} tokens, expected {(h // 2) * (w // 2)} for {height}x{width}")
        x = latents.view(b, h // 2, w // 2, c4 // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
        return x.reshape(b, c4 // 4, h, w)

    def img_ids(self, num_tokens_hw: tuple[int, int]) -> torch.Tensor:
        """(L, 3) position ids (0, row, col) of the packed tokens."""
        if num_tokens_hw not in self._img_ids_cache:
            hh, ww = num_tokens_hw
            ids = torch.zeros(hh, ww, 3)
            ids[..., 1] = torch.arange(hh)[:, None]
            ids[..., 2] = torch.arange(ww)[None, :]
            self._img_ids_cache[num_tokens_hw] = ids.reshape(hh * ww, 3).to(self.device, self.dtype)
        return self._img_ids_cache[num_tokens_hw]

    def sigmas(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        sched = self._fresh_scheduler()
        h, w = self.latent_hw(height, width)
        seq = (h // 2) * (w // 2)
        kwargs = {}
        if sched.config.get("use_dynamic_shifting", False):
            kwargs["mu"] = _calculate_shift(seq, sched.config.get("base_image_seq_len", 256),
                                            sched.config.get("max_image_seq_len", 4096),
                                            sched.config.get("base_shift", 0.5), sched.config.get("max_shift", 1.15))
        sched.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps), device="cpu", **kwargs)
        return sched.sigmas.detach().to(torch.float32).cpu().clone()

    def predict_velocity(self, latents, sigma, embeds: PromptEmbeds, guidance_scale: float = 3.5,
                         cfg: bool = False) -> torch.Tensor:
        if cfg:
            raise ValueError("FluxAdapter: FLUX uses embedded guidance; cfg=True (true CFG) is not supported")
        b, n, _ = latents.shape
        if len(embeds) != b:
            raise ValueError(f"embeds batch {len(embeds)} != latents batch {b}")
        hw = self._token_hw(n)
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.full((b,), float(guidance_scale), dtype=torch.float32, device=self.device)
        return self.model(
            hidden_states=latents.to(self.dtype), timestep=self._sigma_vec(sigma, b), guidance=guidance,
            pooled_projections=embeds.pooled, encoder_hidden_states=embeds.prompt_embeds,
            txt_ids=embeds.text_ids, img_ids=self.img_ids(hw), return_dict=False,
        )[0].float()

    def _token_hw(self, n: int) -> tuple[int, int]:
        """(rows, cols) of the packed token grid of ``n`` tokens: from ``set_resolution``, else square."""
        hw = getattr(self, "_current_hw", None)
        if hw is None or hw[0] * hw[1] != n:
            side = int(round(n ** 0.5))
            if side * side != n:
                raise ValueError("non-square FLUX latents: call set_resolution(height, width) first")
            hw = (side, side)
        return hw

    def set_resolution(self, height: int, width: int) -> None:
        h, w = self.latent_hw(height, width)
        self._current_hw = (h // 2, w // 2)
