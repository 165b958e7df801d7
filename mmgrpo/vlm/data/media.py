"""Media screening when the data is loaded (before the model, before step 1): every video / image a sample names is
checked at the header level (:mod:`mmgrpo.utils.media_check`), and a video's duration is compared with the
annotation's. Problems are skipped and counted, or refused in one error listing ``file:line id field: reason``,
per the data config's policies, so that a file the run cannot use never crashes it mid-run (and again on every
resume).

Kinds and the policy that decides each (``data.*``):

==========================  ====================================================  ==========================
kind                        what                                                  policy
==========================  ====================================================  ==========================
``missing_media``           the file does not exist                               ``on_missing_media``
``unreadable_media``        not an image / video, corrupt header, PNG CRC error    ``on_missing_media``
``media_too_large``         image over ``max_image_pixels`` / video frames over    ``on_missing_media``
                            ``max_video_frame_pixels`` (the decode cap)
``duration_mismatch``       annotated duration vs the video's (below)             ``on_duration_mismatch``
==========================  ====================================================  ==========================

Duration rule: the video's duration is its container header's; the annotation ``d_a`` and the video ``d_v`` disagree
when ``|d_a - d_v| > max(duration_tolerance, duration_tolerance_frac * d_v)`` (defaults 2 s and 5 %: re-encodes and
annotation tools differ by a frame or two, ActivityNet-style re-downloads by a few seconds). A sample with a clip
(``video_start`` / ``video_end``) is flagged only when its annotation is *longer* than the video: for clips the
duration may be a lower bound of the source's length (Time-R1 ``--timerft-videos source``). A video whose header has
no duration is not compared. ``on_duration_mismatch``: ``skip`` (training default: a span measured on another
timeline teaches wrong times, and the reward scores against it), ``warn`` (evaluation default: every sample stays
scored, the mismatches are counted and listed), ``error`` (refuse before loading the model).

Each distinct file is checked once (many samples share a video), in a thread pool. ``media_check=exists`` restores
the old existence-only check (for very large datasets whose media are known good; run-time skips still apply).
"""
from __future__ import annotations

import logging
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from mmgrpo.utils.media_check import DEFAULT_MAX_IMAGE_PIXELS, MediaProblem, inspect_image, inspect_video

from mmgrpo.engine.errors import NothingTrained

from .schema import DataError


class NoSamplesLeft(DataError, NothingTrained):
    """Every sample was dropped by the media check: nothing can be trained (the CLIs exit 4, as for a run whose
    every step was skipped)."""

logger = logging.getLogger("mmgrpo.data")

KIND_OF_PROBLEM = {"missing": "missing_media", "unreadable": "unreadable_media", "too_large": "media_too_large"}
_MAX_LISTED = 50

__all__ = ["MediaScreen", "MediaReport", "screen_samples", "durations_disagree"]


@dataclass(frozen=True)
class MediaScreen:
    """Settings of :func:`screen_samples` (``MediaScreen.from_config(data_cfg)`` reads the ``data`` section)."""

    check: str = "header"                  # "header" | "exists"
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_video_frame_pixels: int = 7680 * 4320
    duration_tolerance: float = 2.0        # seconds
    duration_tolerance_frac: float = 0.05  # of the video's duration
    on_missing_media: str = "skip"         # "skip" | "error" (also unreadable / too large media)
    on_duration_mismatch: str = "skip"     # "skip" | "warn" | "error"
    drop: bool = True                      # False: unusable media under "skip" are counted and kept (eval writes
    #                                        their output null); duration skips still drop
    workers: int = 8

    def __post_init__(self):
        if self.check not in ("header", "exists"):
            raise ValueError(f"data.media_check must be 'header' or 'exists', got {self.check!r}")
        if self.on_missing_media not in ("skip", "error"):
            raise ValueError(f"data.on_missing_media must be 'skip' or 'error', got {self.on_missing_media!r}")
        if self.on_duration_mismatch not in ("skip", "warn", "error"):
            raise ValueError(f"data.on_duration_mismatch must be 'skip', 'warn' or 'error', got "
                             f"{self.on_duration_mismatch!r}")
        if self.duration_tolerance < 0 or self.duration_tolerance_frac < 0:
            raise ValueError("data.duration_tolerance and data.duration_tolerance_frac must be >= 0")

    @classmethod
    def from_config(cls, d: Any, **overrides) -> "MediaScreen":
        """From a data config section (``mmgrpo.vlm.config.DataConfig`` or eval's); missing fields keep the
        defaults."""
        kw = {}
        for name, key in (("check", "media_check"), ("max_image_pixels", "max_image_pixels"),
                          ("max_video_frame_pixels", "max_video_frame_pixels"),
                          ("duration_tolerance", "duration_tolerance"),
                          ("duration_tolerance_frac", "duration_tolerance_frac"),
                          ("on_missing_media", "on_missing_media"), ("on_duration_mismatch", "on_duration_mismatch"),
                          ("workers", "media_check_workers")):
            if hasattr(d, key):
                kw[name] = getattr(d, key)
        kw.update(overrides)
        return cls(**kw)


@dataclass
class MediaReport:
    """What :func:`screen_samples` found: ``counts`` by kind, ``problems`` (DataError with file, line, id, field),
    ``dropped`` samples, distinct files checked and the time it took."""

    source: str
    n_samples: int = 0
    n_files: int = 0
    n_dropped: int = 0
    seconds: float = 0.0
    counts: Counter = field(default_factory=Counter)
    problems: list = field(default_factory=list)

    def summary(self) -> str:
        s = (f"{self.source}: media checked ({self.n_files} files of {self.n_samples} samples in "
             f"{self.seconds:.1f} s)")
        if self.counts:
            s += ": " + ", ".join(f"{k}: {v}" for k, v in sorted(self.counts.items()))
            s += f"; {self.n_dropped} sample(s) dropped" if self.n_dropped else "; no sample dropped"
        return s

    __str__ = summary


def durations_disagree(annotated: float, video: float, tol: float, frac: float, clipped: bool = False) -> bool:
    """The module docstring's rule: ``|d_a - d_v| > max(tol, frac * d_v)``; for a clipped sample only when the
    annotation is the longer one."""
    limit = max(tol, frac * video)
    return annotated - video > limit if clipped else abs(annotated - video) > limit


def _get(s: Any, k: str) -> Any:
    return s.get(k) if isinstance(s, Mapping) else getattr(s, k, None)


def _inspect(path: str, is_video: bool, screen: MediaScreen):
    """(header or None, MediaProblem or None) of one file."""
    try:
        if screen.check == "exists":
            if not os.path.isfile(path):
                raise MediaProblem(path, "missing", "file not found")
            return None, None
        if is_video:
            return inspect_video(path, screen.max_video_frame_pixels), None
        return inspect_image(path, screen.max_image_pixels), None
    except MediaProblem as e:
        return None, e


def screen_samples(samples: Sequence[Any], screen: MediaScreen, source: str = "",
                   lines: Optional[Mapping[str, int]] = None, media_root: str = "") -> tuple[list, MediaReport]:
    """Check the media of ``samples`` (module docstring); returns the kept samples and the report. Raises one
    :class:`DataError` listing every problem of a policy that says ``error``, and when no sample is left.
    ``lines``: sample id -> line of ``source`` (``LoadReport.lines``); ``media_root``: prefix of relative paths."""
    t0 = time.perf_counter()
    rep = MediaReport(source=source, n_samples=len(samples))
    lines = lines or {}

    def path_of(s) -> tuple[Optional[str], bool]:
        v, im = _get(s, "video"), _get(s, "image")
        p = v if v is not None else im
        if not isinstance(p, (str, os.PathLike)):
            return None, v is not None  # in-memory frames / images: nothing to check
        p = os.fspath(p)
        p = p[len("file://"):] if p.startswith("file://") else p
        if media_root and not os.path.isabs(p):
            p = os.path.join(media_root, p)
        return p, v is not None

    wanted = {}
    for s in samples:
        p, is_video = path_of(s)
        if p is not None:
            wanted.setdefault(p, is_video)
    rep.n_files = len(wanted)
    with ThreadPoolExecutor(max_workers=max(1, min(screen.workers, len(wanted) or 1))) as ex:
        found = dict(zip(wanted, ex.map(lambda kv: _inspect(kv[0], kv[1], screen), wanted.items())))

    kept, errors = [], []
    for s in samples:
        p, _ = path_of(s)
        if p is None:
            kept.append(s)
            continue
        head, prob = found[p]
        sid = _get(s, "id")
        where = dict(path=source or None, line=lines.get(sid), sample_id=None if sid is None else str(sid))
        fieldname = "video" if _get(s, "video") is not None else "image"
        problem, policy = None, None
        if prob is not None:
            problem = DataError(prob.reason + f" ({prob.path})", field=fieldname, kind=KIND_OF_PROBLEM[prob.kind],
                                **where)
            policy = screen.on_missing_media
        elif head is not None and fieldname == "video" and getattr(head, "duration", 0) > 0 \
                and _get(s, "duration") is not None:
            d_a, d_v = float(_get(s, "duration")), float(head.duration)
            clipped = _get(s, "video_start") is not None or _get(s, "video_end") is not None
            if durations_disagree(d_a, d_v, screen.duration_tolerance, screen.duration_tolerance_frac, clipped):
                problem = DataError(f"annotated duration {d_a:g} s but the video lasts {d_v:.2f} s ({p}; tolerance "
                                    f"max({screen.duration_tolerance:g} s, {screen.duration_tolerance_frac:g} x the "
                                    "video's))", field="duration", kind="duration_mismatch", **where)
                policy = screen.on_duration_mismatch
        if problem is None:
            kept.append(s)
            continue
        rep.counts[problem.kind] += 1
        rep.problems.append(problem)
        if policy == "error":
            errors.append(problem)
        elif policy == "skip" and (screen.drop or problem.kind == "duration_mismatch"):
            rep.n_dropped += 1
        else:
            kept.append(s)
    rep.seconds = time.perf_counter() - t0
    if errors:
        listing = "\n".join(f"  {e}" for e in errors[:_MAX_LISTED])
        more = f"\n  ... and {len(errors) - _MAX_LISTED} more" if len(errors) > _MAX_LISTED else ""
        raise DataError(f"{len(errors)} of {len(samples)} sample(s) refused by the media check "
                        f"(data.on_missing_media / data.on_duration_mismatch = error):\n{listing}{more}",
                        path=source or None, line=errors[0].line, field=errors[0].field, kind=errors[0].kind)
    if rep.problems:
        listing = "\n".join(f"  {e}" for e in rep.problems[:20])
        more = f"\n  ... and {len(rep.problems) - 20} more" if len(rep.problems) > 20 else ""
        logger.warning("%s\n%s%s", rep.summary(), listing, more)
    if samples and not kept:
        raise NoSamplesLeft(f"no sample left after the media check: {rep.summary()}", path=source or None,
                            kind="no_samples")
    return kept, rep
