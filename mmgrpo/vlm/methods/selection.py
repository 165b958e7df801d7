"""Offline data selection from K repeated inferences per sample (``methods.selection.enabled``).

Before training (round 0), and with ``methods.selection.refilter_every_epoch`` at the start of every epoch e (round
e, Time-R1 multi-round, with the policy as trained so far), every sample is answered
``methods.selection.num_inferences`` times (``run.score_samples``; ``methods.selection.greedy`` = argmax decoding)
and the criterion (:func:`select_indices`) picks the samples the prompt stream draws from (``run.use_samples``).
``selection.jsonl`` gets one row per sample and round. A resume restores the selection from the checkpoint (no
new round).

Criteria (pure functions: (S, K) rewards in, kept indices out):

* ``variance`` (Temporal-RLT): keep samples whose K rewards vary, var >= ``min_variance`` (highest first);
* ``gaussian`` (Time-R1, ``src/utils/process_data.py`` task ``gaussian_03``): only samples with mean reward > 0 are
  candidates (the release keeps difficulty = 100·IoU > 0: a sample the base model cannot hit at all is never
  drawn); weight exp(-(mean - mu)^2 / (2 sigma^2)), normalised over the candidates; draw ``num_keep`` without
  replacement proportionally to the weight (seeded; same distribution as the release's
  ``np.random.choice(n, k, replace=False, p)``, not the same draws). ``keep_zero=True`` makes the zero-reward samples
  candidates again (mmgrpo before issue #23). Deviation: when ``num_keep`` >= the number of candidates every
  candidate is kept (the release's ``np.random.choice`` raises and writes no file);
* ``nonconstant`` (DAPO-style): drop samples whose K rewards are all equal (all right / all wrong).
"""
from __future__ import annotations

import torch

from mmgrpo.vlm.methods.base import VLMMethod
from mmgrpo.vlm.data.task import sample_id
from mmgrpo.utils.logging import get_logger
from mmgrpo.utils.seeding import sample_seed

log = get_logger("mmgrpo.train")

__all__ = ["DataSelection", "reward_stats", "select_indices"]


def reward_stats(rewards: torch.Tensor) -> dict[str, torch.Tensor]:
    """rewards (S, K) -> per-sample mean, population variance, min, max (each (S,) float64)."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    if r.dim() != 2 or r.shape[1] < 1:
        raise ValueError(f"rewards must be (num_samples, K), got {tuple(r.shape)}")
    return {"mean": r.mean(1), "var": r.var(1, unbiased=False), "min": r.min(1).values, "max": r.max(1).values}


def select_indices(rewards: torch.Tensor, criterion: str, min_variance: float = 0.0, num_keep: int = 0,
                   mu: float = 0.3, sigma: float = 0.2, seed: int = 0, keep_zero: bool = False) -> list[int]:
    """Indices (ascending) of the samples to keep; see the module docstring for the criteria."""
    st = reward_stats(rewards)
    S = st["mean"].shape[0]
    if criterion == "nonconstant":
        keep = [i for i in range(S) if st["max"][i] > st["min"][i]]
        return sorted(keep[:num_keep] if num_keep else keep)
    if criterion == "variance":
        ok = [i for i in range(S) if st["var"][i] >= min_variance and st["max"][i] > st["min"][i]]
        ok.sort(key=lambda i: (-float(st["var"][i]), i))
        return sorted(ok[:num_keep] if num_keep else ok)
    if criterion == "gaussian":
        if sigma <= 0:
            raise ValueError("gaussian selection needs sigma > 0")
        cand = torch.arange(S) if keep_zero else (st["mean"] > 0).nonzero().flatten()
        if not num_keep or num_keep >= cand.numel():
            return cand.tolist()
        w = torch.exp(-((st["mean"][cand] - mu) ** 2) / (2 * sigma**2))
        g = torch.Generator().manual_seed(int(seed))
        idx = torch.multinomial(w.clamp_min(1e-300), num_keep, replacement=False, generator=g)
        return sorted(cand[idx].tolist())
    raise ValueError(f"unknown selection criterion {criterion!r}; expected variance | gaussian | nonconstant")


class DataSelection(VLMMethod):
    name = "selection"

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.reselects_data = cfg.methods.selection.refilter_every_epoch

    def on_train_start(self, resumed: bool) -> None:
        if not resumed:
            self.select(round=0)

    def on_epoch(self, epoch: int) -> None:
        """Re-select when epoch ``epoch`` begins (runs on every process, at the same point of the stream)."""
        if self.reselects_data:
            self.select(round=epoch)

    def select(self, round: int = 0) -> list[int]:
        """Score every sample with the CURRENT policy and keep those the criterion selects (each round has its own
        sampling seeds)."""
        run, sc = self.run, self.cfg.methods.selection
        key = sc.key if sc.key != "auto" else (run.acc_key if sc.criterion == "gaussian" else "total")
        mat = run.score_samples(run.all_samples, sc.num_inferences, key, round=round, greedy=sc.greedy)
        ok = ~torch.isnan(mat).any(1)
        valid_idx = ok.nonzero().flatten().tolist()
        seed = sample_seed(self.cfg.run.seed, round) if round else self.cfg.run.seed
        keep_local = select_indices(mat[ok], sc.criterion, sc.min_variance, sc.num_keep, sc.gaussian_mu,
                                    sc.gaussian_sigma, seed=seed, keep_zero=sc.gaussian_keep_zero)
        keep = [valid_idx[i] for i in keep_local]
        self._log(mat, ok, keep, round)
        run.use_samples(keep)
        return keep

    def _log(self, mat: torch.Tensor, ok: torch.Tensor, keep: list[int], round: int) -> None:
        run, step = self.run, self.run.state.step
        st = reward_stats(torch.nan_to_num(mat))
        kept = set(keep)
        if run.accelerator.is_main_process:
            run.logger.log_jsonl("selection.jsonl", [
                {"round": round, "step": step, "index": i, "sample_id": sample_id(run.all_samples[i]),
                 "rewards": mat[i].tolist(), "mean": float(st["mean"][i]), "var": float(st["var"][i]),
                 "kept": i in kept}
                for i in range(len(run.all_samples))])
        run.logger.log({"selection/kept": len(keep), "selection/total": len(run.all_samples),
                        "selection/missing_media": int((~ok).sum()), "selection/round": round}, step)
        log.info("data selection round %d (step %d): kept %d of %d samples", round, step, len(keep),
                 len(run.all_samples))
