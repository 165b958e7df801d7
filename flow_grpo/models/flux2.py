"""FLUX.2 adapters: ``Flux2Pipeline`` (FLUX.2-dev: a Mistral-3 text encoder, embedded guidance) and
``Flux2KleinPipeline`` (FLUX.2-klein: a Qwen3 text encoder, true CFG unless the folder is step-distilled).

Latents: the FLUX.2 VAE (32 channels, spatial factor 8) is followed by a 2x2 patchify (``C -> 4C``) and a
batch-norm normalisation with the VAE's running statistics; the transformer sees one token per 2x2 latent patch,
``(B, (h/2)(w/2), 4C)`` with 4-axis position ids ``(t, row, col, l) = (0, r, c, 0)`` (text: ``(0, 0, 0, l)``).
Model space here is those tokens; ``noise_shape`` is the patchified ``(4C, h/2, w/2)`` the pipeline draws its noise
in (``prepare_latents``), so ``unpack(x)`` is what the pipeline's ``latents=`` takes.

Text: the encoder's hidden states at three layers, stacked along the channel dim (``(10, 20, 30)`` for Mistral-3,
``(9, 18, 27)`` for Qwen3), padded to ``max_sequence_length`` tokens without a mask (the padding is part of the
conditioning, as in FLUX.1), so a prompt's embedding never depends on its batch.

Schedule: ``linspace(1, 1/K, K)`` sigmas with FLUX.2's empirical resolution- and step-dependent ``mu``
(``compute_empirical_mu``), applied by the folder's scheduler (exponential time shift). Timestep fed =
``(1000 sigma) / 1000`` in fp32, exactly what the pipelines feed (they divide the scheduler's timestep by 1000).
"""
from __future__ import annotations

import numpy as np
import torch

from .base import FlowModelAdapter, PromptEmbeds
from .tiny import build_tiny_flux2_pipeline, build_tiny_flux2_klein_pipeline


def _empirical_mu(image_seq_len: int, num_steps: int) -> float:
    # the pipelines' compute_empirical_mu (FLUX.2's release), imported so the two can never drift apart
    from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

    return compute_empirical_mu(image_seq_len=image_seq_len, num_steps=num_steps)


class Flux2Adapter(FlowModelAdapter):
    """FLUX.2-dev. Guidance-distilled: the guidance scale is a transformer input (``guidance_embeds``); there is no
    CFG branch, ``cfg=True`` raises."""

    kind = "flux2"
    pipeline_cls_name = "Flux2Pipeline"
    tiny = {"flux2": build_tiny_flux2_pipeline}
    evidence = ("tests/flow_grpo/test_models_flux2.py::test_flux2_dev_matches_pipeline_call_bitwise",
                "tests/flow_grpo/test_trainer_generators.py::test_generator_trains_lora_two_epochs",
                "flow", "FLUX.2-dev")
    release_max_sequence_length = 512  # Flux2Pipeline.__call__ default
    supports_cfg = False

    def __init__(self, pipe, device="cpu", dtype=torch.float32, max_sequence_length: int | None = None):
        super().__init__(pipe, device=device, dtype=dtype, max_sequence_length=max_sequence_length)
        self._ids_cache: dict[tuple[int, int], torch.Tensor] = {}
        self._current_hw: tuple[int, int] | None = None

    # ----------------------------------------------------------------- prompts
    def _encode_uncached(self, prompts: list[str]) -> PromptEmbeds:
        pe, text_ids = self.pipe.encode_prompt(prompt=prompts, device=self.device,
                                               max_sequence_length=self.max_sequence_length)
        return PromptEmbeds(prompt_embeds=pe.to(self.dtype), pooled=None, text_ids=text_ids[0])

    # ----------------------------------------------------------------- latents
    def noise_shape(self, height: int, width: int) -> tuple[int, ...]:
        h, w = self.latent_hw(height, width)
        if h % 2 or w % 2:
            raise ValueError(f"FLUX.2 patchifies 2x2 latents: height/width must be multiples of "
                             f"{2 * self.pipe.vae_scale_factor}, got ({height}, {width})")
        return (self.transformer.config.in_channels, h // 2, w // 2)

    def pack(self, latents: torch.Tensor) -> torch.Tensor:
        """(B, 4C, h/2, w/2) -> (B, (h/2)(w/2), 4C): the pipeline's ``_pack_latents``."""
        b, c, h, w = latents.shape
        return latents.reshape(b, c, h * w).permute(0, 2, 1).contiguous()

    def unpack(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """(B, (h/2)(w/2), 4C) -> (B, 4C, h/2, w/2)."""
        _, hh, ww = self.noise_shape(height, width)
        b, n, c = latents.shape
        if n != hh * ww:
            raise ValueError(f"packed latents have {n} tokens, expected {hh * ww} for {height}x{width}")
        return latents.permute(0, 2, 1).reshape(b, c, hh, ww)

    def set_resolution(self, height: int, width: int) -> None:
        _, hh, ww = self.noise_shape(height, width)
        self._current_hw = (hh, ww)

    def _token_hw(self, n: int) -> tuple[int, int]:
        hw = self._current_hw
        if hw is None or hw[0] * hw[1] != n:
            side = int(round(n ** 0.5))
            if side * side != n:
                raise ValueError("non-square FLUX.2 latents: call set_resolution(height, width) first")
            hw = (side, side)
        return hw

    def latent_ids(self, hw: tuple[int, int]) -> torch.Tensor:
        """(L, 4) position ids ``(0, row, col, 0)`` of the tokens, row-major (the pipeline's ``_prepare_latent_ids``)."""
        if hw not in self._ids_cache:
            rows, cols = hw
            ids = torch.cartesian_prod(torch.arange(1), torch.arange(rows), torch.arange(cols), torch.arange(1))
            self._ids_cache[hw] = ids.to(self.device)
        return self._ids_cache[hw]

    # ----------------------------------------------------------------- schedule
    def sigmas(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        sched = self._fresh_scheduler()
        _, hh, ww = self.noise_shape(height, width)
        sig = None if sched.config.get("use_flow_sigmas", False) else np.linspace(1.0, 1 / num_steps, num_steps)
        kwargs = {"mu": _empirical_mu(hh * ww, num_steps)} if sched.config.get("use_dynamic_shifting") else {}
        if sig is None:
            sched.set_timesteps(num_steps, device="cpu", **kwargs)
        else:
            sched.set_timesteps(sigmas=sig, device="cpu", **kwargs)
        return sched.sigmas.detach().to(torch.float32).cpu().clone()

    def timestep(self, sigma, batch: int) -> torch.Tensor:
        n = float(self.pipe.scheduler.config.num_train_timesteps)
        return (self._sigma_vec(sigma, batch) * n) / n

    # ----------------------------------------------------------------- model
    def _forward(self, x, t, pe, text_ids, guidance) -> torch.Tensor:
        # contiguous: the training path scores strided views of the stored latents, and a strided input takes
        # other matmul kernels than the rollout's (1e-7 apart: the on-policy ratio would not be exactly 1)
        x = x.contiguous()
        b, n, _ = x.shape
        ids = self.latent_ids(self._token_hw(n))
        return self.model(hidden_states=x, timestep=t, guidance=guidance, encoder_hidden_states=pe,
                          txt_ids=text_ids.unsqueeze(0).expand(b, -1, -1), img_ids=ids.unsqueeze(0).expand(b, -1, -1),
                          return_dict=False)[0]

    def predict_velocity(self, latents, sigma, embeds: PromptEmbeds, guidance_scale: float = 4.0,
                         cfg: bool = False) -> torch.Tensor:
        if cfg:
            raise ValueError("Flux2Adapter: FLUX.2-dev uses embedded guidance; cfg=True (true CFG) is not supported")
        b = latents.shape[0]
        if len(embeds) != b:
            raise ValueError(f"embeds batch {len(embeds)} != latents batch {b}")
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.full((b,), float(guidance_scale), dtype=torch.float32, device=self.device)
        return self._forward(latents.to(self.dtype), self.timestep(sigma, b), embeds.prompt_embeds,
                             embeds.text_ids, guidance).float()

    # ----------------------------------------------------------------- decode
    def vae_latents(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Tokens -> the VAE's (B, C, h, w) latents: undo the batch-norm normalisation (the VAE's running mean and
        ``sqrt(var + eps)``), unpatchify 2x2 (what ``Flux2KleinPipeline(output_type="latent")`` returns)."""
        lat = self.unpack(latents, height, width)
        bn = self.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(lat.device, lat.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + self.vae.config.batch_norm_eps).to(lat.device, lat.dtype)
        return self.pipe._unpatchify_latents(lat * std + mean)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Tokens -> uint8 images (B, H, W, 3) (``vae_latents``, then the VAE decoder)."""
        img = self.vae.decode(self.vae_latents(latents, height, width).to(self.vae.dtype), return_dict=False)[0]
        img = (img.float() / 2 + 0.5).clamp(0, 1)
        return (img * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()


class Flux2KleinAdapter(Flux2Adapter):
    """FLUX.2-klein. Base (``is_distilled=False``) folders sample with true CFG: two passes, cond then uncond with
    the empty negative prompt, ``v_u + w (v_c - v_u)`` (the pipeline's ``guidance_scale > 1``); step-distilled
    folders (``is_distilled=True``) take no guidance (``cfg=True`` raises). No guidance embedding."""

    kind = "flux2_klein"
    pipeline_cls_name = "Flux2KleinPipeline"
    tiny = {"flux2_klein": build_tiny_flux2_klein_pipeline}
    evidence = ("tests/flow_grpo/test_models_flux2.py::test_flux2_klein_matches_pipeline_call_bitwise",
                "tests/flow_grpo/test_trainer_generators.py::test_generator_trains_lora_two_epochs",
                "flow", "FLUX.2-klein")
    release_max_sequence_length = 512  # Flux2KleinPipeline.__call__ default

    def __init__(self, pipe, device="cpu", dtype=torch.float32, max_sequence_length: int | None = None):
        super().__init__(pipe, device=device, dtype=dtype, max_sequence_length=max_sequence_length)
        self.supports_cfg = not bool(pipe.config.get("is_distilled", False))
        self._neg: torch.Tensor | None = None

    def _encode_uncached(self, prompts: list[str]) -> PromptEmbeds:
        emb = super()._encode_uncached(prompts)
        if not self.supports_cfg:
            return emb
        if self._neg is None:  # the pipeline's negative prompt is always "" (encoded once)
            self._neg = super()._encode_uncached([""]).prompt_embeds
        emb.neg_prompt_embeds = self._neg
        return emb

    def clear_prompt_cache(self) -> None:
        super().clear_prompt_cache()
        self._neg = None

    def predict_velocity(self, latents, sigma, embeds: PromptEmbeds, guidance_scale: float = 4.0,
                         cfg: bool = False) -> torch.Tensor:
        b = latents.shape[0]
        if len(embeds) != b:
            raise ValueError(f"embeds batch {len(embeds)} != latents batch {b}")
        if cfg and not self.supports_cfg:
            raise ValueError("Flux2KleinAdapter: a step-distilled klein folder (is_distilled) takes no CFG")
        x, t = latents.to(self.dtype), self.timestep(sigma, b)
        v = self._forward(x, t, embeds.prompt_embeds, embeds.text_ids, None)
        if cfg:
            if embeds.neg_prompt_embeds is None:
                raise ValueError("cfg=True needs negative embeddings")
            v_u = self._forward(x, t, embeds.neg_prompt_embeds, embeds.text_ids, None)
            v = v_u + guidance_scale * (v - v_u)
        return v.float()
