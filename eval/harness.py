"""Shared pieces of the generation harness (``eval/generate_vlm.py``, ``eval/generate_t2i.py``).

* :class:`ResumableJsonl` -- an append-only JSONL results file that survives being killed: rows are written one
  batch per ``write`` call and flushed + fsynced; on restart a torn last line is truncated away and the keys already
  written are skipped.  Generators work on **fixed batches** (batch ``b`` = items ``b*B .. b*B+B-1`` of the full
  list, whatever is already done) and regenerate a whole batch when any of its items is missing, so batch
  composition -- which changes low-order bits of batched matmuls -- is the same in an interrupted and an
  uninterrupted run, and both produce byte-identical files.
* :func:`fingerprint_dir` -- what identifies a model folder: sha256 of every small file (configs, tokenizer, chat
  template) and of the weight files (fully, or sampled: size + evenly spaced 64 KiB chunks, for 15 GB checkpoints).
* :func:`check_resume` -- refuses to append to a run whose recorded settings differ (mixing two settings in one
  predictions file would give a number that belongs to neither).
* :func:`library_versions`, :func:`git_info`, :func:`sha256_file`, :func:`write_json`.

Pure python (no torch at import time).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

__all__ = [
    "ResumableJsonl",
    "ResumeError",
    "sha256_file",
    "fingerprint_file",
    "fingerprint_dir",
    "settings_fingerprint",
    "NON_FINGERPRINT",
    "check_resume",
    "library_versions",
    "git_info",
    "write_json",
    "flatten",
    "fixed_batches",
    "mean_std",
]

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".msgpack", ".h5")
_SMALL_FILE = 64 << 20  # non-weight files above 64 MiB are treated like weights (sampled hash)


class ResumeError(RuntimeError):
    """An existing run directory cannot be continued with the current settings."""


# ------------------------------------------------------------------------------------------------ hashing
def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def fingerprint_file(path: str | os.PathLike, mode: str = "sampled", n_chunks: int = 64,
                     chunk_size: int = 1 << 16) -> dict:
    """``{"size", "sha256"}`` (whole file) or ``{"size", "sampled_sha256"}``.

    ``mode="sampled"``: files up to ``n_chunks * chunk_size`` bytes are hashed whole; bigger ones hash their size
    and ``n_chunks`` chunks at offsets ``round(i * (size - chunk_size) / (n_chunks - 1))``.  A fine-tuned or
    LoRA-merged checkpoint changes (almost) every tensor, so the sample catches it; use ``"full"`` to be certain.
    ``mode="none"``: size only.
    """
    if mode not in ("full", "sampled", "none"):
        raise ValueError(f"hash mode must be full | sampled | none, got {mode!r}")
    size = os.path.getsize(path)
    if mode == "none":
        return {"size": size}
    if mode == "full" or size <= n_chunks * chunk_size:
        return {"size": size, "sha256": sha256_file(path)}
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        for i in range(n_chunks):
            f.seek(round(i * (size - chunk_size) / (n_chunks - 1)))
            h.update(f.read(chunk_size))
    return {"size": size, "sampled_sha256": h.hexdigest()}


def fingerprint_dir(path: str | os.PathLike, weights: str = "sampled") -> dict:
    """Fingerprint of a model / pipeline folder (recursive, hidden entries skipped).

    Returns ``{"path", "digest", "weights_hash", "config_sha256", "files": {relpath: fingerprint_file(...)}}``;
    ``digest`` = sha256 over the sorted file table (any change of any file changes it); ``config_sha256`` is the
    hash of ``config.json`` / ``model_index.json`` / ``adapter_config.json`` when present.  Small files are always
    hashed whole; weight files follow ``weights`` (full | sampled | none).
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"model folder not found: {root}")
    files: dict[str, dict] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if any(part.startswith(".") for part in rel.parts) or not p.is_file():
            continue
        heavy = p.name.endswith(WEIGHT_SUFFIXES) or p.stat().st_size > _SMALL_FILE
        files[rel.as_posix()] = fingerprint_file(p, weights if heavy else "full")
    cfg_sha = None
    for name in ("config.json", "model_index.json", "adapter_config.json"):
        if name in files:
            cfg_sha = files[name].get("sha256")
            break
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return {"path": str(root.resolve()), "digest": digest, "weights_hash": weights, "config_sha256": cfg_sha,
            "files": files}


# ------------------------------------------------------------------------------------------------ settings
def _canonical(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _canonical(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_canonical(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


# recorded but not part of the fingerprint: run bookkeeping, and the git commit (other people's commits land all the
# time; the things code changes would alter -- rendered prompts, processor settings, library versions -- are hashed)
NON_FINGERPRINT = ("fingerprint", "run", "code")


def settings_fingerprint(settings: Mapping[str, Any], exclude: Iterable[str] = NON_FINGERPRINT) -> str:
    """sha256 of the settings (sorted JSON) without the ``exclude`` top-level keys (see ``NON_FINGERPRINT``)."""
    ex = set(exclude)
    body = {k: v for k, v in settings.items() if k not in ex}
    return hashlib.sha256(json.dumps(_canonical(body), sort_keys=True, default=str).encode()).hexdigest()


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists are kept as values)."""
    out: dict[str, Any] = {}
    if isinstance(d, Mapping):
        for k, v in d.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, Mapping) and v:
                out.update(flatten(v, key))
            else:
                out[key] = v
    else:
        out[prefix] = d
    return out


def check_resume(out_dir: str | os.PathLike, settings: Mapping[str, Any], results_name: str) -> None:
    """Raise :class:`ResumeError` if ``out_dir`` holds results made with different settings.

    A results file without ``settings.json`` is refused too (its settings are unknown).  Use ``overwrite=true``
    to start over."""
    out = Path(out_dir)
    res = out / results_name
    sp = out / "settings.json"
    if not res.exists() or res.stat().st_size == 0:
        return
    if not sp.exists():
        raise ResumeError(f"{res} exists but {sp} does not: cannot tell which settings produced it; "
                          "pass overwrite=true to start over or use another out_dir")
    try:
        old = json.loads(sp.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ResumeError(f"{sp}: invalid JSON ({e.msg}); pass overwrite=true to start over") from None
    if old.get("fingerprint") == settings.get("fingerprint"):
        if old.get("code") != settings.get("code"):
            import logging

            logging.getLogger("mmgrpo.eval").warning(
                "%s: resuming at git commit %s (started at %s)", out, (settings.get("code") or {}).get("commit"),
                (old.get("code") or {}).get("commit"))
        return
    a = flatten({k: v for k, v in old.items() if k not in NON_FINGERPRINT})
    # compare as saved: tuples become lists, numpy scalars numbers (else equal values are listed as changed)
    now = json.loads(json.dumps({k: v for k, v in settings.items() if k not in NON_FINGERPRINT}, default=str))
    b = flatten(now)
    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    shown = "; ".join(f"{k}: {_short(a.get(k))} -> {_short(b.get(k))}" for k in diff[:8])
    more = f" (+{len(diff) - 8} more)" if len(diff) > 8 else ""
    raise ResumeError(f"{out} was started with different settings ({shown}{more}); resuming would mix them in "
                      f"{results_name}. Pass overwrite=true to start over or use another out_dir")


def _short(v: Any, n: int = 60) -> str:
    s = json.dumps(v, default=str) if not isinstance(v, str) else v
    return s if len(s) <= n else s[: n - 3] + "..."


def library_versions(names: Sequence[str]) -> dict[str, str | None]:
    """Installed versions (``importlib.metadata``; None if absent) plus the Python version."""
    from importlib import metadata

    out: dict[str, str | None] = {"python": sys.version.split()[0]}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[n] = None
    return out


def git_info(path: str | os.PathLike | None = None) -> dict:
    """``{"commit", "dirty"}`` of the repository holding ``path`` (None values outside a git checkout)."""
    cwd = os.fspath(path) if path is not None else str(Path(__file__).resolve().parents[1])
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                                timeout=10).stdout.strip() or None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                capture_output=True, text=True, timeout=10)
        dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": dirty}


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Atomic JSON write (NaN/inf are rejected: they would be silent wrong numbers downstream)."""
    from mmgrpo.utils.checkpoint import atomic_write_text

    return atomic_write_text(path, json.dumps(obj, indent=2, allow_nan=False, default=str) + "\n")


# ------------------------------------------------------------------------------------------------ results
class ResumableJsonl:
    """Append-only JSONL keyed by ``key``; see the module docstring.

    ``open()`` reads what exists: a last line that is cut off (no trailing newline, or not valid JSON) is
    truncated away (``n_truncated_bytes``); a malformed line *before* the last one, a non-object, a missing or
    duplicate key raise ``ValueError`` naming file and line -- that is damage, not an interrupted write.
    """

    def __init__(self, path: str | os.PathLike, key: str = "id"):
        self.path = Path(path)
        self.key = key
        self.rows: list[dict] = []
        self.done: set[str] = set()
        self.n_truncated_bytes = 0

    def open(self) -> "ResumableJsonl":
        self.rows, self.done = [], set()
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
            return self
        data = self.path.read_bytes()
        keep = len(data)
        lines = data.split(b"\n")
        # data ends with b"\n" -> the last element is b"" (complete); otherwise it is a torn line
        if lines and lines[-1] != b"":
            keep -= len(lines[-1])
            lines = lines[:-1]
        else:
            lines = lines[:-1]
        offsets = []
        pos = 0
        for ln in lines:
            offsets.append(pos)
            pos += len(ln) + 1
        for i, ln in enumerate(lines):
            if not ln.strip():
                continue
            where = f"{self.path}:{i + 1}"
            try:
                row = json.loads(ln.decode("utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                if i == len(lines) - 1:  # a complete-looking but broken last line: also an interrupted write
                    keep = offsets[i]
                    break
                raise ValueError(f"{where}: malformed JSON line ({e}); the file is damaged, not just interrupted") \
                    from None
            if not isinstance(row, dict) or row.get(self.key) is None:
                raise ValueError(f"{where}: expected a JSON object with field {self.key!r}")
            k = str(row[self.key])
            if k in self.done:
                raise ValueError(f"{where}: duplicate {self.key} {k!r}")
            self.rows.append(row)
            self.done.add(k)
        if keep < len(data):
            self.n_truncated_bytes = len(data) - keep
            with open(self.path, "r+b") as f:
                f.truncate(keep)
                f.flush()
                os.fsync(f.fileno())
        return self

    def append(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """Write ``rows`` in ONE write call, then flush and fsync (a kill leaves at most one torn line)."""
        if not rows:
            return
        text = "".join(json.dumps(dict(r), ensure_ascii=False, allow_nan=False) + "\n" for r in rows)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        for r in rows:
            self.rows.append(dict(r))
            self.done.add(str(r[self.key]))


def fixed_batches(n: int, batch_size: int) -> list[range]:
    """Index ranges of the fixed batches over ``n`` items (the last one may be short)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return [range(s, min(n, s + batch_size)) for s in range(0, n, batch_size)]


def mean_std(values: Sequence[float]) -> dict:
    """``{"mean", "std", "min", "max", "n"}``; std is the population std sqrt(mean((x - mean)^2)); None if empty."""
    xs = [float(v) for v in values]
    n = len(xs)
    if n == 0:
        return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
    m = math.fsum(xs) / n
    var = math.fsum((x - m) ** 2 for x in xs) / n
    return {"mean": m, "std": math.sqrt(var), "min": min(xs), "max": max(xs), "n": n}
