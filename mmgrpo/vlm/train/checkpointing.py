"""Checkpoints of the VLM recipe: what is written (:func:`state`), the save and the exact resume, in the one format of
:mod:`mmgrpo.engine.checkpoint` (layout: docs/checkpoints.md).

Entries: ``policy.pt`` (the trained tensors, gathered from the shards under FSDP: the portable copy that
``scripts/experiments/export_vlm.py`` and evaluation read), ``optimizer.pt`` (``optimizer.state_dict()``; under
sharding only the param groups, the moments are in ``state/``), ``scheduler.pt``, ``trainer.pt`` (the
:class:`~mmgrpo.vlm.train.trainer.RunState`: step, data position, counters, selection; the guard's skip state and
budget; every method's state, per process for the methods whose state is the process's own; config, reference),
``rng.pt`` (every process's RNG)."""
from __future__ import annotations

from pathlib import Path

from mmgrpo.engine import dist as _dist
from mmgrpo.engine.checkpoint import (STATE_DIR, gather_rng, load_sharded_state, restore_rng, save_checkpoint,
                                      sharded_writer)
from mmgrpo.utils.checkpoint import capture_rng_state
from mmgrpo.utils.config import config_to_dict
from mmgrpo.utils.logging import get_logger
from mmgrpo.vlm.train.prompts import make_stream

log = get_logger("mmgrpo.train")

__all__ = ["state", "save", "resume", "gather_local_states"]


def state(run, full_state_dict: dict | None = None, rng: dict | None = None, optim_meta: dict | None = None,
          local: dict | None = None) -> dict:
    """The main process's entries. ``full_state_dict``: the gathered weights of a sharded model; ``optim_meta``: the
    sharded optimizer's param groups (its moments are written to ``state/``); ``rng``: every process's RNG state
    (:func:`~mmgrpo.engine.checkpoint.gather_rng`; default: this process's); ``local``: every process's state of the
    methods whose state is per process (:func:`gather_local_states`; default: this process's)."""
    cfg, st = run.cfg, run.state
    if full_state_dict is not None:
        names = {n for n, p in run.unwrapped.named_parameters() if p.requires_grad}
        pol = {k: v.detach().cpu() for k, v in full_state_dict.items() if k in names}
    else:
        pol = run.policy.trainable_state_dict()
    scaler = getattr(run.accelerator, "scaler", None)  # fp16 mixed precision only
    return {
        "policy": pol,
        "optimizer": optim_meta if optim_meta is not None else run.optimizer.state_dict(),
        "scheduler": run.scheduler.state_dict(),
        "trainer": {
            "step": st.step, "stream": st.stream.state_dict(), "counters": dict(st.counters),
            **run.guard.state_dict(), "config": config_to_dict(cfg), "world_size": run.world,
            "reference": {"kind": "lora_disabled" if run.policy.lora else
                          ("frozen_initial_copy" if run.policy.ref_model is not None else "none"),
                          "model_path": cfg.model.path, "kl_coef": cfg.algo.kl_coef},
            "selected": st.selected,
            "methods": {m.name: sd for m in run.methods
                        if not m.state_per_process and (sd := m.state_dict()) is not None},
            "methods_per_process": local if local is not None else {"per_rank": [_local_states(run)], "world": 1},
            "scaler": scaler.state_dict() if scaler is not None else None,
        },
        "rng": rng if rng is not None else {"per_rank": [capture_rng_state()], "world": 1},
    }


def _local_states(run) -> dict:
    return {m.name: sd for m in run.methods if m.state_per_process and (sd := m.state_dict()) is not None}


def gather_local_states(run) -> dict:
    """Collective: every process's state of the methods whose state is its own (``state_per_process``: buffers of
    the groups it sampled), for the main process to save."""
    per_rank = _dist.all_gather_object(_local_states(run))
    return {"per_rank": per_rank, "world": len(per_rank)}


def save(run) -> Path | None:
    """Collective: every process calls it. Returns the checkpoint folder on the main process."""
    rng = gather_rng()
    local = gather_local_states(run)
    full_sd = sharded = optim_meta = None
    if run.sharded:
        sharded, optim_meta = sharded_writer(run.model, run.optimizer, run.accelerator,
                                             deepspeed=run.dist_kind == "DEEPSPEED")
        full_sd = run.accelerator.get_state_dict(run.model)  # the portable copy of the weights (gathers the shards)
    main = run.accelerator.is_main_process
    extra = {}
    if main and run.policy.lora and not run.sharded:
        extra["adapter"] = lambda p: run.unwrapped.save_pretrained(str(p))
    path = save_checkpoint(run.ckpt, run.state.step, lambda: state(run, full_sd, rng, optim_meta, local), is_main=main,
                           sharded=sharded, metric=_best_metric(run) if main else None, extra_files=extra)
    if path is not None:
        log.info("saved checkpoint %s", path)
    return path


def _load_local_states(run, saved: dict | None) -> None:
    """Each process's own method states, on as many processes as wrote them; on another count the buffers start
    empty (a process's buffered groups cannot be split or merged into another's), with a warning."""
    local = [m for m in run.methods if m.state_per_process]
    if not local or not saved:
        return
    per = list(saved["per_rank"])
    if int(saved.get("world", len(per))) != run.world or len(per) != run.world:
        log.warning("resume: the checkpoint was written by %d process(es), this run has %d: the per-process states "
                    "of %s start empty", int(saved.get("world", len(per))), run.world, [m.name for m in local])
        return
    for m in local:
        if m.name in per[run.rank]:
            m.load_state_dict(per[run.rank][m.name])


def _best_metric(run) -> float | None:
    key, last = run.cfg.run.best_metric, run.state.metrics
    if not key:
        return None
    metric = last.get(key)
    if metric is None:
        log.warning("run.best_metric=%r is not among this step's metrics (e.g. %s); checkpoint %d has no metric", key,
                    sorted(last)[:5], run.state.step)
    return metric


def resume(run) -> bool:
    """Restore the run from ``run.resume_from`` (auto: the newest valid checkpoint); False when there is none."""
    cfg, st = run.cfg, run.state
    path = run.ckpt.resolve(cfg.run.resume_from)
    if path is None:
        return False
    ck = run.ckpt.load(path)
    tr = ck["trainer"]
    ref = tr["reference"]
    if ref["kind"] == "frozen_initial_copy" and ref["model_path"] != cfg.model.path:
        raise ValueError(f"resume: the reference was {ref['model_path']!r}, now model.path={cfg.model.path!r}")
    if (path / STATE_DIR).is_dir():  # sharded state: any process count, sharded or not
        load_sharded_state(path / STATE_DIR, run.model, run.optimizer, run.accelerator, ck["optimizer"],
                           deepspeed=run.dist_kind == "DEEPSPEED")
    else:
        if run.sharded:
            raise ValueError(f"resume: {path} was written by a replicated run (no {STATE_DIR}/ folder); a "
                             f"{run.dist_kind} run resumes from sharded checkpoints only")
        run.policy.load_trainable_state_dict(ck["policy"])
        run.optimizer.load_state_dict(ck["optimizer"])
    if ck.get("scheduler"):
        run.scheduler.load_state_dict(ck["scheduler"])
    if tr.get("selected") is not None:
        run.use_samples(tr["selected"])
    st.stream = make_stream(run)
    st.stream.load_state_dict(tr["stream"])
    st.step = int(tr["step"])
    st.counters.update(tr["counters"])
    run.guard.load_state_dict(tr)
    if tr.get("scaler") is not None and getattr(run.accelerator, "scaler", None) is not None:
        run.accelerator.scaler.load_state_dict(tr["scaler"])
    for m in run.methods:
        if m.name in tr.get("methods", {}):
            m.load_state_dict(tr["methods"][m.name])
    _load_local_states(run, tr.get("methods_per_process"))
    restore_rng(ck.get("rng"), run.rank, run.world)
    log.info("resumed from %s at step %d", path, st.step)
    run.guard.saved(st.step, path)  # an interrupt before the next step need not rewrite it
    return True
