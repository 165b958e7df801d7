"""Per-release answer parsing and measurement rules ("parse modes"), next to the project's lenient parser.

The project's default parser (:mod:`mmgrpo.vlm.rewards.parsing`, mode ``lenient``) is deliberately forgiving: it
accepts an unclosed ``<answer>``, "25.3s", "(C)", "The answer is C", option text, float and reversed boxes, and
it swaps reversed spans and clamps predictions to the video. That is a documented choice for training signal and
diagnostics, but each released method reads answers more strictly, and its numbers are only comparable when the
same rules are applied. The modes below reproduce the released code's rules (written from reading the releases;
no code is copied). Each mode names the file it follows.

=================  ======  ====================================================================================
mode               tasks   rules (release file)
=================  ======  ====================================================================================
``lenient``        all     the project parser (module docstring of ``parsing``): last block, unclosed allowed,
                           spans swapped and clamped, boxes ordered and clamped, many MCQ spellings.
``time_r1``        tvg     Time-R1 training reward (xiaomi-research/time-r1 ``main.py``): the **last** closed
                           ``<answer>…</answer>`` block (exact lower-case tag); in it the **last** "A to B" /
                           "A and B" (one space each side, either case of to/and; A, B unsigned decimals
                           ``\\d+\\.?\\d*``); nothing else ("25.3s to 30s", "A - B", "A–B" fail; "00:10 to 00:20"
                           reads as 10 to 0).
``time_r1_eval``   tvg     Time-R1 evaluation (``evaluate.py`` / ``src/vllm_inference/eval_all.py``): the last
                           "A to B" / "A and B" (lower-case to/and) anywhere in the output, answer block or
                           not; R1@θ counts IoU **> θ**; the mean is over the predictions that exist.
``tempsamp_r1``    tvg     TempSamp-R1 reward as re-implemented in ZhangZikun6666/TempSamp-R1
                           (``scripts/timelens/timelens_reward.py``; the official HVision-NKU code is not
                           public): the **first** closed answer block, else the whole text; in it the last
                           "A to B" / "A and B" (any spacing), else the last "A - B", else the first two
                           numbers that stand alone as words.
``video_r1``       mcq     Video-R1 training accuracy reward (tulerfeng/Video-R1 ``src/r1-v/src/open_r1/grpo.py``):
                           the **first** closed ``<answer>\\s*…\\s*</answer>`` block, stripped; no block = wrong.
                           Multiple choice: the stripped text must *equal* the ground-truth letter ("C"; "(C)",
                           "C.", "c", "The answer is C", option text are wrong). Numbers: "." or "," must occur
                           in both the answer and the ground-truth text or in neither; then float() after
                           removing commas ("7.42 meters" fails), equal after rounding both to 2 decimals.
``video_r1_eval``  mcq     Video-R1 evaluation (``src/eval_bench.py``): as ``video_r1``, but when there is no
                           answer block (or it is empty) the whole output is compared instead.
``vlm_r1``         rec     VLM-R1 REC reward (om-ai-lab/VLM-R1 ``vlm_modules/qwen_module.py`` ``iou_reward``):
                           the first closed answer block, stripped; the **first** integer box ``[x1,y1,x2,y2]``
                           (digits only, ``\\s*`` after each comma, no space inside the brackets' ends).
``vlm_r1_eval``    rec     VLM-R1 REC evaluation (``src/eval/test_rec_r1.py``): the first closed answer block;
                           the **last** integer box that sits inside ``{…}``; Acc counts IoU **> 0.5**; a
                           missing answer scores as the box [0, 0, 0, 0].
``mgpo``           mcq     MGPO training reward (xinyu1205/verl branch mgpo,
                           ``verl/utils/reward_score/high_resolution.py``, mathruler's ``extract_boxed_content``
                           + ``grade_answer``): the content of the **last**
                           ``\\boxed{…}`` (braces balanced) of the response; right if, after mathruler's
                           normalisation as it acts on a letter (strip, ``\\text{…}`` unwrapped, spaces dropped,
                           case folded), it equals the ground-truth letter; no box = wrong.
``nextgqa``        gqa     NExT-GQA grounding evaluation (doc-doc/NExT-GQA ``code/TempGQA/eval_ground.py``)
                           for the evidence span, with the answer letter read as VideoChat-R1's GQA evaluation
                           does (OpenGVLab/VideoChat-R1 ``src_eval/evaluate_gqa.py``: the first closed answer
                           block, a few "The answer is" prefixes removed, then the first of A–G).
=================  ======  ====================================================================================

The ``format`` reward in a release mode is that release's format check (:func:`release_format`).
Measurement in every strict mode follows the releases too: reversed spans/boxes are kept as written (the
releases' overlap formulas then give 0), predictions are not clamped to the video or image, and ground truth is
used as annotated (the project's clip-relative time offset still applies: it is a data convention, not parsing).

Functions never raise on any text input.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .parsing import ParseStatus, completion_text

__all__ = [
    "PARSE_MODES",
    "ParseMode",
    "check_parse_mode",
    "is_strict",
    "strict_span",
    "strict_answer_text",
    "video_r1_choice_correct",
    "video_r1_number",
    "video_r1_numeric_correct",
    "strict_box",
    "release_format",
    "videochat_r1_letter",
    "last_boxed",
    "mgpo_letter",
    "videochat_r1_glue",
    "release_temporal_iou",
    "release_boundary_iou",
    "nextgqa_iou_iop",
    "vlm_r1_box_iou",
]


@dataclass(frozen=True)
class ParseMode:
    tasks: tuple[str, ...]
    release: str  # repository and file the rules follow
    summary: str


PARSE_MODES: dict[str, ParseMode] = {
    "lenient": ParseMode(("tvg", "mcq", "gqa", "rec", "qa"), "mmgrpo (this project)",
                         "tolerant parser: unclosed blocks, many spellings, spans swapped/clamped"),
    "time_r1": ParseMode(("tvg",), "xiaomi-research/time-r1 main.py (reward)",
                         "last closed <answer>, last 'A to B'/'A and B', no swap, no clamp"),
    "time_r1_eval": ParseMode(("tvg",), "xiaomi-research/time-r1 evaluate.py + src/vllm_inference/eval_all.py",
                              "last 'A to B'/'A and B' in the whole output, R1@θ counts IoU > θ"),
    "tempsamp_r1": ParseMode(("tvg",), "ZhangZikun6666/TempSamp-R1 scripts/timelens/timelens_reward.py "
                                       "(re-implementation; the official code is not public)",
                             "first closed <answer> else whole text; last 'A to B', else 'A - B', else 2 numbers"),
    "video_r1": ParseMode(("mcq", "qa"), "tulerfeng/Video-R1 src/r1-v/src/open_r1/grpo.py (reward)",
                          "first closed <answer>; exact letter; numbers: decimal-mark rule, round to 2"),
    "video_r1_eval": ParseMode(("mcq",), "tulerfeng/Video-R1 src/eval_bench.py",
                               "as video_r1, whole output when there is no answer block"),
    "vlm_r1": ParseMode(("rec",), "om-ai-lab/VLM-R1 src/open-r1-multimodal/src/open_r1/vlm_modules/qwen_module.py "
                                  "(reward)", "first closed <answer>, first integer box, no corner fixing"),
    "vlm_r1_eval": ParseMode(("rec",), "om-ai-lab/VLM-R1 src/eval/test_rec_r1.py",
                             "first closed <answer>, last integer box inside {...}, Acc counts IoU > 0.5"),
    "mgpo": ParseMode(("mcq",), "xinyu1205/verl@mgpo verl/utils/reward_score/high_resolution.py (reward)",
                      "last \\boxed{...} of the response, mathruler-normalised letter equals the ground truth"),
    "nextgqa": ParseMode(("gqa",), "doc-doc/NExT-GQA code/TempGQA/eval_ground.py (grounding) + "
                                   "OpenGVLab/VideoChat-R1 src_eval/evaluate_gqa.py (answer letter)",
                         "IoP of a point inside the GT = 1, no clamp, missing predictions skipped"),
}


def check_parse_mode(mode: str, task: str) -> str:
    """``mode`` if it is known and applies to ``task``; ValueError listing the choices otherwise."""
    if mode not in PARSE_MODES:
        raise ValueError(f"unknown parse_mode {mode!r}; choose one of {sorted(PARSE_MODES)}")
    if task not in PARSE_MODES[mode].tasks:
        ok = sorted(m for m, pm in PARSE_MODES.items() if task in pm.tasks)
        raise ValueError(f"parse_mode {mode!r} does not apply to task {task!r} (modes for {task}: {ok})")
    return mode


def is_strict(mode: Optional[str]) -> bool:
    return mode not in (None, "lenient")


# --------------------------------------------------------------------------------------------------------------
# Answer blocks as the releases read them: exact lower-case tags, closed blocks only, non-overlapping scan
# --------------------------------------------------------------------------------------------------------------

_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BLOCK_PADDED = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)  # Video-R1 trims inside the tags


def _first_block(text: str, padded: bool = False) -> Optional[str]:
    m = (_BLOCK_PADDED if padded else _BLOCK).search(text)
    return None if m is None else m.group(1)


def _last_block(text: str) -> Optional[str]:
    blocks = _BLOCK.findall(text)
    return blocks[-1] if blocks else None


def strict_answer_text(output: Any, mode: str) -> tuple[Optional[str], ParseStatus, Optional[str]]:
    """(text the release compares, status, source) for the MCQ/GQA modes. ``source`` is "answer" or "text"."""
    text = completion_text(output)
    if text is None or not text.strip():
        return None, ParseStatus.EMPTY, None
    if mode in ("video_r1", "video_r1_eval"):
        blk = _first_block(text, padded=True)
        if blk is not None and blk.strip() != "":
            return blk.strip(), ParseStatus.OK, "answer"
        if mode == "video_r1_eval":  # the evaluation compares the whole output instead
            return text, ParseStatus.OK, "text"
        return None, ParseStatus.NO_ANSWER_BLOCK if blk is None else ParseStatus.EMPTY, None
    blk = _first_block(text)  # nextgqa (VideoChat-R1's answer reading)
    if blk is None:
        return None, ParseStatus.NO_ANSWER_BLOCK, None
    return blk, ParseStatus.OK, "answer"


# --------------------------------------------------------------------------------------------------------------
# Temporal spans (raw, as written: start may exceed end)
# --------------------------------------------------------------------------------------------------------------

_NUM = r"(\d+\.?\d*)"
_TIME_R1_PAIR = re.compile(_NUM + r" (?:to|and) " + _NUM)
_TIME_R1_PAIR_ANYCASE = re.compile(_NUM + r" (?:to|and) " + _NUM, re.IGNORECASE)
_TS_PAIR = re.compile(_NUM + r"\s*(?:to|and)\s*" + _NUM)
_TS_DASH = re.compile(_NUM + r"\s*-\s*" + _NUM)
_TS_WORD_NUM = re.compile(r"\b" + _NUM + r"\b")


def _last_pair(rx: re.Pattern[str], s: str) -> Optional[tuple[float, float]]:
    pairs = rx.findall(s)  # non-overlapping, left to right, like the releases
    if not pairs:
        return None
    a, b = pairs[-1]
    return _finite_pair(a, b)


def _finite_pair(a: str, b: str) -> Optional[tuple[float, float]]:
    try:
        x, y = float(a), float(b)
    except (ValueError, OverflowError):
        return None
    return (x, y) if math.isfinite(x) and math.isfinite(y) else None


def strict_span(output: Any, mode: str) -> tuple[Optional[tuple[float, float]], ParseStatus, Optional[str]]:
    """(raw span (start, end) as written, status, source) under a TVG mode. Never raises."""
    try:
        text = completion_text(output)
        if text is None or not text.strip():
            return None, ParseStatus.EMPTY, None
        if mode == "time_r1":
            blk = _last_block(text)
            if blk is None:
                return None, ParseStatus.NO_ANSWER_BLOCK, None
            sp = _last_pair(_TIME_R1_PAIR_ANYCASE, blk)
            return (sp, ParseStatus.OK, "answer") if sp else (None, ParseStatus.NO_MATCH, "answer")
        if mode == "time_r1_eval":
            sp = _last_pair(_TIME_R1_PAIR, text)
            src = "answer" if _first_block(text) is not None else "text"
            return (sp, ParseStatus.OK, src) if sp else (None, ParseStatus.NO_MATCH, src)
        if mode == "tempsamp_r1":
            blk = _first_block(text)
            s, src = (blk, "answer") if blk is not None else (text, "text")
            sp = _last_pair(_TS_PAIR, s) or _last_pair(_TS_DASH, s)
            if sp is None:
                nums = _TS_WORD_NUM.findall(s)
                if len(nums) >= 2:
                    sp = _finite_pair(nums[0], nums[1])
            return (sp, ParseStatus.OK, src) if sp else (None, ParseStatus.NO_MATCH, src)
        raise ValueError(f"parse_mode {mode!r} has no span rule")
    except ValueError:
        raise
    except Exception:  # pragma: no cover - defensive
        return None, ParseStatus.INVALID, None


def release_temporal_iou(pred: Sequence[float], gt: Sequence[float]) -> float:
    """The releases' tIoU on spans as written: max(0, min(e) − max(s)) / (max(e) − min(s)); a reversed prediction
    gets 0 (its intersection is negative); nothing is clamped; a zero union gives 0 (Time-R1's reward would
    reuse a stale value, its evaluation would give NaN)."""
    (sp, ep), (sg, eg) = pred, gt
    inter = max(0.0, min(ep, eg) - max(sp, sg))
    union = max(ep, eg) - min(sp, sg)
    return inter / union if union > 0 else 0.0


def release_boundary_iou(pred: Sequence[float], gt: Sequence[float], duration: float) -> float:
    """Time-R1 ``iou_v2`` as released: tIoU · (1 − |s_p − s_g|/D) · (1 − |e_p − e_g|/D), unclamped."""
    (sp, ep), (sg, eg) = pred, gt
    return release_temporal_iou(pred, gt) * (1 - abs(sg - sp) / duration) * (1 - abs(eg - ep) / duration)


def nextgqa_iou_iop(pred: Sequence[float], gt: Sequence[float]) -> tuple[float, float]:
    """NExT-GQA ``get_tIoU`` for one ground-truth span: a zero-length prediction scores IoU 0 and IoP 1 when
    it lies inside the ground truth (ends included), else 0/0; otherwise IoU = inter/union and IoP =
    inter/|pred| with inter = min(e) − max(s) (negative when disjoint: the caller's max with 0 removes it);
    a reversed prediction has IoP 0."""
    ps, pe = pred
    gs, ge = gt
    if ps == pe:
        return (0.0, 1.0) if gs <= ps <= ge else (0.0, 0.0)
    inter = min(ge, pe) - max(gs, ps)
    lo, hi = min(gs, ps), max(ge, pe)
    iou = inter / (hi - lo) if hi > lo else 0.0
    iop = inter / (pe - ps) if pe > ps else 0.0
    return iou, iop


# --------------------------------------------------------------------------------------------------------------
# Multiple choice and numbers (Video-R1), answer letters (VideoChat-R1 GQA)
# --------------------------------------------------------------------------------------------------------------


def video_r1_choice_correct(answer_text: Optional[str], gt_text: str) -> float:
    """Video-R1: the stripped answer equals the stripped ground-truth answer text (exact, case-sensitive)."""
    if answer_text is None:
        return 0.0
    return 1.0 if answer_text.strip() == gt_text.strip() else 0.0


def _has_decimal_mark(s: str) -> bool:
    return "." in s or "," in s


def video_r1_number(answer_text: Optional[str]) -> Optional[float]:
    """float() of the answer after removing commas, or None ("7.42 meters", "about 7"); non-finite → None."""
    if answer_text is None:
        return None
    try:
        v = float(answer_text.replace(",", ""))
    except (ValueError, OverflowError):
        return None
    return v if math.isfinite(v) else None


def video_r1_numeric_correct(answer_text: Optional[str], gt_text: str) -> float:
    """Video-R1 "numerical": a decimal mark ("." or ",") in both texts or in neither, then equal numbers after
    rounding both to 2 decimals ("7,807" vs "7807" is wrong: the mark rule; "3.14159" vs "3.14" is right)."""
    if answer_text is None:
        return 0.0
    if _has_decimal_mark(gt_text) != _has_decimal_mark(answer_text):
        return 0.0
    out, gt = video_r1_number(answer_text), video_r1_number(gt_text)
    if out is None or gt is None:
        return 0.0
    return 1.0 if round(gt, 2) == round(out, 2) else 0.0


_VC_PREFIXES = ("The best answer is", "The correct answer is", "The answer is", "The answer",
                "The best option is", "The correct option is", "Best answer:Best option:")
# (the last entry is one string in the release: two literals joined by a missing comma; kept as it behaves)
_VC_LETTER = re.compile(r"[ABCDEFG]")


def videochat_r1_letter(s: Optional[str]) -> str:
    """VideoChat-R1's GQA letter: strip, remove the fixed prefixes, "" if more than 10 words and no A–G, else
    the first of A–G anywhere ("" if none)."""
    if s is None:
        return ""
    s = s.strip()
    for p in _VC_PREFIXES:
        s = s.replace(p, "")
    m = _VC_LETTER.search(s)
    if len(s.split()) > 10 and m is None:
        return ""
    return "" if m is None else m.group(0)


_BOXED = "\\boxed{"


def last_boxed(text: Optional[str]) -> Optional[str]:
    """The content of the last ``\\boxed{...}`` of ``text`` (nested braces balanced), None if there is none or it
    is not closed (mathruler's ``extract_boxed_content`` returns "None" then, which grades as wrong)."""
    if not text:
        return None
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, body = 0, text[start + len(_BOXED):]
    for i, ch in enumerate(body):
        if ch == "{":
            depth += 1
        elif ch == "}":
            if depth == 0:
                return body[:i].strip()
            depth -= 1
    return None


_TEXT_WRAP = re.compile(r"^\\text\{(.+?)\}$")


def mgpo_letter(text: Optional[str]) -> str:
    """The option letter MGPO's reward reads: the last boxed content, ``\\text{...}`` unwrapped, spaces removed,
    upper-cased ("" when there is no box or the content is not one letter A-Z)."""
    b = last_boxed(text)
    if b is None:
        return ""
    m = _TEXT_WRAP.match(b.strip())
    b = (m.group(1) if m else b).replace(" ", "").upper()
    return b if len(b) == 1 and "A" <= b <= "Z" else ""


# --------------------------------------------------------------------------------------------------------------
# Format rewards as released (the "format" reward in a release mode)
# --------------------------------------------------------------------------------------------------------------

_THINK_ANSWER = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
_VLM_R1_FORMAT = re.compile(
    r"<think>.*?</think>\s*<answer>.*?\{.*\[\d+,\s*\d+,\s*\d+,\s*\d+\].*\}.*?</answer>", re.DOTALL)
_TS_FORMAT_PAIR = re.compile(r"\d+\.?\d*\s*(?:to|and|-)\s*\d+\.?\d*")


def release_format(output: Any, mode: str, strict: bool = False) -> float:
    """1/0 format reward of a release (exact lower-case tags):

    * time_r1 / time_r1_eval (Time-R1 ``format_reward``): the *stripped* text fully matches
      ``<think>…</think>`` + whitespace + ``<answer>…</answer>`` (non-greedy parts may span further tags, so
      "<think>a</think><answer>b</answer><answer>c</answer>" passes);
    * video_r1 / video_r1_eval (Video-R1 ``format_reward``): the same full match on the text *as generated*;
    * vlm_r1 / vlm_r1_eval (VLM-R1 ``format_reward_rec``): such a think + answer sequence *somewhere* in the text
      whose answer holds an integer box inside ``{…}``;
    * tempsamp_r1 (re-implementation, default loose check): the first closed answer block contains a number pair
      joined by to / and / "-"; ``strict=True`` is the release's strict variant (its ``TIMELENS_STRICT_FORMAT=1``):
      exactly one closed answer block, the text (right-stripped) ends with ``</answer>``, no newline inside the
      block, and the block contains such a pair (text before the block and around the pair is still accepted);
    * nextgqa (VideoChat-R1 ``src/open_r1/grpo_gqa.py`` ``format_reward``): the stripped text fully matches
      ``<think>…</think>`` + ws + ``<answer>…</answer>`` + ws + ``<glue>…</glue>``, and the first ``<glue>`` block
      holds a list of ``(s, e)`` pairs, s ≤ e (:func:`videochat_r1_glue`).
    """
    text = completion_text(output)
    if text is None:
        return 0.0
    if mode in ("video_r1", "video_r1_eval"):
        return 1.0 if _THINK_ANSWER.fullmatch(text) else 0.0
    if mode in ("vlm_r1", "vlm_r1_eval"):
        return 1.0 if _VLM_R1_FORMAT.search(text) else 0.0
    if mode == "tempsamp_r1":
        if strict:
            blocks = _BLOCK.findall(text)
            ok = (len(blocks) == 1 and text.rstrip().endswith("</answer>") and "\n" not in blocks[0]
                  and "\r" not in blocks[0] and _TS_FORMAT_PAIR.search(blocks[0]) is not None)
            return 1.0 if ok else 0.0
        blk = _first_block(text)
        return 1.0 if blk is not None and _TS_FORMAT_PAIR.search(blk) else 0.0
    if mode == "mgpo":  # the release has no format reward; "a closed \\boxed{} exists" stands in for it
        return 1.0 if last_boxed(text) is not None else 0.0
    if mode == "nextgqa":
        if not _THINK_ANSWER_GLUE.fullmatch(text.strip()):
            return 0.0
        m = _GLUE.search(text)
        return 1.0 if m is not None and videochat_r1_glue(m.group(1)) is not None else 0.0
    return 1.0 if _THINK_ANSWER.fullmatch(text.strip()) else 0.0


_THINK_ANSWER_GLUE = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>\s*<glue>.*?</glue>", re.DOTALL)
_GLUE = re.compile(r"<glue>(.*?)</glue>", re.DOTALL)
_NUM_DEC = r"\d+(?:\.\d+)?"
_GLUE_LIST = re.compile(r"\[(?:\(" + _NUM_DEC + r",\s*" + _NUM_DEC + r"\)(?:,\s*\(" + _NUM_DEC + r",\s*" + _NUM_DEC
                        + r"\))*(?:,)?|)\]$")
_GLUE_PAIR = re.compile(r"\((" + _NUM_DEC + r"),\s*(" + _NUM_DEC + r")\)")


def videochat_r1_glue(s: str) -> Optional[list[tuple[float, float]]]:
    """VideoChat-R1's evidence list ``[(s1, e1), (s2, e2), ...]`` (unsigned decimals, an optional trailing comma,
    "[]" allowed, nothing else), or None; a pair with s > e makes the whole list invalid (its
    ``is_valid_two_d_list_format``)."""
    if not _GLUE_LIST.match(s):
        return None
    pairs = [(float(a), float(b)) for a, b in _GLUE_PAIR.findall(s)]
    return None if any(a > b for a, b in pairs) else pairs


# --------------------------------------------------------------------------------------------------------------
# Boxes (VLM-R1)
# --------------------------------------------------------------------------------------------------------------

_INT_BOX = re.compile(r"\[(\d+),\s*(\d+),\s*(\d+),\s*(\d+)]")
_INT_BOX_IN_BRACES = re.compile(r"\{.*\[(\d+),\s*(\d+),\s*(\d+),\s*(\d+)]\s*.*\}", re.DOTALL)  # greedy: last box


def strict_box(output: Any, mode: str) -> tuple[Optional[tuple[float, float, float, float]], ParseStatus, Optional[str]]:
    """(box as written, status, source) under a REC mode; integers only, corners not reordered. Never raises."""
    try:
        text = completion_text(output)
        if text is None or not text.strip():
            return None, ParseStatus.EMPTY, None
        blk = _first_block(text)
        if blk is None:
            return None, ParseStatus.NO_ANSWER_BLOCK, None
        blk = blk.strip()
        if mode == "vlm_r1":
            m = _INT_BOX.search(blk)
        elif mode == "vlm_r1_eval":
            m = _INT_BOX_IN_BRACES.search(blk)
        else:
            raise ValueError(f"parse_mode {mode!r} has no box rule")
        if m is None:
            return None, ParseStatus.NO_MATCH, "answer"
        return tuple(float(int(g)) for g in m.groups()), ParseStatus.OK, "answer"  # type: ignore[return-value]
    except ValueError:
        raise
    except Exception:  # pragma: no cover
        return None, ParseStatus.INVALID, None


def vlm_r1_box_iou(pred: Sequence[float], gt: Sequence[float]) -> float:
    """VLM-R1's IoU (reward and evaluation): the intersection counts only when it is wider and taller than one
    pixel (max(x1) < min(x2) − 1, same for y), and then equals the continuous overlap; areas are
    (x2 − x1)(y2 − y1) as written (a reversed box has no intersection, so IoU 0); a zero union gives 0 here
    (the release divides by zero)."""
    ix1, iy1 = max(pred[0], gt[0]), max(pred[1], gt[1])
    ix2, iy2 = min(pred[2] - 1, gt[2] - 1), min(pred[3] - 1, gt[3] - 1)
    inter = (ix2 - ix1 + 1) * (iy2 - iy1 + 1) if (ix1 < ix2 and iy1 < iy2) else 0.0
    union = (pred[2] - pred[0]) * (pred[3] - pred[1]) + (gt[2] - gt[0]) * (gt[3] - gt[1]) - inter
    if union == 0:
        return 0.0
    return inter / union
