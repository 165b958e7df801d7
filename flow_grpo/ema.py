"""Exponential moving average of parameters, shared by the GRPO trainer and rectified-flow pre-training."""
from __future__ import annotations

import contextlib
from typing import Optional, Sequence

import torch

__all__ = ["EMA"]


def _local(t: torch.Tensor) -> torch.Tensor:
    """This process's shard of a parameter (FSDP2 DTensor) or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


class EMA:
    """Exponential moving average of trainable parameters (fp32 shadow of this process's local shards)."""

    def __init__(self, params: list[torch.nn.Parameter], decay: float, warmup: bool = False):
        self.params = params
        self.decay = decay
        self.warmup = warmup
        self.num_updates = 0
        self.shadow = [_local(p).detach().float().clone() for p in params]

    def current_decay(self, step: Optional[int] = None) -> float:
        """Decay of an update at optimizer step ``step`` (default: the number of updates so far):
        ``min(decay, (1 + step) / (10 + step))`` with warm-up (Flow-GRPO's EMA and diffusers' EMAModel), else
        ``decay``."""
        n = self.num_updates if step is None else step
        return min(self.decay, (1.0 + n) / (10.0 + n)) if self.warmup else self.decay

    @torch.no_grad()
    def update(self, step: Optional[int] = None) -> None:
        d = self.current_decay(step)
        for s, p in zip(self.shadow, self.params):
            s.mul_(d).add_(_local(p).detach().float(), alpha=1 - d)
        self.num_updates += 1

    @contextlib.contextmanager
    def swapped_in(self):
        with torch.no_grad():
            backup = [_local(p).detach().clone() for p in self.params]
            for s, p in zip(self.shadow, self.params):
                _local(p).copy_(s.to(p.dtype))
        try:
            yield
        finally:
            with torch.no_grad():
                for b, p in zip(backup, self.params):
                    _local(p).copy_(b)

    @torch.no_grad()
    def copy_to(self, params: Optional[Sequence[torch.nn.Parameter]] = None) -> None:
        """Write the averages into ``params`` (default: the tracked parameters), for good."""
        for s, p in zip(self.shadow, params if params is not None else self.params):
            _local(p).copy_(s.to(p.dtype))

    def state_dict(self) -> dict:
        return {"decay": self.decay, "num_updates": self.num_updates, "shadow": [s.cpu() for s in self.shadow]}

    def load_state_dict(self, sd: dict) -> None:
        if len(sd["shadow"]) != len(self.shadow) or any(
                tuple(a.shape) != tuple(b.shape) for a, b in zip(sd["shadow"], self.shadow)):
            raise ValueError("EMA state does not match the trainable parameters")
        self.shadow = [s.to(b.device).float() for s, b in zip(sd["shadow"], self.shadow)]
        self.decay = sd["decay"]
        self.num_updates = int(sd.get("num_updates", 0))
