"""Reward calls of the VLM trainer: retries / timeouts / failure policy, the row rewards, accuracies, and the
K-completions-per-sample scoring that data selection uses."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from mmgrpo.engine.errors import RewardCallFailed
from mmgrpo.vlm.models.rollout import make_seeds
from mmgrpo.engine.reward_calls import CallStats
from mmgrpo.vlm.train.faults import call_with_retries
from mmgrpo.vlm.data.task import BadSampleError, MissingMediaError, sample_id
from mmgrpo.utils.logging import get_logger

log = get_logger("mmgrpo.train")

__all__ = ["ScoringMixin"]


class ScoringMixin:
    """``GRPOTrainer._score`` / ``_accuracy`` / ``_call_reward`` / ``score_samples``."""

    def _call_reward(self, fn: Callable, texts: list[str], samples: list, what: str) -> dict | None:
        """``fn(texts, samples)`` with retries / timeout (``reward.*``); None if it failed for good.

        A failed call never raises here: its rows are dropped (``reward.on_failure=drop``), or the failure is
        recorded and, once every process has finished the same collectives, the step stops the run
        (``on_failure=stop``: checkpoint first, see ``_check_stop``)."""
        rc = self.cfg.reward
        st = CallStats()
        try:
            return call_with_retries(fn, (texts, samples), rc.retries, rc.retry_backoff, rc.timeout, st, what)
        except RewardCallFailed as e:
            self.counters["reward_failed_calls"] += 1
            if rc.on_failure == "stop":
                self._request_stop(f"{e} (reward.on_failure=stop)")
            else:
                log.warning("%s; dropping its %d row(s) (reward.on_failure=drop)", e, len(texts))
            return None
        finally:
            self.counters["reward_retries"] += st.retries
            self.counters["reward_timeouts"] += st.timeouts

    def _score(self, texts: list[str], samples: list[dict]) -> dict[str, torch.Tensor]:
        """Rewards of the rows; ``out["_failed"]`` (bool) marks rows whose reward call failed (rewards NaN)."""
        n = len(texts)
        out = self._call_reward(self.reward_fn, texts, samples, "reward function")
        if out is None:
            return {"total": torch.full((n,), float("nan")), "parse_failed": torch.zeros(n, dtype=torch.bool),
                    "_failed": torch.ones(n, dtype=torch.bool)}
        out = {k: torch.as_tensor(v) for k, v in out.items()}
        if "total" not in out:
            out["total"] = sum(self.cfg.reward.weights[k] * out[k].float() for k in self.cfg.reward.weights)
        if "parse_failed" not in out:
            out["parse_failed"] = torch.zeros(n, dtype=torch.bool)
        for k, v in out.items():
            if v.shape[:1] != (n,):
                raise ValueError(f"reward function returned {k!r} with shape {tuple(v.shape)} for {n} completions")
        out["_failed"] = torch.zeros(n, dtype=torch.bool)
        return out

    def _accuracy(self, texts: list[str], samples: list[Any], scored: dict | None = None) -> torch.Tensor:
        """Accuracy per row (T-GRPO); NaN where the reward failed."""
        if scored is not None and self.acc_key in scored:
            return scored[self.acc_key].float()
        fn = self.accuracy_fn or self.reward_fn
        res = self._call_reward(fn, texts, samples, "accuracy reward")
        if res is None:
            return torch.full((len(texts),), float("nan"))
        return torch.as_tensor(res[self.acc_key] if self.acc_key in res else res["total"]).float()

    def _request_stop(self, reason: str) -> None:
        if self._stop_reason is None:
            self._stop_reason = reason
        log.error("stop requested: %s", reason)

    @torch.no_grad()
    def score_samples(self, samples: Sequence[Any], K: int, key: str = "total", round: int = 0) -> torch.Tensor:
        """(S, K) rewards of K sampled completions per sample (this process's share, gathered); missing media
        gives a row of NaN."""
        from dataclasses import replace

        from accelerate.utils import gather_object

        idx = list(range(self.rank, len(samples), self.world))
        res = []
        for start in range(0, len(idx), self.cfg.run.prompts_per_device):
            chunk = [(i, samples[i]) for i in idx[start:start + self.cfg.run.prompts_per_device]]
            preps, ok = [], []
            for i, s in chunk:
                try:
                    preps.append((i, self.task.prepare(s)))
                except (MissingMediaError, BadSampleError) as e:
                    policy = (self.cfg.data.on_missing_media if isinstance(e, MissingMediaError)
                              else self.cfg.data.on_bad_sample)
                    if policy == "error":
                        raise
                    log.warning("selection: skipping %s: %s", sample_id(s), e)
                    res.append((i, [float("nan")] * K))
            if not preps:
                continue
            with self._generation_context():
                sampling = replace(self.sampling, greedy=True) if self.cfg.selection.greedy else self.sampling
                out = self.backend.generate([pp.item for _, pp in preps], K, sampling,
                                            seeds=make_seeds(self.cfg.run.seed, -1 - round, [i for i, _ in preps], K),
                                            raw_prompts=[{"text": pp.text, "images": pp.images, "clip": pp.clip}
                                                         for _, pp in preps])
            rs = [pp.reward_sample for _, pp in preps for _ in range(K)]
            sc = self._score(out.texts, rs)
            r = sc[key] if key in sc else self._accuracy(out.texts, rs)
            r = r.float().view(len(preps), K)
            res.extend((i, r[j].tolist()) for j, (i, _) in enumerate(preps))
        allres = gather_object(res) if self.world > 1 else res
        mat = torch.full((len(samples), K), float("nan"))
        for i, row in allres:
            mat[i] = torch.tensor(row)
        return mat
