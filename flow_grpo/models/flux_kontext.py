"""FLUX.1-Kontext adapter (``FluxKontextPipeline`` folder): image editing with a reference image as context tokens.

Kontext is the FLUX transformer fed two token sets: the generated image's packed latents (position ids
``(0, row, col)``) followed by the reference image's packed VAE latents (ids ``(1, row, col)``, the first index set
to 1). The transformer's output is sliced back to the generated tokens, so the velocity, the SDE kernel and the
log-probs only ever see the generated image; the context is conditioning, like the text.

Reference images travel with the prompt embeddings (``PromptEmbeds.cond_latents``, the unpacked VAE latents) and
are given per prompt, either explicitly (``encode_prompts(prompts, images=[...])``) or through a prompt -> image
table (``set_reference_images`` / ``bind_reference_images``, fed from a JSONL prompt file whose lines carry an
``image`` path, see ``load_reference_table``). Without any reference the adapter is plain FLUX (text-to-image), as
``FluxKontextPipeline(image=None)`` is.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import torch

from .base import PromptEmbeds
from .flux import FluxAdapter
from .reference import ReferenceImages, load_reference_table, to_pil as _to_pil  # noqa: F401 (re-exported)
from .tiny import build_tiny_flux_kontext_pipeline


class FluxKontextAdapter(ReferenceImages, FluxAdapter):
    """FLUX.1-Kontext. Reference preprocessing follows ``FluxKontextPipeline.__call__``: with ``auto_resize`` (the
    pipeline's default ``_auto_resize=True``) the reference is resized to the preferred Kontext resolution of the
    closest aspect ratio, otherwise it keeps its size; either way the size is floored to a multiple of
    2 x the VAE scale factor, then the pipeline's image processor resizes/normalises it and the VAE encodes it
    (``argmax``: the posterior mode, no sampling). The generated size is the sampler's height/width (the pipeline's
    ``max_area`` re-sizing of the output is not applied: pass ``max_area=height*width`` to it to compare).
    FLUX.1-Kontext-dev is guidance-distilled: no true-CFG branch (``cfg=True`` raises)."""

    kind = "flux_kontext"
    pipeline_cls_name = "FluxKontextPipeline"
    tiny = {"flux_kontext": build_tiny_flux_kontext_pipeline}
    evidence = ("tests/flow_grpo/test_models_t5_kontext.py::test_kontext_ode_matches_pipeline_call_bitwise",
                "tests/flow_grpo/test_models_t5_kontext.py::test_kontext_trains_from_a_jsonl_prompt_file_with_reference_images",
                "fast", "reference image per prompt (JSONL)")
    reference_label = "FLUX-Kontext"

    def __init__(self, pipe, device="cpu", dtype=torch.float32, max_sequence_length: int | None = None,
                 auto_resize: bool = True):
        super().__init__(pipe, device=device, dtype=dtype, max_sequence_length=max_sequence_length)
        self.auto_resize = auto_resize
        self.reference_images: Optional[dict[str, Any]] = None
        self._ref_cache: dict[tuple, torch.Tensor] = {}
        self._cond_ids_cache: dict[tuple[int, int], torch.Tensor] = {}

    # ----------------------------------------------------------------- reference images
    def clear_prompt_cache(self) -> None:
        super().clear_prompt_cache()
        self._ref_cache.clear()

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str], images: Optional[Sequence[Any]] = None) -> PromptEmbeds:
        """Text embeddings (cached by prompt) plus, per row, the reference latents (cached by image path or
        content). ``images``: one reference per prompt (None entries only if all are None); default: the table."""
        prompts = list(prompts)
        embeds = super().encode_prompts(prompts)
        refs = self.reference_images_for(prompts, images)
        if not refs or refs[0] is None:
            return embeds
        lat = [self.encode_reference(r) for r in refs]
        shapes = {tuple(x.shape) for x in lat}
        if len(shapes) > 1:
            raise ValueError(f"FLUX-Kontext: reference images of one batch must have the same latent size, got "
                             f"{sorted(shapes)} (resize them, or keep auto_resize=True for same-aspect images)")
        return dataclasses.replace(embeds, cond_latents=torch.cat(lat))

    @torch.no_grad()
    def encode_reference(self, image) -> torch.Tensor:
        """(1, C, h', w') normalised VAE latents of one reference image (cached)."""
        key = self._reference_key(image)
        if key not in self._ref_cache:
            self._ref_cache[key] = self._encode_reference_uncached(_to_pil(image))
        return self._ref_cache[key]

    def _reference_size(self, pil) -> tuple[int, int]:
        """(height, width) the pipeline resizes the reference to (``FluxKontextPipeline.__call__`` step 3)."""
        from diffusers.pipelines.flux.pipeline_flux_kontext import PREFERRED_KONTEXT_RESOLUTIONS

        multiple_of = self.pipe.vae_scale_factor * 2
        height, width = self.pipe.image_processor.get_default_height_width(pil)
        if self.auto_resize:
            # Kontext was trained on these resolutions: the one with the closest aspect ratio (ties: smaller w)
            _, width, height = min((abs(width / height - w / h), w, h) for w, h in PREFERRED_KONTEXT_RESOLUTIONS)
        height, width = height // multiple_of * multiple_of, width // multiple_of * multiple_of
        if height == 0 or width == 0:
            raise ValueError(f"reference image {pil.size} is smaller than {multiple_of} px (2 x VAE scale factor)")
        return height, width

    def _encode_reference_uncached(self, pil) -> torch.Tensor:
        from diffusers.pipelines.flux.pipeline_flux_kontext import retrieve_latents

        height, width = self._reference_size(pil)
        proc = self.pipe.image_processor
        image = proc.preprocess(proc.resize(pil, height, width), height, width)
        image = image.to(device=self.device, dtype=self.dtype)
        lat = retrieve_latents(self.vae.encode(image.to(self.vae.dtype)), sample_mode="argmax")
        cfg = self.vae.config
        return ((lat - cfg.shift_factor) * cfg.scaling_factor).to(self.dtype)

    def cond_ids(self, num_tokens_hw: tuple[int, int]) -> torch.Tensor:
        """(L', 3) position ids (1, row, col) of the packed reference tokens."""
        if num_tokens_hw not in self._cond_ids_cache:
            ids = self.img_ids(num_tokens_hw).clone()
            ids[:, 0] = 1
            self._cond_ids_cache[num_tokens_hw] = ids
        return self._cond_ids_cache[num_tokens_hw]

    # ----------------------------------------------------------------- model
    def predict_velocity(self, latents, sigma, embeds: PromptEmbeds, guidance_scale: float = 3.5,
                         cfg: bool = False) -> torch.Tensor:
        if cfg:
            raise ValueError("FluxKontextAdapter: FLUX-Kontext uses embedded guidance; cfg=True (true CFG) is not "
                             "supported")
        b, n, _ = latents.shape
        if len(embeds) != b:
            raise ValueError(f"embeds batch {len(embeds)} != latents batch {b}")
        hidden, ids = latents.to(self.dtype), self.img_ids(self._token_hw(n))
        if embeds.cond_latents is not None:
            _, _, hc, wc = embeds.cond_latents.shape
            hidden = torch.cat([hidden, self.pack(embeds.cond_latents.to(self.dtype))], dim=1)
            ids = torch.cat([ids, self.cond_ids((hc // 2, wc // 2))], dim=0)
        guidance = None
        if self.transformer.config.guidance_embeds:
            guidance = torch.full((b,), float(guidance_scale), dtype=torch.float32, device=self.device)
        # timestep = sigma, as FluxAdapter. The pipeline feeds (1000 sigma) / 1000, 1 float32 ulp off sigma for ~3%
        # of sigmas, but the transformer multiplies by 1000 first, which gives back the same float32 value
        # (checked on 1e7 random sigmas); the test's 11-step grid has such a sigma.
        out = self.model(
            hidden_states=hidden, timestep=self._sigma_vec(sigma, b), guidance=guidance, pooled_projections=embeds.pooled,
            encoder_hidden_states=embeds.prompt_embeds, txt_ids=embeds.text_ids, img_ids=ids, return_dict=False,
        )[0]
        return out[:, :n].float()  # the generated tokens; the context tokens' outputs are discarded
