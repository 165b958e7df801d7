"""Per-sample glue between a raw completion, a canonical-schema sample and the reward math.

Used by both the training reward registry (:mod:`mmgrpo.vlm.rewards.registry`) and the eval scorer
(``eval/score.py``), so that training rewards and reported metrics parse and measure identically.
Pure Python, no torch.

Canonical sample fields used here: ``id``, ``duration`` (s), ``spans`` ([[s, e], …] absolute seconds),
``video_start`` / ``video_end`` (optional clip bounds, absolute seconds), ``options``, ``answer``, ``boxes``
([[x1, y1, x2, y2], …] original-image pixels), ``image_size`` ([W, H]), ``resized_image_size`` ([W_r, H_r],
model-input image, for the ``qwen2_5_vl`` / ``resized_abs`` box frame).

Time convention (clips)
-----------------------
The model sees the window [lo, hi] with lo = ``video_start`` (default 0) and hi = ``video_end`` (default
``duration``). With ``clip_relative=True`` (default) a predicted time t is read as *relative to the clip start*
and converted to absolute time t + ``video_start``; ground-truth spans are always absolute. Predicted and
ground-truth spans are then clamped to [lo, hi], and every duration-normalised reward uses D = hi − lo (the
span of video the model could see). Without ``video_start`` this is simply [0, duration] and D = duration.

Multiple ground-truth spans (single-span rewards): the best-matching one counts, i.e. the maximum of the reward
over ground-truth spans (NExT-GQA's convention for IoU / IoP). ``multi_interval_iou`` instead compares unions.

Parse modes (``ParseConfig.parse_mode``): ``lenient`` (default) is the project parser with the clamping and
ordering above; every other mode (``mmgrpo.vlm.rewards.protocols.PARSE_MODES``) reads the answer as one release does
and measures as it does: no swapping, no clamping of prediction or ground truth (the clip offset still applies).
"""
from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from .box import box_iou, box_to_original, clamp_box, frame_scale, resolve_box_frame
from .parsing import (
    ParseStatus,
    Parsed,
    Which,
    completion_text,
    extract_block,
    find_choices,
    parse_box,
    parse_choice,
    parse_number,
    parse_spans,
)
from .protocols import (
    is_strict,
    mgpo_letter,
    nextgqa_iou_iop,
    release_boundary_iou,
    release_temporal_iou,
    strict_answer_text,
    strict_box,
    strict_span,
    video_r1_number,
    video_r1_numeric_correct,
    videochat_r1_letter,
    vlm_r1_box_iou,
)
from .temporal import (
    boundary_iou,
    gaussian_boundary_reward,
    interval_iop,
    multi_interval_iou,
    temporal_iou,
)

__all__ = [
    "SampleError",
    "ParseConfig",
    "sample_id",
    "temporal_window",
    "gt_spans",
    "TemporalPrediction",
    "prepare_temporal",
    "span_iou",
    "span_boundary_iou",
    "span_gaussian",
    "span_multi_iou",
    "span_iop",
    "gt_letters",
    "prepare_choice",
    "gt_number",
    "gt_number_text",
    "prepare_number",
    "numeric_correct",
    "BoxPrediction",
    "prepare_box",
    "box_best_iou",
]


class SampleError(ValueError):
    """A canonical-schema sample is missing a field or has an invalid one; the message names id and field."""


@dataclass(frozen=True)
class ParseConfig:
    """How answers are read from a completion.

    fallback_to_text: parse the whole completion when there is no ``<answer>`` block (default False for
        training rewards: no answer block = parse failure; the eval harness defaults to True and records it).
    allow_unclosed: accept a final ``<answer>`` without a closing tag.
    which: which span/number/box inside the chosen text ("auto": first in an answer block, last in fallback).
    clip_relative: predicted times are relative to ``video_start`` (see module docstring).
    span_tags: for GQA, tags whose last block holds the evidence span(s) (``<glue>``); if none is present the
        span is read from the answer block.
    parse_mode: ``lenient`` (the project parser; the four options above apply) or a release's rules
        (``mmgrpo.vlm.rewards.protocols.PARSE_MODES``: time_r1, time_r1_eval, tempsamp_r1 for tvg; video_r1,
        video_r1_eval for mcq; vlm_r1, vlm_r1_eval for rec; nextgqa for gqa), which ignore those options.
    """

    fallback_to_text: bool = False
    allow_unclosed: bool = True
    which: Which = "auto"
    clip_relative: bool = True
    span_tags: tuple[str, ...] = ("glue", "evidence")
    parse_mode: str = "lenient"


def sample_id(sample: Mapping[str, Any]) -> str:
    try:
        return str(sample.get("id", "<no id>"))
    except AttributeError:
        return "<not a dict>"


def _err(sample: Mapping[str, Any], fld: str, msg: str) -> SampleError:
    return SampleError(f"sample id={sample_id(sample)!s}: field {fld!r}: {msg}")


def _finite_number(sample: Mapping[str, Any], fld: str, value: Any) -> float:
    if isinstance(value, bool):
        raise _err(sample, fld, f"must be a number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise _err(sample, fld, f"must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise _err(sample, fld, f"must be finite, got {value!r}")
    return v


# --------------------------------------------------------------------------------------------------------------
# Temporal
# --------------------------------------------------------------------------------------------------------------


def temporal_window(sample: Mapping[str, Any], *, clip_relative: bool = True) -> tuple[float, float, float]:
    """``(lo, hi, offset)``: visible window in absolute seconds and the offset added to predicted times."""
    if not isinstance(sample, Mapping):
        raise SampleError(f"sample must be a dict, got {type(sample).__name__}")
    if "duration" not in sample or sample["duration"] is None:
        raise _err(sample, "duration", "missing")
    duration = _finite_number(sample, "duration", sample["duration"])
    if duration <= 0:
        raise _err(sample, "duration", f"must be > 0, got {duration}")
    vs, ve = sample.get("video_start"), sample.get("video_end")
    lo = 0.0 if vs is None else _finite_number(sample, "video_start", vs)
    hi = duration if ve is None else _finite_number(sample, "video_end", ve)
    if not (0.0 <= lo < hi):
        raise _err(sample, "video_start/video_end", f"need 0 <= video_start < video_end, got [{lo}, {hi}]")
    if hi > duration + 1e-6:
        raise _err(sample, "video_end", f"{hi} is past duration {duration}")
    offset = lo if (clip_relative and vs is not None) else 0.0
    return lo, min(hi, duration), offset


def gt_spans(sample: Mapping[str, Any], lo: float, hi: float, *, clamp: bool = True) -> list[tuple[float, float]]:
    """Ground-truth spans clamped to [lo, hi] (unless ``clamp=False``) and shifted to window coordinates (minus lo).

    Raises SampleError on a missing/empty list, malformed or non-finite spans, or start > end (a data bug: the
    ground truth is never silently reordered)."""
    spans = sample.get("spans")
    if not isinstance(spans, (list, tuple)) or len(spans) == 0:
        raise _err(sample, "spans", f"must be a non-empty list of [start, end], got {spans!r}")
    out = []
    for k, sp in enumerate(spans):
        if not isinstance(sp, (list, tuple)) or len(sp) != 2:
            raise _err(sample, f"spans[{k}]", f"must be [start, end], got {sp!r}")
        s = _finite_number(sample, f"spans[{k}][0]", sp[0])
        e = _finite_number(sample, f"spans[{k}][1]", sp[1])
        if s > e:
            raise _err(sample, f"spans[{k}]", f"start {s} > end {e}")
        if clamp:
            s, e = min(max(s, lo), hi), min(max(e, lo), hi)
        out.append((s - lo, e - lo))
    return out


@dataclass(frozen=True)
class TemporalPrediction:
    """Parsed temporal prediction in *window coordinates* (0 = window start, D = window length).

    ``pred`` is the selected span (None if parsing failed), ``preds`` all parsed spans; both clamped to [0, D].
    ``gts`` are the clamped ground-truth spans. ``reversed`` / ``clamped``: the selected span was written with
    start > end / reached outside the window before clamping. ``mode``: the parse mode; in a release mode
    (not ``lenient``) the spans are as written (not swapped, not clamped) and the IoU functions below use the
    release's formulas.
    """

    status: ParseStatus
    source: Optional[str]
    pred: Optional[tuple[float, float]]
    preds: list[tuple[float, float]]
    gts: list[tuple[float, float]]
    duration: float
    lo: float
    reversed: bool = False
    clamped: bool = False
    mode: str = "lenient"

    @property
    def parsed(self) -> bool:
        return self.pred is not None

    def absolute(self, span: Optional[tuple[float, float]]) -> Optional[list[float]]:
        return None if span is None else [span[0] + self.lo, span[1] + self.lo]


def _to_window(span: Any, offset: float, lo: float, hi: float) -> tuple[tuple[float, float], bool]:
    s, e = span.start + offset, span.end + offset
    clamped = s < lo or e > hi
    s, e = min(max(s, lo), hi), min(max(e, lo), hi)
    return (s - lo, e - lo), clamped


def _span_parse(output: Any, cfg: ParseConfig, span_tags: Sequence[str]) -> Parsed[list]:
    text_tags = [t for t in span_tags if extract_block(output, t, allow_unclosed=False) is not None]
    if text_tags:
        return parse_spans(output, tag=text_tags[0], allow_unclosed=False, fallback_to_text=False)
    return parse_spans(output, allow_unclosed=cfg.allow_unclosed, fallback_to_text=cfg.fallback_to_text)


def prepare_temporal(
    output: Any, sample: Mapping[str, Any], cfg: ParseConfig = ParseConfig(), *, evidence: bool = False
) -> TemporalPrediction:
    """Parse spans from ``output`` and bring prediction and ground truth to window coordinates.

    ``evidence=True`` (GQA) reads spans from the last ``cfg.span_tags`` block when present."""
    lo, hi, offset = temporal_window(sample, clip_relative=cfg.clip_relative)
    if is_strict(cfg.parse_mode):
        return _prepare_temporal_release(output, sample, cfg, lo, hi, offset, evidence)
    gts = gt_spans(sample, lo, hi)
    d = hi - lo
    if evidence:
        p = _span_parse(output, cfg, cfg.span_tags)
    else:
        p = parse_spans(output, allow_unclosed=cfg.allow_unclosed, fallback_to_text=cfg.fallback_to_text)
    if not p.ok:
        return TemporalPrediction(p.status, p.source, None, [], gts, d, lo)
    conv = [_to_window(sp, offset, lo, hi) for sp in p.value]
    sel_idx = 0 if (cfg.which == "first" or (cfg.which == "auto" and p.source == "answer")) else len(conv) - 1
    sel, clamped = conv[sel_idx]
    return TemporalPrediction(
        ParseStatus.OK,
        p.source,
        sel,
        [c for c, _ in conv],
        gts,
        d,
        lo,
        reversed=p.value[sel_idx].reversed,
        clamped=clamped,
    )


def _prepare_temporal_release(
    output: Any, sample: Mapping[str, Any], cfg: ParseConfig, lo: float, hi: float, offset: float, evidence: bool
) -> TemporalPrediction:
    """Release modes: the span as written (plus the clip offset), unclamped ground truth."""
    mode = cfg.parse_mode
    gts = gt_spans(sample, lo, hi, clamp=False)
    d = hi - lo
    glue = _videochat_glue(output) if (mode == "nextgqa" or evidence) else None
    if glue:  # VideoChat-R1's evidence list "[(s, e), ...]" in the last closed <glue> block: its first pair
        raw, status, source = glue[0], ParseStatus.OK, "glue"
    elif mode == "nextgqa" or evidence:
        # NExT-GQA's evaluation has no text parser: the evidence span is read by the project parser from the
        # last *closed* <glue>/<answer> block (first span in it), in the order written
        p = _span_parse(output, dataclasses.replace(cfg, allow_unclosed=False, fallback_to_text=False),
                        cfg.span_tags)
        raw = None
        if p.ok:
            sp = p.value[0]
            raw = (sp.end, sp.start) if sp.reversed else (sp.start, sp.end)
        status, source = p.status, p.source
    else:
        raw, status, source = strict_span(output, mode)
    if raw is None:
        return TemporalPrediction(status, source, None, [], gts, d, lo, mode=mode)
    s, e = raw[0] + offset - lo, raw[1] + offset - lo
    outside = min(s, e) < 0 or max(s, e) > d
    return TemporalPrediction(ParseStatus.OK, source, (s, e), [(s, e)], gts, d, lo, reversed=s > e,
                              clamped=outside, mode=mode)


def _videochat_glue(output: Any) -> Optional[list]:
    """The pairs of the last closed ``<glue>`` block when it is VideoChat-R1's list form, else None."""
    from .protocols import videochat_r1_glue

    blk = extract_block(output, "glue", allow_unclosed=False)
    return None if blk is None else videochat_r1_glue(blk.strip())


def span_iou(tp: TemporalPrediction) -> float:
    """max over ground-truth spans of tIoU(pred, g); 0 if unparsed. Release modes: the release's formula on
    the spans as written (NExT-GQA: its ``get_tIoU``)."""
    if tp.pred is None:
        return 0.0
    if tp.mode == "nextgqa":
        return max([0.0] + [nextgqa_iou_iop(tp.pred, g)[0] for g in tp.gts])
    if is_strict(tp.mode):
        return max(release_temporal_iou(tp.pred, g) for g in tp.gts)
    return max(temporal_iou(tp.pred, g, duration=tp.duration) for g in tp.gts)


def span_boundary_iou(tp: TemporalPrediction) -> float:
    if tp.pred is None:
        return 0.0
    if is_strict(tp.mode):  # Time-R1 iou_v2 as released: unclamped, may go below 0 far outside the video
        return max(release_boundary_iou(tp.pred, g, tp.duration) for g in tp.gts)
    return max(boundary_iou(tp.pred, g, duration=tp.duration) for g in tp.gts)


def span_gaussian(tp: TemporalPrediction, sigma: float = 0.1) -> float:
    """Gaussian boundary reward (max over ground truth). No release defines it: in a release mode it is computed
    on the span as that release parsed it, ordered and clamped by ``gaussian_boundary_reward`` itself."""
    if tp.pred is None:
        return 0.0
    return max(gaussian_boundary_reward(tp.pred, g, duration=tp.duration, sigma=sigma) for g in tp.gts)


def span_multi_iou(tp: TemporalPrediction) -> float:
    """Union-vs-union IoU of *all* parsed spans against all ground-truth spans (a project metric: in a release mode
    the release's single span is used, ordered and clamped by ``multi_interval_iou``)."""
    if not tp.preds:
        return 0.0
    return multi_interval_iou(tp.preds, tp.gts, duration=tp.duration)


def span_iop(tp: TemporalPrediction) -> float:
    """max over ground-truth spans of |pred ∩ g| / |pred| (NExT-GQA); 0 if unparsed or zero-length. Release
    modes: NExT-GQA's official rule (a zero-length prediction inside a ground-truth span scores 1; no clamping;
    the maximum starts at 0)."""
    if tp.pred is None:
        return 0.0
    if is_strict(tp.mode):
        return max([0.0] + [nextgqa_iou_iop(tp.pred, g)[1] for g in tp.gts])
    return max(interval_iop(tp.pred, g, duration=tp.duration) for g in tp.gts)


# --------------------------------------------------------------------------------------------------------------
# Multiple choice and numbers
# --------------------------------------------------------------------------------------------------------------


def _options(sample: Mapping[str, Any]) -> Optional[list[Any]]:
    opts = sample.get("options")
    if opts is None:
        return None
    if isinstance(opts, Mapping):  # {"A": "...", "B": "..."}
        keys = sorted(opts)
        return [opts[k] for k in keys]
    if not isinstance(opts, (list, tuple)):
        raise _err(sample, "options", f"must be a list of strings, got {type(opts).__name__}")
    return list(opts)


def gt_letters(sample: Mapping[str, Any]) -> tuple[str, ...]:
    """Ground-truth letter set from ``answer``: "C", "(C)", "A, C", ["A", "C"] or the exact text of an option."""
    ans = sample.get("answer")
    opts = _options(sample)
    if ans is None:
        raise _err(sample, "answer", "missing")
    if isinstance(ans, (list, tuple)):
        ans = ", ".join(str(a) for a in ans)
    if not isinstance(ans, str):
        raise _err(sample, "answer", f"must be option letter(s) or option text, got {ans!r}")
    letters, invalid = find_choices(ans, options=opts)
    if letters is None:
        why = "letter out of range of options" if invalid else "no option letter found"
        raise _err(sample, "answer", f"{why}: {ans!r}")
    return letters


_ONE_LETTER = re.compile(r"[A-Z]")


def prepare_choice(output: Any, sample: Mapping[str, Any], cfg: ParseConfig = ParseConfig()) -> Parsed[tuple]:
    """Option letters. ``video_r1*``: the compared text must be exactly one upper-case letter (Video-R1 compares
    it with the ground-truth letter for equality, so anything else is wrong; a multi-letter ground truth can
    then never be matched). ``nextgqa``: VideoChat-R1's letter rule (``protocols.videochat_r1_letter``)."""
    mode = cfg.parse_mode
    if mode == "mgpo":  # MGPO: the last \\boxed{} of the answer turn (protocols.mgpo_letter)
        text = completion_text(output)
        if text is None or not text.strip():
            return Parsed(None, ParseStatus.EMPTY, None)
        letter = mgpo_letter(text)
        return Parsed((letter,), ParseStatus.OK, "text") if letter else Parsed(None, ParseStatus.NO_MATCH, "text")
    if mode in ("video_r1", "video_r1_eval", "nextgqa"):
        text, status, source = strict_answer_text(output, mode)
        if text is None:
            return Parsed(None, status, source)
        letter = videochat_r1_letter(text) if mode == "nextgqa" else text.strip()
        if _ONE_LETTER.fullmatch(letter):
            return Parsed((letter,), ParseStatus.OK, source)
        return Parsed(None, ParseStatus.NO_MATCH, source)
    if is_strict(mode):
        raise ValueError(f"parse_mode {mode!r} does not read option letters")
    return parse_choice(
        output, options=_options(sample), allow_unclosed=cfg.allow_unclosed, fallback_to_text=cfg.fallback_to_text
    )


def gt_number(sample: Mapping[str, Any]) -> float:
    ans = sample.get("answer")
    if isinstance(ans, str):
        try:
            ans = float(ans.strip().replace(",", ""))
        except ValueError:
            raise _err(sample, "answer", f"not a number: {sample.get('answer')!r}") from None
    if ans is None:
        raise _err(sample, "answer", "missing")
    return _finite_number(sample, "answer", ans)


def gt_number_text(sample: Mapping[str, Any]) -> str:
    """The ground-truth number as written (Video-R1's decimal-mark rule looks at the text): a JSON string as is,
    a JSON number via str() (7807 -> "7807", 3.5 -> "3.5")."""
    gt_number(sample)  # validates
    ans = sample["answer"]
    return ans if isinstance(ans, str) else str(ans)


def prepare_number(output: Any, sample: Mapping[str, Any], cfg: ParseConfig = ParseConfig()) -> Parsed[float]:
    """One number. ``video_r1*``: float() of the whole compared text after removing commas ("7.42 meters" fails)."""
    if cfg.parse_mode in ("video_r1", "video_r1_eval"):
        text, status, source = strict_answer_text(output, cfg.parse_mode)
        if text is None:
            return Parsed(None, status, source)
        v = video_r1_number(text)
        return Parsed(v, ParseStatus.OK, source) if v is not None else Parsed(None, ParseStatus.NO_MATCH, source)
    if is_strict(cfg.parse_mode):
        raise ValueError(f"parse_mode {cfg.parse_mode!r} does not read numbers")
    return parse_number(
        output, which=cfg.which, allow_unclosed=cfg.allow_unclosed, fallback_to_text=cfg.fallback_to_text
    )


def numeric_correct(output: Any, sample: Mapping[str, Any], cfg: ParseConfig, rel_tol: float = 0.0) -> float:
    """1/0 numeric accuracy: Video-R1's rule (decimal marks, 2-decimal rounding) in the ``video_r1*`` modes, else
    ``numeric_reward`` (relative tolerance) on :func:`prepare_number`."""
    if cfg.parse_mode in ("video_r1", "video_r1_eval"):
        text, _, _ = strict_answer_text(output, cfg.parse_mode)
        return video_r1_numeric_correct(text, gt_number_text(sample))
    from .numeric import numeric_reward

    return numeric_reward(prepare_number(output, sample, cfg).value, gt_number(sample), rel_tol=rel_tol)


# --------------------------------------------------------------------------------------------------------------
# Boxes (REC)
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BoxPrediction:
    """Predicted box converted to original-image pixels and clamped to the image; ``gts`` likewise clamped."""

    status: ParseStatus
    source: Optional[str]
    pred: Optional[tuple[float, float, float, float]]
    gts: list[tuple[float, float, float, float]]
    image_size: tuple[float, float]
    reversed: bool = False
    raw: Optional[tuple[float, float, float, float]] = field(default=None)
    mode: str = "lenient"


def _size_field(sample: Mapping[str, Any], fld: str) -> tuple[float, float]:
    v = sample.get(fld)
    if not isinstance(v, (list, tuple)) or len(v) != 2:
        raise _err(sample, fld, f"must be [W, H], got {v!r}")
    w, h = (_finite_number(sample, fld, x) for x in v)
    if w <= 0 or h <= 0:
        raise _err(sample, fld, f"must be positive, got {v!r}")
    return w, h


def gt_boxes(sample: Mapping[str, Any]) -> list[tuple[float, float, float, float]]:
    boxes = sample.get("boxes")
    if not isinstance(boxes, (list, tuple)) or len(boxes) == 0:
        raise _err(sample, "boxes", f"must be a non-empty list of [x1, y1, x2, y2], got {boxes!r}")
    if all(isinstance(v, (int, float)) for v in boxes):  # a single flat box
        boxes = [boxes]
    out = []
    for k, b in enumerate(boxes):
        if not isinstance(b, (list, tuple)) or len(b) != 4:
            raise _err(sample, f"boxes[{k}]", f"must be [x1, y1, x2, y2], got {b!r}")
        x1, y1, x2, y2 = (_finite_number(sample, f"boxes[{k}]", v) for v in b)
        if x1 > x2 or y1 > y2:
            raise _err(sample, f"boxes[{k}]", f"corners reversed: {b!r}")
        out.append((x1, y1, x2, y2))
    return out


def prepare_box(
    output: Any,
    sample: Mapping[str, Any],
    cfg: ParseConfig = ParseConfig(),
    *,
    frame: str,
    inclusive: bool = False,
    resized_size: Optional[Sequence[float]] = None,
) -> BoxPrediction:
    """Parse one box, convert it from ``frame`` to original pixels (``resized_size`` defaults to the sample's
    ``resized_image_size``) and clamp prediction and ground truth to the image."""
    kind = resolve_box_frame(frame)
    size = _size_field(sample, "image_size")
    gts = [clamp_box(b, size, inclusive=inclusive) for b in gt_boxes(sample)]
    if kind == "resized_abs" and resized_size is None:
        if sample.get("resized_image_size") is None:
            raise _err(sample, "resized_image_size", f"required for box frame {frame!r}")
        resized_size = _size_field(sample, "resized_image_size")
    if is_strict(cfg.parse_mode):
        return _prepare_box_release(output, sample, cfg.parse_mode, frame, size, resized_size)
    p = parse_box(output, which=cfg.which, allow_unclosed=cfg.allow_unclosed, fallback_to_text=cfg.fallback_to_text)
    if not p.ok:
        return BoxPrediction(p.status, p.source, None, gts, size)
    b = box_to_original(p.value, frame, image_size=size, resized_size=resized_size)
    return BoxPrediction(
        ParseStatus.OK, p.source, clamp_box(b, size, inclusive=inclusive), gts, size, p.value.reversed, tuple(p.value)
    )


def _prepare_box_release(output: Any, sample: Mapping[str, Any], mode: str, frame: str, size, resized_size
                         ) -> BoxPrediction:
    """VLM-R1 modes: the integer box as written, rescaled from ``frame``; corners and image bounds untouched."""
    if mode not in ("vlm_r1", "vlm_r1_eval"):
        raise ValueError(f"parse_mode {mode!r} does not read boxes")
    gts = gt_boxes(sample)
    raw, status, source = strict_box(output, mode)
    if raw is None:
        return BoxPrediction(status, source, None, gts, size, mode=mode)
    sx, sy = frame_scale(frame, image_size=size, resized_size=resized_size)
    x1, y1, x2, y2 = raw
    pred = (x1 * sx, y1 * sy, x2 * sx, y2 * sy)
    return BoxPrediction(ParseStatus.OK, source, pred, gts, size, x1 > x2 or y1 > y2, raw, mode=mode)


def box_best_iou(bp: BoxPrediction, *, inclusive: bool = False) -> float:
    """max over ground-truth boxes of the box IoU; VLM-R1 modes use VLM-R1's IoU (``protocols.vlm_r1_box_iou``)."""
    if bp.pred is None:
        return 0.0
    if is_strict(bp.mode):
        return max(vlm_r1_box_iou(bp.pred, g) for g in bp.gts)
    return max(box_iou(bp.pred, g, inclusive=inclusive) for g in bp.gts)
