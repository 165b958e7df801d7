"""Video-R1's OCR reward: 1 − word error rate, clipped to [0, 1].

Release facts (tulerfeng/Video-R1, ``src/r1-v/src/open_r1/grpo.py``, problem_type "OCR"): the answer is the
stripped text of the first closed ``<answer>…</answer>`` block of the completion and of the solution ("" when
there is none); words are ``str.split()`` tokens (whitespace, case-sensitive, punctuation kept); WER = word-level
Levenshtein distance (unit-cost substitution / insertion / deletion) divided by ``max(1, #reference words)``;
reward = ``max(0, min(1, 1 − WER))``. The edit distance below is this project's own implementation.
"""
from __future__ import annotations

import re
from typing import Any, Optional, Sequence

__all__ = ["word_edit_distance", "word_error_rate", "ocr_answer", "ocr_wer_reward"]

# first closed block, inner whitespace trimmed (Video-R1 reads OCR answers this way; unclosed = no answer)
_ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)


def word_edit_distance(ref: Sequence[str], hyp: Sequence[str]) -> int:
    """Minimum number of word substitutions, insertions and deletions turning ``ref`` into ``hyp``."""
    prev = list(range(len(hyp) + 1))  # distance from ref[:0] to hyp[:j]
    for i, r in enumerate(ref, start=1):
        cur = [i] + [0] * len(hyp)
        for j, h in enumerate(hyp, start=1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h))
        prev = cur
    return prev[-1]


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word edit distance / max(1, number of reference words) (can exceed 1 for long hypotheses)."""
    ref, hyp = reference.split(), hypothesis.split()
    return word_edit_distance(ref, hyp) / max(1, len(ref))


def ocr_answer(text: Optional[str]) -> Optional[str]:
    """The stripped content of the first closed ``<answer>`` block, or None (the release then scores "")."""
    if text is None:
        return None
    m = _ANSWER.search(text)
    return m.group(1).strip() if m else None


def ocr_wer_reward(output: Optional[str], reference: Any) -> float:
    """clip(1 − WER(reference, answer), 0, 1); a ground truth written as ``<answer>X</answer>`` is unwrapped."""
    ref = str(reference)
    inner = ocr_answer(ref)
    ref = inner if inner is not None else ref.strip()
    hyp = ocr_answer(output) or ""
    return max(0.0, min(1.0, 1.0 - word_error_rate(ref, hyp)))
