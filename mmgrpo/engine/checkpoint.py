"""One checkpoint format for both trainers, replicated and sharded runs (layout and guarantees: docs/checkpoints.md).

A checkpoint is one atomic folder of :class:`mmgrpo.utils.checkpoint.CheckpointManager` (temp dir, fsync, manifest
written last, rename; retention of the last N + best). Inside it:

* ``<entry>.pt`` - written by the main process with ``torch.save``, read with ``torch.load(weights_only=True)``:
  the run state (``trainer``), the RNG states of every process (``rng``: ``{"per_rank": [...], "world": W}``), the
  LR schedule, and, when every process holds the whole trainable state (single process, DDP, hand-summed
  gradients), the trainable weights and the optimizer (``optimizer.state_dict()``, exact, fp32 masters included).
* ``state/`` - only when the parameters are sharded (FSDP2): trainable weights, AdamW moments and any extra
  sharded tensors (the flow trainer's EMA), saved by every process with ``torch.distributed.checkpoint`` (DCP),
  keyed by parameter name. The optimizer's ``param_groups`` (plain numbers) go to the main process's
  ``optimizer.pt``. DeepSpeed keeps its engine's own format in ``state/`` (``accelerator.save_state``; untested).

Why DCP and not ``accelerator.save_state`` + ``register_for_checkpointing``: measured on CPU (gloo, FSDP2;
``tests/engine/test_checkpoint_reshard.py``), DCP restores the FSDP2 weights and the AdamW state bit for bit on 1,
2 (and, into an unsharded module, 1) processes from a checkpoint written by 2 (or 1): its load plans reshard by
parameter name. ``accelerator.save_state`` writes the model and optimizer through the same DCP under FSDP; what it
adds does not fit: the objects given to ``register_for_checkpointing`` (data position, counters, budget, EMA) go to
``custom_checkpoint_<i>.pkl``, which ``load_state`` reads with ``torch.load(weights_only=False)`` (accelerate 1.15
``load_custom_state``: loading would run code from the file) and which are keyed by registration order; and for
replicated runs it saves the whole model (frozen base included) instead of the trained tensors. Everything it
added is kept here as plain, safely loadable entries. Only tensors go through DCP: DCP reads its non-tensor items
with ``torch.load(weights_only=False)`` too, so none are written, and a folder holding one is refused before DCP
reads anything (:func:`mmgrpo.utils.checkpoint.read_dcp_metadata`: ``.metadata`` with a restricted unpickler, no
other metadata file, tensor entries only; DCP then plans with that checked object).

Process-count changes: a sharded checkpoint resumes on any number of processes (and into an unsharded run);
replicated entries are the same on every process, so they resume on any number too. RNG states are restored only
on the same number of processes (each process its own stream); otherwise the new processes keep their seeded
streams (logged) - the weights, optimizer and data position are still exact.
"""
from __future__ import annotations

import contextlib
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import torch

from mmgrpo.engine import dist as _dist

__all__ = ["gather_rng", "restore_rng", "save_checkpoint", "sharded_writer", "load_sharded_state",
           "sharded_model_optim", "load_sharded_model_optim", "sharded_like", "save_sharded", "load_sharded",
           "STATE_DIR"]

log = logging.getLogger("mmgrpo.checkpoint")

STATE_DIR = "state"  # DCP folder of the sharded tensors inside a checkpoint


# --------------------------------------------------------------------------------------------------- RNG state
def gather_rng() -> dict:
    """Collective: every process's RNG state (python, numpy, torch, CUDA), for the main process to save."""
    from mmgrpo.utils.checkpoint import capture_rng_state

    per_rank = _dist.all_gather_object(capture_rng_state())
    return {"per_rank": per_rank, "world": len(per_rank)}


def restore_rng(saved: Optional[Mapping[str, Any]], rank: int, world: int) -> bool:
    """Restore this process's RNG state from :func:`gather_rng`'s output, only on the same number of processes
    (each process its own stream); returns whether it did."""
    from mmgrpo.utils.checkpoint import restore_rng_state

    if not saved:
        return False
    per = list(saved["per_rank"])
    if int(saved.get("world", len(per))) != world or len(per) != world:
        log.warning("resume: the checkpoint was written by %d process(es), this run has %d: RNG streams are not "
                    "restored (weights, optimizer and data position are)", int(saved.get("world", len(per))), world)
        return False
    restore_rng_state(per[rank])
    return True


# ------------------------------------------------------------------------------------------ sharded tensors
def _tensors_only(tree: Mapping[str, Any], where: str = "") -> dict:
    """Keep the tensor leaves of a nested dict (DCP reads non-tensor items with an unsafe unpickler)."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            sub = _tensors_only(v, f"{where}{k}.")
            if sub:
                out[k] = sub
        elif isinstance(v, torch.Tensor):
            out[k] = v
        else:
            raise TypeError(f"sharded checkpoint: {where}{k} is a {type(v).__name__}, only tensors are written")
    return out


@contextlib.contextmanager
def _single_process_quiet():
    """DCP warns on every call without a process group that it assumes one process, which is what is meant here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_sharded(path: str | os.PathLike, tensors: Mapping[str, Any]) -> None:
    """Collective: write a nested dict of tensors / DTensors with ``torch.distributed.checkpoint`` (each process
    its shards; replicated tensors once)."""
    import torch.distributed.checkpoint as dcp

    with _single_process_quiet():
        dcp.save(_tensors_only(tensors), checkpoint_id=str(path))


def _checked_reader(path: str | os.PathLike):
    """A DCP ``FileSystemReader`` whose metadata is :func:`~mmgrpo.utils.checkpoint.read_dcp_metadata`'s checked
    object (restricted unpickler, tensors only, ``.metadata`` the only metadata file), and which refuses to read any
    non-tensor item should one be planned anyway.  Its ``read_metadata`` takes no ``rank``: DCP then never falls
    back to a per-rank ``__<rank>.metadata`` file."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta
    from torch.distributed.checkpoint.planner import LoadItemType

    from mmgrpo.utils.checkpoint import UnsafeCheckpointError, read_dcp_metadata

    checked = read_dcp_metadata(path)

    class CheckedReader(FileSystemReader):
        def read_metadata(self):  # no **kwargs: DCP's per-rank metadata fallback is off
            if getattr(checked, "storage_meta", None) is None:
                checked.storage_meta = StorageMeta()
            checked.storage_meta.load_id = self.load_id
            return checked

        def read_data(self, plan, planner):
            bad = [r.storage_index.fqn for r in plan.items if r.type == LoadItemType.BYTE_IO]
            if bad:
                raise UnsafeCheckpointError(f"sharded checkpoint {path} refused: entry {bad[0]!r} is not a tensor "
                                            "(torch.distributed.checkpoint would unpickle it as is)")
            return super().read_data(plan, planner)

    return CheckedReader(str(path))


def load_sharded(path: str | os.PathLike, template: Mapping[str, Any]) -> dict:
    """Collective: fill ``template`` (a nested dict of tensors / DTensors laid out as this run holds them) from a
    DCP folder written by any number of processes; returns it. The folder's metadata is read and checked first
    (:func:`mmgrpo.utils.checkpoint.read_dcp_metadata`): only tensor entries, never run code."""
    import torch.distributed.checkpoint as dcp

    reader = _checked_reader(path)
    sd = _tensors_only(template)
    with _single_process_quiet():
        dcp.load(sd, storage_reader=reader)
    return sd


def _opts(load: bool = False):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # trainable tensors only: a LoRA run never writes its frozen base. Loading them is not strict about the frozen
    # ones; every trainable one is checked by DCP (a template key missing from the checkpoint raises)
    return StateDictOptions(ignore_frozen_params=True, strict=not load)


def sharded_model_optim(model: torch.nn.Module, optimizer) -> tuple[dict, dict]:
    """(tensors, optimizer meta) of a model and its optimizer keyed by parameter name: ``{"model": {name: w},
    "optim": {name: {"exp_avg": .., "exp_avg_sq": .., "step": ..}}}`` (DTensor shards under FSDP2) and
    ``{"param_groups": [...], "has_state": bool}`` (plain numbers + parameter names) for ``optimizer.pt``.
    An optimizer that has not stepped yet writes no moments (asking torch for them would initialise them with a
    zero-lr step, i.e. AdamW's step count 1 instead of 0)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wrapper
    if not optimizer.state:
        groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        return {"model": get_model_state_dict(model, options=_opts())}, {"param_groups": groups, "has_state": False}
    msd, osd = get_state_dict(model, optimizer, options=_opts())
    return {"model": msd, "optim": osd["state"]}, {"param_groups": [dict(g) for g in osd["param_groups"]],
                                                   "has_state": True}


def load_sharded_model_optim(path: str | os.PathLike, model: torch.nn.Module, optimizer, meta: Mapping[str, Any],
                             extra: Optional[Mapping[str, Any]] = None) -> dict:
    """Collective: load weights + optimizer state from ``path`` (any process count) into ``model`` / ``optimizer``
    as this run shards them (``meta``: :func:`sharded_model_optim`'s second value, from ``optimizer.pt``);
    ``extra``: more tensors to fill (e.g. EMA shadows from :func:`sharded_like`), returned loaded."""
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_state_dict,
                                                         set_model_state_dict, set_state_dict)

    opt = getattr(optimizer, "optimizer", optimizer)
    if meta.get("has_state", True):
        # the template of this run's layout; torch initialises an empty AdamW state with a zero-lr step (no update)
        msd, osd = get_state_dict(model, opt, options=_opts())
        tensors = {"model": msd, "optim": osd["state"]}
    else:
        tensors = {"model": get_model_state_dict(model, options=_opts())}
    template = dict(tensors)
    if extra:
        template["extra"] = dict(extra)
    got = load_sharded(path, template)
    if meta.get("has_state", True):
        set_state_dict(model, opt, model_state_dict=got["model"],
                       optim_state_dict={"state": got["optim"], "param_groups": list(meta["param_groups"])},
                       options=_opts(load=True))
    else:
        set_model_state_dict(model, got["model"], options=_opts(load=True))
        for g, saved in zip(opt.param_groups, meta["param_groups"]):
            g.update({k: v for k, v in saved.items() if k != "params"})
    return got.get("extra", {})


def sharded_like(local: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``local`` (this process's piece of ``param``, e.g. an EMA shadow) as a tensor DCP can reshard: a DTensor
    with ``param``'s mesh and placements, or ``local`` itself when ``param`` is not sharded."""
    if not hasattr(param, "device_mesh"):
        return local
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False, shape=param.shape,
                              stride=param.stride())


def sharded_writer(model: torch.nn.Module, optimizer, accelerator, deepspeed: bool = False,
                   extra: Optional[Mapping[str, Any]] = None) -> tuple[Callable[[Path], None], dict]:
    """(writer, optimizer meta) of a sharded run for :func:`save_checkpoint`: the writer saves the weights, the
    optimizer moments and ``extra`` tensors (e.g. EMA shadows from :func:`sharded_like`) into ``state/``; the meta
    goes to ``optimizer.pt``. DeepSpeed: the engine's own ``save_state`` (untested here: no DeepSpeed install)."""
    if deepspeed:  # pragma: no cover
        return (lambda d: accelerator.save_state(str(d))), {}
    tensors, meta = sharded_model_optim(model, optimizer)
    if extra:
        tensors["extra"] = dict(extra)
    return (lambda d: save_sharded(d, tensors)), meta


def load_sharded_state(path: str | os.PathLike, model: torch.nn.Module, optimizer, accelerator, meta: Mapping,
                       deepspeed: bool = False, extra: Optional[Mapping[str, Any]] = None) -> dict:
    """Collective: the inverse of :func:`sharded_writer` (``path``: the checkpoint's ``state/``) into this run's
    layout, whatever number of processes wrote it; returns the loaded ``extra`` tensors."""
    if deepspeed:  # pragma: no cover
        from mmgrpo.utils.checkpoint import refuse_unsafe_pickles

        refuse_unsafe_pickles(path)
        accelerator.load_state(str(path))
        return {}
    if getattr(getattr(optimizer, "optimizer", optimizer), "masters", None) is not None:
        raise ValueError(f"resume: {path} holds sharded optimizer state; this run keeps fp32 master weights of bf16 "
                         "parameters (optim.fp32_master_weights), which cannot take it: resume with "
                         "optim.fp32_master_weights=false or with the sharded setup that wrote it")
    return load_sharded_model_optim(path, model, optimizer, meta, extra=extra)


# ---------------------------------------------------------------------------------------------- the folder
def save_checkpoint(mgr, step: int, entries: Callable[[], Mapping[str, Any]], *, is_main: bool,
                    sharded: Optional[Callable[[Path], None]] = None, metric: Optional[float] = None,
                    extra_files: Optional[Mapping[str, Callable[[Path], Any]]] = None) -> Optional[Path]:
    """Collective: write checkpoint ``step`` through ``mgr`` (atomic folder + manifest + retention).

    ``entries()``: the main process's ``{name: plain data / tensors}`` (one ``<name>.pt`` each), built after the
    sharded write. ``sharded(dir)``: called on every process to write the sharded tensors into ``dir`` (a staging
    folder under ``mgr.root`` that becomes ``state/``; removed with the other stale temp dirs if the writer dies).
    Returns the checkpoint folder on the main process, None elsewhere."""
    stage = None
    if sharded is not None:
        if is_main:
            mgr.root.mkdir(parents=True, exist_ok=True)
            stage = mgr.root / f".tmp-{STATE_DIR}-{int(step):08d}-{os.getpid()}"  # .tmp-*-<pid>: cleaned if dead
            stage.mkdir(exist_ok=True)
        stage = Path(_dist.broadcast_object(str(stage) if stage is not None else None))
        sharded(stage)
        _dist.barrier()
    path = None
    if is_main:
        extra = dict(extra_files or {})
        if stage is not None:
            extra[STATE_DIR] = lambda p: os.rename(stage, p)
        path = mgr.save(step, entries(), metric=metric, extra_files=extra)
    _dist.barrier()
    return path
