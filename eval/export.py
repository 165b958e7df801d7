"""Write scored predictions in the files the benchmarks' own evaluation code reads (``--export`` of
``eval/score.py``, ``export=`` of ``eval/generate_vlm.py``).

Each format was checked against the public evaluation code named below (facts only; nothing is copied).  The
values come from :func:`eval.score.score`'s per-sample records, i.e. the spans / letters / boxes parsed by the
selected protocol (``official`` by default), so the exported file and our metrics read the same answer.

``lmms_eval_tvg`` -> ``lmms_eval_tvg_submission.json`` (task tvg: Charades-STA, ActivityNet Captions)
    lmms-eval's temporal-grounding tasks (``lmms_eval/tasks/charades_sta/utils.py``; the ActivityNet variant is
    the same) write one JSON object ``{"<video>>>><caption>>>><timestamp>": "<raw model output>"}``, where
    ``video`` is the file name (``3MSZA.mp4``), ``caption`` the query and ``timestamp`` the ground-truth
    ``[s, e]`` as Python prints a list; their ``eval_tvg.py -f FILE`` parses the output text itself and
    ``eval``s the timestamp.  We write the video's base name, the query, ``str([s, e])`` of the first
    ground-truth span and the raw output (``""`` when there is none, which that scorer counts as a miss -- it
    divides by every key).  Keys that coincide (same video, query and span) keep the last output, as a Python
    dict does in lmms-eval; their number is returned as ``n_duplicate_keys``.

``time_r1_tvg`` -> ``time_r1_predictions.jsonl`` (task tvg)
    Time-R1's ``src/vllm_inference/eval_all.py`` reads every ``*.jsonl`` of ``logs/eval/<model>/<dataset>*/``,
    one line per query ``{"qid", "pred": [s, e], "target": [s, e], ...}``; a ``pred`` holding ``None`` scores
    0; R1@θ counts IoU > θ.  We write ``qid`` = our sample id, ``pred`` = the parsed span in seconds (``[null,
    null]`` when unparsed or missing), ``target`` = the first ground-truth span, and ``output_text``.

``nextgqa`` -> ``<split>_ground.json`` + ``<split>-res.json`` (task gqa)
    NExT-GQA's ``code/TempGQA/eval_ground.py`` reads predictions keyed ``"<video_id>_<qid>"``: the grounding
    file maps the key to one span ``[s, e]`` in seconds (``gs=False``), and the QA file
    (``<split>-res.json``, as ``train/trainval_gdqa.py`` writes it) maps it to ``{"prediction": i, "answer":
    j}`` with 0-based option indices; Acc@GQA counts ``prediction == answer`` with IoP >= 0.5.  Questions
    without a key are skipped by that evaluation, so missing predictions are left out (as our ``nextgqa``
    protocol does); an output without a parseable span gets ``[-1, -1]`` (IoU = IoP = 0 against any
    ground truth) and one without a letter gets prediction ``-1``.  ``video_id`` = ``meta.video_id``, else the
    video file's stem; ``qid`` = ``meta.qid``, else the sample id (used whole when it already starts with
    ``<video_id>_``).  Score with ``eval_ground(load_file("gsub_<split>.json"), pred_ground, pred_qa,
    gs=False)``.

``refcoco`` -> ``refcoco_predictions.jsonl`` (task rec)
    One line per referring expression: ``{"id", "image", "sentence", "pred_bbox": [x1, y1, x2, y2] or null,
    "gt_bbox", "image_size": [W, H], "output"}``, boxes in **original-image pixels** (the predicted box mapped
    back from the model's frame by the rec scorer), which is what RefCOCO's Acc@0.5 compares.

``lmms_eval_refcoco`` -> ``lmms_eval_refcoco_results.jsonl`` (task rec)
    lmms-eval's ``refcoco_bbox_rec`` task (``lmms_eval/tasks/refcoco/utils_rec.py``) keeps per item
    ``{"answer": expression, "pred": [x1, y1, x2, y2], "ann_id", "bbox": ground truth}`` with both boxes
    normalised by the image width / height, an unparsed answer being ``[0, 0, 0, 0]``;
    ``refcoco_bbox_rec_aggregation_result(results, metric)`` averages IoU / ACC@θ / Center_ACC over that list.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

FORMATS: dict[str, str] = {  # format -> the task it exports
    "lmms_eval_tvg": "tvg",
    "time_r1_tvg": "tvg",
    "nextgqa": "gqa",
    "refcoco": "rec",
    "lmms_eval_refcoco": "rec",
}
FILES = {
    "lmms_eval_tvg": ("lmms_eval_tvg_submission.json",),
    "time_r1_tvg": ("time_r1_predictions.jsonl",),
    "nextgqa": ("{split}_ground.json", "{split}-res.json"),
    "refcoco": ("refcoco_predictions.jsonl",),
    "lmms_eval_refcoco": ("lmms_eval_refcoco_results.jsonl",),
}
EXPORT_HELP = ("official submission files written after scoring: lmms_eval_tvg / time_r1_tvg (tvg: Charades-STA, "
               "ActivityNet), nextgqa (gqa: eval_ground.py's <split>_ground.json + <split>-res.json), refcoco / "
               "lmms_eval_refcoco (rec); see eval/export.py and docs/benchmarks.md")


def check_formats(formats: Iterable[str], task: str) -> list[str]:
    """The formats, validated against ``task`` (before any generation: a typo must not cost a run)."""
    out = []
    for f in formats:
        f = str(f).strip()
        if not f:
            continue
        if f not in FORMATS:
            raise ValueError(f"unknown export format {f!r}; choose from {sorted(FORMATS)}")
        if FORMATS[f] != task:
            raise ValueError(f"export format {f!r} is for task {FORMATS[f]!r}, not {task!r}")
        out.append(f)
    return out


# ------------------------------------------------------------------------------------------------ helpers
def _rec(r: Any) -> Mapping[str, Any]:
    return r[1] if isinstance(r, tuple) and len(r) == 2 and isinstance(r[0], str) else r


def _index(annotations: Iterable[Any]) -> dict[str, Mapping[str, Any]]:
    return {str(_rec(a)["id"]): _rec(a) for a in annotations}


def _first_span(ann: Mapping[str, Any], rec: Optional[Mapping[str, Any]] = None) -> list[float]:
    """The first ground-truth span in seconds: the scored record's (absolute, the frame of ``pred_span``), else
    the annotation's."""
    spans = (rec or {}).get("gt_spans") or ann.get("spans") or []
    if not spans:
        raise ValueError(f"sample id={ann.get('id')}: no ground-truth span to export")
    s = spans[0]
    return [float(s[0]), float(s[1])]


def _video_name(ann: Mapping[str, Any]) -> str:
    v = ann.get("video")
    if not isinstance(v, str) or not v:
        raise ValueError(f"sample id={ann.get('id')}: field 'video' must be a file path to export")
    return os.path.basename(v)


def _span(v: Any) -> Optional[list[float]]:
    return None if v is None else [float(v[0]), float(v[1])]


def _letter_index(letters: Any) -> int:
    if not letters:
        return -1
    x = letters[0] if isinstance(letters, (list, tuple)) else letters
    return ord(str(x).strip().upper()[0]) - ord("A")


def nextgqa_key(ann: Mapping[str, Any]) -> str:
    """``"<video_id>_<qid>"`` (see the module docstring)."""
    meta = ann.get("meta") or {}
    vid = meta.get("video_id") or os.path.splitext(os.path.basename(str(ann.get("video") or "")))[0]
    if not vid:
        raise ValueError(f"sample id={ann.get('id')}: no video id (meta.video_id or video) for the NExT-GQA key")
    qid = meta.get("qid")
    if qid is None:
        sid = str(ann["id"])
        return sid if sid.startswith(f"{vid}_") else f"{vid}_{sid}"
    return f"{vid}_{qid}"


def _write_json(path: Path, obj: Any, lines: bool = False) -> None:
    """Written to a temporary name then renamed: a crash never leaves a half file the scorer would read."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        if lines:
            for r in obj:
                f.write(json.dumps(r, allow_nan=False) + "\n")
        else:
            json.dump(obj, f, indent=1, allow_nan=False)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------ formats
def _lmms_eval_tvg(per_sample, anns) -> tuple[dict, dict]:
    out: dict[str, str] = {}
    dup = 0
    for r in per_sample:
        a = anns[str(r["id"])]
        key = f"{_video_name(a)}>>>{a.get('query', '')}>>>{_first_span(a, r)}"
        dup += key in out
        out[key] = r.get("output") or ""
    return out, {"n_duplicate_keys": dup}


def _time_r1_tvg(per_sample, anns) -> tuple[list, dict]:
    rows = []
    for r in per_sample:
        a = anns[str(r["id"])]
        pred = _span(r.get("pred_span"))
        rows.append({"qid": str(r["id"]), "pred": pred if pred is not None else [None, None],
                     "target": _first_span(a, r), "output_text": r.get("output") or ""})
    return rows, {}


def _nextgqa(per_sample, anns) -> tuple[tuple[dict, dict], dict]:
    ground: dict[str, list[float]] = {}
    qa: dict[str, dict] = {}
    for r in per_sample:
        if r.get("missing"):
            continue  # eval_ground.py skips questions without a prediction
        a = anns[str(r["id"])]
        key = nextgqa_key(a)
        if key in ground:
            raise ValueError(f"NExT-GQA key {key!r} is shared by two samples (e.g. id={r['id']})")
        span = _span(r.get("pred_span"))
        ground[key] = span if span is not None else [-1.0, -1.0]
        qa[key] = {"prediction": _letter_index(r.get("pred")), "answer": _letter_index(r.get("gt"))}
    return (ground, qa), {}


def _refcoco(per_sample, anns) -> tuple[list, dict]:
    rows = []
    for r in per_sample:
        a = anns[str(r["id"])]
        gts = r.get("gt_boxes") or a.get("boxes") or []
        rows.append({"id": str(r["id"]), "image": a.get("image"), "sentence": a.get("query"),
                     "pred_bbox": None if r.get("pred_box") is None else [float(x) for x in r["pred_box"]],
                     "gt_bbox": [float(x) for x in gts[0]] if gts else None, "image_size": a.get("image_size"),
                     "output": r.get("output")})
    return rows, {}


def _normalised(box: Sequence[float], size: Sequence[float]) -> list[float]:
    w, h = float(size[0]), float(size[1])
    return [box[0] / w, box[1] / h, box[2] / w, box[3] / h]


def _lmms_eval_refcoco(per_sample, anns) -> tuple[list, dict]:
    rows = []
    for r in per_sample:
        a = anns[str(r["id"])]
        size = a.get("image_size")
        if not isinstance(size, (list, tuple)) or len(size) != 2:
            raise ValueError(f"sample id={r['id']}: field 'image_size' must be [W, H] to normalise boxes")
        gts = r.get("gt_boxes") or a.get("boxes") or []
        pred = r.get("pred_box")
        rows.append({"answer": a.get("query"), "ann_id": str(r["id"]),
                     "pred": [0, 0, 0, 0] if pred is None else _normalised(pred, size),
                     "bbox": _normalised(gts[0], size)})
    return rows, {}


_WRITERS = {"lmms_eval_tvg": _lmms_eval_tvg, "time_r1_tvg": _time_r1_tvg, "nextgqa": _nextgqa, "refcoco": _refcoco,
            "lmms_eval_refcoco": _lmms_eval_refcoco}


def export(fmt: str, per_sample: Sequence[Mapping[str, Any]], annotations: Iterable[Any], out_dir: str | Path,
           split: str = "test") -> dict:
    """Write ``fmt`` for the per-sample records of :func:`eval.score.score` into ``out_dir``.

    ``annotations``: the canonical records (dicts or ``(location, dict)`` pairs) the records were scored against.
    Returns ``{"format", "files": [...], "n": records written, ...}``."""
    if fmt not in _WRITERS:
        raise ValueError(f"unknown export format {fmt!r}; choose from {sorted(FORMATS)}")
    anns = _index(annotations)
    unknown = [r["id"] for r in per_sample if str(r["id"]) not in anns]
    if unknown:
        raise ValueError(f"export {fmt}: per-sample ids not in the annotations, e.g. {unknown[:3]}")
    data, extra = _WRITERS[fmt](per_sample, anns)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = [n.format(split=split) for n in FILES[fmt]]
    objs = list(data) if fmt == "nextgqa" else [data]
    for name, obj in zip(names, objs):
        _write_json(out / name, obj, lines=name.endswith(".jsonl"))
    n = len(objs[0])
    return {"format": fmt, "files": [str(out / n_) for n_ in names], "n": n, **extra}
