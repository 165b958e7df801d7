"""Hub-free tiny Qwen-VL models of every registered family (``mmgrpo.vlm.models.adapters.ADAPTERS``) for CPU tests
and smoke runs.

Everything is built from configs: a byte-level BPE tokenizer (256 byte symbols plus a few merges, so any text
tokenises), a Qwen ChatML chat template that emits ``<|vision_start|><|image_pad|><|vision_end|>`` /
``<|vision_start|><|video_pad|><|vision_end|>`` for image / video content items, the family's processor and a
randomly initialised model of ~0.2M parameters.  ``save_tiny_model`` writes a folder that loads back through
``from_pretrained`` -- the same code path a user's 7B checkpoint takes.  Nothing here names a family: what differs
(the classes, the vision tower, the rope / MoE settings, the processor's keyword arguments) is read from the
family's adapter.
"""
from __future__ import annotations

import copy
import os
from typing import Any

from .adapters import ADAPTERS, get_adapter

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

FAMILIES = tuple(ADAPTERS)  # every registered family has a tiny checkpoint

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
    patch = get_adapter(family).patch_size
    f = patch * 2
    return patch, 4 * f * f, 16 * f * f


def build_tiny_processor(family: str = "qwen2_5_vl"):
    """The family's real processor classes (its adapter's) around the tiny tokenizer and small pixel bounds."""
    adapter = get_adapter(family)
    processor_cls, image_cls, video_cls = adapter.processor_classes()
    tok = build_tiny_tokenizer()
    patch, min_px, max_px = _pixel_bounds(family)
    size = {"shortest_edge": min_px, "longest_edge": max_px}
    kw = copy.deepcopy(dict(adapter.tiny_processor_kwargs))
    ip = image_cls(size=size, patch_size=patch, **kw)
    vp = video_cls(size=size, patch_size=patch, **copy.deepcopy(kw))
    return processor_cls(image_processor=ip, tokenizer=tok, video_processor=vp, chat_template=CHAT_TEMPLATE)


def tiny_config(family: str, tokenizer) -> Any:
    """Config of a ~0.2M-parameter model whose special-token ids match ``tokenizer``: the text settings every
    family shares, updated with the adapter's ``tiny_text``, and its ``tiny_vision`` tower."""
    adapter = get_adapter(family)
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
    text.update(copy.deepcopy(dict(adapter.tiny_text)))  # copies: a config may keep (and change) what it gets
    vision = copy.deepcopy(dict(adapter.tiny_vision))
    return adapter.config_class()(text_config=text, vision_config=vision, **top)


def model_class(family: str):
    """The family's transformers model class (its adapter's ``model_class_name``)."""
    return get_adapter(family).model_class()


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
