"""Converters from public annotation formats to canonical :class:`~mmgrpo.vlm.data.schema.Sample` lists.

Every converter returns ``(samples, report)``: validated samples and a :class:`ConvertReport` with counts of
skipped and fixed records.  ``on_error="raise"`` (default) raises :class:`DataError` naming the input file and the
line / record; ``"skip"`` drops the record and counts it.  Spans that end past the video (common in Charades-STA
and ActivityNet, whose annotations were made on other encodes) are clamped to the duration when the overshoot is
at most ``clamp_tolerance`` seconds (``meta["clamped_span"]`` keeps the original); larger overshoots and reversed
spans are errors unless ``swap_reversed=True``.

Formats (``FORMATS`` maps the CLI names to functions):

* ``charades_sta``   -- ``Charades_sta_{train,test}.txt``: ``"VID s e##sentence"`` per line; durations from a dict,
  the Charades CSV (columns ``id``, ``length``) or by probing ``video_dir/VID.mp4``.
* ``dense_captions`` -- ActivityNet Captions / Charades dense JSON ``{vid: {duration, timestamps, sentences}}``.
* ``time_r1``        -- Time-R1 / TVGBench JSON (``path, question, answer "s-e", duration``) and TimeRFT items
  (``video, duration, timestamp [s, e], sentence, video_start?, video_end?``).
* ``nextgqa``        -- NExT-GQA in the VideoChat-R1 layout (``video, question, options ["(A) ...", ...],
  duration, glue [[s, e], ...], answer "(C)"``).
* ``video_r1``       -- Video-R1 QA (``problem, options ["A. ...", ...], solution "<answer>X</answer>",
  problem_type, data_type, path``): multiple choice -> mcq; numerical / OCR / free-form / regression -> qa.
* ``tempsamp``       -- TempSamp-R1's JSONL (``problem`` with the quoted event, ``answer`` / ``solution``
  ``"<answer> s to e </answer>"``, ``videos [path]``, ``duration``).
* ``refcoco``        -- RefCOCO-style REC JSON/JSONL (``image``, expression in ``normal_caption`` / ``sentence`` /
  ``expression`` / ``text`` / ``problem``, box in ``solution`` / ``bbox`` / ``box`` as xyxy (or COCO xywh),
  image size from ``width``/``height`` / ``image_size`` / a ``sizes`` dict / reading the image).
* ``vsibench``       -- VSI-Bench (``id, dataset, scene_name, question_type, question, options, ground_truth``):
  multiple-choice types -> mcq, numerical types -> qa (numerical).
* ``qvhighlights``   -- QVHighlights JSONL (``qid, query, duration, vid, relevant_windows, relevant_clip_ids,
  saliency_scores``) -> tvg with every relevant window; clip ids and saliency kept in ``meta``.
* ``seed_bench_r1``  -- SEED-Bench-R1 / EgoPlan JSONL (``question, choice_a..d, golden_choice_idx`` or
  ``answer, negative_answers``; ``video_source, video_basename, current_observation_basename``) -> mcq.
* ``longvideobench`` -- LongVideoBench JSON (``question, candidates, correct_choice, video_path, duration_group,
  question_category``) -> mcq.
* ``mmvu``           -- MMVU JSON (``question_type, question, choices {A..E}, answer, video URL, metadata``) -> mcq
  (multiple-choice) / qa free-form (open-ended).
* ``clevrer``        -- CLEVRER question JSON (``scene_index, video_filename, questions``) -> qa (descriptive) and one
  yes/no mcq per choice (explanatory / predictive / counterfactual).
"""
from __future__ import annotations

import csv
import json
import logging
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from mmgrpo.utils.json_records import JSONRecordError, parse_record

from .schema import LETTERS, DataError, Sample

logger = logging.getLogger("mmgrpo.data")


@dataclass
class ConvertReport:
    source: str
    n_in: int = 0
    n_out: int = 0
    skipped: Counter = field(default_factory=Counter)
    n_clamped: int = 0
    n_swapped: int = 0
    errors: list = field(default_factory=list)

    def summary(self) -> str:
        s = f"{self.source}: {self.n_out} samples from {self.n_in} records"
        if self.skipped:
            s += "; skipped " + ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped.items()))
        if self.n_clamped:
            s += f"; {self.n_clamped} span end(s) clamped to the duration"
        if self.n_swapped:
            s += f"; {self.n_swapped} reversed span(s) swapped"
        return s

    __str__ = summary


class _Ctx:
    """Shared bookkeeping: error policy, span fixing and validation for one input file."""

    def __init__(self, source, on_error, swap_reversed, clamp_tolerance):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.source = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "<memory>"
        self.on_error = on_error
        self.swap = swap_reversed
        self.tol = clamp_tolerance
        self.report = ConvertReport(self.source)
        self.samples: list[Sample] = []
        self.ids: set = set()

        self.lines: list | None = None  # line number of each record (JSONL input), set by records()

    def fail(self, e: Exception, line=None, record=None):
        """Raise (``on_error="raise"``) or count and skip one bad record. ``e``: a DataError, or any error of
        :data:`RECORD_ERRORS` that a value of the wrong type raised (named with its type, the record and, for JSONL
        input, the line). ``record``: a record index (its JSONL line is looked up) or a label."""
        if isinstance(record, int):
            if line is None and self.lines is not None and record < len(self.lines):
                line = self.lines[record]
            record = f"record {record}"
        if not isinstance(e, DataError):
            e = DataError(f"unexpected value ({type(e).__name__}: {' '.join(str(e).split())[:200]})", kind="invalid")
        e = e.located(self.source, line, record)
        self.report.errors.append(e)
        self.report.skipped[e.kind] += 1
        if self.on_error == "raise":
            raise e
        logger.warning("skipping: %s", e)

    def records(self, src) -> list:
        """The records of a JSON / JSONL file (or an in-memory list). An unreadable JSONL line (malformed, nested
        too deeply, an unreadable number) is one bad record under the error policy, counted in ``n_in``."""
        data, lines, bad = _read_rows(src)
        for ln, reason in bad:
            self.report.n_in += 1
            self.fail(DataError(reason, kind="malformed_json"), line=ln)
        self.lines = lines
        return _records(data, self.source)

    def skip(self, kind: str):
        self.report.skipped[kind] += 1

    def fix_span(self, s: Any, e: Any, duration: float | None, fieldname: str, sid: str, meta: dict):
        try:
            s, e = float(s), float(e)
        except (TypeError, ValueError, OverflowError):
            raise DataError(f"span bounds must be numbers, got [{s!r:.40}, {e!r:.40}]", field=fieldname,
                            sample_id=sid) from None
        if s > e and self.swap:
            s, e = e, s
            self.report.n_swapped += 1
            meta["swapped_spans"] = int(meta.get("swapped_spans", 0)) + 1
        if duration is not None and e > duration and e - duration <= self.tol and s < duration:
            meta.setdefault("clamped_span", []).append([s, e])
            e = float(duration)
            self.report.n_clamped += 1
        return [s, e]

    def add(self, sample: Sample, line=None):
        if sample.id in self.ids:
            raise DataError("duplicate id", field="id", sample_id=sample.id, kind="duplicate_id")
        sample.validate()
        self.ids.add(sample.id)
        self.samples.append(sample)

    def finish(self):
        self.report.n_out = len(self.samples)
        return self.samples, self.report


def _read_rows(src) -> tuple[Any, list | None, list]:
    """(parsed data, the line of each row for JSONL input else None, [(line, reason)] of unreadable JSONL lines).
    A file that is neither JSON nor JSONL (its first line does not parse) is a DataError."""
    if not isinstance(src, (str, os.PathLike)):
        return src, None, []
    path = os.fspath(src)
    if not os.path.isfile(path):
        raise DataError("file not found", path=path, kind="missing_file")
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        return parse_record(text), None, []
    except JSONRecordError as first:
        rows, lines, bad = [], [], []
        for i, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append(parse_record(line))
                lines.append(i)
            except JSONRecordError as ex:
                if not rows and not bad:  # neither JSON nor JSONL: report the whole file's error
                    raise DataError(first.reason, path=path, kind="malformed_json") from None
                bad.append((i, ex.reason))
        return rows, lines, bad


def _read_json_or_jsonl(src) -> Any:
    """The parsed JSON file, or the rows of a JSONL file; the first unreadable line raises DataError."""
    data, _, bad = _read_rows(src)
    if bad:
        raise DataError(bad[0][1], path=os.fspath(src), line=bad[0][0], kind="malformed_json")
    return data


def _records(data, source) -> list:
    if isinstance(data, dict):
        for key in ("data", "annotations", "items"):
            if isinstance(data.get(key), list):
                return data[key]
        if str(source).endswith(".jsonl"):  # a one-line JSONL file parses as one JSON object: its only record
            return [data]
        raise DataError("expected a list of records", path=source)
    if not isinstance(data, list):
        raise DataError(f"expected a list of records, got {type(data).__name__}", path=source)
    return data


# Errors of one record: DataError (a ValueError) and what a value of the wrong type raises on the way (float("abc"),
# len(3), a 400-digit integer in float(), ...). Each converter catches these per record: named, then raised or
# counted and skipped (on_error), never a bare traceback that ends the whole file.
RECORD_ERRORS = (ValueError, TypeError, ArithmeticError, AttributeError, KeyError, IndexError)


def _number(value: Any, fieldname: str, sid: str | None = None) -> float:
    """A finite float from a JSON number or a numeric string; DataError naming the field otherwise."""
    try:
        if isinstance(value, bool):
            raise TypeError
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:60] + "..."
        raise DataError(f"must be a number, got {shown}", field=fieldname, sample_id=sid) from None
    if x != x or x in (float("inf"), float("-inf")):
        raise DataError(f"must be a finite number, got {value!r}", field=fieldname, sample_id=sid)
    return x


def _integer(value: Any, fieldname: str, sid: str | None = None) -> int:
    """An integer from a JSON number or a numeric string (``640``, ``640.0``, ``"640"``); DataError otherwise."""
    x = _number(value, fieldname, sid)
    if x != int(x):
        raise DataError(f"must be a whole number, got {value!r}", field=fieldname, sample_id=sid)
    return int(x)


def _video_path(video_dir: str | None, name: str, template: str = "{vid}.mp4") -> str:
    rel = template.format(vid=name) if "{vid}" in template else name
    return os.path.join(video_dir, rel) if video_dir else rel


# ---------------------------------------------------------------------------------------------- Charades-STA
def read_charades_durations(csv_path: str | os.PathLike) -> dict[str, float]:
    """``{video id: length in seconds}`` from ``Charades_v1_{train,test}.csv`` (columns ``id`` and ``length``)."""
    out = {}
    with open(csv_path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames or "id" not in reader.fieldnames or "length" not in reader.fieldnames:
            raise DataError(f"needs columns 'id' and 'length', has {reader.fieldnames}", path=os.fspath(csv_path))
        for i, row in enumerate(reader, start=2):
            try:
                out[row["id"].strip()] = float(row["length"])
            except (TypeError, ValueError):
                raise DataError(f"bad length {row['length']!r}", path=os.fspath(csv_path), line=i,
                                field="length") from None
    return out


def convert_charades_sta(
    txt_path: str | os.PathLike,
    durations: Mapping[str, float] | str | os.PathLike | None = None,
    video_dir: str | None = None,
    video_template: str = "{vid}.mp4",
    probe_root: str | os.PathLike | None = None,
    on_error: str = "raise",
    swap_reversed: bool = False,
    clamp_tolerance: float = 5.0,
) -> tuple[list[Sample], ConvertReport]:
    """Charades-STA ``"VID s e##sentence"`` lines -> tvg samples (id ``VID_line``).

    Durations: a dict, a Charades CSV path, or (``durations=None``) probing ``probe_root/VID.mp4`` (decord/PyAV).
    ``video`` is ``video_dir/VID.mp4`` (relative unless ``video_dir`` is absolute).
    """
    ctx = _Ctx(txt_path, on_error, swap_reversed, clamp_tolerance)
    if isinstance(durations, (str, os.PathLike)):
        durations = read_charades_durations(durations)
    if durations is None and probe_root is None:  # a setting, not a bad record: never counted as a skip
        raise ValueError("convert_charades_sta needs durations (dict or CSV) or probe_root")
    probed: dict[str, float] = {}
    path = os.fspath(txt_path)
    if not os.path.isfile(path):
        raise DataError("file not found", path=path, kind="missing_file")
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        ctx.report.n_in += 1
        try:
            if "##" not in line:
                raise DataError("expected 'VID start end##sentence'", field="line", kind="malformed")
            head, sentence = line.split("##", 1)
            parts = head.split()
            if len(parts) != 3:
                raise DataError(f"expected 'VID start end' before '##', got {head!r}", field="line",
                                kind="malformed")
            vid, s, e = parts
            sid = f"{vid}_{lineno}"
            if durations is not None:
                if vid not in durations:
                    raise DataError(f"no duration for video {vid}", field="duration", sample_id=sid,
                                    kind="missing_field")
                dur = _number(durations[vid], "duration", sid)
            else:
                if probe_root is None:
                    raise ValueError("convert_charades_sta needs durations (dict or CSV) or probe_root")
                if vid not in probed:
                    from mmgrpo.video import VideoError, probe_video

                    try:
                        probed[vid] = probe_video(os.path.join(os.fspath(probe_root),
                                                               video_template.format(vid=vid))).duration
                    except VideoError as ex:
                        raise DataError(f"cannot probe duration: {ex}", field="duration", sample_id=sid,
                                        kind="missing_media") from None
                dur = probed[vid]
            meta = {"source": "charades_sta", "video_id": vid, "line": lineno}
            span = ctx.fix_span(s, e, dur, "spans[0]", sid, meta)
            ctx.add(Sample(id=sid, task="tvg", query=sentence.strip(), video=_video_path(video_dir, vid,
                           video_template), duration=dur, spans=[span], meta=meta))
        except RECORD_ERRORS as ex:
            ctx.fail(ex, line=lineno)
    return ctx.finish()


# ---------------------------------------------------------------------------------------------- dense captions
def convert_dense_captions(
    src: str | os.PathLike | Mapping,
    video_dir: str | None = None,
    video_template: str = "{vid}.mp4",
    source_name: str = "activitynet_captions",
    on_error: str = "raise",
    swap_reversed: bool = False,
    clamp_tolerance: float = 5.0,
) -> tuple[list[Sample], ConvertReport]:
    """``{vid: {duration, timestamps: [[s, e], ...], sentences: [...]}}`` -> one tvg sample per sentence
    (id ``VID_k``)."""
    ctx = _Ctx(src, on_error, swap_reversed, clamp_tolerance)
    data = _read_json_or_jsonl(src)
    if not isinstance(data, dict):
        raise DataError("expected an object {video_id: {duration, timestamps, sentences}}", path=ctx.source)
    for vid, rec in data.items():
        try:
            if not isinstance(rec, dict):
                raise DataError("record must be an object", sample_id=vid, kind="malformed")
            for k in ("duration", "timestamps", "sentences"):
                if k not in rec:
                    raise DataError("missing field", field=k, sample_id=vid, kind="missing_field")
            ts, sents = rec["timestamps"], rec["sentences"]
            if not isinstance(ts, list) or not isinstance(sents, list) or len(ts) != len(sents):
                raise DataError(f"{len(ts) if isinstance(ts, list) else '?'} timestamps for "
                                f"{len(sents) if isinstance(sents, list) else '?'} sentences",
                                field="timestamps", sample_id=vid, kind="malformed")
        except RECORD_ERRORS as ex:
            ctx.report.n_in += 1
            ctx.fail(ex, record=vid)
            continue
        for k, (span, sent) in enumerate(zip(ts, sents)):
            ctx.report.n_in += 1
            sid = f"{vid}_{k}"
            try:
                if not (isinstance(span, (list, tuple)) and len(span) == 2):
                    raise DataError(f"must be [start, end], got {span!r}", field=f"timestamps[{k}]",
                                    sample_id=sid)
                meta = {"source": source_name, "video_id": vid, "index": k}
                dur = _number(rec["duration"], "duration", sid)
                sp = ctx.fix_span(span[0], span[1], dur, f"timestamps[{k}]", sid, meta)
                ctx.add(Sample(id=sid, task="tvg", query=str(sent).strip(),
                               video=_video_path(video_dir, vid, video_template), duration=dur, spans=[sp],
                               meta=meta))
            except RECORD_ERRORS as ex:
                ctx.fail(ex, record=sid)
    return ctx.finish()


# ---------------------------------------------------------------------------------------------- Time-R1 / TVGBench
_SPAN_STR = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*(?:-|to|,)\s*([-+]?\d+(?:\.\d+)?)\s*$")


def _parse_span_str(s: str) -> tuple[float, float]:
    m = _SPAN_STR.match(str(s))
    if not m:
        raise DataError(f"expected 'start-end' seconds, got {s!r}", field="answer")
    return float(m.group(1)), float(m.group(2))


def convert_time_r1(
    src: str | os.PathLike | list,
    video_dir: str | None = None,
    on_error: str = "raise",
    swap_reversed: bool = False,
    clamp_tolerance: float = 5.0,
    timerft_videos: str = "clip",
) -> tuple[list[Sample], ConvertReport]:
    """Time-R1 data -> tvg samples.  TVGBench items ``{path, question, answer "s-e", duration, ...}`` and
    TimeRFT items ``{video, duration, timestamp [s, e], sentence, qid?, video_start?, video_end?}``; other keys
    go to ``meta``.  id: ``qid`` / ``id`` when present, else the record index.

    Clipped TimeRFT items (``video_start``/``video_end`` set, e.g. ``4jujhM5qhEc_00:00:39:000_00:01:24:700.mp4``,
    duration 45.7, video_start 39.0, video_end 84.7, timestamp [34.9, 41.9]): ``video_start``/``video_end`` are
    the clip's place on the *source* video's timeline (the file name encodes them), ``duration`` is the clip's
    length (= video_end - video_start) and ``timestamp`` is relative to the clip's first frame (in train_2k5.json
    all 665 clipped timestamps lie in [0, duration], only 346 in [video_start, video_end]).  The release trains on
    the whole clip file (its trainer's frame request carries no video_start) against the unshifted timestamp, as
    its TVGBench evaluation does with ``start``/``end``.  So by default (``timerft_videos="clip"``) the sample is
    the file as it is: spans = timestamp, no crop, the source bounds kept as ``meta["source_start"]``/
    ``["source_end"]``.  ``timerft_videos="source"`` is for files that are the full source videos: crop
    [video_start, video_end], spans shifted by video_start, duration = video_end (the source's full length is not
    in the annotation; a lower bound).
    """
    if timerft_videos not in ("clip", "source"):
        raise ValueError(f"timerft_videos must be 'clip' or 'source', got {timerft_videos!r}")
    ctx = _Ctx(src, on_error, swap_reversed, clamp_tolerance)
    recs = ctx.records(src)
    for i, r in enumerate(recs):
        ctx.report.n_in += 1
        try:
            if not isinstance(r, dict):
                raise DataError("record must be an object", kind="malformed")
            sid = str(r.get("qid", r.get("id", i)))
            video = r.get("path", r.get("video"))
            query = r.get("question", r.get("sentence", r.get("query")))
            if video is None:
                raise DataError("missing field", field="path/video", sample_id=sid, kind="missing_field")
            if query is None:
                raise DataError("missing field", field="question/sentence", sample_id=sid, kind="missing_field")
            if "duration" not in r:
                raise DataError("missing field", field="duration", sample_id=sid, kind="missing_field")
            dur = _number(r["duration"], "duration", sid)
            if "answer" in r:
                s, e = _parse_span_str(r["answer"])
            elif "timestamp" in r:
                ts = r["timestamp"]
                if not (isinstance(ts, (list, tuple)) and len(ts) == 2):
                    raise DataError(f"must be [start, end], got {ts!r}", field="timestamp", sample_id=sid)
                s, e = ts
            else:
                raise DataError("missing field", field="answer/timestamp", sample_id=sid, kind="missing_field")
            used = {"qid", "id", "path", "video", "question", "sentence", "query", "duration", "answer",
                    "timestamp", "video_start", "video_end"}
            meta = {"source": "time_r1", **{k: v for k, v in r.items() if k not in used}}
            span = ctx.fix_span(s, e, dur, "spans[0]", sid, meta)
            clip = {}
            vs, ve = r.get("video_start"), r.get("video_end")
            if vs is not None or ve is not None:
                if not (_num(vs) and _num(ve) and 0 <= vs < ve):
                    raise DataError(f"need 0 <= video_start < video_end, got [{vs!r}, {ve!r}]", field="video_start",
                                    sample_id=sid)
                meta["source_start"], meta["source_end"] = float(vs), float(ve)
                if timerft_videos == "source":  # the file is the source video: crop it, spans to file time
                    clip = {"video_start": float(vs), "video_end": float(ve)}
                    span = [span[0] + vs, span[1] + vs]
                    dur = max(dur + vs, float(ve))
            ctx.add(Sample(id=sid, task="tvg", query=str(query).strip(),
                           video=os.path.join(video_dir, video) if video_dir else video, duration=dur, spans=[span],
                           meta=meta, **clip))
        except RECORD_ERRORS as ex:
            ctx.fail(ex, record=i)
    return ctx.finish()


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# ---------------------------------------------------------------------------------------------- options helpers
_OPT_PREFIX = re.compile(r"^\s*(?:\(([A-Za-z])\)|([A-Za-z])\s*[.):：])\s*")


def strip_option_prefix(opt: str, expected_letter: str | None = None) -> str:
    """"(A) red" / "A. red" / "A) red" / "A: red" -> "red".  With ``expected_letter`` the prefix must match."""
    m = _OPT_PREFIX.match(opt)
    if not m:
        return opt.strip()
    letter = (m.group(1) or m.group(2)).upper()
    if expected_letter is not None and letter != expected_letter:
        raise DataError(f"option {opt!r} is labelled {letter}, expected {expected_letter}", field="options")
    return opt[m.end():].strip()


def split_options(options: Any) -> list[str]:
    """A list of options, or one string "(A) x (B) y ..." -> ["x", "y", ...] without prefixes."""
    if isinstance(options, str):
        parts = re.split(r"\(([A-Z])\)", options)
        # ["", "A", " x ", "B", " y "]
        if len(parts) < 3:
            raise DataError(f"cannot split options {options!r}", field="options")
        return [parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)]
    if not isinstance(options, list):
        raise DataError(f"options must be a list or a string, got {type(options).__name__}", field="options")
    return [strip_option_prefix(str(o), LETTERS[i]) for i, o in enumerate(options)]


def answer_letter(answer: Any, options: list[str]) -> str:
    """"(C)" / "C" / "C. text" / "<answer>C</answer>" / an option's text / an int index -> "C"."""
    if isinstance(answer, int) and not isinstance(answer, bool):
        if 0 <= answer < len(options):
            return LETTERS[answer]
        raise DataError(f"answer index {answer} out of range", field="answer")
    a = str(answer).strip()
    m = re.search(r"<answer>\s*(.*?)\s*</answer>", a, re.S)
    if m:
        a = m.group(1)
    m = re.fullmatch(r"\(?([A-Za-z])\)?(?:\s*[.):：].*)?", a, re.S)
    if m and LETTERS.index(m.group(1).upper()) < len(options):
        return m.group(1).upper()
    low = [o.lower() for o in options]
    if a.lower() in low:
        return LETTERS[low.index(a.lower())]
    raise DataError(f"cannot map answer {answer!r} to one of {len(options)} options", field="answer")


# ---------------------------------------------------------------------------------------------- NExT-GQA
def convert_nextgqa(
    src: str | os.PathLike | list,
    video_dir: str | None = None,
    video_template: str = "{vid}.mp4",
    on_error: str = "raise",
    swap_reversed: bool = False,
    clamp_tolerance: float = 5.0,
) -> tuple[list[Sample], ConvertReport]:
    """NExT-GQA (VideoChat-R1 layout) -> gqa samples: options without "(A)" prefixes, answer letter, glue spans.
    ``video`` without an extension gets ``video_template``.  id: ``qid`` / ``id``, else ``VIDEO_index``."""
    ctx = _Ctx(src, on_error, swap_reversed, clamp_tolerance)
    recs = ctx.records(src)
    for i, r in enumerate(recs):
        ctx.report.n_in += 1
        try:
            if not isinstance(r, dict):
                raise DataError("record must be an object", kind="malformed")
            for k in ("video", "question", "options", "duration", "answer"):
                if k not in r:
                    raise DataError("missing field", field=k, kind="missing_field")
            glue = r.get("glue", r.get("spans", r.get("solution")))
            if glue is None:
                raise DataError("missing field", field="glue", kind="missing_field")
            video = str(r["video"])
            sid = str(r.get("qid", r.get("id", f"{os.path.splitext(os.path.basename(video))[0]}_{i}")))
            options = split_options(r["options"])
            letter = answer_letter(r["answer"], options)
            dur = _number(r["duration"], "duration", sid)
            meta = {"source": "nextgqa", **{k: v for k, v in r.items()
                                            if k not in ("video", "question", "options", "duration", "answer",
                                                         "glue", "spans", "solution", "qid", "id")}}
            if isinstance(glue, list) and len(glue) == 2 and all(isinstance(x, (int, float)) for x in glue):
                glue = [glue]  # a single [s, e]
            if not isinstance(glue, list):
                raise DataError(f"must be [[s, e], ...], got {glue!r}", field="glue", sample_id=sid)
            spans = []
            for j, g in enumerate(glue):
                if not (isinstance(g, (list, tuple)) and len(g) == 2):
                    raise DataError(f"must be [s, e], got {g!r}", field=f"glue[{j}]", sample_id=sid)
                spans.append(ctx.fix_span(g[0], g[1], dur, f"glue[{j}]", sid, meta))
            if "." not in os.path.basename(video):
                video = video_template.format(vid=video)
            ctx.add(Sample(id=sid, task="gqa", query=str(r["question"]).strip(),
                           video=os.path.join(video_dir, video) if video_dir else video, duration=dur,
                           spans=spans, options=options, answer=letter, meta=meta))
        except RECORD_ERRORS as ex:
            ctx.fail(ex, record=i)
    return ctx.finish()


# ---------------------------------------------------------------------------------------------- Video-R1
_VIDEO_R1_TYPES = {"multiple choice": "multiple choice", "numerical": "numerical", "ocr": "OCR",
                   "free-form": "free-form", "regression": "regression"}


def _release_media_path(media_dir: str | None, path: str) -> str:
    """Video-R1 writes media paths as "./Folder/x.mp4" (training) or "/MVBench/x.mp4" (evaluation) and joins them
    to its data root by string concatenation; with ``media_dir`` the leading "./" or "/" is dropped so the path
    lands under it (``os.path.join`` would discard ``media_dir`` for "/MVBench/...")."""
    if not media_dir:
        return path
    rel = path[2:] if path.startswith("./") else path.lstrip("/")
    return os.path.join(media_dir, rel)


def convert_video_r1(
    src: str | os.PathLike | list,
    media_dir: str | None = None,
    on_error: str = "raise",
) -> tuple[list[Sample], ConvertReport]:
    """Video-R1 items (Video-R1-260k, its evaluation files) -> samples of the five problem types.

    Record: ``problem``, ``problem_type`` ("multiple choice" | "numerical" | "OCR" | "free-form" | "regression"),
    ``options`` (["A. x", ...]; multiple choice), ``solution`` ("<answer>X</answer>"), ``data_type`` ("image" |
    "video"), ``path`` (or ``video`` / ``image``), ``problem_id``.  Multiple choice -> task ``mcq`` (answer letter);
    the other types -> task ``qa`` with ``answer`` = the solution's answer text as written and
    ``meta.problem_type`` (the release's name).  ``problem`` is kept verbatim in ``meta.problem`` (the Video-R1
    prompt template renders it unstripped).  The media path: see :func:`_release_media_path`.
    id: ``problem_id`` / ``id``, else the record index.  Unknown problem types are skipped and counted
    (``unsupported_problem_type``)."""
    ctx = _Ctx(src, on_error, False, 0.0)
    recs = ctx.records(src)
    for i, r in enumerate(recs):
        ctx.report.n_in += 1
        try:
            if not isinstance(r, dict):
                raise DataError("record must be an object", kind="malformed")
            ptype = _VIDEO_R1_TYPES.get(str(r.get("problem_type", "")).strip().lower())
            if ptype is None:
                ctx.skip("unsupported_problem_type")
                continue
            for k in ("problem", "solution", "data_type") + (("options",) if ptype == "multiple choice" else ()):
                if k not in r:
                    raise DataError("missing field", field=k, kind="missing_field")
            media_key = next((k for k in ("path", "video", "image") if r.get(k) is not None), None)
            if media_key is None:  # Video-R1 names it "path"; other files in its style "video" (or "image")
                raise DataError("missing field (the media path)", field="path/video", kind="missing_field")
            sid = str(r.get("problem_id", r.get("id", i)))
            dtype = str(r["data_type"]).lower()
            if dtype not in ("video", "image"):
                raise DataError(f"data_type must be 'video' or 'image', got {dtype!r}", field="data_type",
                                sample_id=sid)
            path = _release_media_path(media_dir, str(r[media_key]))
            meta = {"source": "video_r1", "problem": str(r["problem"]),
                    **{k: v for k, v in r.items() if k not in ("problem", "options", "solution", "problem_type",
                                                               "data_type", media_key, "problem_id", "id")}}
            if ptype == "multiple choice":
                options = split_options(r["options"])
                letter = answer_letter(r["solution"], options)
                ctx.add(Sample(id=sid, task="mcq", query=str(r["problem"]).strip(), options=options, answer=letter,
                               meta=meta, **{dtype: path}))
                continue
            sol = str(r["solution"])
            m = re.search(r"<answer>\s*(.*?)\s*</answer>", sol, re.S)  # the release's extract_answer
            answer = (m.group(1) if m else sol).strip()
            ctx.add(Sample(id=sid, task="qa", query=str(r["problem"]).strip(), answer=answer,
                           meta={**meta, "problem_type": ptype}, **{dtype: path}))
        except RECORD_ERRORS as ex:
            ctx.fail(ex, record=i)
    return ctx.finish()


# ---------------------------------------------------------------------------------------------- TempSamp-R1
_EVENT_IN_PROMPT = re.compile(r'(?:pinpoint|locate|find)\s+(?:the\s+)?(?:event|clip|moment)\s+["\u201c](.+)["\u201d]'
                              r'\s+in the video', re.S | re.I)


def convert_tempsamp(
    src: str | os.PathLike | list,
    video_dir: str | None = None,
    query_from: str = "event",
    on_error: str = "raise",
    swap_reversed: bool = False,
    clamp_tolerance: float = 5.0,
) -> tuple[list[Sample], ConvertReport]:
    """TempSamp-R1's released training JSONL (TimeLens data) -> tvg samples.

    Record: ``problem`` (the whole user prompt, ``<video>To accurately pinpoint the event "QUERY" in the video,
    ...``; or ``messages[0].content``, TimeLens' raw layout), ``answer`` / ``solution`` (``"<answer> s to e
    </answer>"`` or ``"s to e"``, seconds), ``videos`` ([one path]; or ``video`` / ``path``), ``duration``, and
    ``problem_type`` ("temporal grounding"; other types are skipped and counted as ``unsupported_problem_type``).
    ``query_from="event"`` takes the quoted event out of the prompt (a problem without that pattern is an error
    naming the record); ``"problem"`` keeps the whole text without ``<video>`` as the query and marks it
    ``meta["query_is_prompt"]``: the project template then shows it as the whole user text instead of wrapping
    it in its own instruction (a doubled question).  The original ``problem`` stays in ``meta["problem"]``, which
    the ``tempsamp_r1`` prompt template renders verbatim either way; other keys (difficulty, gt_len, ...) go to
    ``meta``.
    id: ``id`` / ``qid`` / ``problem_id``, else the record index.
    """
    if query_from not in ("event", "problem"):
        raise ValueError(f"query_from must be 'event' or 'problem', got {query_from!r}")
    ctx = _Ctx(src, on_error, swap_reversed, clamp_tolerance)
    recs = ctx.records(src)
    for i, r in enumerate(recs):
        ctx.report.n_in += 1
        try:
            if not isinstance(r, dict):
                raise DataError("record must be an object", kind="malformed")
            sid = str(r.get("id", r.get("qid", r.get("problem_id", i))))
            ptype = str(r.get("problem_type", "temporal grounding")).strip().lower()
            if ptype != "temporal grounding":
                ctx.skip("unsupported_problem_type")
                continue
            problem = r.get("problem")
            if problem is None and isinstance(r.get("messages"), list) and r["messages"]:
                problem = (r["messages"][0] or {}).get("content")
            if not isinstance(problem, str) or not problem.strip():
                raise DataError("missing field", field="problem", sample_id=sid, kind="missing_field")
            text = problem.replace("<video>", "").strip()
            if query_from == "event":
                m = _EVENT_IN_PROMPT.search(text)
                if not m:
                    raise DataError('no quoted event ("... the event \"QUERY\" in the video ...") in the prompt; '
                                    "use query_from='problem' to keep the whole text", field="problem",
                                    sample_id=sid, kind="unrecognised_prompt")
                text = m.group(1).strip()
            ans = r.get("answer", r.get("solution"))
            if ans is None:
                raise DataError("missing field", field="answer/solution", sample_id=sid, kind="missing_field")
            m = re.search(r"<answer>(.*?)</answer>", str(ans), re.S)
            s, e = _parse_span_str(m.group(1) if m else str(ans))
            videos = r.get("videos")
            if videos is None:
                videos = [r[k] for k in ("video", "path") if r.get(k) is not None][:1]
            if isinstance(videos, str):
                videos = [videos]
            if not isinstance(videos, list) or len(videos) != 1:
                raise DataError(f"expected one video, got {videos!r}", field="videos", sample_id=sid)
            if r.get("duration") is None:
                raise DataError("missing field", field="duration", sample_id=sid, kind="missing_field")
            dur = _number(r["duration"], "duration", sid)
            meta = {"source": "tempsamp_r1", "problem": problem,
                    **({"query_is_prompt": True} if query_from == "problem" else {}),
                    **{k: v for k, v in r.items() if k not in ("id", "qid", "problem_id", "problem", "messages",
                                                               "answer", "solution", "videos", "video", "path",
                                                               "duration")}}
            span = ctx.fix_span(s, e, dur, "answer", sid, meta)
            video = str(videos[0])
            ctx.add(Sample(id=sid, task="tvg", query=text, video=os.path.join(video_dir, video) if video_dir else video,
                           duration=dur, spans=[span], meta=meta))
        except RECORD_ERRORS as ex:
            ctx.fail(ex, record=i)
    return ctx.finish()


# ---------------------------------------------------------------------------------------------- RefCOCO REC
_EXPR_KEYS = ("normal_caption", "sentence", "expression", "text", "problem", "query")
_BOX_KEYS = ("solution", "bbox", "box")


_REC_INSTRUCTION = re.compile(r"^\s*please provide the bounding box coordinates? of the region this sentence "
                              r"describes:\s*", re.I)


def _box_from_text(text: str, sid: str) -> Any:
    """``"[x1, y1, x2, y2]"`` / ``"<answer> [...] </answer>"`` / ``'{"bbox_2d": [...]}'`` -> the parsed value."""
    m = re.search(r"<answer>(.*?)</answer>", text, re.S)
    try:
        box = json.loads((m.group(1) if m else text).strip())
    except json.JSONDecodeError:
        raise DataError(f"box must be a JSON list [x1, y1, x2, y2], got {text!r}", field="bbox",
                        sample_id=sid) from None
    if isinstance(box, dict) and "bbox_2d" in box:
        box = box["bbox_2d"]
    return box


def _vlm_r1_turns(r: dict, sid: str) -> dict:
    """VLM-R1 JSONL record -> the flat layout: expression from the human turn, box text from the gpt turn."""
    turns = r["conversations"]
    if not (isinstance(turns, list) and len(turns) >= 2 and all(isinstance(t, dict) for t in turns[:2])):
        raise DataError("expected [{from: human, value}, {from: gpt, value}]", field="conversations", sample_id=sid)
    image = r.get("image")
    if isinstance(image, list):
        if len(image) != 1:
            raise DataError(f"REC needs one image, got {len(image)}", field="image", sample_id=sid)
        image = image[0]
    out = {k: v for k, v in r.items() if k not in ("conversations", "image")}
    out["image"] = image
    out["problem"] = str(turns[0].get("value", "")).replace("<image>", "").strip()
    out["solution"] = turns[1].get("value")
    out["release_problem"] = str(turns[0].get("value", ""))  # verbatim: the VLM-R1 prompt template reads it
    return out


def convert_refcoco(
    src: str | os.PathLike | list,
    image_dir: str | None = None,
    bbox_format: str = "xyxy",
    sizes: Mapping[str, Iterable[int]] | None = None,
    read_sizes_from: str | os.PathLike | None = None,
    on_error: str = "raise",
) -> tuple[list[Sample], ConvertReport]:
    """RefCOCO-style REC records -> rec samples with ``boxes`` in original-image pixels (xyxy) and ``image_size``.

    Box: ``bbox_format="xyxy"`` ([x1, y1, x2, y2]) or ``"xywh"`` (COCO [x, y, w, h]).  Image size, first found:
    ``width``/``height`` or ``image_size`` in the record, ``sizes[image]``, or the image file read with PIL from
    ``read_sizes_from`` (a directory).  id: ``id`` / ``ann_id``, else the record index.

    VLM-R1's JSONL layout is read too: ``{"id", "image", "conversations": [{"from": "human", "value":
    "<image>EXPRESSION"}, {"from": "gpt", "value": "[x1, y1, x2, y2]"}]}`` (the answer may sit in ``<answer>``
    tags or be ``{"bbox_2d": [...]}``; VLM-R1 reads it with ``json.loads``).  The instruction "Please provide the
    bounding box coordinate of the region this sentence describes:" is removed from an expression that carries it.
    """
    if bbox_format not in ("xyxy", "xywh"):
        raise ValueError(f"bbox_format must be 'xyxy' or 'xywh', got {bbox_format!r}")
    ctx = _Ctx(src, on_error, False, 0.0)
    recs = ctx.records(src)
    for i, r in enumerate(recs):
        ctx.report.n_in += 1
        try:
            if not isinstance(r, dict):
                raise DataError("record must be an object", kind="malformed")
            sid = str(r.get("id", r.get("ann_id", i)))
            if "conversations" in r:
                r = _vlm_r1_turns(r, sid)
            image = r.get("image", r.get("image_path", r.get("file_name")))
            if image is None:
                raise DataError("missing field", field="image", sample_id=sid, kind="missing_field")
            expr = next((r[k] for k in _EXPR_KEYS if isinstance(r.get(k), str) and r[k].strip()), None)
            if expr is None:
                raise DataError(f"missing referring expression (one of {_EXPR_KEYS})", field="sentence",
                                sample_id=sid, kind="missing_field")
            raw_expr = expr
            expr = _REC_INSTRUCTION.sub("", expr)
            box = next((r[k] for k in _BOX_KEYS if r.get(k) is not None), None)
            if box is None:
                raise DataError(f"missing box (one of {_BOX_KEYS})", field="bbox", sample_id=sid,
                                kind="missing_field")
            if isinstance(box, str):
                box = _box_from_text(box, sid)
            boxes = box if (isinstance(box, list) and box and isinstance(box[0], list)) else [box]
            out = []
            for j, b in enumerate(boxes):
                if not (isinstance(b, (list, tuple)) and len(b) == 4):
                    raise DataError(f"must have 4 numbers, got {b!r}", field=f"bbox[{j}]", sample_id=sid)
                b = [_number(x, f"bbox[{j}]", sid) for x in b]
                out.append([b[0], b[1], b[0] + b[2], b[1] + b[3]] if bbox_format == "xywh" else b)
            if "width" in r and "height" in r:
                size = [_integer(r["width"], "width", sid), _integer(r["height"], "height", sid)]
            elif r.get("image_size") is not None:
                size = [_integer(x, "image_size", sid) for x in r["image_size"]]
            elif sizes is not None and image in sizes:
                size = [int(x) for x in sizes[image]]
            elif read_sizes_from is not None:
                from PIL import Image

                p = os.path.join(os.fspath(read_sizes_from), image)
                try:
                    with Image.open(p) as im:
                        size = [int(im.width), int(im.height)]
                except OSError as ex:
                    raise DataError(f"cannot read image size from {p}: {ex}", field="image_size", sample_id=sid,
                                    kind="missing_media") from None
            else:
                raise DataError("missing image size (width/height, image_size, sizes= or read_sizes_from=)",
                                field="image_size", sample_id=sid, kind="missing_field")
            meta = {"source": "refcoco", **{k: v for k, v in r.items() if k not in
                                            ("id", "ann_id", "image", "image_path", "file_name", "width", "height",
                                             "image_size", "release_problem", *_EXPR_KEYS, *_BOX_KEYS)}}
            if expr != raw_expr:  # the release's question text (VLM-R1 data): its prompt template uses it verbatim
                meta["problem"] = r.get("release_problem", raw_expr)
            ctx.add(Sample(id=sid, task="rec", query=expr.strip(),
                           image=os.path.join(image_dir, image) if image_dir else image, boxes=out,
                           image_size=size, meta=meta))
        except RECORD_ERRORS as ex:
            ctx.fail(ex, record=i)
    return ctx.finish()


# ---------------------------------------------------------------------------------------------- VSI-Bench
VSI_MCA_TYPES = ("object_rel_direction_easy", "object_rel_direction_medium", "object_rel_direction_hard",
                 "object_rel_distance", "route_planning", "obj_appearance_order")
VSI_NA_TYPES = ("object_abs_distance", "object_counting", "object_size_estimation", "room_size_estimation")


def convert_vsibench(
    src: str | os.PathLike | list,
    video_dir: str | None = None,
    subset: str = "all",
    on_error: str = "raise",
) -> tuple[list[Sample], ConvertReport]:
    """VSI-Bench (``nyu-visionx/VSI-Bench``, its test split exported to JSON / JSONL) -> mcq and qa samples.

    Record: ``id``, ``dataset`` (arkitscenes | scannet | scannetpp), ``scene_name``, ``question_type``,
    ``question``, ``options`` (["A. left", ...]; multiple-choice types) and ``ground_truth`` (the letter, or the
    number as text).  The release's video is ``DATASET/SCENE_NAME.mp4``.  Multiple-choice types
    (``object_rel_direction_*``, ``object_rel_distance``, ``route_planning``, ``obj_appearance_order``) -> task
    ``mcq``; numerical types (``object_counting``, ``object_abs_distance``, ``object_size_estimation``,
    ``room_size_estimation``) -> task ``qa`` with ``meta.problem_type = "numerical"`` (scored with MRA by
    ``eval/benchmarks.py vsibench``).  ``meta`` keeps ``question_type``, ``dataset``, ``scene_name``.
    ``subset``: "all" (``eval/configs/vsibench.yaml`` evaluates both kinds in one run), "mca" (the
    multiple-choice half) or "na" (the numerical half); the others are skipped and counted as ``other_subset``."""
    if subset not in ("all", "mca", "na"):
        raise ValueError(f"subset must be 'all', 'mca' or 'na', got {subset!r}")
    ctx = _Ctx(src, on_error, False, 0.0)
    for i, r in enumerate(ctx.records(src)):
        ctx.report.n_in += 1
        try:
            if not isinstance(r, dict):
                raise DataError("record must be an object", kind="malformed")
            sid = str(r.get("id", i))
            for k in ("dataset", "scene_name", "question_type", "question", "ground_truth"):
                if r.get(k) is None:
                    raise DataError("missing field", field=k, sample_id=sid, kind="missing_field")
            qtype = str(r["question_type"])
            if (subset == "mca" and qtype in VSI_NA_TYPES) or (subset == "na" and qtype in VSI_MCA_TYPES):
                ctx.skip("other_subset")
                continue
            video = f"{r['dataset']}/{r['scene_name']}.mp4"
            video = os.path.join(video_dir, video) if video_dir else video
            meta = {"source": "vsibench", "question_type": qtype, "dataset": str(r["dataset"]),
                    "scene_name": str(r["scene_name"])}
            if qtype in VSI_MCA_TYPES:
                if not r.get("options"):
                    raise DataError("multiple-choice question without options", field="options", sample_id=sid)
                options = split_options(r["options"])
                ctx.add(Sample(id=sid, task="mcq", query=str(r["question"]).strip(), video=video, options=options,
                               answer=answer_letter(r["ground_truth"], options), meta=meta))
            elif qtype in VSI_NA_TYPES:
                gt = str(r["ground_truth"]).strip()
                if _number(gt, "ground_truth", sid) == 0:
                    raise DataError("numerical ground truth 0 has no relative error (MRA)", field="ground_truth",
                                    sample_id=sid)
                ctx.add(Sample(id=sid, task="qa", query=str(r["question"]).strip(), video=video, answer=gt,
                               meta={**meta, "problem_type": "numerical"}))
            else:
                raise DataError(f"unknown question_type {qtype!r}; expected one of {VSI_MCA_TYPES + VSI_NA_TYPES}",
                                field="question_type", sample_id=sid, kind="unsupported_problem_type")
        except RECORD_ERRORS as ex:
            ctx.fail(ex, record=i)
    return ctx.finish()


# ---------------------------------------------------------------------------------------------- QVHighlights
def convert_qvhighlights(
    src: str | os.PathLike | list,
    video_dir: str | None = None,
    video_template: str = "{vid}.mp4",
    on_error: str = "raise",
    swap_reversed: bool = False,
    clamp_tolerance: float = 5.0,
) -> tuple[list[Sample], ConvertReport]:
    """QVHighlights ``highlight_{train,val}_release.jsonl`` (jayleicn/moment_detr) -> tvg samples with every
    relevant window as a span.

    Line: ``qid``, ``query``, ``duration`` (150 for most clips), ``vid`` (``YOUTUBEID_START_END``, the clip file
    name), ``relevant_windows`` ([[s, e], ...] seconds), ``relevant_clip_ids`` (2-second clip indices) and
    ``saliency_scores`` ([[a, b, c], ...] per relevant clip, 3 annotators, 0-4).  id = ``qid``; ``meta`` keeps
    ``qid``, ``vid``, ``relevant_clip_ids`` and ``saliency_scores`` (highlight detection in
    ``eval/benchmarks.py qvhighlights``).  The test release has no windows: it is an error naming the line (its
    ground truth is on the CodaLab server)."""
    ctx = _Ctx(src, on_error, swap_reversed, clamp_tolerance)
    for i, r in enumerate(ctx.records(src)):
        ctx.report.n_in += 1
        try:
            if not isinstance(r, dict):
                raise DataError("record must be an object", kind="malformed")
            if r.get("qid") is None:
                raise DataError("missing field", field="qid", kind="missing_field")
            sid = str(r["qid"])
            for k in ("query", "duration", "vid"):
                if r.get(k) is None:
                    raise DataError("missing field", field=k, sample_id=sid, kind="missing_field")
            if not r.get("relevant_windows"):
                raise DataError("no relevant_windows (the test release has no ground truth: it is scored on the "
                                "CodaLab server)", field="relevant_windows", sample_id=sid, kind="missing_field")
            dur = _number(r["duration"], "duration", sid)
            clips, sal = r.get("relevant_clip_ids"), r.get("saliency_scores")
            if clips is not None or sal is not None:
                if not (isinstance(clips, list) and isinstance(sal, list) and len(clips) == len(sal)):
                    raise DataError("relevant_clip_ids and saliency_scores must be lists of the same length",
                                    field="saliency_scores", sample_id=sid)
                if any(not (isinstance(x, list) and len(x) == 3) for x in sal):
                    raise DataError("each saliency entry must hold 3 annotator scores", field="saliency_scores",
                                    sample_id=sid)
            meta = {"source": "qvhighlights", "qid": r["qid"], "vid": str(r["vid"]),
                    **({"relevant_clip_ids": clips, "saliency_scores": sal} if clips is not None else {})}
            spans = []
            for j, w in enumerate(r["relevant_windows"]):
                if not (isinstance(w, (list, tuple)) and len(w) == 2):
                    raise DataError(f"must be [start, end], got {w!r}", field=f"relevant_windows[{j}]",
                                    sample_id=sid)
                spans.append(ctx.fix_span(w[0], w[1], dur, f"relevant_windows[{j}]", sid, meta))
            ctx.add(Sample(id=sid, task="tvg", query=str(r["query"]).strip(),
                           video=_video_path(video_dir, str(r["vid"]), video_template), duration=dur, spans=spans,
                           meta=meta))
        except RECORD_ERRORS as ex:
            ctx.fail(ex, record=i)
    return ctx.finish()


# ---------------------------------------------------------------------------------------------- SEED-Bench-R1
def _level_from_name(src) -> str | None:
    if isinstance(src, (str, os.PathLike)):
        m = re.search(r"(?:^|[_\-])(L[123])(?:\.|_|$)", os.path.basename(os.fspath(src)))
        if m:
            return m.group(1)
    return None


def convert_seed_bench_r1(
    src: str | os.PathLike | list,
    media_dir: str | None = None,
    level: str | None = None,
    seed: int = 0,
    on_error: str = "raise",
) -> tuple[list[Sample], ConvertReport]:
    """SEED-Bench-R1 (TencentARC/SEED-Bench-R1; EgoPlan-Bench / EgoPlan-Bench2 data) -> mcq samples.

    Validation line (``validation_L{1,2,3}.jsonl``): ``sample_id`` (or ``id``), ``question``, ``choice_a`` ..
    ``choice_d``, ``golden_choice_idx`` (the letter), ``answer`` (the golden text), ``video_source``,
    ``video_basename``, ``current_observation_basename``, ``task_progress_metadata``.  Training line: ``answer``
    and ``negative_answers`` instead of the choices: as the release, 3 negatives and the answer in a shuffled
    order (here seeded: ``seed`` and the record index, so a rerun writes the same file).

    Media as the release lays it out: the task-progress video ``videos/SOURCE/VIDEO_BASENAME`` when
    ``task_progress_metadata`` is non-empty, and the current-observation frame ``images/SOURCE/BASENAME``.  The
    canonical schema holds one medium: the video when there is one (the frame's path goes to
    ``meta.current_observation``, not shown to the model by the project's prompts), else the frame as ``image``.
    ``level`` (``L1`` | ``L2`` | ``L3``, in ``meta.level`` for the per-level accuracy) defaults to the one in the
    file name."""
    import random

    level = level or _level_from_name(src)
    ctx = _Ctx(src, on_error, False, 0.0)

    def media(rel: str) -> str:
        return os.path.join(media_dir, rel) if media_dir else rel

    for i, r in enumerate(ctx.records(src)):
        ctx.report.n_in += 1
        try:
            if not isinstance(r, dict):
                raise DataError("record must be an object", kind="malformed")
            sid = str(r.get("sample_id", r.get("id", i)))
            for k in ("question", "video_source", "current_observation_basename"):
                if r.get(k) is None:
                    raise DataError("missing field", field=k, sample_id=sid, kind="missing_field")
            if "golden_choice_idx" in r:
                options = [str(r.get(f"choice_{c}", "")).strip() for c in "abcd"]
                if not all(options):
                    raise DataError("choice_a .. choice_d must be non-empty", field="choice_a", sample_id=sid)
                letter = answer_letter(r["golden_choice_idx"], options)
                if r.get("answer") is not None and options[LETTERS.index(letter)] != str(r["answer"]).strip():
                    raise DataError(f"golden_choice_idx {r['golden_choice_idx']!r} is not the answer text "
                                    f"{r['answer']!r}", field="golden_choice_idx", sample_id=sid,
                                    kind="answer_mismatch")
            else:
                neg = r.get("negative_answers")
                if r.get("answer") is None or not isinstance(neg, list) or len(neg) < 3:
                    raise DataError("needs choice_a..d + golden_choice_idx, or answer + >= 3 negative_answers",
                                    field="negative_answers", sample_id=sid, kind="missing_field")
                rng = random.Random(f"{seed}:{i}")
                options = [str(x) for x in rng.sample(neg, 3)] + [str(r["answer"])]
                rng.shuffle(options)
                letter = LETTERS[options.index(str(r["answer"]))]
            src_dir = str(r["video_source"])
            frame = media(os.path.join("images", src_dir, str(r["current_observation_basename"])))
            meta = {"source": "seed_bench_r1", **({"level": level} if level else {})}
            meta.update({k: v for k, v in r.items() if k in ("video_source", "task_goal", "task_progress_metadata")})
            if r.get("task_progress_metadata"):
                if r.get("video_basename") is None:
                    raise DataError("missing field", field="video_basename", sample_id=sid, kind="missing_field")
                kw = {"video": media(os.path.join("videos", src_dir, str(r["video_basename"])))}
                meta["current_observation"] = frame
            else:
                kw = {"image": frame}
            ctx.add(Sample(id=sid, task="mcq", query=str(r["question"]).strip(), options=options, answer=letter,
                           meta=meta, **kw))
        except RECORD_ERRORS as ex:
            ctx.fail(ex, record=i)
    return ctx.finish()


# ---------------------------------------------------------------------------------------------- LongVideoBench
def convert_longvideobench(
    src: str | os.PathLike | list,
    video_dir: str | None = None,
    on_error: str = "raise",
) -> tuple[list[Sample], ConvertReport]:
    """LongVideoBench ``lvb_val.json`` (longvideobench/LongVideoBench) -> mcq samples.

    Record: ``id``, ``question``, ``candidates`` (4-5 option texts), ``correct_choice`` (0-based index),
    ``video_path`` (under ``videos/``), ``duration``, ``duration_group`` (15 | 60 | 600 | 3600),
    ``question_category``, ``topic_category``, ``level``, ``subtitle_path``,
    ``starting_timestamp_for_subtitles``; those go to ``meta`` (the breakdowns of
    ``eval/configs/longvideobench.yaml``).  Subtitles are not rendered by the project's prompts (the
    SEED-Bench-R1 / Video-R1 setting: video + question); ``lvb_test_wo_gt.json`` has no ``correct_choice``: an
    error naming the record."""
    ctx = _Ctx(src, on_error, False, 0.0)
    for i, r in enumerate(ctx.records(src)):
        ctx.report.n_in += 1
        try:
            if not isinstance(r, dict):
                raise DataError("record must be an object", kind="malformed")
            sid = str(r.get("id", i))
            for k in ("question", "candidates", "video_path"):
                if r.get(k) is None:
                    raise DataError("missing field", field=k, sample_id=sid, kind="missing_field")
            if r.get("correct_choice") is None:
                raise DataError("no correct_choice (lvb_test_wo_gt.json has no ground truth)", field="correct_choice",
                                sample_id=sid, kind="missing_field")
            options = [str(c).strip() for c in r["candidates"]]
            letter = answer_letter(_integer(r["correct_choice"], "correct_choice", sid), options)
            dur = _number(r["duration"], "duration", sid) if r.get("duration") is not None else None
            path = os.path.join("videos", str(r["video_path"]))
            meta = {"source": "longvideobench", **{k: r[k] for k in (
                "video_id", "duration_group", "question_category", "topic_category", "level", "subtitle_path",
                "starting_timestamp_for_subtitles", "position") if k in r}}
            ctx.add(Sample(id=sid, task="mcq", query=str(r["question"]).strip(),
                           video=os.path.join(video_dir, path) if video_dir else path, duration=dur, options=options,
                           answer=letter, meta=meta))
        except RECORD_ERRORS as ex:
            ctx.fail(ex, record=i)
    return ctx.finish()


# ---------------------------------------------------------------------------------------------- MMVU
_MMVU_URL = re.compile(r"^https?://huggingface\.co/datasets/yale-nlp/MMVU/resolve/[^/]+/")


def convert_mmvu(
    src: str | os.PathLike | list,
    video_dir: str | None = None,
    subset: str = "all",
    on_error: str = "raise",
) -> tuple[list[Sample], ConvertReport]:
    """MMVU ``validation.json`` (yale-nlp/MMVU) -> mcq (multiple-choice) and qa free-form (open-ended) samples.

    Record: ``id``, ``video`` (a Hugging Face URL ``.../resolve/main/videos/SUBJECT/N.mp4``: the local path is
    the part after ``resolve/main/``), ``question_type`` ("multiple-choice" | "open-ended"), ``question``,
    ``choices`` ({"A": ..., "E": ...}; empty strings for open-ended), ``answer`` (the letter, or the answer
    text), ``metadata`` (``subject``, ``textbook``, ``rationale``, ``knowledge``; ``subject`` is copied to
    ``meta.subject`` for the breakdown).  ``subset``: "all" | "mc" | "open" (the others are skipped and counted
    as ``other_subset``).  The release grades both kinds with a GPT-4o judge; Video-R1 reports the
    multiple-choice part with exact letters (``eval/configs/mmvu_mc.yaml``)."""
    if subset not in ("all", "mc", "open"):
        raise ValueError(f"subset must be 'all', 'mc' or 'open', got {subset!r}")
    ctx = _Ctx(src, on_error, False, 0.0)
    for i, r in enumerate(ctx.records(src)):
        ctx.report.n_in += 1
        try:
            if not isinstance(r, dict):
                raise DataError("record must be an object", kind="malformed")
            sid = str(r.get("id", i))
            for k in ("video", "question_type", "question", "answer"):
                if r.get(k) is None:
                    raise DataError("missing field", field=k, sample_id=sid, kind="missing_field")
            qtype = str(r["question_type"])
            if qtype not in ("multiple-choice", "open-ended"):
                raise DataError(f"question_type must be 'multiple-choice' or 'open-ended', got {qtype!r}",
                                field="question_type", sample_id=sid)
            if (subset == "mc" and qtype != "multiple-choice") or (subset == "open" and qtype != "open-ended"):
                ctx.skip("other_subset")
                continue
            path = _MMVU_URL.sub("", str(r["video"]))
            video = os.path.join(video_dir, path) if video_dir else path
            md = r.get("metadata") if isinstance(r.get("metadata"), dict) else {}
            meta = {"source": "mmvu", "question_type": qtype, "subject": md.get("subject"), "metadata": md}
            if qtype == "multiple-choice":
                choices = r.get("choices")
                if not isinstance(choices, dict):
                    raise DataError("multiple-choice needs a choices object", field="choices", sample_id=sid)
                keys = [k for k in sorted(choices) if str(choices[k]).strip()]
                if keys != list(LETTERS[:len(keys)]):
                    raise DataError(f"choices must be A, B, ... without gaps, got {keys}", field="choices",
                                    sample_id=sid)
                options = [str(choices[k]).strip() for k in keys]
                ctx.add(Sample(id=sid, task="mcq", query=str(r["question"]).strip(), video=video, options=options,
                               answer=answer_letter(r["answer"], options), meta=meta))
            else:
                ctx.add(Sample(id=sid, task="qa", query=str(r["question"]).strip(), video=video,
                               answer=str(r["answer"]).strip(), meta={**meta, "problem_type": "free-form"}))
        except RECORD_ERRORS as ex:
            ctx.fail(ex, record=i)
    return ctx.finish()


# ---------------------------------------------------------------------------------------------- CLEVRER
CLEVRER_CHOICE_PROMPT = "{question}\nIs the following choice correct? {choice}"


def convert_clevrer(
    src: str | os.PathLike | list,
    video_dir: str | None = None,
    subset: str = "all",
    on_error: str = "raise",
) -> tuple[list[Sample], ConvertReport]:
    """CLEVRER question files (``train.json`` / ``validation.json``) -> qa and mcq samples.

    File: a list of videos ``{scene_index, video_filename, questions: [...]}``; a question has ``question_id``,
    ``question``, ``question_type`` (descriptive | explanatory | predictive | counterfactual) and either
    ``answer`` (descriptive: "yes", "2", "red", ...) or ``choices`` ([{choice_id, choice, answer: "correct" |
    "wrong"}]; several may be correct).  Descriptive -> task ``qa`` (``problem_type`` numerical for counts,
    free-form otherwise; scored by exact answer).  The other types are scored per option (the benchmark's
    per-option and per-question accuracy), so each choice becomes one yes/no ``mcq`` sample (query:
    :data:`CLEVRER_CHOICE_PROMPT`, options ["yes", "no"], id ``SCENE_QUESTION_CHOICE``) with ``meta.question_id``
    grouping the choices of a question.  The test file has no answers: an error naming the question.  The video:
    ``video_dir/VIDEO_FILENAME`` (the release sorts them into 1000-video folders: point ``video_dir`` at one or
    flatten them).  ``subset``: "all", "mc" (the choice questions only: ``eval/configs/clevrer_mc.yaml``) or
    "descriptive"; the others are skipped and counted as ``other_subset``."""
    if subset not in ("all", "mc", "descriptive"):
        raise ValueError(f"subset must be 'all', 'mc' or 'descriptive', got {subset!r}")
    ctx = _Ctx(src, on_error, False, 0.0)
    for i, scene in enumerate(ctx.records(src)):
        try:
            if not isinstance(scene, dict):
                raise DataError("record must be an object", kind="malformed")
            for k in ("scene_index", "video_filename", "questions"):
                if scene.get(k) is None:
                    raise DataError("missing field", field=k, kind="missing_field")
        except RECORD_ERRORS as ex:
            ctx.report.n_in += 1
            ctx.fail(ex, record=i)
            continue
        scene_ix = scene["scene_index"]
        fn = str(scene["video_filename"])
        video = os.path.join(video_dir, fn) if video_dir else fn
        for q in scene["questions"]:
            ctx.report.n_in += 1
            qid = q.get("question_id") if isinstance(q, dict) else None
            sid = f"{scene_ix}_{qid}"
            try:
                if not isinstance(q, dict) or qid is None or not q.get("question"):
                    raise DataError("question must be an object with question_id and question", sample_id=sid,
                                    kind="malformed")
                qtype = str(q.get("question_type"))
                if (subset == "mc" and qtype == "descriptive") or (subset == "descriptive" and qtype != "descriptive"):
                    ctx.skip("other_subset")
                    continue
                meta = {"source": "clevrer", "scene_index": scene_ix, "question_id": qid, "question_type": qtype,
                        **({"question_subtype": q["question_subtype"]} if "question_subtype" in q else {})}
                if qtype == "descriptive":
                    if q.get("answer") is None:
                        raise DataError("no answer (the test file has none)", field="answer", sample_id=sid,
                                        kind="missing_field")
                    ans = str(q["answer"]).strip()
                    ptype = "numerical" if re.fullmatch(r"\d+", ans) else "free-form"
                    ctx.add(Sample(id=sid, task="qa", query=str(q["question"]).strip(), video=video, answer=ans,
                                   meta={**meta, "problem_type": ptype}))
                    continue
                if qtype not in ("explanatory", "predictive", "counterfactual"):
                    raise DataError(f"unknown question_type {qtype!r}", field="question_type", sample_id=sid)
                choices = q.get("choices")
                if not isinstance(choices, list) or not choices:
                    raise DataError("needs choices", field="choices", sample_id=sid, kind="missing_field")
                for c in choices:
                    verdict = str(c.get("answer", "")).lower() if isinstance(c, dict) else ""
                    if verdict not in ("correct", "wrong"):
                        raise DataError(f"choice answer must be 'correct' or 'wrong', got {verdict!r}",
                                        field="choices", sample_id=sid)
                    ctx.add(Sample(id=f"{sid}_{c.get('choice_id')}", task="mcq",
                                   query=CLEVRER_CHOICE_PROMPT.format(question=str(q["question"]).strip(),
                                                                      choice=str(c.get("choice", "")).strip()),
                                   video=video, options=["yes", "no"], answer="A" if verdict == "correct" else "B",
                                   meta={**meta, "choice_id": c.get("choice_id")}))
            except RECORD_ERRORS as ex:
                ctx.fail(ex, record=sid)
    return ctx.finish()


FORMATS: dict[str, Callable[..., tuple[list[Sample], ConvertReport]]] = {
    "charades_sta": convert_charades_sta,
    "dense_captions": convert_dense_captions,
    "activitynet": convert_dense_captions,
    "time_r1": convert_time_r1,
    "tvgbench": convert_time_r1,
    "nextgqa": convert_nextgqa,
    "video_r1": convert_video_r1,
    "tempsamp": convert_tempsamp,
    "refcoco": convert_refcoco,
    "vsibench": convert_vsibench,
    "qvhighlights": convert_qvhighlights,
    "seed_bench_r1": convert_seed_bench_r1,
    "longvideobench": convert_longvideobench,
    "mmvu": convert_mmvu,
    "clevrer": convert_clevrer,
}
