"""Thin per-family adapters for the Qwen-VL families (the registry ``ADAPTERS``) and ``load_policy``.

An adapter only records what differs between families (its transformers classes, the vision module keyword used for
freezing and LoRA exclusion, the multimodal keys the processor emits, the box coordinate frame the model was trained
on, how the video time axis reaches the processor, its patch size, and the settings of its hub-free tiny random
checkpoint).  Everything else (rollouts, log-probs, the trainer, ``mmgrpo.vlm.models.tiny``, the config's check of
``model.family``) is family-agnostic: it reads the adapter and talks to the model only through ``model(**inputs)`` and
``model.generate(**inputs)``.  A new family is one ``ADAPTERS`` entry and its test (CONTRIBUTING.md, "Add a model").
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

VISION_SPECIAL_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
LLM_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelAdapter:
    """What differs between Qwen-VL families.

    model_class_name / config_class_name / processor_class_name: its ``transformers`` classes (the model loads
      with the first; the tiny builders and memory planning build configs with the second).
    box_frame: coordinate frame of boxes the model emits (a frame of ``mmgrpo.vlm.rewards.box``, where the family
      name is an alias of it) --
      ``"resized_abs"``: absolute pixels of the *processor-resized* image (Qwen2.5-VL; W = grid_w * patch);
      ``"norm1000"``: integers in [0, 1000) relative to the image (Qwen2-VL and Qwen3-VL).
    video_time: how the processor learns the sampled frame rate (``mmgrpo.video.build_video_inputs(video_time=)``) --
      ``"second_per_grid_ts"``: Qwen2.5-VL MRoPE time axis, = temporal_patch_size / sample_fps;
      ``"timestamps"``: Qwen3-VL writes ``<t seconds>`` text per temporal patch from ``video_metadata``;
      ``"none"``: Qwen2-VL has no absolute time axis (temporal index = grid slice).
    patch_size: the ViT patch side in pixels (a merged token covers ``2 * patch_size`` square).

    The hub-free tiny random checkpoint of the family (``mmgrpo.vlm.models.tiny``: tests, ``mmgrpo make-tiny``,
    smoke runs) is declared here too; the builder adds only what every family shares (the tokenizer, the ~0.2M-
    parameter text model, the special-token ids, the pixel bounds):
    tiny_text: the family's text-config keys on top of the shared ones (rope, head_dim, MoE sizes);
    tiny_vision: its whole vision-tower config;
    image_processor_class_name / video_processor_class_name / tiny_processor_kwargs: the processor parts and the
      keyword arguments both take besides ``size`` and ``patch_size``.
    """

    family: str
    model_class_name: str
    config_class_name: str
    processor_class_name: str
    vision_keywords: tuple[str, ...] = ("visual",)
    multimodal_keys: tuple[str, ...] = (
        "pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "mm_token_type_ids",
    )
    box_frame: str = "norm1000"
    video_time: str = "none"
    patch_size: int = 14
    temporal_patch_size: int = 2
    image_processor_class_name: str = "Qwen2VLImageProcessor"
    video_processor_class_name: str = "Qwen2VLVideoProcessor"
    tiny_text: Mapping[str, Any] = field(default_factory=dict, hash=False)
    tiny_vision: Mapping[str, Any] = field(default_factory=dict, hash=False)
    tiny_processor_kwargs: Mapping[str, Any] = field(default_factory=dict, hash=False)

    # --- helpers -------------------------------------------------------------------------------------------
    def model_class(self):
        return _transformers_class(self.model_class_name)

    def config_class(self):
        return _transformers_class(self.config_class_name)

    def processor_classes(self) -> tuple[Any, Any, Any]:
        """(processor, image processor, video processor) classes."""
        return tuple(_transformers_class(n) for n in (self.processor_class_name, self.image_processor_class_name,
                                                       self.video_processor_class_name))

    def is_vision_param(self, name: str) -> bool:
        return any(k in name.split(".") for k in self.vision_keywords)

    def lora_target_regex(self, targets: Sequence[str] = LLM_LORA_TARGETS) -> str:
        """peft full-match regex: the named linear layers of the language model, never the vision tower."""
        kw = "|".join(self.vision_keywords)
        return rf"^(?!.*\b(?:{kw})\b).*\.(?:{'|'.join(targets)})$"

    def video_processor_kwargs(self, num_frames: int, sample_fps: float,
                               frames_indices: Sequence[int] | None = None) -> dict[str, Any]:
        """kwargs for ``processor(..., videos=[frames], **kw)`` for pre-sampled frames at ``sample_fps``.

        transformers 5.x derives ``second_per_grid_ts`` (Qwen2.5-VL) and the Qwen3-VL timestamps from
        ``video_metadata.fps``; a bare ``fps=`` is ignored for raw frame arrays (see :mod:`mmgrpo.video.processor`).
        """
        from transformers.video_utils import VideoMetadata

        if sample_fps <= 0:
            raise ValueError(f"sample_fps must be > 0, got {sample_fps}")
        idx = list(frames_indices) if frames_indices is not None else list(range(num_frames))
        md = VideoMetadata(total_num_frames=num_frames, fps=float(sample_fps), frames_indices=idx)
        return {"do_sample_frames": False, "video_metadata": [md]}


def _transformers_class(name: str):
    import transformers

    return getattr(transformers, name)


_MROPE = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]}
# the same tiny Qwen3-VL vision tower and text settings serve its dense and MoE members
_QWEN3_TINY_TEXT = {"head_dim": 16, "rope_parameters": {**_MROPE, "mrope_interleaved": True}}
_QWEN3_TINY_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                          patch_size=16, spatial_merge_size=2, temporal_patch_size=2, deepstack_visual_indexes=[1],
                          num_position_embeddings=64, in_channels=3)
_QWEN3_TINY_PROCESSOR = dict(merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3)

# The registry: a family's name is its config.json ``model_type`` (``family=auto``) and ``model.family``'s value.
ADAPTERS: dict[str, ModelAdapter] = {
    "qwen2_vl": ModelAdapter(
        "qwen2_vl", "Qwen2VLForConditionalGeneration", "Qwen2VLConfig", "Qwen2VLProcessor",
        box_frame="norm1000", video_time="none",
        tiny_text={"rope_parameters": _MROPE},
        tiny_vision=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                         spatial_merge_size=2, temporal_patch_size=2, in_channels=3)),
    "qwen2_5_vl": ModelAdapter(
        "qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLConfig", "Qwen2_5_VLProcessor",
        box_frame="resized_abs", video_time="second_per_grid_ts",
        multimodal_keys=("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
                         "second_per_grid_ts", "mm_token_type_ids"),
        tiny_text={"rope_parameters": _MROPE},
        tiny_vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                         patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                         fullatt_block_indexes=[1], tokens_per_second=2, in_channels=3)),
    "qwen3_vl": ModelAdapter(
        "qwen3_vl", "Qwen3VLForConditionalGeneration", "Qwen3VLConfig", "Qwen3VLProcessor",
        box_frame="norm1000", video_time="timestamps", patch_size=16,
        video_processor_class_name="Qwen3VLVideoProcessor", tiny_processor_kwargs=_QWEN3_TINY_PROCESSOR,
        tiny_text=_QWEN3_TINY_TEXT, tiny_vision=_QWEN3_TINY_VISION),
    # Qwen3-VL-30B-A3B / 235B-A22B: Qwen3-VL's vision tower and processor, a sparse-MoE language model (every layer
    # routes each token to num_experts_per_tok of num_experts fused experts; those are 3-D parameters, not Linear
    # layers, so LoRA adapts the attention projections only)
    "qwen3_vl_moe": ModelAdapter(
        "qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration", "Qwen3VLMoeConfig", "Qwen3VLProcessor",
        box_frame="norm1000", video_time="timestamps", patch_size=16,
        video_processor_class_name="Qwen3VLVideoProcessor", tiny_processor_kwargs=_QWEN3_TINY_PROCESSOR,
        tiny_text={**_QWEN3_TINY_TEXT, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
        tiny_vision=_QWEN3_TINY_VISION),
}


def unknown_family(family: str, key: str = "") -> ValueError:
    """The error for a family the registry lacks: it names the registered families and the nearest one."""
    import difflib

    known = ["auto", *ADAPTERS] if key else list(ADAPTERS)
    close = difflib.get_close_matches(str(family), known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    where = f"config key {key!r}: " if key else ""
    return ValueError(f"{where}unknown model family {family!r}{hint}; the registered families "
                      f"(mmgrpo.vlm.models.adapters.ADAPTERS): {known}")


def check_family(family: str, key: str = "model.family") -> None:
    """A config's family is ``"auto"`` or registered (checked when the config is parsed, before anything loads)."""
    if family != "auto" and family not in ADAPTERS:
        raise unknown_family(family, key)


def get_adapter(family: str) -> ModelAdapter:
    if family not in ADAPTERS:
        raise unknown_family(family)
    return ADAPTERS[family]


def detect_family(path: str | os.PathLike) -> str:
    """Family from ``config.json``'s ``model_type`` (or a peft adapter's base model)."""
    path = os.fspath(path)
    cfg_path = os.path.join(path, "config.json")
    if not os.path.exists(cfg_path):
        ad = os.path.join(path, "adapter_config.json")
        if os.path.exists(ad):
            with open(ad) as f:
                return detect_family(json.load(f)["base_model_name_or_path"])
        raise FileNotFoundError(f"{cfg_path} not found: cannot detect the model family of {path!r}")
    with open(cfg_path) as f:
        mt = json.load(f).get("model_type", "")
    if mt not in ADAPTERS:
        raise ValueError(f"{cfg_path}: model_type {mt!r} is not a supported family {sorted(ADAPTERS)}")
    return mt


@dataclass
class LoraSpec:
    r: int = field(default=16, metadata={"help": "LoRA rank"})
    alpha: int = field(default=32, metadata={"help": "LoRA alpha (scale = alpha / r)"})
    dropout: float = field(default=0.0, metadata={"help": "LoRA dropout (0 keeps old/new log-probs consistent)"})
    target_modules: list[str] = field(default_factory=lambda: list(LLM_LORA_TARGETS),
                                      metadata={"help": "linear layer names in the LLM to adapt"})
    include_vision: bool = field(default=False, metadata={"help": "also adapt the vision tower (off by default)"})


def vision_token_ids(tokenizer) -> list[int]:
    ids = []
    for t in VISION_SPECIAL_TOKENS:
        i = tokenizer.convert_tokens_to_ids(t)
        if i is not None and i != tokenizer.unk_token_id:
            ids.append(int(i))
    return ids


class Policy:
    """A policy model + processor + adapter, with the frozen reference used for the KL term.

    Reference = the same model with the LoRA adapter disabled (LoRA), or a frozen deep copy (full fine-tuning,
    created lazily only when ``need_reference``).
    """

    def __init__(self, model, processor, adapter: ModelAdapter, lora: bool, ref_model=None):
        self.model = model
        self.processor = processor
        self.adapter = adapter
        self.lora = lora
        self.ref_model = ref_model
        self.suppress_token_ids = vision_token_ids(processor.tokenizer)

    @property
    def family(self) -> str:
        return self.adapter.family

    @property
    def tokenizer(self):
        return self.processor.tokenizer

    @contextlib.contextmanager
    def reference(self, model=None) -> Iterator[Any]:
        """Context yielding the frozen reference model (``model`` = the possibly accelerate-wrapped policy)."""
        model = model if model is not None else self.model
        if self.lora:
            base = getattr(model, "module", model)
            with base.disable_adapter():
                yield model
        else:
            if self.ref_model is None:
                raise RuntimeError("full fine-tuning without a reference model: load_policy(need_reference=True)")
            yield self.ref_model

    def trainable_parameters(self):
        return [p for p in self.model.parameters() if p.requires_grad]

    def trainable_state_dict(self) -> dict:
        """Only the trained weights (LoRA matrices, or all unfrozen parameters) -- what a checkpoint must hold."""
        if self.lora:
            from peft import get_peft_model_state_dict

            return {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(self.model).items()}
        names = {n for n, p in self.model.named_parameters() if p.requires_grad}
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items() if k in names}

    def load_trainable_state_dict(self, sd: dict) -> None:
        if self.lora:
            from peft import set_peft_model_state_dict

            res = set_peft_model_state_dict(self.model, sd)
            unexpected = getattr(res, "unexpected_keys", [])
            if unexpected:
                raise KeyError(f"unexpected LoRA keys in checkpoint: {unexpected[:5]}")
        else:
            missing = set(n for n, p in self.model.named_parameters() if p.requires_grad) - set(sd)
            if missing:
                raise KeyError(f"checkpoint lacks trainable weights: {sorted(missing)[:5]}")
            self.model.load_state_dict(sd, strict=False)

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        """LoRA: ``adapter_config.json`` + weights (reload with ``load_policy(base, lora_path=dir)``); full FT:
        a complete model folder.  The processor is saved alongside so the folder is self-contained."""
        self.model.save_pretrained(os.fspath(directory))
        self.processor.save_pretrained(os.fspath(directory))


def _dtype(dtype):
    import torch

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16, "auto": "auto"}
    if dtype not in table:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {sorted(table)}")
    return table[dtype]


def load_policy(
    path: str | os.PathLike,
    family: str = "auto",
    lora: LoraSpec | None = None,
    freeze_vision: bool = True,
    gradient_checkpointing: bool = False,
    dtype: Any = "float32",
    need_reference: bool = False,
    lora_path: str | os.PathLike | None = None,
    attn_implementation: str | None = "sdpa",
    device: Any = None,
) -> Policy:
    """Load a Qwen-VL checkpoint folder as a trainable ``Policy``.

    * ``family="auto"`` reads ``config.json``'s ``model_type``.
    * ``lora``: wrap with peft LoRA on the LLM's linear layers; the vision tower is excluded unless
      ``lora.include_vision``.  ``lora_path``: load an existing adapter instead (trainable).
    * ``freeze_vision``: vision tower parameters get ``requires_grad=False`` (full fine-tuning).
    * ``need_reference``: for full fine-tuning, keep a frozen copy as the KL reference.
    * ``generation_config.suppress_tokens`` is set to the vision special tokens: a sampled ``<|image_pad|>``
      would break re-scoring with pixel inputs.
    * ``dtype="bfloat16"``: every weight loads in bf16 (the vision tower casts the fp32 ``pixel_values`` to its own
      dtype). LoRA adapters are nonetheless fp32: peft upcasts them on a bf16 base (``autocast_adapter_dtype=True``,
      the default of ``get_peft_model`` and ``PeftModel.from_pretrained``, which TRL relies on too), casts the
      adapter input to fp32 and the output back to bf16; kept deliberately, since bf16 adapters would lose small
      AdamW updates (see ``mmgrpo.utils.master_weights``, which covers full fine-tuning instead).
    """
    import torch

    path = os.fspath(path)
    fam = detect_family(path) if family == "auto" else family
    adapter = get_adapter(fam)
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(path)
    processor.tokenizer.padding_side = "left"
    kwargs = {"dtype": _dtype(dtype)}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    model = adapter.model_class().from_pretrained(path, **kwargs)
    if device is not None:
        model.to(device)
    gc = model.generation_config
    sup = vision_token_ids(processor.tokenizer)
    gc.suppress_tokens = sorted(set(list(gc.suppress_tokens or []) + sup))
    if gc.pad_token_id is None:
        gc.pad_token_id = processor.tokenizer.pad_token_id

    if freeze_vision or lora is not None or lora_path is not None:
        for n, p in model.named_parameters():
            if adapter.is_vision_param(n):
                p.requires_grad_(False)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        if lora is not None or lora_path is not None:
            model.enable_input_require_grads()

    ref_model = None
    is_lora = lora is not None or lora_path is not None
    if is_lora:
        from peft import LoraConfig, PeftModel, get_peft_model

        if lora_path is not None:
            model = PeftModel.from_pretrained(model, os.fspath(lora_path), is_trainable=True)
        else:
            if lora.include_vision:
                targets: Any = list(lora.target_modules)
            else:
                targets = adapter.lora_target_regex(lora.target_modules)
            cfg = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=targets,
                             bias="none")
            model = get_peft_model(model, cfg)
            if not any(p.requires_grad for p in model.parameters()):
                raise ValueError(f"LoRA targets {lora.target_modules} matched no module of {path}")
    elif need_reference:
        ref_model = copy.deepcopy(model)
        ref_model.requires_grad_(False)
        ref_model.eval()
    model.train()  # dropout is 0 in Qwen-VL configs; train() only matters for gradient checkpointing
    del torch
    return Policy(model, processor, adapter, lora=is_lora, ref_model=ref_model)
