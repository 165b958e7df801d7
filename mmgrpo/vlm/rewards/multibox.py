"""Visual-RFT's detection / REC rewards: multi-box IoU and confidence, with its JSON answer format.

Release facts (Liuziyu77/Visual-RFT, ``src/virft/src/open_r1/grpo.py``: ``accuracy_iou`` / ``accuracy_confidence``):

* Answer format: a JSON list in ``<answer>``, e.g. ``[{'Position': [x1, y1, x2, y2], 'Confidence': 0.9}, …]``.
  Before parsing the release turns ``[[`` / ``]]`` into ``[`` / ``]``, drops newlines, repairs a truncated list
  (cut after the last complete ``},`` and close with ``}]``) and turns single into double quotes. A list whose
  items are not objects, or any error (missing key, empty list), scores 0 on both rewards.
* Exact duplicate positions are dropped (first kept). Predictions are sorted by confidence, highest first
  (stable). Greedy matching: each prediction takes the not-yet-matched ground-truth box of highest IoU (first
  one on ties); it counts as matched only if that IoU is **> 0.5** (strict), else its IoU is recorded as 0.
* IoU: continuous areas, no reordering of corners, 0 without a positive-area overlap.
* IoU reward = Σ matched IoUs / max(#GT, #predictions), capped at 1 (extra boxes dilute it).
* Confidence reward = mean over predictions of (c if matched else 1 − c), clipped to [0, 1].

Deviations (documented, deliberate): the answer block is read with this package's block extractor, so a block
spanning several lines is accepted (the release's first search is single-line and then fails to parse such an
answer); the release first tries a ``math_verify`` equality of the whole completion with the solution (reward 1)
— not reproduced, it only fires when the completion literally equals the ground truth. Predicted positions are
mapped from the model's box frame to original-image pixels (``box_frame``), since the canonical ground truth is
in original pixels; the release compares the numbers as written (frame scale 1 = ``box_frame=abs``).
"""
from __future__ import annotations

import json
import math
from typing import Any, Optional, Sequence

from .parsing import extract_block

__all__ = ["ScoredBox", "parse_scored_boxes", "visual_rft_iou", "greedy_match", "multibox_iou_reward",
           "confidence_reward", "MATCH_IOU"]

MATCH_IOU = 0.5  # the release's matching threshold (strict >)

ScoredBox = tuple[tuple[float, float, float, float], float]  # ((x1, y1, x2, y2), confidence)


def _finite(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def parse_scored_boxes(text: Optional[str], *, allow_unclosed: bool = True) -> Optional[list[ScoredBox]]:
    """Boxes with confidences from the ``<answer>`` block, or None when it does not parse as the release's list."""
    block = extract_block(text, "answer", allow_unclosed=allow_unclosed)
    if block is None:
        return None
    s = block.strip().replace("[[", "[").replace("]]", "]").replace("\n", "")
    if not s.endswith("]"):  # truncated generation: keep the complete objects
        s = s.rsplit("},", 1)[0] + "}]"
    try:
        items = json.loads(s.replace("'", '"'))
    except ValueError:
        return None
    if not isinstance(items, list) or not items:
        return None
    out: list[ScoredBox] = []
    for it in items:
        if not isinstance(it, dict) or "Position" not in it or "Confidence" not in it:
            return None
        pos, conf = it["Position"], _finite(it["Confidence"])
        if not isinstance(pos, list) or len(pos) != 4 or conf is None:
            return None
        coords = [_finite(v) for v in pos]
        if any(v is None for v in coords):
            return None
        out.append((tuple(coords), conf))  # type: ignore[arg-type]
    return out


def visual_rft_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Continuous IoU, corners as written; 0 unless the overlap has positive width and height."""
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def greedy_match(gts: Sequence[Sequence[float]], preds: Sequence[ScoredBox],
                 threshold: float = MATCH_IOU) -> list[tuple[float, float]]:
    """(IoU or 0, confidence) per prediction after de-duplication, in descending-confidence order."""
    seen, uniq = set(), []
    for pos, conf in preds:
        if tuple(pos) not in seen:
            seen.add(tuple(pos))
            uniq.append((pos, conf))
    uniq.sort(key=lambda pc: pc[1], reverse=True)
    taken: set[int] = set()
    out = []
    for pos, conf in uniq:
        best, best_k = 0.0, -1
        for k, g in enumerate(gts):
            if k not in taken:
                iou = visual_rft_iou(g, pos)
                if iou > best:
                    best, best_k = iou, k
        if best > threshold:
            taken.add(best_k)
            out.append((best, conf))
        else:
            out.append((0.0, conf))
    return out


def multibox_iou_reward(matches: Sequence[tuple[float, float]], n_gt: int) -> float:
    """Σ IoU / max(#GT, #predictions), capped at 1; 0 without predictions."""
    if not matches:
        return 0.0
    return min(1.0, sum(i for i, _ in matches) / max(n_gt, len(matches)))


def confidence_reward(matches: Sequence[tuple[float, float]]) -> float:
    """mean of c (matched) or 1 − c (unmatched), clipped to [0, 1]; 0 without predictions."""
    if not matches:
        return 0.0
    r = sum(c if i != 0 else 1.0 - c for i, c in matches) / len(matches)
    return max(0.0, min(1.0, r))
