"""VLM rewards: tolerant answer parsing, temporal-IoU family, format, multiple choice, box IoU, numeric, length.

All reward math is pure Python on floats (importing this package does not import torch or numpy); torch tensors
appear only in the batched function returned by :func:`build_reward_fn`. The eval harness (``eval/score.py``)
imports the same parsers and IoU functions, so training rewards and reported metrics agree by construction.

Modules: ``parsing`` (never-raising lenient parsers with a parse status), ``protocols`` (per-release parse modes:
Time-R1, TempSamp-R1, Video-R1, VLM-R1, NExT-GQA), ``temporal`` (tIoU, boundary-penalised IoU,
Gaussian boundary reward, multi-interval IoU, IoP, thresholds), ``box`` (box IoU, model coordinate frames,
smart_resize), ``multibox`` (Visual-RFT multi-box IoU / confidence), ``ocr`` (Video-R1 1 − WER),
``choice`` (MCQ exact / TW-GRPO soft), ``numeric``, ``format``, ``length``, ``tasks`` (sample-level glue:
clip-relative time, clamping, multi-GT) and ``registry`` (``build_reward_fn``).
"""
from .box import BOX_FRAMES, box_iou, box_to_original, clamp_box, resolve_box_frame, smart_resize
from .choice import mcq_exact, mcq_soft
from .format import format_reward
from .length import length_bonus
from .numeric import mean_relative_accuracy, numeric_reward, relative_error
from .parsing import (
    AnswerBlock,
    Box,
    Parsed,
    ParseStatus,
    Span,
    Structure,
    completion_text,
    extract_answer,
    extract_block,
    find_boxes,
    find_choices,
    find_numbers,
    find_spans,
    parse_box,
    parse_boxes,
    parse_choice,
    parse_number,
    parse_span,
    parse_spans,
    parse_structure,
)
from .protocols import PARSE_MODES
from .registry import REWARDS, TASKS, RewardFn, build_reward_fn
from .tasks import ParseConfig, SampleError
from .temporal import (
    boundary_iou,
    clamp_span,
    gaussian_boundary_reward,
    interval_iop,
    merge_intervals,
    multi_interval_iop,
    multi_interval_iou,
    temporal_iou,
    threshold_reward,
)

__all__ = [
    "AnswerBlock", "Box", "Parsed", "ParseStatus", "Span", "Structure", "completion_text", "extract_answer",
    "extract_block", "find_boxes", "find_choices", "find_numbers", "find_spans", "parse_box", "parse_boxes",
    "parse_choice", "parse_number", "parse_span", "parse_spans", "parse_structure",
    "boundary_iou", "clamp_span", "gaussian_boundary_reward", "interval_iop", "merge_intervals",
    "multi_interval_iop", "multi_interval_iou", "temporal_iou", "threshold_reward",
    "BOX_FRAMES", "box_iou", "box_to_original", "clamp_box", "resolve_box_frame", "smart_resize",
    "mcq_exact", "mcq_soft", "mean_relative_accuracy", "numeric_reward", "relative_error",
    "format_reward", "length_bonus",
    "REWARDS", "TASKS", "RewardFn", "build_reward_fn", "ParseConfig", "SampleError", "PARSE_MODES",
]  # fmt: skip
