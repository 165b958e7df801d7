r"""DCPO (Dynamic Clipping Policy Optimization, arXiv 2509.02333): ``methods.dcpo.enabled=true``.

Two parts, each with its switch:

* **dynamic clip** (``dynamic_clip``): PPO's clipped surrogate with per-token bounds from the old token probability
  q, :math:`\tfrac12+\tfrac12\sqrt{\max(1-4\epsilon_{low}/q, 0)} \le \rho \le
  \min(\tfrac12+\tfrac12\sqrt{1+4\epsilon_{high}/q}, 10)` (:func:`mmgrpo.core.loss_variants.dcpo_bounds`; the
  paper's 0.16 / 0.2 / 10): rare tokens get a wider region, likely ones about PPO's. It binds only when
  :math:`\rho \ne 1` (``algo.num_iterations`` > 1);
* **smooth advantage standardisation** (``smooth_advantages``): each group's advantages mix its own z-scores with
  z-scores against every reward its prompt got so far (:func:`mmgrpo.core.advantage_variants.dcpo_smooth_advantages`),
  so a prompt whose group ties this step still gets a signal from its history (from its second visit on).

Choices: the prompt key is the sample id (:func:`mmgrpo.vlm.data.task.sample_id`); the history is saved in
checkpoints; it is kept per process, so this module refuses multi-process runs for now (a prompt's history would be
split). The paper also aggregates by token mean ("OTM", ``algo.agg=token_mean``, the default here).
"""
from __future__ import annotations

import functools

from mmgrpo.vlm.methods.base import Estimator, PolicyLoss, VLMMethod, grpo_loss

__all__ = ["DCPO"]


def _surrogate(lr, li, eps_low: float, eps_high: float, max_ratio: float):
    from mmgrpo.core.loss_variants import dcpo_surrogate

    return dcpo_surrogate(lr, li.advantages, li.mask, li.old_logp, eps_low, eps_high, max_ratio)


class DCPO(VLMMethod):
    name = "dcpo"
    needs_whole_groups = True  # a group's statistics and its prompt's history

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.dcpo
        if not o.enabled:
            return
        if cfg.algo.loss_type != "clip" and o.dynamic_clip:
            raise ValueError("methods.dcpo.dynamic_clip replaces the clipped surrogate: it needs algo.loss_type=clip")
        if not (o.eps_low > 0 and o.eps_high > 0 and o.max_ratio > 1):
            raise ValueError(f"methods.dcpo needs eps_low, eps_high > 0 and max_ratio > 1, got {o.eps_low}, "
                             f"{o.eps_high}, {o.max_ratio}")
        if o.smooth_advantages and cfg.algo.adv_scale != "group":
            raise ValueError("methods.dcpo.smooth_advantages standardises by group and history statistics: it needs "
                             f"algo.adv_scale=group (got {cfg.algo.adv_scale!r})")

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        from mmgrpo.core.advantage_variants import PromptStats

        if getattr(run, "world", 1) > 1 and cfg.methods.dcpo.smooth_advantages:
            raise ValueError("methods.dcpo.smooth_advantages keeps each prompt's reward history on one process; "
                             "multi-process runs are not supported yet (set smooth_advantages=false)")
        self.stats = PromptStats()
        self._nonzero = 0.0

    def advantage_estimator(self) -> Estimator | None:
        if not self.cfg.methods.dcpo.smooth_advantages:
            return None
        return Estimator(local=self._local)

    def _local(self, rb, rewards, kw):
        from mmgrpo.core.advantage_variants import dcpo_smooth_advantages
        from mmgrpo.vlm.data.task import sample_id

        keys = [str(sample_id(s)) for s in rb.samples]
        out = dcpo_smooth_advantages(rewards, rb.group_ids, keys, self.stats, valid=kw.get("valid"),
                                     eps=kw.get("eps", 1e-4))
        self._nonzero = float((out.advantages != 0).float().mean()) if rb.n else 0.0
        return out

    def loss(self) -> PolicyLoss | None:
        o = self.cfg.methods.dcpo
        if not o.dynamic_clip:
            return None
        return PolicyLoss(functools.partial(grpo_loss, surrogate=functools.partial(
            _surrogate, eps_low=o.eps_low, eps_high=o.eps_high, max_ratio=o.max_ratio)))

    def end_of_step(self, rb, metrics: dict) -> None:
        metrics["dcpo/nonzero_adv_frac"] = self._nonzero
        metrics["dcpo/prompts_tracked"] = float(len(self.stats.table))

    def state_dict(self):
        return self.stats.state_dict()

    def load_state_dict(self, sd):
        self.stats.load_state_dict(sd)
