r"""Online difficulty filtering with a pass-rate window and refill (``methods.pass_rate_filter``): the "dynamic
sampling" of DAPO / verl / EasyR1 (``online_filtering``), on the group's pass rate.

For each group (one prompt's on-policy rows whose reward exists), the pass rate is

.. math:: p_g = \frac{1}{|g|} \sum_{i \in g} 1[\mathrm{acc}_i \ge \theta]

with acc the task's accuracy reward (``reward.accuracy_key``; tvg: IoU) and :math:`\theta` = ``correct_threshold``.
A group is kept when ``low <= p_g <= high``; the others (too easy, too hard) are dropped after the advantages and up
to ``max_rounds`` extra sampling rounds refill the step (the step keeps its first groups: a fixed batch size). With
``low = 1/G``-ish and ``high = 1 - 1/G``-ish (the defaults 0.01 / 0.99) on a binary reward this is DAPO's zero-variance
filter; a narrower window (e.g. 0.2 / 0.8) trains only on prompts of middle difficulty.

Differences from ``algo.filter_zero_std`` (:mod:`mmgrpo.vlm.methods.dapo`): that one drops groups whose *total*
rewards are all equal (a continuous IoU almost never is); this one reads the accuracy as pass / fail, so a group whose
answers all miss (IoU < theta) is dropped even though its IoUs differ. Counted in ``pass_rate_filter/dropped_groups`` (and the run total ``filtered_groups``);
``pass_rate_filter/kept_frac`` is the share of sampled groups kept, ``pass_rate_filter/pass_rate`` their mean.
"""
from __future__ import annotations

import torch
from torch import Tensor

from mmgrpo.vlm.methods.base import VLMMethod

__all__ = ["group_pass_rates", "window_keep", "PassRateFilter"]


def group_pass_rates(acc: Tensor, group_ids: Tensor, rows: Tensor, threshold: float) -> dict[int, float]:
    """``{group id: pass rate}`` over the rows that take part (``rows`` (N,) bool); a group with none is absent."""
    acc = torch.nan_to_num(torch.as_tensor(acc, dtype=torch.float64), nan=float("-inf"))
    ok = acc >= threshold
    out = {}
    for g in torch.unique(group_ids[rows]).tolist():
        m = (group_ids == g) & rows
        out[int(g)] = float(ok[m].double().mean())
    return out


def window_keep(group_ids: Tensor, rates: dict[int, float], low: float, high: float) -> Tensor:
    """Row indices (K,) int64 of the groups whose pass rate lies in [low, high] (a group without a rate is kept:
    nothing is known about it)."""
    drop = [g for g, p in rates.items() if not (low <= p <= high)]
    return (~torch.isin(group_ids, torch.tensor(drop, dtype=group_ids.dtype))).nonzero().flatten()


class PassRateFilter(VLMMethod):
    name = "pass_rate_filter"
    needs_whole_groups = True  # a group's pass rate; refills

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.pass_rate_filter
        if o.enabled and not (0.0 <= o.low <= o.high <= 1.0):
            raise ValueError(f"methods.pass_rate_filter: need 0 <= low <= high <= 1, got low={o.low}, high={o.high}")
        if o.enabled and o.max_rounds < 0:
            raise ValueError(f"methods.pass_rate_filter.max_rounds must be >= 0, got {o.max_rounds}")

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.o = cfg.methods.pass_rate_filter
        self.extra_rounds = self.o.max_rounds
        self._seen = self._kept = 0
        self._rates: list[float] = []

    def on_advantages(self, rb):
        if rb.n == 0:
            return rb
        acc = self.run.accuracy(rb.texts, rb.samples, rb.rewards)
        rows = ~rb.is_offpolicy & (rb.valid if rb.valid is not None else torch.ones(rb.n, dtype=torch.bool))
        rates = group_pass_rates(acc, rb.group_ids, rows, self.o.correct_threshold)
        keep = window_keep(rb.group_ids, rates, self.o.low, self.o.high)
        kept = {g: p for g, p in rates.items() if self.o.low <= p <= self.o.high}
        self._seen += len(rates)
        self._kept += len(kept)
        self._rates += list(kept.values())
        self.run.state.counters["filtered_groups"] += len(rates) - len(kept)
        return rb.select(keep)

    def end_of_step(self, rb, metrics: dict) -> None:
        metrics["pass_rate_filter/kept_frac"] = self._kept / self._seen if self._seen else 0.0
        metrics["pass_rate_filter/pass_rate"] = sum(self._rates) / len(self._rates) if self._rates else 0.0
        metrics["pass_rate_filter/dropped_groups"] = float(self._seen - self._kept)
        self._seen = self._kept = 0
        self._rates = []
