"""The ``remote`` open reward: a text reward (the model-based judge) served by :mod:`mmgrpo.vlm.rewards.server`.

    mmgrpo train ... 'reward.weights={remote: 1.0}' \
        'reward.kwargs={remote: {url: "http://127.0.0.1:18090/score", timeout: 120, retries: 2}}'

Each call POSTs the step's completions and samples (``fields``: which sample fields travel; default all) and returns
the server reward's scores as ``{"score": N floats, "<key>": N floats}`` (diagnostics such as ``parse_failed``
logged as ``reward/remote/<key>``). The HTTP client is the flow front-end's (:class:`mmgrpo.utils.score_service.
ScoreClient`): a wall-clock ``timeout`` per attempt, ``retries`` with backoff after a connection error, timeout,
429 or 5xx, a reply cap, replies validated before use, ``MMGRPO_REWARD_TOKEN`` signing, counted failures
(``stats``). A call that still fails raises, and the trainer's own fault handling applies (``reward.retries`` /
``timeout`` / ``on_failure``). ``batch_size`` > 0 splits a call into requests of that many rows.
"""
from __future__ import annotations

import json
import math
from typing import Any, Mapping, Optional, Sequence

from mmgrpo.utils.score_service import ScoreClient

__all__ = ["RemoteTextReward", "RemoteRewardError"]

TOKEN_ENV = "MMGRPO_REWARD_TOKEN"


class RemoteRewardError(RuntimeError):
    """A remote reward call that gave no usable reply (after the client's retries)."""


class RemoteTextReward:
    """``reward(completions, samples) -> {"score": [...], ...}`` from a text-reward server (module doc)."""

    def __init__(self, url: str, *, name: str = "remote", timeout: float = 120.0, retries: int = 2,
                 backoff: float = 0.5, max_reply_mb: float = 16.0, batch_size: int = 0,
                 fields: Optional[Sequence[str]] = None):
        where = "reward.kwargs.remote"
        if int(batch_size) < 0:
            raise ValueError(f"{where}.batch_size must be >= 0 (0: one request per call), got {batch_size!r}")
        if fields is not None and (isinstance(fields, str) or not all(isinstance(f, str) for f in fields)):
            raise ValueError(f"{where}.fields must be a list of sample field names, got {fields!r}")
        try:
            self.client = ScoreClient(url, name, timeout=timeout, retries=retries, backoff=backoff,
                                      max_reply_mb=max_reply_mb, token_env=TOKEN_ENV, what="reward", unit="rows",
                                      error=RemoteRewardError)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from e
        self.name = str(name)
        self.batch_size = int(batch_size)
        self.fields = None if fields is None else tuple(fields)

    @property
    def stats(self):
        return self.client.stats

    def _sample(self, i: int, s: Mapping[str, Any]) -> dict:
        out = {}
        for k, v in s.items():
            if self.fields is not None and k not in self.fields:
                continue
            try:
                json.dumps(v, allow_nan=False)
            except (TypeError, ValueError) as e:
                raise RemoteRewardError(f"reward {self.name!r}: sample {s.get('id', i)!r} field {k!r} cannot travel "
                                        f"as JSON ({e}); list the fields the server needs in "
                                        "reward.kwargs.remote.fields") from e
            out[k] = v
        return out

    def __call__(self, completions: Sequence[Optional[str]], samples: Sequence[Mapping[str, Any]]) -> dict:
        n = len(completions)
        if n != len(samples):
            raise ValueError(f"{n} completions but {len(samples)} samples")
        step = self.batch_size or max(n, 1)
        merged: dict[str, list] = {}
        for lo in range(0, n, step):
            comps = [None if c is None else str(c) for c in completions[lo:lo + step]]
            sams = [self._sample(lo + i, s) for i, s in enumerate(samples[lo:lo + step])]
            part = self.client.post({"completions": comps, "samples": sams}, len(comps))
            if merged and set(part) != set(merged):
                raise RemoteRewardError(f"reward {self.name!r}: the server's keys changed between requests "
                                        f"({sorted(merged)} then {sorted(part)})")
            for k, v in part.items():
                merged.setdefault(k, []).extend(v)
        out = {"score": merged.pop(self.name)}
        prefix = f"{self.name}/"
        for k, v in merged.items():
            if k == "valid":  # a served image-style validity flag: an invalid row is dropped (NaN)
                out["score"] = [x if ok else math.nan for x, ok in zip(out["score"], v)]
                continue
            out[k[len(prefix):] if k.startswith(prefix) else k] = v
        return out
