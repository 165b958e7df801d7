"""Pairwise judge data from Mini-GenEval (:mod:`mmgrpo.synthetic.t2i`): two images, one of which matches the
caption; the answer (``"1"`` or ``"2"``) is known from the renderer, so a judge's verdict is verifiable.

* **Positive**: ``render(meta)`` of the caption's own metadata; it passes :func:`~mmgrpo.synthetic.t2i.verify`
  strictly (checked, else re-drawn with the next seed).
* **Negative**: ``render`` of a *perturbed* metadata (:func:`perturb`), one of the errors a small generator makes:
  another shape, another colour (when the caption names one), another count (1-4), or one extra object of another
  shape.  It must *fail* the strict check of the caption's metadata (checked, else another perturbation).
* Order: the positive is Image 1 or Image 2 with probability 1/2 (balanced per file).
* Splits follow the benchmark's own train / held-out split of the captions (disjoint content), so a judge trained
  on ``train`` pairs is measured on captions it never saw.

The judge sees **one image**, the pair side by side (:func:`compose`: Image 1 on the left, a grey bar, Image 2 on
the right), not UnifiedReward-Think's two-image chat: the VLM front-end's data path carries one image per sample,
and the flow reward composes its pairs with the same function, so training and use see the same input. Rows are
canonical VLM samples (``task: qa``, ``image``: the composite PNG, ``query``: :func:`query` of the caption,
``answer: "1" | "2"``, ``meta.problem_type: free-form``), read by ``mmgrpo train`` (an ``mcq`` run may hold
``qa`` samples) and by the judge's greedy evaluation.  The verdict format is UnifiedReward-Think's pairwise answer, ``<answer>Image k is better
</answer>`` (:func:`answer_text`; parsed by :func:`flow_grpo.rewards.unified_reward.parse_think_pair`).
"""
from __future__ import annotations

import json
import os
import random
from typing import Any, Sequence

from . import t2i

__all__ = ["QUERY", "query", "answer_text", "compose", "perturb", "make_pair", "write_split"]

#: the judge's question (the project's no-think system turn asks for the ``<answer>`` block)
QUERY = ('Caption: "{caption}". Which image matches the caption? '
         "Answer with <answer>Image 1 is better</answer> or <answer>Image 2 is better</answer>.")
DEFAULT_TAGS = ("single_object", "colors", "counting")


def query(caption: str) -> str:
    return QUERY.format(caption=caption)


GAP = 4  # px of the grey bar between the two images
GAP_GREY = 128


def compose(first, second):
    """One uint8 (H, W1 + GAP + W2, 3) image: ``first`` (Image 1) left, a grey bar, ``second`` (Image 2) right."""
    import numpy as np

    a, b = np.asarray(first, dtype=np.uint8), np.asarray(second, dtype=np.uint8)
    if a.ndim != 3 or a.shape[2] != 3 or a.shape != b.shape:
        raise ValueError(f"compose needs two uint8 (H, W, 3) images of one shape, got {a.shape} and {b.shape}")
    bar = np.full((a.shape[0], GAP, 3), GAP_GREY, dtype=np.uint8)
    return np.concatenate([a, bar, b], axis=1)


def answer_text(winner: int) -> str:
    """The verdict in UnifiedReward-Think's pairwise answer format."""
    if winner not in (1, 2):
        raise ValueError(f"winner must be 1 or 2, got {winner!r}")
    return f"<answer>Image {winner} is better</answer>"


def perturb(meta: dict, rng: random.Random) -> tuple[dict, str]:
    """(metadata of a wrong image for ``meta``'s caption, the kind of error). Single-entry captions only (the tags
    single_object / colors / counting)."""
    inc = meta["include"]
    if len(inc) != 1:
        raise ValueError(f"perturb handles one-entry captions (tags {DEFAULT_TAGS}), got {meta.get('prompt')!r}")
    e = dict(inc[0])
    kinds = ["shape", "count", "extra"] + (["color"] if e.get("color") else [])
    kind = rng.choice(kinds)
    if kind == "shape":
        e["class"] = rng.choice([s for s in t2i.SHAPES if s != e["class"]])
        new = [e]
    elif kind == "color":
        e["color"] = rng.choice([c for c in t2i.COLORS if c != e["color"]])
        new = [e]
    elif kind == "count":
        e["count"] = rng.choice([k for k in (1, 2, 3, 4) if k != e.get("count", 1)])
        new = [e]
    else:
        other = {"class": rng.choice([s for s in t2i.SHAPES if s != e["class"]]), "count": 1}
        new = [e, other]
    return {"prompt": meta["prompt"], "include": new}, kind


def make_pair(meta: dict, seed: int, size: int = 32, tries: int = 20) -> tuple[Any, Any, str]:
    """(positive image, negative image, error kind) for ``meta``, both uint8 (size, size, 3); deterministic in
    ``seed``. Raises RuntimeError if no verified pair is found in ``tries`` draws."""
    rng = random.Random(seed)
    for t in range(tries):
        pos = t2i.render(meta, size=size, seed=seed * 1000 + t)
        if not t2i.verify(pos, meta)["correct"]:
            continue
        wrong, kind = perturb(meta, rng)
        neg = t2i.render(wrong, size=size, seed=seed * 1000 + 500 + t)
        if t2i.verify(neg, meta)["correct"]:
            continue
        return pos, neg, kind
    raise RuntimeError(f"no verified pair for {meta['prompt']!r} (seed {seed}) in {tries} draws")


def write_split(out_dir: str, split: str, n: int, seed: int = 0, size: int = 32,
                tags: Sequence[str] = DEFAULT_TAGS) -> str:
    """Write ``n`` pairs of ``split`` (composite PNGs under ``out_dir/images/<split>/`` and ``out_dir/<split>.jsonl``);
    the positive's position alternates 1, 2, 1, ... over a shuffled order (balanced). Returns the JSONL path."""
    from PIL import Image

    caps = t2i.all_prompts(split, tags)
    rng = random.Random(f"judge-pairs|{split}|{seed}")
    img_dir = os.path.join(out_dir, "images", split)
    os.makedirs(img_dir, exist_ok=True)
    rows = []
    for i in range(n):
        meta = caps[rng.randrange(len(caps))]
        pos, neg, kind = make_pair(meta, seed=rng.randrange(1 << 30), size=size)
        winner = 1 + (i % 2)
        first, second = (pos, neg) if winner == 1 else (neg, pos)
        p = os.path.join(img_dir, f"{i:05d}.png")
        Image.fromarray(compose(first, second)).save(p)
        rows.append({"id": f"{split}-{i:05d}", "task": "qa", "image": os.path.abspath(p),
                     "query": query(meta["prompt"]), "answer": str(winner),
                     "meta": {"problem_type": "free-form", "caption": meta["prompt"], "tag": meta["tag"],
                              "error": kind, "split": split}})
    rng.shuffle(rows)
    path = os.path.join(out_dir, f"{split}.jsonl")
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path
