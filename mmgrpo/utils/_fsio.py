"""Small atomic file-system helpers with no heavy imports (used by config and checkpoint)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

__all__ = ["atomic_write", "atomic_write_text", "fsync_dir"]


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory so that a rename/creation inside it is durable (no-op where unsupported)."""
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write_fn: Callable[[Path], None]) -> Path:
    """Write ``path`` atomically: ``write_fn(tmp_path)`` writes a sibling temp file, which is fsynced and
    ``os.replace``d onto ``path``. Readers see either the old file or the complete new one, never a torn file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write_fn(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
    fsync_dir(path.parent)
    return path


def atomic_write_text(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """Atomically replace ``path`` with ``text``."""

    def _write(tmp: Path) -> None:
        with open(tmp, "w", encoding=encoding) as fh:
            fh.write(text)
            fh.flush()

    return atomic_write(path, _write)
