"""Final weight exports written atomically, with a manifest that says what they are.

:func:`publish_dir` writes an export folder (e.g. ``lora_final``) into a temp folder next to it, adds
``export.json`` (the caller's fields, e.g. epoch and step, plus size and sha256 of every file), fsyncs, and renames
it into place.  A process killed at any moment leaves the previous complete export, no export, or the new
complete one: never a half-written folder under the final name (a directory cannot be renamed over a non-empty
one, so the old export is first renamed aside; a kill between the two renames leaves no export, which
:func:`export_problem` reports).  :func:`export_problem` tells a resumed run whether the export exists, is intact
and belongs to the current state, so it can be rewritten when it is not.

A process killed during :func:`publish_dir` leaves ``.tmp-<name>-<pid>`` (the new export being written) and/or
``.old-<name>-<pid>`` (the previous one, renamed aside) next to the export: up to two full copies of the weights.
:func:`clean_stale_exports`, called when a run starts, removes those of processes that are gone; when the export
itself is missing (killed between the two renames) it first puts back the newest complete one.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping

from mmgrpo.utils._fsio import fsync_dir

__all__ = ["publish_dir", "export_problem", "clean_stale_exports", "EXPORT_MANIFEST"]

log = logging.getLogger("mmgrpo.export")

EXPORT_MANIFEST = "export.json"
_LEFTOVER_RE = re.compile(r"^\.(tmp|old)-(.+)-(\d+)$")  # publish_dir's temp / renamed-aside folders


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file() and p.name != EXPORT_MANIFEST)


def publish_dir(target: str | os.PathLike, write: Callable[[Path], None], meta: Mapping[str, Any]) -> Path:
    """``write(tmp_dir)`` fills a fresh temp folder; it then becomes ``target`` atomically (see module doc)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".tmp-{target.name}-{os.getpid()}")
    trash = target.with_name(f".old-{target.name}-{os.getpid()}")
    for d in (tmp, trash):
        shutil.rmtree(d, ignore_errors=True)
    tmp.mkdir()
    try:
        write(tmp)
        files = {}
        for f in _files(tmp):
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
            files[f.relative_to(tmp).as_posix()] = {"size": f.stat().st_size, "sha256": _sha256(f)}
        if not files:
            raise RuntimeError(f"export {target}: the writer produced no files")
        with open(tmp / EXPORT_MANIFEST, "w", encoding="utf-8") as fh:
            json.dump({**dict(meta), "files": files}, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        fsync_dir(tmp)
        if target.exists():
            os.rename(target, trash)
        os.rename(tmp, target)
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(trash, ignore_errors=True)
    return target


def export_problem(target: str | os.PathLike, expect: Mapping[str, Any] | None = None) -> str | None:
    """None if ``target`` is a complete export whose manifest fields match ``expect``; else what is wrong."""
    target = Path(target)
    mpath = target / EXPORT_MANIFEST
    if not target.is_dir():
        return f"{target} does not exist"
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
        files = manifest["files"]
        assert isinstance(files, dict) and files
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        return f"{target} has no readable {EXPORT_MANIFEST} (written before exports were atomic, or interrupted)"
    for key, want in (expect or {}).items():
        if manifest.get(key) != want:
            return f"{target} is from {key}={manifest.get(key)!r}, the run is at {key}={want!r}"
    for rel, info in files.items():
        f = target / rel
        if not f.is_file():
            return f"{target}: {rel} is missing"
        if f.stat().st_size != info.get("size") or _sha256(f) != info.get("sha256"):
            return f"{target}: {rel} does not match its manifest (truncated or corrupt)"
    return None


def clean_stale_exports(parent: str | os.PathLike) -> list[Path]:
    """Remove the ``.tmp-<name>-<pid>`` / ``.old-<name>-<pid>`` folders :func:`publish_dir` left in ``parent``
    when its process was killed (only those whose pid is neither this process nor alive); returns what was removed.

    If ``<name>`` itself is missing (a kill between the two renames), the newest complete leftover is renamed back
    to ``<name>`` first: the new export if its manifest verifies, else the previous one; the trainer then compares
    its ``export.json`` with the run's state as usual.  The export ``<name>`` is never touched otherwise."""
    from mmgrpo.utils.checkpoint import _pid_alive

    parent = Path(parent)
    if not parent.is_dir():
        return []
    stale: dict[str, dict[str, list[Path]]] = {}
    for p in parent.iterdir():
        m = _LEFTOVER_RE.match(p.name)
        if not m or not p.is_dir() or p.is_symlink():
            continue
        if _pid_alive(int(m.group(3))):
            log.info("leaving %s: its process %s is alive", p, m.group(3))
            continue
        stale.setdefault(m.group(2), {"tmp": [], "old": []})[m.group(1)].append(p)
    removed = []
    for name, kinds in stale.items():
        target = parent / name
        if not target.exists():
            for cand in kinds["tmp"] + kinds["old"]:  # the new export first, then the previous one
                if export_problem(cand) is None:
                    os.rename(cand, target)
                    fsync_dir(parent)
                    log.warning("export %s was missing (a run was killed while replacing it): restored it from %s",
                                target, cand.name)
                    break
        for p in kinds["tmp"] + kinds["old"]:
            if p.exists():
                log.warning("removing %s, left by an export that was killed", p)
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed
