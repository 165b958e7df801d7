"""Offline data selection from K repeated inferences per sample (``selection.enabled``).

Before training (round 0), and with ``selection.refilter_every_epoch`` at the start of every epoch e (round e,
Time-R1 multi-round, with the policy as trained so far), every sample is answered ``selection.num_inferences``
times (``trainer.score_samples``; ``selection.greedy`` = argmax decoding) and the pure criterion of
``mmgrpo.train.selection`` (variance / gaussian / nonconstant) picks the samples the prompt stream draws from
(``trainer.use_samples``). ``selection.jsonl`` gets one row per sample and round. A resume restores the
selection from the checkpoint (no new round).
"""
from __future__ import annotations

import torch

from mmgrpo.methods.base import VLMMethod
from mmgrpo.train.selection import reward_stats, select_indices
from mmgrpo.train.task import sample_id
from mmgrpo.utils.logging import get_logger
from mmgrpo.utils.seeding import sample_seed

log = get_logger("mmgrpo.train")

__all__ = ["DataSelection"]


class DataSelection(VLMMethod):
    name = "selection"

    def __init__(self, cfg, trainer):
        super().__init__(cfg, trainer)
        self.uses_epoch_hook = cfg.selection.refilter_every_epoch

    def on_train_start(self, resumed: bool) -> None:
        if not resumed:
            self.select(round=0)

    def on_epoch(self, epoch: int) -> int | None:
        """Re-select when epoch ``epoch`` begins (runs on every process, at the same point of the stream)."""
        return len(self.select(round=epoch))

    def select(self, round: int = 0) -> list[int]:
        """Score every sample with the CURRENT policy and keep those the criterion selects (each round has its own
        sampling seeds)."""
        tr, sc = self.trainer, self.cfg.selection
        key = sc.key if sc.key != "auto" else (tr.acc_key if sc.criterion == "gaussian" else "total")
        mat = tr.score_samples(tr.all_samples, sc.num_inferences, key, round=round)
        ok = ~torch.isnan(mat).any(1)
        valid_idx = ok.nonzero().flatten().tolist()
        seed = sample_seed(self.cfg.run.seed, round) if round else self.cfg.run.seed
        keep_local = select_indices(mat[ok], sc.criterion, sc.min_variance, sc.num_keep, sc.gaussian_mu,
                                    sc.gaussian_sigma, seed=seed, keep_zero=sc.gaussian_keep_zero)
        keep = [valid_idx[i] for i in keep_local]
        self._log(mat, ok, keep, round)
        tr.use_samples(keep)
        return keep

    def _log(self, mat: torch.Tensor, ok: torch.Tensor, keep: list[int], round: int) -> None:
        tr = self.trainer
        st = reward_stats(torch.nan_to_num(mat))
        kept = set(keep)
        if tr.accelerator.is_main_process:
            tr.logger.log_jsonl("selection.jsonl", [
                {"round": round, "step": tr.step, "index": i, "sample_id": sample_id(tr.all_samples[i]),
                 "rewards": mat[i].tolist(), "mean": float(st["mean"][i]), "var": float(st["var"][i]),
                 "kept": i in kept}
                for i in range(len(tr.all_samples))])
        tr.logger.log({"selection/kept": len(keep), "selection/total": len(tr.all_samples),
                       "selection/missing_media": int((~ok).sum()), "selection/round": round}, tr.step)
        log.info("data selection round %d (step %d): kept %d of %d samples", round, tr.step, len(keep),
                 len(tr.all_samples))
