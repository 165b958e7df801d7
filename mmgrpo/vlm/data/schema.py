"""The canonical sample schema (one JSON object per line) and its validation.

Fields (times in **seconds, absolute video time**; boxes in **original-image pixels**, [x1, y1, x2, y2])::

    id           str, unique within a file
    task         "tvg" (temporal grounding) | "mcq" (multiple-choice QA) | "gqa" (grounded QA) | "rec" (image REC)
                 | "qa" (open-answer QA on a video or image: Video-R1's numerical / OCR / free-form / regression)
    query        str, non-empty: the event description (tvg), the question (mcq/gqa) or the referring expression
    video        str path (tvg, gqa; mcq may use video or image)   -- exactly one of video / image
    image        str path (rec; mcq)
    duration     float > 0, seconds of the whole video (required for tvg, gqa)
    spans        [[s, e], ...] with 0 <= s < e <= duration (tvg: >= 1; gqa: >= 1 evidence span; others: none)
    options      [str, ...] >= 2 options, without "(A)" prefixes (mcq, gqa)
    answer       option letter "A".."Z" (mcq, gqa); the reference answer as written (qa: "42", "3.5", text);
                 optional otherwise
    boxes        [[x1, y1, x2, y2], ...] >= 1 box with x1 < x2, y1 < y2, inside image_size (rec)
    image_size   [width, height] in pixels (rec)
    video_start, video_end   optional clip in seconds, 0 <= start < end <= duration; spans must lie inside it
    meta         dict, free-form provenance (source dataset, original ids, ...); qa: meta.problem_type (how the
                 answer is scored: "numerical" | "OCR" | "free-form" | "regression", Video-R1's names); a release's
                 verbatim prompt text may sit in meta.problem (mmgrpo.vlm.data.templates uses it)
"""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields
from typing import Any

TASKS = ("tvg", "mcq", "gqa", "rec", "qa")
QA_PROBLEM_TYPES = ("numerical", "OCR", "free-form", "regression")
VIDEO_TASKS = ("tvg", "gqa")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class DataError(ValueError):
    """Bad data.  The message names the file, line number, sample id and field when they are known."""

    def __init__(self, message: str, path: str | os.PathLike | None = None, line: int | None = None,
                 field: str | None = None, sample_id: str | None = None, kind: str = "invalid"):
        self.message = message
        self.path = None if path is None else os.fspath(path)
        self.line = line
        self.field = field
        self.sample_id = sample_id
        self.kind = kind
        super().__init__(self._format())

    def _format(self) -> str:
        where = []
        if self.path is not None:
            where.append(self.path + (f":{self.line}" if self.line is not None else ""))
        elif self.line is not None:
            where.append(f"line {self.line}")
        if self.sample_id is not None:
            where.append(f"id={self.sample_id!r}")
        if self.field is not None:
            where.append(f"field {self.field!r}")
        return (", ".join(where) + ": " if where else "") + self.message

    def located(self, path=None, line=None, sample_id=None) -> "DataError":
        """A copy with the location filled in (keeps what is already known)."""
        return DataError(self.message, path if self.path is None else self.path,
                         line if self.line is None else self.line, self.field,
                         sample_id if self.sample_id is None else self.sample_id, self.kind)


def _is_num(x: Any) -> bool:
    """A finite number (JSON integers beyond float range, e.g. 400 digits, are not: ``float()`` overflows)."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def _short(x: Any, n: int = 60) -> str:
    """``repr(x)`` cut to ``n`` characters, for messages (a 400-digit number or a huge list stays readable)."""
    if isinstance(x, int) and not isinstance(x, bool) and abs(x) >= 10 ** 40:
        return f"<{len(str(abs(x)))}-digit integer>"
    r = repr(x)
    return r if len(r) <= n else r[:n] + "..."


@dataclass
class Sample:
    """One canonical sample; see the module docstring for the field contract."""

    id: str
    task: str
    query: str
    video: str | None = None
    image: str | None = None
    duration: float | None = None
    spans: list = field(default_factory=list)
    options: list | None = None
    answer: str | None = None
    boxes: list | None = None
    image_size: list | None = None
    video_start: float | None = None
    video_end: float | None = None
    meta: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, d: Any) -> "Sample":
        """Build from a parsed JSON object; unknown or missing required fields raise DataError."""
        if not isinstance(d, dict):
            raise DataError(f"a sample must be a JSON object, got {type(d).__name__}", kind="malformed")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        sid = d.get("id") if isinstance(d.get("id"), str) else None
        if unknown:
            raise DataError(f"unknown field(s) {unknown}; allowed: {sorted(names)}", field=unknown[0],
                            sample_id=sid, kind="unknown_field")
        for req in ("id", "task", "query"):
            if req not in d or d[req] is None:
                raise DataError("missing required field", field=req, sample_id=sid, kind="missing_field")
        kw = dict(d)
        if kw.get("spans") is None:
            kw["spans"] = []
        if kw.get("meta") is None:
            kw["meta"] = {}
        return cls(**kw)

    def to_dict(self) -> dict:
        """JSON-ready dict; optional fields that are None are left out."""
        d = asdict(self)
        return {k: v for k, v in d.items() if v is not None}

    @property
    def media(self) -> str | None:
        return self.video if self.video is not None else self.image

    # ------------------------------------------------------------------ validation
    def validate(self, swap_reversed: bool = False) -> "Sample":
        """Check every field; raise :class:`DataError` (with ``field`` set) on the first problem.

        ``swap_reversed=True`` turns a reversed span [e, s] into [s, e] (counted in ``meta['swapped_spans']``)
        instead of rejecting it.  Numbers are normalised to float.  Returns ``self``.
        """
        sid = self.id if isinstance(self.id, str) else None

        def err(f, msg, kind="invalid"):
            return DataError(msg, field=f, sample_id=sid, kind=kind)

        if not isinstance(self.id, str) or not self.id.strip():
            raise err("id", "must be a non-empty string")
        if self.task not in TASKS:
            raise err("task", f"unknown task {self.task!r}; expected one of {TASKS}", "unknown_task")
        if not isinstance(self.query, str) or not self.query.strip():
            raise err("query", "must be a non-empty string", "empty_query")
        if not isinstance(self.meta, dict):
            raise err("meta", "must be an object")

        # media
        for f in ("video", "image"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                raise err(f, "must be a non-empty path string")
        if self.video is not None and self.image is not None:
            raise err("video", "give exactly one of 'video' and 'image', not both")
        if self.task in VIDEO_TASKS and self.video is None:
            raise err("video", f"task {self.task!r} needs a video", "missing_field")
        if self.task == "rec" and self.image is None:
            raise err("image", "task 'rec' needs an image", "missing_field")
        if self.task in ("mcq", "qa") and self.media is None:
            raise err("video", f"task {self.task!r} needs a video or an image", "missing_field")

        # duration and clip
        if self.duration is not None:
            if not _is_num(self.duration) or self.duration <= 0:
                raise err("duration", f"must be a positive number of seconds, got {_short(self.duration)}")
            self.duration = float(self.duration)
        elif self.task in VIDEO_TASKS:
            raise err("duration", f"task {self.task!r} needs the video duration in seconds", "missing_field")
        lo, hi = 0.0, self.duration
        for f in ("video_start", "video_end"):
            v = getattr(self, f)
            if v is None:
                continue
            if self.video is None:
                raise err(f, "only valid for video samples")
            if not _is_num(v) or v < 0 or (self.duration is not None and v > self.duration + 1e-6):
                raise err(f, f"must be in [0, duration={self.duration}], got {_short(v)}")
            setattr(self, f, float(v))
        if self.video_start is not None:
            lo = self.video_start
        if self.video_end is not None:
            hi = self.video_end
        if self.video_start is not None and self.video_end is not None and self.video_start >= self.video_end:
            raise err("video_start", f"video_start={self.video_start} must be < video_end={self.video_end}")

        # spans
        if not isinstance(self.spans, list):
            raise err("spans", "must be a list of [start, end] pairs")
        if self.task in ("tvg", "gqa") and not self.spans:
            raise err("spans", f"task {self.task!r} needs at least one [start, end] span", "missing_field")
        if self.task in ("mcq", "rec", "qa") and self.spans and self.duration is None:
            raise err("spans", "spans need a duration")
        out = []
        for i, sp in enumerate(self.spans):
            f = f"spans[{i}]"
            if not (isinstance(sp, (list, tuple)) and len(sp) == 2 and all(_is_num(x) for x in sp)):
                raise err(f, f"must be a pair of finite numbers [start, end], got {_short(sp)}")
            s, e = float(sp[0]), float(sp[1])
            if s > e:
                if not swap_reversed:
                    raise err(f, f"reversed span [{s}, {e}] (start > end); pass swap_reversed=True to swap",
                              "reversed_span")
                s, e = e, s
                self.meta["swapped_spans"] = int(self.meta.get("swapped_spans", 0)) + 1
            if s == e:
                raise err(f, f"zero-length span [{s}, {e}]", "bad_span")
            if s < lo - 1e-6 or (hi is not None and e > hi + 1e-6):
                raise err(f, f"span [{s}, {e}] lies outside [{lo}, {hi}] "
                             f"({'clip' if (self.video_start, self.video_end) != (None, None) else 'video'})",
                          "span_out_of_range")
            out.append([s, e])
        self.spans = out

        # options / answer
        if self.task in ("mcq", "gqa"):
            if not isinstance(self.options, list) or len(self.options) < 2:
                raise err("options", "needs a list of at least 2 options", "missing_field")
            if len(self.options) > len(LETTERS):
                raise err("options", f"at most {len(LETTERS)} options")
            for i, o in enumerate(self.options):
                if not isinstance(o, str) or not o.strip():
                    raise err(f"options[{i}]", "must be a non-empty string")
            if self.answer is None:
                raise err("answer", f"task {self.task!r} needs the answer letter", "missing_field")
            if not isinstance(self.answer, str) or len(self.answer) != 1 or self.answer not in LETTERS:
                raise err("answer", f"must be one option letter A-Z, got {self.answer!r}")
            if LETTERS.index(self.answer) >= len(self.options):
                raise err("answer", f"letter {self.answer} but only {len(self.options)} options")
        elif self.options is not None:
            raise err("options", f"not used by task {self.task!r}")
        if self.answer is not None and not isinstance(self.answer, str):
            raise err("answer", "must be a string")
        if self.task == "qa":
            if self.answer is None or not self.answer.strip():
                raise err("answer", "task 'qa' needs the reference answer as a non-empty string", "missing_field")
            ptype = self.meta.get("problem_type")
            if ptype not in QA_PROBLEM_TYPES:
                raise err("meta", f"task 'qa' needs meta.problem_type, one of {QA_PROBLEM_TYPES}; got {ptype!r}")
            if ptype in ("numerical", "regression"):
                try:
                    v = float(self.answer.strip().replace(",", ""))
                except ValueError:
                    v = math.nan
                if not math.isfinite(v):
                    raise err("answer", f"a {ptype} answer must be a number, got {self.answer!r}")

        # boxes / image size
        if self.image_size is not None:
            if not (isinstance(self.image_size, (list, tuple)) and len(self.image_size) == 2
                    and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in self.image_size)):
                raise err("image_size", f"must be [width, height] positive integers, got {_short(self.image_size)}")
            self.image_size = list(self.image_size)
        if self.task == "rec":
            if not self.boxes:
                raise err("boxes", "task 'rec' needs at least one [x1, y1, x2, y2] box", "missing_field")
            if self.image_size is None:
                raise err("image_size", "task 'rec' needs [width, height] of the original image", "missing_field")
        if self.boxes is not None:
            if not isinstance(self.boxes, list):
                raise err("boxes", "must be a list of [x1, y1, x2, y2]")
            bx = []
            for i, b in enumerate(self.boxes):
                f = f"boxes[{i}]"
                if not (isinstance(b, (list, tuple)) and len(b) == 4 and all(_is_num(x) for x in b)):
                    raise err(f, f"must be [x1, y1, x2, y2] numbers, got {_short(b)}")
                x1, y1, x2, y2 = (float(x) for x in b)
                if not (x1 < x2 and y1 < y2):
                    raise err(f, f"needs x1 < x2 and y1 < y2, got {b!r}", "bad_box")
                if self.image_size is not None:
                    w, h = self.image_size
                    if x1 < 0 or y1 < 0 or x2 > w or y2 > h:
                        raise err(f, f"box {b!r} outside the image {w}x{h}", "bad_box")
                bx.append([x1, y1, x2, y2])
            self.boxes = bx
        return self


def answer_index(sample: Sample) -> int:
    """0-based index of the answer option."""
    return LETTERS.index(sample.answer)
