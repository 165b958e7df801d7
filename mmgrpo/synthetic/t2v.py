"""Mini-T2V: a synthetic text-to-video benchmark with a programmatic verifier (``flow_grpo.rewards.motion``).

Prompts come from a small grammar over 4 colours x 3 shapes x 4 directions, e.g.::

    "a red circle moves from left to right"                       tag motion
    "two yellow circles move up"                                   tag count_motion (counts 2-3)
    "a red circle moves left and a blue square moves down"         tag two_motion
    "a blue square appears, then a green triangle"                 tag order

Each prompt carries a structured spec (``"objects"``: one entry per colour, with shape, count, direction and
appearance rank)::

    {"prompt": "a blue square appears, then a green triangle", "tag": "order", "split": "train",
     "combo": "blue square < green triangle", "fps": 8.0,
     "objects": [{"color": "blue", "shape": "square", "count": 1, "direction": "none", "order": 0},
                 {"color": "green", "shape": "triangle", "count": 1, "direction": "none", "order": 1}]}

``direction`` is ``"left" | "right" | "up" | "down"`` (the object moves that way) or ``"none"`` (the prompt says
nothing about motion; the reference keeps it still and the verifier does not check it).  ``order`` is the rank of
appearance: entries of rank 0 are there from the first frame, rank 1 appears later ("then").  The entries of one
prompt have distinct colours, so the verifier tracks an entry by its colour.

Splits: ``train`` / ``val`` / ``heldout`` are disjoint at the level of *content* (``combo``: "A and B" ==
"B and A" for two_motion), 70 / 10 / 20 % of the combos of each tag, chosen by a stable SHA-1 hash (independent of
``PYTHONHASHSEED`` and of any seed).  :func:`make_prompts` samples a split with a seed; :func:`all_prompts` lists it.

Reference clips (:func:`render_clip`): ``frames`` x ``size`` x ``size`` x 3 uint8 (default 12 x 48 x 48, 8 fps),
the grey background and the shape masks of the temporal-grounding renderer (:mod:`mmgrpo.synthetic.shapes`:
``BACKGROUND``, ``_shape_mask``) in its red / green / blue / yellow colours, shapes ``shape_px = max(8,
round(0.21 size))`` px (10 px at 48) with no anti-aliasing.  A moving object travels in a straight line along its
axis, linearly in time over all frames, by ``U[0.45, 0.7] * (size - shape_px)`` px (at least ``MIN_MOVE`` of the
frame) and keeps its other coordinate; objects of rank 1 appear at frame ``U[F/3, F/2]`` (rounded) and stay to the
end; objects of rank 0 are visible on every frame.  No two objects overlap (gap >= 2 px) on any frame.  Each clip is
a deterministic function of (spec, size, frames, seed).

Files (CLI ``python data/synthetic_t2v.py OUT [--splits train val heldout] [--n 200 | --all] [--seed 0]
[--size 48] [--frames 12] [--mp4]``): ``OUT/{split}.jsonl`` (one spec per line plus ``"clip"``: the path of its
reference clip relative to OUT, ``"seed"``, ``"size"``, ``"frames"``) and ``OUT/clips/{split}_{i:06d}.npy``
(uint8 (F, H, W, 3), lossless: H.264 with 4:2:0 chroma would blur 10 px shapes by a few levels and shift colours
at the edges, and the clips are training targets for a tiny generator).  ``--mp4`` also writes an mp4 next to each
``.npy`` for viewing (:func:`mmgrpo.video.write_video`, crf 10); the JSONL then has ``"video"`` too.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .t2i import stable_rank
from .shapes import BACKGROUND, COLOURS as _TVG_COLOURS, _shape_mask

__all__ = [
    "COLORS", "BACKGROUND", "SHAPES", "DIRECTIONS", "COUNTS", "TAGS", "SPLITS", "DEFAULT_SIZE", "DEFAULT_FRAMES",
    "DEFAULT_FPS", "MIN_MOVE", "all_prompts", "make_prompts", "parse_prompt", "validate_spec", "render_clip",
    "shape_px", "main",
]

COLORS: dict[str, tuple[int, int, int]] = {c: _TVG_COLOURS[c] for c in ("red", "green", "blue", "yellow")}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
DIRECTIONS: tuple[str, ...] = ("left", "right", "up", "down")
COUNTS: tuple[int, ...] = (2, 3)  # count_motion prompts; the other tags use count 1
TAGS: tuple[str, ...] = ("motion", "count_motion", "two_motion", "order")
SPLITS: tuple[str, ...] = ("train", "val", "heldout")
SPLIT_FRACTIONS = {"heldout": 0.2, "val": 0.1}  # of the combos of each tag; the rest is train
DEFAULT_SIZE, DEFAULT_FRAMES, DEFAULT_FPS = 48, 12, 8.0
MIN_MOVE = 0.25  # a reference object moves at least this fraction of the frame (the verifier's default threshold)
GAP = 2  # px between objects on every frame

_NUM = {1: "a", 2: "two", 3: "three"}
_PLURAL = {"circle": "circles", "square": "squares", "triangle": "triangles"}
_MOVE_PHRASE = {"right": "from left to right", "left": "from right to left", "up": "up", "down": "down"}
_SHORT_MOVE = {"right": "right", "left": "left", "up": "up", "down": "down"}


# ----------------------------------------------------------------------------------------------------------
# prompts
# ----------------------------------------------------------------------------------------------------------
def _entry(color: str, shape: str, count: int = 1, direction: str = "none", order: int = 0) -> dict:
    return {"color": color, "shape": shape, "count": count, "direction": direction, "order": order}


def _noun(color: str, shape: str, count: int) -> str:
    return f"{_NUM[count]} {color} {shape if count == 1 else _PLURAL[shape]}"


def _variants() -> list[tuple[str, str, dict]]:
    """Every (tag, combo, spec) of the grammar."""
    out: list[tuple[str, str, dict]] = []
    pairs = [(c, s) for c in COLORS for s in SHAPES]
    for c, s in pairs:
        for d in DIRECTIONS:
            out.append(("motion", f"{c} {s} {d}", {
                "prompt": f"{_noun(c, s, 1)} moves {_MOVE_PHRASE[d]}", "objects": [_entry(c, s, 1, d)]}))
            for k in COUNTS:
                out.append(("count_motion", f"{k} {c} {s} {d}", {
                    "prompt": f"{_noun(c, s, k)} move {_MOVE_PHRASE[d]}", "objects": [_entry(c, s, k, d)]}))
    for i, (c1, s1) in enumerate(pairs):
        for (c2, s2) in pairs[i + 1:]:
            if c1 == c2:
                continue
            for d1 in DIRECTIONS:
                for d2 in DIRECTIONS:
                    combo = f"{c1} {s1} {d1} & {c2} {s2} {d2}"  # pairs are in a fixed order: one combo, one prompt
                    out.append(("two_motion", combo, {
                        "prompt": f"{_noun(c1, s1, 1)} moves {_SHORT_MOVE[d1]} and {_noun(c2, s2, 1)} moves "
                                  f"{_SHORT_MOVE[d2]}",
                        "objects": [_entry(c1, s1, 1, d1), _entry(c2, s2, 1, d2)]}))
    for (c1, s1) in pairs:
        for (c2, s2) in pairs:
            if c1 == c2:
                continue
            out.append(("order", f"{c1} {s1} < {c2} {s2}", {
                "prompt": f"{_noun(c1, s1, 1)} appears, then {_noun(c2, s2, 1)}",
                "objects": [_entry(c1, s1, 1, "none", 0), _entry(c2, s2, 1, "none", 1)]}))
    return [(t, k, {"prompt": m["prompt"], "tag": t, "combo": k, "fps": DEFAULT_FPS, "objects": m["objects"]})
            for t, k, m in out]


_TABLE: dict[str, list[dict]] | None = None
_BY_PROMPT: dict[str, dict] | None = None


def _table() -> dict[str, list[dict]]:
    global _TABLE, _BY_PROMPT
    if _TABLE is None:
        variants = _variants()
        split_of: dict[tuple[str, str], str] = {}
        for tag in TAGS:
            keys = sorted({k for t, k, _ in variants if t == tag}, key=lambda k: stable_rank("mini-t2v", tag, k))
            n_held = math.ceil(SPLIT_FRACTIONS["heldout"] * len(keys))
            n_val = math.ceil(SPLIT_FRACTIONS["val"] * len(keys))
            for j, k in enumerate(keys):
                split_of[(tag, k)] = "heldout" if j < n_held else "val" if j < n_held + n_val else "train"
        table: dict[str, list[dict]] = {s: [] for s in SPLITS}
        for tag, key, md in variants:
            s = split_of[(tag, key)]
            table[s].append({**md, "split": s})
        _TABLE = table
        _BY_PROMPT = {m["prompt"]: m for ms in table.values() for m in ms}
    return _TABLE


def _check_split(split: str) -> str:
    split = {"test": "heldout", "held_out": "heldout", "eval": "heldout", "validation": "val"}.get(split, split)
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return split


def _check_tags(tags: Sequence[str] | None) -> tuple[str, ...]:
    if tags is None:
        return TAGS
    bad = [t for t in tags if t not in TAGS]
    if bad:
        raise ValueError(f"unknown tags {bad}; choose from {TAGS}")
    return tuple(tags)


def _copy(m: Mapping) -> dict:
    return json.loads(json.dumps(m))


def all_prompts(split: str = "train", tags: Sequence[str] | None = None) -> list[dict]:
    """Every prompt of a split (copies of the specs), in a fixed order."""
    split, tags = _check_split(split), _check_tags(tags)
    return [_copy(m) for m in _table()[split] if m["tag"] in tags]


def make_prompts(n: int, seed: int = 0, split: str = "train", tags: Sequence[str] | None = None) -> list[dict]:
    """``n`` specs of ``split``: a tag uniform over ``tags``, then a prompt uniform within it; deterministic in
    ``seed``."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    split, tags = _check_split(split), _check_tags(tags)
    by_tag = {t: [m for m in _table()[split] if m["tag"] == t] for t in tags}
    names = sorted(t for t, ms in by_tag.items() if ms)
    if not names:
        raise ValueError(f"no prompts for tags {tags} in split {split!r}")
    rng = random.Random(seed)
    return [_copy(rng.choice(by_tag[rng.choice(names)])) for _ in range(n)]


def parse_prompt(prompt: str) -> dict | None:
    """The spec of a grammar prompt (any split), or None when the prompt is not from this grammar."""
    _table()
    assert _BY_PROMPT is not None
    m = _BY_PROMPT.get(prompt.strip())
    return None if m is None else _copy(m)


# ----------------------------------------------------------------------------------------------------------
# spec validation
# ----------------------------------------------------------------------------------------------------------
def validate_spec(spec: Mapping[str, Any], where: str = "spec") -> list[dict]:
    """The spec's ``objects`` as a list of complete entries; ValueError naming ``where`` and the field if bad."""
    objs = spec.get("objects") if isinstance(spec, Mapping) else None
    if not isinstance(objs, list) or not objs:
        raise ValueError(f"{where}: needs a non-empty 'objects' list, got {objs!r}")
    out, colors = [], set()
    for i, e in enumerate(objs):
        f = f"{where}.objects[{i}]"
        if not isinstance(e, Mapping):
            raise ValueError(f"{f}: must be a dict, got {e!r}")
        if e.get("color") not in COLORS:
            raise ValueError(f"{f}.color must be one of {tuple(COLORS)}, got {e.get('color')!r}")
        if e["color"] in colors:
            raise ValueError(f"{f}.color {e['color']!r} repeats: the entries of one spec need distinct colours")
        colors.add(e["color"])
        if e.get("shape") not in SHAPES:
            raise ValueError(f"{f}.shape must be one of {SHAPES}, got {e.get('shape')!r}")
        k = e.get("count", 1)
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 3:
            raise ValueError(f"{f}.count must be an int in 1..3, got {k!r}")
        d = e.get("direction", "none")
        if d not in DIRECTIONS + ("none",):
            raise ValueError(f"{f}.direction must be one of {DIRECTIONS + ('none',)}, got {d!r}")
        r = e.get("order", 0)
        if r not in (0, 1):
            raise ValueError(f"{f}.order must be 0 (from the start) or 1 (appears later), got {r!r}")
        out.append(_entry(e["color"], e["shape"], k, d, r))
    if sum(e["count"] for e in out) > 3:  # as the grammar; 4 movers rarely fit 48 px frames without touching
        raise ValueError(f"{where}: at most 3 objects in total, got {sum(e['count'] for e in out)}")
    if all(e["order"] == 1 for e in out):
        raise ValueError(f"{where}: some entry must have order 0 (visible from the first frame)")
    return out


# ----------------------------------------------------------------------------------------------------------
# rendering
# ----------------------------------------------------------------------------------------------------------
def shape_px(size: int) -> int:
    """Side of a rendered shape in a ``size`` x ``size`` frame (10 px at 48)."""
    return max(8, int(round(0.21 * size)))


def _trajectory(rng: random.Random, direction: str, size: int, d: int) -> tuple[tuple[float, float],
                                                                              tuple[float, float]]:
    """(start, end) top-left corners of a ``d`` px shape moving ``direction`` (or still for "none")."""
    lim = size - d
    if direction == "none":
        p = (float(rng.randint(0, lim)), float(rng.randint(0, lim)))
        return p, p
    length = max(MIN_MOVE * size + 1, rng.uniform(0.45, 0.7) * lim)
    a = rng.uniform(0, lim - length)
    b = float(rng.randint(0, lim))
    s, e = (a, a + length) if direction in ("right", "down") else (a + length, a)
    if direction in ("left", "right"):
        return (s, b), (e, b)
    return (b, s), (b, e)


def _corner(start, end, k: int, first: int, frames: int) -> tuple[int, int]:
    t = (k - first) / max(frames - 1 - first, 1) if end != start else 0.0
    return int(round(start[0] + (end[0] - start[0]) * t)), int(round(start[1] + (end[1] - start[1]) * t))


def render_clip(spec: Mapping[str, Any], size: int = DEFAULT_SIZE, frames: int = DEFAULT_FRAMES,
                seed: int = 0) -> np.ndarray:
    """A reference clip satisfying ``spec``: uint8 (frames, size, size, 3); rules in the module docstring.
    Moving objects travel over all frames from their first visible one (rank 1 objects never move in the grammar,
    but a rank 1 mover would travel from its appearance to the last frame)."""
    objs = validate_spec(spec)
    if size < 32:
        raise ValueError(f"size must be >= 32 (shapes of >= 8 px with room to move), got {size}")
    if frames < 4:
        raise ValueError(f"frames must be >= 4, got {frames}")
    rng = random.Random(seed)
    d = shape_px(size)
    mask = _shape_mask  # the grounding renderer's crisp masks
    insts = [(e["color"], e["shape"], e["direction"], e["order"]) for e in objs for _ in range(e["count"])]
    for _attempt in range(500):
        appear = int(round(rng.uniform(frames / 3, frames / 2)))
        paths = [(*_trajectory(rng, dr, size, d), appear if r else 0) for (_c, _s, dr, r) in insts]
        boxes = [[_corner(st, en, k, f0, frames) if k >= f0 else None for k in range(frames)] for st, en, f0 in paths]
        if _separated(boxes, d):
            break
    else:
        raise RuntimeError(f"could not place {len(insts)} objects in {size}px frames for {spec.get('prompt')!r}")
    clip = np.empty((frames, size, size, 3), np.uint8)
    clip[:] = BACKGROUND
    for (c, s, _dr, _r), bx in zip(insts, boxes):
        m = mask(s, d)
        for k, xy in enumerate(bx):
            if xy is not None:
                x, y = xy
                clip[k, y:y + d, x:x + d][m] = COLORS[c]
    return clip


def _separated(boxes: list[list], d: int) -> bool:
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            for a, b in zip(boxes[i], boxes[j]):
                if a is not None and b is not None and abs(a[0] - b[0]) < d + GAP and abs(a[1] - b[1]) < d + GAP:
                    return False
    return True


# ----------------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------------
def _clip_seed(seed: int, split: str, i: int) -> int:
    return int(hashlib.sha1(f"mini-t2v-clip|{seed}|{split}|{i}".encode()).hexdigest()[:12], 16)


def write_split(out_dir: str, split: str, rows: list[dict], seed: int = 0, size: int = DEFAULT_SIZE,
                frames: int = DEFAULT_FRAMES, mp4: bool = False) -> str:
    """Render each spec's reference clip and write ``out_dir/{split}.jsonl`` + ``out_dir/clips/*.npy``."""
    import os

    os.makedirs(os.path.join(out_dir, "clips"), exist_ok=True)
    path = os.path.join(out_dir, f"{split}.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for i, m in enumerate(rows):
            s = _clip_seed(seed, split, i)
            clip = render_clip(m, size, frames, seed=s)
            rel = os.path.join("clips", f"{split}_{i:06d}.npy")
            np.save(os.path.join(out_dir, rel), clip)
            row = {**m, "clip": rel, "seed": s, "size": size, "frames": frames}
            if mp4:
                from mmgrpo.video.writer import write_video

                row["video"] = rel[:-4] + ".mp4"
                write_video(os.path.join(out_dir, row["video"]), clip, m.get("fps", DEFAULT_FPS), crf=10)
            f.write(json.dumps(row) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    from ._cli import int_in

    p = argparse.ArgumentParser(description="Write the Mini-T2V benchmark: {split}.jsonl specs + reference clips "
                                            "(clips/*.npy, uint8 (F, H, W, 3)).")
    p.add_argument("out", help="output folder")
    p.add_argument("--splits", nargs="+", default=list(SPLITS), choices=list(SPLITS), help="splits to write")
    p.add_argument("--n", type=int_in(0), default=200, help="sampled prompts per split (ignored with --all)")
    p.add_argument("--all", action="store_true", help="write every prompt of each split once (fixed order)")
    p.add_argument("--seed", type=int, default=0, help="prompt sampling and clip rendering seed")
    p.add_argument("--tags", nargs="*", default=None, choices=list(TAGS), help="restrict to these prompt tags")
    p.add_argument("--size", type=int_in(32, 1024), default=DEFAULT_SIZE, help="frame side in px (32-1024)")
    p.add_argument("--frames", type=int_in(4, 1024), default=DEFAULT_FRAMES, help="frames per clip (4-1024)")
    p.add_argument("--mp4", action="store_true", help="also write an H.264 mp4 per clip for viewing")
    a = p.parse_args(argv)
    if a.tags is not None and not a.tags:
        p.error("--tags needs at least one tag (leave it out for all tags)")
    for split in a.splits:  # each split's sampling seed depends on the split name only, not on --splits order
        rows = all_prompts(split, a.tags) if a.all else make_prompts(a.n, a.seed * 1000 + SPLITS.index(split),
                                                                      split, a.tags)
        path = write_split(a.out, split, rows, a.seed, a.size, a.frames, a.mp4)
        print(f"wrote {len(rows)} {split} prompts + clips to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
