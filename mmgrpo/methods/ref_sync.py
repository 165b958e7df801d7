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
def mix_models_(ref_model: nn.Module, policy_model: nn.Module, alpha: float) -> int:
    """:func:`mix_parameters_` over the parameters of two models matched by name (``module.`` prefixes of
    DDP/accelerate wrappers removed). Parameters the policy does not train (frozen vision tower) are mixed too:
    they are equal, so the mix leaves them unchanged up to rounding. Raises on a name or shape mismatch."""
    def named(m: nn.Module) -> dict[str, torch.Tensor]:
        m = getattr(m, "module", m)
        return dict(m.named_parameters())

    ref, pol = named(ref_model), named(policy_model)
    if ref.keys() != pol.keys():
        only_r, only_p = sorted(ref.keys() - pol.keys()), sorted(pol.keys() - ref.keys())
        raise ValueError(f"reference and policy parameters differ: only in reference {only_r[:5]}, only in policy "
                         f"{only_p[:5]}")
    names = list(ref)
    return mix_parameters_([ref[k] for k in names], [pol[k] for k in names], alpha)
