"""Checkpoints and the final export of the flow trainer (mixed into :class:`flow_grpo.trainer.FlowGRPOTrainer`).

Replicated backends (single process, DDP): the main process writes trainable weights, optimizer, LR schedule, EMA,
counters, data position, reference fingerprint, config and every process's RNG state into an atomic
``checkpoints/epoch-XXXXXXXX`` folder (:class:`mmgrpo.utils.checkpoint.CheckpointManager`; older runs'
``step-XXXXXXXX`` folders resume too). Sharded backends (FSDP, DeepSpeed): ``accelerator.save_state`` shards inside
the same folder. Halted runs write ``halted/step-XXXXXXXX`` (the optimizer step they stopped at)."""
from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from typing import Optional

import torch

from mmgrpo.utils.logging import get_logger
from mmgrpo.utils.write_errors import names_write_errors

from .distributed import _all_gather_object, _barrier, _broadcast_object

log = get_logger("flow_grpo.trainer")


class CheckpointMixin:
    """State dict, save / resume, replica check and the final export; needs the trainer's attributes (cfg,
    accelerator, model, optimizer, lr_scheduler, ema, named_params, counters, budget, ckpt, halt_ckpt, ...)."""

    def state_dict(self) -> dict:
        """Checkpoint entries (replicated backends; written by the main process): trainable weights, optimizer,
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

    def _trainer_state(self) -> dict:
        return {"epoch": self.epoch, "global_step": self.global_step, "world": self.world,
                "counters": dict(self.counters), "best_eval": self.best_eval, "budget": self.budget.state_dict(),
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

    def save_checkpoint(self, metric: Optional[float] = None, halted: bool = False) -> Optional[Path]:
        """Collective: every process must call it. Returns the checkpoint dir on the main process."""
        from mmgrpo.utils.checkpoint import capture_rng_state

        mgr = self.halt_ckpt if halted else self.ckpt
        step = self.global_step if halted else self.epoch
        rng_all = _all_gather_object(capture_rng_state())
        if self.sharded:
            return self._save_sharded(mgr, step, metric, rng_all)
        self._check_replicas_in_sync()
        path = None
        if self.is_main:
            state = self.state_dict()
            state["rng"] = {"per_rank": rng_all, "world": self.world}
            extra = {}
            if self.cfg.model.lora.enabled:
                def write_lora(p):
                    os.makedirs(p, exist_ok=True)
                    with self.ema.swapped_in() if self.ema is not None else contextlib.nullcontext():
                        self.adapter.save_lora(str(p))
                extra["lora"] = write_lora
            path = mgr.save(step, state, metric=metric, extra_files=extra)
        _barrier()
        if not halted:
            self._last_save = (self.epoch, path)  # a stop right after this save does not write it again
        return path

    def _save_sharded(self, mgr, step: int, metric, rng_all) -> Optional[Path]:
        """FSDP / DeepSpeed: every process writes its shards (``accelerator.save_state``: model, optimizer, schedule
        and RNG in the backend's sharded format, plus ``ema_rank{r}.pt``) into a staging dir that the main process
        then moves into the atomic checkpoint. Resume needs the same number of processes."""
        stage = None
        if self.is_main:
            mgr.root.mkdir(parents=True, exist_ok=True)
            stage = mgr.root / f".tmp-shards-{step:08d}-{os.getpid()}"
            stage.mkdir(exist_ok=True)
        stage = Path(_broadcast_object(str(stage) if stage is not None else None))
        self.accelerator.save_state(str(stage / "accelerate"))
        torch.save(self.ema.state_dict() if self.ema is not None else {}, stage / f"ema_rank{self.rank}.pt")
        _barrier()
        path = None
        if self.is_main:
            from mmgrpo.utils.config import config_to_dict

            state = {"trainer": self._trainer_state(), "config": config_to_dict(self.cfg),
                     "reference": dict(self.reference_info), "rng": {"per_rank": rng_all, "world": self.world}}
            path = mgr.save(step, state, metric=metric, extra_files={"shards": lambda p: os.rename(stage, p)})
        _barrier()
        if mgr is self.ckpt:
            self._last_save = (self.epoch, path)  # a stop right after this save does not write it again
        return path

    def load_state_dict(self, st: dict, path: Optional[Path] = None) -> None:
        from mmgrpo.utils.checkpoint import restore_rng_state

        ref = st.get("reference")
        if ref and ref.get("base_fingerprint") != self.reference_info["base_fingerprint"]:
            raise ValueError("checkpoint was trained on different base weights (fingerprint mismatch): refusing to "
                             "resume onto another model")
        tr = st["trainer"]
        data = tr.get("data", {})
        sha = hashlib.sha256("\n".join(self.prompts).encode()).hexdigest()
        if data and data.get("prompts_sha256") != sha:
            log.warning("resume: the prompt list differs from the checkpoint's; the data order will not reproduce")
        if self.sharded:
            if path is None:
                raise ValueError("sharded resume needs the checkpoint path")
            if int(tr.get("world", self.world)) != self.world:
                raise ValueError(f"sharded checkpoint written by {tr.get('world')} processes; resume with the same "
                                 f"number (now {self.world})")
            from mmgrpo.utils.checkpoint import refuse_unsafe_pickles, safe_torch_load

            refuse_unsafe_pickles(Path(path) / "shards")  # torch.distributed.checkpoint unpickles .metadata as is
            self.accelerator.load_state(str(Path(path) / "shards" / "accelerate"))
            if self.ema is not None:
                self.ema.load_state_dict(safe_torch_load(Path(path) / "shards" / f"ema_rank{self.rank}.pt"))
        else:
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
        self.epoch = int(tr["epoch"])
        self.global_step = int(tr["global_step"])
        self.counters.update(tr.get("counters", {}))
        self.best_eval = tr.get("best_eval")
        self.budget.load_state_dict(tr.get("budget"))
        rng = st.get("rng")
        if rng is not None:
            per = rng.get("per_rank") if isinstance(rng, dict) and "per_rank" in rng else [rng]
            if self.rank < len(per):
                restore_rng_state(per[self.rank])
            else:
                log.warning("resume: no RNG state saved for process %d (checkpoint had %d)", self.rank, len(per))

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
        """Collective. The trained weights (EMA if on) for inference: LoRA -> ``<output_dir>/lora_final``
        (``Pipeline.load_lora_weights``), full fine-tune -> ``<output_dir>/transformer_final`` (``save_pretrained``,
        gathered from all shards).

        Written atomically (temp folder + rename, ``mmgrpo.utils.export``) with an ``export.json`` naming the epoch
        and step it holds: a resumed run with no epochs left rewrites an export that is missing, damaged or older
        than its checkpoint (see :meth:`train`)."""
        from mmgrpo.utils.export import publish_dir

        target = None
        with self.ema.swapped_in() if self.ema is not None else contextlib.nullcontext():
            if self.cfg.model.lora.enabled and not self.sharded:
                if self.is_main:
                    target = publish_dir(self._export_dir(), lambda d: self.adapter.save_lora(str(d)),
                                         self._export_meta())
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

                    target = publish_dir(self._export_dir(), write, self._export_meta())
        _barrier()
        return target

    def _export_dir(self) -> Path:
        lora = self.cfg.model.lora.enabled
        return self.out / ("lora_final" if lora and not self.sharded else "lora_final_state" if lora
                           else "transformer_final")

    def _export_meta(self) -> dict:
        return {"epoch": self.epoch, "global_step": self.global_step}

    def _export_outdated(self) -> bool:
        """Collective. True (and logged) if the final export is missing, damaged or not of the current state."""
        from mmgrpo.utils.export import export_problem

        why = export_problem(self._export_dir(), self._export_meta()) if self.is_main else None
        why = _broadcast_object(why)
        if why and self.is_main:
            log.warning("final export to be (re)written: %s", why)
        return why is not None

