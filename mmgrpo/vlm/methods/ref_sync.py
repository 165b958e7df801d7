r"""Reference-model synchronisation (TR-DPO, Gorbatovski et al. 2024, arXiv 2404.09656; TRL ``sync_ref_model``).

The KL term :math:`\beta\,KL(\pi_\theta\|\pi_{ref})` ties the policy to a frozen reference. TR-DPO's trust-region
update moves the reference along instead, every :math:`\tau` optimizer updates:

.. math:: \theta_{ref} \leftarrow \alpha\,\theta + (1-\alpha)\,\theta_{ref}

(soft update, "mixup" :math:`\alpha`; :math:`\alpha = 1` is the hard update, a copy). TRL's defaults:
``ref_model_sync_steps`` :math:`\tau` = 512, ``ref_model_mixup_alpha`` :math:`\alpha` = 0.6; TRL checks
``global_step % ref_model_sync_steps == 0`` after every optimizer step, so the first sync is after update τ.

Choices: the counter is the number of **applied optimizer updates** (a skipped, non-finite update does not count;
with ``algo.num_iterations`` > 1 every update counts, as TRL's ``global_step``); the mix is computed in float32 and
rounded once to the reference's dtype (a bf16 in-place ``mul_/add_`` would round twice); only parameters present
in both models with the same name and shape are mixed and any other difference is an error (a reference that
silently kept stale weights would be worse than none). LoRA has no separate reference (the reference is the base
model with the adapter disabled): syncing would have to change the base weights under the adapter, so it is
refused there with a clear error.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

__all__ = ["sync_due", "mix_parameters_", "mix_models_"]


def sync_due(num_updates: int, every: int) -> bool:
    """True after update number ``num_updates`` (1-based count of applied updates) when it is a multiple of
    ``every`` (>= 1), as TRL's ``global_step % ref_model_sync_steps == 0``."""
    if every < 1:
        raise ValueError(f"ref_model_sync_steps must be >= 1, got {every}")
    return num_updates > 0 and num_updates % every == 0


@torch.no_grad()
def mix_parameters_(ref: Iterable[torch.Tensor], policy: Iterable[torch.Tensor], alpha: float) -> int:
    r"""In place ``ref = alpha * policy + (1 - alpha) * ref`` for paired tensors (float32 math, one rounding).
    Returns the number of tensors updated."""
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"ref_model_mixup_alpha must be in (0, 1], got {alpha}")
    n = 0
    for r, p in zip(ref, policy, strict=True):
        if r.shape != p.shape:
            raise ValueError(f"reference tensor {tuple(r.shape)} vs policy {tuple(p.shape)}")
        if alpha == 1.0:
            r.copy_(p)
        else:
            mixed = p.detach().float().to(r.device) * alpha + r.float() * (1.0 - alpha)
            r.copy_(mixed.to(r.dtype))
        n += 1
    return n


@torch.no_grad()
def mix_models_(ref_model: nn.Module, policy_model: nn.Module, alpha: float, only: set[str] | None = None) -> int:
    """:func:`mix_parameters_` over the parameters of two models matched by name (``module.`` prefixes of
    DDP/accelerate wrappers removed), restricted to the names in ``only`` if given (the trainer passes the trained
    parameters: frozen ones, e.g. the vision tower, are equal in both, and mixing them would only add rounding).
    Raises on a name or shape mismatch."""
    def named(m: nn.Module) -> dict[str, torch.Tensor]:
        m = getattr(m, "module", m)
        return dict(m.named_parameters())

    ref, pol = named(ref_model), named(policy_model)
    if ref.keys() != pol.keys():
        only_r, only_p = sorted(ref.keys() - pol.keys()), sorted(pol.keys() - ref.keys())
        raise ValueError(f"reference and policy parameters differ: only in reference {only_r[:5]}, only in policy "
                         f"{only_p[:5]}")
    names = [k for k in ref if only is None or k in only]
    return mix_parameters_([ref[k] for k in names], [pol[k] for k in names], alpha)


# ----------------------------------------------------------------------------------------------- trainer hook
from mmgrpo.vlm.methods.base import VLMMethod  # noqa: E402  (the pure functions above need no trainer)


class RefSync(VLMMethod):
    """``methods.ref_sync.enabled``: every ``sync_steps`` applied updates the frozen reference becomes
    ``mixup_alpha * policy + (1 - mixup_alpha) * reference``. The reference's trained-parameter tensors are saved
    in checkpoints (they are no longer the initial weights), so a resumed run continues from the synced reference."""

    name = "ref_sync"

    @classmethod
    def check(cls, cfg):
        if not cfg.methods.ref_sync.enabled:  # called for every registered method
            return
        o = cfg.methods.ref_sync
        sync_due(0, o.sync_steps)
        if not 0.0 < o.mixup_alpha <= 1.0:
            raise ValueError(f"methods.ref_sync.mixup_alpha must be in (0, 1], got {o.mixup_alpha}")
        if cfg.algo.kl_coef <= 0:
            raise ValueError("methods.ref_sync moves the KL reference, but algo.kl_coef=0 uses none; set "
                             "algo.kl_coef > 0")
        if cfg.model.lora.enabled:
            raise ValueError("methods.ref_sync: with LoRA the reference is the base model under the disabled "
                             "adapter; mixing into it would change the policy's own base weights. Use full "
                             "fine-tuning or drop methods.ref_sync")

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        if run.sharded:
            raise ValueError("methods.ref_sync mixes whole parameter tensors; the policy is sharded (FSDP / "
                             "DeepSpeed), which it does not support yet")
        self.o = cfg.methods.ref_sync
        self.updates = 0
        self.syncs = 0

    def _ref(self):
        ref = self.run.policy.ref_model
        if ref is None:
            raise RuntimeError("methods.ref_sync: the trainer has no reference model")
        return ref

    def _trained_names(self) -> set[str]:
        return {n for n, p in getattr(self.run.model, "module", self.run.model).named_parameters()
                if p.requires_grad}

    def after_optimizer_step(self):
        self.updates += 1
        if sync_due(self.updates, self.o.sync_steps):
            mix_models_(self._ref(), self.run.model, self.o.mixup_alpha, self._trained_names())
            self.syncs += 1

    def state_dict(self):
        names = self._trained_names()
        ref = {k: v.detach().cpu().clone() for k, v in self._ref().named_parameters() if k in names}
        return {"updates": self.updates, "syncs": self.syncs, "reference": ref if self.syncs else {}}

    def load_state_dict(self, sd):
        self.updates, self.syncs = int(sd["updates"]), int(sd["syncs"])
        if sd.get("reference"):
            params = dict(self._ref().named_parameters())
            missing = sorted(set(sd["reference"]) - set(params))
            if missing:
                raise ValueError(f"resume: methods.ref_sync reference tensors {missing[:5]} are not in the model")
            with torch.no_grad():
                for k, v in sd["reference"].items():
                    params[k].copy_(v.to(params[k].device, params[k].dtype))

    def end_of_step(self, rb, m):
        m["ref_sync/syncs"] = float(self.syncs)
