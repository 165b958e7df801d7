"""Crash-safe checkpoints, retention and RNG state.

Layout under ``root`` (folders are ``<prefix>-XXXXXXXX``, ``step`` by default; the flow trainer, whose checkpoints
count epochs, writes ``epoch-*``)::

    step-00000100/           one complete checkpoint
        model.pt             one file per entry of the saved ``state`` dict (torch.save)
        <extra files>        written by ``extra_files`` callables (may be directories, e.g. save_pretrained)
        manifest.json        written LAST: step, metric, entries, size + sha256 of every other file
    .tmp-step-00000200-<pid>/   a save in progress (or a killed one: ignored, cleaned when its pid is gone)

Protocol of :meth:`CheckpointManager.save`: write everything into the temp dir, fsync every file, write the
manifest, fsync the directory, ``os.rename`` it to ``step-XXXXXXXX`` (atomic on POSIX), fsync ``root``. A process
killed at any moment therefore leaves either no new ``step-*`` directory or a complete one; checkpoints damaged
later (truncation, bit rot, partial copies) fail manifest verification and are logged and skipped on load.

Loading never runs code from the files: every entry is read with ``torch.load(weights_only=True)`` (tensors, plain
containers and numbers, plus the numpy array / dtype reconstructors the RNG state needs, see :func:`safe_torch_load`);
a file that needs anything else is refused with :class:`UnsafeCheckpointError` naming it. The manifest's sha256 only
detects damage: whoever writes a folder writes its manifest, so it proves nothing about where the files came from.
Sharded state (``torch.distributed.checkpoint``, DCP) is read through :func:`read_dcp_metadata`: its one metadata file
``.metadata`` (a plain pickle to DCP) is loaded with a restricted unpickler, any other ``*.metadata`` file is refused,
and so is any non-tensor ("bytes") entry, which DCP would read with ``torch.load(weights_only=False)``.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import random
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from mmgrpo.utils._fsio import atomic_write, atomic_write_text, fsync_dir
from mmgrpo.utils.write_errors import names_write_errors

__all__ = [
    "CheckpointManager",
    "CheckpointError",
    "UnsafeCheckpointError",
    "safe_torch_load",
    "refuse_unsafe_pickles",
    "read_dcp_metadata",
    "capture_rng_state",
    "restore_rng_state",
    "atomic_write_text",
    "atomic_torch_save",
    "verify_checkpoint",
    "MANIFEST_NAME",
]

logger = logging.getLogger("mmgrpo.checkpoint")

MANIFEST_NAME = "manifest.json"
FORMAT_VERSION = 1
_TMP_RE = re.compile(r"^\.tmp-.*-(\d+)$")
_WRITER_FILE = ".writer"  # hostname of the process writing a temp dir (its pid is in the dir name)
_FOREIGN_TMP_MAX_AGE = 24 * 3600.0
_ENTRY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete or corrupt (message names the path and the problem)."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file would need unpickling beyond tensors and plain data (i.e. could run code): refused, never
    skipped silently (a crafted file is an alarm, not damage)."""


def _numpy_safe_globals() -> list:
    """What ``numpy.random.get_state()`` (part of the RNG state) pickles to: an uint32 array."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def _refusal(f: Path, exc: BaseException) -> UnsafeCheckpointError:
    # torch's message is long (and suggests weights_only=False); its "unsupported GLOBAL ..." line says enough
    lines = [ln.strip() for ln in str(exc).splitlines() if "unsupported" in ln.lower() or "GLOBAL" in ln]
    detail = lines[0] if lines else f"{type(exc).__name__}: not loadable with torch.load(weights_only=True)"
    return UnsafeCheckpointError(
        f"checkpoint file {f} refused: loading it would need unpickling beyond tensors and plain data, i.e. could "
        f"run code ({detail}). Files written by mmgrpo never need this; do not resume from a folder you did not "
        "write (delete it, or set run.resume_from to another checkpoint).")


def safe_torch_load(f: str | os.PathLike, map_location: Any = "cpu") -> Any:
    """``torch.load(f, weights_only=True)`` allowing only the numpy globals of the RNG state; a file needing any
    other global raises :class:`UnsafeCheckpointError` naming ``f`` (nothing of it is executed)."""
    import pickle

    import torch

    try:
        with torch.serialization.safe_globals(_numpy_safe_globals()):
            return torch.load(f, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise _refusal(Path(f), exc) from None


# torch.distributed.checkpoint's .metadata (FSDP sharded state through accelerate) is a plain pickle of these
_DCP_METADATA_GLOBALS = {
    "pathlib.PosixPath", "pathlib.WindowsPath", "torch.Size", "torch.serialization._get_layout",
    "torch.distributed.checkpoint.filesystem._StorageInfo", "collections.OrderedDict",
}


def _allowed_raw_global(module: str, name: str) -> bool:
    if f"{module}.{name}" in _DCP_METADATA_GLOBALS:
        return True
    if module == "torch.distributed.checkpoint.metadata" and not name.startswith("__"):
        return True  # dataclasses and enums describing the shards
    if module == "torch":
        import torch

        return isinstance(getattr(torch, name, None), torch.dtype)
    return False


class _RestrictedUnpickler:
    """A ``pickle.Unpickler`` that builds only the allowlisted globals of DCP metadata (see :func:`_allowed_raw_global`)."""

    @staticmethod
    def load(data: bytes) -> Any:
        import io
        import pickle

        class _Restricted(pickle.Unpickler):
            def find_class(self, module, name):
                if not _allowed_raw_global(module, name):
                    raise pickle.UnpicklingError(f"Unsupported global: {module}.{name}")
                return super().find_class(module, name)

        return _Restricted(io.BytesIO(data)).load()


DCP_METADATA = ".metadata"  # the one metadata file of a torch.distributed.checkpoint folder that is ever read


def _is_metadata_file(p: Path) -> bool:
    # DCP writes ``.metadata`` (collective save) or ``__<rank>.metadata`` (per-rank save), and falls back to the
    # latter when the former is missing: every ``*.metadata`` name is a pickle DCP may read
    return p.is_file() and p.name.endswith(DCP_METADATA)


def read_dcp_metadata(folder: str | os.PathLike, allow_bytes: bool = False) -> Any:
    """The ``torch.distributed.checkpoint`` metadata of ``folder``, read without running code; raises
    :class:`UnsafeCheckpointError` naming the folder (and the file or entry) unless all of these hold:

    * ``folder/.metadata`` exists and no other ``*.metadata`` file does (DCP would fall back to
      ``__<rank>.metadata`` when ``.metadata`` is missing, and read it with plain ``pickle.load``);
    * it unpickles with the restricted unpickler (DCP's own dataclasses, ``torch.Size``, dtypes, paths only) to a
      ``Metadata`` object;
    * every entry is a tensor (``TensorStorageMetadata``): DCP reads non-tensor ("bytes") entries with
      ``torch.load(weights_only=False)``, i.e. a pickle that can run code. mmgrpo never writes one.
      ``allow_bytes=True`` (checkpoints of the earlier accelerate format, whose optimizer ``param_groups`` went
      through DCP as bytes) accepts a bytes entry only if it loads with ``torch.load(weights_only=True)`` (plain
      data then unpickles the same way under DCP's loader);
    * every storage file it names is a plain file name inside ``folder`` (no ``..``, no absolute path).

    Returns the checked ``Metadata``; :func:`mmgrpo.engine.checkpoint.load_sharded` hands this very object to DCP,
    so what DCP plans with is what was checked."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, TensorStorageMetadata

    folder = Path(folder)
    meta_file = folder / DCP_METADATA
    others = sorted(p.name for p in folder.iterdir() if _is_metadata_file(p) and p.name != DCP_METADATA) \
        if folder.is_dir() else []
    if others:
        raise UnsafeCheckpointError(
            f"sharded checkpoint {folder} refused: metadata file(s) {others} other than {DCP_METADATA!r}, the only "
            "one mmgrpo writes and checks; torch.distributed.checkpoint would unpickle them as they are (i.e. they "
            "could run code). Do not resume from a folder you did not write.")
    if not meta_file.is_file():
        raise CheckpointError(f"sharded checkpoint {folder} has no {DCP_METADATA} file (incomplete or not a "
                              "torch.distributed.checkpoint folder)")
    try:
        md = _RestrictedUnpickler.load(meta_file.read_bytes())
    except Exception as exc:  # noqa: BLE001 - any failure to parse it safely is a refusal
        raise _refusal(meta_file, exc) from None
    if not isinstance(md, Metadata) or not isinstance(md.state_dict_metadata, dict):
        raise UnsafeCheckpointError(f"checkpoint file {meta_file} refused: it unpickles to a "
                                    f"{type(md).__name__}, not torch.distributed.checkpoint's Metadata")
    for fqn, entry in md.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            continue
        if isinstance(entry, BytesStorageMetadata) and allow_bytes:
            _check_bytes_entry(folder, md, fqn)
            continue
        raise UnsafeCheckpointError(
            f"sharded checkpoint {folder} refused: entry {fqn!r} is a {type(entry).__name__} item, not a tensor. "
            "torch.distributed.checkpoint reads such items with torch.load(weights_only=False) (i.e. it could run "
            "code) and mmgrpo never writes one. Do not resume from a folder you did not write.")
    for info in (md.storage_data or {}).values():
        rel = getattr(info, "relative_path", None)
        if not isinstance(rel, str) or not rel or Path(rel).name != rel or rel in (".", ".."):
            raise UnsafeCheckpointError(f"sharded checkpoint {folder} refused: {meta_file.name} points at storage "
                                        f"file {rel!r}, outside the folder")
    return md


def _check_bytes_entry(folder: Path, md: Any, fqn: str) -> None:
    """A bytes entry of a DCP folder must be plain data: load its bytes with ``torch.load(weights_only=True)``."""
    import io

    from torch.distributed.checkpoint.metadata import MetadataIndex

    info = (md.storage_data or {}).get(MetadataIndex(fqn))
    if info is None or getattr(info, "transform_descriptors", None):
        raise UnsafeCheckpointError(f"sharded checkpoint {folder} refused: bytes entry {fqn!r} has no plain "
                                    "storage record (cannot be checked without unpickling it)")
    f = folder / str(info.relative_path)
    try:
        with open(f, "rb") as fh:
            fh.seek(int(info.offset))
            data = fh.read(int(info.length))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"sharded checkpoint {folder}: bytes entry {fqn!r} unreadable from {f}: {exc}") from None
    import torch

    try:
        with torch.serialization.safe_globals(_numpy_safe_globals()):
            torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - not loadable as plain data: refuse
        detail = next((ln.strip() for ln in str(exc).splitlines() if "GLOBAL" in ln or "unsupported" in ln.lower()),
                      f"{type(exc).__name__}")
        raise UnsafeCheckpointError(f"sharded checkpoint {folder} refused: bytes entry {fqn!r} would need "
                                    f"unpickling beyond plain data, i.e. could run code ({detail})") from None


def refuse_unsafe_pickles(root: str | os.PathLike, names: tuple[str, ...] = ()) -> None:
    """Check every ``torch.distributed.checkpoint`` folder under ``root`` (a folder holding any ``*.metadata``
    file) with :func:`read_dcp_metadata` (``allow_bytes=True``: for the earlier accelerate format, whose loader is
    accelerate's), and any other plain pickle named like ``names``; raise :class:`UnsafeCheckpointError` naming the
    file or entry.  For loads that go through accelerate / DCP's own reader."""
    root = Path(root)
    folders = sorted({p.parent for p in root.rglob("*") if _is_metadata_file(p)})
    for d in folders:
        read_dcp_metadata(d, allow_bytes=True)
    for f in sorted(p for p in root.rglob("*") if p.is_file() and p.name in names):
        try:
            _RestrictedUnpickler.load(f.read_bytes())
        except Exception as exc:  # noqa: BLE001 - any failure to parse it safely is a refusal
            raise _refusal(f, exc) from None


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save(obj, path)`` atomically (temp file + fsync + rename)."""
    import torch

    return atomic_write(path, lambda tmp: torch.save(obj, tmp))


def _sha256(path: Path, bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            b = fh.read(bufsize)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _files_under(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file())


def verify_checkpoint(path: str | os.PathLike, check_hashes: bool = True) -> dict:
    """Return the manifest of checkpoint dir ``path``; raise :class:`CheckpointError` naming the problem if it
    is incomplete or corrupt (missing manifest, missing file, size or sha256 mismatch)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist or is not a directory")
    mpath = path / MANIFEST_NAME
    if not mpath.is_file():
        raise CheckpointError(f"checkpoint {path} is incomplete: no {MANIFEST_NAME}")
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint {path}: unreadable {MANIFEST_NAME}: {exc}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"checkpoint {path}: malformed {MANIFEST_NAME}")
    for rel, info in manifest["files"].items():
        f = path / rel
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path}: file {rel} listed in the manifest is missing")
        size = f.stat().st_size
        if size != info.get("size"):
            raise CheckpointError(
                f"checkpoint {path}: file {rel} has {size} bytes, manifest says {info.get('size')} (truncated?)"
            )
        if check_hashes and _sha256(f) != info.get("sha256"):
            raise CheckpointError(f"checkpoint {path}: file {rel} fails its sha256 check (corrupt)")
    for key in manifest.get("entries", []):
        if f"{key}.pt" not in manifest["files"]:
            raise CheckpointError(f"checkpoint {path}: entry {key!r} has no file in the manifest")
    return manifest


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except OSError:  # pragma: no cover
        return False
    return True


class CheckpointManager:
    """Atomic checkpoints under ``root`` keeping the last ``keep_last`` plus the best by metric.

    Args:
        root: directory holding ``step-XXXXXXXX`` checkpoint dirs (created on first save).
        keep_last: number of most recent checkpoints kept (``None``: keep all).
        keep_best: also keep the checkpoint with the best ``metric`` ("max" or "min" per ``best_mode``).
        best_mode: ``"max"`` or ``"min"``.
        check_hashes: verify sha256 on load (sizes are always checked).
        prefix: folder name prefix of the checkpoints (``<prefix>-XXXXXXXX``): what the number counts.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        keep_last: int | None = 3,
        keep_best: bool = True,
        best_mode: str = "max",
        check_hashes: bool = True,
        prefix: str = "step",
    ):
        if not re.fullmatch(r"[a-z]+", prefix):
            raise ValueError(f"the checkpoint prefix must be lowercase letters, got {prefix!r}")
        self.prefix = prefix
        self._dir_re = re.compile(rf"^({prefix})-(\d{{8,}})$")
        if best_mode not in ("max", "min"):
            raise ValueError(f"best_mode must be 'max' or 'min', got {best_mode!r}")
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 or None, got {keep_last}")
        self.root = Path(root)
        self.keep_last = keep_last
        self.keep_best = keep_best
        self.best_mode = best_mode
        self.check_hashes = check_hashes

    # ----------------------------------------------------------------------------------------------- listing
    def step_dir(self, step: int) -> Path:
        return self.root / f"{self.prefix}-{int(step):08d}"

    def list_checkpoints(self) -> list[tuple[int, Path]]:
        """``(step, path)`` of every ``<prefix>-*`` directory (valid or not), oldest first."""
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            m = self._dir_re.match(p.name)
            if m and p.is_dir():
                out.append((int(m.group(2)), p))
        return sorted(out)

    def clean_stale_tmp(self) -> list[Path]:
        """Delete ``.tmp-*`` dirs left by processes that no longer exist (a live writer's dir is left alone)."""
        removed = []
        if not self.root.is_dir():
            return removed
        host = socket.gethostname()
        for p in self.root.iterdir():
            m = _TMP_RE.match(p.name)
            if not m or not p.is_dir() or int(m.group(1)) == os.getpid():
                continue
            try:
                writer_host = (p / _WRITER_FILE).read_text(encoding="utf-8").strip()
            except OSError:
                writer_host = host  # renamed-for-deletion dirs and very old dirs carry no writer file
            if writer_host == host:
                if _pid_alive(int(m.group(1))):
                    continue
            elif time.time() - p.stat().st_mtime < _FOREIGN_TMP_MAX_AGE:
                # A writer on another host (shared file system): its pid means nothing here; only age tells.
                continue
            logger.info("removing stale partial checkpoint %s", p)
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
        return removed

    # ----------------------------------------------------------------------------------------------- saving
    @names_write_errors("checkpoint", lambda self, step, *a, **k: self.step_dir(step))  # disk full: name the path
    def save(
        self,
        step: int,
        state: Mapping[str, Any],
        metric: float | None = None,
        extra_files: Mapping[str, Callable[[Path], Any]] | None = None,
    ) -> Path:
        """Atomically write checkpoint ``step``; returns its directory ``root/step-XXXXXXXX``.

        Each ``state[key]`` goes to ``<key>.pt`` (torch.save). ``extra_files[name](path)`` must write the file or
        directory ``path`` (= ``<tmpdir>/<name>``), e.g. ``lambda p: model.save_pretrained(p)``. An existing
        checkpoint of the same step is replaced. Retention runs afterwards and never deletes this checkpoint.
        """
        import torch

        step = int(step)
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        extra_files = dict(extra_files or {})
        names = list(state) + list(extra_files)
        for name in names:
            if not isinstance(name, str) or not _ENTRY_RE.match(name) or name == MANIFEST_NAME:
                raise ValueError(f"invalid checkpoint entry name {name!r} (use letters, digits, _ . -)")
        files = [f"{k}.pt" for k in state] + list(extra_files)
        if len(set(files)) != len(files):
            raise ValueError(f"checkpoint entry names collide: {files}")
        if metric is not None:
            metric = float(metric)
            if not math.isfinite(metric):
                logger.warning("checkpoint step %d: non-finite metric %r recorded as null", step, metric)
                metric = None

        self.root.mkdir(parents=True, exist_ok=True)
        self.clean_stale_tmp()
        tmp = self.root / f".tmp-{self.prefix}-{step:08d}-{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        try:
            (tmp / _WRITER_FILE).write_text(socket.gethostname(), encoding="utf-8")
            for key, value in state.items():
                torch.save(value, tmp / f"{key}.pt")
            for name, writer in extra_files.items():
                writer(tmp / name)
                if not (tmp / name).exists():
                    raise RuntimeError(f"extra_files[{name!r}] did not create {tmp / name}")
            (tmp / _WRITER_FILE).unlink()
            file_info = {}
            for f in _files_under(tmp):
                _fsync_file(f)
                file_info[f.relative_to(tmp).as_posix()] = {"size": f.stat().st_size, "sha256": _sha256(f)}
            for d in sorted({f.parent for f in _files_under(tmp)}, key=lambda p: len(p.parts), reverse=True):
                fsync_dir(d)
            manifest = {
                "format": FORMAT_VERSION,
                "step": step,
                "metric": metric,
                "time": time.time(),
                "entries": list(state),
                "extra_files": list(extra_files),
                "files": file_info,
            }
            atomic_write_text(tmp / MANIFEST_NAME, json.dumps(manifest, indent=1))
            final = self.step_dir(step)
            if final.exists():  # re-saving a step: move the old one out of the way first
                trash = self.root / f".tmp-replaced-{final.name}-{os.getpid()}"
                shutil.rmtree(trash, ignore_errors=True)
                os.rename(final, trash)
                os.rename(tmp, final)
                shutil.rmtree(trash, ignore_errors=True)
            else:
                os.rename(tmp, final)
            fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        logger.info("saved checkpoint %s (metric=%s)", final, metric)
        self._apply_retention(protect=final)
        return final

    def _read_manifest(self, path: Path) -> dict | None:
        try:
            m = json.loads((path / MANIFEST_NAME).read_text(encoding="utf-8"))
            return m if isinstance(m, dict) else None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            return None

    def best_checkpoint(self) -> Path | None:
        """Checkpoint dir with the best recorded metric (ties: the later step), or None."""
        best: tuple[float, int, Path] | None = None
        for step, p in self.list_checkpoints():
            m = self._read_manifest(p)
            if not m or m.get("metric") is None:
                continue
            val = float(m["metric"])
            score = val if self.best_mode == "max" else -val
            if best is None or (score, step) >= (best[0], best[1]):
                best = (score, step, p)
        return best[2] if best else None

    def _apply_retention(self, protect: Path) -> None:
        if self.keep_last is None:
            return
        ckpts = [(s, p) for s, p in self.list_checkpoints() if (p / MANIFEST_NAME).is_file()]
        keep = {p for _, p in ckpts[-self.keep_last :]}
        keep.add(protect)
        if self.keep_best:
            best = self.best_checkpoint()
            if best is not None:
                keep.add(best)
        for _, p in ckpts:
            if p in keep:
                continue
            # Rename first so a crash mid-delete never leaves a half-deleted dir that looks like a checkpoint.
            trash = self.root / f".tmp-delete-{p.name}-{os.getpid()}"
            try:
                os.rename(p, trash)
            except OSError as exc:
                logger.warning("retention: could not remove %s: %s", p, exc)
                continue
            shutil.rmtree(trash, ignore_errors=True)
            logger.info("retention: removed %s", p)

    # ----------------------------------------------------------------------------------------------- loading
    def verify(self, path: str | os.PathLike) -> dict:
        """Manifest of ``path`` if it verifies, else :class:`CheckpointError`."""
        return verify_checkpoint(path, check_hashes=self.check_hashes)

    def load(self, path: str | os.PathLike, map_location: Any = "cpu", verify: bool = True) -> dict[str, Any]:
        """Verify checkpoint ``path`` and load its entries: ``{key: torch.load(<key>.pt, weights_only=True)}``.
        A file that needs more than tensors and plain data raises :class:`UnsafeCheckpointError`."""
        path = Path(path)
        manifest = self.verify(path) if verify else (self._read_manifest(path) or {})
        state = {}
        for key in manifest.get("entries", []):
            f = path / f"{key}.pt"
            try:
                state[key] = safe_torch_load(f, map_location=map_location)
            except UnsafeCheckpointError:
                raise
            except Exception as exc:  # unpickling errors come in many types
                raise CheckpointError(f"checkpoint {path}: cannot load {f.name}: {type(exc).__name__}: {exc}") from exc
        return state

    def latest_valid(self) -> Path | None:
        """Newest checkpoint dir whose manifest verifies (invalid ones are logged and skipped)."""
        self.clean_stale_tmp()
        for _, p in reversed(self.list_checkpoints()):
            try:
                self.verify(p)
                return p
            except CheckpointError as exc:
                logger.warning("skipping invalid checkpoint: %s", exc)
        return None

    def load_latest(self, map_location: Any = "cpu") -> tuple[dict[str, Any] | None, Path | None]:
        """``(state, path)`` of the newest checkpoint that verifies and loads; ``(None, None)`` if there is none.

        Corrupt or incomplete checkpoints are logged (logger ``mmgrpo.checkpoint``) and skipped; stale temp dirs
        of killed writers are ignored and removed.
        """
        self.clean_stale_tmp()
        for _, p in reversed(self.list_checkpoints()):
            try:
                return self.load(p, map_location=map_location), p
            except UnsafeCheckpointError:
                raise  # an alarm, not damage: never fall back silently
            except CheckpointError as exc:
                logger.warning("skipping invalid checkpoint: %s", exc)
        return None, None

    def resolve(self, resume_from: str | os.PathLike | None) -> Path | None:
        """``resume_from`` semantics: ``"auto"`` -> latest valid checkpoint under ``root`` or None;
        ``None``/``""``/``"none"`` -> None; a path -> that checkpoint (verified) or, if it is a directory of
        checkpoint folders, its latest valid one. Raises :class:`CheckpointError` naming the problem."""
        if resume_from is None:
            return None
        s = str(resume_from).strip()
        if s.lower() in ("", "none", "null", "false", "no"):
            return None
        if s.lower() in ("auto", "latest"):
            return self.latest_valid()
        p = Path(s).expanduser()
        if not p.exists():
            raise CheckpointError(f"resume_from={s!r}: path does not exist")
        if p.is_dir() and not (p / MANIFEST_NAME).exists():
            # a folder of checkpoints: its own kind (the flow trainer's halted/ folder holds step-* ones)
            kinds = {m.group(1) for c in p.iterdir() if (m := re.match(r"^([a-z]+)-\d{8,}$", c.name))}
            kind = self.prefix if self.prefix in kinds or len(kinds) != 1 else kinds.pop()
            sub = CheckpointManager(p, keep_last=None, check_hashes=self.check_hashes, prefix=kind)
            if sub.list_checkpoints():
                found = sub.latest_valid()
                if found is None:
                    raise CheckpointError(f"resume_from={s!r}: no valid checkpoint in this directory")
                return found
        try:
            self.verify(p)
        except CheckpointError as exc:
            raise CheckpointError(f"resume_from={s!r}: {exc}") from None
        return p


# --------------------------------------------------------------------------------------------------- RNG state
def capture_rng_state() -> dict[str, Any]:
    """States of python ``random``, numpy's global RNG, torch CPU and (if available) every CUDA device."""
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state` (CUDA states restored for the devices present, with a warning if
    the device count differs)."""
    import numpy as np
    import torch

    if "python" in state:
        py = state["python"]
        if isinstance(py, list):  # JSON/pickle round trips may turn the tuple into a list
            py = (py[0], tuple(py[1]), py[2])
        random.setstate(py)
    if "numpy" in state:
        np.random.set_state(state["numpy"])
    if "torch" in state:
        t = state["torch"]
        torch.set_rng_state(t if isinstance(t, torch.Tensor) else torch.as_tensor(t, dtype=torch.uint8))
    if "cuda" in state and state["cuda"] is not None:
        if not torch.cuda.is_available():
            logger.warning("checkpoint has CUDA RNG states but CUDA is not available: not restored")
            return
        cuda_states = list(state["cuda"])
        n = torch.cuda.device_count()
        if len(cuda_states) != n:
            logger.warning("CUDA RNG states for %d devices, %d present: restoring the first %d",
                           len(cuda_states), n, min(n, len(cuda_states)))
        for i, s in enumerate(cuda_states[:n]):
            torch.cuda.set_rng_state(s, device=i)
