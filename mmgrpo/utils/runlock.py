"""One run per output folder: an exclusive lock file ``<output_dir>/.lock``.

Two runs writing into one folder would interleave ``metrics.jsonl`` and delete each other's checkpoints (each
applies its own retention), so a run takes the lock before it loads anything and keeps it until it ends:

* the lock is an ``fcntl.flock`` on ``<output_dir>/.lock``; the file holds the holder's pid, host and start time
  (JSON), so a refused run can name it;
* a second run refuses with :class:`OutputDirLocked` (the CLIs exit with code 5);
* a lock left by a process that died (SIGKILL, node crash) is *stale*: the kernel dropped its flock, so the next
  run takes it over with a warning naming the dead holder.  This also works when a preempted job is requeued on
  another node of a cluster (the shared file system's lock manager released it);
* where the file system has no working ``flock`` (some Lustre / NFS mounts answer ENOLCK / EOPNOTSUPP), the pid is
  checked instead: a live pid on this host refuses, a dead one is taken over, and a holder on another host is
  refused (it cannot be checked from here: delete the file if that run is gone);
* multi-process runs lock once, on the main process (:func:`acquire_run_lock` shares the outcome with the others);
* the lock is released (file removed) when the run ends (:func:`release_run_lock`: the CLIs, ``close()`` of the
  flow trainer), when the run's trainer is garbage-collected, or when the process exits; a process may lock the
  same folder again (e.g. a second trainer resuming in the same process) without conflict.
"""
from __future__ import annotations

import atexit
import errno
import json
import logging
import os
import socket
import time
import weakref
from pathlib import Path

from mmgrpo.engine.errors import OutputDirLocked

__all__ = ["RunLock", "acquire_run_lock", "release_run_lock", "LOCK_NAME"]

log = logging.getLogger("mmgrpo.runlock")

LOCK_NAME = ".lock"
_HELD: dict[str, "RunLock"] = {}  # realpath of the lock file -> this process's lock on it


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    except OSError:
        return False
    return True


def _describe(holder: dict) -> str:
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, started {when}"


class RunLock:
    """Exclusive lock on an output folder (see the module docstring).  ``acquire()`` / ``release()``."""

    def __init__(self, output_dir: str | os.PathLike):
        self.dir = Path(output_dir)
        self.path = self.dir / LOCK_NAME
        self.fd: int | None = None
        self.users = 0  # acquisitions by this process (released when it drops to 0)

    @property
    def held(self) -> bool:
        return self.fd is not None

    def _read_holder(self, fd: int | None = None) -> dict:
        try:
            if fd is not None:
                os.lseek(fd, 0, os.SEEK_SET)
                raw = os.read(fd, 4096)
            else:
                raw = self.path.read_bytes()
            holder = json.loads(raw.decode("utf-8") or "{}")
            return holder if isinstance(holder, dict) else {}
        except (OSError, ValueError):
            return {}

    def _refuse(self, holder: dict, why: str = "") -> None:
        raise OutputDirLocked(
            f"{self.dir} is in use by another run ({_describe(holder)}){why}: two runs in one output folder would "
            f"interleave their logs and delete each other's checkpoints. Wait for it to finish, use another "
            f"run.output_dir, or, if that run is gone, delete {self.path}")

    def _open_locked(self) -> tuple[int, bool]:
        """(fd of the lock file, whether flock works here).  Retries if the file was replaced meanwhile (a
        releasing holder unlinks it: a lock on the old inode would not exclude a newcomer)."""
        import fcntl

        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    holder = self._read_holder(fd)
                    os.close(fd)
                    self._refuse(holder)
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    os.close(fd)
                    raise
                return fd, False  # no flock on this file system: fall back to pid checks
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                return fd, True
            os.close(fd)

    def acquire(self) -> "RunLock":
        if self.fd is not None:
            self.users += 1
            return self
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, flock_ok = self._open_locked()
        try:
            holder = self._read_holder(fd)
            host = socket.gethostname()
            if holder.get("pid") is not None and not (holder.get("pid") == os.getpid() and holder.get("host") == host):
                pid = holder.get("pid")
                if not flock_ok:
                    if holder.get("host") != host:
                        self._refuse(holder, " (file locks do not work on this file system, so a run on another "
                                             "host cannot be checked)")
                    if isinstance(pid, int) and _pid_alive(pid):
                        self._refuse(holder)
                log.warning("%s: taking over a stale lock of a run that ended without releasing it (%s)",
                            self.path, _describe(holder))
            me = {"pid": os.getpid(), "host": host, "started": time.time()}
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(me).encode("utf-8"))
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self.fd, self.users = fd, 1
        return self

    def release(self) -> None:
        """Drop one acquisition; the last one removes the file (while still locked) and unlocks."""
        if self.fd is None:
            return
        self.users -= 1
        if self.users > 0:
            return
        try:
            if self._read_holder(self.fd).get("pid") == os.getpid():
                self.path.unlink()
        except OSError:
            pass
        os.close(self.fd)  # closing the descriptor drops the flock
        self.fd = None
        _HELD.pop(os.path.realpath(self.path), None)


def _release_all() -> None:
    for lk in list(_HELD.values()):
        lk.users = 1
        lk.release()


atexit.register(_release_all)


def acquire_run_lock(output_dir: str | os.PathLike, is_main: bool = True, owner: object = None) -> RunLock | None:
    """Lock ``output_dir`` for this run (main process only) and return the lock (None on other processes).

    ``owner`` (e.g. the trainer): the lock is released when it is garbage-collected (or at process exit).

    Collective when ``torch.distributed`` is initialised: every process learns whether the main process got the
    lock, and all raise :class:`OutputDirLocked` if it did not (no process is left waiting in a collective)."""
    lock, err = None, None
    if is_main:
        key = os.path.realpath(Path(output_dir) / LOCK_NAME)
        lock = _HELD.get(key) or RunLock(output_dir)
        try:
            lock.acquire()
            _HELD[key] = lock
        except OutputDirLocked as exc:
            err, lock = str(exc), None
    err = _share_from_main(err)
    if err is not None:
        raise OutputDirLocked(err)
    if lock is not None and owner is not None:
        weakref.finalize(owner, lock.release)
    return lock


def release_run_lock(output_dir: str | os.PathLike) -> None:
    """Release this process's lock on ``output_dir`` now, however many trainers took it (the run is over)."""
    lock = _HELD.get(os.path.realpath(Path(output_dir) / LOCK_NAME))
    if lock is not None:
        lock.users = 1
        lock.release()


def _share_from_main(obj):
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return obj
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
