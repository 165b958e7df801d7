r"""GRPO-D (OThink-MR1, arXiv 2503.16081): a scheduled KL weight, ``methods.kl_schedule.enabled=true``.

OThink-MR1 replaces GRPO's constant KL weight by a dynamic one: weak early (the policy explores), stronger later
(it stays near the reference once it found good answers). Here the weight :math:`\beta(s)` follows
:func:`mmgrpo.core.loss_variants.kl_schedule` (``start`` -> ``end`` over ``steps`` after ``warmup``; linear, cosine or
constant). The paper's exact curve is not in the team's notes: the shape and the numbers are this module's options,
not the release's.

Wiring: the default loss adds ``algo.kl_coef`` (:math:`\beta_0`) times the KL; this method's ``on_loss`` adds
:math:`(\beta(s)-\beta_0)` times the same KL aggregated the same way (``algo.agg``, the step's counts), so the total
weight is :math:`\beta(s)` whatever policy loss the run uses. ``algo.kl_coef`` must be > 0: it switches the reference
forward on (and is the default ``end``).
"""
from __future__ import annotations

from mmgrpo.vlm.methods.base import VLMMethod

__all__ = ["KLSchedule"]


class KLSchedule(VLMMethod):
    name = "kl_schedule"

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.kl_schedule
        if not o.enabled:
            return
        if cfg.algo.kl_coef <= 0:
            raise ValueError("methods.kl_schedule schedules the KL weight, but algo.kl_coef=0 computes no reference; "
                             "set algo.kl_coef > 0 (it is also the schedule's default end)")
        if cfg.algo.loss_type != "clip":
            raise ValueError("methods.kl_schedule: Reg-GRPO shares its loss by rows; use algo.loss_type=clip")
        end = cfg.algo.kl_coef if o.end is None else o.end
        from mmgrpo.core.loss_variants import kl_schedule

        kl_schedule(0, o.start, end, o.steps, o.shape, o.warmup)  # raises on bad options

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.step = 0

    def beta(self) -> float:
        from mmgrpo.core.loss_variants import kl_schedule

        o = self.cfg.methods.kl_schedule
        return kl_schedule(self.step, o.start, self.cfg.algo.kl_coef if o.end is None else o.end, o.steps, o.shape,
                           o.warmup)

    def before_rollout(self, step: int, prompts: list) -> list:
        self.step = step
        return prompts

    def on_loss(self, li, loss):
        from mmgrpo.core.losses import aggregate_loss, masked_kl

        a = li.algo
        delta = self.beta() - a.kl_coef
        if delta == 0.0 or li.ref_logp is None:
            return loss
        kl_t = masked_kl(li.logp, li.ref_logp, li.mask.bool(), a.kl_estimator)
        t = li.totals
        return loss + delta * aggregate_loss(kl_t, li.mask.bool(), a.agg, li.max_len, t.get("tokens"),
                                             t.get("sequences"))

    def end_of_step(self, rb, metrics: dict) -> None:
        metrics["kl_schedule/beta"] = self.beta()
