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

The judge sees **one image**, the pair side by side (:func:`compose`: each 32 px image upscaled, nearest
neighbour, to ``CELL`` = 112 px -- 4 x 4 merged Qwen2.5-VL visual tokens of 28 px each, where the 32 px image
unscaled gave about 3 x 3 -- Image 1 on the left, a grey bar one token wide, Image 2 on the right under a grey
veil (a quarter of the way to grey: white becomes 223), so every visual token sees one image only and *says
which*: a real VLM gets two images at two positions of its sequence, the tiny judge's language model cannot read
left from right through its rotary positions alone -- without the veil it stayed at 50 %), not
UnifiedReward-Think's two-image chat: the VLM front-end's data path carries one image per sample,
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

__all__ = ["QUERY", "query", "answer_text", "compose", "pair_strip", "unstrip", "image_tags", "describe", "think_text", "THINK_STYLES", "TAG_HEADS", "TAG_LEVELS", "perturb",
           "make_pair", "write_split"]

#: the judge's question (the project's no-think system turn asks for the ``<answer>`` block)
QUERY = ('Caption: "{caption}". Which image matches the caption? '
         "Answer with <answer>Image 1 is better</answer> or <answer>Image 2 is better</answer>.")
DEFAULT_TAGS = ("single_object", "colors", "counting")


def query(caption: str) -> str:
    return QUERY.format(caption=caption)


CELL = 112  # px of each image in the composite (4 x 4 merged Qwen2.5-VL tokens of 28 px)
GAP = 28  # px of the grey bar between the two images: one merged token column
GAP_GREY = 128
VEIL = 0.25  # Image 2 = (1 - VEIL) * image + VEIL * GAP_GREY: the mark of the right-hand image
#: the composite's size; a judge's processor must keep it as it is (min_pixels <= H * W <= max_pixels)
COMPOSITE_HW = (CELL, 2 * CELL + GAP)


def _cell(img):
    import numpy as np
    from PIL import Image

    a = np.asarray(img, dtype=np.uint8)
    if a.ndim != 3 or a.shape[2] != 3:
        raise ValueError(f"compose needs uint8 (H, W, 3) images, got {a.shape}")
    if a.shape[:2] == (CELL, CELL):
        return a
    return np.asarray(Image.fromarray(a).resize((CELL, CELL), Image.NEAREST))


def compose(first, second):
    """One uint8 (CELL, 2 CELL + GAP, 3) image: ``first`` (Image 1) left, a grey bar, ``second`` (Image 2) right
    under the grey veil (``VEIL``); each square image upscaled (nearest neighbour) to CELL x CELL."""
    import numpy as np

    a, b = np.asarray(first), np.asarray(second)
    if a.shape != b.shape or a.ndim != 3 or a.shape[0] != a.shape[1]:
        raise ValueError(f"compose needs two square (H, H, 3) images of one shape, got {a.shape} and {b.shape}")
    a, b = _cell(a), _cell(b)
    b = np.rint((1.0 - VEIL) * b.astype(np.float64) + VEIL * GAP_GREY).astype(np.uint8)
    bar = np.full((CELL, GAP, 3), GAP_GREY, dtype=np.uint8)
    return np.concatenate([a, bar, b], axis=1)


def pair_strip(first, second):
    """The two images as they are, side by side with a GAP_GREY bar of ``GAP`` px (no upscaling, no veil): what
    :func:`write_split` keeps next to the composite so that a pair can be judged again (:func:`unstrip`)."""
    import numpy as np

    a, b = np.asarray(first, dtype=np.uint8), np.asarray(second, dtype=np.uint8)
    bar = np.full((a.shape[0], GAP, 3), GAP_GREY, dtype=np.uint8)
    return np.concatenate([a, bar, b], axis=1)


def unstrip(strip):
    """(Image 1, Image 2) of a :func:`pair_strip`."""
    import numpy as np

    s = np.asarray(strip)
    w = (s.shape[1] - GAP) // 2
    if w <= 0 or 2 * w + GAP != s.shape[1]:
        raise ValueError(f"a pair strip is 2 W + {GAP} px wide, got {s.shape}")
    return s[:, :w], s[:, w + GAP:]


#: what :func:`image_tags` counts, one head each (the vision tower's pre-training targets)
TAG_HEADS = tuple(t2i.SHAPES) + tuple(t2i.COLORS) + tuple(f"{c} {s}" for c in t2i.COLORS for s in t2i.SHAPES)
TAG_LEVELS = 5  # counts 0, 1, 2, 3, 4+ per head


def image_tags(image) -> list[int]:
    """What one (un-upscaled) image shows, read by the verifier's detector
    (:func:`~mmgrpo.synthetic.t2i.segment_objects`): per :data:`TAG_HEADS` entry (each shape, each colour, each
    colour-shape) the number of objects, clipped to ``TAG_LEVELS - 1``."""
    objs, _ = t2i.segment_objects(image)
    n = {h: 0 for h in TAG_HEADS}
    for o in objs:
        for h in (o["shape"], o["color"], f"{o['color']} {o['shape']}"):
            n[h] += 1
    return [min(n[h], TAG_LEVELS - 1) for h in TAG_HEADS]


def describe(tags: Sequence[int], caption: str) -> str:
    """What an image with :func:`image_tags` ``tags`` shows, in the words of ``caption`` (Mini-GenEval grammar):
    colours are named only if the caption names one; the caption's own object comes first, the others after in
    a fixed order; ``"nothing"`` for an empty image. E.g. ``describe(tags, "three red squares")`` ->
    ``"two red squares and a blue circle"``."""
    meta = t2i.parse_prompt(caption)
    if meta is None or len(meta["include"]) != 1:
        raise ValueError(f"describe handles one-entry captions (tags {DEFAULT_TAGS}), got {caption!r}")
    want = meta["include"][0]
    coloured = want.get("color") is not None
    counts: dict[tuple, int] = {}
    for c in t2i.COLORS:
        for sh in t2i.SHAPES:
            n = int(tags[TAG_HEADS.index(f"{c} {sh}")])
            if n:
                key = (c if coloured else None, sh)
                counts[key] = counts.get(key, 0) + n
    if not counts:
        return "nothing"
    first = (want.get("color"), want["class"])
    order = sorted(counts, key=lambda k: (k != first, t2i.SHAPES.index(k[1]),
                                          list(t2i.COLORS).index(k[0]) if k[0] else -1))
    return " and ".join(t2i._phrase(k[0], k[1], min(counts[k], TAG_LEVELS - 1)) for k in order)


THINK_STYLES = ("describe", "describe_mark", "describe_check")


def think_text(caption: str, tags: Sequence[Sequence[int]], style: str = "describe") -> str:
    """The judge's reasoning: what each image shows, in the caption's words (:func:`describe`).

    ``style``: ``describe`` -- ``Image 1: two red squares. Image 2: ...``; ``describe_mark`` -- each description
    followed by ``(match)`` if it is the caption itself, else ``(no match)``; ``describe_check`` -- every word of
    the description followed by ``+`` if the caption has that word, else ``-``, then the mark (a description
    matches exactly when all its words are the caption's: descriptions use the caption's grammar)."""
    if style not in THINK_STYLES:
        raise ValueError(f"think style must be one of {THINK_STYLES}, got {style!r}")
    words = set(caption.split())
    out = []
    for k, t in enumerate(tags):
        d = describe(t, caption)
        if style == "describe_check":
            d = " ".join(f"{w}{'+' if w in words else '-'}" for w in d.split())
        if style != "describe":
            d += " (match)" if describe(t, caption) == caption else " (no match)"
        out.append(f"Image {k + 1}: {d}.")
    return " ".join(out)


def answer_text(winner: int, think: str | None = None) -> str:
    """The verdict in UnifiedReward-Think's pairwise answer format, after ``<think>think</think>`` if given."""
    if winner not in (1, 2):
        raise ValueError(f"winner must be 1 or 2, got {winner!r}")
    head = f"<think>{think}</think>" if think is not None else ""
    return f"{head}<answer>Image {winner} is better</answer>"


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
    the positive's position alternates 1, 2, 1, ... over a shuffled order (balanced); ``meta.tags`` holds
    :func:`image_tags` of Image 1 and Image 2, ``meta.pair`` the :func:`pair_strip` PNG of the two images as
    drawn. Returns the JSONL path."""
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
        Image.fromarray(pair_strip(first, second)).save(p[:-4] + "_pair.png")
        rows.append({"id": f"{split}-{i:05d}", "task": "qa", "image": os.path.abspath(p),
                     "query": query(meta["prompt"]), "answer": str(winner),
                     "meta": {"problem_type": "free-form", "caption": meta["prompt"], "tag": meta["tag"],
                              "error": kind, "split": split, "tags": [image_tags(first), image_tags(second)],
                              "pair": os.path.abspath(p[:-4] + "_pair.png")}})
    rng.shuffle(rows)
    path = os.path.join(out_dir, f"{split}.jsonl")
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path
