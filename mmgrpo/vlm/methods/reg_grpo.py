"""Reg-GRPO (DeepVideo-R1), ``algo.loss_type=reg``: the regression loss itself is ``core.policy_loss``'s
``loss_type="reg"`` (a per-micro-batch mean over rows); this module makes each micro-batch's loss its share of
all the step's rows (``rows / global rows``), so the update does not depend on the micro-batch split."""
from __future__ import annotations

from mmgrpo.vlm.methods.base import VLMMethod

__all__ = ["RegGRPO"]


class RegGRPO(VLMMethod):
    name = "reg_grpo"

    def loss_share(self, rows: int, totals: dict) -> float:
        return rows / max(totals["rows"], 1.0)
