"""Exit codes of ``mmgrpo train`` and ``flow_grpo train`` (no heavy imports: used by ``--help``).

A run that trained nothing never exits 0; each way of not finishing has its own code, so a scheduler or a
script can tell "fix the config" from "resume later" from "look at the data / reward server".
"""
from __future__ import annotations

OK = 0  # trained; final weights written
USAGE = 2  # bad command line or config (checked before any data or model is loaded)
STOPPED = 3  # a fault policy stopped the run after writing a checkpoint (resume with run.resume_from=auto)
NOTHING_TRAINED = 4  # no optimizer step of the run was applied (every step skipped); no final weights written
LOCKED = 5  # run.output_dir is in use by another run (<output_dir>/.lock names it)

HELP = f"""exit codes:
  {OK}  trained; final weights written
  {USAGE}  bad command line or config (validated before any data or model is loaded)
  {STOPPED}  stopped by a fault policy after writing a checkpoint (too many consecutive skipped steps; mmgrpo also
     reward.on_failure=stop / on_nonfinite=error); fix the cause, then resume from the checkpoint it names
  {NOTHING_TRAINED}  nothing was trained: every optimizer step was skipped (no valid group / reward, e.g. all media
     missing or the reward server down, or non-finite values); no final weights are written
  {LOCKED}  run.output_dir is in use by another run (one run per folder; <output_dir>/.lock names the holder; a
     lock left by a dead process is taken over with a warning)"""

__all__ = ["OK", "USAGE", "STOPPED", "NOTHING_TRAINED", "LOCKED", "HELP"]
