r"""A MedLoc-R1-style IoU-threshold curriculum for grounding rewards (``methods.iou_curriculum``).

MedLoc-R1 (performance-aware curriculum reward scheduling for GRPO grounding) replaces the IoU reward by a
criterion that starts lenient and is tightened when a sliding-window tracker of the policy's performance says it is
ready. Here, with :math:`\theta_k` the k-th of the increasing ``thresholds`` and IoU the task's accuracy reward
(``reward.accuracy_key``; tvg: temporal IoU, rec: box IoU):

.. math::
    r_{cur} = 1[\mathrm{IoU} \ge \theta_k] \quad (\texttt{mode=binary}) \qquad
    r_{cur} = \mathrm{IoU} \cdot 1[\mathrm{IoU} \ge \theta_k] \quad (\texttt{mode=gated})

and the total reward uses :math:`r_{cur}` in place of the IoU: ``total += w (r_cur - IoU)`` with ``w`` its weight in
``reward.weights`` (1 when it is not weighted). The tracker keeps the step's hit rate
:math:`h_t = \mathrm{mean}_i 1[\mathrm{IoU}_i \ge \theta_k]` (on-policy rows with a reward, over all processes);
the level advances to :math:`\theta_{k+1}` after a step when all of (the multi-condition rule)

1. at least ``window`` steps were trained at level k (the window is full);
2. the window's mean hit rate is at least ``advance_at``;
3. the window is not getting worse: the mean of its later half >= the mean of its earlier half;

hold. The window restarts at each level. Choices (the paper's exact rule and constants are not reproduced here): the
three conditions above, the defaults thresholds (0.3, 0.5, 0.7), window 5, advance_at 0.6.
Metrics: ``iou_curriculum/threshold``, ``iou_curriculum/level``, ``iou_curriculum/hit_rate``.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from mmgrpo.vlm.methods.base import VLMMethod

__all__ = ["curriculum_reward", "should_advance", "IoUCurriculum"]


def curriculum_reward(iou: Tensor, theta: float, mode: str = "binary") -> Tensor:
    """(N,) the curriculum reward of IoUs ``iou`` at threshold ``theta`` (NaN stays NaN)."""
    x = torch.as_tensor(iou, dtype=torch.float64)
    hit = (x >= theta).double()
    out = hit if mode == "binary" else x * hit
    return torch.where(torch.isnan(x), x, out)


def should_advance(history: Sequence[float], window: int, advance_at: float) -> bool:
    """The multi-condition rule of the module docstring on the hit rates since the level began (oldest first)."""
    if len(history) < window:
        return False
    w = list(history[-window:])
    if sum(w) / window < advance_at:
        return False
    half = window // 2
    if half == 0:
        return True
    early, late = w[:half], w[-half:]
    return sum(late) / len(late) >= sum(early) / len(early)


class IoUCurriculum(VLMMethod):
    name = "iou_curriculum"

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.iou_curriculum
        if not o.enabled:
            return
        th = list(o.thresholds)
        if not th or any(not (0.0 < t <= 1.0) for t in th) or any(b <= a for a, b in zip(th, th[1:])):
            raise ValueError(f"methods.iou_curriculum.thresholds must be increasing values in (0, 1], got {th}")
        if o.window < 1:
            raise ValueError(f"methods.iou_curriculum.window must be >= 1, got {o.window}")

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.o = cfg.methods.iou_curriculum
        self.level = 0
        self.history: list[float] = []
        self._hits = self._rows = 0.0

    @property
    def theta(self) -> float:
        return float(self.o.thresholds[self.level])

    def on_rewards(self, rb) -> None:
        iou = self.run.accuracy(rb.texts, rb.samples, rb.rewards)
        cur = curriculum_reward(iou, self.theta, self.o.mode)
        w = float(self.cfg.reward.weights.get(self.run.acc_key, 1.0))
        tot = rb.rewards["total"]
        rb.rewards["iou_curriculum"] = cur.to(tot.dtype)
        rb.rewards["total"] = (tot.double() + w * (cur - iou.double())).to(tot.dtype)
        rows = ~rb.is_offpolicy & ~torch.isnan(iou.double())
        if rb.valid is not None:
            rows &= rb.valid
        self._hits += float((iou.double()[rows] >= self.theta).sum())
        self._rows += float(rows.sum())

    def end_of_step(self, rb, metrics: dict) -> None:
        from mmgrpo.engine.dist import all_reduce

        hits, n = all_reduce([self._hits, self._rows], "sum")  # every process advances at the same step
        self._hits = self._rows = 0.0
        h = hits / n if n else 0.0
        metrics["iou_curriculum/hit_rate"] = h
        metrics["iou_curriculum/threshold"] = self.theta
        metrics["iou_curriculum/level"] = float(self.level)
        if n:
            self.history.append(h)
        if self.level + 1 < len(self.o.thresholds) and should_advance(self.history, self.o.window,
                                                                      self.o.advance_at):
            self.level += 1
            self.history = []

    def state_dict(self) -> dict:
        return {"level": self.level, "history": list(self.history)}

    def load_state_dict(self, sd: dict) -> None:
        self.level, self.history = int(sd["level"]), [float(x) for x in sd["history"]]
