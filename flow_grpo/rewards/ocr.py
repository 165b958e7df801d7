"""OCR text-match reward with rapidocr-onnxruntime (its wheel ships PP-OCRv4 weights; works offline).

``r = clip(1 - Lev(pred, target) / max(|pred|, |target|), 0, 1)`` (and 0 if both are empty after normalisation
is impossible: an empty target is an error).  ``pred`` is all recognised text boxes joined in reading order
(top-to-bottom lines, then left-to-right); by default both strings are lower-cased and whitespace is removed
before comparing, because OCR engines split/merge words unpredictably.

Target text: ``metadata[i][target_key]`` (default ``"text"``) if present, otherwise the first quoted span in
the prompt (``"..."``, ``'...'``, ``“...”`` or ``‘...’``).  A sample with neither raises :class:`RewardError`.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from .base import NanPolicy, Reward, RewardError

__all__ = ["levenshtein", "extract_quoted", "text_match_score", "OCRReward"]

_QUOTES = [r'"([^"]+)"', r"“([^”]+)”", r"‘([^’]+)’", r"(?<![A-Za-z])'([^']+)'(?![A-Za-z])"]


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insert/delete/substitute, unit costs), O(|a||b|) time, O(|b|) memory."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def extract_quoted(prompt: str) -> str | None:
    """First quoted span in ``prompt`` (earliest position over the supported quote styles), or None."""
    best: tuple[int, str] | None = None
    for pat in _QUOTES:
        m = re.search(pat, prompt)
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), m.group(1))
    return None if best is None else best[1]


def _norm(s: str, ignore_case: bool, ignore_space: bool) -> str:
    if ignore_case:
        s = s.lower()
    if ignore_space:
        s = re.sub(r"\s+", "", s)
    return s


def text_match_score(pred: str, target: str, ignore_case: bool = True, ignore_space: bool = True) -> float:
    """``clip(1 - Lev(p, t) / max(|p|, |t|), 0, 1)`` on normalised strings; ``t`` must be non-empty."""
    p, t = _norm(pred, ignore_case, ignore_space), _norm(target, ignore_case, ignore_space)
    if not t:
        raise ValueError("empty OCR target")
    return float(min(1.0, max(0.0, 1.0 - levenshtein(p, t) / max(len(p), len(t)))))


def _reading_order(result: list) -> str:
    """Join rapidocr boxes ``[[pts], text, conf]`` by line (y-centre within half a box height) then x."""
    items = []
    for box, text, _conf in result:
        pts = np.asarray(box, dtype=np.float64)
        items.append((pts[:, 1].mean(), pts[:, 0].min(), pts[:, 1].max() - pts[:, 1].min(), text))
    items.sort(key=lambda t: t[0])
    lines: list[list[tuple]] = []
    for it in items:
        if lines and abs(it[0] - lines[-1][0][0]) <= 0.5 * max(it[2], lines[-1][0][2], 1.0):
            lines[-1].append(it)
        else:
            lines.append([it])
    return " ".join(" ".join(t[3] for t in sorted(line, key=lambda t: t[1])) for line in lines)


class OCRReward(Reward):
    """``r = clip(1 - Lev(ocr(x), target) / max(len), 0, 1)``; see module docstring for target lookup.

    ``engine_kwargs`` go to ``RapidOCR(...)`` on top of :attr:`DEFAULT_ENGINE_KWARGS`.  Recognised strings are
    not part of the output (not tensors); call :meth:`recognize` to inspect them.
    """

    name = "ocr"
    # rapidocr's default ("min" side 736) upsamples small images, e.g. 300x80 -> 2760x736, and detection then
    # takes seconds per image on a CPU; capping the longer side keeps generated images at native size.
    DEFAULT_ENGINE_KWARGS: dict[str, Any] = {"det_limit_type": "max", "det_limit_side_len": 960}

    def __init__(self, target_key: str = "text", ignore_case: bool = True, ignore_space: bool = True,
                 engine=None, engine_kwargs: Mapping[str, Any] | None = None, name: str | None = None,
                 nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        self.target_key = target_key
        self.ignore_case = ignore_case
        self.ignore_space = ignore_space
        if engine is None:
            try:
                from rapidocr_onnxruntime import RapidOCR
            except ImportError as e:  # pragma: no cover - depends on the environment
                raise ImportError("the OCR reward needs `pip install rapidocr-onnxruntime` "
                                  "(extra: mmgrpo[ocr])") from e
            engine = RapidOCR(**{**self.DEFAULT_ENGINE_KWARGS, **dict(engine_kwargs or {})})
        self.engine = engine

    def recognize(self, image: np.ndarray) -> str:
        """All text in one uint8 HWC RGB image, in reading order ('' if none)."""
        # rapidocr's ndarray path expects OpenCV's BGR order.
        result, _ = self.engine(np.ascontiguousarray(image[..., ::-1]))
        return _reading_order(result) if result else ""

    def target(self, prompt: str, meta: Mapping[str, Any], index: int) -> str:
        t = meta.get(self.target_key)
        if t is None:
            t = extract_quoted(prompt)
        if t is None or not _norm(str(t), self.ignore_case, self.ignore_space):
            raise RewardError(f"reward {self.name!r}: sample {index} has no target text (no metadata "
                              f"{self.target_key!r} and no quoted span in prompt {prompt!r})", self.name, [index])
        return str(t)

    def score(self, images, prompts, metadata, **kwargs: Any):
        targets = [self.target(p, m, i) for i, (p, m) in enumerate(zip(prompts, metadata))]
        return np.array([text_match_score(self.recognize(im), t, self.ignore_case, self.ignore_space)
                         for im, t in zip(images, targets)], dtype=np.float64)
