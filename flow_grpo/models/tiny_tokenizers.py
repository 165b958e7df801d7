"""Tokenizers of the hub-free tiny pipelines (:mod:`flow_grpo.models.tiny`, ``tiny_wan``, ``tiny_qwen_image``),
built offline.

* CLIP: a truncated copy of the real CLIP BPE (open_clip ships ``bpe_simple_vocab_16e6.txt.gz``): the 512 byte
  symbols (plain and ``</w>``-terminated), the first ``n_merges`` merges and the two special tokens, in the same order
  as CLIP's own vocab. ``CLIPTokenizer(vocab=dict, merges=[tuple])`` (transformers v5 ignores file paths).
* T5 (FLUX ``tokenizer_2``): a tiny ``tokenizers`` word-piece-free BPE trained on a fixed corpus.
* T5 (SD3 ``tokenizer_3``): a ``T5TokenizerFast`` (Unigram model, T5's Metaspace pre-tokenizer and ``</s>``
  post-processor) over a tiny vocabulary built from the same corpus (words + characters). No installed package
  ships a real T5 SentencePiece model (``spiece.model``) and ``sentencepiece`` is not installed, so the real
  vocabulary and its NFKC ``precompiled_charsmap`` normaliser are absent; the tokenizer class, id layout
  (<pad>=0, </s>=1, <unk>=2) and padding/truncation behaviour are T5's.

"""
from __future__ import annotations

import gzip
import os
from functools import lru_cache
from typing import Sequence

_CORPUS = [
    "a photo of a cat", "a photo of a dog", "a red apple on a table", "a blue car in the street",
    "two birds on a wire", "an astronaut riding a horse", "a bowl of fruit", "a green tree in a field",
    "a yellow banana and a purple grape", "the quick brown fox jumps over the lazy dog",
    "a painting of a mountain at sunset", "a black and white photograph of a city",
]


def _bytes_to_unicode() -> dict[int, str]:
    # CLIP/GPT-2 reversible byte -> printable unicode mapping (a standard, documented construction)
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


@lru_cache(maxsize=4)
def _clip_vocab_merges(n_merges: int) -> tuple[dict[str, int], list[tuple[str, str]]]:
    import importlib.util

    # locate open_clip's BPE file without importing open_clip (its import pulls in timm/torchvision: seconds)
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the tiny CLIP tokenizer needs open_clip's bpe_simple_vocab_16e6.txt.gz (pip install open_clip_torch)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "bpe_simple_vocab_16e6.txt.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    merges = [tuple(line.split()) for line in lines[1 : 1 + n_merges]]
    vocab = list(_bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab]
    vocab += ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    return {tok: i for i, tok in enumerate(vocab)}, merges


def build_clip_tokenizer(n_merges: int = 256, model_max_length: int = 77):
    from transformers import CLIPTokenizer

    vocab, merges = _clip_vocab_merges(n_merges)
    return CLIPTokenizer(vocab=dict(vocab), merges=list(merges), model_max_length=model_max_length)


def build_t5_tokenizer(vocab_size: int = 300, model_max_length: int = 64):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "</s>", "<unk>"])
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>", model_max_length=model_max_length
    )


def build_t5_unigram_tokenizer(model_max_length: int = 512, extra_corpus: Sequence[str] = ()):
    """A ``T5TokenizerFast`` (a Unigram model, like T5's SentencePiece one) over a tiny hand-built vocabulary.

    Pieces: the corpus words with SentencePiece's word-start marker ("\u2581cat"), the bare marker, and single
    characters (lowercase letters, digits and the corpus' characters), scored by smoothed log-frequency with
    characters penalised, so corpus words are one token and other words split into characters (<unk> only for
    characters outside lowercase letters, digits and the corpus, e.g. capitals: there is no NFKC/lowercasing). Built in pure Python on purpose: ``tokenizers``' UnigramTrainer orders equal-score pieces
    differently from one process to the next, which would change token ids between a build and its reload.
    No sentinel ``<extra_id_*>`` tokens (``extra_ids=0``): the text encoder never sees them.
    ``extra_corpus``: more lines whose words become single tokens too (e.g. a benchmark's prompts; the default
    keeps the ids of existing folders)."""
    import math
    import string
    from collections import Counter

    from transformers import T5TokenizerFast

    corpus = list(_CORPUS) + list(extra_corpus)
    words = Counter(w for line in corpus for w in line.split())
    chars = Counter(c for line in corpus for c in line.replace(" ", ""))
    chars.update(string.ascii_lowercase + string.digits)  # add-one smoothing, and full lowercase/digit coverage
    total = sum(words.values()) + sum(chars.values())
    scored = {"\u2581" + w: math.log(n / total) for w, n in words.items()}
    scored["\u2581"] = math.log(len(words) / total)
    scored.update({c: math.log(n / total) - 2.0 for c, n in chars.items()})
    pieces = sorted(scored.items(), key=lambda kv: (-kv[1], kv[0]))  # a deterministic id order
    # T5's id layout: <pad>=0, </s>=1, <unk>=2 (T5TokenizerFast builds its Unigram model with unk_id=2)
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + pieces
    return T5TokenizerFast(vocab=vocab, extra_ids=0, model_max_length=model_max_length)
