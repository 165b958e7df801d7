"""Numeric-answer rewards (pure Python).

``relative error`` = |ŷ − y| / |y|; for y = 0 the absolute error |ŷ| is used instead.
"""
from __future__ import annotations

import math
from typing import Literal, Optional, Sequence

__all__ = ["relative_error", "numeric_reward", "mean_relative_accuracy"]

MRA_THRESHOLDS: tuple[float, ...] = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))  # 0.50, 0.55, ..., 0.95


def _finite(x: float, name: str) -> float:
    v = float(x)
    if not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {x!r}")
    return v


def relative_error(pred: float, gt: float) -> float:
    p, g = _finite(pred, "pred"), _finite(gt, "gt")
    return abs(p - g) / abs(g) if g != 0 else abs(p)


def numeric_reward(
    pred: Optional[float],
    gt: float,
    *,
    rel_tol: float = 0.0,
    mode: Literal["binary", "continuous"] = "binary",
) -> float:
    """``binary``: 1[rel_err ≤ rel_tol] (rel_tol = 0 means exact equality).
    ``continuous`` (Video-R1 regression reward): max(0, 1 − rel_err).
    ``pred=None`` (unparsed) scores 0."""
    if pred is None:
        return 0.0
    err = relative_error(pred, gt)
    if mode == "binary":
        return 1.0 if err <= float(rel_tol) else 0.0
    if mode == "continuous":
        return max(0.0, 1.0 - err)
    raise ValueError(f"mode must be 'binary' or 'continuous', got {mode!r}")


def mean_relative_accuracy(pred: Optional[float], gt: float, thresholds: Sequence[float] = MRA_THRESHOLDS) -> float:
    """VSI-Bench MRA: mean over θ of 1[rel_err < 1 − θ], θ ∈ {0.50, 0.55, …, 0.95}. None scores 0."""
    if pred is None:
        return 0.0
    err = relative_error(pred, gt)
    return sum(1.0 for t in thresholds if err < 1.0 - t) / len(thresholds)
