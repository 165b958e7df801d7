"""Write failures that name what was written, where, and why.

A full disk reaches the user as torch's ``unexpected pos 576 vs 534`` (``torch.save`` loses the errno), as
safetensors' ``I/O error: ... (os error 28)``, or as a bare ``OSError`` with no hint of which output failed.
:func:`naming_write_errors` turns these into one :class:`OutputWriteError`, e.g.::

    cannot write checkpoint to /runs/a/checkpoints/step-00000003: No space left on device (errno 28) [file
    /runs/a/checkpoints/.tmp-step-00000003-41/model.pt]; 0.0 MB free there

Anything else (a bug, a ``KeyboardInterrupt``) passes through unchanged.
"""
from __future__ import annotations

import errno as _errno
import functools
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

__all__ = ["OutputWriteError", "describe_write_failure", "naming_write_errors", "names_write_errors"]

# torch.save's C++ writer reports a short write without errno; safetensors formats the OS error in its message.
_TORCH_SHORT_WRITE = re.compile(r"unexpected pos \d+ vs \d+|PytorchStreamWriter failed|file write failed")
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


class OutputWriteError(OSError):
    """Writing an output failed; the message names the output, its path and the cause. ``errno`` is the cause's
    errno when known (``errno.ENOSPC`` for a full disk), else None. Subclass of :class:`OSError`, so existing
    ``except OSError`` handlers still see it."""

    def __init__(self, message: str, errno: int | None = None, filename: str | None = None):
        super().__init__(message)
        self.message = message
        self.errno = errno
        self.filename = filename

    def __str__(self) -> str:  # OSError's own would print "[Errno 28] None: None" once errno is set
        return self.message


def _free_space(path: Path) -> str:
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return f"{shutil.disk_usage(p).free / 2**20:.1f} MB free there"
    except OSError:
        return "free space unknown"


def _hint(code: int | None) -> str:
    if code in (_errno.ENOSPC, _errno.EDQUOT):
        return " - free some space or write elsewhere (run.output_dir)"
    if code in (_errno.EROFS, _errno.EACCES, _errno.EPERM):
        return " - is the output directory writable by this user?"
    return ""


def describe_write_failure(exc: BaseException, what: str, path: str | os.PathLike) -> OutputWriteError | None:
    """An :class:`OutputWriteError` describing ``exc`` if it is a write failure (an ``OSError`` with an errno,
    torch's short-write ``RuntimeError``, a safetensors I/O error), else None."""
    if isinstance(exc, OutputWriteError):
        return None
    head = f"cannot write {what} to {path}"
    if isinstance(exc, OSError) and exc.errno is not None:
        cause = f"{exc.strerror or os.strerror(exc.errno)} (errno {exc.errno})"
        where = f" [file {exc.filename}]" if exc.filename and os.fspath(exc.filename) != os.fspath(path) else ""
        free = f"; {_free_space(Path(path))}" if exc.errno in (_errno.ENOSPC, _errno.EDQUOT) else ""
        return OutputWriteError(f"{head}: {cause}{where}{free}{_hint(exc.errno)}", exc.errno, exc.filename)
    msg = str(exc)
    if type(exc).__name__ == "SafetensorError" and (m := _RUST_OS_ERROR.search(msg)):
        code = int(m.group(1))
        return OutputWriteError(f"{head}: {os.strerror(code)} (errno {code}) [safetensors: {msg}]"
                                f"{_hint(code)}", code)
    if isinstance(exc, RuntimeError) and _TORCH_SHORT_WRITE.search(msg):
        # torch does not keep the errno; a short write is nearly always a full disk or an exceeded quota
        return OutputWriteError(f"{head}: the write came up short, the file system is probably full or over quota "
                                f"({_free_space(Path(path))} after removing the partial write) [torch: {msg}]"
                                f"{_hint(_errno.ENOSPC)}", None)
    return None


@contextmanager
def naming_write_errors(what: str, path: str | os.PathLike) -> Iterator[None]:
    """Re-raise write failures inside the block as :class:`OutputWriteError` naming ``what`` and ``path``."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - only write failures are translated, the rest is re-raised as is
        err = describe_write_failure(exc, what, path)
        if err is None:
            raise
        raise err from exc


def names_write_errors(what: str, where: Callable[..., str | os.PathLike]) -> Callable:
    """Decorator form of :func:`naming_write_errors`; ``where(*args, **kwargs)`` gives the path from the call's
    arguments (e.g. ``lambda self, step, *a, **k: self.step_dir(step)``)."""

    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with naming_write_errors(what, where(*args, **kwargs)):
                return fn(*args, **kwargs)

        return wrapper

    return deco
