"""A pairwise judge trained by our own VLM front-end (issue #40 item 4), on both sides of the loop.

1. **Training the judge** (VLM front-end, ``mmgrpo train``): :class:`PairVerdictReward` is the verifiable reward of
   the pairwise judge data (:mod:`mmgrpo.synthetic.judge_pairs`): ``1`` when the completion's UnifiedReward-Think
   verdict (:func:`~flow_grpo.rewards.unified_reward.parse_think_pair`) names the image the renderer drew for the
   caption (the sample's ``answer``, ``"1"`` or ``"2"``), else ``0``; an unreadable verdict is ``0`` and is counted
   (``failed``). It is an open reward by import path::

       reward.weights='{flow_grpo.rewards.trained_judge:PairVerdictReward: 1.0}'

2. **Using the judge** (flow front-end): :class:`TrainedPairJudge` is a pairwise scorer for the trainer's Pref-GRPO
   mode (``reward.mode=win_rate``, ``reward.pairwise_scorer=flow_grpo.rewards.trained_judge:TrainedPairJudge``):
   each pair of a group's images is composed side by side (:func:`mmgrpo.synthetic.judge_pairs.compose`) and put
   to the judge with **the chat it was trained on** (the project's no-think system turn, the composite image, the
   :func:`~mmgrpo.synthetic.judge_pairs.query` of the caption), greedy, batched
   (:class:`~flow_grpo.rewards.unified_reward.GenerativeJudge`); the verdict and its failures are read as by
   :class:`~flow_grpo.rewards.unified_reward.UnifiedRewardThinkPairwise` (a failure is a tie, counted).

Why pairwise within the group, not pointwise against a reference: the judge was trained to compare two images,
and the win rate over the group is what GRPO needs (a ranking within the group). A pointwise score "generated image
vs the renderer's correct image" would put the renderer (the verifier's own ground truth) into the training reward,
and a judge that always prefers the reference gives every sample the same score.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import numpy as np

from .unified_reward import UnifiedRewardThinkPairwise, parse_think_pair

__all__ = ["PairVerdictReward", "TrainedPairJudge", "judge_messages", "read_judge_config", "JUDGE_CONFIG"]


#: the file in a judge folder that names its chat convention (``{"query_position": "before" | "after"}``)
JUDGE_CONFIG = "judge_config.json"


def judge_messages(caption: str, query_position: str = "after") -> list[dict]:
    """The judge's chat for ``caption``: exactly what ``mmgrpo train`` renders for a judge-pair sample (the
    project template, ``prompt_mode=no_think``, ``data.query_position=query_position``)."""
    from mmgrpo.synthetic.judge_pairs import query
    from mmgrpo.vlm.data.prompts import build_messages

    return build_messages({"id": "judge", "task": "qa", "image": "pair.png", "query": query(caption),
                           "answer": "1", "meta": {"problem_type": "free-form"}}, mode="no_think",
                          query_position=query_position)


def read_judge_config(path: str | None) -> dict:
    """``path/judge_config.json`` (written next to a judge trained by ``scripts/judge_loop.py``), or ``{}``."""
    import json
    import os

    if not path or not os.path.isfile(os.path.join(path, JUDGE_CONFIG)):
        return {}
    with open(os.path.join(path, JUDGE_CONFIG)) as f:
        cfg = json.load(f)
    bad = set(cfg) - {"query_position", "max_new_tokens"}
    if bad:
        raise ValueError(f"{os.path.join(path, JUDGE_CONFIG)}: unknown keys {sorted(bad)} "
                         "(known: query_position, max_new_tokens)")
    return cfg


#: the whole completion of a well-formed verdict: an optional reasoning block, then exactly one answer block
_STRICT = re.compile(r"\s*(?:<think>.*?</think>\s*)?<answer>\s*Image ([12]) is better\s*</answer>\s*", re.S)


class PairVerdictReward:
    """VLM open reward: ``1[verdict == sample answer]`` (module docstring); diagnostics ``failed`` (1 = the verdict
    could not be read) and ``picks_1`` (1 = the verdict names Image 1: a position bias shows here).

    ``strict=True`` (default) also fails a completion that is not exactly ``[<think>...</think>]<answer>Image k is
    better</answer>`` (whitespace aside): failure ``not_strict``. Why: a tiny judge under GRPO learned to repeat
    the answer block up to the token cap, which :func:`parse_think_pair` accepts (one winner named throughout).
    The UnifiedReward-Think release's GRPO rewards accept that too (its accuracy reward reads the first
    ``<answer>`` block only, its format reward ``re.match`` es ``<think>.*?</think>\\s*<answer>.*?</answer>``
    from the start and ignores what follows); this is the deviation, and the release's ``<think>`` is optional
    here (the judge may answer at once)."""

    def __init__(self, strict: bool = True):
        self.strict = bool(strict)
        self.stats: dict[str, int] = {}

    def __call__(self, completions: Sequence[str], samples: Sequence[Mapping[str, Any]]) -> dict:
        score, failed, picks_1 = [], [], []
        for text, s in zip(completions, samples):
            want = str(s.get("answer", "")).strip()
            if want not in ("1", "2"):
                raise ValueError(f"sample {s.get('id')!r}: a judge-pair answer must be '1' or '2', got {want!r}")
            v = parse_think_pair(text)
            winner, reason = v.winner, v.failure or "ok"
            if winner is not None and self.strict and not _STRICT.fullmatch(text):
                winner, reason = None, "not_strict"
            self.stats[reason] = self.stats.get(reason, 0) + 1
            score.append(float(winner is not None and winner == int(want)))
            failed.append(float(winner is None))
            picks_1.append(float(winner == 1))
        return {"score": score, "failed": failed, "picks_1": picks_1}


class TrainedPairJudge(UnifiedRewardThinkPairwise):
    """Pairwise scorer of a judge folder trained on :mod:`mmgrpo.synthetic.judge_pairs` (module docstring).

    Args: ``path`` (or ``model=`` + ``processor=``), ``batch_size``, ``max_new_tokens`` (the verdict is ~12 tokens),
    ``device`` / ``dtype`` / ``family`` (:class:`~flow_grpo.rewards.unified_reward.GenerativeJudge`),
    ``query_position`` (where the caption sits in the chat, as the judge was trained). ``max_new_tokens`` and
    ``query_position`` default to the folder's ``judge_config.json``, else 24 and ``"after"``."""

    def __init__(self, path: str | None = None, *, model=None, processor=None, family: str = "auto",
                 dtype: Any = "float32", device: str = "cpu", batch_size: int = 32, max_new_tokens: int | None = None,
                 query_position: str | None = None):
        cfg = read_judge_config(path)
        super().__init__(path, model=model, processor=processor, template="{prompt}", family=family, dtype=dtype,
                         device=device, batch_size=batch_size,
                         max_new_tokens=int(max_new_tokens or cfg.get("max_new_tokens", 24)))
        self.query_position = query_position or cfg.get("query_position", "after")

    def messages(self, prompt: str) -> list[dict]:
        return judge_messages(prompt, self.query_position)

    def __call__(self, images_a, images_b, prompts, metadata=None):
        from PIL import Image

        from mmgrpo.synthetic.judge_pairs import compose

        a, b = np.asarray(images_a), np.asarray(images_b)
        if a.dtype != np.uint8:
            raise ValueError(f"TrainedPairJudge takes uint8 (N, H, W, 3) images, got {a.dtype} {a.shape}")
        pairs = [[Image.fromarray(compose(x, y))] for x, y in zip(a, b)]
        texts, truncated = self.judge.generate([self.messages(p) for p in prompts], pairs)
        self.last_texts = texts
        return self.prefs_from_texts(texts, truncated)
