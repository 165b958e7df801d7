"""``mini_geneval`` reward: the programmatic verifier of the synthetic Mini-GenEval benchmark.

Outputs ``{name: strict or partial, name + "/strict": 1[correct], name + "/partial": score}`` where ``correct``
and ``score`` are :func:`mmgrpo.synthetic.t2i.verify`'s (formulas there).  Training on ``mode="strict"``
mirrors Flow-GRPO's GenEval setup (``only_strict=True``); ``mode="partial"`` gives a denser signal.

Metadata per sample: the benchmark's dict (``{"include": [...], ...}``); without it the prompt is looked up in
the grammar (:func:`mmgrpo.synthetic.t2i.parse_prompt`), and a prompt outside the grammar raises
:class:`~flow_grpo.rewards.base.RewardError` naming the sample.

The benchmark is :mod:`mmgrpo.synthetic.t2i` (part of the installed package, so this reward works from a
wheel; ``data/synthetic_t2i.py`` in a source checkout is its command line).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Literal

import numpy as np

from .base import NanPolicy, Reward, RewardError

__all__ = ["load_synthetic_t2i", "MiniGenEvalReward"]


def load_synthetic_t2i() -> ModuleType:
    """The Mini-GenEval benchmark module, :mod:`mmgrpo.synthetic.t2i` (kept for old callers)."""
    from mmgrpo.synthetic import t2i as synthetic_t2i

    return synthetic_t2i


class MiniGenEvalReward(Reward):
    """Verifiable Mini-GenEval reward (strict accuracy or partial score); see the module docstring."""

    name = "mini_geneval"

    def __init__(self, mode: Literal["strict", "partial"] = "strict", max_color_dist: float = 80.0,
                 rel_margin: float = 0.05, name: str | None = None, nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        if mode not in ("strict", "partial"):
            raise ValueError(f"mode must be 'strict' or 'partial', got {mode!r}")
        self.mode = mode
        self.max_color_dist = float(max_color_dist)
        self.rel_margin = float(rel_margin)
        self.bench = load_synthetic_t2i()

    def score(self, images, prompts, metadata, **kwargs: Any):
        n = images.shape[0]
        strict = np.zeros(n)
        partial = np.zeros(n)
        for i in range(n):
            md = metadata[i] if "include" in metadata[i] else self.bench.parse_prompt(prompts[i])
            if md is None:
                raise RewardError(f"reward {self.name!r}: sample {i} has no 'include' metadata and its prompt "
                                  f"{prompts[i]!r} is not a Mini-GenEval prompt", self.name, [i])
            try:
                res = self.bench.verify(images[i], md, max_color_dist=self.max_color_dist,
                                        rel_margin=self.rel_margin)
            except ValueError as e:
                raise RewardError(f"reward {self.name!r}: sample {i}: {e}", self.name, [i]) from e
            strict[i] = float(res["correct"])
            partial[i] = res["score"]
        return {self.name: strict if self.mode == "strict" else partial,
                f"{self.name}/strict": strict, f"{self.name}/partial": partial}
