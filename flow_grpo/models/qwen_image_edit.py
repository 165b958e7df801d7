"""Qwen-Image-Edit adapter (``QwenImageEditPipeline`` folder): Qwen-Image conditioned on a reference image twice,
as ``QwenImageEditPipeline.__call__`` does:

* through the text encoder: the Qwen2.5-VL sees the reference image (vision tokens) with the edit instruction in
  the pipeline's edit template (``pipe.encode_prompt(prompt, image)``; the template's first 64 tokens dropped), so
  the text conditioning depends on (prompt, image); the negative prompt is encoded with the image too;
* as context tokens: the reference's VAE latents (posterior mode, ``(z - mean) / std``), packed 2x2 like the
  generated latents and appended after them; the transformer gets both grids in ``img_shapes`` (its RoPE places
  them), and its output is cut back to the generated tokens (the velocity, SDE step and log-probs only concern
  the generated image).

The reference is resized as the pipeline does: to ``reference_area`` pixels (the pipeline's 1024 x 1024) at its
aspect ratio, both sides rounded to multiples of 32 (``calculate_dimensions``), for the VAE and the VLM alike.
Everything else (sigmas, true CFG with the norm rescale, fixed-length masked text padding, decode) is the
Qwen-Image adapter's. Reference images follow FLUX.1-Kontext's prompt-file convention (a JSONL ``image`` field,
:mod:`flow_grpo.models.reference`); every prompt needs one (the pipeline has no text-only mode).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from .base import PromptEmbeds
from .qwen_image import QwenImageAdapter
from .reference import ReferenceImages, to_pil
from .tiny import build_tiny_qwen_image_edit_pipeline

RELEASE_REFERENCE_AREA = 1024 * 1024  # QwenImageEditPipeline.__call__: calculate_dimensions(1024 * 1024, ratio)


class QwenImageEditAdapter(ReferenceImages, QwenImageAdapter):
    """Qwen-Image-Edit. Text embeddings (with the reference's vision tokens) are zero-padded to a fixed
    ``max_sequence_length`` with a mask, as in :class:`QwenImageAdapter`; the default 2048 leaves room for a
    1024 x 1024 reference (~1.4k vision tokens under the released processor) plus the instruction; a longer
    embedding is refused with a message naming the prompt. The pipeline itself pads to the longest prompt of its
    batch (and does not truncate). ``reference_area`` (default the pipeline's 1024 x 1024) is the reference's
    pixel count; a smaller one makes tiny CPU runs affordable (a test patches the pipeline to match)."""

    kind = "qwen_image_edit"
    pipeline_cls_name = "QwenImageEditPipeline"
    tiny = {"qwen_image_edit": build_tiny_qwen_image_edit_pipeline}
    evidence = ("tests/flow_grpo/test_models_qwen_image_edit.py::test_qwen_edit_batched_loop_matches_pipeline_call_bitwise",
                "tests/flow_grpo/test_models_qwen_image_edit.py::test_qwen_edit_trains_from_a_jsonl_prompt_file",
                "flow", "reference image per prompt (JSONL)")
    reference_label = "Qwen-Image-Edit"
    release_max_sequence_length = 2048
    max_sequence_length_cap = 1 << 16

    def __init__(self, pipe, device="cpu", dtype=torch.float32, max_sequence_length: int | None = None,
                 negative_prompt: str = " ", reference_area: int = RELEASE_REFERENCE_AREA):
        super().__init__(pipe, device=device, dtype=dtype, max_sequence_length=max_sequence_length,
                         negative_prompt=negative_prompt)
        self.reference_area = int(reference_area)
        self._edit_cache: dict[tuple, PromptEmbeds] = {}
        self._ref_cache: dict[tuple, torch.Tensor] = {}

    def clear_prompt_cache(self) -> None:
        super().clear_prompt_cache()
        self._edit_cache.clear()
        self._ref_cache.clear()

    # ----------------------------------------------------------------- conditioning
    def reference_size(self, pil) -> tuple[int, int]:
        """(height, width) of the resized reference (the pipeline's ``calculate_dimensions``)."""
        from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit import calculate_dimensions

        width, height, _ = calculate_dimensions(self.reference_area, pil.size[0] / pil.size[1])
        return int(height), int(width)

    def _resized(self, image):
        pil = to_pil(image)
        height, width = self.reference_size(pil)
        return self.pipe.image_processor.resize(pil, height, width), height, width

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str], images: Optional[Sequence[Any]] = None) -> PromptEmbeds:
        """Per row: the instruction encoded with its reference image (padded, masked), the negative prompt encoded
        with the same image, and the reference latents (``cond_latents``, (B, C, h', w')); cached per
        (prompt, image). ``images``: one per prompt; default: the reference table."""
        prompts = list(prompts)
        refs = self.reference_images_for(prompts, images)
        if refs and refs[0] is None:
            raise ValueError("Qwen-Image-Edit needs a reference image per prompt: a JSONL prompt file with an "
                             "'image' field, set_reference_images({prompt: image}) or encode_prompts(prompts, "
                             "images=...)")
        rows = []
        for prompt, ref in zip(prompts, refs):
            key = (prompt, self._reference_key(ref))
            if key not in self._edit_cache:
                self._edit_cache[key] = self._encode_edit(prompt, ref, key[1])
            rows.append(self._edit_cache[key])
        shapes = {tuple(r.cond_latents.shape) for r in rows}
        if len(shapes) > 1:
            raise ValueError(f"Qwen-Image-Edit: reference images of one batch must have the same latent size, got "
                             f"{sorted(shapes)} (use references of one aspect ratio per batch)")
        return PromptEmbeds.cat(rows)

    def _encode_edit(self, prompt: str, ref, ref_key: tuple) -> PromptEmbeds:
        pil, height, width = self._resized(ref)
        pe, mask = self._pad(self._encode_with_image(prompt, pil))
        npe, nmask = self._pad(self._encode_with_image(self.negative_prompt, pil))
        if ref_key not in self._ref_cache:
            self._ref_cache[ref_key] = self._reference_latents(pil, height, width)
        return PromptEmbeds(prompt_embeds=pe, pooled=None, neg_prompt_embeds=npe, prompt_mask=mask,
                            neg_prompt_mask=nmask, cond_latents=self._ref_cache[ref_key])

    def _encode_with_image(self, prompt: str, pil) -> torch.Tensor:
        pe, _ = self.pipe.encode_prompt(prompt=[prompt], image=pil, device=self.device)
        if pe.shape[1] > self.max_sequence_length:
            raise ValueError(f"Qwen-Image-Edit: prompt {prompt!r} with its reference image encodes to "
                             f"{pe.shape[1]} tokens > max_sequence_length={self.max_sequence_length} (the padded "
                             "length); raise model.max_sequence_length")
        return pe.to(self.dtype)

    def _reference_latents(self, pil, height: int, width: int) -> torch.Tensor:
        """(1, C, h', w'): the pipeline's preprocess -> ``_encode_vae_image`` (posterior mode, normalised)."""
        pixels = self.pipe.image_processor.preprocess(pil, height, width).unsqueeze(2)
        pixels = pixels.to(device=self.device, dtype=self.dtype)
        lat = self.pipe._encode_vae_image(image=pixels, generator=None)  # (1, C, 1, h', w')
        return lat[:, :, 0].to(self.dtype)

    # ----------------------------------------------------------------- model
    def predict_velocity(self, latents, sigma, embeds: PromptEmbeds, guidance_scale: float = 4.0,
                         cfg: bool = False) -> torch.Tensor:
        b, n, _ = latents.shape
        if len(embeds) != b:
            raise ValueError(f"embeds batch {len(embeds)} != latents batch {b}")
        if embeds.cond_latents is None:
            raise ValueError("Qwen-Image-Edit: the embeddings carry no reference latents (see encode_prompts)")
        rows, cols = self._token_hw(n)
        hc, wc = embeds.cond_latents.shape[-2:]
        img_shapes = [[(1, rows, cols), (1, hc // 2, wc // 2)]] * b
        scale = float(self.pipe.scheduler.config.num_train_timesteps)
        t = (self._sigma_vec(sigma, b) * scale) / scale
        x = torch.cat([latents.to(self.dtype), self.pack(embeds.cond_latents.to(self.dtype))], dim=1)
        v = self._forward(x, t, embeds.prompt_embeds, embeds.prompt_mask, img_shapes)[:, :n]
        if cfg:
            if embeds.neg_prompt_embeds is None:
                raise ValueError("cfg=True needs negative embeddings")
            v_u = self._forward(x, t, embeds.neg_prompt_embeds, embeds.neg_prompt_mask, img_shapes)[:, :n]
            comb = v_u + guidance_scale * (v - v_u)
            v = comb * (torch.norm(v, dim=-1, keepdim=True) / torch.norm(comb, dim=-1, keepdim=True))
        return v.float()
