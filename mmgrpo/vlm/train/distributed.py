"""Cross-process pieces of the VLM recipe, plain functions of the run: hand-summed gradients, the prepared engine's
gradient sync / norm, and the sampling context for sharded parameters. Scalar reductions (``global_max``,
``global_sum``) are :mod:`mmgrpo.engine.dist`."""
from __future__ import annotations

import contextlib

import torch

__all__ = ["sync_context", "prepared_grad_norm", "allreduce_grads", "generation_context"]


def sync_context(run, last: bool):
    """Gradient synchronisation only on the last micro-batch of an update (prepared model)."""
    if run.grad_sync != "accelerate":
        return contextlib.nullcontext()
    if run.dist_kind == "DEEPSPEED":  # the engine reads accelerate's flag in accelerator.backward
        run.accelerator.gradient_state._set_sync_gradients(last)
        return contextlib.nullcontext()
    return contextlib.nullcontext() if last else run.accelerator.no_sync(run.model)


def prepared_grad_norm(run, max_norm: float) -> float:
    gn = run.accelerator.clip_grad_norm_(run.model.parameters(), max_norm)
    if gn is None:  # DeepSpeed clips inside its engine (its config's gradient_clipping) and reports the norm
        eng = getattr(run.accelerator, "deepspeed_engine_wrapped", None)
        gn = eng.get_global_grad_norm() if eng is not None else float("nan")
        return float("nan") if gn is None else float(gn)
    if hasattr(gn, "full_tensor"):  # FSDP2: a replicated DTensor
        gn = gn.full_tensor()
    return float(gn)


def allreduce_grads(run) -> None:
    """Sum gradients over processes (losses are normalised by global counts, see ``steps.optimize``)."""
    if run.world == 1:
        return
    import torch.distributed as dist

    for p in run.params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)


@contextlib.contextmanager
def generation_context(run):
    """Sampling runs the plain module token by token; with sharded parameters it must not issue collectives per
    token (processes generate different lengths). FSDP2: every FSDP unit is all-gathered once and kept unsharded
    until sampling ends. DeepSpeed ZeRO-3: parameters gathered (``GatheredParameters``). No-op for replicated
    weights."""
    if not run.sharded:
        yield
        return
    if run.dist_kind == "FSDP":
        from torch.distributed.fsdp import FSDPModule

        mods = [m for m in run.model.modules() if isinstance(m, FSDPModule)]
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
    stage = getattr(getattr(run.accelerator.state, "deepspeed_plugin", None), "zero_stage", 0)
    if stage == 3:  # pragma: no cover - needs deepspeed + GPUs
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(run.model.parameters())):
            yield
    else:
        yield
