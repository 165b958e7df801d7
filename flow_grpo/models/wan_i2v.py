"""Wan2.1 image-to-video adapter (``WanImageToVideoPipeline`` folder): the T2V adapter plus the first-frame
conditioning of ``WanImageToVideoPipeline.__call__``.

Per prompt, a reference image (the video's first frame) gives two conditioning inputs, both computed by the
pipeline's own methods so they are the pipeline's bit for bit:

* ``image_embeds``: the CLIP vision encoder's penultimate hidden states (``pipe.encode_image``; 257 tokens of
  width 1280 for Wan2.1 I2V's ViT-H/14), fed as ``encoder_hidden_states_image``;
* the condition video (``pipe.prepare_latents``): the image resized to the generated height/width
  (``video_processor.preprocess``), followed by ``num_frames - 1`` black frames, VAE-encoded (posterior mode) and
  normalised with the VAE's ``latents_mean`` / ``latents_std``, after a 4-channel mask (1 on the latent frame of
  the given image, 0 elsewhere; the temporal factor folded into channels). The transformer input is
  ``cat([x, mask, condition latents], channels)`` (16 + 4 + 16 = 36 channels in the release).

The condition depends on the generated size and ``num_frames``: it is computed at the resolution given by
``set_resolution`` (the sampler calls it before encoding prompts) and cached per (image, height, width, frames).
The noise, the velocity, the SDE step and the log-probs concern only the generated latents (B, C, F', h, w), as for
T2V. Reference images follow FLUX.1-Kontext's prompt-file convention (a JSONL ``image`` field,
:mod:`flow_grpo.models.reference`); every prompt needs one (the I2V transformer has no text-only mode).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import torch

from .base import PromptEmbeds
from .reference import ReferenceImages, to_pil
from .wan import WanAdapter
from .tiny import build_tiny_wan_i2v_pipeline

# WanAttnProcessor splits the cross-attention context as "everything before the last 512 tokens is the image"
# (diffusers' transformer_wan.py: image_context_length = len - 512), so the text must be exactly 512 tokens
_WAN_I2V_TEXT_TOKENS = 512


class WanI2VAdapter(ReferenceImages, WanAdapter):
    """Wan2.1 I2V (480p / 720p). CFG, sigmas, timesteps and decode are the T2V adapter's; the unconditional pass
    keeps the image conditioning (as the pipeline: only the text changes). Wan2.2's I2V modes (two transformers,
    ``expand_timesteps``) and the first-last-frame mode (``last_image``) are not supported."""

    kind = "wan_i2v"
    pipeline_cls_name = "WanImageToVideoPipeline"
    tiny = {"wan_i2v": build_tiny_wan_i2v_pipeline}
    evidence = ("tests/flow_grpo/test_models_wan_i2v.py::test_wan_i2v_ode_matches_pipeline_call_bitwise",
                "tests/flow_grpo/test_models_wan_i2v.py::test_wan_i2v_trains_from_a_jsonl_prompt_file_with_first_frames",
                "flow", "Wan2.1 I2V, first frame per prompt (JSONL)")
    reference_label = "Wan2.1 I2V"

    def __init__(self, pipe, device="cpu", dtype=torch.float32, max_sequence_length: int | None = None,
                 num_frames: int | None = None, negative_prompt: str = ""):
        # Wan2.2 A14B I2V (flow_grpo.models.wan22) has no CLIP image tokens: no image encoder, no text-length split
        self.clip_image = pipe.transformer.config.image_dim is not None
        if self.clip_image and max_sequence_length not in (None, _WAN_I2V_TEXT_TOKENS):
            raise ValueError(f"Wan2.1 I2V: max_sequence_length must be {_WAN_I2V_TEXT_TOKENS} (the transformer "
                             f"splits image and text tokens at 512 text tokens), got {max_sequence_length}")
        if not self.wan22 and (not self.clip_image or getattr(pipe, "image_encoder", None) is None):
            raise ValueError("WanI2VAdapter: the transformer has no image_dim or the folder has no image_encoder "
                             "(Wan2.2 A14B I2V: model.kind=wan22_i2v)")
        super().__init__(pipe, device=device, dtype=dtype, max_sequence_length=max_sequence_length,
                         num_frames=num_frames, negative_prompt=negative_prompt)
        self._hw: Optional[tuple[int, int]] = None
        self._image_embed_cache: dict[tuple, torch.Tensor] = {}
        self._cond_cache: dict[tuple, torch.Tensor] = {}

    def _frozen_modules(self) -> list[torch.nn.Module]:
        enc = getattr(self.pipe, "image_encoder", None)
        return super()._frozen_modules() + ([enc] if enc is not None else [])

    def set_resolution(self, height: int, width: int) -> None:
        self.latent_hw(height, width)  # validates
        self._hw = (int(height), int(width))

    def clear_prompt_cache(self) -> None:
        super().clear_prompt_cache()
        self._image_embed_cache.clear()
        self._cond_cache.clear()

    def noise_shape(self, height: int, width: int) -> tuple[int, ...]:
        """The generated latents only: ``z_dim`` channels (the transformer's input also holds the condition)."""
        h, w = self.latent_hw(height, width)
        return (self.transformer.config.out_channels, self.latent_frames(), h, w)

    # ----------------------------------------------------------------- conditioning
    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str], images: Optional[Sequence[Any]] = None) -> PromptEmbeds:
        """Text embeddings (cached by prompt) plus, per row, the CLIP image embeddings (``image_embeds``) and the
        condition latents (``cond_latents``: mask + VAE latents, (B, 4 + C, F', h, w)) of its reference image at
        the current resolution and ``num_frames``. ``images``: one per prompt; default: the reference table."""
        prompts = list(prompts)
        embeds = super().encode_prompts(prompts)
        refs = self.reference_images_for(prompts, images)
        if refs and refs[0] is None:
            raise ValueError("Wan2.1 I2V needs a reference image per prompt: a JSONL prompt file with an 'image' "
                             "field, set_reference_images({prompt: image}) or encode_prompts(prompts, images=...)")
        if self._hw is None:
            raise ValueError("Wan2.1 I2V: call set_resolution(height, width) before encode_prompts (the first-frame "
                             "condition is encoded at the generated size)")
        if not refs:
            return embeds
        keys = [self._reference_key(r) for r in refs]
        image_embeds = torch.cat([self._image_embeds(k, r) for k, r in zip(keys, refs)]) if self.clip_image else None
        cond = torch.cat([self._condition(k, r) for k, r in zip(keys, refs)])
        return dataclasses.replace(embeds, image_embeds=image_embeds, cond_latents=cond)

    def _image_embeds(self, key: tuple, image) -> torch.Tensor:
        if key not in self._image_embed_cache:
            self._image_embed_cache[key] = self.pipe.encode_image(to_pil(image), self.device).to(self.dtype)
        return self._image_embed_cache[key]

    def _condition(self, key: tuple, image) -> torch.Tensor:
        """(1, 4 + C, F', h, w): ``WanImageToVideoPipeline.prepare_latents``'s mask and condition latents (its
        noise output is discarded: zeros are passed so it draws none)."""
        (height, width), f = self._hw, self.num_frames
        ckey = (key, height, width, f)
        if ckey not in self._cond_cache:
            pixels = self.pipe.video_processor.preprocess(to_pil(image), height=height, width=width)
            pixels = pixels.to(self.device, dtype=torch.float32)
            z = self.vae.config.z_dim
            zeros = torch.zeros(1, z, self.latent_frames(), *self.latent_hw(height, width))
            _, cond = self.pipe.prepare_latents(pixels, 1, z, height, width, f, torch.float32, self.device,
                                                None, zeros)
            self._cond_cache[ckey] = cond
        return self._cond_cache[ckey]

    # ----------------------------------------------------------------- model
    def predict_velocity(self, latents, sigma, embeds: PromptEmbeds, guidance_scale: float = 5.0,
                         cfg: bool = False) -> torch.Tensor:
        b = latents.shape[0]
        if len(embeds) != b:
            raise ValueError(f"embeds batch {len(embeds)} != latents batch {b}")
        if latents.ndim != 5:
            raise ValueError(f"Wan latents must be (B, C, F, h, w), got shape {tuple(latents.shape)}")
        cond = embeds.cond_latents
        if cond is None or embeds.image_embeds is None:
            raise ValueError("Wan2.1 I2V: the embeddings carry no reference image (see encode_prompts)")
        if cond.shape[2:] != latents.shape[2:]:
            raise ValueError(f"Wan2.1 I2V: the condition was encoded for latent (F', h, w) = {tuple(cond.shape[2:])}"
                             f", the latents are {tuple(latents.shape[2:])}: call set_resolution / set_num_frames "
                             "before encode_prompts")
        t = self.timestep(sigma, b)
        # as the pipeline: concatenate in fp32, then cast the whole input to the transformer dtype
        x = torch.cat([latents.float(), cond.to(latents.device, torch.float32)], dim=1).to(self.dtype)
        img = embeds.image_embeds.to(self.dtype)
        v = self.model(hidden_states=x, timestep=t, encoder_hidden_states=embeds.prompt_embeds,
                       encoder_hidden_states_image=img, return_dict=False)[0]
        if cfg:
            if embeds.neg_prompt_embeds is None:
                raise ValueError("cfg=True needs negative embeddings")
            v_u = self.model(hidden_states=x, timestep=t, encoder_hidden_states=embeds.neg_prompt_embeds,
                             encoder_hidden_states_image=img, return_dict=False)[0]
            v = v_u + guidance_scale * (v - v_u)
        return v.float()
