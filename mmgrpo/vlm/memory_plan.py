"""The VLM side of the memory planner (``mmgrpo plan``): Qwen-VL configs of the released models
(:data:`mmgrpo.utils.memory_plan.MODELS`) cut to any depth, their exact parameter counts (built on the meta device:
no memory), and the ``plan`` subcommand."""
from __future__ import annotations

from mmgrpo.utils.memory_plan import PLAN_HELP, _linear_lora, _meta, plan_main as _plan_main
from mmgrpo.vlm.models.adapters import get_adapter
from mmgrpo.vlm.models.real_tokenizer import QWEN_IDS

# the released token ids, from the one table the real-tokenizer builder uses (that module imports nothing heavy)
_QWEN_IDS = dict(bos_token_id=QWEN_IDS["<|endoftext|>"], eos_token_id=QWEN_IDS["<|im_end|>"],
                 pad_token_id=QWEN_IDS["<|endoftext|>"])
_QWEN_TOP = dict(image_token_id=QWEN_IDS["<|image_pad|>"], video_token_id=QWEN_IDS["<|video_pad|>"],
                 vision_start_token_id=QWEN_IDS["<|vision_start|>"], vision_end_token_id=QWEN_IDS["<|vision_end|>"])


VLM_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _truncate(idx: list[int], n: int) -> list[int]:
    """Released layer indexes kept by a depth-``n`` cut; the last kept block takes the role when none survives
    (so a truncated Qwen2.5-VL ViT still has a full-attention block, Qwen3-VL a deepstack tap)."""
    kept = [i for i in idx if i < n]
    return kept or [n - 1]


def vlm_config(spec: dict, layers: int | None = None, vision_layers: int | None = None):
    """The transformers config of ``spec`` with the LLM cut to ``layers`` and the ViT to ``vision_layers``
    (default: ``layers``; ``None`` for both = the released depth)."""
    t, v = dict(spec["text"]), dict(spec["vision"])
    if layers is not None:
        t["num_hidden_layers"] = layers
        v["depth"] = vision_layers or layers
        if "fullatt_block_indexes" in v:
            v["fullatt_block_indexes"] = _truncate(v["fullatt_block_indexes"], v["depth"])
        if "deepstack_visual_indexes" in v:
            v["deepstack_visual_indexes"] = _truncate(v["deepstack_visual_indexes"], v["depth"])
    rope = {"rope_type": "default", "rope_theta": t.pop("rope_theta"), "mrope_section": t.pop("mrope_section")}
    if t.pop("mrope_interleaved", False):
        rope["mrope_interleaved"] = True
    t.update(rope_parameters=rope, **_QWEN_IDS)
    C = get_adapter(spec["family"]).config_class()
    tie = t["tie_word_embeddings"]
    return C(text_config=t, vision_config=v, tie_word_embeddings=tie, **_QWEN_TOP)


def counts(spec: dict, layers: int | None = None, lora_r: int = 16, lora_targets=None) -> dict:
    """Exact parameter counts from the config (built on the meta device: no memory): ``all`` (everything loaded),
    ``full`` (what full fine-tuning trains), ``lora`` (adapter parameters), ``layers``, ``per_layer`` (largest
    trained block), ``hidden``, ``vocab``, ``kv`` (KV-cache bytes per token per layer, bf16)."""
    from mmgrpo.vlm.models.tiny import model_class

    cfg = vlm_config(spec, layers)
    m = _meta(lambda: model_class(spec["family"])(cfg))
    tot = sum(p.numel() for p in m.parameters())
    vis = sum(p.numel() for n, p in m.named_parameters() if "visual" in n.split("."))
    t = spec["text"]
    L = t["num_hidden_layers"] if layers is None else layers
    block = max(sum(p.numel() for p in b.parameters()) for b in m.model.language_model.layers) \
        if hasattr(m.model, "language_model") else 0
    head_dim = t.get("head_dim", t["hidden_size"] // t["num_attention_heads"])
    return {"all": tot, "full": tot - vis, "lora": _linear_lora(m, lora_targets or VLM_LORA_TARGETS, lora_r),
            "layers": L, "per_layer": block, "hidden": t["hidden_size"], "vocab": t["vocab_size"],
            "kv": 2 * t["num_key_value_heads"] * head_dim * 2}


def plan_main(argv, prog: str = "mmgrpo plan") -> int:
    """``mmgrpo plan``: exit 0 when the run fits, 1 when not, 2 on a bad argument."""
    from mmgrpo.utils.config import parse_config_cli
    from mmgrpo.vlm.config import TrainConfig

    return _plan_main(argv, "vlm", prog, lambda rest: parse_config_cli(TrainConfig, rest, prog=prog,
                                                                        description=PLAN_HELP), counts)
