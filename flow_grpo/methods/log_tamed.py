"""PaCo-GRPO's log-tamed multi-reward aggregation (Ping et al., arXiv 2512.04784, eq. 3-4): before the weighted
sum, every reward component whose coefficient of variation over the batch exceeds ``delta`` is compressed to
``log(1 + R_k)``, so that a component with large fluctuations cannot dominate the total
(:func:`mmgrpo.core.reward_shaping.log_tamed`). The coefficients are computed over the whole gathered batch (every
process), each epoch. ``delta``: a number (the paper's example 0.2) or ``mean`` (the mean of the components'
coefficients, the paper's adaptive choice). The components are those of ``reward.weights`` with a non-zero weight
(or ``components``). ``methods.log_tamed.enabled=true``.
"""
from __future__ import annotations

import torch

from mmgrpo.core.reward_shaping import log_tamed
from mmgrpo.engine.dist import gather_rows

from .base import FlowMethod

__all__ = ["LogTamed"]


def _delta(v: str):
    return v if str(v).strip() == "mean" else float(v)


class LogTamed(FlowMethod):
    name = "log_tamed"

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.log_tamed
        missing = [k for k in o.components if k not in cfg.reward.weights]
        if missing:
            raise ValueError(f"methods.log_tamed.components {missing} are not in reward.weights")
        _delta(o.delta)

    def components(self) -> list[str]:
        w = self.cfg.reward.weights
        return list(self.cfg.methods.log_tamed.components) or [k for k, v in w.items() if float(v) != 0.0]

    def on_rewards(self, traj) -> None:
        names = self.components()
        comps = {k: traj.rewards[k].double() for k in names}
        (allr,), _ = gather_rows([torch.stack([comps[k] for k in names], 1)], getattr(self.run, "device", None))
        stats = {k: allr[:, i] for i, k in enumerate(names)}
        w = {k: float(self.cfg.reward.weights.get(k, 1.0)) for k in names}
        total, h, tamed = log_tamed(comps, w, _delta(self.cfg.methods.log_tamed.delta), stats=stats)
        traj.rewards["proxy_total"] = traj.rewards["total"]
        traj.rewards["total"] = total.float()
        self._m = {f"log_tamed/cv/{k}": v for k, v in h.items()}
        self._m.update({f"log_tamed/tamed/{k}": float(t) for k, t in tamed.items()})

    def end_of_step(self, traj, metrics: dict) -> None:
        metrics.update(getattr(self, "_m", {}))
