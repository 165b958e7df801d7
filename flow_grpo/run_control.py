"""Stopping a flow run: consecutive skipped steps (halt), a failed reward call (``reward.on_failure=stop``), SIGTERM /
SIGINT, the time budget, and the refusal to export a run that applied no optimizer step (mixed into
:class:`flow_grpo.trainer.FlowGRPOTrainer`)."""
from __future__ import annotations

from typing import Optional

import torch

from mmgrpo.engine.dist import any_process
from mmgrpo.engine.errors import NothingTrained, RewardCallFailed, TrainingInterrupted, TrainingStopped
from mmgrpo.utils.logging import get_logger

from .distributed import _broadcast_object, _reduce

log = get_logger("flow_grpo.trainer")


class RunControlMixin:
    def _halt(self, what: str) -> None:
        path = self.save_checkpoint(halted=True)
        path = _broadcast_object(str(path) if path is not None else None)
        k = self.cfg.optim.max_consecutive_skips
        never = " (none of the run's optimizer steps was applied)" if not self.counters["applied_steps"] else ""
        msg = (f"flow_grpo: stopping after {k} consecutive skipped optimizer steps{never} (last cause: {what}) at "
               f"epoch {self.epoch}, step {self.global_step}. Weights are unchanged by the skipped steps; the state "
               f"was written to {path} (continue with run.resume_from={path} after fixing the cause, e.g. a lower "
               "optim.lr, optim.max_grad_norm, bf16 -> fp32, or a broken reward).")
        if self.logger is not None:
            self.logger.log({"halted": 1.0, "steps/skipped_total": float(self.counters["skipped_steps"])},
                            self.global_step)
            self.logger.flush()
        log.error(msg)
        raise TrainingStopped(msg, path, resume_hint=False)  # msg names the halted folder to resume from


    def _zero_advantage_cause(self, traj, adv: torch.Tensor) -> Optional[str]:
        """Collective. Why this epoch has no reward signal (every advantage of every process is 0: all groups' rewards
        are equal), or None; counted in ``zero_advantage_epochs``. With ``optim.drop_zero_adv`` (the default) such
        an epoch's updates are already empty (no trajectory left to train: not an optimizer step). Without it, the
        epoch's optimizer steps are *skipped steps* (counted, feed ``optim.max_consecutive_skips``) when their
        gradient is exactly 0: no KL term (``optim.kl_coef=0``) and no credit with a loss of its own
        (DiffusionNFT); a step on a zero gradient would only apply AdamW's momentum and weight decay. With a KL term
        the steps are taken, but a run none of whose epochs had a reward signal still fails
        (:meth:`_check_trained`)."""
        valid = traj.rewards["valid"].bool()
        nonzero = _reduce([float((adv[valid] != 0).sum())], "sum", self.device)[0]
        if nonzero > 0:
            return None
        self.counters["zero_advantage_epochs"] = self.counters.get("zero_advantage_epochs", 0) + 1
        r = traj.rewards["total"].double()[valid]
        n, s1, s2 = _reduce([float(r.numel()), float(r.sum()), float((r * r).sum())], "sum", self.device)
        mean = s1 / max(n, 1.0)
        std = max(s2 / max(n, 1.0) - mean * mean, 0.0) ** 0.5
        why = (f"no reward signal: every advantage is 0, every group's rewards are equal ({int(n)} valid samples, "
               f"reward mean {mean:.4g}, std {std:.3g} over the epoch)")
        self._last_zero_advantage = why
        if self.cfg.run.allow_no_reward_signal:
            if self.is_main:
                log.warning("epoch %d: %s; its zero-gradient steps are taken (run.allow_no_reward_signal=true)",
                            self.epoch, why)
            return None
        if self.cfg.optim.drop_zero_adv:  # every trajectory leaves the update: empty updates, as before
            return None
        rt = self.method_runtime
        if self.cfg.optim.kl_coef > 0 or (rt is not None and hasattr(rt, "loss")):
            if self.is_main:
                log.warning("epoch %d: %s; the KL / method loss terms are still applied", self.epoch, why)
            return None
        return why

    def _check_trained(self) -> None:
        """A run none of whose optimizer steps was applied, or none of whose epochs had a reward signal (every
        advantage 0), fails instead of exporting "trained" weights."""
        n = self.counters
        if self.epoch == 0:
            return
        if n["applied_steps"] > 0 and (n.get("zero_advantage_epochs", 0) < self.epoch
                                       or self.cfg.run.allow_no_reward_signal):
            return
        if n["applied_steps"] > 0:  # steps were taken on the KL / method loss terms alone
            if self.logger is not None:
                self.logger.flush()
            raise NothingTrained(
                f"flow_grpo: nothing was trained: none of the run's {self.epoch} epoch(s) had a reward signal (last: "
                f"{getattr(self, '_last_zero_advantage', 'every advantage 0')}); only the KL / method loss terms were "
                "applied. No final weights were exported. Check the reward (reward.weights / reward.kwargs: does it "
                "tell the group's images apart?); run.allow_no_reward_signal=true accepts such a run (rehearsals)")
        if self.logger is not None:
            self.logger.flush()
        cause = self.skips.last_cause or (
            "every update was empty: no trajectory had a non-zero advantage (all groups' rewards tied; "
            "optim.drop_zero_adv=true)" + (f"; {self._last_zero_advantage}" if hasattr(self, "_last_zero_advantage")
                                            else ""))
        raise NothingTrained(
            f"flow_grpo: nothing was trained in {self.epoch} epoch(s): no optimizer step was applied "
            f"({n['skipped_steps']} skipped, {n['empty_updates']} empty, {n.get('zero_advantage_epochs', 0)} "
            f"epoch(s) without a reward signal; last cause: {cause}; "
            f"{n['reward_invalid']} samples had an invalid reward, {n['reward_failed_calls']} reward calls failed). "
            f"No final weights were exported. Check the reward (server reachable? reward.weights / reward.kwargs) "
            f"and the learning rate.")


    def _sampling_progress(self):
        """``on_chunk`` of the epoch's sampling: a progress line every 30 s (main process) and, on replicated runs,
        the end of sampling when SIGTERM / SIGINT arrived (sharded runs finish the epoch's sampling: their forwards
        are collectives every process must run)."""
        import time

        t0 = last = time.monotonic()

        def hook(done: int, total: int) -> bool:
            nonlocal last
            now = time.monotonic()
            if self.is_main and now - last >= 30.0:
                log.info("epoch %d: sampled %d of %d chunks in %.0f s", self.epoch, done, total, now - t0)
                last = now
            sig = self._signals
            if sig is not None and sig.requested and not self.sharded:
                log.warning("%s received while sampling: the epoch's samples are discarded", sig.name)
                return True
            return False

        return hook

    def _budget_exhausted(self) -> bool:
        """Collective when a budget is set: every process stops after the same epoch."""
        if not self.budget.enabled:
            return False
        if any_process(self.budget.exhausted, self.device):
            if not self.budget_stopped:
                log.info("run.max_train_seconds=%g reached after epoch %d (%.1f s, %s clock)",
                         self.budget.max_seconds, self.epoch, self.budget.spent, self.cfg.run.budget_clock)
            self.budget_stopped = True
        return self.budget_stopped

    def _reduce_max(self, x: float) -> float:
        return _reduce([x], "max", self.device)[0]

    def _stop_on_reward_failure(self, exc: RewardCallFailed, epoch: int) -> None:
        """Collective. ``reward.on_failure=stop``: write a checkpoint of the state before ``epoch`` (its samples are
        redrawn on resume, as after a signal) and raise :class:`TrainingStopped` (``flow_grpo train`` exits 3)."""
        last = getattr(self, "_last_save", None)
        path = last[1] if last is not None and last[0] == self.epoch else self.save_checkpoint()
        path = _broadcast_object(str(path) if path is not None else None)
        if self.logger is not None:
            self.logger.flush()
        msg = (f"flow_grpo: a reward call failed at epoch {epoch} and reward.on_failure=stop: {exc}. The state before "
               f"the epoch was written to {path}; fix the reward, then resume with run.resume_from=auto.")
        log.error(msg)
        raise TrainingStopped(msg, path, resume_hint=False) from exc

    def _interrupt(self, where: str) -> None:
        """Collective. SIGTERM / SIGINT: checkpoint the current state (unless this epoch's is already written) on
        every process and raise :class:`TrainingInterrupted` (``flow_grpo train`` exits with code 6)."""
        last = getattr(self, "_last_save", None)
        path = last[1] if last is not None and last[0] == self.epoch else self.save_checkpoint()
        path = _broadcast_object(str(path) if path is not None else None)
        if self.logger is not None:
            self.logger.flush()
        log.warning("interrupted by %s at %s: checkpoint %s", self._signals.name, where, path)
        raise TrainingInterrupted(self._signals.name, where, path)

