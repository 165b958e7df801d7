"""UnifiedReward judges in their released text formats: generated reasoning, then a parsed verdict.

Unlike :mod:`flow_grpo.rewards.vlm_judge` (one forward pass, one token's probability), these judges *generate*
their answer with the released prompt (:mod:`flow_grpo.rewards.unified_reward_templates`) and parse it.

Pairwise (UnifiedReward-Think, image generation)
------------------------------------------------
Chat: ``[image 1, image 2, text]`` (one user turn, the images first, as the release's inference script), text =
the template with ``{prompt}`` filled.  Released output format (the templates' own example)::

    <think>
    1. Semantic consistency: Image 1 (9/10) - ...; Image 2 (7/10) - ...
    ...
    Total score:
    Image 1: 9+8+8+6=31
    Image 2: 7+8+5+8=28
    </think>
    <answer>Image 1 is better</answer>

:func:`parse_think_pair` reads the ``<answer>`` blocks: every ``Image k is better`` (any case, any spacing) they
contain names a winner; exactly one distinct winner is the verdict, ``P(a > b) = 1`` (image a is "Image 1") or
``0``             .  Anything else is a *failure* with a reason, never an exception:

================  =========================================================================================
``not_text``      the output is not a string
``empty``         blank output
``truncated``     an ``<answer>`` (or ``<think>``) opened and never closed: generation hit ``max_new_tokens``
``no_answer``     no ``<answer>...</answer>`` block
``ambiguous``     the answer blocks name both images (e.g. "Image 1 is better ... Image 2 is better")
``unrecognised``  an answer block that names no winner (e.g. "<answer>tie</answer>")
================  =========================================================================================

A failed judgement counts as a tie, ``P(a > b) = 0.5`` -- the Pref-GRPO release's rule for an unreadable
verdict -- and is *counted*: the scorer returns its failure mask, so the win-rate reward adds
``<name>/judge_failures``  (per sample: failed judgements among its pairs), and the scorer keeps running totals in
``scorer.stats`` (``judged``, ``failed``, ``failed/<reason>``).  The ``<think>`` block's per-dimension scores
``Image k (s/10)`` and ``Total score`` lines are parsed as well (diagnostics; never used for the verdict).

Pointwise (the UnifiedReward family's pointwise formats)
--------------------------------------------------------
The Think release has no pointwise image-generation prompt; pointwise judging uses the family's released
formats, chat ``[image, text]``:

* ``template="final_score"`` (UnifiedReward-qwen 1.0): output ``... Final Score: s`` with ``s`` in [1, 5];
  ``r = (s - 1) / 4``.
* ``template="acs"`` (UnifiedReward-2.0-qwen): output ``Alignment Score (1-5): a`` / ``Coherence Score (1-5): c``
  / ``Style Score (1-5): t``; ``r = sum_d w_d (s_d - 1) / 4 / sum_d w_d`` (``weights=``; Pref-GRPO uses
  Alignment and Style only: ``weights={"Alignment": 1, "Coherence": 0, "Style": 1}``), per dimension logged as
  ``<name>/alignment`` etc. (raw 1..5).

A pointwise failure (no score, a score outside [1, 5], two different scores for one key) gives ``valid = False``
for that sample (the trainer drops it from its group) and ``<name>/parse_failed = 1``; its score is the neutral
``0.5`` so no NaN travels.

Decoding
--------
Greedy (deterministic), batched: ``batch_size`` prompts per ``model.generate`` call, left padded, the same
collation and decoding as the VLM trainer's evaluation (:func:`mmgrpo.vlm.models.rollout.greedy_generate`: the
checkpoint's ``generation_config`` sampling settings are not merged in; vision tokens are suppressed).
``max_new_tokens`` bounds the reasoning (the release uses 512 for Qwen2.5-VL); an output cut there is a
``truncated`` failure.

Usage::

    build_reward("unified_reward_point", path="/models/UnifiedReward-qwen-7b", template="final_score")
    # Pref-GRPO win rate in the trainer: reward.mode=win_rate with
    #   reward.pairwise_scorer=flow_grpo.rewards.unified_reward:UnifiedRewardThinkPairwise
    #   reward.kwargs.win_rate={path: /models/UnifiedReward-Think-qwen-7b, template: think_qwen25}
    build_reward("unified_reward_think_pairwise", path="/models/UnifiedReward-Think-qwen-7b")  # same, standalone
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .base import NanPolicy, PairwisePreferenceReward, Reward
from .unified_reward_templates import TEMPLATES

__all__ = [
    "PairVerdict", "PointVerdict", "parse_think_pair", "parse_final_score", "parse_acs", "GenerativeJudge",
    "UnifiedRewardPointwise", "UnifiedRewardThinkPairwise", "unified_reward_think_pairwise", "ACS_DIMS",
]

ACS_DIMS = ("Alignment", "Coherence", "Style")
_NUM = r"(\d+(?:\.\d+)?)"
_WINNER = re.compile(r"\b(?:image|video)\s*([12])\s+is\s+better\b", re.I)
_DIM_SCORE = re.compile(r"\bimage\s*([12])\s*\(\s*" + _NUM + r"\s*/\s*10\s*\)", re.I)
_TOTAL = re.compile(r"\bimage\s*([12])\s*:\s*([\d.\s+]+)=\s*" + _NUM, re.I)  # greedy: linear on long runs
_FINAL = re.compile(r"final\s+score\s*:?\s*\**\s*" + _NUM, re.I)
_ACS = re.compile(r"\b(alignment|coherence|style)\s+score\s*\(\s*1\s*-\s*5\s*\)\s*:\s*\**\s*" + _NUM, re.I)


# ----------------------------------------------------------------------------------------------------------
# parsers (pure functions of the text; never raise)
# ----------------------------------------------------------------------------------------------------------
def _answer_blocks(text: str) -> list[str]:
    """The ``<answer>...</answer>`` contents in order (tags in any case); linear in the text's length."""
    low, blocks, pos = text.lower(), [], 0
    while True:
        start = low.find("<answer>", pos)
        end = low.find("</answer>", start + 8) if start >= 0 else -1
        if end < 0:
            return blocks
        blocks.append(text[start + 8:end])
        pos = end + 9


@dataclass(frozen=True)
class PairVerdict:
    """A parsed pairwise output. ``winner`` is 1, 2 or None (then ``failure`` names why)."""

    winner: int | None
    failure: str | None = None
    answer: str | None = None
    dim_scores: Mapping[int, tuple[float, ...]] = field(default_factory=dict)  # <think> "Image k (s/10)" in order
    totals: Mapping[int, float] = field(default_factory=dict)  # <think> "Total score" lines

    @property
    def pref(self) -> float:
        """``P(Image 1 > Image 2)``: 1, 0, or the tie 0.5 of a failed judgement."""
        return 0.5 if self.winner is None else (1.0 if self.winner == 1 else 0.0)


def _not_text_reason(text: Any) -> str | None:
    if not isinstance(text, str):
        return "not_text"
    return "empty" if not text.strip() else None


def parse_think_pair(text: Any) -> PairVerdict:
    """Parse a UnifiedReward-Think pairwise output (module docstring); a failure never raises."""
    bad = _not_text_reason(text)
    if bad:
        return PairVerdict(None, bad)
    think = text.split("</think>")[0] if "</think>" in text else text.split("<answer>")[0]
    scores: dict[int, list[float]] = {1: [], 2: []}
    for k, s in _DIM_SCORE.findall(think):
        scores[int(k)].append(float(s))
    totals = {int(k): float(t) for k, _, t in _TOTAL.findall(think)}
    extra = dict(dim_scores={k: tuple(v) for k, v in scores.items() if v}, totals=totals)
    blocks = _answer_blocks(text)
    if not blocks:
        opened = re.search(r"<answer>", text, re.I) or (re.search(r"<think>", text, re.I)
                                                       and not re.search(r"</think>", text, re.I))
        return PairVerdict(None, "truncated" if opened else "no_answer", **extra)
    answer = " | ".join(b.strip() for b in blocks)
    winners = {int(k) for b in blocks for k in _WINNER.findall(b)}
    if len(winners) == 2:
        return PairVerdict(None, "ambiguous", answer, **extra)
    if not winners:
        return PairVerdict(None, "unrecognised", answer, **extra)
    return PairVerdict(winners.pop(), None, answer, **extra)


@dataclass(frozen=True)
class PointVerdict:
    """A parsed pointwise output: ``scores`` (raw, 1..5) per key, or ``failure``."""

    scores: Mapping[str, float]
    failure: str | None = None


def _one_per_key(pairs: Sequence[tuple[str, str]], keys: Sequence[str]) -> PointVerdict:
    got: dict[str, set[float]] = {}
    for k, s in pairs:
        got.setdefault(k, set()).add(float(s))
    missing = [k for k in keys if k not in got]
    if missing:
        return PointVerdict({}, "no_score")
    if any(len(v) > 1 for v in got.values()):
        return PointVerdict({}, "ambiguous")
    scores = {k: got[k].pop() for k in keys}
    if not all(1.0 <= v <= 5.0 for v in scores.values()):
        return PointVerdict({}, "out_of_range")
    return PointVerdict(scores)


def parse_final_score(text: Any) -> PointVerdict:
    """UnifiedReward-qwen pointwise: ``Final Score: s`` (s in [1, 5]) -> ``{"Final": s}``."""
    bad = _not_text_reason(text)
    if bad:
        return PointVerdict({}, bad)
    return _one_per_key([("Final", s) for s in _FINAL.findall(text)], ("Final",))


def parse_acs(text: Any) -> PointVerdict:
    """UnifiedReward-2.0 pointwise: ``{Alignment|Coherence|Style} Score (1-5): s`` -> the three scores."""
    bad = _not_text_reason(text)
    if bad:
        return PointVerdict({}, bad)
    return _one_per_key([(k.capitalize(), s) for k, s in _ACS.findall(text)], ACS_DIMS)


_POINT_PARSERS = {"final_score": (parse_final_score, ("Final",)), "acs": (parse_acs, ACS_DIMS)}


# ----------------------------------------------------------------------------------------------------------
# generation
# ----------------------------------------------------------------------------------------------------------
class GenerativeJudge:
    """A Qwen-VL judge folder (or ``model=`` + ``processor=``) that greedily generates answers in batches."""

    def __init__(self, path: str | None = None, *, model=None, processor=None, family: str = "auto",
                 dtype: Any = "float32", device: str = "cpu", batch_size: int = 8, max_new_tokens: int = 512,
                 attn_implementation: str | None = "sdpa"):
        from .vlm_judge import VLMJudge

        if int(max_new_tokens) < 1 or int(batch_size) < 1:
            raise ValueError(f"max_new_tokens and batch_size must be >= 1, got {max_new_tokens}, {batch_size}")
        base = VLMJudge(path, model=model, processor=processor, family=family, dtype=dtype, device=device,
                        batch_size=batch_size, attn_implementation=attn_implementation)
        self.model, self.processor, self.adapter = base.model, base.processor, base.adapter
        self.device, self.batch_size, self.max_new_tokens = device, int(batch_size), int(max_new_tokens)
        self.generate_calls = 0  # model.generate calls so far (one per batch)

    def generate(self, conversations: Sequence[list[dict]], images: Sequence[Sequence[Any]]
                 ) -> tuple[list[str], list[bool]]:
        """Greedy answers (texts, truncated flags) for the chats, ``batch_size`` per ``generate`` call."""
        texts: list[str] = []
        truncated: list[bool] = []
        for s in range(0, len(conversations), self.batch_size):
            t, tr = self.generate_batch(conversations[s:s + self.batch_size], images[s:s + self.batch_size])
            self.generate_calls += 1
            texts.extend(t)
            truncated.extend(bool(x) for x in tr)
        return texts, truncated

    def generate_batch(self, conversations: Sequence[list[dict]], images: Sequence[Sequence[Any]]
                       ) -> tuple[list[str], list[bool]]:
        """One left-padded batch through ``model.generate`` (greedy; vision tokens suppressed)."""
        from types import SimpleNamespace

        from mmgrpo.vlm.models.adapters import vision_token_ids
        from mmgrpo.vlm.models.inputs import build_prompt_item
        from mmgrpo.vlm.models.rollout import greedy_generate

        tok = self.processor.tokenizer
        policy = SimpleNamespace(model=self.model, tokenizer=tok, suppress_token_ids=vision_token_ids(tok))
        items = [build_prompt_item(self.processor, self.adapter, msgs, images=list(ims))
                 for msgs, ims in zip(conversations, images)]
        texts, _, truncated = greedy_generate(policy, items, self.max_new_tokens)
        return texts, truncated


def _pil(images: np.ndarray, size: int | None):
    from .vlm_judge import _pil as pil

    return pil(images, size)


def _fill(template: str, prompt: str) -> str:
    return template.replace("{prompt}", prompt)


def _template(name_or_text: str, kind: str) -> str:
    if name_or_text in TEMPLATES:
        text, k = TEMPLATES[name_or_text]
        if k != kind:
            raise ValueError(f"template {name_or_text!r} is a {k}wise template; this judge needs a {kind}wise one "
                             f"({sorted(n for n, (_, kk) in TEMPLATES.items() if kk == kind)})")
        return text
    if "{prompt}" not in name_or_text:
        raise ValueError(f"template must be one of {sorted(TEMPLATES)} or a text with a '{{prompt}}' field")
    return name_or_text


# ----------------------------------------------------------------------------------------------------------
# rewards
# ----------------------------------------------------------------------------------------------------------
class UnifiedRewardPointwise(Reward):
    """Pointwise UnifiedReward judge (module docstring): generated answer -> parsed 1..5 score(s) -> [0, 1].

    Args:
        path / model / processor / family / dtype / device / batch_size / max_new_tokens: :class:`GenerativeJudge`.
        template: ``"final_score"`` (default) or ``"acs"``; the parser follows the template name.
        weights: ``acs`` only, ``{Alignment, Coherence, Style: w}`` (default all 1; Pref-GRPO: Coherence 0).
        image_size: resize to a square first (None keeps the size).
        name (default ``"unified_reward"``), nan_policy.
    Outputs: ``name`` in [0, 1] (0.5 where the parse failed), ``name/parse_failed`` (0/1), ``valid`` (False where
    the parse failed), and for ``acs`` ``name/<dim>`` (raw 1..5; the neutral 3 where the parse failed).
    """

    name = "unified_reward"

    def __init__(self, path: str | None = None, *, model=None, processor=None, template: str = "final_score",
                 weights: Mapping[str, float] | None = None, image_size: int | None = None, family: str = "auto",
                 dtype: Any = "float32", device: str = "cpu", batch_size: int = 8, max_new_tokens: int = 512,
                 name: str | None = None, nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        if template not in _POINT_PARSERS:
            raise ValueError(f"pointwise template must be one of {sorted(_POINT_PARSERS)}, got {template!r}")
        self.parse, self.dims = _POINT_PARSERS[template]
        w = {d: 1.0 for d in self.dims}
        if weights is not None:
            unknown = set(weights) - set(self.dims)
            if unknown:
                raise ValueError(f"weights for unknown dimensions {sorted(unknown)}; template {template!r} has "
                                 f"{list(self.dims)}")
            w.update({k: float(v) for k, v in weights.items()})
        if any(v < 0 or not math.isfinite(v) for v in w.values()) or sum(w.values()) <= 0:
            raise ValueError(f"weights must be finite, >= 0, with a positive sum; got {w}")
        self.weights = w
        self.template_name, self.template = template, _template(template, "point")
        self.image_size = image_size
        self.judge = GenerativeJudge(path, model=model, processor=processor, family=family, dtype=dtype,
                                     device=device, batch_size=batch_size, max_new_tokens=max_new_tokens)
        self.stats: Counter = Counter()
        self.last_texts: list[str] = []

    def messages(self, prompt: str) -> list[dict]:
        text = _fill(self.template, prompt)
        return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]

    def score(self, images, prompts, metadata, **kwargs: Any):
        ims = _pil(images, self.image_size)
        texts, truncated = self.judge.generate([self.messages(p) for p in prompts], [[im] for im in ims])
        self.last_texts = texts
        return self.scores_from_texts(texts, truncated)

    def scores_from_texts(self, texts: Sequence[Any], truncated: Sequence[bool] | None = None) -> dict:
        """Parsed texts -> outputs (module docstring); ``truncated`` marks outputs cut at ``max_new_tokens``."""
        n = len(texts)
        r = np.full(n, 0.5)
        failed = np.zeros(n)
        dims = {d: np.full(n, 3.0) for d in self.dims}
        wsum = sum(self.weights.values())
        for i, t in enumerate(texts):
            v = self.parse(t)
            self.stats["judged"] += 1
            if v.failure is not None:
                reason = "truncated" if truncated is not None and truncated[i] else v.failure
                self.stats["failed"] += 1
                self.stats[f"failed/{reason}"] += 1
                failed[i] = 1.0
                continue
            for d in self.dims:
                dims[d][i] = v.scores[d]
            r[i] = sum(self.weights[d] * (v.scores[d] - 1.0) / 4.0 for d in self.dims) / wsum
        out = {self.name: r, f"{self.name}/parse_failed": failed, "valid": failed == 0}
        if len(self.dims) > 1:
            out.update({f"{self.name}/{d.lower()}": dims[d] for d in self.dims})
        return out


class UnifiedRewardThinkPairwise:
    """UnifiedReward-Think pairwise scorer (:class:`~flow_grpo.rewards.base.PairwiseScorer`): ``a`` is shown as
    Image 1, ``b`` as Image 2; returns ``{"pref": P(a > b) in {0, 0.5, 1}, "failed": bool mask}`` (module
    docstring).  For :class:`~flow_grpo.rewards.base.PairwisePreferenceReward` (``symmetric=True`` judges both
    orders and averages, cancelling a position bias) and the trainer's ``reward.pairwise_scorer``.

    Args: path / model / processor / family / dtype / device / batch_size / max_new_tokens
    (:class:`GenerativeJudge`), ``template`` (``"think_qwen25"`` default, ``"think_qwen3"``, or a text with
    ``{prompt}``), ``image_size``."""

    accepts_video = False

    def __init__(self, path: str | None = None, *, model=None, processor=None, template: str = "think_qwen25",
                 image_size: int | None = None, family: str = "auto", dtype: Any = "float32", device: str = "cpu",
                 batch_size: int = 8, max_new_tokens: int = 512):
        self.template = _template(template, "pair")
        self.image_size = image_size
        self.judge = GenerativeJudge(path, model=model, processor=processor, family=family, dtype=dtype,
                                     device=device, batch_size=batch_size, max_new_tokens=max_new_tokens)
        self.stats: Counter = Counter()
        self.last_texts: list[str] = []

    def messages(self, prompt: str) -> list[dict]:
        return [{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                             {"type": "text", "text": _fill(self.template, prompt)}]}]

    def __call__(self, images_a, images_b, prompts, metadata=None):
        a, b = _pil(np.asarray(images_a), self.image_size), _pil(np.asarray(images_b), self.image_size)
        texts, truncated = self.judge.generate([self.messages(p) for p in prompts], list(zip(a, b)))
        self.last_texts = texts
        return self.prefs_from_texts(texts, truncated)

    def prefs_from_texts(self, texts: Sequence[Any], truncated: Sequence[bool] | None = None) -> dict:
        pref = np.empty(len(texts))
        failed = np.zeros(len(texts), dtype=bool)
        for i, t in enumerate(texts):
            v = parse_think_pair(t)
            pref[i] = v.pref
            self.stats["judged"] += 1
            if v.failure is not None:
                reason = "truncated" if truncated is not None and truncated[i] else v.failure
                failed[i] = True
                self.stats["failed"] += 1
                self.stats[f"failed/{reason}"] += 1
        return {"pref": pref, "failed": failed}


def unified_reward_think_pairwise(path: str | None = None, *, symmetric: bool = True, hard: bool = True,
                                  name: str = "unified_reward_think_win_rate", nan_policy: NanPolicy = "raise",
                                  **judge_kwargs: Any) -> PairwisePreferenceReward:
    """Pref-GRPO win rate with the UnifiedReward-Think pairwise judge: ``r_i = 1/(G-1) sum_{j in group} w_ij``
    (:class:`~flow_grpo.rewards.base.PairwisePreferenceReward`), plus ``<name>/judge_failures``."""
    return PairwisePreferenceReward(UnifiedRewardThinkPairwise(path, **judge_kwargs), name=name,
                                    symmetric=symmetric, hard=hard, nan_policy=nan_policy)
