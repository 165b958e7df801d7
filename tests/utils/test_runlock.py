"""One run per output folder (``mmgrpo.utils.runlock``), with real processes holding the lock."""
import errno
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from mmgrpo.engine.errors import OutputDirLocked
from mmgrpo.utils.runlock import LOCK_NAME, RunLock, acquire_run_lock

HOLDER = """
import sys, time
from mmgrpo.utils.runlock import acquire_run_lock
lock = acquire_run_lock(sys.argv[1])
print("locked", flush=True)
time.sleep(600)
"""


def _holder(folder):
    """A real process that takes the lock on ``folder`` and sleeps (ours to kill)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdout=subprocess.PIPE, env=env, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_second_run_refuses_naming_the_holder_then_takes_over_once_it_died(tmp_path, caplog):
    holder = _holder(tmp_path)
    try:
        info = json.loads((tmp_path / LOCK_NAME).read_text())
        assert info["pid"] == holder.pid and info["host"] == socket.gethostname()
        with pytest.raises(OutputDirLocked, match=rf"in use by another run \(pid {holder.pid} on host "
                                                   rf"{socket.gethostname()}, started .*delete .*\.lock"):
            RunLock(tmp_path).acquire()
    finally:
        _kill(holder)  # SIGKILL: the file stays behind, naming a dead pid (a stale lock)
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == holder.pid
    with caplog.at_level(logging.WARNING, logger="mmgrpo.runlock"):
        lock = RunLock(tmp_path).acquire()
    assert "taking over a stale lock" in caplog.text and f"pid {holder.pid}" in caplog.text
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()  # released: the file is removed


def test_same_process_may_lock_again_and_the_last_release_unlocks(tmp_path):
    a = acquire_run_lock(tmp_path)
    b = acquire_run_lock(tmp_path)  # e.g. a second trainer resuming in the same process
    assert a is b and a.users == 2
    a.release()
    assert (tmp_path / LOCK_NAME).exists()
    b.release()
    assert not (tmp_path / LOCK_NAME).exists() and not a.held


def test_lock_is_released_when_its_owner_is_collected(tmp_path):
    class Owner:
        pass

    owner = Owner()
    lock = acquire_run_lock(tmp_path, owner=owner)
    assert lock.held
    del owner
    assert not lock.held and not (tmp_path / LOCK_NAME).exists()


def test_non_main_process_does_not_lock(tmp_path):
    assert acquire_run_lock(tmp_path, is_main=False) is None
    assert not (tmp_path / LOCK_NAME).exists()


def test_without_working_flock_the_pid_decides(tmp_path, monkeypatch, caplog):
    """Some cluster file systems answer flock with ENOLCK: a live pid on this host refuses, a dead one is taken
    over, a holder on another host is refused (it cannot be checked)."""
    import fcntl

    def no_flock(fd, op):
        raise OSError(errno.ENOLCK, "no locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)
    host = socket.gethostname()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": live.pid, "host": host, "started": time.time()}))
        with pytest.raises(OutputDirLocked, match=f"pid {live.pid}"):
            RunLock(tmp_path).acquire()
    finally:
        _kill(live)
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 12345, "host": "elsewhere", "started": time.time()}))
    with pytest.raises(OutputDirLocked, match="on host elsewhere.*cannot be checked"):
        RunLock(tmp_path).acquire()
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": host, "started": time.time()}))
    with caplog.at_level(logging.WARNING, logger="mmgrpo.runlock"):
        lock = RunLock(tmp_path).acquire()
    assert "stale lock" in caplog.text
    lock.release()
