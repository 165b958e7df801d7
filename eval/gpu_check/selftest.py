"""Stand-in sections for the runner's own test (tests/eval/test_gpu_check.py): one that succeeds, one that raises,
one that writes a figure and then hangs past its budget (and starts a child process that must die with it)."""
from __future__ import annotations

import subprocess
import sys
import time

from .common import Ctx


def ok(ctx: Ctx) -> None:
    ctx.put(headline={"value": 1.0}, dry_run=ctx.dry_run)


def fails(ctx: Ctx) -> None:
    ctx.put(partial=1)
    raise RuntimeError("planned failure")


def hangs(ctx: Ctx) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    ctx.put(partial=2, grandchild_pid=child.pid)
    time.sleep(600)
