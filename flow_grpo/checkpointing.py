"""Checkpoints and the final export of the flow trainer (mixed into :class:`flow_grpo.trainer.FlowGRPOTrainer`), in the
one format of :mod:`mmgrpo.engine.checkpoint` (layout: docs/checkpoints.md).

Atomic ``checkpoints/epoch-XXXXXXXX`` folders (:class:`mmgrpo.utils.checkpoint.CheckpointManager`; older runs'
``step-XXXXXXXX`` folders resume too); halted runs write ``halted/step-XXXXXXXX`` (the optimizer step they stopped
at). Entries of the main process: ``trainer`` (epoch, step, counters, skip state, budget, data), ``config``,
``reference``, ``rng`` (every process's), ``scheduler``, ``optimizer``, ``ema`` and, when every process holds the
whole trainable state (single process, DDP), ``trainable`` and the method's state (``method``). Sharded runs (FSDP2)
write the weights, AdamW moments and EMA shadows to ``state/`` instead (every process its shards; resumable on any
number of processes). Sharded checkpoints of the earlier format (``shards/``) still resume on the same number."""
from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Optional

import torch

from mmgrpo.engine.checkpoint import (STATE_DIR, gather_rng, load_sharded_state, restore_rng, save_checkpoint,
                                      sharded_like, sharded_writer)
from mmgrpo.utils.logging import get_logger
from mmgrpo.utils.write_errors import names_write_errors

from .distributed import _all_gather_object, _barrier, _broadcast_object

log = get_logger("flow_grpo.trainer")


class CheckpointMixin:
    """State dict, save / resume, replica check and the final export; needs the trainer's attributes (cfg,
    accelerator, model, optimizer, lr_scheduler, ema, named_params, counters, skips, budget, ckpt, halt_ckpt, ...)."""

    def state_dict(self) -> dict:
        """Checkpoint entries of a replicated run (written by the main process): trainable weights, optimizer,
        LR schedule, EMA, counters and data position, reference settings, config. RNG states of every process are
        added by :meth:`save_checkpoint`."""
        from mmgrpo.utils.config import config_to_dict

        st = {
            "trainable": {n: p.detach().cpu().clone() for n, p in self.named_params},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.lr_scheduler.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else {},
            "trainer": self._trainer_state(),
            "config": config_to_dict(self.cfg),
            "reference": dict(self.reference_info),
        }
        rt = getattr(self, "method_runtime", None)
        if hasattr(rt, "state_dict"):  # a credit's own state (DiffusionNFT's old adapter, B2-DiffuRL's history)
            st["method"] = rt.state_dict()
        return st

    def _sharded_entries(self, optim_meta: dict) -> dict:
        """The main process's entries of a sharded run (tensors are in ``state/``)."""
        from mmgrpo.utils.config import config_to_dict

        ema = ({k: v for k, v in self.ema.state_dict().items() if k != "shadow"} if self.ema is not None else {})
        return {"optimizer": optim_meta, "scheduler": self.lr_scheduler.state_dict(), "ema": ema,
                "trainer": self._trainer_state(), "config": config_to_dict(self.cfg),
                "reference": dict(self.reference_info)}

    def _trainer_state(self) -> dict:
        scaler = getattr(self.accelerator, "scaler", None)  # fp16 mixed precision only
        return {"epoch": self.epoch, "global_step": self.global_step, "world": self.world,
                "counters": dict(self.counters), **self.skips.state_dict(), "best_eval": self.best_eval,
                "budget": self.budget.state_dict(), "scaler": scaler.state_dict() if scaler is not None else None,
                "data": {"epoch": self.epoch, "num_prompts": len(self.prompts),
                         "prompts_sha256": hashlib.sha256("\n".join(self.prompts).encode()).hexdigest(),
                         "group_size": self.cfg.data.group_size, "groups_per_epoch": self.cfg.data.groups_per_epoch}}

    def _check_replicas_in_sync(self) -> None:
        """Replicated backends: every process must hold the same trainable weights (DanceGRPO#110 guard). Compares
        per-tensor float64 sums and sums of squares computed on the device (cheap even for full fine-tunes);
        replicas that diverged in any entry would have to collide in both sums of every tensor to pass."""
        if self.sharded or self.world == 1:
            return
        with torch.no_grad():
            fp = torch.stack([torch.stack([p.detach().double().sum(), p.detach().double().pow(2).sum()])
                              for _, p in self.named_params]).cpu()
        prints = _all_gather_object(fp)
        bad = [r for r, f in enumerate(prints) if not torch.equal(f, prints[0])]
        if bad:
            raise RuntimeError(f"processes {bad} hold different trainable weights than process 0: gradients were not "
                               "synchronised")

    def _ema_sharded(self) -> dict:
        """The EMA shadows as tensors DCP can reshard (DTensors with their parameter's layout)."""
        if self.ema is None:
            return {}
        return {n: sharded_like(s, p) for (n, p), s in zip(self.named_params, self.ema.shadow)}

    def save_checkpoint(self, metric: Optional[float] = None, halted: bool = False) -> Optional[Path]:
        """Collective: every process must call it. Returns the checkpoint dir on the main process."""
        mgr = self.halt_ckpt if halted else self.ckpt
        step = self.global_step if halted else self.epoch
        rng = gather_rng()
        extra, sharded = {}, None
        if self.sharded:
            sharded, meta = sharded_writer(self.model, self.optimizer, self.accelerator, deepspeed=self.deepspeed,
                                           extra={"ema": self._ema_sharded()})

            def entries():
                return {**self._sharded_entries(meta), "rng": rng}
        else:
            self._check_replicas_in_sync()

            def entries():
                return {**self.state_dict(), "rng": rng}

            if self.cfg.model.lora.enabled and self.is_main:
                # lora/ = the trained weights, lora_ema/ = their EMA once updated (as the final export)
                def write_lora(p, ema=False):
                    os.makedirs(p, exist_ok=True)
                    with self.ema.swapped_in() if ema else contextlib.nullcontext():
                        self.adapter.save_lora(str(p))
                extra["lora"] = write_lora
                if self._exports_ema():
                    extra["lora_ema"] = lambda p: write_lora(p, ema=True)
        path = save_checkpoint(mgr, step, entries, is_main=self.is_main, sharded=sharded, metric=metric,
                               extra_files=extra)
        if not halted:
            self._last_save = (self.epoch, path)  # a stop right after this save does not write it again
        return path

    def load_state_dict(self, st: dict, path: Optional[Path] = None) -> None:
        ref = st.get("reference")
        if ref and ref.get("base_fingerprint") != self.reference_info["base_fingerprint"]:
            raise ValueError("checkpoint was trained on different base weights (fingerprint mismatch): refusing to "
                             "resume onto another model")
        tr = st["trainer"]
        data = tr.get("data", {})
        sha = hashlib.sha256("\n".join(self.prompts).encode()).hexdigest()
        if data and data.get("prompts_sha256") != sha:
            log.warning("resume: the prompt list differs from the checkpoint's; the data order will not reproduce")
        if path is not None and (Path(path) / "shards").is_dir():
            self._load_legacy_shards(tr, Path(path))
        elif path is not None and (Path(path) / STATE_DIR).is_dir():
            self._load_sharded(st, Path(path))
        else:
            if self.sharded:
                raise ValueError(f"resume: {path} was written by a replicated run (no {STATE_DIR}/ folder); a sharded "
                                 "run resumes from sharded checkpoints only")
            self._load_replicated(st)
        self.epoch = int(tr["epoch"])
        self.global_step = int(tr["global_step"])
        self.counters.update({k: v for k, v in tr.get("counters", {}).items() if k != "consecutive_skips"})
        self.skips.load_state_dict(tr)
        self.best_eval = tr.get("best_eval")
        self.budget.load_state_dict(tr.get("budget"))
        scaler = getattr(self.accelerator, "scaler", None)
        if tr.get("scaler") is not None and scaler is not None:
            scaler.load_state_dict(tr["scaler"])
        rng = st.get("rng")
        if rng is not None and "per_rank" not in rng:  # a single state (never written by this trainer; be lenient)
            rng = {"per_rank": [rng], "world": 1}
        restore_rng(rng, self.rank, self.world)

    def _load_replicated(self, st: dict) -> None:
        names = dict(self.named_params)
        missing = set(names) - set(st["trainable"])
        if missing:
            raise ValueError(f"checkpoint lacks trainable parameters {sorted(missing)[:5]}")
        with torch.no_grad():
            for n, p in names.items():
                p.copy_(st["trainable"][n].to(p.device, p.dtype))
        self.optimizer.load_state_dict(st["optimizer"])
        if "scheduler" in st:
            self.lr_scheduler.load_state_dict(st["scheduler"])
        if self.ema is not None and st.get("ema"):
            self.ema.load_state_dict(st["ema"])
        rt = getattr(self, "method_runtime", None)
        if hasattr(rt, "load_state_dict"):
            if not st.get("method"):
                raise ValueError(f"checkpoint has no state of sample.credit={self.cfg.sample.credit} (written by "
                                 "another method?): refusing to resume without it")
            rt.load_state_dict(st["method"])

    def _load_sharded(self, st: dict, path: Path) -> None:
        """``state/`` (DCP) into this run's layout, whatever number of processes wrote it."""
        ema_meta = st.get("ema") or {}
        extra = {"ema": self._ema_sharded()} if self.ema is not None and ema_meta else None
        got = load_sharded_state(path / STATE_DIR, self.model, self.optimizer, self.accelerator, st["optimizer"],
                                 deepspeed=self.deepspeed, extra=extra)
        if st.get("scheduler"):
            self.lr_scheduler.load_state_dict(st["scheduler"])
        if extra and got:
            shadow = [(t.to_local() if hasattr(t, "to_local") else t) for t in got["ema"].values()]
            self.ema.load_state_dict({**ema_meta, "shadow": shadow})

    def _load_legacy_shards(self, tr: dict, path: Path) -> None:
        """Sharded checkpoints of the earlier format: ``shards/accelerate`` (``accelerator.save_state``) and
        ``shards/ema_rank<r>.pt``; the same number of processes only."""
        from mmgrpo.utils.checkpoint import refuse_unsafe_pickles, safe_torch_load

        if int(tr.get("world", self.world)) != self.world:
            raise ValueError(f"sharded checkpoint (earlier format) written by {tr.get('world')} processes; resume "
                             f"with the same number (now {self.world})")
        refuse_unsafe_pickles(path / "shards")  # torch.distributed.checkpoint unpickles .metadata as is
        self.accelerator.load_state(str(path / "shards" / "accelerate"))
        if self.ema is not None:
            self.ema.load_state_dict(safe_torch_load(path / "shards" / f"ema_rank{self.rank}.pt"))

    def maybe_resume(self) -> Optional[Path]:
        """Collective. ``run.resume_from``: auto (latest valid checkpoint, if any) | none | a path."""
        path, err = None, None
        if self.is_main:
            try:
                path = self.ckpt.resolve(self.cfg.run.resume_from)
            except Exception as exc:  # noqa: BLE001 - re-raised on every process below
                err = f"{type(exc).__name__}: {exc}"
        path, err = _broadcast_object((str(path) if path is not None else None, err))
        if err:
            raise ValueError(f"resume_from={self.cfg.run.resume_from!r}: {err}")
        if path is None:
            return None
        self.load_state_dict(self.ckpt.load(path), Path(path))
        self._last_save = (self.epoch, path)  # an interrupt before the next epoch need not rewrite it
        return Path(path)

    # ------------------------------------------------------------------ export
    @names_write_errors("the final weights export", lambda self: self.out)  # disk full / read-only: name path and cause
    def export_final(self) -> Optional[Path]:
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
        than its checkpoint (see :meth:`train`)."""
        target = self._write_export(self._export_dir(), "trained")
        if self._exports_ema():
            with self.ema.swapped_in():
                ema_target = self._write_export(self._export_dir(ema=True), "ema")
        if self.is_main:
            log.info("final weights: %s = the trained weights (%d applied optimizer steps, epoch %d)%s", target,
                     self.counters["applied_steps"], self.epoch,
                     f"; {ema_target} = their EMA (decay {self.ema.decay}, {self.ema.num_updates} updates, one every "
                     f"{self.cfg.ema.update_every} optimizer steps)" if self._exports_ema() else "")
            if self.ema is not None and not self._exports_ema():
                log.warning("no EMA export: the EMA was never updated (ema.update_every=%d > %d optimizer steps); "
                            "it still equals the initial weights", self.cfg.ema.update_every, self.global_step)
        return target

    def _exports_ema(self) -> bool:
        """An EMA export is written beside the trained weights (EMA on and updated at least once)."""
        return self.ema is not None and self.ema.num_updates > 0

    def _write_export(self, dst: Path, weights: str) -> Optional[Path]:
        """Collective. The current trainable weights into ``dst`` (atomically, with ``export.json``)."""
        from mmgrpo.utils.export import publish_dir

        target = None
        meta = self._export_meta(weights)
        if self.cfg.model.lora.enabled and not self.sharded:
            if self.is_main:
                target = publish_dir(dst, lambda d: self.adapter.save_lora(str(d)), meta)
        else:
            sd = self.accelerator.get_state_dict(self.model)  # collective under FSDP / ZeRO-3
            if self.is_main:
                from safetensors.torch import save_file

                sd = {k: v.detach().cpu().contiguous().clone() for k, v in sd.items()
                      if not self.cfg.model.lora.enabled or "lora_" in k}

                def write(d: Path) -> None:
                    # a diffusers model folder (config.json + weights): ``<ModelClass>.from_pretrained(target)``
                    save_file(sd, str(d / "diffusion_pytorch_model.safetensors"))
                    self.unwrapped.save_config(str(d))

                target = publish_dir(dst, write, meta)
        _barrier()
        return target

    def _export_dir(self, ema: bool = False) -> Path:
        lora = self.cfg.model.lora.enabled
        name = "lora_final" if lora and not self.sharded else "lora_final_state" if lora else "transformer_final"
        return self.out / (name + ("_ema" if ema else ""))

    def _export_meta(self, weights: str = "trained") -> dict:
        meta = {"epoch": self.epoch, "global_step": self.global_step, "weights": weights}
        if weights == "ema":
            meta.update(ema_decay=self.ema.decay, ema_updates=self.ema.num_updates,
                        ema_update_every=self.cfg.ema.update_every)
        return meta

    def _export_outdated(self) -> bool:
        """Collective. True (and logged) if a final export is missing, damaged or not of the current state."""
        from mmgrpo.utils.export import export_problem

        why = None
        if self.is_main:
            why = export_problem(self._export_dir(), self._export_meta())
            if why is None and self._exports_ema():
                why = export_problem(self._export_dir(ema=True), self._export_meta("ema"))
        why = _broadcast_object(why)
        if why and self.is_main:
            log.warning("final export to be (re)written: %s", why)
        return why is not None
