"""``motion_verifier``: the programmatic verifier of the Mini-T2V benchmark (:mod:`mmgrpo.synthetic.t2v`).

Given decoded frames (F, H, W, 3) uint8 and a prompt's spec, :func:`verify_clip` finds the objects of every frame,
tracks each spec entry by its colour (the entries of one spec have distinct colours) and runs these checks:

Detection (per frame, as Mini-GenEval's detector, :func:`mmgrpo.synthetic.t2i.segment_objects`): a pixel gets
the nearest palette colour if that is within ``max_color_dist`` (RGB) and nearer than the background; 8-connected
components of one colour with ``area >= min_area`` (default ``max(4, 0.008 H W)``, 18 px at 48x48) are objects;
their shape comes from :func:`mmgrpo.synthetic.t2i.classify_shape` (bbox fill, aspect, half-plane asymmetry,
corner fill).  ``n_k(e)`` = the number of objects of entry e's colour on frame k; e is *seen* on frame k when
``n_k(e) >= 1``; ``min_frames = max(1, ceil(min_visible * F))`` (3 of 12 frames by default).

Checks (each passes or fails; ``partial`` = the fraction passed, ``strict`` = all passed):

* ``color[e]``     e is seen on >= ``min_frames`` frames;
* ``shape[e]``     the most frequent shape label among e's detections (all frames) is e's shape;
* ``count[e]``     the most frequent non-zero ``n_k(e)`` (ties go to the larger count) equals e's count;
* ``direction[e]`` (entries with a direction only) on the seen frames whose ``n_k(e)`` equals that modal count,
  the mean centroid of e's objects moves from the first such frame to the last by ``(dx, dy)`` (image y grows
  downwards); along the named axis, signed ``>= min_move * W`` (or ``* H``) and across it
  ``|.| <= max_drift * |along|``; fails with fewer than two such frames;
* ``order``        (specs with an entry of rank 1 only) every entry is seen, and the first frame on which any rank 1
  entry is seen comes after the last of the rank 0 entries' first frames ("A appears, then B");
* ``extra``        objects of colours outside the spec are seen on fewer than ``min_frames`` frames.

A missing entry fails ``color``, ``shape``, ``count`` and ``direction`` (and ``order``); a wrong colour fails
``color`` of that entry and ``extra``; a wrong way fails only ``direction``; swapped appearance fails only
``order``.  The reference clips of every split score strict 1.0 (the oracle; tested).

Reward outputs: ``{name: strict or partial, name + "/strict", name + "/partial"}``.  Input videos: uint8
(B, F, H, W, 3) (numpy or torch), float (B, F, 3, H, W) in [0, 1], or a list of B uint8 (F, H, W, 3) arrays.
Metadata per sample: the benchmark spec (``{"objects": [...]}``) or none, in which case the prompt is looked up in
the grammar (:func:`mmgrpo.synthetic.t2v.parse_prompt`); a prompt outside it raises
:class:`~flow_grpo.rewards.base.RewardError` naming the sample.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from ..media import to_uint8_videos  # noqa: F401 (re-exported: the layouts the verifier takes)
from .base import NanPolicy, Reward, RewardError

__all__ = ["segment_frame", "segment_clip", "verify_clip", "MotionVerifierReward", "to_uint8_videos"]

_AXIS = {"left": (0, -1), "right": (0, 1), "up": (1, -1), "down": (1, 1)}  # (axis: 0 = x, 1 = y; sign)


def segment_frame(frame: np.ndarray, palette: Mapping[str, tuple[int, int, int]] | None = None,
                  background: tuple[int, int, int] | None = None, max_color_dist: float = 80.0,
                  min_area: int | None = None) -> list[dict]:
    """Objects of one uint8 (H, W, 3) frame: ``[{"color", "shape", "area", "centroid": [x, y]}, ...]``.

    Defaults: the Mini-T2V palette and background.  Formulas in the module docstring."""
    img = np.asarray(frame)
    if img.ndim != 3 or img.shape[-1] != 3 or img.dtype != np.uint8:
        raise ValueError(f"frame must be uint8 (H, W, 3), got {img.dtype} {img.shape}")
    return segment_clip(img[None], palette, background, max_color_dist, min_area)[0]


def segment_clip(clip: np.ndarray, palette: Mapping[str, tuple[int, int, int]] | None = None,
                 background: tuple[int, int, int] | None = None, max_color_dist: float = 80.0,
                 min_area: int | None = None) -> list[list[dict]]:
    """:func:`segment_frame` of every frame of a uint8 (F, H, W, 3) clip, vectorised over the clip."""
    from mmgrpo.synthetic import t2i as t2i
    from mmgrpo.synthetic import t2v as t2v

    palette = t2v.COLORS if palette is None else palette
    background = t2v.BACKGROUND if background is None else background
    n_frames, h, w = clip.shape[:3]
    if min_area is None:
        min_area = max(4, int(round(0.008 * h * w)))
    names = list(palette)
    refs = np.array([palette[c] for c in names] + [background], dtype=np.int32)
    d2 = ((clip.astype(np.int32)[..., None, :] - refs) ** 2).sum(axis=-1)  # (F, H, W, K + 1) squared distances
    nearest = d2.argmin(axis=-1)
    cls = np.where((nearest < len(names)) & (d2.min(axis=-1) <= max_color_dist ** 2), nearest, -1)
    labels = _label(cls).reshape(-1)
    out: list[list[dict]] = [[] for _ in range(n_frames)]
    fg = np.nonzero(labels >= 0)[0]
    order = fg[np.argsort(labels[fg], kind="stable")]  # foreground pixels grouped by component
    _ids, starts, counts = np.unique(labels[order], return_index=True, return_counts=True)
    for st, cnt in zip(starts, counts):
        if cnt < min_area:
            continue
        f, ys, xs = np.unravel_index(order[st:st + cnt], (n_frames, h, w))
        out[int(f[0])].append({"color": names[int(cls[f[0], ys[0], xs[0]])],
                               "shape": _shape_of(ys, xs, t2i.classify_shape), "area": int(cnt),
                               "centroid": [float(xs.mean()), float(ys.mean())]})
    return out


def _label(cls: np.ndarray) -> np.ndarray:
    """8-connected components of equal non-negative class within each frame of ``cls`` (F, H, W): every pixel of a
    component gets the smallest flat index in it (-1 off the mask).  Min-label propagation, one numpy step per
    pixel of geodesic radius (objects here are small, so a handful of steps; no scipy needed)."""
    f, h, w = cls.shape
    big = np.iinfo(np.int64).max
    lab = np.where(cls >= 0, np.arange(f * h * w, dtype=np.int64).reshape(f, h, w), big)
    pc = np.pad(cls, ((0, 0), (1, 1), (1, 1)), constant_values=-1)
    shifts = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if dy or dx]
    same = [pc[:, 1 + dy:1 + dy + h, 1 + dx:1 + dx + w] == cls for dy, dx in shifts]
    while True:
        pl = np.pad(lab, ((0, 0), (1, 1), (1, 1)), constant_values=big)
        new = lab
        for (dy, dx), sm in zip(shifts, same):
            new = np.minimum(new, np.where(sm, pl[:, 1 + dy:1 + dy + h, 1 + dx:1 + dx + w], big))
        new = np.where(cls >= 0, new, big)
        if np.array_equal(new, lab):
            return np.where(cls >= 0, lab, -1)
        lab = new


def _shape_of(ys: np.ndarray, xs: np.ndarray, classify) -> str:
    """Mini-GenEval's shape features of one component (see :mod:`mmgrpo.synthetic.t2i`)."""
    x0, x1, y0, y1 = int(xs.min()), int(xs.max()), int(ys.min()), int(ys.max())
    bw, bh, area = x1 - x0 + 1, y1 - y0 + 1, ys.size
    cy, cx = (y0 + y1) / 2.0, (x0 + x1) / 2.0
    asym = max(abs(int((ys < cy).sum()) - int((ys > cy).sum())),
               abs(int((xs < cx).sum()) - int((xs > cx).sum()))) / float(area)
    local = np.zeros((bh, bw), dtype=bool)
    local[ys - y0, xs - x0] = True
    kc = max(1, int(round(0.2 * min(bw, bh))))
    corner = float(np.mean([local[:kc, :kc].mean(), local[:kc, -kc:].mean(), local[-kc:, :kc].mean(),
                            local[-kc:, -kc:].mean()]))
    return classify(area / float(bw * bh), bw / float(bh), asym, corner)


def _mode(values: Sequence, larger_on_tie: bool = False):
    c = Counter(values)
    top = max(c.values())
    tied = [v for v in c if c[v] == top]
    return max(tied) if larger_on_tie else tied[0]


def verify_clip(frames: np.ndarray, spec: Mapping[str, Any], max_color_dist: float = 80.0,
                min_area: int | None = None, min_visible: float = 0.25, min_move: float = 0.25,
                max_drift: float = 0.5) -> dict:
    """Check a clip against a Mini-T2V spec: ``{"strict": bool, "partial": float, "checks": [...], "tracks"}``.

    ``checks``: one dict per check (``{"check", "entry" (index or None), "ok", ...values}``); ``tracks``: per
    entry the seen frames, per-frame counts and (for movers) the displacement.  Formulas in the module docstring.
    """
    from mmgrpo.synthetic.t2v import validate_spec

    clip = np.asarray(frames)
    if clip.ndim != 4 or clip.shape[-1] != 3 or clip.dtype != np.uint8:
        raise ValueError(f"frames must be uint8 (F, H, W, 3), got {clip.dtype} {clip.shape}")
    objs = validate_spec(spec)
    n_frames, h, w = clip.shape[:3]
    min_frames = max(1, math.ceil(min_visible * n_frames))
    dets = segment_clip(clip, max_color_dist=max_color_dist, min_area=min_area)
    checks: list[dict] = []
    tracks: list[dict] = []
    first_seen: list[int | None] = []
    for i, e in enumerate(objs):
        per = [[o for o in fr if o["color"] == e["color"]] for fr in dets]
        counts = [len(p) for p in per]
        seen = [k for k in range(n_frames) if counts[k]]
        first_seen.append(seen[0] if seen else None)
        checks.append({"check": "color", "entry": i, "ok": len(seen) >= min_frames, "frames_seen": len(seen),
                       "min_frames": min_frames})
        shapes = [o["shape"] for p in per for o in p]
        shape = _mode(shapes) if shapes else None
        checks.append({"check": "shape", "entry": i, "ok": shape == e["shape"], "shape": shape})
        count = _mode([counts[k] for k in seen], larger_on_tie=True) if seen else 0
        checks.append({"check": "count", "entry": i, "ok": count == e["count"], "count": count})
        track = {"entry": i, "color": e["color"], "counts": counts}
        if e["direction"] != "none":
            checks.append(_direction_check(i, e["direction"], per, count, (w, h), min_move, max_drift, track))
        tracks.append(track)
    if any(e["order"] == 1 for e in objs):
        r0 = [f for f, e in zip(first_seen, objs) if e["order"] == 0]
        r1 = [f for f, e in zip(first_seen, objs) if e["order"] == 1]
        ok = None not in first_seen and max(r0) < min(r1)  # type: ignore[type-var]
        checks.append({"check": "order", "entry": None, "ok": bool(ok), "first_seen": first_seen})
    spec_colors = {e["color"] for e in objs}
    extra_frames = sum(1 for fr in dets if any(o["color"] not in spec_colors for o in fr))
    checks.append({"check": "extra", "entry": None, "ok": extra_frames < min_frames, "frames_with_extra": extra_frames})
    passed = [c["ok"] for c in checks]
    return {"strict": bool(all(passed)), "partial": float(np.mean(passed)), "checks": checks, "tracks": tracks}


def _direction_check(i: int, direction: str, per: list[list[dict]], count: int, wh: tuple[int, int],
                     min_move: float, max_drift: float, track: dict) -> dict:
    frames = [k for k, p in enumerate(per) if p and len(p) == count]
    out = {"check": "direction", "entry": i, "ok": False, "direction": direction, "dx": None, "dy": None}
    if len(frames) < 2:
        return out
    a = np.mean([o["centroid"] for o in per[frames[0]]], axis=0)
    b = np.mean([o["centroid"] for o in per[frames[-1]]], axis=0)
    d = b - a
    axis, sign = _AXIS[direction]
    along, across = sign * float(d[axis]), abs(float(d[1 - axis]))
    out.update(dx=round(float(d[0]), 3), dy=round(float(d[1]), 3),
               ok=bool(along >= min_move * wh[axis] and across <= max_drift * abs(along)))
    track["displacement"] = [out["dx"], out["dy"]]
    return out


# ----------------------------------------------------------------------------------------------------------
# reward
# ----------------------------------------------------------------------------------------------------------
class MotionVerifierReward(Reward):
    """Mini-T2V verifier reward (strict or partial); see the module docstring.

    Args:
        mode: ``"strict"`` (1 iff every check passes) or ``"partial"`` (fraction of checks passed).
        max_color_dist, min_area, min_visible, min_move, max_drift: :func:`verify_clip` thresholds.
        name (default ``"motion_verifier"``), nan_policy.
    """

    name = "motion_verifier"
    accepts_video = True  # MultiReward passes it the (B, F, H, W, 3) videos (flow_grpo.rewards.base)
    video_only = True  # Reward.evaluate converts with flow_grpo.media.to_uint8_videos

    def __init__(self, mode: Literal["strict", "partial"] = "strict", max_color_dist: float = 80.0,
                 min_area: int | None = None, min_visible: float = 0.25, min_move: float = 0.25,
                 max_drift: float = 0.5, name: str | None = None, nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        if mode not in ("strict", "partial"):
            raise ValueError(f"mode must be 'strict' or 'partial', got {mode!r}")
        self.mode = mode
        self.kw = dict(max_color_dist=float(max_color_dist), min_area=min_area, min_visible=float(min_visible),
                       min_move=float(min_move), max_drift=float(max_drift))

    def score(self, images, prompts, metadata, **kwargs: Any):
        from mmgrpo.synthetic.t2v import parse_prompt

        n = images.shape[0]
        strict, partial = np.zeros(n), np.zeros(n)
        for i in range(n):
            spec = metadata[i] if "objects" in metadata[i] else parse_prompt(prompts[i])
            if spec is None:
                raise RewardError(f"reward {self.name!r}: sample {i} has no 'objects' metadata and its prompt "
                                  f"{prompts[i]!r} is not a Mini-T2V prompt", self.name, [i])
            try:
                res = verify_clip(images[i], spec, **self.kw)
            except ValueError as e:
                raise RewardError(f"reward {self.name!r}: sample {i}: {e}", self.name, [i]) from e
            strict[i], partial[i] = float(res["strict"]), res["partial"]
        return {self.name: strict if self.mode == "strict" else partial,
                f"{self.name}/strict": strict, f"{self.name}/partial": partial}

