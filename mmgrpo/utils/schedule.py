"""Learning-rate schedule shared by both trainers and both pre-training scripts (pure Python)."""
from __future__ import annotations

import math

__all__ = ["LRFactor"]


class LRFactor:
    """Multiplier of the base LR after ``step`` optimizer steps: linear warmup ``(step + 1) / warmup`` over
    ``warmup`` steps, then constant / linear / cosine decay from 1 to ``min_ratio`` at ``total`` steps.
    (An object, not a closure, so that ``LambdaLR.state_dict`` stores it.)"""

    def __init__(self, kind: str, warmup: int, total: int, min_ratio: float = 0.0):
        if kind not in ("constant", "linear", "cosine"):
            raise ValueError(f"optim.lr_schedule must be constant | linear | cosine, got {kind!r}")
        if warmup < 0:
            raise ValueError("optim.warmup_steps must be >= 0")
        self.kind, self.warmup, self.total, self.min_ratio = kind, int(warmup), int(total), float(min_ratio)

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if self.kind == "constant":
            return 1.0
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        decay = 1.0 - progress if self.kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return decay if not self.min_ratio else self.min_ratio + (1.0 - self.min_ratio) * decay
