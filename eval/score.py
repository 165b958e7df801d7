#!/usr/bin/env python
"""Score model predictions against canonical-schema annotations.

    python eval/score.py tvg --predictions preds.jsonl --annotations ann.jsonl --out metrics.json \
        [--by dataset,duration_bucket] [--per-sample per_sample.jsonl]
    python eval/score.py mcq ...     # accuracy, soft accuracy (TW-GRPO partial credit), numeric MRA; numerical /
                                     # regression qa samples of a mixed file (VSI-Bench) are read as numbers
    python eval/score.py gqa ...     # answer accuracy + evidence mIoU / mIoP / IoU@θ / IoP@θ / Acc@GQA
    python eval/score.py rec --box-frame qwen2_5_vl ...   # Acc@0.5 and mean box IoU

Predictions: JSON lines ``{"id", "output": raw model text, ...}`` (other fields are kept in the per-sample file).
Annotations: canonical JSON lines ``{id, duration, spans, task, options?, answer?, boxes?, image_size?,
video_start?, video_end?, meta}``, read here as plain JSON (no dependency on the data loaders).

Protocols (``--protocol``, default ``official``; every report carries **both**, with parse-failure counts, in
``metrics["protocols"]``, and the CLI prints a two-line comparison on stderr):

* ``official`` reproduces the evaluation released with the benchmark or, where the benchmark has none, with the
  paper being reproduced (named in ``metrics["protocol"]["reference"]``): tvg = Time-R1's evaluation
  (``time_r1_eval``: last "A to B" in the output, no swap, no clamp, R1@θ counts IoU > θ, missing predictions
  not counted), mcq = Video-R1's evaluation (``video_r1_eval``: first closed answer block, else the whole
  output; exact letter; decimal-mark rule and 2-decimal rounding for numbers), rec = VLM-R1's REC evaluation
  (``vlm_r1_eval``: integer boxes, last box inside {...}, IoU > 0.5, no clamping), gqa = NExT-GQA's grounding
  evaluation (``nextgqa``: a zero-length span inside the ground truth has IoP 1, no clamping, missing predictions
  not counted; the answer letter as VideoChat-R1's GQA evaluation reads it). ``--official-mode`` picks another release mode of the task (e.g. ``tempsamp_r1`` for tvg).
  The parse modes are documented in ``mmgrpo.vlm.rewards.protocols``.
* ``lenient`` is the project's tolerant parser, with the rules below.

Missing predictions: an empty or partial predictions file is an error (exit 1, with a warning naming the count)
unless ``--allow-missing``; the API (:func:`score`) never refuses and reports ``n_missing``.

Lenient rules (identical parsing and IoU to the training rewards: everything is imported from ``mmgrpo.vlm.rewards``):
* the answer is read from the **last** ``<answer>`` block; with no block the whole text is parsed
  (``--no-fallback`` turns that off); the choice is recorded in ``metrics["config"]`` and the number of outputs
  that needed it in ``n_fallback``;
* reversed spans are swapped (``n_reversed``); spans are clamped to [0, duration] (``n_clamped``); predicted
  times are clip-relative when the annotation has ``video_start`` (see ``mmgrpo.vlm.rewards.tasks``);
* an unparseable output scores IoU 0 / wrong; an annotation with no prediction also scores 0 and is counted in
  ``n_missing`` (it is included in ``n`` and in every rate); ``parse_failure_rate`` is over the outputs that
  exist (n − n_missing); predictions whose id is not in the annotations are ignored and counted in
  ``n_unmatched_predictions``;
* duplicate ids (in either file) and malformed annotations are errors naming file, line and field.
All rates and means are percentages. Importable: ``score_tvg(preds, anns, **opts) -> dict`` and friends.

``--export FORMAT[,FORMAT] --export-dir DIR`` also writes the scored predictions in the files the benchmarks' own
evaluation code reads (lmms_eval_tvg, time_r1_tvg, nextgqa, refcoco, lmms_eval_refcoco; formats and their
sources in ``eval/export.py`` and ``docs/benchmarks.md``), from the selected protocol's parsed answers.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

if __package__ in (None, ""):  # executed as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval.metrics import DEFAULT_DURATION_BUCKETS, breakdown, group_value, mean_pct, pct, rate_at  # noqa: E402
from mmgrpo.vlm.models.adapters import ADAPTERS  # noqa: E402
from mmgrpo.vlm.rewards.box import BOX_FRAMES, resolve_box_frame, smart_resize  # noqa: E402
from mmgrpo.vlm.rewards.choice import mcq_exact, mcq_soft  # noqa: E402
from mmgrpo.vlm.rewards.numeric import mean_relative_accuracy, numeric_reward  # noqa: E402
from mmgrpo.vlm.rewards.parsing import ParseStatus  # noqa: E402
from mmgrpo.vlm.rewards.protocols import PARSE_MODES, check_parse_mode  # noqa: E402
from mmgrpo.vlm.rewards.tasks import (  # noqa: E402
    ParseConfig,
    SampleError,
    box_best_iou,
    gt_letters,
    gt_number,
    numeric_correct,
    prepare_box,
    prepare_choice,
    prepare_number,
    prepare_temporal,
    span_iop,
    span_iou,
    span_multi_iou,
)

__all__ = [
    "ScoreInputError",
    "ScoreResult",
    "read_jsonl",
    "score",
    "score_tvg",
    "score_mcq",
    "score_gqa",
    "score_rec",
    "main",
]

TASKS = ("tvg", "mcq", "gqa", "rec")
PROTOCOLS = ("official", "lenient")
# the release evaluation each task's "official" protocol reproduces
OFFICIAL_MODE = {"tvg": "time_r1_eval", "mcq": "video_r1_eval", "gqa": "nextgqa", "rec": "vlm_r1_eval"}
# modes whose evaluation counts a hit only when IoU > θ (the others: IoU >= θ)
_STRICT_THRESHOLD_MODES = ("time_r1_eval", "vlm_r1_eval")
# modes whose evaluation averages over the predictions that exist (Time-R1 iterates over its prediction files,
# NExT-GQA skips questions without a prediction); the others divide by every annotation
_SKIP_MISSING_MODES = ("time_r1_eval", "nextgqa")
TVG_THRESHOLDS = (0.3, 0.5, 0.7)
# open-answer (qa) samples the mcq scorer reads as numbers (their answer compared numerically, plus MRA)
NUMERIC_QA_TYPES = ("numerical", "regression")
GQA_THRESHOLDS = (0.3, 0.5)


class ScoreInputError(ValueError):
    """Bad prediction/annotation input; the message names the file (or list) and line (or index)."""


@dataclass
class ScoreResult:
    metrics: dict
    per_sample: list[dict] = field(default_factory=list)


Located = tuple[str, Mapping[str, Any]]  # ("file.jsonl:12" or "annotations[11]", record)


def read_jsonl(path: str | Path) -> list[Located]:
    """Records of a JSON-lines file with their ``file:line`` location; blank lines are skipped."""
    out: list[Located] = []
    path = Path(path)
    with path.open("r", encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{i}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ScoreInputError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(rec, dict):
                raise ScoreInputError(f"{where}: expected a JSON object, got {type(rec).__name__}")
            out.append((where, rec))
    return out


def _locate(records: Iterable[Any], name: str) -> list[Located]:
    out: list[Located] = []
    for i, r in enumerate(records):
        if isinstance(r, tuple) and len(r) == 2 and isinstance(r[0], str):
            where, rec = r
        else:
            where, rec = f"{name}[{i}]", r
        if not isinstance(rec, Mapping):
            raise ScoreInputError(f"{where}: expected a dict, got {type(rec).__name__}")
        out.append((where, rec))
    return out


def _id_of(where: str, rec: Mapping[str, Any]) -> str:
    if "id" not in rec or rec["id"] is None:
        raise ScoreInputError(f"{where}: field 'id' missing")
    if not isinstance(rec["id"], (str, int)) or isinstance(rec["id"], bool):
        raise ScoreInputError(f"{where}: field 'id' must be a string or integer, got {rec['id']!r}")
    return str(rec["id"])


def _index_predictions(preds: list[Located]) -> dict[str, Located]:
    idx: dict[str, Located] = {}
    for where, rec in preds:
        pid = _id_of(where, rec)
        if pid in idx:
            raise ScoreInputError(f"{where}: duplicate prediction id {pid!r} (first at {idx[pid][0]})")
        if "output" not in rec:
            raise ScoreInputError(f"{where}: field 'output' missing (raw model text)")
        if rec["output"] is not None and not isinstance(rec["output"], str):
            raise ScoreInputError(f"{where}: field 'output' must be a string, got {type(rec['output']).__name__}")
        idx[pid] = (where, rec)
    return idx


def _select_annotations(anns: list[Located], task: str, skip_other_tasks: bool) -> tuple[list[Located], int]:
    seen: dict[str, str] = {}
    out: list[Located] = []
    skipped = 0
    for where, rec in anns:
        aid = _id_of(where, rec)
        if aid in seen:
            raise ScoreInputError(f"{where}: duplicate annotation id {aid!r} (first at {seen[aid]})")
        seen[aid] = where
        t = rec.get("task")
        if task == "mcq" and t == "qa":  # Video-R1's mixed files: a numerical answer is scored next to the letters
            ptype = (rec.get("meta") or {}).get("problem_type") if isinstance(rec.get("meta"), Mapping) else None
            if ptype not in NUMERIC_QA_TYPES:
                raise ScoreInputError(f"{where}: an open-answer (qa) sample of problem_type {ptype!r} cannot be scored "
                                      f"as mcq (only {NUMERIC_QA_TYPES}: their number is compared)")
            out.append((where, rec))
            continue
        if t is not None and t != task:
            if skip_other_tasks:
                skipped += 1
                continue
            raise ScoreInputError(
                f"{where}: field 'task' is {t!r} but scoring {task!r} (use --skip-other-tasks to ignore such lines)"
            )
        out.append((where, rec))
    return out, skipped


# ------------------------------------------------------------------------------------------------------------
# Per-task sample scoring
# ------------------------------------------------------------------------------------------------------------


def _tvg_record(output: Optional[str], ann: Mapping[str, Any], pc: ParseConfig, opts: dict) -> dict:
    tp = prepare_temporal(output, ann, pc)
    return {
        "iou": span_iou(tp),
        "parse_status": tp.status.value,
        "source": tp.source,
        "pred_span": tp.absolute(tp.pred),
        "gt_spans": [tp.absolute(g) for g in tp.gts],
        "reversed": tp.reversed,
        "clamped": tp.clamped,
    }


def _tvg_aggregate(recs: list[dict], opts: dict) -> dict:
    m = _common_counts(recs)
    recs = _scored(recs, opts, m)
    ious = [r["iou"] for r in recs]
    for t in opts["thresholds"]:
        m[f"R1@{t:g}"] = _rate(ious, t, opts)
    m["mIoU"] = mean_pct(ious)
    m["n_reversed"] = sum(1 for r in recs if r.get("reversed"))
    m["n_outside_video" if opts["strict_mode"] else "n_clamped"] = sum(1 for r in recs if r.get("clamped"))
    return m


def _scored(recs: list[dict], opts: dict, m: dict) -> list[dict]:
    """The records the metrics average over: all, or (release modes that do so) only those with a prediction."""
    if opts.get("skip_missing"):
        recs = [r for r in recs if not r["missing"]]
        m["n_scored"] = len(recs)
    return recs


def _rate(values: Sequence[float], t: float, opts: dict) -> Optional[float]:
    if opts.get("strict_threshold"):
        return pct(sum(1 for v in values if v > t), len(values))
    return rate_at(values, t)


def _mcq_record(output: Optional[str], ann: Mapping[str, Any], pc: ParseConfig, opts: dict) -> dict:
    numeric = ann.get("options") in (None, [], {}) and _is_number(ann.get("answer"))
    if numeric:
        p = prepare_number(output, ann, pc)
        gt = gt_number(ann)
        if opts["strict_mode"]:
            acc = numeric_correct(output, ann, pc)
        else:
            acc = numeric_reward(p.value, gt, rel_tol=opts["numeric_rel_tol"])
        return {
            "kind": "numeric",
            "correct": acc,
            "soft": acc,
            "mra": mean_relative_accuracy(p.value, gt),
            "parse_status": p.status.value,
            "source": p.source,
            "pred": p.value,
            "gt": gt,
        }
    p = prepare_choice(output, ann, pc)
    gt = gt_letters(ann)
    return {
        "kind": "choice",
        "correct": mcq_exact(p.value, gt),
        "soft": mcq_soft(p.value, gt),
        "parse_status": p.status.value,
        "source": p.source,
        "pred": None if p.value is None else list(p.value),
        "gt": list(gt),
    }


def _is_number(x: Any) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, (int, float)):
        return math.isfinite(x)
    if isinstance(x, str):
        try:
            return math.isfinite(float(x.strip().replace(",", "")))
        except ValueError:
            return False
    return False


def _mcq_aggregate(recs: list[dict], opts: dict) -> dict:
    m = _common_counts(recs)
    recs = _scored(recs, opts, m)
    m["accuracy"] = mean_pct([r["correct"] for r in recs])
    if not opts["strict_mode"]:  # TW-GRPO partial credit: not part of any release's evaluation
        m["soft_accuracy"] = mean_pct([r["soft"] for r in recs])
    num = [r for r in recs if r.get("kind") == "numeric"]
    if num:
        m["n_numeric"] = len(num)
        m["mra"] = mean_pct([r["mra"] for r in num])
    return m


def _gqa_record(output: Optional[str], ann: Mapping[str, Any], pc: ParseConfig, opts: dict) -> dict:
    p = prepare_choice(output, ann, pc)
    gt = gt_letters(ann)
    tp = prepare_temporal(output, ann, pc, evidence=True)
    return {
        "correct": mcq_exact(p.value, gt),
        "soft": mcq_soft(p.value, gt),
        "iou": span_iou(tp),
        "iop": span_iop(tp),
        "iou_union": span_multi_iou(tp),
        "parse_status": p.status.value,
        "span_parse_status": tp.status.value,
        "source": p.source,
        "pred": None if p.value is None else list(p.value),
        "gt": list(gt),
        "pred_span": tp.absolute(tp.pred),
        "gt_spans": [tp.absolute(g) for g in tp.gts],
        "reversed": tp.reversed,
        "clamped": tp.clamped,
    }


def _gqa_aggregate(recs: list[dict], opts: dict) -> dict:
    m = _common_counts(recs)
    present = [r for r in recs if not r["missing"]]
    recs = _scored(recs, opts, m)
    ious = [r["iou"] for r in recs]
    iops = [r["iop"] for r in recs]
    m["accuracy"] = mean_pct([r["correct"] for r in recs])
    if not opts["strict_mode"]:
        m["soft_accuracy"] = mean_pct([r["soft"] for r in recs])
    m["mIoU"] = mean_pct(ious)
    m["mIoP"] = mean_pct(iops)
    for t in opts["gqa_thresholds"]:
        m[f"IoU@{t:g}"] = _rate(ious, t, opts)
    for t in opts["gqa_thresholds"]:
        m[f"IoP@{t:g}"] = _rate(iops, t, opts)
    # NExT-GQA: answered correctly AND grounded (IoP >= 0.5)
    m["Acc@GQA"] = pct(sum(1 for r in recs if r["correct"] == 1.0 and r["iop"] >= 0.5), len(recs))
    if not opts["strict_mode"]:  # VideoChat-R1-style merged-interval IoU: a project diagnostic
        m["mIoU_union"] = mean_pct([r["iou_union"] for r in recs])
    m["n_span_parse_failed"] = sum(1 for r in present if r["span_parse_status"] != ParseStatus.OK.value)
    m["span_parse_failure_rate"] = pct(m["n_span_parse_failed"], len(present))
    m["n_reversed"] = sum(1 for r in recs if r.get("reversed"))
    m["n_outside_video" if opts["strict_mode"] else "n_clamped"] = sum(1 for r in recs if r.get("clamped"))
    return m


def _rec_record(output: Optional[str], ann: Mapping[str, Any], pc: ParseConfig, opts: dict, pred: Mapping) -> dict:
    frame = opts["box_frame"]
    resized = None
    resized_src = None
    if resolve_box_frame(frame) == "resized_abs":
        for src, rec in (("annotation", ann), ("prediction", pred)):
            if rec.get("resized_image_size") is not None:
                resized, resized_src = rec["resized_image_size"], src
                break
        if resized is None:
            size = ann.get("image_size")
            if not isinstance(size, (list, tuple)) or len(size) != 2:
                raise SampleError(f"sample id={ann.get('id')}: field 'image_size': must be [W, H], got {size!r}")
            h_r, w_r = smart_resize(
                int(round(float(size[1]))),
                int(round(float(size[0]))),
                factor=opts["patch_factor"],
                min_pixels=opts["min_pixels"],
                max_pixels=opts["max_pixels"],
            )
            resized, resized_src = (w_r, h_r), "smart_resize"
    bp = prepare_box(output, ann, pc, frame=frame, inclusive=opts["box_inclusive"], resized_size=resized)
    return {
        "iou": box_best_iou(bp, inclusive=opts["box_inclusive"]),
        "parse_status": bp.status.value,
        "source": bp.source,
        "pred_box": None if bp.pred is None else list(bp.pred),
        "pred_box_raw": None if bp.raw is None else list(bp.raw),
        "gt_boxes": [list(g) for g in bp.gts],
        "resized_image_size": None if resized is None else list(resized),
        "resized_image_size_source": resized_src,
        "reversed": bp.reversed,
    }


def _rec_aggregate(recs: list[dict], opts: dict) -> dict:
    m = _common_counts(recs)
    recs = _scored(recs, opts, m)
    ious = [r["iou"] for r in recs]
    m[f"Acc@{opts['box_threshold']:g}"] = _rate(ious, opts["box_threshold"], opts)
    m["mIoU"] = mean_pct(ious)
    m["n_reversed"] = sum(1 for r in recs if r.get("reversed"))
    return m


def _common_counts(recs: list[dict]) -> dict:
    present = [r for r in recs if not r["missing"]]
    n_failed = sum(1 for r in present if r["parse_status"] != ParseStatus.OK.value)
    return {
        "n": len(recs),
        "n_missing": len(recs) - len(present),
        "n_parse_failed": n_failed,
        "parse_failure_rate": pct(n_failed, len(present)),
        "n_fallback": sum(1 for r in present if r.get("source") == "text"),
    }


_SCORERS = {
    "tvg": (_tvg_record, _tvg_aggregate),
    "mcq": (_mcq_record, _mcq_aggregate),
    "gqa": (_gqa_record, _gqa_aggregate),
    "rec": (_rec_record, _rec_aggregate),
}

_MISSING_FIELDS = {
    "tvg": {"iou": 0.0, "parse_status": "missing", "source": None, "pred_span": None},
    "mcq": {"correct": 0.0, "soft": 0.0, "mra": 0.0, "parse_status": "missing", "source": None, "pred": None},
    "gqa": {
        "correct": 0.0,
        "soft": 0.0,
        "iou": 0.0,
        "iop": 0.0,
        "iou_union": 0.0,
        "parse_status": "missing",
        "span_parse_status": "missing",
        "source": None,
        "pred": None,
        "pred_span": None,
    },
    "rec": {"iou": 0.0, "parse_status": "missing", "source": None, "pred_box": None},
}


def _options(task: str, **opts: Any) -> dict:
    defaults = {
        "fallback_to_text": True,
        "allow_unclosed": True,
        "which": "auto",
        "clip_relative": True,
        "by": (),
        "duration_buckets": DEFAULT_DURATION_BUCKETS,
        "skip_other_tasks": False,
        "thresholds": TVG_THRESHOLDS,
        "gqa_thresholds": GQA_THRESHOLDS,
        "numeric_rel_tol": 0.0,
        "box_frame": None,
        "box_inclusive": False,
        "box_threshold": 0.5,
        "patch_factor": None,
        "min_pixels": None,
        "max_pixels": None,
        "span_tags": ("glue", "evidence"),
        "protocol": "official",
        "official_mode": None,
    }
    unknown = set(opts) - set(defaults)
    if unknown:
        raise TypeError(f"unknown scoring options {sorted(unknown)}; allowed: {sorted(defaults)}")
    o = {**defaults, **opts}
    if isinstance(o["by"], str):
        o["by"] = tuple(k.strip() for k in o["by"].split(",") if k.strip())
    o["by"] = tuple(o["by"] or ())
    if o["which"] not in ("auto", "first", "last"):
        raise ValueError(f"which must be 'auto', 'first' or 'last', got {o['which']!r}")
    if o["protocol"] not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {o['protocol']!r}")
    if o["official_mode"] in (None, "", "auto"):
        o["official_mode"] = OFFICIAL_MODE[task]
    check_parse_mode(o["official_mode"], task)
    if o["official_mode"] == "lenient":
        raise ValueError("official_mode must be a release mode, not 'lenient' (use protocol='lenient')")
    if task == "rec":
        if o["box_frame"] is None:
            raise ValueError("rec scoring needs box_frame (qwen2_vl | qwen2_5_vl | qwen3_vl | norm1000 | ...)")
        kind = resolve_box_frame(o["box_frame"])
        if o["patch_factor"] is None:
            # a family's merged-patch side (its adapter's 2 x patch_size: 28, Qwen3-VL 32); 28 for a bare frame
            ad = ADAPTERS.get(o["box_frame"])
            o["patch_factor"] = 2 * ad.patch_size if ad is not None else 28
        o["box_frame_kind"] = kind
    return o


def _protocol_opts(o: dict, protocol: str) -> dict:
    """Options of one protocol: the parse mode and the release's counting rules (thresholds, missing)."""
    mode = o["official_mode"] if protocol == "official" else "lenient"
    return {**o, "parse_mode": mode, "strict_mode": mode != "lenient",
            "strict_threshold": mode in _STRICT_THRESHOLD_MODES, "skip_missing": mode in _SKIP_MISSING_MODES}


def protocol_reference(task: str, protocol: str, mode: str) -> dict:
    """What a protocol reproduces (written into every metrics file)."""
    if protocol == "lenient":
        return {"name": "lenient", "parse_mode": "lenient",
                "reference": "mmgrpo lenient parser (documented in eval/score.py and mmgrpo.vlm.rewards.parsing)"}
    pm = PARSE_MODES[mode]
    return {"name": "official", "parse_mode": mode, "reference": pm.release, "rules": pm.summary}


def score(task: str, predictions: Iterable[Any], annotations: Iterable[Any], **opts: Any) -> ScoreResult:
    """Score ``predictions`` against ``annotations`` for ``task``; returns metrics and per-sample records.

    Both protocols are always computed: the top-level metrics, ``by`` breakdowns and per-sample records are those
    of ``protocol`` (default "official"); ``metrics["protocols"]`` holds both protocols' metrics (with their
    parse-failure counts) and each per-sample record holds the other protocol's values under ``"other"``.

    predictions / annotations: lists of dicts (or ``(location, dict)`` pairs from :func:`read_jsonl`).
    opts: fallback_to_text (True), allow_unclosed (True), which ("auto"), clip_relative (True), by (() or
    "dataset,duration_bucket"), duration_buckets ((30, 60, 120, 300) s), skip_other_tasks (False), thresholds
    (TVG, (0.3, 0.5, 0.7)), gqa_thresholds ((0.3, 0.5)), numeric_rel_tol (0), box_frame (REC, required),
    box_inclusive (False), box_threshold (0.5), patch_factor / min_pixels / max_pixels (REC resized frame when no
    resized_image_size is given: smart_resize with factor 28, or 32 for qwen3_vl), span_tags (GQA evidence tags),
    protocol ("official" | "lenient"), official_mode (None = the task's default release, OFFICIAL_MODE).
    fallback_to_text / allow_unclosed / which apply to the lenient protocol only.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {TASKS}")
    o = _options(task, **opts)
    pc0 = ParseConfig(
        fallback_to_text=o["fallback_to_text"],
        allow_unclosed=o["allow_unclosed"],
        which=o["which"],
        clip_relative=o["clip_relative"],
        span_tags=tuple(o["span_tags"]),
    )
    sel, other = o["protocol"], ("lenient" if o["protocol"] == "official" else "official")
    popts = {p: _protocol_opts(o, p) for p in PROTOCOLS}
    pcs = {p: dataclasses.replace(pc0, parse_mode=popts[p]["parse_mode"]) for p in PROTOCOLS}
    preds = _index_predictions(_locate(predictions, "predictions"))
    anns, n_skipped = _select_annotations(_locate(annotations, "annotations"), task, o["skip_other_tasks"])
    record_fn, aggregate_fn = _SCORERS[task]
    records: dict[str, list[dict]] = {p: [] for p in PROTOCOLS}
    matched: set[str] = set()
    for where, ann in anns:
        aid = str(ann["id"])
        groups = {k: group_value(ann, k, o["duration_buckets"]) for k in o["by"]}
        hit = preds.get(aid)
        if hit is not None:
            matched.add(aid)
        for proto in PROTOCOLS:
            pc, po = pcs[proto], popts[proto]
            try:
                if hit is None:
                    # validate the annotation anyway, so bad ground truth is reported even without a prediction
                    rec = record_fn(None, ann, pc, po) if task != "rec" else record_fn(None, ann, pc, po, {})
                    rec.update(_MISSING_FIELDS[task])
                    rec.update({"id": aid, "missing": True})
                else:
                    pwhere, prec = hit
                    output = prec.get("output")
                    rec = record_fn(output, ann, pc, po) if task != "rec" else record_fn(output, ann, pc, po, prec)
                    extras = {k: v for k, v in prec.items() if k not in rec}
                    rec = {**extras, **rec, "id": aid, "missing": False}
            except SampleError as e:
                raise ScoreInputError(f"{where}: {e}") from None
            rec["groups"] = groups
            records[proto].append(rec)
    n_unmatched = len(set(preds) - matched)
    if n_unmatched:
        print(f"[score] warning: {n_unmatched} prediction ids are not in the annotations (ignored)", file=sys.stderr)
    by_proto = {p: aggregate_fn(records[p], popts[p]) for p in PROTOCOLS}
    metrics = dict(by_proto[sel])
    metrics["n_unmatched_predictions"] = n_unmatched
    if n_skipped:
        metrics["n_other_task_skipped"] = n_skipped
    if o["by"]:
        metrics["by"] = breakdown(records[sel], o["by"], lambda rs: aggregate_fn(rs, popts[sel]),
                                  lambda r, k: r["groups"][k])
    metrics["protocol"] = protocol_reference(task, sel, o["official_mode"])
    metrics["protocols"] = {p: {**protocol_reference(task, p, o["official_mode"]), **by_proto[p]} for p in PROTOCOLS}
    metrics["config"] = _config_record(task, o)
    per_sample = []
    for rec, orec in zip(records[sel], records[other]):
        rec = dict(rec)
        rec["protocol"] = sel
        rec["other"] = {"protocol": other, **{k: orec.get(k) for k in _OTHER_KEYS[task] if k in orec}}
        per_sample.append(rec)
    return ScoreResult(metrics, per_sample)


# per-sample values of the other protocol kept next to the selected one's
_OTHER_KEYS = {
    "tvg": ("iou", "parse_status", "pred_span"),
    "mcq": ("correct", "parse_status", "pred"),
    "gqa": ("correct", "iou", "iop", "parse_status", "span_parse_status", "pred", "pred_span"),
    "rec": ("iou", "parse_status", "pred_box"),
}


def missing_problem(metrics: Mapping[str, Any]) -> Optional[str]:
    """A message when predictions are missing (empty or partial predictions file), else None."""
    n, n_missing = metrics.get("n", 0), metrics.get("n_missing", 0)
    if n_missing == 0:
        return None
    if n_missing >= n:
        return f"no prediction matches any of the {n} annotations (empty predictions file or wrong ids)"
    return f"{n_missing} of {n} annotations have no prediction (partial predictions file)"


def protocol_lines(metrics: Mapping[str, Any]) -> list[str]:
    """One line per protocol: headline numbers and parse-failure counts (for logs and the CLI)."""
    lines = []
    for name, m in (metrics.get("protocols") or {}).items():
        vals = ", ".join(f"{k} {v:.2f}" for k, v in m.items() if k in _HEADLINE_KEYS and isinstance(v, (int, float)))
        lines.append(f"[score] {name:8s} ({m.get('reference')}): {vals}; parse failures {m.get('n_parse_failed')}"
                     f" ({_fmt_pct(m.get('parse_failure_rate'))}), missing {m.get('n_missing')}")
    return lines


_HEADLINE_KEYS = ("R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "accuracy", "mra", "Acc@GQA", "mIoP", "IoP@0.5", "Acc@0.5")


def _fmt_pct(v: Any) -> str:
    return "-" if v is None else f"{v:.1f}%"


def _config_record(task: str, o: dict) -> dict:
    cfg = {
        "task": task,
        "protocol": o["protocol"],
        "official_mode": o["official_mode"],
        "answer_source": "lenient: last <answer> block" + (", whole text if none" if o["fallback_to_text"] else "")
        + f"; official: {PARSE_MODES[o['official_mode']].summary}",
        "fallback_to_text": o["fallback_to_text"],
        "allow_unclosed": o["allow_unclosed"],
        "which": o["which"],
    }
    if task in ("tvg", "gqa"):
        cfg["clip_relative"] = o["clip_relative"]
        cfg["multi_gt"] = "max over ground-truth spans"
    if task == "tvg":
        cfg["thresholds"] = list(o["thresholds"])
    if task == "gqa":
        cfg["thresholds"] = list(o["gqa_thresholds"])
        cfg["span_tags"] = list(o["span_tags"])
    if task == "mcq":
        cfg["numeric_rel_tol"] = o["numeric_rel_tol"]
    if task == "rec":
        cfg.update(
            box_frame=o["box_frame"],
            box_frame_kind=o["box_frame_kind"],
            box_inclusive=o["box_inclusive"],
            box_threshold=o["box_threshold"],
        )
        if o["box_frame_kind"] == "resized_abs":
            cfg.update(patch_factor=o["patch_factor"], min_pixels=o["min_pixels"], max_pixels=o["max_pixels"])
    if o["by"]:
        cfg["by"] = list(o["by"])
        if "duration_bucket" in o["by"]:
            cfg["duration_buckets"] = list(o["duration_buckets"])
    return cfg


def score_tvg(predictions: Iterable[Any], annotations: Iterable[Any], **opts: Any) -> dict:
    """TVG metrics: n, n_missing, R1@0.3/0.5/0.7, mIoU, parse_failure_rate (%), counts; see :func:`score`."""
    return score("tvg", predictions, annotations, **opts).metrics


def score_mcq(predictions: Iterable[Any], annotations: Iterable[Any], **opts: Any) -> dict:
    """MCQ metrics: accuracy, soft_accuracy (TW-GRPO), parse_failure_rate; numeric answers add MRA."""
    return score("mcq", predictions, annotations, **opts).metrics


def score_gqa(predictions: Iterable[Any], annotations: Iterable[Any], **opts: Any) -> dict:
    """Grounded QA metrics: accuracy, mIoU, mIoP, IoU@θ, IoP@θ, Acc@GQA, mIoU_union, parse failure rates."""
    return score("gqa", predictions, annotations, **opts).metrics


def score_rec(predictions: Iterable[Any], annotations: Iterable[Any], **opts: Any) -> dict:
    """REC metrics: Acc@0.5 (box IoU ≥ 0.5), mIoU; needs ``box_frame``."""
    return score("rec", predictions, annotations, **opts).metrics


# ------------------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------------------


def _floats(s: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {s!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="eval/score.py",
        description="Score predictions (JSONL {id, output}) against canonical annotations (JSONL).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("task", choices=TASKS)
    p.add_argument("--predictions", required=True, help="JSONL with {id, output, ...}")
    p.add_argument("--annotations", required=True, help="canonical-schema JSONL")
    p.add_argument("--out", help="write metrics JSON here (also printed to stdout)")
    p.add_argument("--by", default="", help="breakdowns, e.g. dataset,duration_bucket (any meta key works)")
    p.add_argument("--per-sample", help="write one JSON line per annotation (prediction fields kept)")
    p.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default="official",
        help="official = the evaluation released with the benchmark or the reproduced paper (tvg: Time-R1, mcq: "
        "Video-R1, rec: VLM-R1, gqa: NExT-GQA; named in the output); lenient = the project's tolerant parser. Both "
        "are always computed and reported (metrics['protocols']); this picks the top-level numbers",
    )
    p.add_argument(
        "--official-mode",
        default="auto",
        choices=["auto"] + sorted(m for m in PARSE_MODES if m != "lenient"),
        help="release whose rules the official protocol uses (auto: tvg time_r1_eval, mcq video_r1_eval, rec "
        "vlm_r1_eval, gqa nextgqa); must apply to the task",
    )
    p.add_argument(
        "--allow-missing",
        action="store_true",
        help="score an empty or partial predictions file anyway (otherwise: a loud warning and exit 1); missing "
        "predictions count as wrong in lenient, and as the release does in official",
    )
    p.add_argument("--no-fallback", action="store_true", help="lenient: no <answer> block = parse failure")
    p.add_argument("--no-unclosed", action="store_true", help="lenient: ignore a final <answer> without </answer>")
    p.add_argument("--which", choices=("auto", "first", "last"), default="auto",
                   help="lenient: span/box/number to use")
    p.add_argument("--absolute-times", action="store_true", help="predictions are absolute even with video_start")
    p.add_argument("--duration-buckets", type=_floats, default=DEFAULT_DURATION_BUCKETS, help="bucket edges (s)")
    p.add_argument("--skip-other-tasks", action="store_true", help="skip annotations whose task differs")
    p.add_argument("--thresholds", type=_floats, default=None, help="IoU thresholds (tvg 0.3,0.5,0.7; gqa 0.3,0.5)")
    p.add_argument("--numeric-rel-tol", type=float, default=0.0, help="mcq numeric answers: relative tolerance")
    p.add_argument(
        "--box-frame",
        choices=sorted(BOX_FRAMES),
        help="rec: coordinate frame of predicted boxes",
    )
    p.add_argument("--box-inclusive", action="store_true", help="rec: x2,y2 are inclusive pixel indices (+1 area); "
                   "off = the continuous IoU (VLM-R1's)")
    p.add_argument("--box-threshold", type=float, default=0.5, help="rec: IoU threshold of Acc@θ")
    p.add_argument("--patch-factor", type=int, default=None, help="rec resized frame: 28 (Qwen2/2.5) or 32 (Qwen3)")
    p.add_argument("--min-pixels", type=int, default=None, help="rec resized frame: smart_resize min_pixels")
    p.add_argument("--max-pixels", type=int, default=None, help="rec resized frame: smart_resize max_pixels")
    from eval.export import EXPORT_HELP

    p.add_argument("--export", default="", help=f"comma-separated formats: {EXPORT_HELP}")
    p.add_argument("--export-dir", help="folder for the --export files (required with --export)")
    p.add_argument("--export-split", default="test", help="nextgqa: split prefix of the file names (test | val)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    opts: dict[str, Any] = dict(
        fallback_to_text=not args.no_fallback,
        allow_unclosed=not args.no_unclosed,
        which=args.which,
        clip_relative=not args.absolute_times,
        by=args.by,
        duration_buckets=args.duration_buckets,
        skip_other_tasks=args.skip_other_tasks,
        protocol=args.protocol,
        official_mode=args.official_mode,
    )
    if args.thresholds is not None:
        opts["gqa_thresholds" if args.task == "gqa" else "thresholds"] = args.thresholds
    if args.task == "mcq":
        opts["numeric_rel_tol"] = args.numeric_rel_tol
    from eval.export import check_formats, export

    try:
        exports = check_formats(args.export.split(","), args.task)
    except ValueError as e:
        print(f"error: --export: {e}", file=sys.stderr)
        return 2
    if exports and not args.export_dir:
        print("error: --export needs --export-dir DIR", file=sys.stderr)
        return 2
    if args.task == "rec":
        if args.box_frame is None:
            print("error: rec needs --box-frame", file=sys.stderr)
            return 2
        opts.update(
            box_frame=args.box_frame,
            box_inclusive=args.box_inclusive,
            box_threshold=args.box_threshold,
            patch_factor=args.patch_factor,
            min_pixels=args.min_pixels,
            max_pixels=args.max_pixels,
        )
    try:
        anns = read_jsonl(args.annotations)
        res = score(args.task, read_jsonl(args.predictions), anns, **opts)
    except (ScoreInputError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for line in protocol_lines(res.metrics):
        print(line, file=sys.stderr)
    problem = missing_problem(res.metrics)
    if problem is not None:
        bar = "!" * 100
        if not args.allow_missing:
            print(f"{bar}\nerror: {problem} in {args.predictions}; nothing written. Scoring it would report "
                  f"missing predictions as wrong answers (or, in official TVG/GQA, leave them out). Finish the "
                  f"generation, or pass --allow-missing to score it anyway.\n{bar}", file=sys.stderr)
            return 1
        print(f"{bar}\nwarning: {problem} in {args.predictions} (--allow-missing: scored anyway, "
              f"n_missing={res.metrics['n_missing']})\n{bar}", file=sys.stderr)
    res.metrics["config"]["predictions"] = str(args.predictions)
    res.metrics["config"]["annotations"] = str(args.annotations)
    text = json.dumps(res.metrics, indent=2, allow_nan=False)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    if args.per_sample:
        Path(args.per_sample).parent.mkdir(parents=True, exist_ok=True)
        with open(args.per_sample, "w", encoding="utf-8") as f:
            for r in res.per_sample:
                f.write(json.dumps(r, allow_nan=False, default=str) + "\n")
    for fmt in exports:
        try:
            info = export(fmt, res.per_sample, anns, args.export_dir, split=args.export_split)
        except (OSError, ValueError) as e:
            print(f"error: --export {fmt}: {e}", file=sys.stderr)
            return 1
        print(f"[score] export {fmt}: {', '.join(info['files'])} ({info['n']} entries)", file=sys.stderr)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
