"""Tiny models round-trip through from_pretrained; adapters freeze / exclude the vision tower; LoRA reference."""
import json

import pytest
import torch

from mmgrpo.vlm.models.adapters import ADAPTERS, LoraSpec, detect_family, get_adapter, load_policy
from mmgrpo.vlm.models.inputs import build_prompt_item
from mmgrpo.vlm.models.tiny import (VISION_SPECIAL_TOKENS, build_tiny_model, synthetic_frames, synthetic_image)

FAMILIES = list(ADAPTERS)  # every registered family: a new one is tested here by itself


def _msgs(kind, q="what happens?"):
    return [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": q}]}]


@pytest.mark.parametrize("family", FAMILIES)
def test_roundtrip_identical_logits_and_processor(tiny_dirs, family, roundtrip):
    path = tiny_dirs(family)
    assert detect_family(path) == family
    model, proc = build_tiny_model(family)  # same seed as the saved one
    pol = load_policy(path)
    assert type(pol.model).__name__ == get_adapter(family).model_class_name
    tok = pol.tokenizer
    vis = [tok.convert_tokens_to_ids(t) for t in VISION_SPECIAL_TOKENS]
    assert sorted(pol.model.generation_config.suppress_tokens) == sorted(vis)
    a = build_prompt_item(proc, pol.adapter, _msgs("image"), images=[synthetic_image(0)])
    b = build_prompt_item(pol.processor, pol.adapter, _msgs("image"), images=[synthetic_image(0)])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the chat template put exactly one image placeholder block, expanded to grid/4 pad tokens
    n_pad = int((b["input_ids"] == tok.convert_tokens_to_ids("<|image_pad|>")).sum())
    assert n_pad == int(b["image_grid_thw"].prod()) // 4
    # save/load: the weights bit for bit, the logits to a tolerance (the loaded weights sit in another layout)
    roundtrip.same_weights(pol.model, model)
    with torch.no_grad():
        la = model(**a).logits
        lb = pol.model(**b).logits
        roundtrip.close(lb, la, atol=roundtrip.LOGITS_ATOL)
        # ... which a real bug still fails: one loaded weight element moved by 1e-2
        dict(pol.model.named_parameters())["model.language_model.layers.1.self_attn.o_proj.weight"][0, 0] += 1e-2
        with pytest.raises(AssertionError, match="not close"):
            roundtrip.close(pol.model(**b).logits, la, atol=roundtrip.LOGITS_ATOL)


@pytest.mark.parametrize("family", [f for f, a in ADAPTERS.items() if a.video_time != "none"])
def test_video_time_axis_reaches_processor(tiny_dirs, family):
    pol = load_policy(tiny_dirs(family))
    frames = synthetic_frames(1, num_frames=8)
    for fps in (2.0, 0.5):
        it = build_prompt_item(pol.processor, pol.adapter, _msgs("video"), video=frames, sample_fps=fps)
        assert int(it["video_grid_thw"][0, 0]) == 4  # 8 frames / temporal patch 2
        if pol.adapter.video_time == "second_per_grid_ts":  # = temporal_patch / sample_fps (Qwen2.5-VL)
            assert it["second_per_grid_ts"].tolist() == [pytest.approx(2.0 / fps)]
        else:  # Qwen3-VL writes "<t seconds>" text per temporal patch: mean time of its 2 frames
            text = pol.tokenizer.decode(it["input_ids"][0])
            last = (6 + 7) / 2 / fps
            assert f"<{last:.1f} seconds>" in text, text


def test_lora_excludes_vision_and_reference_is_base(tiny_dirs):
    pol = load_policy(tiny_dirs("qwen2_5_vl"), lora=LoraSpec(r=4, alpha=8))
    trainable = [n for n, p in pol.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert not any(".visual." in n for n in trainable)
    assert any("language_model" in n and "q_proj" in n for n in trainable)
    item = build_prompt_item(pol.processor, pol.adapter, _msgs("image"), images=[synthetic_image(2)])
    with torch.no_grad():
        base = pol.model(**item).logits
        for n, p in pol.model.named_parameters():
            if "lora_B" in n:
                p.add_(0.05 * torch.randn_like(p))
        moved = pol.model(**item).logits
        with pol.reference() as ref:
            ref_logits = ref(**item).logits
        again = pol.model(**item).logits  # adapter re-enabled after the context
    assert not torch.allclose(base, moved)
    assert torch.equal(ref_logits, base)
    assert torch.equal(again, moved)


def test_full_ft_freezes_vision_and_keeps_frozen_reference(tiny_dirs):
    pol = load_policy(tiny_dirs("qwen2_vl"), freeze_vision=True, need_reference=True)
    vis = [p.requires_grad for n, p in pol.model.named_parameters() if ".visual." in n]
    llm = [p.requires_grad for n, p in pol.model.named_parameters() if "language_model" in n]
    assert vis and not any(vis) and all(llm)
    assert not any(p.requires_grad for p in pol.ref_model.parameters())
    with torch.no_grad():
        next(p for n, p in pol.model.named_parameters() if "lm_head" in n).add_(1.0)
    item = build_prompt_item(pol.processor, pol.adapter, _msgs("image"), images=[synthetic_image(3)])
    with torch.no_grad(), pol.reference() as ref:
        assert not torch.allclose(ref(**item).logits, pol.model(**item).logits)


def test_detect_family_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        detect_family(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="llama"):
        detect_family(tmp_path)
    with pytest.raises(ValueError, match="unknown model family"):
        get_adapter("qwen9")


def test_adapter_lora_regex_never_matches_vision():
    import re

    rx = re.compile(get_adapter("qwen2_5_vl").lora_target_regex())
    assert rx.fullmatch("model.language_model.layers.0.mlp.gate_proj")
    assert rx.fullmatch("base_model.model.model.language_model.layers.1.self_attn.q_proj")
    assert not rx.fullmatch("model.visual.blocks.0.mlp.gate_proj")
    assert not rx.fullmatch("model.language_model.layers.0.self_attn.q_proj.lora_A")


_TOKENIZER_TEXTS = [
    "10", "The answer is 10.5 seconds", "<think>x</think><answer>12.3 to 45</answer>", "He'S here\n\n  ok  Ä ñ 9999",
    "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>when?<|im_end|>", "(A) 3,250 frames; B: 0.75s",
]


def test_tiny_tokenizer_in_memory_equals_saved_and_reloaded(tmp_path):
    """The tokenizer a test builds in memory is the one its saved folder loads back: ``from_pretrained`` rebuilds
    Qwen's own pre-tokenizer (one digit per pre-token, NFC), so the in-memory one must use it too (it once kept the
    BPE trainer's GPT-2 regex: "10" was one pre-token in memory and two after a reload)."""
    import sys
    from pathlib import Path

    from transformers import AutoTokenizer

    from mmgrpo.vlm.models.tiny import build_tiny_tokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import build_tiny_vlm

    built = {"tiny": build_tiny_tokenizer(),
             "grounding": build_tiny_vlm.build_tokenizer(["the person opens the door 1 2 to 3.5"] * 20, vocab_size=300)}
    for name, tok in built.items():
        tok.save_pretrained(tmp_path / name)
        back = AutoTokenizer.from_pretrained(tmp_path / name)
        assert len(back) == len(tok), name
        for text in _TOKENIZER_TEXTS:
            assert tok(text)["input_ids"] == back(text)["input_ids"], (name, text)
    # Qwen's pre-tokenization: the BPE never merges across digits
    tiny = built["tiny"]
    assert tiny.convert_ids_to_tokens(tiny("10")["input_ids"]) == ["1", "0"]
