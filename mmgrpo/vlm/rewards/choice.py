"""Multiple-choice rewards on option-letter sets (pure Python).

Letters are compared as sets, so ("A", "C") == ("C", "A"). An empty or None prediction scores 0.
"""
from __future__ import annotations

from typing import Iterable, Optional

__all__ = ["mcq_exact", "mcq_soft"]


def _as_set(x: Optional[Iterable[str]], what: str) -> frozenset[str]:
    if x is None:
        return frozenset()
    if isinstance(x, str):
        x = [x]
    out = frozenset(str(v).strip().upper() for v in x)
    if any(len(v) != 1 or not ("A" <= v <= "Z") for v in out):
        raise ValueError(f"{what} must be option letters A-Z, got {sorted(out)!r}")
    return out


def mcq_exact(pred: Optional[Iterable[str]], gt: Iterable[str]) -> float:
    """1 if the predicted letter set equals the ground-truth set (non-empty), else 0."""
    p, g = _as_set(pred, "pred"), _as_set(gt, "gt")
    if not g:
        raise ValueError("ground-truth letter set is empty")
    return 1.0 if p == g else 0.0


def mcq_soft(pred: Optional[Iterable[str]], gt: Iterable[str]) -> float:
    """TW-GRPO partial credit: |P| / |G| if ∅ ≠ P ⊆ G, else 0 (a single wrong letter voids the answer)."""
    p, g = _as_set(pred, "pred"), _as_set(gt, "gt")
    if not g:
        raise ValueError("ground-truth letter set is empty")
    if not p or not p <= g:
        return 0.0
    return len(p) / len(g)
