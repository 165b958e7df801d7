"""LTX-2 adapter (``LTX2Pipeline`` folder): joint audio + video generation; the video is what the rewards see and what
is trained, the audio branch is frozen (it is still sampled, jointly, because the two streams attend to each other).

* **State.** ``LTX2Pipeline.__call__`` denoises packed video tokens (B, F' h w, C) and packed audio tokens
  (B, La, C_a M) together, both with the same sigmas. The adapter's model space is the two flattened and
  concatenated, (B, N_video + N_audio), so the unchanged SDE kernel steps both and a step's log-prob is the joint
  Gaussian's (the policy's action is the audio+video latent). ``decode`` returns the video frames only (the audio
  VAE and vocoder are not run); rewards score frames.
* **Frozen audio branch.** LoRA goes on the video stream's self-attention and text cross-attention (``attn1``,
  ``attn2`` of every block) only; the audio stream, the audio<->video cross-attention and every other module stay
  at the base weights (``add_lora`` refuses other targets). The audio latents still change with training, through
  the video stream the audio attends to.
* **Text.** ``encode_prompt`` (Gemma-3 hidden states of every layer, left padded to ``max_sequence_length``, 1024 in
  the release) for the prompt and the negative prompt, then the pipeline's ``connectors`` run on the pair
  ``[negative; prompt]`` exactly as ``__call__`` batches them, giving the video and audio text streams and their
  mask (``prompt_embeds`` / ``prompt_embeds_2`` / ``prompt_mask``, the negatives likewise); cached per prompt.
* **Sigmas.** ``linspace(1, 1/K, K)`` through the folder scheduler with ``mu`` from the video token count (the
  pipeline's ``calculate_shift`` with its LTX-2 defaults), so ``shift_terminal`` etc. are the folder's. Timestep fed
  = ``1000 sigma`` (also passed as ``sigma``, LTX-2.3's input).
* **Guidance**, as ``__call__`` combines it, in x0 space (``x0 = x - sigma v``) per stream, then back to a velocity
  ``(x - x0) / sigma``: CFG on ``[uncond; cond]`` (video scale = the sampler's guidance scale when ``cfg=True``,
  audio scale ``audio_guidance_scale``), spatio-temporal guidance (an extra pass with ``stg_blocks`` perturbed),
  modality-isolation guidance (an extra pass without the audio<->video attention), and the guidance rescale. The
  defaults are the pipeline's ``__call__`` defaults (read from its signature), except ``stg_blocks``, which must
  name blocks that exist. ``cfg=False`` = the pipeline with ``guidance_scale`` and ``audio_guidance_scale`` 1.
* Not covered: image/video conditioning (``LTX2ImageToVideoPipeline``, ``LTX2ConditionPipeline``), the duration head
  (``num_frames`` is an adapter setting), prompt enhancement, two-stage upsampling, audio rewards.
"""
from __future__ import annotations

import inspect
from typing import Optional, Sequence

import numpy as np
import torch

from .base import DEFAULT_LORA_TARGETS, FlowModelAdapter, PromptEmbeds
from .tiny import build_tiny_ltx2_pipeline

_GUIDANCE = ("stg_scale", "modality_scale", "guidance_rescale", "audio_guidance_scale", "audio_stg_scale",
             "audio_modality_scale", "audio_guidance_rescale", "use_cross_timestep", "frame_rate", "motion_speed")
VIDEO_LORA_SCOPES = ("attn1", "attn2")  # the video stream's self- and text cross-attention


class LTX2Adapter(FlowModelAdapter):
    kind = "ltx2"
    pipeline_cls_name = "LTX2Pipeline"
    tiny = {"ltx2": build_tiny_ltx2_pipeline}
    evidence = ("tests/flow_grpo/test_models_ltx2.py::test_ltx2_matches_pipeline_call_bitwise",
                "tests/flow_grpo/test_trainer_generators.py::test_generator_trains_lora_two_epochs",
                "flow", "audio+video state, LoRA on the video stream only (audio branch frozen); video decoded")
    release_max_sequence_length = 1024  # LTX2Pipeline.__call__ default
    release_num_frames = 121  # the pipeline's fixed default without a duration head
    media = "video"

    def __init__(self, pipe, device="cpu", dtype=torch.float32, max_sequence_length: int | None = None,
                 num_frames: int | None = None, negative_prompt: str = "", stg_blocks: Optional[Sequence[int]] = None,
                 **guidance):
        unknown = set(guidance) - set(_GUIDANCE)
        if unknown:
            raise ValueError(f"LTX-2 adapter: unknown settings {sorted(unknown)}; known: {list(_GUIDANCE)}")
        super().__init__(pipe, device=device, dtype=dtype, max_sequence_length=max_sequence_length)
        defaults = inspect.signature(type(pipe).__call__).parameters
        g = {k: guidance.get(k, defaults[k].default) for k in _GUIDANCE}
        for k in ("stg_scale", "modality_scale", "guidance_rescale"):  # the pipeline's `audio_x or x`
            g[f"audio_{k}"] = g[f"audio_{k}"] or g[k]
        self.guidance = g
        self.negative_prompt = negative_prompt
        n_blocks = len(self.transformer.transformer_blocks)
        self.stg_blocks = list(stg_blocks if stg_blocks is not None else [n_blocks - 1])
        if g["stg_scale"] > 0 or g["audio_stg_scale"] > 0:
            if not self.stg_blocks or not all(0 <= b < n_blocks for b in self.stg_blocks):
                raise ValueError(f"LTX-2: stg_blocks {self.stg_blocks} must name blocks of the {n_blocks}-block "
                                 "transformer (the release perturbs block 28 of 48)")
        from diffusers.pipelines.ltx2.utils import conditioning_frame_rate

        self.fps = conditioning_frame_rate(g["frame_rate"], g["motion_speed"])
        self._hw: Optional[tuple[int, int]] = None
        self.set_num_frames(num_frames or self.release_num_frames)

    def _frozen_modules(self) -> list[torch.nn.Module]:
        return [self.vae, self.pipe.audio_vae, self.pipe.text_encoder, self.pipe.connectors, self.pipe.vocoder]

    # ----------------------------------------------------------------- geometry
    def set_num_frames(self, num_frames: int) -> None:
        r = self.pipe.vae_temporal_compression_ratio
        f = int(num_frames)
        if f < 1 or (f - 1) % r:
            raise ValueError(f"num_frames={num_frames}: LTX-2 needs 1 + {r}k frames")
        self.num_frames = f

    def latent_frames(self) -> int:
        return (self.num_frames - 1) // self.pipe.vae_temporal_compression_ratio + 1

    def audio_frames(self) -> int:
        """The pipeline's audio latent length for ``num_frames`` at ``frame_rate``."""
        p = self.pipe
        per_second = p.audio_sampling_rate / p.audio_hop_length / float(p.audio_vae_temporal_compression_ratio)
        return round(self.num_frames / self.guidance["frame_rate"] * per_second)

    def latent_hw(self, height: int, width: int) -> tuple[int, int]:
        f = self.pipe.vae_spatial_compression_ratio * self.transformer.config.patch_size
        if height % f or width % f:
            raise ValueError(f"height/width ({height}, {width}) must be multiples of {f}")
        r = self.pipe.vae_spatial_compression_ratio
        return height // r, width // r

    def _shapes(self, height: int, width: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """((video tokens, video width), (audio tokens, audio width)) of the packed streams."""
        h, w = self.latent_hw(height, width)
        c, p, pt = self.transformer.config.in_channels, self.transformer.config.patch_size, self.transformer.config.patch_size_t
        video = (self.latent_frames() // pt * (h // p) * (w // p), c * pt * p * p)
        a = self.pipe.audio_vae.config
        audio = (self.audio_frames(), a.latent_channels * (a.mel_bins // self.pipe.audio_vae_mel_compression_ratio))
        return video, audio

    def noise_shape(self, height: int, width: int) -> tuple[int, ...]:
        (sv, dv), (sa, da) = self._shapes(height, width)
        return (sv * dv + sa * da,)

    def set_resolution(self, height: int, width: int) -> None:
        self._hw = (int(height), int(width))

    def split(self, x: torch.Tensor, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Model-space (B, N) -> packed video (B, Sv, Dv) and audio (B, Sa, Da) tokens (views)."""
        (sv, dv), (sa, da) = self._shapes(height, width)
        if x.shape[1:] != (sv * dv + sa * da,):
            raise ValueError(f"LTX-2 latents must be (B, {sv * dv + sa * da}) at {height}x{width}, {self.num_frames} "
                             f"frames; got {tuple(x.shape)}")
        return x[:, :sv * dv].reshape(-1, sv, dv), x[:, sv * dv:].reshape(-1, sa, da)

    @staticmethod
    def join(video: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        return torch.cat([video.flatten(1), audio.flatten(1)], dim=1)

    # ----------------------------------------------------------------- text
    def _encode_uncached(self, prompts: list[str]) -> PromptEmbeds:
        (prompt,) = prompts
        p = self.pipe
        pe, m, npe, nm = p.encode_prompt(prompt=[prompt], negative_prompt=[self.negative_prompt],
                                         do_classifier_free_guidance=True, max_sequence_length=self.max_sequence_length,
                                         device=self.device)
        side = getattr(p.tokenizer, "padding_side", "left")
        video, audio, mask = p.connectors(torch.cat([npe, pe]), torch.cat([nm, m]), padding_side=side)
        d = self.dtype
        return PromptEmbeds(prompt_embeds=video[1:].to(d), pooled=None, neg_prompt_embeds=video[:1].to(d),
                            prompt_mask=mask[1:], neg_prompt_mask=mask[:1], prompt_embeds_2=audio[1:].to(d),
                            neg_prompt_embeds_2=audio[:1].to(d))

    # ----------------------------------------------------------------- schedule
    def sigmas(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift

        sched = self._fresh_scheduler()
        (sv, _), _ = self._shapes(height, width)
        c = sched.config
        mu = calculate_shift(sv, c.get("base_image_seq_len", 1024), c.get("max_image_seq_len", 4096),
                             c.get("base_shift", 0.95), c.get("max_shift", 2.05))
        sched.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps), device="cpu", mu=mu)
        return sched.sigmas.detach().to(torch.float32).cpu().clone()

    def timestep(self, sigma, batch: int) -> torch.Tensor:
        return self._sigma_vec(sigma, batch) * float(self.pipe.scheduler.config.num_train_timesteps)

    # ----------------------------------------------------------------- model
    def _forward(self, xv, xa, t, pe, pe2, mask, *, isolate=False, stg=None):
        b = xv.shape[0]
        f, (h, w) = self.latent_frames(), self._latent_hw_current()
        tr = self.transformer
        return self.model(
            hidden_states=xv.to(self.dtype), audio_hidden_states=xa.to(self.dtype), encoder_hidden_states=pe,
            audio_encoder_hidden_states=pe2, timestep=t, sigma=t, encoder_attention_mask=mask,
            audio_encoder_attention_mask=mask, num_frames=f, height=h, width=w, fps=self.fps,
            audio_num_frames=self.audio_frames(),
            video_coords=tr.rope.prepare_video_coords(b, f, h, w, xv.device, fps=self.fps),
            audio_coords=tr.audio_rope.prepare_audio_coords(b, self.audio_frames(), xa.device),
            isolate_modalities=isolate, spatio_temporal_guidance_blocks=stg, perturbation_mask=None,
            use_cross_timestep=self.guidance["use_cross_timestep"], return_dict=False)

    def _latent_hw_current(self) -> tuple[int, int]:
        return self.latent_hw(*self._hw)

    def predict_velocity(self, latents, sigma, embeds: PromptEmbeds, guidance_scale: float = 3.0,
                         cfg: bool = False) -> torch.Tensor:
        b = latents.shape[0]
        if len(embeds) != b:
            raise ValueError(f"embeds batch {len(embeds)} != latents batch {b}")
        g = self.guidance
        if self._hw is None:
            raise ValueError("LTX-2: call set_resolution(height, width) before predict_velocity (the flat latents "
                             "do not carry the video geometry)")
        xv, xa = self.split(latents.float(), *self._hw)
        t = self.timestep(sigma, b)
        s = self._sigma_vec(sigma, b).view(b, 1, 1)
        pe, pe2, mask = embeds.prompt_embeds, embeds.prompt_embeds_2, embeds.prompt_mask
        gs, ags = (guidance_scale, g["audio_guidance_scale"]) if cfg else (1.0, 1.0)
        do_cfg = gs > 1.0 or ags > 1.0  # the pipeline's do_classifier_free_guidance
        if do_cfg:
            if embeds.neg_prompt_embeds is None:
                raise ValueError("cfg=True needs negative embeddings")
            out_v, out_a = self._forward(torch.cat([xv, xv]), torch.cat([xa, xa]), torch.cat([t, t]),
                                         torch.cat([embeds.neg_prompt_embeds, pe]),
                                         torch.cat([embeds.neg_prompt_embeds_2, pe2]),
                                         torch.cat([embeds.neg_prompt_mask, mask]))
            v_u, v_c = out_v.float().chunk(2)
            a_u, a_c = out_a.float().chunk(2)
            x0v, x0a = xv - v_c * s, xa - a_c * s
            cfg_v = (gs - 1) * (x0v - (xv - v_u * s))
            cfg_a = (ags - 1) * (x0a - (xa - a_u * s))
        else:
            out_v, out_a = self._forward(xv, xa, t, pe, pe2, mask)
            x0v, x0a = xv - out_v.float() * s, xa - out_a.float() * s
            cfg_v = cfg_a = 0
        stg_v = stg_a = mod_v = mod_a = 0
        if g["stg_scale"] > 0 or g["audio_stg_scale"] > 0:
            o_v, o_a = self._forward(xv, xa, t, pe, pe2, mask, stg=self.stg_blocks)
            stg_v = g["stg_scale"] * (x0v - (xv - o_v.float() * s))
            stg_a = g["audio_stg_scale"] * (x0a - (xa - o_a.float() * s))
        if g["modality_scale"] > 1 or g["audio_modality_scale"] > 1:
            o_v, o_a = self._forward(xv, xa, t, pe, pe2, mask, isolate=True)
            mod_v = (g["modality_scale"] - 1) * (x0v - (xv - o_v.float() * s))
            mod_a = (g["audio_modality_scale"] - 1) * (x0a - (xa - o_a.float() * s))
        gv, ga = x0v + cfg_v + stg_v + mod_v, x0a + cfg_a + stg_a + mod_a
        from diffusers.pipelines.ltx2.pipeline_ltx2 import rescale_noise_cfg

        if g["guidance_rescale"] > 0:
            gv = rescale_noise_cfg(gv, x0v, guidance_rescale=g["guidance_rescale"])
        if g["audio_guidance_rescale"] > 0:
            ga = rescale_noise_cfg(ga, x0a, guidance_rescale=g["audio_guidance_rescale"])
        return self.join((xv - gv) / s, (xa - ga) / s)

    # ----------------------------------------------------------------- LoRA / decode
    def add_lora(self, rank: int = 32, alpha: float = 64.0, target_modules: Sequence[str] = DEFAULT_LORA_TARGETS,
                 init_lora_weights="gaussian", dropout: float = 0.0) -> list[torch.nn.Parameter]:
        """LoRA on the video stream only: every Linear named ``target_modules`` inside a block's ``attn1`` /
        ``attn2`` (module docstring); the audio branch stays frozen."""
        names = [n for n, m in self.transformer.named_modules() if isinstance(m, torch.nn.Linear)
                 and n.split(".")[2:3] and n.split(".")[2] in VIDEO_LORA_SCOPES
                 and any(n.endswith("." + t) for t in target_modules)]
        if not names:
            raise ValueError(f"LTX-2: none of the LoRA target_modules {list(target_modules)} is in the video "
                             f"stream's {VIDEO_LORA_SCOPES}")
        return super().add_lora(rank, alpha, names, init_lora_weights=init_lora_weights, dropout=dropout)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Model-space latents -> uint8 videos (B, F, H, W, 3), as ``__call__`` decodes the video (its decode noise
        scale is the decode timestep, 0 by default: no noise); the audio part is dropped."""
        p = self.pipe
        xv, _ = self.split(latents.float(), height, width)
        h, w = self.latent_hw(height, width)
        pz, pt = self.transformer.config.patch_size, self.transformer.config.patch_size_t
        lat = p._unpack_latents(xv, self.latent_frames(), h, w, pz, pt).to(self.dtype)  # the pipeline's arguments
        lat = p._denormalize_latents(lat, self.vae.latents_mean, self.vae.latents_std, self.vae.config.scaling_factor)
        timestep = None
        if self.vae.config.timestep_conditioning:
            timestep = torch.zeros(lat.shape[0], device=lat.device, dtype=lat.dtype)
        video = self.vae.decode(lat.to(self.vae.dtype), timestep, return_dict=False)[0]
        video = (video.float() / 2 + 0.5).clamp(0, 1)
        return (video * 255).round().to(torch.uint8).permute(0, 2, 3, 4, 1).contiguous()
