"""Cross-process pieces of the VLM trainer: parameter broadcast, hand-summed gradients, the
prepared engine's gradient sync / norm, and the sampling context for sharded parameters.  Scalar
reductions (``global_max``, ``global_sum``) live in :mod:`mmgrpo.engine.dist`."""
from __future__ import annotations

import contextlib

import torch

__all__ = ["DistributedMixin"]


class DistributedMixin:
    """``GRPOTrainer`` methods that talk to the other processes (need ``world``, ``params``, ``accelerator``,
    ``model``, ``grad_sync``, ``sharded``, ``dist_kind``)."""

    def _sync_context(self, last: bool):
        """Gradient synchronisation only on the last micro-batch of an update (prepared model)."""
        if self.grad_sync != "accelerate":
            return contextlib.nullcontext()
        if self.dist_kind == "DEEPSPEED":  # the engine reads accelerate's flag in accelerator.backward
            self.accelerator.gradient_state._set_sync_gradients(last)
            return contextlib.nullcontext()
        return contextlib.nullcontext() if last else self.accelerator.no_sync(self.model)

    def _prepared_grad_norm(self, max_norm: float) -> float:
        gn = self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm)
        if gn is None:  # DeepSpeed clips inside its engine (its config's gradient_clipping) and reports the norm
            eng = getattr(self.accelerator, "deepspeed_engine_wrapped", None)
            gn = eng.get_global_grad_norm() if eng is not None else float("nan")
            return float("nan") if gn is None else float(gn)
        if hasattr(gn, "full_tensor"):  # FSDP2: a replicated DTensor
            gn = gn.full_tensor()
        return float(gn)

    def _broadcast_params(self) -> None:
        """Start every process from rank 0's trainable weights (belt and braces on top of the shared seed)."""
        if self.world == 1:
            return
        import torch.distributed as dist

        with torch.no_grad():
            for p in self.params:
                dist.broadcast(p.data, src=0)

    def _allreduce_grads(self) -> None:
        """Sum gradients over processes (losses are normalised by global counts, see ``optimize``)."""
        if self.world == 1:
            return
        import torch.distributed as dist

        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)

    @contextlib.contextmanager
    def _generation_context(self):
        """Sampling runs the plain module token by token; with sharded parameters it must not issue collectives
        per token (processes generate different lengths).  FSDP2: every FSDP unit is all-gathered once and kept
        unsharded until sampling ends.  DeepSpeed ZeRO-3: parameters gathered (``GatheredParameters``).  No-op
        for replicated weights."""
        if not self.sharded:
            yield
            return
        if self.dist_kind == "FSDP":
            from torch.distributed.fsdp import FSDPModule

            mods = [m for m in self.model.modules() if isinstance(m, FSDPModule)]
            # generate() may run the vision tower before the root module's forward; FSDP2 decides which unit is
            # the root on the first forward it sees, so settle that here (no public API for it)
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
        stage = getattr(getattr(self.accelerator.state, "deepspeed_plugin", None), "zero_stage", 0)
        if stage == 3:  # pragma: no cover - needs deepspeed + GPUs
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(self.model.parameters())):
                yield
        else:
            yield
