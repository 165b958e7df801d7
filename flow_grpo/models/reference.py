"""Reference images for conditioned generators (FLUX.1-Kontext, Wan2.1 I2V, Qwen-Image-Edit): one prompt-file
convention and one prompt -> image table.

Prompt file (``data.train_path`` / ``data.eval_path``, JSONL), one line per prompt, ``image`` relative to the
file's folder (or absolute); other fields are metadata for the rewards::

    {"prompt": "make the cat blue", "image": "images/cat_001.png"}

The prompt string is the key the samplers pass around, so one prompt text cannot point at two images in a run (an
error names both). Images are given as paths, PIL images or uint8 (H, W, 3) arrays / tensors.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, Mapping, Optional, Sequence

import torch

from mmgrpo.utils.media_check import DEFAULT_MAX_IMAGE_PIXELS


class ReferenceImages:
    """Mixin of an adapter whose prompts carry a reference image: the prompt -> image table
    (``set_reference_images`` / ``bind_reference_images``, which the trainer feeds from the prompt file) and
    ``reference_images_for(prompts, images)``. ``reference_label`` names the model in error messages."""

    reference_label = "this model"
    reference_images: Optional[dict[str, Any]] = None

    def set_reference_images(self, table: Optional[Mapping[str, Any]]) -> None:
        """Prompt -> reference image (path, PIL image, or uint8 (H, W, 3) array/tensor) used when
        ``encode_prompts`` gets no ``images``; once set, a prompt missing from it is an error. None: no table."""
        self.reference_images = None if table is None else dict(table)

    def bind_reference_images(self, prompts: Sequence[str], metadata: Sequence[Mapping], source: str = "") -> None:
        """Add the ``image`` field of each prompt's metadata (a JSONL prompt line) to the reference table; relative
        paths are resolved against the folder of ``source`` (the prompt file). See ``load_reference_table``."""
        table = dict(self.reference_images or {})
        table.update(load_reference_table(prompts, metadata, source, existing=table, model=self.reference_label))
        self.reference_images = table

    def _reference_for(self, prompt: str):
        if self.reference_images is None:
            return None
        if prompt not in self.reference_images:
            raise KeyError(f"{self.reference_label}: no reference image for prompt {prompt!r} (not in the reference "
                           "table)")
        return self.reference_images[prompt]

    def reference_images_for(self, prompts: Sequence[str], images: Optional[Sequence[Any]] = None) -> list:
        """One reference per prompt: ``images`` if given, else the table's (None entries when there is no table).
        A batch must not mix prompts with and without a reference."""
        refs = list(images) if images is not None else [self._reference_for(p) for p in prompts]
        if len(refs) != len(prompts):
            raise ValueError(f"{len(refs)} reference images for {len(prompts)} prompts")
        if any(r is None for r in refs) and not all(r is None for r in refs):
            raise ValueError(f"{self.reference_label}: a batch mixes prompts with and without a reference image")
        return refs

    @staticmethod
    def _reference_key(image) -> tuple:
        """Cache key of a reference: its absolute path, or its pixels' hash."""
        if isinstance(image, (str, os.PathLike)):
            return ("path", os.path.abspath(os.fspath(image)))
        pil = to_pil(image)
        return ("pixels", pil.mode, pil.size, hashlib.sha1(pil.tobytes()).hexdigest())


def to_pil(image):
    """A reference image as an RGB PIL image: path, PIL image, or uint8 (H, W, 3) numpy array / torch tensor."""
    from PIL import Image

    if isinstance(image, (str, os.PathLike)):
        path = os.fspath(image)
        try:
            with Image.open(path) as im:
                return im.convert("RGB")
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:  # the last is no OSError
            raise ValueError(f"cannot read reference image {path}: {type(exc).__name__}: {exc}") from None
    if isinstance(image, Image.Image):
        return image.convert("RGB")
    arr = image.detach().cpu().numpy() if isinstance(image, torch.Tensor) else image
    import numpy as np

    arr = np.asarray(arr)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[-1] != 3:
        raise ValueError(f"reference image array must be uint8 (H, W, 3), got {arr.dtype} {arr.shape}")
    return Image.fromarray(arr, mode="RGB")


def load_reference_table(prompts: Sequence[str], metadata: Sequence[Mapping], source: str = "",
                         existing: Optional[Mapping[str, Any]] = None, model: str = "FLUX-Kontext",
                         max_pixels: Optional[int] = DEFAULT_MAX_IMAGE_PIXELS) -> dict[str, str]:
    """Prompt -> reference image path from prompt-file metadata: a JSONL line
    ``{"prompt": "make the cat blue", "image": "images/cat.png", ...}`` (``image`` relative to the prompt file's
    folder, or absolute). Every line must have an ``image``; the same prompt text with two different images is an
    error (the prompt string is the key the samplers pass around), naming the file and the prompt. Every image is
    checked at the header level when the table is built (:func:`mmgrpo.utils.media_check.inspect_image`: not an
    image, a corrupt header or PNG chunk, more than ``max_pixels`` pixels): an error naming the prompt file, the
    prompt and the image, before the first step."""
    from mmgrpo.utils.media_check import MediaProblem, inspect_image

    base = os.path.dirname(os.path.abspath(source)) if source else os.getcwd()
    where = source or "prompts"
    checked: set = set()
    table: dict[str, str] = {}
    prior = dict(existing or {})
    for i, (prompt, meta) in enumerate(zip(prompts, metadata)):
        img = meta.get("image") if isinstance(meta, Mapping) else None
        if not isinstance(img, str) or not img:
            raise ValueError(f"{where}: prompt #{i + 1} {prompt!r}: {model} needs a string field 'image' "
                             "(reference image path) on every prompt line")
        path = img if os.path.isabs(img) else os.path.join(base, img)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{where}: prompt #{i + 1} {prompt!r}: reference image not found: {path}")
        if path not in checked:  # header check now, not when the prompt is first drawn (epoch 4, every resume)
            try:
                inspect_image(path, max_pixels)
            except MediaProblem as exc:
                raise ValueError(f"{where}: prompt #{i + 1} {prompt!r}: unusable reference image: {exc}") from None
            checked.add(path)
        old = table.get(prompt, prior.get(prompt))
        if old is not None and os.path.abspath(os.fspath(old)) != os.path.abspath(path):
            raise ValueError(f"{where}: prompt {prompt!r} appears with two reference images ({old} and {path}); "
                             "make the edit instructions unique per image")
        table[prompt] = path
    return table
