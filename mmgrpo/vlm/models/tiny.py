"""Hub-free tiny Qwen-VL models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) for CPU tests and smoke runs.

Everything is built from configs: a byte-level BPE tokenizer (256 byte symbols plus a few merges, so any text
tokenises), a Qwen ChatML chat template that emits ``<|vision_start|><|image_pad|><|vision_end|>`` /
``<|vision_start|><|video_pad|><|vision_end|>`` for image / video content items, the family's processor and a
randomly initialised model of ~0.2M parameters.  ``save_tiny_model`` writes a folder that loads back through
``from_pretrained`` -- the same code path a user's 7B checkpoint takes.
"""
from __future__ import annotations

import os
from typing import Any

# Special tokens in Qwen's order.  ids are assigned 0..len-1 by the BPE trainer.
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
VISION_SPECIAL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")

# Qwen ChatML, the structure of the released Qwen2-VL/2.5-VL template: a default system turn, content lists
# with {"type": "image"|"video"|"text"} items, and the generation prompt.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for content in message['content'] -%}"
    "{%- if content['type'] == 'image' or 'image' in content or 'image_url' in content -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif content['type'] == 'video' or 'video' in content -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in content -%}"
    "{{- content['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)

_CORPUS_WORDS = (
    "the answer is A B C D <think> </think> <answer> </answer> video frame second start end to from event "
    "person opens door walks table 0 1 2 3 4 5 6 7 8 9 . , : { } [ ] \" box image what when where which option"
).split()


def _bpe_tokenizer(vocab_size: int = 320):
    """Byte-level BPE (tokenizers), trained on a small synthetic corpus in ~0.03 s; deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = []
    for i in range(400):  # deterministic pseudo-sentences
        words = [_CORPUS_WORDS[(i * 7 + j * 13) % len(_CORPUS_WORDS)] for j in range(8)]
        corpus.append(" ".join(words) + f" {i % 60}.{i % 10} to {(i + 7) % 60}.{(i * 3) % 10}")
    tk.train_from_iterator(corpus, trainer=trainer)
    return tk


def vocab_and_merges(tk) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The BPE vocabulary and merges of a trained ``tokenizers.Tokenizer``.

    The tiny tokenizers are built from these with ``Qwen2TokenizerFast(vocab=..., merges=...)``, not around the
    trained object (``tokenizer_object=``): that keeps the trainer's pre-tokenizer (GPT-2's regex, digits grouped),
    while ``from_pretrained`` rebuilds Qwen's own (NFC, one digit per pre-token). A model built in memory and the
    same model saved and reloaded would then tokenise "10" differently."""
    import json

    model = json.loads(tk.to_str())["model"]
    return dict(model["vocab"]), [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]


def build_tiny_tokenizer():
    """A Qwen2 tokenizer (fast) around the tiny byte-level BPE with Qwen's special tokens and ChatML template."""
    from transformers import Qwen2TokenizerFast

    vocab, merges = vocab_and_merges(_bpe_tokenizer())
    tok = Qwen2TokenizerFast(
        vocab=vocab, merges=merges,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        additional_special_tokens=SPECIAL_TOKENS[1:],
        padding_side="left",
    )
    tok.chat_template = CHAT_TEMPLATE
    for t in SPECIAL_TOKENS:
        assert tok.convert_tokens_to_ids(t) == SPECIAL_TOKENS.index(t), t
    return tok


def _pixel_bounds(family: str) -> tuple[int, int, int]:
    """(patch_size, min_pixels, max_pixels) for the tiny processors: 4..16 merged tokens per image/frame."""
    patch = 16 if family == "qwen3_vl" else 14
    f = patch * 2
    return patch, 4 * f * f, 16 * f * f


def build_tiny_processor(family: str = "qwen2_5_vl"):
    """The family's real processor class around the tiny tokenizer and small pixel bounds."""
    _check_family(family)
    tok = build_tiny_tokenizer()
    patch, min_px, max_px = _pixel_bounds(family)
    if family == "qwen3_vl":
        from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

        size = {"shortest_edge": min_px, "longest_edge": max_px}
        ip = Qwen2VLImageProcessor(size=size, patch_size=patch, merge_size=2, temporal_patch_size=2,
                                   image_mean=[0.5] * 3, image_std=[0.5] * 3)
        vp = Qwen3VLVideoProcessor(size=size, patch_size=patch, merge_size=2, temporal_patch_size=2,
                                   image_mean=[0.5] * 3, image_std=[0.5] * 3)
        return Qwen3VLProcessor(image_processor=ip, tokenizer=tok, video_processor=vp, chat_template=CHAT_TEMPLATE)
    from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    size = {"shortest_edge": min_px, "longest_edge": max_px}
    ip = Qwen2VLImageProcessor(size=size, patch_size=patch)
    vp = Qwen2VLVideoProcessor(size=size, patch_size=patch)
    if family == "qwen2_vl":
        from transformers import Qwen2VLProcessor as P
    else:
        from transformers import Qwen2_5_VLProcessor as P
    return P(image_processor=ip, tokenizer=tok, video_processor=vp, chat_template=CHAT_TEMPLATE)


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; expected one of {FAMILIES}")


def tiny_config(family: str, tokenizer) -> Any:
    """Config of a ~0.2M-parameter model whose special-token ids match ``tokenizer``."""
    _check_family(family)
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    text = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=False,
    )
    top = dict(
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    if family == "qwen2_vl":
        from transformers import Qwen2VLConfig

        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]}
        vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
        return Qwen2VLConfig(text_config=text, vision_config=vision, **top)
    if family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig

        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]}
        vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                      patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                      fullatt_block_indexes=[1], tokens_per_second=2, in_channels=3)
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **top)
    from transformers import Qwen3VLConfig

    text["head_dim"] = 16
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3],
                               "mrope_interleaved": True}
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, deepstack_visual_indexes=[1],
                  num_position_embeddings=64, in_channels=3)
    return Qwen3VLConfig(text_config=text, vision_config=vision, **top)


def model_class(family: str):
    _check_family(family)
    import transformers

    return {
        "qwen2_vl": transformers.Qwen2VLForConditionalGeneration,
        "qwen2_5_vl": transformers.Qwen2_5_VLForConditionalGeneration,
        "qwen3_vl": transformers.Qwen3VLForConditionalGeneration,
    }[family]


def vision_token_ids(tokenizer) -> list[int]:
    return [tokenizer.convert_tokens_to_ids(t) for t in VISION_SPECIAL_TOKENS]


def build_tiny_model(family: str = "qwen2_5_vl", processor=None, seed: int = 0):
    """(model, processor): a random tiny model in eval mode (float32), sampling never emits vision tokens."""
    import torch

    processor = processor if processor is not None else build_tiny_processor(family)
    cfg = tiny_config(family, processor.tokenizer)
    cfg._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(family)(cfg)
    model.eval()
    gc = model.generation_config
    gc.suppress_tokens = vision_token_ids(processor.tokenizer)
    gc.eos_token_id = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    gc.pad_token_id = processor.tokenizer.pad_token_id
    gc.bos_token_id = cfg.text_config.bos_token_id
    gc.do_sample = True
    gc.temperature = 1.0
    gc.top_p = 1.0
    gc.top_k = None
    return model, processor


def save_tiny_model(directory: str | os.PathLike, family: str = "qwen2_5_vl", seed: int = 0) -> str:
    """Build a tiny random model + processor and ``save_pretrained`` both into ``directory``; returns the path."""
    directory = os.fspath(directory)
    model, processor = build_tiny_model(family, seed=seed)
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


def synthetic_image(seed: int, height: int = 84, width: int = 112):
    """A deterministic random RGB PIL image (tests / smoke runs)."""
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.random.RandomState(seed).randint(0, 255, (height, width, 3), dtype=np.uint8))


def synthetic_frames(seed: int, num_frames: int = 4, height: int = 112, width: int = 112):
    """Deterministic random video frames (F, H, W, 3) uint8."""
    import numpy as np

    return np.random.RandomState(seed).randint(0, 255, (num_frames, height, width, 3), dtype=np.uint8)
