"""Checkpoint state of the VLM trainer: what is written (``state``), the atomic save, and the exact resume."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from mmgrpo.utils.checkpoint import capture_rng_state, refuse_unsafe_pickles, restore_rng_state
from mmgrpo.utils.config import config_to_dict
from mmgrpo.utils.logging import get_logger

log = get_logger("mmgrpo.train")

__all__ = ["CheckpointMixin"]


class CheckpointMixin:
    """``GRPOTrainer.state`` / ``save`` / ``resume`` (everything through ``mmgrpo.utils.checkpoint``)."""

    def state(self, full_state_dict: dict | None = None) -> dict:
        if self.grad_sync == "accelerate":  # optimizer / scheduler / sharded weights live in "accelerate/"
            names = {n for n, p in self.unwrapped.named_parameters() if p.requires_grad}
            pol = ({k: v.detach().cpu() for k, v in full_state_dict.items() if k in names}
                   if full_state_dict is not None else self.policy.trainable_state_dict())
            opt = sch = {}
        else:
            pol, opt, sch = (self.policy.trainable_state_dict(), self.optimizer.state_dict(),
                             self.scheduler.state_dict())
        return {
            "policy": pol,
            "optimizer": opt,
            "scheduler": sch,
            "trainer": {
                "step": self.step, "stream": self.stream.state_dict(), "counters": dict(self.counters),
                "consecutive_skips": self.consecutive_skips,
                "rng": capture_rng_state(), "config": config_to_dict(self.cfg), "world_size": self.world,
                "reference": {"kind": "lora_disabled" if self.policy.lora else
                              ("frozen_initial_copy" if self.policy.ref_model is not None else "none"),
                              "model_path": self.cfg.model.path, "kl_coef": self.cfg.algo.kl_coef},
                "selection": getattr(self, "selected_indices", None),
                "budget": self.budget.state_dict(),
                "methods": {m.name: sd for m in self.methods if (sd := m.state_dict()) is not None},
            },
        }

    def save(self) -> Path | None:
        path = None
        staging = None
        full_sd = None
        if self.grad_sync == "accelerate":
            # model / optimizer / scheduler / RNG of every process (sharded under FSDP / DeepSpeed) through
            # accelerate, written by all processes into a staging dir that becomes part of the checkpoint
            staging = self.ckpt.root / f".staging-step-{self.step:08d}"
            if self.accelerator.is_main_process:
                shutil.rmtree(staging, ignore_errors=True)
                self.ckpt.root.mkdir(parents=True, exist_ok=True)
            self.accelerator.wait_for_everyone()
            self.accelerator.save_state(str(staging))
            if self.sharded:  # a portable copy of the trained weights (collective: gathers the shards)
                full_sd = self.accelerator.get_state_dict(self.model)
            self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            extra = {}
            if staging is not None:
                extra["accelerate"] = lambda p: os.rename(staging, p)
            if self.policy.lora and not self.sharded:
                extra["adapter"] = lambda p: self.unwrapped.save_pretrained(str(p))
            metric = None
            if self.cfg.run.best_metric:
                metric = self._last_metrics.get(self.cfg.run.best_metric)
                if metric is None:
                    log.warning("run.best_metric=%r is not among this step's metrics (e.g. %s); checkpoint %d "
                                "has no metric", self.cfg.run.best_metric, sorted(self._last_metrics)[:5], self.step)
            path = self.ckpt.save(self.step, self.state(full_sd), metric=metric, extra_files=extra)
            log.info("saved checkpoint %s", path)
        self.accelerator.wait_for_everyone()
        self._last_save = (self.step, path)  # a stop right after this save does not write it again
        return path

    def resume(self) -> bool:
        path = self.ckpt.resolve(self.cfg.run.resume_from)
        if path is None:
            return False
        st = self.ckpt.load(path)
        tr = st["trainer"]
        ref = tr["reference"]
        if ref["kind"] == "frozen_initial_copy" and ref["model_path"] != self.cfg.model.path:
            raise ValueError(f"resume: the reference was {ref['model_path']!r}, now model.path={self.cfg.model.path!r}")
        if self.grad_sync == "accelerate":
            if not (path / "accelerate").is_dir():
                raise ValueError(f"resume: {path} was written with run.grad_sync=manual; it has no accelerate state "
                                 "for the prepared model (resume with run.grad_sync=manual, or start anew)")
            refuse_unsafe_pickles(path / "accelerate")  # torch.distributed.checkpoint unpickles .metadata as is
            self.accelerator.load_state(str(path / "accelerate"))
        else:
            if not st["optimizer"]:
                raise ValueError(f"resume: {path} was written with run.grad_sync=accelerate; resume with it")
            self.policy.load_trainable_state_dict(st["policy"])
            self.optimizer.load_state_dict(st["optimizer"])
            self.scheduler.load_state_dict(st["scheduler"])
        if tr.get("selection") is not None:
            self.use_samples(tr["selection"])
        self._make_stream()
        self.stream.load_state_dict(tr["stream"])
        self.step = int(tr["step"])
        self.budget.load_state_dict(tr.get("budget"))
        self.counters.update(tr["counters"])
        self.consecutive_skips = int(tr.get("consecutive_skips", 0))
        for m in self.methods:
            if m.name in tr.get("methods", {}):
                m.load_state_dict(tr["methods"][m.name])
        if tr.get("world_size", 1) == self.world:
            restore_rng_state(tr["rng"])
        log.info("resumed from %s at step %d", path, self.step)
        self._last_save = (self.step, str(path))  # an interrupt before the next step need not rewrite it
        return True
