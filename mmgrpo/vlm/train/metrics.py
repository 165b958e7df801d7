"""Per-step metrics of the VLM trainer, their reduction over processes, and the completions log."""
from __future__ import annotations

import torch

from mmgrpo.vlm.train.batch import RolloutBatch
from mmgrpo.vlm.train.format_guard import well_formed_rows
from mmgrpo.vlm.train.task import sample_id

__all__ = ["MetricsMixin"]


class MetricsMixin:
    """``GRPOTrainer.step_metrics`` / ``_reduce_metrics`` / ``_log_completions``."""

    def step_metrics(self, rb: RolloutBatch) -> dict[str, float]:
        onp = ~rb.is_offpolicy
        m: dict[str, float] = {}
        for k, v in rb.rewards.items():
            v = v[onp].float()
            v = v[torch.isfinite(v)]  # an unweighted diagnostic reward may be NaN on a kept row
            if v.numel():
                m[f"reward/{k}/mean"] = float(v.mean())
                m[f"reward/{k}/std"] = float(v.std()) if v.numel() > 1 else 0.0
        lens = rb.completion_mask[onp].sum(1).float()
        if lens.numel():
            m["completions/mean_length"] = float(lens.mean())
            m["completions/max_length"] = float(lens.max())
            m["completions/clipped_ratio"] = float(rb.truncated[onp].float().mean())
            m["completions/parse_failures"] = float(rb.parse_failed[onp].sum())
            m["completions/parse_failure_rate"] = float(rb.parse_failed[onp].float().mean())
            # exactly the answer the prompt asks for (the format guard's signal; clipped_ratio = share at the cap)
            wf = torch.tensor(well_formed_rows(rb.texts, self.cfg), dtype=torch.bool)
            m["completions/well_formed"] = float(wf[onp].float().mean())
        if rb.advantages is not None and rb.n:
            m["advantages/abs_mean"] = float(rb.advantages[onp].abs().mean()) if onp.any() else 0.0
        m["frac_reward_zero_std"] = rb.info.get("zero_std_frac", 0.0)
        gt = rb.info.get("gen_time", 0.0)
        m["perf/tokens_per_s"] = rb.info.get("gen_tokens", 0.0) / gt if gt > 0 else 0.0
        m["data/groups"] = rb.info.get("groups", 0.0)
        m["data/valid_groups"] = rb.info.get("valid_groups", 0.0)  # groups with >= 2 valid rows (a baseline)
        m["data/sampling_rounds"] = rb.info.get("rounds", 1.0)
        m["data/skipped_missing_media"] = float(self.counters["skipped_missing_media"])
        m["data/skipped_bad_samples"] = float(self.counters["skipped_bad_samples"])
        mr = getattr(self, "media_report", None)  # samples the media check at load time dropped (fixed for the run)
        m["data/dropped_at_load"] = float(mr.n_dropped) if mr is not None else 0.0
        m["data/filtered_groups"] = float(self.counters["filtered_groups"])
        for k in ("reward_nonfinite_rows", "reward_failed_rows", "reward_failed_calls", "reward_retries",
                  "reward_timeouts", "degenerate_groups"):
            m[f"faults/{k}"] = float(self.counters[k])
        m["faults/degenerate_groups_step"] = rb.info.get("degenerate_groups", 0.0)
        m["data/epoch"] = float(self.stream.epoch)
        m["perf/generated_tokens"] = float(self.counters["generated_tokens"])  # cumulative, this process
        m["perf/prefix_group"] = float(self.logprob_impl == "prefix_group")
        if rb.old_logp is not None and onp.any():  # engine vs trainer log-probs (vLLM parity diagnostic)
            mk = rb.completion_mask[onp].bool()
            Tm = min(rb.old_logp.shape[1], rb.rollout_logp.shape[1])
            d = (rb.old_logp[onp][:, :Tm] - rb.rollout_logp[onp][:, :Tm]).abs()[mk[:, :Tm]]
            m["rollout/logprob_max_abs_diff"] = float(d.max()) if d.numel() else 0.0
        for meth in self.methods:
            meth.metrics(rb, m)
        return m

    def _reduce_metrics(self, m: dict[str, float]) -> dict[str, float]:
        """Average metrics over processes (max for ``*max*`` keys, sum for counters of this step).

        Cumulative counters (``data/skipped_missing_media``, ``data/filtered_groups``) are per process and summed;
        per-process means are averaged with equal weight (processes hold equally many prompts)."""
        if self.world == 1:
            return m
        from accelerate.utils import gather_object

        allm = gather_object([m])
        out: dict[str, float] = {}
        for k in sorted({k for d in allm for k in d}):
            vals = [d[k] for d in allm if k in d]
            if "max" in k:
                out[k] = max(vals)
            elif "min" in k:
                out[k] = min(vals)
            elif k in ("faults/skipped_steps", "faults/consecutive_skips", "train/skipped_steps"):
                out[k] = vals[0]  # decided globally: the same on every process
            elif k in ("data/skipped_missing_media", "data/skipped_bad_samples", "data/filtered_groups", "data/groups",
                       "data/valid_groups",
                       "completions/parse_failures") or k.startswith(("perf/tokens", "faults/")):
                out[k] = float(sum(vals))
            else:
                out[k] = sum(vals) / len(vals)
        return out

    def _log_completions(self, rb: RolloutBatch, step: int) -> None:
        rows = []
        for i in range(min(rb.n, self.cfg.run.num_completions_to_log)):
            rows.append({"step": step, "sample_id": sample_id(rb.samples[i]), "group": int(rb.group_ids[i]),
                         "completion": rb.texts[i], "offpolicy": bool(rb.is_offpolicy[i]),
                         "truncated": bool(rb.truncated[i]), "parse_failed": bool(rb.parse_failed[i]),
                         "advantage": float(rb.advantages[i]) if rb.advantages is not None else None,
                         **{f"reward/{k}": float(v[i]) for k, v in rb.rewards.items()}})
        self.logger.log_jsonl("completions.jsonl", rows)
