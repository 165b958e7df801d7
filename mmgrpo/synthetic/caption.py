"""Synthetic free-form captioning: describe the one coloured shape of a small image in free text.

An image (default 56 x 56 px, 2 x 2 Qwen2.5-VL visual tokens of 28 px) holds one shape of
:data:`mmgrpo.synthetic.shapes.SHAPES` (circle / square / triangle) in one colour of
:data:`mmgrpo.synthetic.shapes.COLOURS` (6 colours: 18 classes) at a random size and place on the grey background.
The sample is a canonical ``qa`` sample of the VLM front-end (``meta.problem_type = "free-form"``): the query is
:data:`QUESTION`, the reference ``answer`` is ``"a <colour> <shape>"`` and ``meta`` holds the truth (``colour``,
``shape``).

The answer is free text: "a red circle", "the circle is red", "it is a red circle" all describe the same image.
:func:`caption_correct` is the **verifier**, read from the generator's truth: the answer's words name the true
colour and the true shape and no other colour or shape (case-insensitive, whole words). :func:`verifier_reward` is
it as an open reward of ``mmgrpo train`` (``reward.weights='{"mmgrpo.synthetic.caption:verifier_reward": 1}'``).

:func:`paraphrases` lists the free-text forms used to teach a base to caption and a judge to grade, and
:func:`judge_pairs` draws (reference, candidate, label) triples for a judge: the candidate is a paraphrase of the
true description or of a wrong one (wrong colour, wrong shape, both, two colours, one word, empty), the label the
verifier's.

Splits ``train`` / ``val`` / ``heldout`` are independent draws from ``numpy.random.default_rng([seed, split])``;
every sample is a deterministic function of (seed, split, index). Pure numpy; PIL only to write PNGs.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from .shapes import BACKGROUND, COLOURS, SHAPES, _shape_mask

__all__ = ["QUESTION", "SPLITS", "TEMPLATES", "draw", "make_samples", "write_split", "generate", "load_split",
           "caption_correct", "verifier_reward", "paraphrases", "judge_pairs"]

QUESTION = "Describe the object in the image.\nAnswer in a few words."
SPLITS = {"train": 0, "val": 1, "heldout": 2, "judge_train": 3, "judge_heldout": 4}
# free-text forms of one description ({c} colour, {s} shape)
TEMPLATES = ("a {c} {s}", "the {c} {s}", "{c} {s}", "a {s} that is {c}", "it is a {c} {s}", "one {c} {s}",
             "the {s} is {c}", "a {c} coloured {s}")
_WORD = re.compile(r"[a-z]+")
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S)


def draw(rng: np.random.Generator, size: int = 56, colour: Optional[str] = None, shape: Optional[str] = None) -> dict:
    """One image's content: colour, shape, side (``size // 3`` .. ``size // 2``) and top-left corner."""
    colour = colour or str(rng.choice(list(COLOURS)))
    shape = shape or str(rng.choice(SHAPES))
    side = int(rng.integers(size // 3, size // 2 + 1))
    x, y = (int(v) for v in rng.integers(0, size - side + 1, size=2))
    return {"colour": colour, "shape": shape, "side": side, "xy": [x, y], "size": size}


def render(content: Mapping[str, Any]) -> np.ndarray:
    """uint8 (H, W, 3) image of ``content``."""
    n, side = int(content["size"]), int(content["side"])
    img = np.empty((n, n, 3), np.uint8)
    img[:] = BACKGROUND
    x, y = content["xy"]
    mask = _shape_mask(content["shape"], side)
    img[y:y + side, x:x + side][mask] = COLOURS[content["colour"]]
    return img


def make_samples(n: int, split: str, seed: int, size: int = 56) -> list[tuple[dict, dict]]:
    """``n`` (content, sample-without-image-path) pairs of ``split``; the 18 classes balanced up to rounding."""
    if split not in SPLITS:
        raise ValueError(f"caption: split must be one of {list(SPLITS)}, got {split!r}")
    rng = np.random.default_rng([int(seed), SPLITS[split]])
    classes = [(c, s) for c in COLOURS for s in SHAPES]
    order = [classes[i % len(classes)] for i in range(n)]
    rng.shuffle(order)
    out = []
    for i, (c, s) in enumerate(order):
        content = draw(rng, size, c, s)
        sample = {"id": f"{split}_{i:05d}", "task": "qa", "query": QUESTION, "answer": f"a {c} {s}",
                  "meta": {"benchmark": "caption", "problem_type": "free-form", "split": split, "seed": int(seed),
                           "colour": c, "shape": s}}
        out.append((content, sample))
    return out


def write_split(out_dir: str, split: str, n: int, seed: int, size: int = 56) -> str:
    """``images/{id}.png`` and ``{split}.jsonl`` (``image`` relative to ``out_dir``); returns the JSONL path."""
    from PIL import Image

    os.makedirs(os.path.join(out_dir, "images"), exist_ok=True)
    path = os.path.join(out_dir, f"{split}.jsonl")
    with open(path, "w") as f:
        for content, s in make_samples(n, split, seed, size):
            rel = f"images/{s['id']}.png"
            Image.fromarray(render(content)).save(os.path.join(out_dir, rel))
            f.write(json.dumps(dict(s, image=rel)) + "\n")
    return path


def generate(out_dir: str, n_train: int = 600, n_val: int = 60, n_heldout: int = 180, seed: int = 0) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    for sp, n in (("train", n_train), ("val", n_val), ("heldout", n_heldout)):
        write_split(out_dir, sp, n, seed)
    info = {"benchmark": "caption", "seed": seed, "sizes": {"train": n_train, "val": n_val, "heldout": n_heldout},
            "question": QUESTION}
    with open(os.path.join(out_dir, "info.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


def load_split(path: str) -> list[dict]:
    """The rows of a split file with ``image`` made absolute."""
    base = os.path.dirname(os.path.abspath(path))
    with open(path) as f:
        return [dict(r, image=os.path.join(base, r["image"])) for r in map(json.loads, filter(str.strip, f))]


# ------------------------------------------------------------------------------------------------------ verifier
def _answer_words(text: Optional[str]) -> list[str]:
    text = text or ""
    m = _ANSWER.search(text)
    return _WORD.findall((m.group(1) if m else text).lower())


def caption_correct(text: Optional[str], colour: str, shape: str) -> bool:
    """The verifier: the answer (the ``<answer>`` block when there is one, else the whole text) names ``colour``
    and ``shape`` and no other colour or shape (whole words, case-insensitive)."""
    words = set(_answer_words(text))
    colours, shapes = words & set(COLOURS), words & set(SHAPES)
    return colours == {colour} and shapes == {shape}


def verifier_reward() -> Callable[[Sequence[str], Sequence[Mapping[str, Any]]], list[float]]:
    """Open-reward factory: ``reward(completions, samples)`` = 1.0 where :func:`caption_correct` on the sample's
    ``meta.colour`` / ``meta.shape``, else 0.0."""

    def reward(completions: Sequence[str], samples: Sequence[Mapping[str, Any]]) -> list[float]:
        return [float(caption_correct(c, s["meta"]["colour"], s["meta"]["shape"]))
                for c, s in zip(completions, samples)]

    return reward


# ---------------------------------------------------------------------------------------------- text for a judge
def paraphrases(colour: str, shape: str) -> list[str]:
    return [t.format(c=colour, s=shape) for t in TEMPLATES]


def _wrong(rng: np.random.Generator, colour: str, shape: str) -> str:
    """A description that the verifier rejects."""
    others_c = [c for c in COLOURS if c != colour]
    others_s = [s for s in SHAPES if s != shape]
    kind = int(rng.integers(0, 7))
    t = str(rng.choice(TEMPLATES))
    if kind <= 1:  # wrong colour
        return t.format(c=rng.choice(others_c), s=shape)
    if kind <= 3:  # wrong shape
        return t.format(c=colour, s=rng.choice(others_s))
    if kind == 4:  # both wrong
        return t.format(c=rng.choice(others_c), s=rng.choice(others_s))
    if kind == 5:  # two colours (one right)
        pair = [colour, str(rng.choice(others_c))]
        rng.shuffle(pair)
        return t.format(c=f"{pair[0]} and {pair[1]}", s=shape)
    return str(rng.choice([colour, shape, "", "an object", f"a {shape}", f"something {colour}"]))


def judge_pairs(n: int, split: str, seed: int) -> list[dict]:
    """``n`` judge examples ``{"reference", "answer", "label", "colour", "shape"}``: half paraphrases of the truth
    (label 1), half wrong descriptions (label 0 by the verifier)."""
    rng = np.random.default_rng([int(seed), SPLITS[split], 7])
    out = []
    for i in range(n):
        c, s = str(rng.choice(list(COLOURS))), str(rng.choice(SHAPES))
        ans = str(rng.choice(paraphrases(c, s))) if i % 2 == 0 else _wrong(rng, c, s)
        out.append({"reference": f"a {c} {s}", "answer": ans, "label": int(caption_correct(ans, c, s)),
                    "colour": c, "shape": s})
    return out
