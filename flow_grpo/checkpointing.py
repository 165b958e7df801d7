"""Checkpoints and the final export of the flow recipe (functions of :class:`flow_grpo.train.trainer.FlowGRPOTrainer`), in
the one format of :mod:`mmgrpo.engine.checkpoint` (layout: docs/checkpoints.md).

Atomic ``checkpoints/epoch-XXXXXXXX`` folders (:class:`mmgrpo.utils.checkpoint.CheckpointManager`); halted runs write ``halted/step-XXXXXXXX`` (the optimizer step they stopped
at). Entries of the main process: ``trainer`` (epoch, step, counters, skip state, budget, data), ``config``,
``reference``, ``rng`` (every process's), ``scheduler``, ``optimizer``, ``ema``, the methods' state (``methods``)
and, when every process holds the whole trainable state (single process, DDP), ``trainable``. Sharded runs (FSDP2)
write the weights, AdamW moments and EMA shadows to ``state/`` instead (every process its shards; resumable on any
number of processes)."""
from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Optional

import torch

from mmgrpo.engine.checkpoint import (STATE_DIR, gather_rng, load_sharded_state, restore_rng, save_checkpoint,
                                      sharded_like, sharded_writer)
from mmgrpo.engine.dist import all_gather_object, barrier, broadcast_object
from mmgrpo.utils.logging import get_logger
from mmgrpo.utils.write_errors import names_write_errors

log = get_logger("flow_grpo.trainer")


def state_dict(run) -> dict:
    """Checkpoint entries of a replicated run (written by the main process): trainable weights, optimizer,
    LR schedule, EMA, the run state, the methods' state, reference settings, config. RNG states of every process
    are added by :func:`save`."""
    from mmgrpo.utils.config import config_to_dict

    return {
        "trainable": {n: p.detach().cpu().clone() for n, p in run.named_params},
        "optimizer": run.optimizer.state_dict(),
        "scheduler": run.lr_scheduler.state_dict(),
        "ema": run.ema.state_dict() if run.ema is not None else {},
        "trainer": _trainer_state(run),
        "methods": _methods_state(run),
        "config": config_to_dict(run.cfg),
        "reference": dict(run.reference_info),
    }


def _sharded_entries(run, optim_meta: dict) -> dict:
    """The main process's entries of a sharded run (tensors are in ``state/``)."""
    from mmgrpo.utils.config import config_to_dict

    ema = ({k: v for k, v in run.ema.state_dict().items() if k != "shadow"} if run.ema is not None else {})
    return {"optimizer": optim_meta, "scheduler": run.lr_scheduler.state_dict(), "ema": ema,
            "trainer": _trainer_state(run), "methods": _methods_state(run), "config": config_to_dict(run.cfg),
            "reference": dict(run.reference_info)}


def _methods_state(run) -> dict:
    """Every method's own state (DiffusionNFT's old adapter, B²-DiffuRL's history, Adv-GRPO's reward model)."""
    return {m.name: sd for m in run.methods if (sd := m.state_dict()) is not None}


def _trainer_state(run) -> dict:
    st = run.state
    scaler = getattr(run.accelerator, "scaler", None)  # fp16 mixed precision only
    return {"epoch": st.epoch, "global_step": st.global_step, "world": run.world,
            "counters": dict(st.counters), **run.guard.state_dict(), "best_eval": st.best_eval,
            "scaler": scaler.state_dict() if scaler is not None else None,
            "data": {"epoch": st.epoch, "num_prompts": len(run.prompts),
                     "prompts_sha256": hashlib.sha256("\n".join(run.prompts).encode()).hexdigest(),
                     "group_size": run.cfg.data.group_size, "groups_per_epoch": run.cfg.data.groups_per_epoch}}


def check_replicas_in_sync(run) -> None:
    """Replicated backends: every process must hold the same trainable weights (DanceGRPO#110 guard). Compares
    per-tensor float64 sums and sums of squares computed on the device (cheap even for full fine-tunes);
    replicas that diverged in any entry would have to collide in both sums of every tensor to pass."""
    if run.sharded or run.accelerator.num_processes == 1:
        return
    with torch.no_grad():
        fp = torch.stack([torch.stack([p.detach().double().sum(), p.detach().double().pow(2).sum()])
                          for _, p in run.named_params]).cpu()
    prints = all_gather_object(fp)
    bad = [r for r, f in enumerate(prints) if not torch.equal(f, prints[0])]
    if bad:
        raise RuntimeError(f"processes {bad} hold different trainable weights than process 0: gradients were not "
                           "synchronised")


def _ema_sharded(run) -> dict:
    """The EMA shadows as tensors DCP can reshard (DTensors with their parameter's layout)."""
    if run.ema is None:
        return {}
    return {n: sharded_like(s, p) for (n, p), s in zip(run.named_params, run.ema.shadow)}


def save(run, metric: Optional[float] = None, halted: bool = False) -> Optional[Path]:
    """Collective: every process must call it. Returns the checkpoint dir on the main process."""
    mgr = run.halt_ckpt if halted else run.ckpt
    step = run.state.global_step if halted else run.state.epoch
    rng = gather_rng()
    extra, sharded = {}, None
    if run.sharded:
        sharded, meta = sharded_writer(run.model, run.optimizer, run.accelerator, deepspeed=run.deepspeed,
                                       extra={"ema": _ema_sharded(run)})

        def entries():
            return {**_sharded_entries(run, meta), "rng": rng}
    else:
        check_replicas_in_sync(run)

        def entries():
            return {**state_dict(run), "rng": rng}

        if run.cfg.model.lora.enabled and run.is_main:
            # lora/ = the trained weights, lora_ema/ = their EMA once updated (as the final export)
            def write_lora(p, ema=False):
                os.makedirs(p, exist_ok=True)
                with run.ema.swapped_in() if ema else contextlib.nullcontext():
                    run.adapter.save_lora(str(p))
            extra["lora"] = write_lora
            if _exports_ema(run):
                extra["lora_ema"] = lambda p: write_lora(p, ema=True)
    path = save_checkpoint(mgr, step, entries, is_main=run.is_main, sharded=sharded, metric=metric,
                           extra_files=extra)
    if not halted:
        run.guard.saved(run.state.epoch, path)  # a stop right after this save does not write it again
    return path


def load_state_dict(run, st: dict, path: Optional[Path] = None) -> None:
    ref = st.get("reference")
    if ref and ref.get("base_fingerprint") != run.reference_info["base_fingerprint"]:
        raise ValueError("checkpoint was trained on different base weights (fingerprint mismatch): refusing to "
                         "resume onto another model")
    tr = st["trainer"]
    data = tr.get("data", {})
    sha = hashlib.sha256("\n".join(run.prompts).encode()).hexdigest()
    if data and data.get("prompts_sha256") != sha:
        log.warning("resume: the prompt list differs from the checkpoint's; the data order will not reproduce")
    if path is not None and (Path(path) / STATE_DIR).is_dir():
        _load_sharded(run, st, Path(path))
    else:
        if run.sharded:
            raise ValueError(f"resume: {path} was written by a replicated run (no {STATE_DIR}/ folder); a sharded "
                             "run resumes from sharded checkpoints only")
        _load_replicated(run, st)
    saved = st.get("methods") or {}
    for m in run.methods:
        if m.state_dict() is None:
            continue
        if m.name not in saved:
            raise ValueError(f"checkpoint has no state of the method {m.name} (sample.credit={run.cfg.sample.credit}; "
                             "written by another method?): refusing to resume without it")
        m.load_state_dict(saved[m.name])
    rs = run.state
    rs.epoch = int(tr["epoch"])
    rs.global_step = int(tr["global_step"])
    rs.counters.update(tr.get("counters", {}))
    run.guard.load_state_dict(tr)
    rs.best_eval = tr.get("best_eval")
    scaler = getattr(run.accelerator, "scaler", None)
    if tr.get("scaler") is not None and scaler is not None:
        scaler.load_state_dict(tr["scaler"])
    restore_rng(st.get("rng"), run.accelerator.process_index, run.accelerator.num_processes)


def _load_replicated(run, st: dict) -> None:
    names = dict(run.named_params)
    missing = set(names) - set(st["trainable"])
    if missing:
        raise ValueError(f"checkpoint lacks trainable parameters {sorted(missing)[:5]}")
    with torch.no_grad():
        for n, p in names.items():
            p.copy_(st["trainable"][n].to(p.device, p.dtype))
    run.optimizer.load_state_dict(st["optimizer"])
    if "scheduler" in st:
        run.lr_scheduler.load_state_dict(st["scheduler"])
    if run.ema is not None and st.get("ema"):
        run.ema.load_state_dict(st["ema"])


def _load_sharded(run, st: dict, path: Path) -> None:
    """``state/`` (DCP) into this run's layout, whatever number of processes wrote it."""
    ema_meta = st.get("ema") or {}
    extra = {"ema": _ema_sharded(run)} if run.ema is not None and ema_meta else None
    got = load_sharded_state(path / STATE_DIR, run.model, run.optimizer, run.accelerator, st["optimizer"],
                             deepspeed=run.deepspeed, extra=extra)
    if st.get("scheduler"):
        run.lr_scheduler.load_state_dict(st["scheduler"])
    if extra and got:
        shadow = [(t.to_local() if hasattr(t, "to_local") else t) for t in got["ema"].values()]
        run.ema.load_state_dict({**ema_meta, "shadow": shadow})


def resume(run) -> Optional[Path]:
    """Collective. ``run.resume_from``: auto (latest valid checkpoint, if any) | none | a path."""
    path, err = None, None
    if run.is_main:
        try:
            path = run.ckpt.resolve(run.cfg.run.resume_from)
        except Exception as exc:  # noqa: BLE001 - re-raised on every process below
            err = f"{type(exc).__name__}: {exc}"
    path, err = broadcast_object((str(path) if path is not None else None, err))
    if err:
        raise ValueError(f"resume_from={run.cfg.run.resume_from!r}: {err}")
    if path is None:
        return None
    load_state_dict(run, run.ckpt.load(path), Path(path))
    run.guard.saved(run.state.epoch, path)  # an interrupt before the next epoch need not rewrite it
    return Path(path)


# ------------------------------------------------------------------ export
@names_write_errors("the final weights export", lambda run: run.out)  # disk full / read-only: name path and cause
def export_final(run) -> Optional[Path]:
    """Collective. The weights the optimizer trained: LoRA -> ``<output_dir>/lora_final``
    (``Pipeline.load_lora_weights``), full fine-tune -> ``<output_dir>/transformer_final`` (``save_pretrained``,
    gathered from all shards); with ``ema.enabled`` their EMA beside them (``lora_final_ema`` /
    ``transformer_final_ema``) once it has been updated at least once. ``export.json`` in each folder says which
    (``"weights": "trained" | "ema"``) and the log says it too.

    The trained weights, not the EMA, are the default export because the EMA moves only every
    ``ema.update_every`` optimizer steps: a run with fewer updates than that would export its initial weights
    (a LoRA with every B matrix zero) and an evaluation would find trained == base.

    Written atomically (temp folder + rename, ``mmgrpo.utils.export``) with an ``export.json`` naming the epoch
    and step it holds: a resumed run with no epochs left rewrites an export that is missing, damaged or older
    than its checkpoint (see :meth:`~flow_grpo.train.trainer.FlowGRPOTrainer.train`)."""
    st = run.state
    target = _write_export(run, _export_dir(run), "trained")
    ema_target = None
    if _exports_ema(run):
        with run.ema.swapped_in():
            ema_target = _write_export(run, _export_dir(run, ema=True), "ema")
    if run.is_main:
        log.info("final weights: %s = the trained weights (%d applied optimizer steps, epoch %d)%s", target,
                 st.counters["applied_steps"], st.epoch,
                 f"; {ema_target} = their EMA (decay {run.ema.decay}, {run.ema.num_updates} updates, one every "
                 f"{run.cfg.ema.update_every} optimizer steps)" if ema_target is not None else "")
        if run.ema is not None and not _exports_ema(run):
            log.warning("no EMA export: the EMA was never updated (ema.update_every=%d > %d optimizer steps); "
                        "it still equals the initial weights", run.cfg.ema.update_every, st.global_step)
    return target


def _exports_ema(run) -> bool:
    """An EMA export is written beside the trained weights (EMA on and updated at least once)."""
    return run.ema is not None and run.ema.num_updates > 0


def _write_export(run, dst: Path, weights: str) -> Optional[Path]:
    """Collective. The current trainable weights into ``dst`` (atomically, with ``export.json``)."""
    from mmgrpo.utils.export import publish_dir

    target = None
    meta = _export_meta(run, weights)
    if run.cfg.model.lora.enabled and not run.sharded:
        if run.is_main:
            target = publish_dir(dst, lambda d: run.adapter.save_lora(str(d)), meta)
    else:
        sd = run.accelerator.get_state_dict(run.model)  # collective under FSDP / ZeRO-3
        if run.is_main:
            from safetensors.torch import save_file

            sd = {k: v.detach().cpu().contiguous().clone() for k, v in sd.items()
                  if not run.cfg.model.lora.enabled or "lora_" in k}

            def write(d: Path) -> None:
                # a diffusers model folder (config.json + weights): ``<ModelClass>.from_pretrained(target)``; Wan2.2
                # A14B's two experts: one folder each (``ExpertPair.export_parts``)
                split = getattr(run.unwrapped, "export_parts", None)
                for sub, (module, part) in (split(sd) if split else {"": (run.unwrapped, sd)}).items():
                    (d / sub).mkdir(exist_ok=True)
                    save_file(part, str(d / sub / "diffusion_pytorch_model.safetensors"))
                    module.save_config(str(d / sub))

            target = publish_dir(dst, write, meta)
    barrier()
    return target


def _export_dir(run, ema: bool = False) -> Path:
    lora = run.cfg.model.lora.enabled
    name = "lora_final" if lora and not run.sharded else "lora_final_state" if lora else "transformer_final"
    return run.out / (name + ("_ema" if ema else ""))


def _export_meta(run, weights: str = "trained") -> dict:
    meta = {"epoch": run.state.epoch, "global_step": run.state.global_step, "weights": weights}
    if weights == "ema":
        meta.update(ema_decay=run.ema.decay, ema_updates=run.ema.num_updates,
                    ema_update_every=run.cfg.ema.update_every)
    return meta


def export_outdated(run) -> bool:
    """Collective. True (and logged) if a final export is missing, damaged or not of the current state."""
    from mmgrpo.utils.export import export_problem

    why = None
    if run.is_main:
        why = export_problem(_export_dir(run), _export_meta(run))
        if why is None and _exports_ema(run):
            why = export_problem(_export_dir(run, ema=True), _export_meta(run, "ema"))
    why = broadcast_object(why)
    if why and run.is_main:
        log.warning("final export to be (re)written: %s", why)
    return why is not None
