"""Exit codes of ``mmgrpo train`` and ``flow_grpo train`` (no heavy imports: used by ``--help``).

A run that trained nothing never exits 0; each way of not finishing has its own code, so a scheduler or a
script can tell "fix the config" from "resume later" from "look at the data / reward server".
"""
from __future__ import annotations

import sys
from typing import Callable

OK = 0  # trained; final weights written
USAGE = 2  # bad command line or config (checked before any data or model is loaded)
STOPPED = 3  # a fault policy stopped the run after writing a checkpoint (resume with run.resume_from=auto)
NOTHING_TRAINED = 4  # no optimizer step applied, or none with a reward signal (all advantages 0); no final weights
LOCKED = 5  # run.output_dir is in use by another run (<output_dir>/.lock names it)
INTERRUPTED = 6  # SIGTERM / SIGINT: stopped at a step (VLM) / epoch (flow) boundary after writing a checkpoint
SIGINT_EARLY = 130  # Ctrl-C before the training loop started (nothing to checkpoint yet); the shell's 128 + SIGINT

HELP = f"""exit codes:
  {OK}  trained; final weights written
  {USAGE}  bad command line or config (validated before any model is loaded: also flash-attn missing, a reward
     without its URL or weights, a run the planner says cannot fit the device; the message names the setting)
  {STOPPED}  stopped by a fault policy after writing a checkpoint (too many consecutive skipped steps; mmgrpo also
     reward.on_failure=stop / on_nonfinite=error); fix the cause, then resume from the checkpoint it names
  {NOTHING_TRAINED}  nothing was trained: every optimizer step was skipped (no valid group / reward, e.g. all media
     missing or the reward server down, or non-finite values), or no step had a reward signal (every group's
     rewards equal, e.g. no completion parsed: the message gives the parse rate and reward spread); no final
     weights are written
  {LOCKED}  run.output_dir is in use by another run (one run per folder; <output_dir>/.lock names the holder; a
     lock left by a dead process is taken over with a warning)
  {INTERRUPTED}  interrupted by SIGTERM / SIGINT (preemption, Ctrl-C): the current step (flow: epoch) was finished, or
     discarded while its rollouts were still being drawn; a checkpoint was written on every process; resume with
     run.resume_from=auto (a second signal 1 s or more later aborts at once; the last complete checkpoint is kept)
  {SIGINT_EARLY}  Ctrl-C before training started (no checkpoint written)"""



def run_training(prog: str, train: Callable[[], object]) -> int:
    """Run ``train()`` (which does its own heavy imports) and map the run's outcome to the codes above, printing
    the reason as one ``"<prog>: <message>"`` line on stderr instead of a traceback. Shared by both CLIs."""
    from mmgrpo.engine.errors import (ConfigError, NothingTrained, OutputDirLocked, TrainingInterrupted,
                                      TrainingStopped)

    codes = ((ConfigError, USAGE),  # a setting found wrong before the model loaded (the message names it)
             (TrainingStopped, STOPPED),  # a fault policy stopped the run after writing a checkpoint
             (NothingTrained, NOTHING_TRAINED),  # every optimizer step was skipped: no final weights
             (OutputDirLocked, LOCKED),  # another run writes into run.output_dir
             (TrainingInterrupted, INTERRUPTED))  # SIGTERM / SIGINT: stopped at a boundary after a checkpoint
    try:
        train()
    except tuple(cls for cls, _ in codes) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return next(code for cls, code in codes if isinstance(e, cls))
    except KeyboardInterrupt:  # Ctrl-C before the training loop started: no traceback, nothing to save yet
        print(f"{prog}: interrupted before training started (no checkpoint written)", file=sys.stderr)
        return SIGINT_EARLY
    return OK


__all__ = ["OK", "USAGE", "STOPPED", "NOTHING_TRAINED", "LOCKED", "INTERRUPTED", "SIGINT_EARLY", "HELP", "run_training"]
