"""Sequence parallelism in the flow trainer: ``run.sequence_parallel=P`` (``flow_grpo train ... run.sequence_parallel=2``).

The W processes form W/P sequence-parallel groups of P consecutive ranks (ranks ``[g*P, (g+1)*P)``); the
transformer(s) of every process are sharded over its group by Ulysses (:mod:`flow_grpo.models.sequence_parallel`:
each process holds 1/P of the video tokens, attention exchanges them for 1/P of the heads). Data parallelism runs
over the groups:

* the samples of an epoch are split over the W/P groups (the trainer's ``rank`` / ``world`` become the group's
  index and the number of groups); every process of a group samples the same prompts, seeds and noise, so the
  model forwards (collectives inside the group) are identical and so are the trajectories;
* rewards are computed once per group, by its first process, and sent to the others
  (:meth:`SequenceParallel.shared`): rollout, ODE-completion and eval rewards alike; their failures too;
* advantages, loss normalisers and epoch statistics count each sample once: the other processes of a group declare
  their rows copies of the first process's (:func:`mmgrpo.engine.dist.set_row_source`);
* gradients: each process's gradient is its token shard's contribution; DDP / FSDP2 average over all W processes and
  the trainer multiplies the loss by W, so the result is the sum over shards and groups = the gradient of the
  whole global batch, as without sequence parallelism.

Nothing of it enters a checkpoint: a run resumes on another sequence-parallel size (or on one process).
Not supported with it: ``reward.mode=win_rate`` (the judge's split over processes would count a group P times) and
``reward.async_workers > 1`` (a group's processes must receive the shared rewards in the same order).
Verified on CPU only (2 gloo processes, Wan2.1; tests/flow_grpo/test_sequence_parallel.py).
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Callable, Optional

from mmgrpo.engine import dist as edist
from mmgrpo.engine.errors import ConfigError


@dataclass
class SequenceParallel:
    degree: int          # P: processes per sequence-parallel group
    rank: int            # this process
    world: int           # W processes
    mesh: Any            # this process's ("ring", "ulysses") DeviceMesh (ring of size 1)
    reward_group: Any    # gloo group of this process's sequence-parallel group (reward broadcasts)

    @property
    def leader(self) -> int:
        """The first process of this process's group: it computes the group's rewards."""
        return self.rank // self.degree * self.degree

    @property
    def dp_rank(self) -> int:
        return self.rank // self.degree

    @property
    def dp_world(self) -> int:
        return self.world // self.degree

    def enable(self, adapter) -> None:
        """Shard the adapter's transformer(s) over the group (after LoRA is attached, before DDP / FSDP wrapping)."""
        from .models.sequence_parallel import enable_sequence_parallel

        enable_sequence_parallel(adapter, self.degree, mesh=self.mesh)

    def shared(self, fn: Callable) -> "SharedCall":
        """``fn`` called by the group's first process only; every process of the group gets its result, or raises
        its exception (:class:`SharedCall`)."""
        return SharedCall(fn, self)

    def close(self) -> None:
        edist.set_row_source(None)


class SharedCall:
    """A reward callable run by the sequence-parallel group's first process; the others receive its result (or its
    exception) by a broadcast over the group's own gloo group: the async reward thread may call it while the main
    thread runs the model's collectives. Collective over the group. Other attributes (``accepts_video``, ...) are
    the wrapped reward's."""

    def __init__(self, fn: Callable, sp: SequenceParallel):
        self.fn, self.sp = fn, sp

    def __call__(self, *args, **kwargs):
        import torch.distributed as dist

        sp, box = self.sp, [None]
        if sp.rank == sp.leader:
            try:
                box[0] = ("ok", self.fn(*args, **kwargs))
            except Exception as exc:  # noqa: BLE001 - re-raised on every process of the group below
                box[0] = ("err", _portable(exc))
        dist.broadcast_object_list(box, src=sp.leader, group=sp.reward_group)
        kind, value = box[0]
        if kind == "err":
            raise value
        return value

    def __getattr__(self, name):
        if name in ("fn", "sp"):
            raise AttributeError(name)
        return getattr(self.fn, name)


def _portable(exc: BaseException) -> BaseException:
    """The exception itself if it pickles, else a RuntimeError with its message (the other processes raise it)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def setup(cfg, accelerator, adapter) -> Optional[SequenceParallel]:
    """The groups of ``run.sequence_parallel`` (None when it is 1). Checks the settings (``ConfigError`` naming
    them), builds the device mesh (data, ring, ulysses) = (W/P, 1, P) and the reward groups, and declares the rows
    of the groups' other processes copies. Every process calls it."""
    P, W = int(cfg.run.sequence_parallel), accelerator.num_processes
    if P == 1:
        return None
    if P < 1 or W % P or W < P:
        raise ConfigError(f"run.sequence_parallel={P} must divide the number of processes ({W})")
    if cfg.reward.mode == "win_rate":
        raise ConfigError("run.sequence_parallel > 1 does not support reward.mode=win_rate")
    if cfg.reward.async_workers > 1:
        raise ConfigError(f"run.sequence_parallel > 1 needs reward.async_workers <= 1 (got "
                          f"{cfg.reward.async_workers}): a group's processes receive its rewards in call order")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from .models.sequence_parallel import check_supported

    check_supported(adapter, P)
    rank = dist.get_rank()
    mesh = init_device_mesh(accelerator.device.type, (W // P, 1, P), mesh_dim_names=("data", "ring", "ulysses"))
    groups = [dist.new_group(list(range(g * P, (g + 1) * P)), backend="gloo") for g in range(W // P)]
    sp = SequenceParallel(degree=P, rank=rank, world=W, mesh=mesh["ring", "ulysses"], reward_group=groups[rank // P])
    edist.set_row_source(sp.leader)
    return sp
