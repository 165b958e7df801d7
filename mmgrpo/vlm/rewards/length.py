"""Length bonus (Video-R1 style; pure Python)."""
from __future__ import annotations

__all__ = ["length_bonus"]


def length_bonus(n_tokens: int, correct: bool, *, lo: int = 320, hi: int = 512, bonus: float = 0.2) -> float:
    """``bonus`` if the completion is correct and lo ≤ n_tokens ≤ hi, else 0.

    Video-R1 additionally requires more than one correct completion in the group; the reward registry applies
    that group condition (completions are grouped by sample ``id``)."""
    if lo > hi:
        raise ValueError(f"length bounds must satisfy lo <= hi, got lo={lo}, hi={hi}")
    if n_tokens < 0:
        raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
    return float(bonus) if (correct and lo <= n_tokens <= hi) else 0.0
