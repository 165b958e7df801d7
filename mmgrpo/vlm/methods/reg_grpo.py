"""Reg-GRPO (DeepVideo-R1), ``algo.loss_type=reg``: the policy loss regresses the group-normalised sequence
log-ratio onto the advantage (:func:`mmgrpo.core.losses.reg_grpo_loss`: a mean over the micro-batch's rows, plus
``algo.kl_coef`` times the KL aggregated as ``algo.agg``); each micro-batch's loss is its share of all the step's
rows (``rows / global rows``), so the update does not depend on the micro-batch split."""
from __future__ import annotations

from mmgrpo.vlm.methods.base import LossInputs, PolicyLoss, VLMMethod

__all__ = ["RegGRPO", "reg_loss", "reg_share"]


def reg_loss(li: LossInputs):
    """The Reg-GRPO policy loss of one micro-batch (a :class:`mmgrpo.core.PolicyLossOutput`)."""
    import torch

    from mmgrpo.core.losses import (PolicyLossOutput, aggregate_loss, kl_penalty, log_ratio, masked_kl, masked_mean,
                                    ratio_metrics, reg_grpo_loss)

    a = li.algo
    maskb = li.mask.bool()
    lr = log_ratio(li.logp, li.old_logp, maskb)
    metrics: dict[str, float] = {}
    kl_t = None
    if a.kl_coef != 0.0:
        kl_t = masked_kl(li.logp, li.ref_logp, maskb, a.kl_estimator)
        metrics["kl"] = masked_mean(kl_t, maskb).item()
    elif li.ref_logp is not None:
        with torch.no_grad():
            metrics["kl"] = masked_mean(kl_penalty(li.logp, li.ref_logp, a.kl_estimator), maskb).item()
    loss = reg_grpo_loss(lr, li.advantages, maskb, li.group_ids, a.adv_eps)
    if kl_t is not None:
        t = li.totals
        loss = loss + a.kl_coef * aggregate_loss(kl_t, maskb, a.agg, li.max_len, t.get("tokens"), t.get("sequences"))
    metrics.update(ratio_metrics(lr, maskb))
    return PolicyLossOutput(loss=loss, metrics=metrics)


def reg_share(loss, li: LossInputs):
    """A micro-batch's share of the step's rows."""
    return loss * (li.rows / max(li.totals.get("rows", li.rows), 1.0))


class RegGRPO(VLMMethod):
    name = "reg_grpo"

    def loss(self) -> PolicyLoss:
        return PolicyLoss(reg_loss, reg_share)
