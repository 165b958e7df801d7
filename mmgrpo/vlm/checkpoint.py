"""Checkpoints of a VLM run: what is written, the save and the exact resume, in the one format of
:mod:`mmgrpo.engine.checkpoint` (layout: docs/checkpoints.md).

Entries: ``policy.pt`` (the trained tensors, gathered from the shards under FSDP: the portable copy that
``scripts/experiments/export_vlm.py`` and evaluation read), ``optimizer.pt`` (``optimizer.state_dict()``; under
sharding only the param groups, the moments are in ``state/``), ``scheduler.pt``, ``trainer.pt`` (the recipe's run
state -- step, data position, counters, selection, the guard's skip state and budget: the ``run_state`` the recipe
hands over -- plus every method's state, per process for the methods whose state is the process's own; config,
reference), ``rng.pt`` (every process's RNG).

:func:`save` and :func:`resume` take what they write and restore explicitly: the checkpoint manager, the run's
config, its methods, the trained objects (:class:`TrainedModel`) and the process layout
(:class:`~mmgrpo.engine.parallel.Parallel`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from mmgrpo.engine import dist as _dist
from mmgrpo.engine.checkpoint import (STATE_DIR, gather_rng, load_sharded_state, restore_rng, save_checkpoint,
                                      sharded_writer)
from mmgrpo.engine.parallel import Parallel
from mmgrpo.utils.checkpoint import CheckpointManager, capture_rng_state
from mmgrpo.utils.config import config_to_dict
from mmgrpo.utils.logging import get_logger
from mmgrpo.vlm.models.adapters import Policy

log = get_logger("mmgrpo.train")

__all__ = ["TrainedModel", "state", "save", "resume", "gather_local_states"]


@dataclass
class TrainedModel:
    """The weights being trained (as :class:`flow_grpo.build.TrainedModel` for flow), what a checkpoint writes of the
    model and its optimizer: the ``policy`` (its trainable tensors, LoRA adapter,
    reference), ``model`` (the module forwards go through: ``accelerator.prepare``d or the policy's own),
    ``unwrapped`` (the module itself), ``optimizer``, ``scheduler``."""

    policy: Policy
    model: Any
    unwrapped: Any
    optimizer: Any
    scheduler: Any


def state(cfg, run_state: dict, methods: Sequence[Any], tr: TrainedModel, par: Parallel,
          full_state_dict: dict | None = None, rng: dict | None = None, optim_meta: dict | None = None,
          local: dict | None = None) -> dict:
    """The main process's entries. ``run_state``: the recipe's part of ``trainer.pt``; ``full_state_dict``: the
    gathered weights of a sharded model; ``optim_meta``: the sharded optimizer's param groups (its moments are written
    to ``state/``); ``rng``: every process's RNG state (:func:`~mmgrpo.engine.checkpoint.gather_rng`; default: this
    process's); ``local``: every process's state of the methods whose state is per process
    (:func:`gather_local_states`; default: this process's)."""
    if full_state_dict is not None:
        names = {n for n, p in tr.unwrapped.named_parameters() if p.requires_grad}
        pol = {k: v.detach().cpu() for k, v in full_state_dict.items() if k in names}
    else:
        pol = tr.policy.trainable_state_dict()
    scaler = getattr(par.accelerator, "scaler", None)  # fp16 mixed precision only
    return {
        "policy": pol,
        "optimizer": optim_meta if optim_meta is not None else tr.optimizer.state_dict(),
        "scheduler": tr.scheduler.state_dict(),
        "trainer": {
            **run_state, "config": config_to_dict(cfg), "world_size": par.world,
            "reference": {"kind": "lora_disabled" if tr.policy.lora else
                          ("frozen_initial_copy" if tr.policy.ref_model is not None else "none"),
                          "model_path": cfg.model.path, "kl_coef": cfg.algo.kl_coef},
            "methods": {m.name: sd for m in methods if not m.state_per_process and (sd := m.state_dict()) is not None},
            "methods_per_process": local if local is not None else {"per_rank": [_local_states(methods)], "world": 1},
            "scaler": scaler.state_dict() if scaler is not None else None,
        },
        "rng": rng if rng is not None else {"per_rank": [capture_rng_state()], "world": 1},
    }


def _local_states(methods: Sequence[Any]) -> dict:
    return {m.name: sd for m in methods if m.state_per_process and (sd := m.state_dict()) is not None}


def gather_local_states(methods: Sequence[Any]) -> dict:
    """Collective: every process's state of the methods whose state is its own (``state_per_process``: buffers of
    the groups it sampled), for the main process to save."""
    per_rank = _dist.all_gather_object(_local_states(methods))
    return {"per_rank": per_rank, "world": len(per_rank)}


def save(ckpt: CheckpointManager, cfg, step: int, run_state: dict, methods: Sequence[Any], tr: TrainedModel,
         par: Parallel, metrics: dict[str, float]) -> Path | None:
    """Collective: every process calls it. Writes checkpoint ``step``; ``metrics``: the step's, from which
    ``run.best_metric`` is read for retention. Returns the checkpoint folder on the main process."""
    rng = gather_rng()
    local = gather_local_states(methods)
    full_sd = sharded = optim_meta = None
    if par.sharded:
        sharded, optim_meta = sharded_writer(tr.model, tr.optimizer, par.accelerator,
                                             deepspeed=par.dist_kind == "DEEPSPEED")
        full_sd = par.accelerator.get_state_dict(tr.model)  # the portable copy of the weights (gathers the shards)
    main = par.accelerator.is_main_process
    extra = {}
    if main and tr.policy.lora and not par.sharded:
        extra["adapter"] = lambda p: tr.unwrapped.save_pretrained(str(p))
    path = save_checkpoint(ckpt, step, lambda: state(cfg, run_state, methods, tr, par, full_sd, rng, optim_meta, local),
                           is_main=main, sharded=sharded,
                           metric=_best_metric(cfg.run.best_metric, metrics, step) if main else None,
                           extra_files=extra)
    if path is not None:
        log.info("saved checkpoint %s", path)
    return path


def _best_metric(key: str, metrics: dict[str, float], step: int) -> float | None:
    if not key:
        return None
    metric = metrics.get(key)
    if metric is None:
        log.warning("run.best_metric=%r is not among this step's metrics (e.g. %s); checkpoint %d has no metric", key,
                    sorted(metrics)[:5], step)
    return metric


def _load_local_states(methods: Sequence[Any], saved: dict | None, par: Parallel) -> None:
    """Each process's own method states, on as many processes as wrote them; on another count the buffers start
    empty (a process's buffered groups cannot be split or merged into another's), with a warning."""
    local = [m for m in methods if m.state_per_process]
    if not local or not saved:
        return
    per = list(saved["per_rank"])
    if int(saved.get("world", len(per))) != par.world or len(per) != par.world:
        log.warning("resume: the checkpoint was written by %d process(es), this run has %d: the per-process states "
                    "of %s start empty", int(saved.get("world", len(per))), par.world, [m.name for m in local])
        return
    for m in local:
        if m.name in per[par.rank]:
            m.load_state_dict(per[par.rank][m.name])


def resume(ckpt: CheckpointManager, cfg, methods: Sequence[Any], tr: TrainedModel, par: Parallel,
           restore_run_state: Callable[[dict], None]) -> Path | None:
    """Restore a run from ``run.resume_from`` (auto: the newest valid checkpoint); None when there is none. The
    weights, optimizer, scheduler, mixed-precision scaler, the methods' states and the RNG are restored here;
    ``restore_run_state(trainer_entry)`` restores the recipe's own part (what it handed to :func:`save` as
    ``run_state``), after the scheduler and before the methods."""
    path = ckpt.resolve(cfg.run.resume_from)
    if path is None:
        return None
    ck = ckpt.load(path)
    entry = ck["trainer"]
    ref = entry["reference"]
    if ref["kind"] == "frozen_initial_copy" and ref["model_path"] != cfg.model.path:
        raise ValueError(f"resume: the reference was {ref['model_path']!r}, now model.path={cfg.model.path!r}")
    if (path / STATE_DIR).is_dir():  # sharded state: any process count, sharded or not
        load_sharded_state(path / STATE_DIR, tr.model, tr.optimizer, par.accelerator, ck["optimizer"],
                           deepspeed=par.dist_kind == "DEEPSPEED")
    else:
        if par.sharded:
            raise ValueError(f"resume: {path} was written by a replicated run (no {STATE_DIR}/ folder); a "
                             f"{par.dist_kind} run resumes from sharded checkpoints only")
        tr.policy.load_trainable_state_dict(ck["policy"])
        tr.optimizer.load_state_dict(ck["optimizer"])
    if ck.get("scheduler"):
        tr.scheduler.load_state_dict(ck["scheduler"])
    restore_run_state(entry)
    if entry.get("scaler") is not None and getattr(par.accelerator, "scaler", None) is not None:
        par.accelerator.scaler.load_state_dict(entry["scaler"])
    for m in methods:
        if m.name in entry.get("methods", {}):
            m.load_state_dict(entry["methods"][m.name])
    _load_local_states(methods, entry.get("methods_per_process"), par)
    restore_rng(ck.get("rng"), par.rank, par.world)
    return path
