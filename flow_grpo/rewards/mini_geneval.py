"""``mini_geneval`` reward: the programmatic verifier of the synthetic Mini-GenEval benchmark.

Outputs ``{name: strict or partial, name + "/strict": 1[correct], name + "/partial": score}`` where ``correct``
and ``score`` are :func:`data.synthetic_t2i.verify`'s (formulas there).  Training on ``mode="strict"`` mirrors
Flow-GRPO's GenEval setup (``only_strict=True``); ``mode="partial"`` gives a denser signal.

Metadata per sample: the benchmark's dict (``{"include": [...], ...}``); without it the prompt is looked up in
the grammar (:func:`data.synthetic_t2i.parse_prompt`), and a prompt outside the grammar raises
:class:`~flow_grpo.rewards.base.RewardError` naming the sample.

The benchmark lives in the repository's top-level ``data/`` folder (not an installed package); it is imported as
``data.synthetic_t2i`` when importable, otherwise loaded from ``<repo>/data/synthetic_t2i.py`` next to this
package (editable installs / source checkouts).
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import numpy as np

from .base import NanPolicy, Reward, RewardError

__all__ = ["load_synthetic_t2i", "MiniGenEvalReward"]

_MODNAME = "data.synthetic_t2i"


def load_synthetic_t2i() -> ModuleType:
    """Import ``data/synthetic_t2i.py`` (see module docstring for the lookup order)."""
    if _MODNAME in sys.modules:
        return sys.modules[_MODNAME]
    try:
        mod = importlib.import_module(_MODNAME)
        if hasattr(mod, "verify"):
            return mod
    except ImportError:
        pass
    path = Path(__file__).resolve().parents[2] / "data" / "synthetic_t2i.py"
    if not path.is_file():
        raise ImportError(f"Mini-GenEval module not found: neither 'data.synthetic_t2i' is importable nor {path} "
                          "exists (run from a source checkout of the repository)")
    spec = importlib.util.spec_from_file_location("mmgrpo_data_synthetic_t2i", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


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
