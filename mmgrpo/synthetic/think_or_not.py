"""Think-or-not: a synthetic image benchmark where a short thought is needed for half the prompts and not for the
other half (the task of TON's comparison, issue #38 item 4).

Every sample shows a **solid-colour image** (default 56 x 56 px: four Qwen2.5-VL visual tokens) of one of six
colours, and its text holds a **partner table**: a random derangement of the six colours written as
``red->cyan`` one per line (every colour has a partner other than itself; the table is drawn per sample). The
options are the six colours in a fixed order (letters A-F; chance 1/6). Two kinds of question, half the samples
each:

* ``direct`` (a direct read): "Which option is the colour of the image?" -- the answer is the image's colour;
* ``partner`` (a computed intermediate): "Which option is the partner of the colour of the image?" -- the answer is
  the table's partner of the image's colour: read the colour, *then* look it up in this sample's table.

Thoughts (:func:`thought`): ``direct`` -> ``"green"`` (the colour read; restating it does not help the answer),
``partner`` -> ``"green->blue"`` (the colour read and the table entry looked up: the intermediate that turns a
two-hop question into two one-hop steps). The premise -- a small model answers ``direct`` as well without the
thought and ``partner`` much better with it -- is a property of a *model*, not of the data: the base build
(``scripts/build_think_or_not_base.py``) measures it on the validation split with the thought forced on and off.
What the data guarantee (:func:`probe`): the ``partner`` answer is not a function of the image alone (a classifier
of the image is at most ~1/5 right on it: the partner is uniform over the five other colours), and the ``direct``
answer is not a function of the text (the image colour is drawn independently of the table).

Samples are canonical ``mcq`` samples of the VLM front-end (``mmgrpo.vlm.data.schema``): ``image``, ``query``
(table + question), ``options`` (the six colour names), ``answer`` (the letter); ``meta`` holds ``kind``,
``colour`` (the image's), ``partner`` (its partner), ``table`` and ``thought``.

Splits ``train`` / ``val`` / ``heldout`` are independent draws from ``numpy.random.default_rng([seed, split])``,
balanced in kind (exactly half ``partner``, up to one) and in image colour (each ``n / 6`` times up to rounding).
Every sample is a deterministic function of (seed, split, index). Pure numpy; PIL only to write PNGs.
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ._cli import write_splits

__all__ = ["COLOURS", "OPTIONS", "LETTERS", "SPLITS", "KINDS", "QUESTIONS", "draw_table", "table_text", "thought",
           "render", "make_samples", "write_split", "generate", "probe", "oracle", "main"]

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40), "green": (40, 200, 40), "blue": (40, 40, 220),
    "yellow": (220, 220, 40), "cyan": (40, 220, 220), "magenta": (220, 40, 220),
}
OPTIONS = tuple(COLOURS)
LETTERS = "ABCDEF"
SPLITS = {"train": 0, "val": 1, "heldout": 2}
KINDS = ("direct", "partner")
QUESTIONS = {
    "direct": "Which option is the colour of the image?",
    "partner": "Which option is the partner of the colour of the image?",
}


def draw_table(rng: np.random.Generator) -> dict[str, str]:
    """A uniformly random derangement of the six colours (colour -> partner, never itself), by rejection."""
    while True:
        perm = rng.permutation(len(OPTIONS))
        if not np.any(perm == np.arange(len(OPTIONS))):
            return {OPTIONS[i]: OPTIONS[int(j)] for i, j in enumerate(perm)}


def table_text(table: dict[str, str]) -> str:
    """``"Partners:\nred->cyan\ngreen->blue\n..."`` in the fixed colour order. One entry per line, so a colour
    is the same token in the table as in the thought (a byte-level BPE gives ``" red"`` and ``"red"`` different
    tokens)."""
    return "Partners:\n" + "\n".join(f"{c}->{table[c]}" for c in OPTIONS)


def thought(kind: str, colour: str, table: dict[str, str]) -> str:
    """The short thought that carries the intermediate: the colour read (``direct``), the colour and its table entry
    (``partner``)."""
    if kind not in KINDS:
        raise ValueError(f"think_or_not: kind must be one of {KINDS}, got {kind!r}")
    return colour if kind == "direct" else f"{colour}->{table[colour]}"


def render(colour: str, size: int = 56) -> np.ndarray:
    """(size, size, 3) uint8: the solid colour."""
    img = np.empty((size, size, 3), np.uint8)
    img[:] = COLOURS[colour]
    return img


def _balanced(rng: np.random.Generator, values, n: int) -> list:
    order = list(values) * -(-n // len(values))
    return [order[i] for i in rng.permutation(len(order))[:n]]


def make_samples(n: int, split: str, seed: int, size: int = 56) -> list[dict]:
    """``n`` samples (without image paths) of ``split``: deterministic in (seed, split, index)."""
    if split not in SPLITS:
        raise ValueError(f"think_or_not: split must be one of {list(SPLITS)}, got {split!r}")
    rng = np.random.default_rng([int(seed), SPLITS[split]])
    kinds = _balanced(rng, KINDS, n)
    colours = _balanced(rng, OPTIONS, n)
    out = []
    for i, (kind, colour) in enumerate(zip(kinds, colours)):
        table = draw_table(rng)
        target = colour if kind == "direct" else table[colour]
        out.append({
            "id": f"{split}_{i:05d}", "task": "mcq", "query": f"{table_text(table)}\n{QUESTIONS[kind]}",
            "options": list(OPTIONS), "answer": LETTERS[OPTIONS.index(target)], "image_size": [size, size],
            "meta": {"benchmark": "think_or_not", "split": split, "seed": int(seed), "kind": kind,
                     "colour": colour, "partner": table[colour], "table": table,
                     "thought": thought(kind, colour, table)},
        })
    return out


def write_split(out_dir: str, split: str, n: int, seed: int, size: int = 56) -> str:
    """Render ``split`` into ``out_dir``: one PNG per colour under ``images/`` (the image depends on the colour
    only) and ``{split}.jsonl`` (``image`` relative to ``out_dir``); returns the JSONL path."""
    from PIL import Image

    os.makedirs(os.path.join(out_dir, "images"), exist_ok=True)
    for c in OPTIONS:
        p = os.path.join(out_dir, "images", f"{c}.png")
        if not os.path.exists(p):
            Image.fromarray(render(c, size)).save(p)
    path = os.path.join(out_dir, f"{split}.jsonl")
    with open(path, "w") as f:
        for s in make_samples(n, split, seed, size):
            f.write(json.dumps(dict(s, image=f"images/{s['meta']['colour']}.png")) + "\n")
    return path


def probe(seed: int = 0, n_train: int = 600, n_test: int = 300, test_split: str = "heldout") -> dict:
    """What the data allow without a model (percent, on ``test_split``):

    * ``image_only_<kind>``: the best answer given the image's colour alone -- the majority answer per (kind,
      colour) on the train split (``direct``: 100; ``partner``: about 1/5, the partner is uniform over five colours);
    * ``majority``: the most frequent training answer; ``chance``: 1/6;
    * ``oracle``: colour + the table parsed back from the query text: 100 (the answer is in the prompt).
    """
    tr, te = make_samples(n_train, "train", seed), make_samples(n_test, test_split, seed)
    votes: dict[tuple, dict] = {}
    for s in tr:
        key = (s["meta"]["kind"], s["meta"]["colour"])
        votes.setdefault(key, {}).setdefault(s["answer"], 0)
        votes[key][s["answer"]] += 1
    res: dict[str, Any] = {"seed": seed, "n_train": n_train, "n_test": n_test, "test_split": test_split,
                           "chance": 100.0 / len(OPTIONS)}
    for kind in KINDS:
        sub = [s for s in te if s["meta"]["kind"] == kind]
        hit = [max(votes.get((kind, s["meta"]["colour"]), {"?": 0}).items(), key=lambda kv: kv[1])[0] == s["answer"]
               for s in sub]
        res[f"image_only_{kind}"] = 100.0 * float(np.mean(hit)) if hit else float("nan")
    counts = np.bincount([LETTERS.index(s["answer"]) for s in tr], minlength=len(OPTIONS))
    res["majority"] = 100.0 * float(np.mean([s["answer"] == LETTERS[int(counts.argmax())] for s in te]))
    res["oracle"] = 100.0 * float(np.mean([s["answer"] == oracle(s) for s in te]))
    return res


def oracle(sample: dict) -> str:
    """The answer letter from the image's colour and the table *parsed back from the query text*."""
    table = dict(line.split("->") for line in sample["query"].splitlines() if "->" in line)
    c = sample["meta"]["colour"]
    kind = "partner" if sample["query"].endswith(QUESTIONS["partner"]) else "direct"
    return LETTERS[OPTIONS.index(table[c] if kind == "partner" else c)]


def generate(out_dir: str, n_train: int = 600, n_val: int = 60, n_heldout: int = 120, seed: int = 0,
             size: int = 56) -> dict:
    """Write the three splits and ``info.json`` (sizes, the probe on val); returns the info."""
    return write_splits(out_dir, lambda sp, n: write_split(out_dir, sp, n, seed, size),
                        {"train": n_train, "val": n_val, "heldout": n_heldout},
                        {"benchmark": "think_or_not", "seed": seed},
                        {"image_size": size, "options": list(OPTIONS), "questions": QUESTIONS})


def main(argv=None) -> int:
    from ._cli import split_benchmark_main

    return split_benchmark_main(argv, __doc__, generate, probe, "data probe")


if __name__ == "__main__":
    raise SystemExit(main())
