"""Checkpoint state of the VLM trainer: what is written (``state``), the save and the exact resume, in the one format
of :mod:`mmgrpo.engine.checkpoint` (layout: docs/checkpoints.md).

Entries: ``policy.pt`` (the trained tensors, gathered from the shards under FSDP: the portable copy that
``scripts/experiments/export_vlm.py`` and evaluation read), ``optimizer.pt`` (``optimizer.state_dict()``; under
sharding only the param groups, the moments are in ``state/``), ``scheduler.pt``, ``trainer.pt`` (step, data
position, counters, skip state, budget, selection, methods, config, reference), ``rng.pt`` (every process's RNG)."""
from __future__ import annotations

from pathlib import Path

from mmgrpo.engine.checkpoint import (STATE_DIR, gather_rng, load_sharded_state, restore_rng, save_checkpoint,
                                      sharded_writer)
from mmgrpo.utils.checkpoint import capture_rng_state
from mmgrpo.utils.config import config_to_dict
from mmgrpo.utils.logging import get_logger

log = get_logger("mmgrpo.train")

__all__ = ["CheckpointMixin"]


class CheckpointMixin:
    """``GRPOTrainer.state`` / ``save`` / ``resume`` (through :mod:`mmgrpo.engine.checkpoint`)."""

    def state(self, full_state_dict: dict | None = None, rng: dict | None = None,
              optim_meta: dict | None = None) -> dict:
        """The main process's entries. ``full_state_dict``: the gathered weights of a sharded model; ``optim_meta``:
        the sharded optimizer's param groups (its moments are written to ``state/``); ``rng``: every process's
        RNG state (:func:`~mmgrpo.engine.checkpoint.gather_rng`; default: this process's)."""
        if full_state_dict is not None:
            names = {n for n, p in self.unwrapped.named_parameters() if p.requires_grad}
            pol = {k: v.detach().cpu() for k, v in full_state_dict.items() if k in names}
        else:
            pol = self.policy.trainable_state_dict()
        return {
            "policy": pol,
            "optimizer": optim_meta if optim_meta is not None else self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "trainer": {
                "step": self.step, "stream": self.stream.state_dict(), "counters": dict(self.counters),
                **self.skips.state_dict(),
                "config": config_to_dict(self.cfg), "world_size": self.world,
                "reference": {"kind": "lora_disabled" if self.policy.lora else
                              ("frozen_initial_copy" if self.policy.ref_model is not None else "none"),
                              "model_path": self.cfg.model.path, "kl_coef": self.cfg.algo.kl_coef},
                "selection": getattr(self, "selected_indices", None),
                "budget": self.budget.state_dict(),
                "methods": {m.name: sd for m in self.methods if (sd := m.state_dict()) is not None},
                "scaler": self._scaler_state(),
            },
            "rng": rng if rng is not None else {"per_rank": [capture_rng_state()], "world": 1},
        }

    def _scaler_state(self):
        scaler = getattr(self.accelerator, "scaler", None)  # fp16 mixed precision only
        return scaler.state_dict() if scaler is not None else None

    def save(self) -> Path | None:
        """Collective: every process calls it. Returns the checkpoint folder on the main process."""
        rng = gather_rng()
        full_sd = sharded = None
        optim_meta = None
        if self.sharded:
            sharded, optim_meta = sharded_writer(self.model, self.optimizer, self.accelerator,
                                                 deepspeed=self.dist_kind == "DEEPSPEED")
            # the portable copy of the trained weights (collective: gathers the shards)
            full_sd = self.accelerator.get_state_dict(self.model)
        extra = {}
        if self.accelerator.is_main_process and self.policy.lora and not self.sharded:
            extra["adapter"] = lambda p: self.unwrapped.save_pretrained(str(p))
        path = save_checkpoint(self.ckpt, self.step, lambda: self.state(full_sd, rng, optim_meta),
                               is_main=self.accelerator.is_main_process, sharded=sharded,
                               metric=self._best_metric() if self.accelerator.is_main_process else None,
                               extra_files=extra)
        if path is not None:
            log.info("saved checkpoint %s", path)
        self._last_save = (self.step, path)  # a stop right after this save does not write it again
        return path

    def _best_metric(self) -> float | None:
        if not self.cfg.run.best_metric:
            return None
        metric = self._last_metrics.get(self.cfg.run.best_metric)
        if metric is None:
            log.warning("run.best_metric=%r is not among this step's metrics (e.g. %s); checkpoint %d has no metric",
                        self.cfg.run.best_metric, sorted(self._last_metrics)[:5], self.step)
        return metric

    def resume(self) -> bool:
        path = self.ckpt.resolve(self.cfg.run.resume_from)
        if path is None:
            return False
        st = self.ckpt.load(path)
        tr = st["trainer"]
        ref = tr["reference"]
        if ref["kind"] == "frozen_initial_copy" and ref["model_path"] != self.cfg.model.path:
            raise ValueError(f"resume: the reference was {ref['model_path']!r}, now model.path={self.cfg.model.path!r}")
        self._load_weights_and_optimizer(path, st)
        if tr.get("selection") is not None:
            self.use_samples(tr["selection"])
        self._make_stream()
        self.stream.load_state_dict(tr["stream"])
        self.step = int(tr["step"])
        self.budget.load_state_dict(tr.get("budget"))
        self.counters.update(tr["counters"])
        self.skips.load_state_dict(tr)
        if tr.get("scaler") is not None and getattr(self.accelerator, "scaler", None) is not None:
            self.accelerator.scaler.load_state_dict(tr["scaler"])
        for m in self.methods:
            if m.name in tr.get("methods", {}):
                m.load_state_dict(tr["methods"][m.name])
        restore_rng(st.get("rng"), self.rank, self.world)
        log.info("resumed from %s at step %d", path, self.step)
        self._last_save = (self.step, str(path))  # an interrupt before the next step need not rewrite it
        return True

    def _load_weights_and_optimizer(self, path: Path, st: dict) -> None:
        """Sharded state (``state/``: any process count, sharded or not) or the replicated entries."""
        if (path / STATE_DIR).is_dir():
            load_sharded_state(path / STATE_DIR, self.model, self.optimizer, self.accelerator, st["optimizer"],
                               deepspeed=self.dist_kind == "DEEPSPEED")
        else:
            if self.sharded:
                raise ValueError(f"resume: {path} was written by a replicated run (no {STATE_DIR}/ folder); a "
                                 f"{self.dist_kind} run resumes from sharded checkpoints only")
            self.policy.load_trainable_state_dict(st["policy"])
            self.optimizer.load_state_dict(st["optimizer"])
        if st.get("scheduler"):
            self.scheduler.load_state_dict(st["scheduler"])
