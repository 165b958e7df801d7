"""Checkpoints and the final export of a flow model, in the one format of :mod:`mmgrpo.engine.checkpoint` (layout:
docs/checkpoints.md). Functions of the trained model (:class:`flow_grpo.build.TrainedModel`) and of explicit run
entries: the recipe (:class:`flow_grpo.train.trainer.FlowGRPOTrainer`) hands in what its run state is.

Atomic ``checkpoints/epoch-XXXXXXXX`` folders (:class:`mmgrpo.utils.checkpoint.CheckpointManager`); halted runs
write ``halted/step-XXXXXXXX`` (the optimizer step they stopped at). Entries of the main process: ``trainer`` (epoch,
step, counters, skip state, budget, data), ``config``, ``reference`` and the methods' state (``methods``), all from
the recipe's ``run_entries``; ``rng`` (every process's), ``scheduler``, ``optimizer``, ``ema`` and, when every process
holds the whole trainable state (single process, DDP), ``trainable``. Sharded runs (FSDP2) write the weights, AdamW
moments and EMA shadows to ``state/`` instead (every process its shards; resumable on any number of processes)."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import torch

from mmgrpo.engine.checkpoint import (STATE_DIR, gather_rng, load_sharded_state, save_checkpoint, sharded_like,
                                      sharded_writer)
from mmgrpo.engine.dist import all_gather_object, barrier, broadcast_object
from mmgrpo.utils.logging import get_logger
from mmgrpo.utils.write_errors import names_write_errors

if TYPE_CHECKING:
    from .build import TrainedModel

log = get_logger("flow_grpo.trainer")

__all__ = ["state_dict", "save", "find_checkpoint", "load", "check_replicas_in_sync", "export_final",
           "export_outdated"]


def state_dict(tm: TrainedModel) -> dict:
    """The model's checkpoint entries of a replicated run (written by the main process): trainable weights,
    optimizer, LR schedule, EMA. :func:`save` adds the run's entries and every process's RNG state."""
    return {
        "trainable": {n: p.detach().cpu().clone() for n, p in tm.named_params},
        "optimizer": tm.optimizer.state_dict(),
        "scheduler": tm.lr_scheduler.state_dict(),
        "ema": tm.ema.state_dict() if tm.ema is not None else {},
    }


def check_replicas_in_sync(tm: TrainedModel) -> None:
    """Replicated backends: every process must hold the same trainable weights (DanceGRPO#110 guard). Compares
    per-tensor float64 sums and sums of squares computed on the device (cheap even for full fine-tunes);
    replicas that diverged in any entry would have to collide in both sums of every tensor to pass."""
    if tm.sharded or tm.accelerator.num_processes == 1:
        return
    with torch.no_grad():
        fp = torch.stack([torch.stack([p.detach().double().sum(), p.detach().double().pow(2).sum()])
                          for _, p in tm.named_params]).cpu()
    prints = all_gather_object(fp)
    bad = [r for r, f in enumerate(prints) if not torch.equal(f, prints[0])]
    if bad:
        raise RuntimeError(f"processes {bad} hold different trainable weights than process 0: gradients were not "
                           "synchronised")


def ema_sharded(tm: TrainedModel) -> dict:
    """The EMA shadows as tensors DCP can reshard (DTensors with their parameter's layout)."""
    if tm.ema is None:
        return {}
    return {n: sharded_like(s, p) for (n, p), s in zip(tm.named_params, tm.ema.shadow)}


def save(mgr, step: int, tm: TrainedModel, run_entries: Callable[[], dict],
         metric: Optional[float] = None) -> Optional[Path]:
    """Collective: every process must call it. Checkpoint ``step`` of ``mgr`` (a
    :class:`~mmgrpo.utils.checkpoint.CheckpointManager`): the model's entries, ``run_entries()`` (called on the main
    process) and every process's RNG state; LoRA runs also write ``lora/`` (and ``lora_ema/`` once the EMA was
    updated), as the final export. Returns the checkpoint folder on the main process."""
    is_main = tm.accelerator.is_main_process
    rng = gather_rng()
    extra, sharded = {}, None
    if tm.sharded:
        sharded, meta = sharded_writer(tm.model, tm.optimizer, tm.accelerator, deepspeed=tm.deepspeed,
                                       extra={"ema": ema_sharded(tm)})

        def entries():  # the tensors are in state/
            ema = {k: v for k, v in tm.ema.state_dict().items() if k != "shadow"} if tm.ema is not None else {}
            return {"optimizer": meta, "scheduler": tm.lr_scheduler.state_dict(), "ema": ema, **run_entries(),
                    "rng": rng}
    else:
        check_replicas_in_sync(tm)

        def entries():
            return {**state_dict(tm), **run_entries(), "rng": rng}

        if tm.lora and is_main:
            # lora/ = the trained weights, lora_ema/ = their EMA once updated (as the final export)
            def write_lora(p, ema=False):
                os.makedirs(p, exist_ok=True)
                with tm.ema.swapped_in() if ema else contextlib.nullcontext():
                    tm.adapter.save_lora(str(p))
            extra["lora"] = write_lora
            if _exports_ema(tm):
                extra["lora_ema"] = lambda p: write_lora(p, ema=True)
    return save_checkpoint(mgr, step, entries, is_main=is_main, sharded=sharded, metric=metric, extra_files=extra)


def find_checkpoint(mgr, resume_from: str, is_main: bool) -> Optional[Path]:
    """Collective. The checkpoint ``run.resume_from`` names: auto (the latest valid one of ``mgr``, if any) | none |
    a path; resolved on the main process, the same on every process."""
    path, err = None, None
    if is_main:
        try:
            path = mgr.resolve(resume_from)
        except Exception as exc:  # noqa: BLE001 - re-raised on every process below
            err = f"{type(exc).__name__}: {exc}"
    path, err = broadcast_object((str(path) if path is not None else None, err))
    if err:
        raise ValueError(f"resume_from={resume_from!r}: {err}")
    return Path(path) if path is not None else None


def load(tm: TrainedModel, st: dict, path: Optional[Path] = None) -> None:
    """The model's entries of a loaded checkpoint ``st`` (folder ``path``) into ``tm``: trainable weights,
    optimizer, LR schedule, EMA (replicated entries, or the sharded ``state/`` folder resharded to this run)."""
    if path is not None and (Path(path) / STATE_DIR).is_dir():
        _load_sharded(tm, st, Path(path))
        return
    if tm.sharded:
        raise ValueError(f"resume: {path} was written by a replicated run (no {STATE_DIR}/ folder); a sharded "
                         "run resumes from sharded checkpoints only")
    names = dict(tm.named_params)
    missing = set(names) - set(st["trainable"])
    if missing:
        raise ValueError(f"checkpoint lacks trainable parameters {sorted(missing)[:5]}")
    with torch.no_grad():
        for n, p in names.items():
            p.copy_(st["trainable"][n].to(p.device, p.dtype))
    tm.optimizer.load_state_dict(st["optimizer"])
    if "scheduler" in st:
        tm.lr_scheduler.load_state_dict(st["scheduler"])
    if tm.ema is not None and st.get("ema"):
        tm.ema.load_state_dict(st["ema"])


def _load_sharded(tm: TrainedModel, st: dict, path: Path) -> None:
    """``state/`` (DCP) into this run's layout, whatever number of processes wrote it."""
    ema_meta = st.get("ema") or {}
    extra = {"ema": ema_sharded(tm)} if tm.ema is not None and ema_meta else None
    got = load_sharded_state(path / STATE_DIR, tm.model, tm.optimizer, tm.accelerator, st["optimizer"],
                             deepspeed=tm.deepspeed, extra=extra)
    if st.get("scheduler"):
        tm.lr_scheduler.load_state_dict(st["scheduler"])
    if extra and got:
        shadow = [(t.to_local() if hasattr(t, "to_local") else t) for t in got["ema"].values()]
        tm.ema.load_state_dict({**ema_meta, "shadow": shadow})


# ------------------------------------------------------------------ export
@names_write_errors("the final weights export", lambda tm, out, *a, **k: out)  # disk full / read-only: name it
def export_final(tm: TrainedModel, out: Path, epoch: int, global_step: int, applied_steps: int,
                 ema_update_every: int) -> Optional[Path]:
    """Collective. The weights the optimizer trained: LoRA -> ``<out>/lora_final`` (``Pipeline.load_lora_weights``),
    full fine-tune -> ``<out>/transformer_final`` (``save_pretrained``, gathered from all shards); with an EMA
    their EMA beside them (``lora_final_ema`` / ``transformer_final_ema``) once it has been updated at least once.
    ``export.json`` in each folder says which (``"weights": "trained" | "ema"``) and the log says it too.
    ``epoch`` / ``global_step``: the run position the export holds; ``applied_steps`` and ``ema_update_every``
    (``ema.update_every``) are only logged / recorded.

    The trained weights, not the EMA, are the default export because the EMA moves only every
    ``ema.update_every`` optimizer steps: a run with fewer updates than that would export its initial weights
    (a LoRA with every B matrix zero) and an evaluation would find trained == base.

    Written atomically (temp folder + rename, ``mmgrpo.utils.export``) with an ``export.json`` naming the epoch
    and step it holds: a resumed run with no epochs left rewrites an export that is missing, damaged or older
    than its checkpoint (:func:`export_outdated`)."""
    target = _write_export(tm, _export_dir(tm, out), _export_meta(tm, epoch, global_step, ema_update_every))
    ema_target = None
    if _exports_ema(tm):
        with tm.ema.swapped_in():
            ema_target = _write_export(tm, _export_dir(tm, out, ema=True),
                                       _export_meta(tm, epoch, global_step, ema_update_every, "ema"))
    if tm.accelerator.is_main_process:
        log.info("final weights: %s = the trained weights (%d applied optimizer steps, epoch %d)%s", target,
                 applied_steps, epoch,
                 f"; {ema_target} = their EMA (decay {tm.ema.decay}, {tm.ema.num_updates} updates, one every "
                 f"{ema_update_every} optimizer steps)" if ema_target is not None else "")
        if tm.ema is not None and not _exports_ema(tm):
            log.warning("no EMA export: the EMA was never updated (ema.update_every=%d > %d optimizer steps); "
                        "it still equals the initial weights", ema_update_every, global_step)
    return target


def _exports_ema(tm: TrainedModel) -> bool:
    """An EMA export is written beside the trained weights (EMA on and updated at least once)."""
    return tm.ema is not None and tm.ema.num_updates > 0


def _write_export(tm: TrainedModel, dst: Path, meta: dict) -> Optional[Path]:
    """Collective. The current trainable weights into ``dst`` (atomically, with ``export.json`` = ``meta``)."""
    from mmgrpo.utils.export import publish_dir

    target = None
    is_main = tm.accelerator.is_main_process
    if tm.lora and not tm.sharded:
        if is_main:
            target = publish_dir(dst, lambda d: tm.adapter.save_lora(str(d)), meta)
    else:
        sd = tm.accelerator.get_state_dict(tm.model)  # collective under FSDP / ZeRO-3
        if is_main:
            from safetensors.torch import save_file

            sd = {k: v.detach().cpu().contiguous().clone() for k, v in sd.items() if not tm.lora or "lora_" in k}

            def write(d: Path) -> None:
                # a diffusers model folder (config.json + weights): ``<ModelClass>.from_pretrained(target)``; Wan2.2
                # A14B's two experts: one folder each (``ExpertPair.export_parts``)
                split = getattr(tm.unwrapped, "export_parts", None)
                for sub, (module, part) in (split(sd) if split else {"": (tm.unwrapped, sd)}).items():
                    (d / sub).mkdir(exist_ok=True)
                    save_file(part, str(d / sub / "diffusion_pytorch_model.safetensors"))
                    module.save_config(str(d / sub))

            target = publish_dir(dst, write, meta)
    barrier()
    return target


def _export_dir(tm: TrainedModel, out: Path, ema: bool = False) -> Path:
    name = "lora_final" if tm.lora and not tm.sharded else "lora_final_state" if tm.lora else "transformer_final"
    return Path(out) / (name + ("_ema" if ema else ""))


def _export_meta(tm: TrainedModel, epoch: int, global_step: int, ema_update_every: int,
                 weights: str = "trained") -> dict:
    meta = {"epoch": epoch, "global_step": global_step, "weights": weights}
    if weights == "ema":
        meta.update(ema_decay=tm.ema.decay, ema_updates=tm.ema.num_updates, ema_update_every=ema_update_every)
    return meta


def export_outdated(tm: TrainedModel, out: Path, epoch: int, global_step: int, ema_update_every: int) -> bool:
    """Collective. True (and logged) if a final export in ``out`` is missing, damaged or not of the run position
    (``epoch``, ``global_step``)."""
    from mmgrpo.utils.export import export_problem

    why = None
    if tm.accelerator.is_main_process:
        why = export_problem(_export_dir(tm, out), _export_meta(tm, epoch, global_step, ema_update_every))
        if why is None and _exports_ema(tm):
            why = export_problem(_export_dir(tm, out, ema=True),
                                 _export_meta(tm, epoch, global_step, ema_update_every, "ema"))
    why = broadcast_object(why)
    if why and tm.accelerator.is_main_process:
        log.warning("final export to be (re)written: %s", why)
    return why is not None
