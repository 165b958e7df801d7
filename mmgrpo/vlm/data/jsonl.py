"""Load / write canonical JSONL files with per-line error reporting."""
from __future__ import annotations

import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

from mmgrpo.utils.json_records import JSONRecordError, parse_record

from .schema import DataError, Sample

logger = logging.getLogger("mmgrpo.data")

_MAX_LOGGED = 20  # individual skip messages; the rest are only counted


@dataclass
class LoadReport:
    """What happened while loading one file.

    ``errors`` holds every problem (as :class:`DataError`, with file, line, id and field); ``counts`` tallies them
    by kind (malformed_json, not_utf8, missing_field, unknown_field, unknown_task, empty_query, reversed_span,
    span_out_of_range, bad_span, bad_box, duplicate_id, missing_media, invalid).
    """

    path: str
    n_lines: int = 0
    n_loaded: int = 0
    n_skipped: int = 0
    n_swapped_spans: int = 0
    errors: list = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    missing_media: list = field(default_factory=list)
    lines: dict = field(default_factory=dict)  # sample id -> line of the loaded samples (messages of later checks)

    def add(self, e: DataError) -> None:
        self.errors.append(e)
        self.counts[e.kind] += 1

    def summary(self) -> str:
        s = f"{self.path}: {self.n_loaded} loaded, {self.n_skipped} skipped of {self.n_lines} non-empty lines"
        if self.counts:
            s += " (" + ", ".join(f"{k}: {v}" for k, v in sorted(self.counts.items())) + ")"
        if self.n_swapped_spans:
            s += f"; {self.n_swapped_spans} reversed span(s) swapped"
        return s

    __str__ = summary


def resolve_media(value: str, root: str | os.PathLike | None, base_dir: str) -> str:
    """Absolute path of a media reference: ``file://`` stripped; relative paths join ``root`` (or the JSONL's
    directory when root is None); absolute paths are kept."""
    v = value[len("file://"):] if value.startswith("file://") else value
    if os.path.isabs(v) or "://" in v:
        return v
    return os.path.abspath(os.path.join(os.fspath(root) if root is not None else base_dir, v))


def load_jsonl(
    path: str | os.PathLike,
    root: str | os.PathLike | None = None,
    on_error: str = "raise",
    check_media: bool = True,
    swap_reversed: bool = False,
    resolve_paths: bool = True,
) -> tuple[list[Sample], LoadReport]:
    """Read a canonical JSONL file into validated :class:`Sample` objects.

    Args:
        path: the JSONL file (UTF-8; blank lines are ignored).
        root: directory that relative ``video`` / ``image`` paths are relative to (default: the file's directory).
        on_error: "raise" -> the first problem raises :class:`DataError` naming file, line, id and field;
            "skip" -> the bad line is dropped, counted in the report and logged.
        check_media: check that every video / image file exists.  All missing files are found in one pass,
            before training starts: with "raise" a single DataError lists them all; with "skip" those samples
            are dropped and counted (kind ``missing_media``).
        swap_reversed: swap reversed spans instead of rejecting them (counted in ``report.n_swapped_spans``).
        resolve_paths: store absolute media paths in the returned samples.

    Returns:
        ``(samples, report)``.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    path = os.fspath(path)
    report = LoadReport(path=path)
    base_dir = os.path.dirname(os.path.abspath(path))
    if not os.path.isfile(path):
        raise DataError("file not found", path=path, kind="missing_file")

    def problem(e: DataError) -> None:
        report.add(e)
        report.n_skipped += 1
        if on_error == "raise":
            raise e
        if len(report.errors) <= _MAX_LOGGED:
            logger.warning("skipping: %s", e)
        elif len(report.errors) == _MAX_LOGGED + 1:
            logger.warning("%s: more problems; only counting from now on", path)

    samples: list[tuple[int, Sample]] = []
    seen: dict[str, int] = {}
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as ex:
                report.n_lines += 1
                problem(DataError(f"not valid UTF-8 ({ex.reason} at byte {ex.start})", path, lineno,
                                  kind="not_utf8"))
                continue
            if not text.strip():
                continue
            report.n_lines += 1
            try:  # malformed, nested too deeply, or a number Python will not read: one counted kind
                obj = parse_record(text)
            except JSONRecordError as ex:
                problem(DataError(ex.reason, path, lineno, kind="malformed_json"))
                continue
            try:
                s = Sample.from_dict(obj)
                s.validate(swap_reversed=swap_reversed)
            except DataError as ex:
                problem(ex.located(path, lineno))
                continue
            except (TypeError, ValueError, ArithmeticError) as ex:  # wrong value types the dataclass rejects, ...
                problem(DataError(f"{type(ex).__name__}: {ex}", path, lineno, kind="invalid"))
                continue
            if s.id in seen:
                problem(DataError(f"duplicate id (first seen on line {seen[s.id]})", path, lineno, "id", s.id,
                                  kind="duplicate_id"))
                continue
            seen[s.id] = lineno
            report.n_swapped_spans += int(s.meta.get("swapped_spans", 0))
            if resolve_paths:
                if s.video is not None:
                    s.video = resolve_media(s.video, root, base_dir)
                if s.image is not None:
                    s.image = resolve_media(s.image, root, base_dir)
            samples.append((lineno, s))

    if check_media:
        missing = []
        for lineno, s in samples:
            m = s.media if resolve_paths else (resolve_media(s.media, root, base_dir) if s.media else None)
            if m is not None and not os.path.isfile(m):
                missing.append((lineno, s, m))
        if missing:
            report.missing_media = [m for _, _, m in missing]
            report.counts["missing_media"] += len(missing)
            listing = "\n".join(f"  {path}:{ln} id={s.id!r} {'video' if s.video else 'image'}: {m}"
                                for ln, s, m in missing[:50])
            more = f"\n  ... and {len(missing) - 50} more" if len(missing) > 50 else ""
            msg = f"{len(missing)} of {len(samples)} sample(s) reference missing media files:\n{listing}{more}"
            if on_error == "raise":
                e = DataError(msg, path, missing[0][0], "video" if missing[0][1].video else "image",
                              kind="missing_media")
                report.add(e)
                raise e
            logger.warning("%s: skipping %s", path, msg)
            drop = {id(s) for _, s, _ in missing}
            for ln, s, m in missing:
                report.errors.append(DataError(f"media file not found: {m}", path, ln,
                                               "video" if s.video else "image", s.id, kind="missing_media"))
            report.n_skipped += len(missing)
            samples = [(ln, s) for ln, s in samples if id(s) not in drop]

    report.n_loaded = len(samples)
    report.lines = {s.id: ln for ln, s in samples}
    if report.n_skipped:
        logger.warning(report.summary())
    return [s for _, s in samples], report


def write_jsonl(samples: Iterable[Sample | dict], path: str | os.PathLike, validate: bool = True) -> int:
    """Write samples (validated unless ``validate=False``) one JSON object per line, UTF-8; returns the count."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    n = 0
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        for s in samples:
            if isinstance(s, dict):
                s = Sample.from_dict(s)
            if validate:
                s.validate()
            fh.write(json.dumps(s.to_dict(), ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n
