"""Wan2.1 text-to-video adapter (``WanPipeline`` folder): UMT5 text encoder, causal 3-D VAE, video latents.

Model-space latents are (B, C, F', h, w) with ``F' = (num_frames - 1) // 4 + 1`` (the VAE's temporal compression;
``scale_factor_temporal`` in its config) and ``h, w = H / 8, W / 8``; the SDE kernel is elementwise, so the
samplers run on them unchanged and the log-prob is the average over all C * F' * h * w dimensions.
``decode`` returns uint8 videos (B, F, H, W, 3). The number of frames is an adapter setting (``num_frames``,
``set_num_frames``), not a sampler argument, so the image-shaped calls ``noise_shape(H, W)`` / ``decode(x, H, W)``
keep their signatures.
"""
from __future__ import annotations

import torch

from .base import FlowModelAdapter, PromptEmbeds
from .tiny import build_tiny_wan_pipeline


class WanAdapter(FlowModelAdapter):
    """Wan2.1 T2V. CFG is two forward passes (cond, then uncond), combined ``v_u + w (v_c - v_u)``, as
    ``WanPipeline.__call__`` does (no batched [uncond; cond] pass: the result is then bitwise the pipeline's).

    Sigmas are the scheduler's own grid (``set_timesteps(K)`` on a fresh copy), so the shift is the folder's:
    ``FlowMatchEulerDiscreteScheduler(shift=s)`` or, as the released Wan2.1 Diffusers folders ship,
    ``UniPCMultistepScheduler(use_flow_sigmas=True, flow_shift=s)``. The samplers always take Euler/SDE steps on
    that grid (UniPC's multistep corrector is not reproduced; a UniPC folder is matched step-for-step only in its
    sigmas, first one snapped to 1 (see ``sigmas``), and timesteps). Timestep fed = ``1000 sigma`` (fp32), truncated to an integer when the scheduler's
    timesteps are integers (UniPC casts them to int64), so the transformer sees what the pipeline feeds it.
    Wan2.2's two-transformer (``boundary_ratio``) and ``expand_timesteps`` modes are refused."""

    kind = "wan"
    pipeline_cls_name = "WanPipeline"
    tiny = {"wan": build_tiny_wan_pipeline}
    evidence = ("tests/flow_grpo/test_models_wan.py::test_wan_ode_matches_pipeline_call_bitwise",
                "tests/flow_grpo/test_trainer_video.py::test_tiny_wan_trains_lora_on_video_rewards",
                "flow", "Wan2.1 T2V")
    release_max_sequence_length = 512  # WanPipeline.__call__ default (UMT5 tokens, zero-padded past the prompt)
    release_num_frames = 81  # WanPipeline.__call__ default
    media = "video"
    wan22 = False  # Wan2.2 subclasses (flow_grpo.models.wan22) take transformer_2 / boundary_ratio / expand_timesteps

    def __init__(self, pipe, device="cpu", dtype=torch.float32, max_sequence_length: int | None = None,
                 num_frames: int | None = None, negative_prompt: str = ""):
        if type(self) is WanAdapter or not self.wan22:
            if getattr(pipe, "transformer_2", None) is not None or pipe.config.get("boundary_ratio") is not None:
                raise ValueError("WanAdapter: a two-expert Wan2.2 pipeline (transformer_2 / boundary_ratio): use "
                                 "model.kind=wan22 (flow_grpo.models.wan22)")
            if pipe.config.get("expand_timesteps", False):
                raise ValueError("WanAdapter: expand_timesteps (Wan2.2 TI2V-5B): use model.kind=wan22")
        super().__init__(pipe, device=device, dtype=dtype, max_sequence_length=max_sequence_length)
        self.negative_prompt = negative_prompt  # the pipeline's default negative prompt is "" too
        self.set_num_frames(num_frames or self.release_num_frames)
        sched = self._fresh_scheduler()
        sched.set_timesteps(2, device="cpu")
        self.integer_timesteps = not sched.timesteps.is_floating_point()

    # ----------------------------------------------------------------- video geometry
    @property
    def temporal_factor(self) -> int:
        return int(self.pipe.vae_scale_factor_temporal)

    def set_num_frames(self, num_frames: int) -> None:
        """Frames of the next videos; must be ``1 + temporal_factor * k`` (the pipeline would silently round)."""
        f = int(num_frames)
        if f < 1 or (f - 1) % self.temporal_factor:
            raise ValueError(f"num_frames={num_frames}: Wan needs 1 + {self.temporal_factor}k frames (e.g. "
                             f"{1 + self.temporal_factor}, {1 + 4 * self.temporal_factor}, 81)")
        self.num_frames = f

    def latent_frames(self) -> int:
        return (self.num_frames - 1) // self.temporal_factor + 1

    def latent_hw(self, height: int, width: int) -> tuple[int, int]:
        f = self.pipe.vae_scale_factor_spatial
        _, ph, pw = self.transformer.config.patch_size
        if height % (f * ph) or width % (f * pw):
            raise ValueError(f"height/width ({height}, {width}) must be multiples of ({f * ph}, {f * pw}) "
                             "(VAE scale factor x transformer patch size)")
        return height // f, width // f

    def noise_shape(self, height: int, width: int) -> tuple[int, ...]:
        h, w = self.latent_hw(height, width)
        return (self.transformer.config.in_channels, self.latent_frames(), h, w)

    # ----------------------------------------------------------------- prompts
    def _encode_uncached(self, prompts: list[str]) -> PromptEmbeds:
        pe, npe = self.pipe.encode_prompt(
            prompt=prompts, negative_prompt=[self.negative_prompt] * len(prompts), do_classifier_free_guidance=True,
            max_sequence_length=self.max_sequence_length, device=self.device,
        )
        return PromptEmbeds(prompt_embeds=pe.to(self.dtype), pooled=None, neg_prompt_embeds=npe.to(self.dtype))

    # ----------------------------------------------------------------- schedule / model
    def sigmas(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        """The scheduler's grid (K+1 values, last 0). UniPC moves a first sigma of 1 down by 1e-6 (to keep its
        log-SNR finite, a solver detail); it is snapped back to 1 here, because the Flow-GRPO SDE's
        ``g = a sqrt(sigma / (1 - sigma))`` is ~1000a at 1 - 1e-6 (a first step of std ~100s) and takes its
        sigma = 1 form only at exactly 1. The timestep fed there stays UniPC's (999, see ``timestep``)."""
        sched = self._fresh_scheduler()
        sched.set_timesteps(num_steps, device="cpu")  # as WanPipeline.__call__: no resolution-dependent mu
        sig = sched.sigmas.detach().to(torch.float32).cpu().clone()
        if 0 < 1 - float(sig[0]) <= 1e-5:
            sig[0] = 1.0
        return sig

    def timestep(self, sigma, batch: int) -> torch.Tensor:
        """(B,) timesteps fed to the transformer: ``1000 sigma`` in fp32 (the FlowMatch schedulers' values), or
        ``int64(1000 sigma)`` computed in float64, at most 999, when the scheduler's timesteps are integers
        (UniPC: its first timestep is int64(999.999) = 999)."""
        s, n = self._sigma_vec(sigma, batch), float(self.pipe.scheduler.config.num_train_timesteps)
        if self.integer_timesteps:
            return (s.double() * n).long().clamp(max=int(n) - 1)
        return s * n

    def predict_velocity(self, latents, sigma, embeds: PromptEmbeds, guidance_scale: float = 5.0,
                         cfg: bool = False) -> torch.Tensor:
        b = latents.shape[0]
        if len(embeds) != b:
            raise ValueError(f"embeds batch {len(embeds)} != latents batch {b}")
        if latents.ndim != 5:
            raise ValueError(f"Wan latents must be (B, C, F, h, w), got shape {tuple(latents.shape)}")
        t, x = self.timestep(sigma, b), latents.to(self.dtype)
        v = self.model(hidden_states=x, timestep=t, encoder_hidden_states=embeds.prompt_embeds,
                       return_dict=False)[0]
        if cfg:
            if embeds.neg_prompt_embeds is None:
                raise ValueError("cfg=True needs negative embeddings")
            v_u = self.model(hidden_states=x, timestep=t, encoder_hidden_states=embeds.neg_prompt_embeds,
                             return_dict=False)[0]
            v = v_u + guidance_scale * (v - v_u)  # in the model dtype, as the pipeline combines them
        return v.float()

    # ----------------------------------------------------------------- decode
    @torch.no_grad()
    def decode(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """(B, C, F', h, w) -> uint8 videos (B, F, H, W, 3): de-normalise with the VAE's per-channel
        ``latents_mean`` / ``latents_std`` (the pipeline's ``x / (1 / std) + mean``, same rounding), decode."""
        cfg = self.vae.config
        lat = latents.to(self.vae.dtype)
        mean = torch.tensor(cfg.latents_mean).view(1, cfg.z_dim, 1, 1, 1).to(lat.device, lat.dtype)
        inv_std = 1.0 / torch.tensor(cfg.latents_std).view(1, cfg.z_dim, 1, 1, 1).to(lat.device, lat.dtype)
        video = self.vae.decode(lat / inv_std + mean, return_dict=False)[0]  # (B, 3, F, H, W) in [-1, 1]
        video = (video.float() / 2 + 0.5).clamp(0, 1)
        return (video * 255).round().to(torch.uint8).permute(0, 2, 3, 4, 1).contiguous()
