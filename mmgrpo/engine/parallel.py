"""Gradient exchange and sampling over accelerate, for any torch module: hand-summed gradients of replicated weights
(:func:`allreduce_grads`), the prepared engine's gradient sync / norm (:func:`sync_context`,
:func:`prepared_grad_norm`: DDP, FSDP2, DeepSpeed) and the sampling context for sharded parameters
(:func:`generation_context`). Each takes what it works on (the accelerator, the model, the parameters) and how the
gradients meet (``grad_sync``: ``manual`` / ``accelerate``; ``dist_kind``: accelerate's distributed type name,
``FSDP`` / ``DEEPSPEED`` / ...). The VLM recipe calls them; scalar reductions (``global_max``, ``global_sum``) are
:mod:`mmgrpo.engine.dist`."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Parallel", "sync_context", "prepared_grad_norm", "allreduce_grads", "generation_context"]


def sync_context(accelerator, model, grad_sync: str, dist_kind: str, last: bool):
    """Gradient synchronisation only on the last micro-batch of an update (prepared model, ``grad_sync=accelerate``;
    a no-op for hand-summed gradients)."""
    if grad_sync != "accelerate":
        return contextlib.nullcontext()
    if dist_kind == "DEEPSPEED":  # the engine reads accelerate's flag in accelerator.backward
        accelerator.gradient_state._set_sync_gradients(last)
        return contextlib.nullcontext()
    return contextlib.nullcontext() if last else accelerator.no_sync(model)


def prepared_grad_norm(accelerator, model, max_norm: float) -> float:
    """Clip the prepared model's gradients to ``max_norm``; their global norm before clipping (NaN if unknown)."""
    gn = accelerator.clip_grad_norm_(model.parameters(), max_norm)
    if gn is None:  # DeepSpeed clips inside its engine (its config's gradient_clipping) and reports the norm
        eng = getattr(accelerator, "deepspeed_engine_wrapped", None)
        gn = eng.get_global_grad_norm() if eng is not None else float("nan")
        return float("nan") if gn is None else float(gn)
    if hasattr(gn, "full_tensor"):  # FSDP2: a replicated DTensor
        gn = gn.full_tensor()
    return float(gn)


def allreduce_grads(params, world: int) -> None:
    """Sum the gradients of ``params`` over the ``world`` processes (a missing gradient counts as zeros)."""
    if world == 1:
        return
    import torch.distributed as dist

    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)


@contextlib.contextmanager
def generation_context(accelerator, model, sharded: bool, dist_kind: str):
    """Sampling runs the plain module token by token; with sharded parameters it must not issue collectives per
    token (processes generate different lengths). FSDP2: every FSDP unit is all-gathered once and kept unsharded
    until sampling ends. DeepSpeed ZeRO-3: parameters gathered (``GatheredParameters``). No-op for replicated
    weights."""
    if not sharded:
        yield
        return
    if dist_kind == "FSDP":
        from torch.distributed.fsdp import FSDPModule

        mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
        # generate() may run the vision tower before the root module's forward; FSDP2 decides which unit is the
        # root on the first forward it sees, so settle that here (no public API for it)
        root = mods[0]._get_fsdp_state() if mods else None
        if root is not None and getattr(root, "_is_root", True) is None:
            root._lazy_init()
        for m in mods:
            m.set_reshard_after_forward(False, recurse=False)
        for m in mods:
            m.unshard()
        try:
            yield
        finally:
            for m in mods:
                m.reshard()
                m.set_reshard_after_forward(True, recurse=False)
        return
    stage = getattr(getattr(accelerator.state, "deepspeed_plugin", None), "zero_stage", 0)
    if stage == 3:  # pragma: no cover - needs deepspeed + GPUs
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            yield
    else:
        yield


@dataclass(frozen=True)
class Parallel:
    """How this process sits in the run (built once by the recipe's setup from the accelerator): ``rank`` of
    ``world`` processes on ``device``; ``sharded``: FSDP / DeepSpeed shard the parameters; ``dist_kind``:
    accelerate's distributed type name; ``grad_sync``: ``manual`` (hand-summed gradients) or ``accelerate``."""

    accelerator: Any
    rank: int
    world: int
    device: Any
    sharded: bool
    dist_kind: str
    grad_sync: str
