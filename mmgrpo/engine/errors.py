"""One exception family for both trainers and both CLIs (``mmgrpo train``, ``flow_grpo train``).

Every error a run raises on purpose derives from :class:`MMGRPOError`; the CLIs turn each into its exit code
(:mod:`mmgrpo.utils.exit_codes`), not a traceback:

* :class:`ConfigError`: a setting found wrong before the model loads (flash-attn missing, a reward without its
  URL or weights, a run that cannot fit the device; exit code 2, like a bad command line);
* :class:`TrainingStopped`: a fault policy stopped the run after writing a checkpoint (exit code 3);
* :class:`NothingTrained`: the run applied no optimizer step, every step was skipped (exit code 4);
* :class:`OutputDirLocked`: another run holds ``<output_dir>/.lock`` (exit code 5);
* :class:`TrainingInterrupted`: SIGTERM / SIGINT stopped the run at a step / epoch boundary (exit code 6);
* :class:`RewardCallFailed`: a reward call kept failing after its retries (in a rollout, both trainers turn it into
  :class:`TrainingStopped` after writing a checkpoint: ``RunGuard.stop_if_asked``; elsewhere it propagates);
* :class:`RewardTimeout`: one attempt of a (flow) reward call timed out (retried, then :class:`RewardCallFailed`).

Each class also derives from the builtin its meaning fits (``RuntimeError``, ``TimeoutError``), so a generic
``except RuntimeError`` catches it too. No heavy imports here (the CLIs import this for ``--help``).
"""
from __future__ import annotations

from typing import Optional

__all__ = ["MMGRPOError", "ConfigError", "TrainingStopped", "NothingTrained", "RewardCallFailed",
           "RewardTimeout", "OutputDirLocked", "TrainingInterrupted"]


class MMGRPOError(Exception):
    """Base of every error mmgrpo / flow_grpo raise on purpose (catch this to handle them all)."""


class ConfigError(MMGRPOError, ValueError):
    """A setting is wrong, found before the model loads; the message names the setting (a dotted config key or a
    command-line flag) and what to do (exit code 2)."""


class TrainingStopped(MMGRPOError, RuntimeError):
    """The run stopped on purpose (a configured fault policy); a checkpoint was written first (``checkpoint``).

    ``resume_hint=True`` appends where the checkpoint is and how to resume (``run.resume_from=auto``); a message
    that already says so itself (the flow trainer's, whose halted state lives in ``<output_dir>/halted`` and is
    resumed by path) passes ``resume_hint=False``.
    """

    def __init__(self, message: str, checkpoint: Optional[str] = None, resume_hint: bool = True):
        super().__init__(message + (f"; checkpoint written: {checkpoint} (resume with run.resume_from=auto)"
                                    if checkpoint and resume_hint else ""))
        self.reason = message
        self.checkpoint = checkpoint



class NothingTrained(MMGRPOError, RuntimeError):
    """The run applied no optimizer step (all were skipped); raised instead of writing final weights."""


class RewardCallFailed(MMGRPOError, RuntimeError):
    """A reward call still failed (exception or timeout) after all its retries."""


class RewardTimeout(MMGRPOError, TimeoutError):
    """One attempt of a reward call did not return within its timeout."""


class OutputDirLocked(MMGRPOError, RuntimeError):
    """Another run holds ``<output_dir>/.lock`` (the message names it)."""


class TrainingInterrupted(MMGRPOError):
    """SIGTERM / SIGINT stopped the run at a step boundary after a checkpoint was written (``checkpoint``: its path,
    known on the process that wrote it)."""

    def __init__(self, signame: str, where: str, checkpoint: Optional[str] = None):
        msg = f"{signame} received: stopped at {where}"
        msg += (f"; checkpoint written: {checkpoint} (resume with run.resume_from=auto)" if checkpoint
                else "; checkpoint written by the main process (resume with run.resume_from=auto)")
        super().__init__(msg)
        self.signame, self.where, self.checkpoint = signame, where, checkpoint
