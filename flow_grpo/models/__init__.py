"""Thin per-architecture adapters over diffusers pipelines (the registry ``ADAPTERS``; docs/generators.md lists them
with what each supports), plus the hub-free tiny pipelines they declare (``TINY_BUILDERS``).

A new model is one adapter file (the ``FlowModelAdapter`` subclass with its ``kind``, ``pipeline_cls_name``, ``tiny``
builder and ``evidence``), its line in ``ADAPTERS`` and its test: everything else here is derived from the classes."""
from __future__ import annotations

import json
import os
from typing import Any, Callable

from .base import DEFAULT_LORA_TARGETS, FlowModelAdapter, PromptEmbeds
from .flux import FluxAdapter
from .flux2 import Flux2Adapter, Flux2KleinAdapter
from .flux_kontext import FluxKontextAdapter
from .hunyuan_video15 import HunyuanVideo15Adapter
from .ltx2 import LTX2Adapter
from .qwen_image import QwenImageAdapter
from .qwen_image21 import QwenImage21Adapter
from .qwen_image_edit import QwenImageEditAdapter
from .sana import SanaAdapter
from .sd3 import SD3Adapter
from .wan import WanAdapter
from .wan22 import Wan22Adapter, Wan22HighAdapter, Wan22I2VAdapter, Wan22LowAdapter, is_wan22
from .wan_i2v import WanI2VAdapter
from .z_image import ZImageAdapter

ADAPTERS = {"sd3": SD3Adapter, "flux": FluxAdapter, "flux_kontext": FluxKontextAdapter, "wan": WanAdapter,
            "wan_i2v": WanI2VAdapter, "qwen_image": QwenImageAdapter, "qwen_image_edit": QwenImageEditAdapter,
            "flux2": Flux2Adapter, "flux2_klein": Flux2KleinAdapter, "z_image": ZImageAdapter,
            "qwen_image21": QwenImage21Adapter, "wan22": Wan22Adapter, "wan22_high": Wan22HighAdapter,
            "wan22_low": Wan22LowAdapter, "wan22_i2v": Wan22I2VAdapter, "sana": SanaAdapter,
            "hunyuan_video15": HunyuanVideo15Adapter, "ltx2": LTX2Adapter}
# a pipeline class -> the first kind registered with it (``kind=auto``); the others are told apart by config below
_PIPELINE_TO_KIND: dict[str, str] = {}
for _kind, _cls in ADAPTERS.items():
    if _cls.pipeline_cls_name:
        _PIPELINE_TO_KIND.setdefault(_cls.pipeline_cls_name, _kind)
# ``model.tiny=<name>``: the hub-free tiny random pipelines each adapter class declares next to it (``tiny``)
TINY_BUILDERS: dict[str, Callable[..., Any]] = {
    name: build for cls in ADAPTERS.values() for name, build in vars(cls).get("tiny", {}).items()}
# kinds sharing a pipeline class with another, told apart by its config (model_index.json / pipe.config); the first
# matching rule wins. wan22_high / wan22_low (one A14B expert trained) are chosen by model.kind only.
_CONFIG_KINDS = {"WanPipeline": [("wan22", is_wan22)], "WanImageToVideoPipeline": [("wan22_i2v", is_wan22)]}
_KIND_ONLY = ("wan22_high", "wan22_low")


def kind_of(cls_name: str, config) -> str:
    """The adapter kind of a pipeline class and its config; ValueError if unsupported."""
    for kind, rule in _CONFIG_KINDS.get(cls_name, []):
        if rule(config):
            return kind
    if cls_name not in _PIPELINE_TO_KIND:
        raise ValueError(f"unsupported pipeline class {cls_name!r}; supported: {sorted(_PIPELINE_TO_KIND)}")
    return _PIPELINE_TO_KIND[cls_name]


def detect_kind(pipeline_dir: str) -> str:
    """Read ``model_index.json`` and map the pipeline class to an adapter kind."""
    path = os.path.join(pipeline_dir, "model_index.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: pipeline_dir must be a diffusers pipeline folder")
    with open(path) as f:
        index = json.load(f)
    try:
        return kind_of(index.get("_class_name"), index)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _dtype_kwarg() -> str:
    """``dtype`` where the installed diffusers takes it (``torch_dtype`` is deprecated there and warns on every
    load), else the older ``torch_dtype``."""
    import diffusers
    from diffusers.pipelines import pipeline_utils
    from packaging.version import Version

    if hasattr(pipeline_utils, "_resolve_dtype") or Version(diffusers.__version__).release >= (1, 0):
        return "dtype"
    return "torch_dtype"


def load_adapter(pipeline_dir: str, kind: str = "auto", device="cpu", dtype=None, max_sequence_length=None,
                 **adapter_kwargs) -> FlowModelAdapter:
    """``from_pretrained`` the pipeline folder (same path as a full-size checkpoint) and wrap it in its adapter.

    SD3 folders without T5 (``text_encoder_3`` missing from model_index or saved as null) are loaded with
    ``text_encoder_3=None, tokenizer_3=None``.  ``max_sequence_length=None`` keeps the adapter's release value
    (FLUX.1 512, SD3 256 T5 tokens; the CLIP encoders always take 77)."""
    import torch

    dtype = dtype or torch.float32
    if kind == "auto":
        kind = detect_kind(pipeline_dir)
    if kind not in ADAPTERS:
        raise ValueError(f"unknown adapter kind {kind!r}; expected 'auto' or one of {sorted(ADAPTERS)}")
    if kind == "sd3":
        from diffusers import StableDiffusion3Pipeline

        with open(os.path.join(pipeline_dir, "model_index.json")) as f:
            index = json.load(f)
        extra = {}
        te3 = index.get("text_encoder_3")
        if te3 is None or te3 == [None, None] or not os.path.isdir(os.path.join(pipeline_dir, "text_encoder_3")):
            extra = {"text_encoder_3": None, "tokenizer_3": None}
        pipe = StableDiffusion3Pipeline.from_pretrained(pipeline_dir, **{_dtype_kwarg(): dtype}, **extra)
    else:
        import diffusers

        if kind == "wan":  # a folder may name this transformer class; diffusers resolves it from sys.modules
            from . import wan_abspos  # noqa: F401
        pipe_cls = getattr(diffusers, ADAPTERS[kind].pipeline_cls_name)
        pipe = pipe_cls.from_pretrained(pipeline_dir, **{_dtype_kwarg(): dtype})
    if hasattr(pipe, "set_progress_bar_config"):
        pipe.set_progress_bar_config(disable=True)
    kw = dict(adapter_kwargs)
    if max_sequence_length is not None:
        kw["max_sequence_length"] = max_sequence_length
    return ADAPTERS[kind](pipe, device=device, dtype=dtype, **kw)


def save_tiny_pipeline(directory: str, kind: str = "sd3", seed: int = 0) -> str:
    """Build a tiny pipeline of ``kind`` (a key of ``TINY_BUILDERS``) and ``save_pretrained`` it into ``directory``."""
    if kind not in TINY_BUILDERS:
        raise ValueError(f"unknown tiny pipeline kind {kind!r}; expected one of {sorted(TINY_BUILDERS)}")
    pipe = TINY_BUILDERS[kind](seed=seed)
    pipe.save_pretrained(directory)
    return directory


def adapter_from_pipeline(pipe, **kwargs) -> FlowModelAdapter:
    return ADAPTERS[kind_of(type(pipe).__name__, pipe.config)](pipe, **kwargs)


__all__ = ["FlowModelAdapter", "PromptEmbeds", "SD3Adapter", "FluxAdapter", "FluxKontextAdapter", "WanAdapter",
           "WanI2VAdapter", "QwenImageAdapter", "QwenImageEditAdapter", "Flux2Adapter", "Flux2KleinAdapter", "ZImageAdapter", "QwenImage21Adapter",
           "Wan22Adapter", "Wan22HighAdapter", "Wan22LowAdapter", "Wan22I2VAdapter", "SanaAdapter", "HunyuanVideo15Adapter", "LTX2Adapter", "kind_of",
           "load_adapter",
           "adapter_from_pipeline",
           "detect_kind", "DEFAULT_LORA_TARGETS", "TINY_BUILDERS", "save_tiny_pipeline"]
