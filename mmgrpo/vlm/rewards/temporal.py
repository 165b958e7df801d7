"""Temporal overlap rewards and metrics on spans in seconds (pure Python floats; no torch).

A span is anything with ``.start/.end`` (:class:`~mmgrpo.vlm.rewards.parsing.Span`) or a 2-sequence ``(s, e)``.
Every function first **orders** each span (a reversed ``(e, s)`` is swapped) and, when ``duration`` D is given,
**clamps** both ends to ``[0, D]``. Non-finite inputs raise ``ValueError`` (the parsers never produce them, so
seeing one is a bug upstream, not a zero reward).

Zero-length / zero-union convention (deliberate, differs from VideoChat-R1 which returns 1 on a zero union):
a span of zero length has zero measure, so it overlaps nothing: ``IoU = 0`` whenever the union is 0. Otherwise
a prediction collapsed by clamping (e.g. both ends past the video end -> ``[D, D]``) would score 1 against a
ground truth that was itself clamped to ``[D, D]``. Consequently ``temporal_iou(p, g) == 1`` iff ``p == g`` and
``e > s``. Data loaders should reject zero-length ground truth; here it simply scores 0 for every prediction.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Optional, Sequence

__all__ = [
    "as_span",
    "clamp_span",
    "temporal_iou",
    "boundary_iou",
    "gaussian_boundary_reward",
    "merge_intervals",
    "multi_interval_iou",
    "interval_iop",
    "multi_interval_iop",
    "threshold_reward",
]


def as_span(x: Any) -> tuple[float, float]:
    """``(s, e)`` floats, swapped so that ``s <= e``. Raises ValueError on non-finite or malformed input."""
    if hasattr(x, "start") and hasattr(x, "end"):
        s, e = x.start, x.end
    else:
        try:
            s, e = x
        except (TypeError, ValueError):
            raise ValueError(f"a span must be (start, end), got {x!r}") from None
    try:
        s, e = float(s), float(e)
    except (TypeError, ValueError):
        raise ValueError(f"span ends must be numbers, got {x!r}") from None
    if not (math.isfinite(s) and math.isfinite(e)):
        raise ValueError(f"span has a non-finite end: {x!r}")
    return (s, e) if s <= e else (e, s)


def _check_duration(duration: Optional[float], required: bool = False) -> Optional[float]:
    if duration is None:
        if required:
            raise ValueError("duration is required")
        return None
    d = float(duration)
    if not (math.isfinite(d) and d > 0):
        raise ValueError(f"duration must be a finite positive number, got {duration!r}")
    return d


def clamp_span(x: Any, lo: float = 0.0, hi: Optional[float] = None) -> tuple[float, float]:
    """Order the span, then clamp both ends to ``[lo, hi]`` (``hi=None``: no upper bound)."""
    s, e = as_span(x)
    s, e = max(s, lo), max(e, lo)
    if hi is not None:
        s, e = min(s, hi), min(e, hi)
    return s, e


def _prep(x: Any, duration: Optional[float]) -> tuple[float, float]:
    return clamp_span(x, 0.0, duration) if duration is not None else as_span(x)


def temporal_iou(pred: Any, gt: Any, *, duration: Optional[float] = None) -> float:
    """tIoU = max(0, min(e_p, e_g) − max(s_p, s_g)) / (max(e_p, e_g) − min(s_p, s_g)), in [0, 1].

    The denominator is the hull of the two spans, which equals the union whenever they overlap (and when they
    do not, the numerator is 0). A zero denominator (both spans the same point) gives 0, see module docstring.
    """
    d = _check_duration(duration)
    sp, ep = _prep(pred, d)
    sg, eg = _prep(gt, d)
    inter = min(ep, eg) - max(sp, sg)
    union = max(ep, eg) - min(sp, sg)
    if inter <= 0.0 or union <= 0.0:
        return 0.0
    return min(1.0, inter / union)


def boundary_iou(pred: Any, gt: Any, *, duration: float) -> float:
    """Time-R1 ``iou_v2``: tIoU · (1 − |s_p − s_g|/D) · (1 − |e_p − e_g|/D), spans clamped to [0, D]."""
    d = _check_duration(duration, required=True)
    sp, ep = clamp_span(pred, 0.0, d)
    sg, eg = clamp_span(gt, 0.0, d)
    iou = temporal_iou((sp, ep), (sg, eg))
    return iou * (1.0 - abs(sp - sg) / d) * (1.0 - abs(ep - eg) / d)


def gaussian_boundary_reward(pred: Any, gt: Any, *, duration: float, sigma: float = 0.1) -> float:
    """Soft boundary reward exp(−((s_p − s_g)² + (e_p − e_g)²) / (2 σ² D²)), spans clamped to [0, D].

    ``sigma`` is a fraction of the duration. Unlike IoU it is non-zero for disjoint spans, so groups whose
    members all miss the ground truth still get a learning signal. It is 1 iff both boundaries match exactly.
    """
    d = _check_duration(duration, required=True)
    sigma = float(sigma)
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be a finite positive number, got {sigma!r}")
    sp, ep = clamp_span(pred, 0.0, d)
    sg, eg = clamp_span(gt, 0.0, d)
    return math.exp(-((sp - sg) ** 2 + (ep - eg) ** 2) / (2.0 * sigma**2 * d**2))


def merge_intervals(spans: Iterable[Any], *, duration: Optional[float] = None) -> list[tuple[float, float]]:
    """Order, clamp (if ``duration``), sort and merge overlapping or touching spans; zero-length spans are
    dropped (they have zero measure)."""
    d = _check_duration(duration)
    items = sorted(_prep(x, d) for x in spans)
    out: list[tuple[float, float]] = []
    for s, e in items:
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _measure(merged: Sequence[tuple[float, float]]) -> float:
    return sum(e - s for s, e in merged)


def _intersection(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    """Measure of the intersection of two merged (sorted, disjoint) interval lists; two-pointer sweep."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo = max(a[i][0], b[j][0])
        hi = min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def multi_interval_iou(preds: Iterable[Any], gts: Iterable[Any], *, duration: Optional[float] = None) -> float:
    """|∪P ∩ ∪G| / |∪P ∪ ∪G| after merging each side (VideoChat-R1 "glue" IoU); zero union gives 0."""
    p = merge_intervals(preds, duration=duration)
    g = merge_intervals(gts, duration=duration)
    inter = _intersection(p, g)
    union = _measure(p) + _measure(g) - inter
    if inter <= 0.0 or union <= 0.0:
        return 0.0
    return min(1.0, inter / union)


def interval_iop(pred: Any, gt: Any, *, duration: Optional[float] = None) -> float:
    """Intersection over prediction |P ∩ G| / |P| (NExT-GQA IoP). A zero-length prediction gives 0 (the
    official NExT-GQA script gives 1 to a point inside the ground truth; we do not reward collapsed spans; the
    ``nextgqa`` parse mode and ``eval/score.py --protocol official`` reproduce the official rule)."""
    return multi_interval_iop([pred], [gt], duration=duration)


def multi_interval_iop(preds: Iterable[Any], gts: Iterable[Any], *, duration: Optional[float] = None) -> float:
    """|∪P ∩ ∪G| / |∪P|; zero-measure prediction gives 0."""
    p = merge_intervals(preds, duration=duration)
    g = merge_intervals(gts, duration=duration)
    mp = _measure(p)
    if mp <= 0.0:
        return 0.0
    return min(1.0, _intersection(p, g) / mp)


def threshold_reward(iou: float, thresholds: Sequence[float] = (0.3, 0.5, 0.7)) -> float:
    """Mean over θ of 1[iou ≥ θ] (a single θ gives the R1@θ indicator)."""
    iou = float(iou)
    if not math.isfinite(iou):
        raise ValueError(f"iou must be finite, got {iou!r}")
    if len(thresholds) == 0:
        raise ValueError("thresholds must be non-empty")
    return sum(1.0 for t in thresholds if iou >= t) / len(thresholds)
