"""Mini-GenEval: a synthetic text-to-image benchmark with a programmatic (verifiable) reward.

Prompts are built from a tiny grammar over 4 colours x 3 shapes x counts 1-4 x 4 spatial relations, e.g.
``"two red circles"``, ``"a blue square on the left of a green triangle"``.  Each prompt carries GenEval-style
metadata::

    {"prompt": "a blue square on the left of a green triangle", "tag": "position", "split": "train",
     "include": [{"class": "triangle", "color": "green", "count": 1},
                 {"class": "square", "color": "blue", "count": 1, "position": ["left of", 0]}]}

(``position: [rel, j]`` means "this object is ``rel`` object ``j``"; ``color`` is absent when the prompt does
not name one.)  Tags: ``single_object`` ("a circle"), ``colors`` ("a red circle"), ``counting``
("three yellow squares", counts 2-4), ``color_attr`` ("a red circle and a blue square"), ``position``.

* :func:`make_prompts` samples prompts of one split.  Train and held-out splits are disjoint at the level of
  *content* (the canonical combo: "A and B" == "B and A", "A left of B" == "B right of A"), chosen per tag by a
  stable hash (no dependence on ``PYTHONHASHSEED``).
* :func:`render` draws a correct image (white background, flat palette colours, no anti-aliasing).
* :func:`verify` checks any uint8 HWC image against the metadata with colour masks + connected components +
  shape classification, and returns ``score`` in [0, 1] (partial credit) and ``correct`` (strict).

Scoring (``verify``)
--------------------
Pixels are labelled with the nearest palette colour if its RGB distance is ``<= max_color_dist`` and nearer
than the background; 8-connected components of each colour with area ``>= min_area`` are objects (smaller ones
are counted as noise and ignored).  Shape from the component's pixels inside its bounding box (w x h):
``extent = area / (w h)``, ``aspect = w / h``, ``asym = max(|#above - #below|, |#left - #right|) / area``
(pixels above/below/left/right of the bbox centre: ~0 for circles and squares, ~0.5 for a triangle pointing in
any axis direction) and ``corner`` = mean fill of the four k x k bbox corners, ``k = max(1, round(0.2 min(w, h)))``
(~1 for squares, <= 1/3 for circles).  With ``0.5 <= aspect <= 2``:

* ``asym >= 0.25``:  triangle if ``0.36 <= extent < 0.8``
* ``corner >= 0.5``: square if ``extent >= 0.7``
* otherwise:         circle if ``0.6 <= extent < 0.93``

and ``unknown`` in every other case (elongated bars, outlines, rings, a 45-degree rotated square).  Objects
should be >= ~10 px across for anti-aliased input (smaller anti-aliased circles and squares are ambiguous);
crisp renders verify from 8 px.

For include entry e with count k_e: ``n_e`` = #objects matching class and colour (colour wildcard when absent),
``m_e`` = #objects matching the class only, ``g(n, k) = max(0, 1 - |n - k| / k)``, and
``c_e = (g(m_e, k_e) + g(n_e, k_e)) / 2``.  For each position constraint p (entry e is ``rel`` of entry j):
``c_p = 1`` iff ``n_e = n_j = 1`` and the centroids satisfy the relation with margin ``rel_margin * W``
("left of": ``x_e < x_j - margin``; "above": ``y_e < y_j - margin``; image y grows downwards), else 0.
``x`` = #objects matching no entry.  Then

    score   = mean(c_e ..., c_p ...) / (1 + x)
    correct = all n_e == k_e  and  all c_p == 1  and  x == 0

CLI: ``python data/synthetic_t2i.py --n 1000 --split train --seed 0 --out train.jsonl [--images DIR]``
(or ``python -m mmgrpo.synthetic.t2i ...``).  This module is part of the installed package (the
``mini_geneval`` reward imports it); ``data/synthetic_t2i.py`` in a source checkout is an alias of it.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "COLORS", "BACKGROUND", "SHAPES", "COUNTS", "RELATIONS", "TAGS",
    "all_prompts", "make_prompts", "parse_prompt", "render", "verify", "segment_objects",
    "connected_components", "classify_shape",
]

# Flat, well-separated palette (min pairwise RGB distance ~150) so a tiny generator can learn it.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 200, 30),
}
BACKGROUND: tuple[int, int, int] = (255, 255, 255)
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
COUNTS: tuple[int, ...] = (2, 3, 4)  # counting prompts; the other tags use count 1
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
TAGS: tuple[str, ...] = ("single_object", "colors", "counting", "color_attr", "position")

_NUM = {1: "a", 2: "two", 3: "three", 4: "four"}
_PLURAL = {"circle": "circles", "square": "squares", "triangle": "triangles"}
_REL_PHRASE = {"left of": "on the left of", "right of": "on the right of", "above": "above", "below": "below"}
_INVERSE = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
HELDOUT_FRACTION = 0.2


# ----------------------------------------------------------------------------------------------------------
# prompts
# ----------------------------------------------------------------------------------------------------------
def _obj(shape: str, color: str | None = None, count: int = 1) -> dict:
    d: dict[str, Any] = {"class": shape}
    if color is not None:
        d["color"] = color
    d["count"] = count
    return d


def _phrase(color: str | None, shape: str, count: int = 1) -> str:
    words = [_NUM[count]] + ([color] if color else []) + [shape if count == 1 else _PLURAL[shape]]
    return " ".join(words)


def _variants() -> list[tuple[str, str, dict]]:
    """Every (tag, canonical_key, metadata) the grammar can produce (phrasing variants included)."""
    out: list[tuple[str, str, dict]] = []
    pairs = [(c, s) for c in COLORS for s in SHAPES]
    for s in SHAPES:
        out.append(("single_object", s, {"prompt": _phrase(None, s), "tag": "single_object", "include": [_obj(s)]}))
    for c, s in pairs:
        out.append(("colors", f"{c} {s}", {"prompt": _phrase(c, s), "tag": "colors", "include": [_obj(s, c)]}))
    for k in COUNTS:
        for c, s in pairs:
            out.append(("counting", f"{k} {c} {s}",
                        {"prompt": _phrase(c, s, k), "tag": "counting", "include": [_obj(s, c, k)]}))
    for (c1, s1) in pairs:
        for (c2, s2) in pairs:
            if c1 == c2 or s1 == s2:
                continue
            key = " & ".join(sorted([f"{c1} {s1}", f"{c2} {s2}"]))
            out.append(("color_attr", key, {"prompt": f"{_phrase(c1, s1)} and {_phrase(c2, s2)}",
                                            "tag": "color_attr", "include": [_obj(s1, c1), _obj(s2, c2)]}))
    for (c1, s1) in pairs:
        for (c2, s2) in pairs:
            if s1 == s2:
                continue
            for rel in RELATIONS:
                a, b, r = f"{c1} {s1}", f"{c2} {s2}", rel
                if r in ("right of", "below"):  # canonical: "A left of B" == "B right of A"
                    a, b, r = b, a, _INVERSE[r]
                # GenEval layout: include[0] is the reference object, include[1] is `rel` of it.
                out.append(("position", f"{a} {r} {b}", {
                    "prompt": f"{_phrase(c1, s1)} {_REL_PHRASE[rel]} {_phrase(c2, s2)}", "tag": "position",
                    "include": [_obj(s2, c2), {**_obj(s1, c1), "position": [rel, 0]}]}))
    return out


def stable_rank(salt: str, tag: str, key: str) -> str:
    """A per-(tag, key) sort key that depends on no RNG state or Python hash seed (the held-out split of a
    benchmark must be the same on every machine); ``salt`` names the benchmark, so two benchmarks split
    independently."""
    return hashlib.sha1(f"{salt}|{tag}|{key}".encode()).hexdigest()


_TABLE: dict[str, list[dict]] | None = None
_BY_PROMPT: dict[str, dict] | None = None


def _table() -> dict[str, list[dict]]:
    """split -> list of metadata dicts (with "split"), built once."""
    global _TABLE, _BY_PROMPT
    if _TABLE is None:
        variants = _variants()
        heldout_keys: set[tuple[str, str]] = set()
        for tag in TAGS:
            keys = sorted({k for t, k, _ in variants if t == tag}, key=lambda k: stable_rank("mini-geneval", tag, k))
            n_held = max(1, math.ceil(HELDOUT_FRACTION * len(keys))) if len(keys) > 1 else 0
            heldout_keys.update((tag, k) for k in keys[:n_held])
        table: dict[str, list[dict]] = {"train": [], "heldout": []}
        for tag, key, md in variants:
            split = "heldout" if (tag, key) in heldout_keys else "train"
            table[split].append({**md, "split": split, "combo": key})
        _TABLE = table
        _BY_PROMPT = {m["prompt"]: m for ms in table.values() for m in ms}
    return _TABLE


def _check_split(split: str) -> str:
    split = {"test": "heldout", "held_out": "heldout", "eval": "heldout"}.get(split, split)
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    return split


def all_prompts(split: str = "train", tags: Sequence[str] | None = None) -> list[dict]:
    """Every prompt of a split (deep copies of the metadata), in a fixed order."""
    split = _check_split(split)
    tags = _check_tags(tags)
    return [json.loads(json.dumps(m)) for m in _table()[split] if m["tag"] in tags]


def _check_tags(tags: Sequence[str] | None) -> tuple[str, ...]:
    if tags is None:
        return TAGS
    bad = [t for t in tags if t not in TAGS]
    if bad:
        raise ValueError(f"unknown tags {bad}; choose from {TAGS}")
    return tuple(tags)


def make_prompts(n: int, seed: int = 0, split: str = "train", tags: Sequence[str] | None = None) -> list[dict]:
    """Sample ``n`` prompts of ``split`` ("train" | "heldout"): tag uniform over ``tags``, then a prompt
    uniform within the tag.  Deterministic in ``seed``.  Returns metadata dicts (with ``"prompt"``)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    split = _check_split(split)
    tags = _check_tags(tags)
    by_tag = {t: [m for m in _table()[split] if m["tag"] == t] for t in tags}
    by_tag = {t: ms for t, ms in by_tag.items() if ms}
    if not by_tag:
        raise ValueError(f"no prompts for tags {tags} in split {split!r}")
    rng = random.Random(seed)
    names = sorted(by_tag)
    return [json.loads(json.dumps(rng.choice(by_tag[rng.choice(names)]))) for _ in range(n)]


def parse_prompt(prompt: str) -> dict | None:
    """Metadata of a grammar prompt (any split), or None if the prompt is not from this grammar."""
    _table()
    assert _BY_PROMPT is not None
    m = _BY_PROMPT.get(prompt.strip())
    return None if m is None else json.loads(json.dumps(m))


# ----------------------------------------------------------------------------------------------------------
# metadata validation
# ----------------------------------------------------------------------------------------------------------
def _validate(metadata: Mapping[str, Any]) -> list[dict]:
    inc = metadata.get("include") if isinstance(metadata, Mapping) else None
    if not isinstance(inc, list) or not inc:
        raise ValueError(f"metadata needs a non-empty 'include' list, got {metadata!r}")
    for i, e in enumerate(inc):
        if not isinstance(e, Mapping):
            raise ValueError(f"include[{i}] must be a dict, got {e!r}")
        if e.get("class") not in SHAPES:
            raise ValueError(f"include[{i}].class must be one of {SHAPES}, got {e.get('class')!r}")
        if e.get("color") is not None and e["color"] not in COLORS:
            raise ValueError(f"include[{i}].color must be one of {tuple(COLORS)}, got {e['color']!r}")
        k = e.get("count", 1)
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"include[{i}].count must be a positive int, got {k!r}")
        pos = e.get("position")
        if pos is not None:
            if (not isinstance(pos, (list, tuple)) or len(pos) != 2 or pos[0] not in RELATIONS
                    or not isinstance(pos[1], int) or not 0 <= pos[1] < len(inc) or pos[1] == i):
                raise ValueError(f"include[{i}].position must be [relation in {RELATIONS}, other index], "
                                 f"got {pos!r}")
            if k != 1 or inc[pos[1]].get("count", 1) != 1:
                raise ValueError(f"include[{i}].position needs count 1 on both objects")
    return [dict(e) for e in inc]


# ----------------------------------------------------------------------------------------------------------
# rendering
# ----------------------------------------------------------------------------------------------------------
def _draw_shape(draw: Any, shape: str, x0: int, y0: int, d: int, color: tuple[int, int, int]) -> None:
    x1, y1 = x0 + d - 1, y0 + d - 1
    if shape == "circle":
        draw.ellipse([x0, y0, x1, y1], fill=color)
    elif shape == "square":
        draw.rectangle([x0, y0, x1, y1], fill=color)
    elif shape == "triangle":
        draw.polygon([(x0, y1), (x1, y1), (x0 + (d - 1) / 2.0, y0)], fill=color)
    else:  # pragma: no cover - validated earlier
        raise ValueError(shape)


def _relation_holds(rel: str, a: tuple[float, float], b: tuple[float, float], margin: float) -> bool:
    """Is point ``a`` = (x, y) ``rel`` point ``b``?  y grows downwards."""
    if rel == "left of":
        return a[0] < b[0] - margin
    if rel == "right of":
        return a[0] > b[0] + margin
    if rel == "above":
        return a[1] < b[1] - margin
    if rel == "below":
        return a[1] > b[1] + margin
    raise ValueError(f"unknown relation {rel!r}")


def render(metadata: Mapping[str, Any], size: int = 64, seed: int = 0) -> np.ndarray:
    """Draw an image satisfying ``metadata``: uint8 (size, size, 3), white background, palette colours.

    Objects are ``d x d`` with ``d ~ U[0.2, 0.28] * size`` (at least 8 px), placed without overlap with a gap
    of ``max(2, size // 16)`` px; position constraints are satisfied along their axis with margin ``0.15 size``
    and dominate the other axis.  Uncoloured entries get a random palette colour.
    """
    from PIL import Image, ImageDraw

    if size < 24:
        raise ValueError(f"size must be >= 24, got {size}")
    inc = _validate(metadata)
    rng = random.Random(seed)
    palette = list(COLORS)
    objs: list[tuple[int, str, str]] = []  # (entry index, shape, colour)
    for i, e in enumerate(inc):
        for _ in range(e.get("count", 1)):
            objs.append((i, e["class"], e.get("color") or rng.choice(palette)))
    gap = max(2, size // 16)
    margin = 0.15 * size
    for _attempt in range(200):
        boxes: list[tuple[int, int, int]] = []
        centres: dict[int, tuple[float, float]] = {}
        ok = True
        for (i, _shape, _col) in objs:
            d = max(8, int(round(rng.uniform(0.2, 0.28) * size)))
            placed = False
            for _try in range(100):
                x0, y0 = rng.randint(1, size - d - 1), rng.randint(1, size - d - 1)
                if any(x0 < bx + bd + gap and bx < x0 + d + gap and y0 < by + bd + gap and by < y0 + d + gap
                       for bx, by, bd in boxes):
                    continue
                c = (x0 + (d - 1) / 2.0, y0 + (d - 1) / 2.0)
                pos = inc[i].get("position")
                if pos is not None and pos[1] in centres:
                    ref = centres[pos[1]]
                    axis = 0 if pos[0] in ("left of", "right of") else 1
                    if not _relation_holds(pos[0], c, ref, margin) or \
                            abs(c[1 - axis] - ref[1 - axis]) >= abs(c[axis] - ref[axis]):
                        continue
                boxes.append((x0, y0, d))
                centres.setdefault(i, c)
                placed = True
                break
            if not placed:
                ok = False
                break
        if ok:
            img = Image.new("RGB", (size, size), BACKGROUND)
            draw = ImageDraw.Draw(img)
            for (i, shape, col), (x0, y0, d) in zip(objs, boxes):
                _draw_shape(draw, shape, x0, y0, d, COLORS[col])
            return np.asarray(img, dtype=np.uint8).copy()
    raise RuntimeError(f"could not place {len(objs)} objects in a {size}px image for {metadata.get('prompt')!r}")


# ----------------------------------------------------------------------------------------------------------
# verification
# ----------------------------------------------------------------------------------------------------------
def connected_components(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """8-connected components of a bool (H, W) mask -> (labels int32 (H, W), n); 0 = background, 1..n.

    Uses ``scipy.ndimage.label`` when scipy is installed, else a BFS over the foreground pixels.
    """
    mask = np.asarray(mask, dtype=bool)
    try:
        from scipy import ndimage  # type: ignore[import-not-found]

        labels, n = ndimage.label(mask, structure=np.ones((3, 3), dtype=int))
        return labels.astype(np.int32), int(n)
    except ImportError:
        pass
    h, w = mask.shape
    labels = np.zeros((h, w), dtype=np.int32)
    n = 0
    for y0, x0 in zip(*np.nonzero(mask)):
        if labels[y0, x0]:
            continue
        n += 1
        labels[y0, x0] = n
        q = deque([(int(y0), int(x0))])
        while q:
            y, x = q.popleft()
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    yy, xx = y + dy, x + dx
                    if 0 <= yy < h and 0 <= xx < w and mask[yy, xx] and not labels[yy, xx]:
                        labels[yy, xx] = n
                        q.append((yy, xx))
    return labels, n


def classify_shape(extent: float, aspect: float, asym: float, corner: float) -> str:
    """Shape from bbox fill ``extent``, ``aspect = w / h``, half-plane asymmetry ``asym`` and corner fill
    ``corner`` (thresholds in the module docstring)."""
    if not 0.5 <= aspect <= 2.0:
        return "unknown"
    if asym >= 0.25:
        return "triangle" if 0.36 <= extent < 0.8 else "unknown"
    if corner >= 0.5:
        return "square" if extent >= 0.7 else "unknown"
    return "circle" if 0.6 <= extent < 0.93 else "unknown"


def segment_objects(image: np.ndarray, max_color_dist: float = 80.0, min_area: int | None = None
                    ) -> tuple[list[dict], int]:
    """Detect palette-coloured objects: returns (objects, n_noise_components).

    Each object: ``{"color", "shape", "area", "bbox": [x0, y0, x1, y1], "centroid": [x, y], "extent",
    "aspect", "asym", "corner"}``.  ``min_area`` defaults to ``max(4, 0.004 * H * W)``.
    """
    img = np.asarray(image)
    if img.ndim != 3 or img.shape[-1] != 3 or img.dtype != np.uint8:
        raise ValueError(f"image must be uint8 (H, W, 3), got {img.dtype} {img.shape}")
    h, w = img.shape[:2]
    if min_area is None:
        min_area = max(4, int(round(0.004 * h * w)))
    names = list(COLORS)
    refs = np.array([COLORS[c] for c in names] + [BACKGROUND], dtype=np.float32)  # (K+1, 3)
    dist = np.linalg.norm(img.astype(np.float32)[:, :, None, :] - refs[None, None], axis=-1)  # (H, W, K+1)
    nearest = dist.argmin(axis=-1)
    ok = (nearest < len(names)) & (dist.min(axis=-1) <= max_color_dist)
    objects: list[dict] = []
    noise = 0
    for k, cname in enumerate(names):
        labels, n = connected_components(ok & (nearest == k))
        for lab in range(1, n + 1):
            ys, xs = np.nonzero(labels == lab)
            area = int(ys.size)
            if area < min_area:
                noise += 1
                continue
            x0, x1, y0, y1 = int(xs.min()), int(xs.max()), int(ys.min()), int(ys.max())
            bw, bh = x1 - x0 + 1, y1 - y0 + 1
            extent, aspect = area / float(bw * bh), bw / float(bh)
            cy, cx = (y0 + y1) / 2.0, (x0 + x1) / 2.0
            asym = max(abs(int((ys < cy).sum()) - int((ys > cy).sum())),
                       abs(int((xs < cx).sum()) - int((xs > cx).sum()))) / float(area)
            local = np.zeros((bh, bw), dtype=bool)
            local[ys - y0, xs - x0] = True
            kc = max(1, int(round(0.2 * min(bw, bh))))
            corner = float(np.mean([local[:kc, :kc].mean(), local[:kc, -kc:].mean(),
                                    local[-kc:, :kc].mean(), local[-kc:, -kc:].mean()]))
            objects.append({"color": cname, "shape": classify_shape(extent, aspect, asym, corner), "area": area,
                            "bbox": [x0, y0, x1, y1], "centroid": [float(xs.mean()), float(ys.mean())],
                            "extent": round(extent, 4), "aspect": round(aspect, 4), "asym": round(asym, 4),
                            "corner": round(corner, 4)})
    return objects, noise


def verify(image: np.ndarray, metadata: Mapping[str, Any], max_color_dist: float = 80.0,
           min_area: int | None = None, rel_margin: float = 0.05) -> dict:
    """Score an image against GenEval-style metadata: ``{"score": float in [0,1], "correct": bool, "details"}``.

    Formulas in the module docstring.  ``details`` has the detected objects, per-entry counts, position
    results, extra and noise counts (JSON-serialisable).
    """
    inc = _validate(metadata)
    objects, noise = segment_objects(image, max_color_dist, min_area)
    width = np.asarray(image).shape[1]

    def matches(o: dict, e: Mapping[str, Any], colour: bool) -> bool:
        return o["shape"] == e["class"] and (not colour or e.get("color") is None or o["color"] == e["color"])

    entries, credits, matched = [], [], set()
    full_matches: list[list[int]] = []
    for e in inc:
        k = e.get("count", 1)
        full = [j for j, o in enumerate(objects) if matches(o, e, True)]
        m = sum(matches(o, e, False) for o in objects)
        g = lambda n_: max(0.0, 1.0 - abs(n_ - k) / k)  # noqa: E731
        credits.append(0.5 * (g(m) + g(len(full))))
        matched.update(full)
        full_matches.append(full)
        entries.append({"class": e["class"], "color": e.get("color"), "count": k, "found": len(full),
                        "found_any_color": m})
    positions = []
    for i, e in enumerate(inc):
        pos = e.get("position")
        if pos is None:
            continue
        rel, j = pos
        ok = False
        if len(full_matches[i]) == 1 and len(full_matches[j]) == 1:
            a, b = objects[full_matches[i][0]]["centroid"], objects[full_matches[j][0]]["centroid"]
            ok = _relation_holds(rel, tuple(a), tuple(b), rel_margin * width)
        credits.append(1.0 if ok else 0.0)
        positions.append({"entry": i, "relation": rel, "reference": j, "ok": ok})
    extras = len(objects) - len(matched)
    score = float(np.mean(credits)) / (1.0 + extras)
    correct = (all(en["found"] == en["count"] for en in entries) and all(p["ok"] for p in positions)
               and extras == 0)
    return {"score": score, "correct": bool(correct),
            "details": {"objects": objects, "entries": entries, "positions": positions, "extras": extras,
                        "noise_components": noise}}


# ----------------------------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import os

    from ._cli import int_in

    p = argparse.ArgumentParser(description="Write Mini-GenEval prompts (JSONL, one metadata dict per line).")
    p.add_argument("--n", type=int_in(0), default=1000, help="number of sampled prompts (ignored with --all)")
    p.add_argument("--all", action="store_true", help="write every prompt of the split once")
    p.add_argument("--split", default="train", choices=["train", "heldout"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tags", nargs="*", default=None, choices=list(TAGS))
    p.add_argument("--out", required=True)
    p.add_argument("--images", default=None, help="also render a reference PNG per prompt into this folder")
    p.add_argument("--size", type=int_in(24, 4096), default=64, help="reference image side in px (24-4096)")
    a = p.parse_args(argv)
    if a.tags is not None and not a.tags:
        p.error("--tags needs at least one tag (leave it out for all tags)")
    rows = all_prompts(a.split, a.tags) if a.all else make_prompts(a.n, a.seed, a.split, a.tags)
    if a.images:
        from PIL import Image

        os.makedirs(a.images, exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        for i, m in enumerate(rows):
            if a.images:
                path = os.path.join(a.images, f"{i:06d}.png")
                Image.fromarray(render(m, a.size, seed=a.seed * 1_000_003 + i)).save(path)
                m["image"] = path
            f.write(json.dumps(m) + "\n")
    print(f"wrote {len(rows)} prompts to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
