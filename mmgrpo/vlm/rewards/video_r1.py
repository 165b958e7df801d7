"""Video-R1's accuracy reward over its five problem types, and ROUGE written from its definition.

Release facts (tulerfeng/Video-R1 ``src/r1-v/src/open_r1/grpo.py``, ``accuracy_reward``): the answer is the stripped
text of the first closed ``<answer>\\s*…\\s*</answer>`` block of the completion ("" when there is none), the reference
likewise from the solution; then by ``problem_type``:

* ``multiple choice``: 1 if the two texts are equal, else 0;
* ``numerical``: 0 unless a decimal mark ("." or ",") is in both texts or in neither; then float() after removing
  commas, 1 if equal after rounding both to 2 decimals (:func:`~mmgrpo.vlm.rewards.protocols.video_r1_numeric_correct`);
* ``OCR``: clip(1 − word error rate, 0, 1) (:mod:`mmgrpo.vlm.rewards.ocr`);
* ``free-form``: the mean of the ROUGE-1, ROUGE-2 and ROUGE-L F-measures (``rouge_score`` with ``use_stemmer=True``),
  clipped to [0, 1];
* ``regression``: 1 − clip((|ŷ − y| + 1e-9) / (|y| + 1e-9), 0, 1); an answer that is not a number scores 0.  (As
  released: the 1e-9 terms make an exact answer score 1 − 1e-9/(|y| + 1e-9), and a reference of 0 answered 0
  scores 0.)

ROUGE (Lin 2004, as ``rouge_score`` computes it): texts are lower-cased, every run of characters outside
``[a-z0-9]`` becomes a space, tokens are the non-empty pieces.  ROUGE-N: with the n-gram count multisets R (reference)
and H (hypothesis), overlap = Σ_g min(R_g, H_g), P = overlap / max(|H|, 1), R = overlap / max(|R|, 1),
F = 2PR / (P + R) (0 when P + R = 0).  ROUGE-L: P = LCS / |H|, R = LCS / |R| over the token sequences (0 when either is
empty), F as above.  The package ``rouge_score`` is not installable from this project's registry, so the formulas
are written here.  **Stemming:** the release stems tokens longer than 3 characters with the Porter stemmer;
``stemmer="porter"`` does that with ``nltk`` (``pip install nltk``; reward option ``rouge_stemmer: porter``), the
default ``"none"`` does not (a documented deviation: "running" and "run" then differ).
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any, Callable, Mapping, Optional, Sequence

from .ocr import ocr_wer_reward
from .protocols import video_r1_choice_correct, video_r1_number, video_r1_numeric_correct

__all__ = ["rouge_tokens", "rouge_n", "rouge_l", "video_r1_rouge", "video_r1_regression", "video_r1_accuracy",
           "video_r1_answer", "PROBLEM_TYPES", "make_stemmer"]

PROBLEM_TYPES = ("multiple choice", "numerical", "OCR", "free-form", "regression")
_ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)
_NON_ALNUM = re.compile(r"[^a-z0-9]+")


def video_r1_answer(text: Optional[str]) -> Optional[str]:
    """Stripped content of the first closed ``<answer>`` block; None when there is none (the release uses "")."""
    if text is None:
        return None
    m = _ANSWER.search(text)
    return m.group(1).strip() if m else None


def make_stemmer(name: str) -> Optional[Callable[[str], str]]:
    """``"none"`` -> None; ``"porter"`` -> nltk's Porter stemmer (the one ``rouge_score`` uses)."""
    if name == "none":
        return None
    if name == "porter":
        try:
            from nltk.stem import porter
        except ImportError as e:
            raise ImportError("rouge_stemmer=porter needs nltk (pip install nltk)") from e
        return porter.PorterStemmer().stem
    raise ValueError(f"rouge_stemmer must be 'none' or 'porter', got {name!r}")


def rouge_tokens(text: str, stem: Optional[Callable[[str], str]] = None) -> list[str]:
    """Lower-case, non-[a-z0-9] runs -> spaces, split; tokens longer than 3 characters stemmed when ``stem``."""
    toks = [t for t in _NON_ALNUM.sub(" ", text.lower()).split() if t]
    if stem is not None:
        toks = [stem(t) if len(t) > 3 else t for t in toks]
        toks = [t for t in toks if re.fullmatch(r"[a-z0-9]+", t)]
    return toks


def _f(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if p + r > 0 else 0.0


def rouge_n(ref: Sequence[str], hyp: Sequence[str], n: int) -> float:
    """ROUGE-N F-measure of token lists (module docstring)."""
    rg = Counter(tuple(ref[i:i + n]) for i in range(len(ref) - n + 1))
    hg = Counter(tuple(hyp[i:i + n]) for i in range(len(hyp) - n + 1))
    overlap = sum(min(c, hg[g]) for g, c in rg.items())
    return _f(overlap / max(sum(hg.values()), 1), overlap / max(sum(rg.values()), 1))


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, start=1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def rouge_l(ref: Sequence[str], hyp: Sequence[str]) -> float:
    """ROUGE-L F-measure (longest common subsequence) of token lists; 0 when either is empty."""
    if not ref or not hyp:
        return 0.0
    lcs = _lcs(ref, hyp)
    return _f(lcs / len(hyp), lcs / len(ref))


def video_r1_rouge(reference: str, hypothesis: str, stem: Optional[Callable[[str], str]] = None) -> float:
    """Video-R1 free-form reward: clip(mean(ROUGE-1 F, ROUGE-2 F, ROUGE-L F), 0, 1)."""
    r, h = rouge_tokens(reference, stem), rouge_tokens(hypothesis, stem)
    return max(0.0, min(1.0, (rouge_n(r, h, 1) + rouge_n(r, h, 2) + rouge_l(r, h)) / 3))


def video_r1_regression(answer: Optional[str], reference: str) -> float:
    """1 − clip((|ŷ − y| + 1e-9) / (|y| + 1e-9), 0, 1) as released; 0 when either is not a number."""
    out, gt = video_r1_number(answer), video_r1_number(reference)
    if out is None or gt is None:
        return 0.0
    rel = (abs(out - gt) + 1e-9) / (abs(gt) + 1e-9)
    return 1.0 - min(1.0, max(0.0, rel))


def video_r1_accuracy(text: Optional[str], reference: Any, problem_type: str,
                      stem: Optional[Callable[[str], str]] = None) -> tuple[float, bool]:
    """(Video-R1's accuracy of ``text`` for ``reference`` under ``problem_type``, answer block found)."""
    ans = video_r1_answer(text)
    ref = str(reference)
    inner = video_r1_answer(ref)
    ref = inner if inner is not None else ref.strip()
    if problem_type == "multiple choice":
        r = video_r1_choice_correct(ans if ans is not None else "", ref)
    elif problem_type == "numerical":
        r = video_r1_numeric_correct(ans if ans is not None else "", ref)
    elif problem_type == "OCR":
        r = ocr_wer_reward(text, ref)
    elif problem_type == "free-form":
        r = video_r1_rouge(ref, ans or "", stem)
    elif problem_type == "regression":
        r = video_r1_regression(ans, ref)
    else:
        raise ValueError(f"unknown Video-R1 problem type {problem_type!r}; one of {PROBLEM_TYPES}")
    return r, ans is not None


def sample_problem_type(sample: Mapping[str, Any]) -> str:
    """"multiple choice" for mcq samples, ``meta.problem_type`` for qa samples."""
    if sample.get("task") == "qa":
        return str((sample.get("meta") or {}).get("problem_type", ""))
    return "multiple choice"
