r"""Balanced Aggregation ("Understanding and Fixing Aggregation Bias in GRPO"): ``methods.balanced_agg.enabled=true``.

The policy term of the loss is aggregated as

.. math:: L = \frac{N^+}{N}\,\frac{\sum_{A_i>0}\sum_t \ell}{T^+} + \frac{N^-}{N}\,\frac{\sum_{A_i<0}\sum_t \ell}{T^-}

(:func:`mmgrpo.core.loss_variants.balanced_aggregate`) instead of ``algo.agg``; the KL term keeps ``algo.agg``. The
counts :math:`T^\pm, N^\pm, N` are the step's, over every micro-batch and process (``on_logprobs`` sums them once
the batch is final), so each micro-batch's loss is its exact share of the step's.
"""
from __future__ import annotations

import functools

from mmgrpo.vlm.methods.base import PolicyLoss, VLMMethod, grpo_loss

__all__ = ["BalancedAgg"]


class BalancedAgg(VLMMethod):
    name = "balanced_agg"

    @classmethod
    def check(cls, cfg) -> None:
        if not cfg.methods.balanced_agg.enabled:
            return
        if cfg.algo.loss_type != "clip":
            raise ValueError("methods.balanced_agg aggregates the clipped surrogate: it needs algo.loss_type=clip")
        if cfg.algo.agg == "local_token_mean":
            raise ValueError("methods.balanced_agg uses the step's global counts; algo.agg=local_token_mean would "
                             "share its KL term per micro-batch differently: use another algo.agg")

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.counts: dict[str, float] | None = None

    def on_logprobs(self, rb) -> None:
        from mmgrpo.core.loss_variants import balanced_counts
        from mmgrpo.engine.dist import global_sum

        import torch

        local = balanced_counts(rb.advantages, rb.loss_mask) if rb.n and rb.advantages is not None else \
            balanced_counts(torch.zeros(0), torch.zeros(0, 1))
        self.counts = {k: global_sum(v) for k, v in local.items()}

    def _agg(self, pg, li):
        from mmgrpo.core.loss_variants import balanced_aggregate

        return balanced_aggregate(pg, li.mask, li.advantages, self.counts)

    def loss(self) -> PolicyLoss:
        return PolicyLoss(functools.partial(grpo_loss, policy_agg=self._agg), share=lambda loss, li: loss)

    def end_of_step(self, rb, metrics: dict) -> None:
        c = self.counts or {}
        n = max(c.get("seqs", 0.0), 1.0)
        metrics["balanced_agg/pos_seq_share"] = c.get("pos_seqs", 0.0) / n
        metrics["balanced_agg/neg_seq_share"] = c.get("neg_seqs", 0.0) / n
