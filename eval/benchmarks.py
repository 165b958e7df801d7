#!/usr/bin/env python
"""Official metrics of the video benchmarks users report on (issue #38 item 6), on canonical annotations.

    python eval/benchmarks.py vsibench --predictions preds.jsonl --annotations vsibench.jsonl [--out m.json]
    python eval/benchmarks.py seed_bench_r1 --predictions preds.jsonl --annotations L1.jsonl
    python eval/benchmarks.py clevrer --predictions preds.jsonl --annotations clevrer_val.jsonl
    python eval/benchmarks.py qvhighlights --predictions sub.jsonl --annotations qvh_val.jsonl

Predictions are JSON lines ``{"id", "output": raw model text}`` (``eval/generate_vlm.py`` writes them); for
QVHighlights a moment_detr submission line (``{"qid", "pred_relevant_windows": [[s, e, score], ...],
"pred_saliency_scores": [...]}``) is read as well.  Annotations: the canonical JSONL of ``data/convert.py``
(the converters keep what the metrics need in ``meta``).  All numbers are percentages.

What each reproduces (the facts are from the released evaluation code; the code here is written from them):

* **VSI-Bench** (``vision-x-nyu/thinking-in-space``, ``lmms_eval/tasks/vsibench``): the answer is the first
  whitespace token of the answer text with a trailing "." removed; multiple-choice types score exact match
  (case-insensitive) with the option letter, numerical types the Mean Relative Accuracy over the 10 thresholds
  θ ∈ {0.50, 0.55, …, 0.95}: mean of 1[|pred − gt| / gt ≤ 1 − θ] (the code uses ≤; the paper writes <), an
  unreadable number scores 0.  Each question type is averaged; the three ``object_rel_direction_*`` levels are
  averaged into one ``object_rel_direction`` score; ``overall`` is the mean of the 8 type scores.  The release
  reads the raw output (its prompt asks for the letter / a number directly); ``answer_from="auto"`` (default)
  first takes the text of the first closed ``<answer>`` block when there is one, for reasoning models prompted
  with the think/answer format (``"output"`` = the release's rule exactly).
* **QVHighlights** (``jayleicn/moment_detr``, ``standalone_eval/eval.py``): moment retrieval mAP over IoU
  thresholds 0.50:0.05:0.95 (ActivityNet-style detection AP per query on the first 10 predicted windows ranked
  by score, VOC interpolation, averaged over queries), R1@θ (the first predicted window against the ground-truth
  window it overlaps most, IoU ≥ θ), split by ground-truth window length (short ≤ 10 s, middle (10, 30], long
  (30, 150], full); highlight detection mAP and HIT@1 at the saliency minimums Fair (2), Good (3), VeryGood (4)
  over 2-second clips and the 3 annotators (AP per annotator as the release's ``get_ap``: interpolated precision
  averaged over the distinct recall levels; HIT@1: the top-scored clip is positive for at least one annotator).
* **SEED-Bench-R1** (``TencentARC/SEED-Bench-R1``, ``infer.py``): accuracy per level (L1 in-distribution, L2
  cross-environment, L3 cross-environment-task): the text of the first ``<answer>`` block must start with the
  letter of the golden choice; no block scores 0.
* **CLEVRER** (Yi et al., ICLR 2020): descriptive questions: accuracy of the exact answer (numbers, colours,
  shapes, yes/no); explanatory / predictive / counterfactual questions, asked one choice at a time: per-option
  accuracy and per-question accuracy (every choice of the question right).

MMVU (multiple-choice) and LongVideoBench are plain multiple-choice accuracy: ``eval/score.py mcq`` with its
``--by`` breakdowns (see ``eval/configs/mmvu_mc.yaml`` and ``eval/configs/longvideobench.yaml``).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

if __package__ in (None, ""):  # executed as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BENCHMARKS = ("vsibench", "qvhighlights", "seed_bench_r1", "clevrer")


def _r2(x: float) -> float:
    """Two decimals, as the releases print them."""
    return float(f"{x:.2f}")


def _index(records: Iterable[Mapping], key: str = "id", what: str = "records") -> dict[str, Mapping]:
    out: dict[str, Mapping] = {}
    for i, r in enumerate(records):
        if not isinstance(r, Mapping) or r.get(key) is None:
            raise ValueError(f"{what}[{i}]: a JSON object with field {key!r} expected")
        k = str(r[key])
        if k in out:
            raise ValueError(f"{what}[{i}]: duplicate {key} {k!r}")
        out[k] = r
    return out


def _meta(ann: Mapping) -> Mapping:
    m = ann.get("meta")
    return m if isinstance(m, Mapping) else {}


_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.S)


def first_answer_block(text: Optional[str]) -> Optional[str]:
    """The text of the first closed ``<answer>...</answer>`` block, or None."""
    m = _ANSWER_BLOCK.search(text or "")
    return None if m is None else m.group(1)


# ============================================================================================== VSI-Bench
VSI_MCA_TYPES = ("object_rel_direction_easy", "object_rel_direction_medium", "object_rel_direction_hard",
                 "object_rel_distance", "route_planning", "obj_appearance_order")
VSI_NA_TYPES = ("object_abs_distance", "object_counting", "object_size_estimation", "room_size_estimation")
# the release's np.linspace(0.5, 0.95, 10) to the last bit (0.8999999999999999, not 0.9): the ≤ comparisons at the
# boundaries depend on it
VSI_MRA_THRESHOLDS = tuple([0.5 + i * ((0.95 - 0.5) / 9) for i in range(9)] + [0.95])
# the order the release prints its table in
VSI_REPORT_ORDER = ("object_counting", "object_abs_distance", "object_size_estimation", "room_size_estimation",
                    "object_rel_distance", "object_rel_direction", "route_planning", "obj_appearance_order")


def vsibench_mra(pred: Optional[float], gt: float) -> float:
    """VSI-Bench Mean Relative Accuracy in [0, 1]: mean over θ of 1[|pred − gt| / gt ≤ 1 − θ]; None / NaN
    score 0."""
    if pred is None or not math.isfinite(pred):
        return 0.0
    if gt == 0:
        raise ValueError("MRA needs a non-zero ground truth (relative error)")
    err = abs(pred - gt) / gt
    return sum(1.0 for t in VSI_MRA_THRESHOLDS if err <= 1 - t) / len(VSI_MRA_THRESHOLDS)


def vsibench_token(output: Optional[str], answer_from: str = "auto") -> str:
    """The release's ``fuzzy_matching``: the first space-separated token, trailing "." removed, stripped.
    ``answer_from``: "output" (the release: the raw text) or "auto" (the first <answer> block if any)."""
    if answer_from not in ("auto", "output"):
        raise ValueError(f"answer_from must be 'auto' or 'output', got {answer_from!r}")
    text = output or ""
    if answer_from == "auto":
        block = first_answer_block(text)
        if block is not None:
            text = block.strip()
    return text.split(" ")[0].rstrip(".").strip()


def _to_float(s: str) -> Optional[float]:
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def vsibench_sample(output: Optional[str], ann: Mapping, answer_from: str = "auto") -> dict:
    """One question's score in [0, 1] and how it was read."""
    qtype = _meta(ann).get("question_type")
    token = vsibench_token(output, answer_from)
    if qtype in VSI_MCA_TYPES:
        gt = str(ann.get("answer", ""))
        return {"question_type": qtype, "metric": "accuracy", "pred": token,
                "score": 1.0 if token.lower() == gt.lower() else 0.0}
    if qtype in VSI_NA_TYPES:
        gt = _to_float(str(ann.get("answer", "")))
        if gt is None:
            raise ValueError(f"sample {ann.get('id')!r}: numerical ground truth expected, got {ann.get('answer')!r}")
        pred = _to_float(token)
        return {"question_type": qtype, "metric": "MRA:.5:.95:.05", "pred": pred, "score": vsibench_mra(pred, gt)}
    raise ValueError(f"sample {ann.get('id')!r}: unknown VSI-Bench question_type {qtype!r} (meta.question_type)")


def vsibench_aggregate(rows: Sequence[Mapping]) -> dict:
    """Per-type means, the merged object_rel_direction, and ``overall`` = mean of the type scores (percent)."""
    by_type: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        by_type[r["question_type"]].append(r["score"])
    scores = {t: math.fsum(v) / len(v) for t, v in by_type.items()}
    levels = [t for t in VSI_MCA_TYPES[:3] if t in scores]
    if levels:
        if len(levels) != 3:
            raise ValueError(f"object_rel_direction needs its three levels, got {levels}")
        scores["object_rel_direction"] = math.fsum(scores.pop(t) for t in levels) / 3
    mean = 100 * math.fsum(scores.values()) / len(scores) if scores else None
    missing = [t for t in VSI_REPORT_ORDER if t not in scores]
    # "overall" is the release's number only over all 8 types (a run of the multiple-choice half has 4)
    out: dict[str, Any] = {"overall": mean} if not missing else {"overall": None, "mean_of_present_types": mean,
                                                                  "missing_types": missing}
    for t in VSI_REPORT_ORDER:
        if t in scores:
            metric = "MRA:.5:.95:.05" if t in VSI_NA_TYPES else "accuracy"
            out[f"{t}_{metric}"] = 100 * scores[t]
    out["n_per_type"] = {t: len(v) for t, v in sorted(by_type.items())}
    return out


def score_vsibench(predictions: Iterable[Mapping], annotations: Iterable[Mapping], answer_from: str = "auto") -> dict:
    preds = _index(predictions, what="predictions")
    rows, n_missing = [], 0
    for ann in annotations:
        p = preds.get(str(ann["id"]))
        n_missing += p is None
        rows.append(vsibench_sample(None if p is None else p.get("output"), ann, answer_from))
    m = vsibench_aggregate(rows)
    m.update(n=len(rows), n_missing=n_missing, answer_from=answer_from,
             reference="VSI-Bench (vision-x-nyu/thinking-in-space lmms_eval/tasks/vsibench)")
    return m


# ============================================================================================== QVHighlights
QVH_IOU_THRESHOLDS = tuple(round(0.5 + 0.05 * i, 2) for i in range(10))
QVH_LENGTH_RANGES = {"short": (0, 10), "middle": (10, 30), "long": (30, 150), "full": (0, 150)}
QVH_SALIENCY_MIN = {"Fair": 2, "Good": 3, "VeryGood": 4}
QVH_CLIP_SECONDS = 2


def temporal_iou(a: Sequence[float], b: Sequence[float]) -> float:
    inter = max(0.0, min(a[1], b[1]) - max(a[0], b[0]))
    union = (a[1] - a[0]) + (b[1] - b[0]) - inter
    return inter / union if union > 0 else 0.0


def voc_interpolated_ap(precision: Sequence[float], recall: Sequence[float]) -> float:
    """VOC (2011) AP: precision made non-increasing from the right, summed over the recall steps."""
    p = [0.0, *precision, 0.0]
    r = [0.0, *recall, 1.0]
    for i in range(len(p) - 2, -1, -1):
        p[i] = max(p[i], p[i + 1])
    return math.fsum((r[i] - r[i - 1]) * p[i] for i in range(1, len(r)) if r[i] != r[i - 1])


def detection_ap(gt_windows: Sequence[Sequence[float]], pred_windows: Sequence[Sequence[float]],
                 thresholds: Sequence[float] = QVH_IOU_THRESHOLDS) -> list[float]:
    """Average precision of scored windows ``[s, e, score]`` against ``gt_windows`` at each IoU threshold.

    Predictions are taken by decreasing score (stable); each matches the unmatched ground-truth window of the
    highest IoU if that IoU ≥ θ (ties: the later window first, as the release's reversed argsort), else it is a
    false positive.  No predictions: AP 0."""
    if not pred_windows:
        return [0.0] * len(thresholds)
    preds = sorted(pred_windows, key=lambda w: -w[2])
    out = []
    for t in thresholds:
        taken = [False] * len(gt_windows)
        tp = []
        for w in preds:
            ious = [temporal_iou(w, g) for g in gt_windows]
            hit = 0
            for j in sorted(range(len(gt_windows)), key=lambda j: (ious[j], j), reverse=True):
                if ious[j] < t:
                    break
                if not taken[j]:
                    taken[j], hit = True, 1
                    break
            tp.append(hit)
        cum, precision, recall = 0, [], []
        for k, h in enumerate(tp, start=1):
            cum += h
            precision.append(cum / k)
            recall.append(cum / len(gt_windows))
        out.append(voc_interpolated_ap(precision, recall))
    return out


def highlight_ap(labels: Sequence[float], scores: Sequence[float]) -> float:
    """moment_detr's ``get_ap`` (interpolated, not 11-point) on one annotator's binary clip labels.

    All labels 0 → 0, all 1 → 1.  Otherwise a (precision, recall) point per distinct score (ties enter
    together); for every distinct recall level r > 0 take the best precision at recall ≥ r; AP = the mean of
    those (a mean over levels, not a recall-weighted sum)."""
    if len(labels) != len(scores):
        raise ValueError(f"{len(labels)} labels for {len(scores)} scores")
    if len(set(labels)) == 1:
        return 0.0 if labels[0] == 0 else 1.0
    n_pos = sum(1 for x in labels if x)
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    points = []  # (recall, precision) at each distinct score, from the highest score down
    tp = fp = 0
    for k, i in enumerate(order):
        tp += 1 if labels[i] else 0
        fp += 0 if labels[i] else 1
        if k + 1 == len(order) or scores[order[k + 1]] != scores[i]:
            points.append((tp / n_pos, tp / (tp + fp)))
    levels = sorted({r for r, _ in points if r > 0})
    return math.fsum(max(p for r2, p in points if r2 >= r) for r in levels) / len(levels)


def qvh_ground_truth(ann: Mapping) -> dict:
    """The release's ground-truth dict from a canonical annotation (``spans`` + ``meta``) or a release line."""
    if "relevant_windows" in ann:
        d = dict(ann)
    else:
        m = _meta(ann)
        d = {"qid": m.get("qid", ann.get("id")), "duration": ann.get("duration"), "relevant_windows": ann.get("spans"),
             "relevant_clip_ids": m.get("relevant_clip_ids"), "saliency_scores": m.get("saliency_scores")}
    d["qid"] = str(d["qid"])
    return d


def qvh_submission(pred: Mapping, id_key: str = "id") -> dict:
    """A moment_detr submission line, or ``{"id", "output"}`` whose windows are read out of the text (the
    first ``<answer>`` block if any, else the whole text; every "s to e" / "s - e" / "[s, e]" pair in order,
    scored by rank), without saliency scores."""
    qid = str(pred.get("qid", pred.get(id_key)))
    if "pred_relevant_windows" in pred:
        return {"qid": qid, "pred_relevant_windows": [list(map(float, w)) for w in pred["pred_relevant_windows"]],
                **({"pred_saliency_scores": list(pred["pred_saliency_scores"])}
                   if pred.get("pred_saliency_scores") is not None else {})}
    text = pred.get("output") or ""
    block = first_answer_block(text)
    text = block if block is not None else text
    num = r"(\d+(?:\.\d+)?)"
    pairs = re.findall(rf"{num}\s*(?:to|-|,)\s*{num}", text)
    windows = [[float(s), float(e)] for s, e in pairs if float(e) > float(s)]
    return {"qid": qid, "pred_relevant_windows": [[s, e, 1.0 - k / 100] for k, (s, e) in enumerate(windows)]}


def _in_range(gt: Sequence[dict], subs: Mapping[str, dict], lo: float, hi: float) -> list[tuple[dict, dict]]:
    if (lo, hi) == QVH_LENGTH_RANGES["full"]:
        return [(g, subs[g["qid"]]) for g in gt]
    out = []
    for g in gt:
        kept = [w for w in g["relevant_windows"] if lo < w[1] - w[0] <= hi]
        if kept:
            out.append(({**g, "relevant_windows": kept}, subs[g["qid"]]))
    return out


def qvh_moment_retrieval(pairs: Sequence[tuple[dict, dict]], max_pred_windows: int = 10) -> dict:
    """{"MR-mAP": {θ: AP, ..., "average"}, "MR-R1": {θ: R1}} over (ground truth, submission) pairs."""
    aps, ious = [], []
    for g, s in pairs:
        windows = s["pred_relevant_windows"]
        aps.append(detection_ap(g["relevant_windows"], windows[:max_pred_windows]))
        top = windows[0][:2] if windows else None  # the first listed window, as the release
        ious.append(0.0 if top is None else max(temporal_iou(top, w) for w in g["relevant_windows"]))
    n = len(pairs)
    per_t = [math.fsum(a[k] for a in aps) / n if n else 0.0 for k in range(len(QVH_IOU_THRESHOLDS))]
    mean_ap = {f"{t:g}": _r2(100 * v) for t, v in zip(QVH_IOU_THRESHOLDS, per_t)}
    mean_ap["average"] = _r2(100 * math.fsum(per_t) / len(per_t))
    r1 = {f"{t:g}": _r2(100 * sum(1 for x in ious if x >= t) / n) if n else 0.0 for t in QVH_IOU_THRESHOLDS}
    return {"MR-mAP": mean_ap, "MR-R1": r1, "n": n}


def qvh_clip_labels(gt: Mapping) -> list[list[float]]:
    """Saliency of every 2-second clip of the video (#clips = int(duration / 2)), 3 annotators, 0 outside the
    relevant clips."""
    n = int(float(gt["duration"]) / QVH_CLIP_SECONDS)
    full = [[0.0, 0.0, 0.0] for _ in range(n)]
    for cid, sc in zip(gt["relevant_clip_ids"], gt["saliency_scores"]):
        if not 0 <= cid < n:
            raise ValueError(f"qid {gt['qid']}: relevant clip {cid} outside the {n} clips of a "
                             f"{gt['duration']} s video")
        full[cid] = [float(x) for x in sc]
    return full


def qvh_highlight(pairs: Sequence[tuple[dict, dict]]) -> dict:
    """{"HL-min-Fair": {"HL-mAP", "HL-Hit1"}, ...} over (ground truth, submission) pairs with saliency."""
    out = {}
    for name, lo in QVH_SALIENCY_MIN.items():
        aps, hits = [], []
        for g, s in pairs:
            full = qvh_clip_labels(g)
            n = len(full)
            pred = list(map(float, s["pred_saliency_scores"]))
            top = max(range(len(pred)), key=lambda i: (pred[i], -i)) if pred else n  # first maximum
            hits.append(max(1.0 if full[top][w] >= lo else 0.0 for w in range(3)) if top < n else 0.0)
            pred = (pred + [0.0] * n)[:n]  # cut or zero-pad to the clips, as the release
            for w in range(3):
                aps.append(highlight_ap([1.0 if c[w] >= lo else 0.0 for c in full], pred))
        out[f"HL-min-{name}"] = {"HL-mAP": _r2(100 * math.fsum(aps) / len(aps)) if aps else None,
                                 "HL-Hit1": _r2(100 * math.fsum(hits) / len(hits)) if hits else None}
    return out


def score_qvhighlights(predictions: Iterable[Mapping], annotations: Iterable[Mapping]) -> dict:
    """moment_detr's ``eval_submission``: the "brief" table plus the per-range and per-threshold numbers.
    Every annotated query needs a prediction (the release asserts the same qids); a query whose output holds
    no window scores 0 (the release would skip it in mAP and fail in R1)."""
    gt = [qvh_ground_truth(a) for a in annotations]
    subs = {}
    for p in predictions:
        s = qvh_submission(p)
        if s["qid"] in subs:
            raise ValueError(f"duplicate prediction for qid {s['qid']!r}")
        subs[s["qid"]] = s
    missing = [g["qid"] for g in gt if g["qid"] not in subs]
    if missing:
        raise ValueError(f"{len(missing)} of {len(gt)} queries have no prediction (e.g. qid {missing[0]}); the "
                         "release scores complete submissions only")
    metrics: dict[str, Any] = {}
    brief: dict[str, Any] = {}
    for name, (lo, hi) in QVH_LENGTH_RANGES.items():
        metrics[name] = qvh_moment_retrieval(_in_range(gt, subs, lo, hi))
    full = metrics["full"]
    brief.update({"MR-full-mAP": full["MR-mAP"]["average"], "MR-full-mAP@0.5": full["MR-mAP"]["0.5"],
                  "MR-full-mAP@0.75": full["MR-mAP"]["0.75"], "MR-full-R1@0.5": full["MR-R1"]["0.5"],
                  "MR-full-R1@0.7": full["MR-R1"]["0.7"]})
    for name in ("short", "middle", "long"):
        brief[f"MR-{name}-mAP"] = metrics[name]["MR-mAP"]["average"]
    with_sal = [(g, subs[g["qid"]]) for g in gt if "pred_saliency_scores" in subs[g["qid"]]]
    if with_sal:
        if len(with_sal) != len(gt):
            raise ValueError(f"pred_saliency_scores in {len(with_sal)} of {len(gt)} predictions: all or none")
        if any(g.get("relevant_clip_ids") is None or g.get("saliency_scores") is None for g, _ in with_sal):
            raise ValueError("highlight detection needs relevant_clip_ids and saliency_scores in the annotations")
        hl = qvh_highlight(with_sal)
        metrics.update(hl)
        for k, v in hl.items():
            brief[f"{k}-mAP"], brief[f"{k}-Hit1"] = v["HL-mAP"], v["HL-Hit1"]
    else:
        metrics["highlight"] = "not scored: the predictions have no pred_saliency_scores"
    return {"brief": brief, **metrics, "n": len(gt),
            "reference": "QVHighlights (jayleicn/moment_detr standalone_eval/eval.py)"}


# ============================================================================================== SEED-Bench-R1
def seed_bench_r1_correct(output: Optional[str], letter: str) -> float:
    """1 when the first <answer> block's stripped text starts with the golden letter (the release's letter
    check; its math_verify pass never matches a bare option letter), else 0."""
    block = first_answer_block(output)
    if block is None or not block.strip():
        return 0.0
    return 1.0 if block.strip()[0] == letter.strip()[0] else 0.0


def score_seed_bench_r1(predictions: Iterable[Mapping], annotations: Iterable[Mapping]) -> dict:
    preds = _index(predictions, what="predictions")
    levels: dict[str, list[float]] = defaultdict(list)
    n_missing = 0
    for ann in annotations:
        p = preds.get(str(ann["id"]))
        n_missing += p is None
        levels[str(_meta(ann).get("level", "unknown"))].append(
            seed_bench_r1_correct(None if p is None else p.get("output"), str(ann["answer"])))
    allv = [x for v in levels.values() for x in v]
    return {"accuracy": 100 * math.fsum(allv) / len(allv) if allv else None,
            "by_level": {k: {"accuracy": 100 * math.fsum(v) / len(v), "n": len(v)} for k, v in sorted(levels.items())},
            "n": len(allv), "n_missing": n_missing,
            "reference": "SEED-Bench-R1 (TencentARC/SEED-Bench-R1 infer.py accuracy_reward)"}


# ============================================================================================== CLEVRER
def _norm_word(s: str) -> str:
    return " ".join(s.strip().lower().rstrip(".").split())


def clevrer_read(output: Optional[str]) -> str:
    """The answer text: the first closed <answer> block if any, else the whole output; lower case, trailing
    period and extra spaces removed."""
    block = first_answer_block(output)
    return _norm_word(block if block is not None else (output or ""))


def score_clevrer(predictions: Iterable[Mapping], annotations: Iterable[Mapping]) -> dict:
    """Descriptive accuracy (exact answer) and, per question type, per-option and per-question accuracy of the
    one-choice-at-a-time yes/no samples (``meta.question_id`` groups the options of a question)."""
    preds = _index(predictions, what="predictions")
    desc: list[float] = []
    options: dict[str, list[float]] = defaultdict(list)
    questions: dict[tuple[str, str], list[float]] = defaultdict(list)
    for ann in annotations:
        m = _meta(ann)
        p = preds.get(str(ann["id"]))
        out = None if p is None else p.get("output")
        qtype = m.get("question_type")
        if qtype == "descriptive":
            desc.append(1.0 if clevrer_read(out) == _norm_word(str(ann["answer"])) else 0.0)
            continue
        if qtype not in ("explanatory", "predictive", "counterfactual"):
            raise ValueError(f"sample {ann.get('id')!r}: unknown CLEVRER question_type {qtype!r}")
        gt = ann["options"][ord(ann["answer"]) - ord("A")]  # "yes" / "no"
        read = clevrer_read(out)
        ok = 1.0 if read in (gt.lower(), ann["answer"].lower()) else 0.0  # the word or its letter
        options[qtype].append(ok)
        questions[(qtype, f"{m.get('scene_index')}/{m.get('question_id')}")].append(ok)
    out: dict[str, Any] = {"reference": "CLEVRER (Yi et al. 2020): descriptive accuracy; per-option and "
                                        "per-question accuracy of the multiple-choice types"}
    if desc:
        out["descriptive"] = {"accuracy": 100 * math.fsum(desc) / len(desc), "n": len(desc)}
    for qtype, v in sorted(options.items()):
        per_q = [all(x == 1.0 for x in opts) for (t, _), opts in questions.items() if t == qtype]
        out[qtype] = {"per_option": 100 * math.fsum(v) / len(v), "per_question": 100 * sum(per_q) / len(per_q),
                      "n_options": len(v), "n_questions": len(per_q)}
    return out


SCORERS = {"vsibench": score_vsibench, "qvhighlights": score_qvhighlights, "seed_bench_r1": score_seed_bench_r1,
           "clevrer": score_clevrer}


# the canonical tasks each benchmark's samples have
BENCHMARK_TASKS = {"vsibench": ("mcq", "qa"), "qvhighlights": ("tvg",), "seed_bench_r1": ("mcq",),
                   "clevrer": ("mcq", "qa")}


def check_benchmark(name: str, task: str) -> None:
    """A ValueError when ``name`` is not a benchmark here or its samples are not of ``task``."""
    if name not in SCORERS:
        raise ValueError(f"unknown benchmark {name!r}; choose one of {sorted(SCORERS)}")
    if task not in BENCHMARK_TASKS[name]:
        raise ValueError(f"benchmark {name!r} scores {'/'.join(BENCHMARK_TASKS[name])} samples, not {task!r}")


def score_benchmark(name: str, predictions: Iterable[Mapping], annotations: Iterable[Mapping]) -> dict:
    if name not in SCORERS:
        raise ValueError(f"unknown benchmark {name!r}; choose one of {sorted(SCORERS)}")
    return SCORERS[name](list(predictions), list(annotations))


def _read_jsonl(path: str) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{i}: invalid JSON ({e.msg})") from None
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="eval/benchmarks.py", description=__doc__.strip().splitlines()[0])
    p.add_argument("benchmark", choices=BENCHMARKS)
    p.add_argument("--predictions", required=True,
                   help="JSONL {id, output} (QVHighlights: or a moment_detr submission)")
    p.add_argument("--annotations", required=True, help="canonical JSONL from data/convert.py")
    p.add_argument("--out", help="also write the metrics JSON here")
    a = p.parse_args(argv)
    try:
        m = score_benchmark(a.benchmark, _read_jsonl(a.predictions), _read_jsonl(a.annotations))
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    text = json.dumps(m, indent=2, allow_nan=False)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
