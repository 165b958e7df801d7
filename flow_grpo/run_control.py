"""Stopping a flow run: consecutive skipped steps (halt), a failed reward call (``reward.on_failure=stop``), SIGTERM /
SIGINT, the time budget, and the refusal to export a run that applied no optimizer step (mixed into
:class:`flow_grpo.trainer.FlowGRPOTrainer`)."""
from __future__ import annotations

from mmgrpo.engine.dist import all_reduce, any_process, broadcast_object
from mmgrpo.engine.errors import NothingTrained, RewardCallFailed, TrainingInterrupted, TrainingStopped
from mmgrpo.utils.logging import get_logger

log = get_logger("flow_grpo.trainer")


class RunControlMixin:
    def _halt(self, what: str) -> None:
        path = self.save_checkpoint(halted=True)
        path = broadcast_object(str(path) if path is not None else None)
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


    def _check_trained(self) -> None:
        """A run none of whose optimizer steps was applied fails instead of exporting "trained" weights."""
        n = self.counters
        if self.epoch == 0 or n["applied_steps"] > 0:
            return
        if self.logger is not None:
            self.logger.flush()
        cause = self.skips.last_cause or (
            "every update was empty: no trajectory had a non-zero advantage (all groups' rewards tied; "
            "optim.drop_zero_adv=true)")
        raise NothingTrained(
            f"flow_grpo: nothing was trained in {self.epoch} epoch(s): no optimizer step was applied "
            f"({n['skipped_steps']} skipped, {n['empty_updates']} empty; last cause: {cause}; "
            f"{n['reward_invalid']} samples had an invalid reward, {n['reward_failed_calls']} reward calls failed). "
            f"No final weights were exported. Check the reward (server reachable? reward.weights / reward.kwargs) "
            f"and the learning rate.")


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
        return all_reduce([x], "max", self.device)[0]

    def _stop_on_reward_failure(self, exc: RewardCallFailed, epoch: int) -> None:
        """Collective. ``reward.on_failure=stop``: write a checkpoint of the state before ``epoch`` (its samples are
        redrawn on resume, as after a signal) and raise :class:`TrainingStopped` (``flow_grpo train`` exits 3)."""
        last = getattr(self, "_last_save", None)
        path = last[1] if last is not None and last[0] == self.epoch else self.save_checkpoint()
        path = broadcast_object(str(path) if path is not None else None)
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
        path = broadcast_object(str(path) if path is not None else None)
        if self.logger is not None:
            self.logger.flush()
        log.warning("interrupted by %s at %s: checkpoint %s", self._signals.name, where, path)
        raise TrainingInterrupted(self._signals.name, where, path)

