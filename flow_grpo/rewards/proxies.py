"""A cheap, *hackable* proxy of the Mini-GenEval verifier (:mod:`flow_grpo.rewards.mini_geneval`), a training reward
of the reward-hacking benchmark (``scripts/hacking_demo.py``, where the verifier is the held-out truth; its main
proxy is ``brightness`` of :mod:`flow_grpo.rewards.toy`, which a blank canvas maximises):

* ``blob_count``: ``max(0, 1 - |n - k| / k)``, ``n`` the palette-coloured blobs the verifier's segmentation finds
  (:func:`mmgrpo.synthetic.t2i.segment_objects`, any colour and shape), ``k`` the number of objects the prompt
  asks for: the verifier's count credit without shape or colour, a second proxy hacked differently (any blobs).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .base import NanPolicy, Reward, RewardError

__all__ = ["BlobCount"]


def _meta(bench, prompt: str, md: dict, name: str, i: int) -> dict:
    m = md if "include" in md else bench.parse_prompt(prompt)
    if m is None:
        raise RewardError(f"reward {name!r}: sample {i} has no 'include' metadata and its prompt {prompt!r} is not "
                          f"a Mini-GenEval prompt", name, [i])
    return m


class BlobCount(Reward):
    name = "blob_count"

    def __init__(self, max_color_dist: float = 80.0, name: str | None = None, nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        from mmgrpo.synthetic import t2i

        self.bench, self.d = t2i, float(max_color_dist)

    def score(self, images, prompts, metadata, **kwargs: Any):
        out = np.zeros(images.shape[0])
        for i in range(images.shape[0]):
            m = _meta(self.bench, prompts[i], metadata[i], self.name, i)
            k = sum(int(e.get("count", 1)) for e in m["include"])
            n = len(self.bench.segment_objects(images[i], self.d)[0])
            out[i] = max(0.0, 1.0 - abs(n - k) / k)
        return out
