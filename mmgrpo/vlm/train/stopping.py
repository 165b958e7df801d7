"""How a VLM run stops: skipped optimizer steps, "nothing trained", stop requests and SIGTERM / SIGINT (always
after writing a checkpoint)."""
from __future__ import annotations

import torch

from mmgrpo.engine.dist import any_process, global_max, global_sum
from mmgrpo.engine.errors import NothingTrained, TrainingInterrupted, TrainingStopped
from mmgrpo.utils.checkpoint import restore_rng_state
from mmgrpo.utils.logging import get_logger

log = get_logger("mmgrpo.train")

__all__ = ["StopMixin"]


class StopMixin:
    """``GRPOTrainer._record_skip`` / ``_check_trained`` / ``_check_stop`` / ``_interrupt`` / ``_stop``."""

    def _record_skip(self, why: str, n: int = 1) -> None:
        self.counters["skipped_steps"] += n
        self.skips.skipped(why, n)
        log.warning("step %d: %s -> optimizer step skipped (%d skipped in a row, %d in total)",
                    self.step + 1, why, self.consecutive_skips, self.counters["skipped_steps"])

    @property
    def consecutive_skips(self) -> int:
        """Optimizer steps skipped in a row (:class:`mmgrpo.engine.checkpoint.SkipHalt`)."""
        return self.skips.consecutive

    @property
    def _last_skip_cause(self) -> str:
        return self.skips.last_cause or "unknown"

    def _applied_updates(self) -> int:
        """Optimizer updates applied so far in the run (every step attempts num_iterations; skips are counted)."""
        return self.step * self.cfg.algo.num_iterations - int(self.counters["skipped_steps"])

    def _zero_advantage_cause(self, rb) -> str | None:
        """Collective. Why this step has no reward signal (every advantage of every process is 0: all groups' rewards
        are equal, e.g. every completion fails to parse), or None. Counted in ``zero_advantage_steps``.

        Such a step is a *skipped step* (counted, feeds ``run.max_consecutive_skips``) when its gradient is exactly 0:
        no KL term (``algo.kl_coef=0``) and no method adding a loss term of its own (entropy bonus). An optimizer step
        on a zero gradient would only apply AdamW's momentum and weight decay (TRL / verl take it; we do not). With a
        KL or entropy term the step is taken, but a run none of whose steps had a reward signal still fails
        (:meth:`_check_trained`)."""
        n_rows = global_sum(float(rb.n))
        nonzero = global_sum(float((rb.advantages != 0).sum()) if rb.advantages is not None and rb.n else 0.0)
        if nonzero > 0:
            return None
        self.counters["zero_advantage_steps"] = self.counters.get("zero_advantage_steps", 0) + 1
        r = rb.rewards["total"].double() if rb.n else torch.zeros(0, dtype=torch.float64)
        s1, s2 = global_sum(float(r.sum())), global_sum(float((r * r).sum()))
        fails = global_sum(float(rb.parse_failed.sum()) if rb.n else 0.0)
        mean = s1 / max(n_rows, 1.0)
        std = max(s2 / max(n_rows, 1.0) - mean * mean, 0.0) ** 0.5
        why = (f"no reward signal: every advantage is 0, every group's rewards are equal ({int(n_rows)} rows, parse "
               f"failures {int(fails)} = {100 * fails / max(n_rows, 1.0):.0f} %, reward mean {mean:.4g}, std {std:.3g} "
               "over the step)")
        self._last_zero_advantage = why
        if self.cfg.run.allow_no_reward_signal:
            log.warning("step %d: %s; its zero-gradient step is taken (run.allow_no_reward_signal=true)",
                        self.step + 1, why)
            return None
        if self.cfg.algo.kl_coef > 0 or any(m.needs_train_logits for m in self.methods):
            log.warning("step %d: %s; the KL / entropy terms are still applied", self.step + 1, why)
            return None
        return why

    def _check_trained(self) -> None:
        """A run none of whose optimizer steps was applied, or none of whose steps had a reward signal (all advantages
        0), fails instead of saving "trained" weights."""
        if self.step == 0:
            return
        zero = int(self.counters.get("zero_advantage_steps", 0))
        if self._applied_updates() > 0 and (zero < self.step or self.cfg.run.allow_no_reward_signal):
            return
        if self._applied_updates() > 0:  # steps were taken on the KL / entropy terms alone
            self.logger.flush()
            raise NothingTrained(
                f"nothing was trained: none of the run's {self.step} step(s) had a reward signal (last: "
                f"{getattr(self, '_last_zero_advantage', 'all advantages 0')}); only the KL / entropy terms were "
                "applied; no final checkpoint written. Check completions.jsonl: the answer format the reward parses "
                "(reward.parse_mode, data.prompt_mode), the reward weights, and whether the task is too hard or too "
                "easy for the base model (run.allow_no_reward_signal=true accepts such a run: pipeline rehearsals)")
        self.logger.flush()
        raise NothingTrained(
            f"nothing was trained: all {self.counters['skipped_steps']} optimizer step(s) of the run's {self.step} "
            f"step(s) were skipped (last cause: {self._last_skip_cause}; "
            f"data/skipped_missing_media={self.counters['skipped_missing_media']}, "
            f"faults/reward_failed_calls={self.counters['reward_failed_calls']}, "
            f"faults/reward_nonfinite_rows={self.counters['reward_nonfinite_rows']}, "
            f"zero-advantage steps={zero}); no final checkpoint written. Check data.media_root / data.train_file, "
            "the reward function or server and the answer format it parses (completions.jsonl), and the learning "
            "rate")

    def _check_stop(self) -> None:
        """After collect (the same collectives ran everywhere): stop on every process if any process asked to, or
        a SIGTERM / SIGINT reached one (the step is abandoned: a resume redraws its prompts)."""
        stop = any_process(self._stop_reason is not None)
        signalled = not stop and self._signals is not None and self._signals.agreed(global_max)
        if not (stop or signalled):
            return
        reason = self._stop_reason or "another process requested a stop (see its log)"
        snap = self._step_snapshot  # the step did not happen: its prompts are drawn again after a resume
        if snap["subset"] is not None:  # a data re-selection inside this step is redone too
            self.use_samples(snap["subset"])
            self.stream.n = len(self.samples)
        self.stream.load_state_dict(snap["stream"])
        restore_rng_state(snap["rng"])
        if signalled:  # nothing of this step is kept, not even its counts (the resumed run counts them)
            self.counters.update(snap["counters"])
            self._interrupt(f"step {self.step} (its rollouts were discarded)")
        self._stop(reason)

    def _interrupt(self, where: str) -> None:
        """SIGTERM / SIGINT: checkpoint the current state (unless this step's is already written) and raise
        :class:`TrainingInterrupted` (``mmgrpo train`` exits with code 6)."""
        last = getattr(self, "_last_save", None)
        path = last[1] if last is not None and last[0] == self.step else self.save()
        self.logger.flush()
        if path is not None:
            log.info("interrupted by %s: checkpoint %s", self._signals.name, path)
        raise TrainingInterrupted(self._signals.name, where, str(path) if path else None)

    def _stop(self, reason: str) -> None:
        """Write a checkpoint of the current state and raise :class:`TrainingStopped` (the run is not lost)."""
        path = self.save()
        self.logger.flush()
        raise TrainingStopped(f"training stopped at step {self.step}: {reason}", str(path) if path else None)
