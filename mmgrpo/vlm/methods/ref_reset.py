r"""ProRL (Liu et al. 2025, "Prolonged RL Expands Reasoning Boundaries"): periodic reference-policy reset,
``methods.ref_reset.enabled=true``.

A long run with a KL penalty drifts until the KL term dominates the loss and learning stalls. ProRL then makes the
reference a copy of the current policy (a hard reset) and re-initialises the optimizer state, and training goes on
from there. Here: every ``every`` applied optimizer updates, the reference's trained parameters are copied from the
policy (:func:`mmgrpo.vlm.methods.ref_sync.mix_models_` with :math:`\alpha = 1`) and, with ``reset_optimizer``, the
optimizer's moments and step counts are zeroed (AdamW restarts its bias correction). ProRL resets at hand-picked
points of its runs; a fixed period is this module's choice. Needs full fine-tuning and ``algo.kl_coef`` > 0 (the
same reasons as :mod:`mmgrpo.vlm.methods.ref_sync`); the synced reference is saved in checkpoints.
"""
from __future__ import annotations

import torch

from mmgrpo.vlm.methods.base import VLMMethod
from mmgrpo.vlm.methods.ref_sync import mix_models_, sync_due

__all__ = ["RefReset", "reset_optimizer_state_"]


@torch.no_grad()
def reset_optimizer_state_(optimizer: torch.optim.Optimizer) -> int:
    """Zero every tensor of the optimizer's per-parameter state in place (AdamW: ``exp_avg``, ``exp_avg_sq``,
    ``step``), keeping its keys and devices: the next update is a first Adam step. Returns the entries reset."""
    n = 0
    for st in optimizer.state.values():
        for k, v in st.items():
            if torch.is_tensor(v):
                v.zero_()
            elif isinstance(v, (int, float)):
                st[k] = type(v)(0)
        n += 1
    return n


class RefReset(VLMMethod):
    name = "ref_reset"

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.ref_reset
        if not o.enabled:
            return
        sync_due(0, o.every)
        if cfg.algo.kl_coef <= 0:
            raise ValueError("methods.ref_reset resets the KL reference, but algo.kl_coef=0 uses none; set "
                             "algo.kl_coef > 0")
        if cfg.model.lora.enabled:
            raise ValueError("methods.ref_reset: with LoRA the reference is the base model under the disabled "
                             "adapter; copying the policy into it would change the policy's own base weights. Use "
                             "full fine-tuning")
        if cfg.methods.ref_sync.enabled:
            raise ValueError("methods.ref_reset and methods.ref_sync both move the reference; enable one")

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        if run.sharded:
            raise ValueError("methods.ref_reset copies whole parameter tensors; the policy is sharded (FSDP / "
                             "DeepSpeed), which it does not support yet")
        self.updates = 0
        self.resets = 0

    def _ref(self):
        ref = self.run.policy.ref_model
        if ref is None:
            raise RuntimeError("methods.ref_reset: the trainer has no reference model")
        return ref

    def _trained_names(self) -> set[str]:
        return {n for n, p in getattr(self.run.model, "module", self.run.model).named_parameters()
                if p.requires_grad}

    def after_optimizer_step(self) -> None:
        self.updates += 1
        if sync_due(self.updates, self.cfg.methods.ref_reset.every):
            mix_models_(self._ref(), self.run.model, 1.0, self._trained_names())
            if self.cfg.methods.ref_reset.reset_optimizer:
                reset_optimizer_state_(self.run.optimizer)
            self.resets += 1

    def state_dict(self):
        names = self._trained_names()
        ref = {k: v.detach().cpu().clone() for k, v in self._ref().named_parameters() if k in names}
        return {"updates": self.updates, "resets": self.resets, "reference": ref if self.resets else {}}

    def load_state_dict(self, sd):
        self.updates, self.resets = int(sd["updates"]), int(sd["resets"])
        if sd.get("reference"):
            params = dict(self._ref().named_parameters())
            missing = sorted(set(sd["reference"]) - set(params))
            if missing:
                raise ValueError(f"resume: methods.ref_reset reference tensors {missing[:5]} are not in the model")
            for k, v in sd["reference"].items():
                with torch.no_grad():
                    params[k].copy_(v.to(params[k].device, params[k].dtype))

    def end_of_step(self, rb, metrics: dict) -> None:
        metrics["ref_reset/resets"] = float(self.resets)
