"""Step-0 on-policy check: the trainer's log-probs of the first step's completions must equal the rollout's.

At the first step a process trains (step 0 of a run, or the first step after a resume), the weights that sampled the
completions are the weights the loss scores, so every completion token's ratio

    r_t = exp(log pi_train(y_t | prompt, y_<t) - log pi_rollout(y_t | prompt, y_<t))

must be 1 up to the rounding of the model's dtype. When it is not, the loss trains off-policy from the first step
on, and nothing else fails: the prompt the engine sampled from differs from the one the trainer scores (chat
template, processor pixels / frames), the engine reports log-probs of another distribution (temperature, top-p/k,
penalties, vLLM's raw log-probs), the training forward is random (LoRA dropout), or bf16 kernels differ more than
rounding explains. Users of every peer report such mismatches; this check finds them before the first update.

How: one no-grad forward of the step's rows through the trainer's own log-prob function
(:class:`mmgrpo.vlm.models.logprobs.TokenLogprobs`, the function and padding the loss uses, on its micro-batch plan;
the model in training mode, as the loss sees it), compared with ``rb.rollout_logp`` on the on-policy tokens of rows whose backend returned sampling log-probs (rows
whose rollout log-probs are all exactly 0 had none and are left out). Statistics are reduced over processes:

* ``max |r - 1|`` and ``mean |r - 1|`` over the tokens, and the mean over the first completion tokens only (which
  depend on the prompt alone: a prompt difference shows there as much as anywhere);
* the decision (``rollout.onpolicy_tol``): ``> 0`` = the max must stay below it; ``0`` (auto) = by
  the compute precision (``model.dtype``, or ``run.mixed_precision``'s autocast dtype): float32 ``max <= 1e-3``;
  bfloat16 ``mean <= 2e-2``, float16 ``mean <= 5e-3`` (half-precision kernels leave rare tokens with large ratios,
  so there the max is logged, not decided on).

A failed check raises :class:`mmgrpo.engine.errors.TrainingStopped` before any update (``mmgrpo train`` exits
with code 3; nothing was trained, so no checkpoint is written) with the statistics and the likely causes, most
likely first. ``rollout.onpolicy_check=false`` turns it off. The statistics go to the log (one INFO line on
every run) and stay in :attr:`OnPolicyCheck.stats`.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from mmgrpo.engine.dist import global_max, global_sum
from mmgrpo.engine.errors import TrainingStopped
from mmgrpo.utils.logging import get_logger

log = get_logger("mmgrpo.train")

__all__ = ["AUTO_TOLERANCE", "ratio_statistics", "tolerance", "compute_dtype", "OnPolicyCheck"]

# model.dtype -> (statistic decided on, bound) when rollout.onpolicy_tol = 0
AUTO_TOLERANCE: dict[str, tuple[str, float]] = {"float32": ("max", 1e-3), "bfloat16": ("mean", 2e-2),
                                                "float16": ("mean", 5e-3)}


def ratio_statistics(train_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Sums over the ``mask`` tokens of (N, T) log-probs: ``n``, ``sum_abs`` (sum |r - 1|), ``max_abs``, and the
    same over each row's first masked token (``first_n``, ``first_sum_abs``); ``r = exp(train - rollout)``."""
    m = mask.bool()
    d = (torch.exp(train_logp.double() - rollout_logp.double()) - 1.0).abs()
    first = m & (m.long().cumsum(1) == 1)
    return {"n": float(m.sum()), "sum_abs": float(d[m].sum()), "max_abs": float(d[m].max()) if m.any() else 0.0,
            "first_n": float(first.sum()), "first_sum_abs": float(d[first].sum())}


def compute_dtype(cfg) -> str:
    """The precision the forwards run in: ``model.dtype``, or the autocast dtype of ``run.mixed_precision`` (which
    scores under bf16 / fp16 autocast while fp32 weights sample: rounding of that precision)."""
    return {"bf16": "bfloat16", "fp16": "float16"}.get(cfg.run.mixed_precision, cfg.model.dtype)


def tolerance(dtype: str, tol: float) -> tuple[str, float]:
    """(statistic, bound) of the decision: ``("max", tol)`` for an explicit ``tol > 0``, else by compute dtype."""
    if tol > 0:
        return "max", float(tol)
    return AUTO_TOLERANCE.get(dtype, AUTO_TOLERANCE["bfloat16"])


def _likely_causes(cfg, stats: dict[str, float], backend: Any, which: str, bound: float) -> list[str]:
    """The usual causes of a step-0 mismatch, ordered by what the statistics and the config point to."""
    ro = cfg.rollout
    engine = type(backend).__name__
    prompt = (f"prompt: the rollout backend ({engine}) sampled from another prompt than the trainer scores (chat "
              f"template / system turn, processor pixels or frames, vision token count); the first completion token "
              f"depends on the prompt alone and is off by mean |r-1| = {stats['first_mean_abs']:.3g}; compare the "
              "rendered prompts of both sides")
    gen = (f"generation config: the engine's log-probs may be of another distribution than the loss scores "
           f"(rollout.temperature={ro.temperature}, top_p={ro.top_p}, top_k={ro.top_k}; vLLM needs "
           "logprobs_mode=processed_logprobs; repetition / presence penalties or a checkpoint generation_config "
           "applied by the engine only)")
    dtype = (f"dtype: model.dtype={cfg.model.dtype}, run.mixed_precision={cfg.run.mixed_precision}; generation "
             "and training kernels round differently (KV-cached decoding vs the full forward); rerun with model.dtype=float32 to confirm, then raise "
             "rollout.onpolicy_tol if the difference is rounding")
    if compute_dtype(cfg) == "float32":
        dtype = ("dtype: unlikely at model.dtype=float32 (rounding gives |ratio-1| ~ 1e-6), unless the engine runs "
                 "in another precision than the trainer")
    causes = []
    if cfg.model.lora.enabled and cfg.model.lora.dropout > 0:
        causes.append(f"LoRA dropout: model.lora.dropout={cfg.model.lora.dropout} makes the training forward "
                      "random (set it to 0)")
    far = stats[f"{which}_abs"] > 10 * bound  # rounding explains a little over the bound, not orders of magnitude
    sampler_changed = ro.temperature != 1.0 or ro.top_p < 1.0 or ro.top_k > 0
    if sampler_changed and stats["first_mean_abs"] < 0.5 * stats["mean_abs"]:
        causes += [gen, prompt, dtype]  # later tokens off more than the first: the distribution, not the prompt
    elif compute_dtype(cfg) != "float32" and not far:
        causes += [dtype, prompt, gen]
    else:
        causes += [prompt, gen, dtype]
    return causes


class OnPolicyCheck:
    """The check of one trainer object: runs at its first step (:attr:`pending` until then, unless
    ``rollout.onpolicy_check=false``); ``cfg``: the run's config (``rollout.onpolicy_check`` / ``onpolicy_tol``, the
    precision and LoRA settings the likely causes name). The statistics stay in :attr:`stats`."""

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.pending = bool(cfg.rollout.onpolicy_check)
        self.stats: dict[str, float] | None = None

    @torch.no_grad()
    def check(self, model, rb, plan: list, logprobs: Callable, backend: Any) -> dict[str, float] | None:
        """Compare the trainer's log-probs of ``rb``'s completions with the rollout's; returns the statistics (None
        when no row has rollout log-probs). ``plan``: the step's micro-batch plan, (batch, rows, weight) per forward
        (weight 0: a padding forward, run for the collectives only); ``logprobs(model, batch, rows)``: the loss's
        log-prob function; ``backend``: the rollout backend (named in the message). Collective: every process
        calls it."""
        self.pending = False
        cfg = self.cfg
        sums = {"n": 0.0, "sum_abs": 0.0, "max_abs": 0.0, "first_n": 0.0, "first_sum_abs": 0.0}
        rows_ok = None
        if rb.n:
            has_lp = (rb.rollout_logp * rb.completion_mask).abs().sum(1) > 0  # all exactly 0: the backend gave none
            rows_ok = ~rb.is_offpolicy & has_lp & (rb.valid if rb.valid is not None else True)
        was = model.training
        model.train()  # as the loss sees it (LoRA dropout, if any, is active there)
        try:
            for b, idx, w in plan:  # same forwards on every process (prepared models)
                lp = logprobs(model, b, idx).float().cpu()
                if not w:
                    continue
                T = lp.shape[1]
                # the tokens the loss trains on: a multi-turn row's tool turns have no sampling log-probs
                mask = b.completion_mask[idx, :T] * b.loss_mask[idx, :T] * rows_ok[idx].unsqueeze(1)
                st = ratio_statistics(lp, b.rollout_logp[idx, :T], mask)
                for k in sums:
                    sums[k] = max(sums[k], st[k]) if k == "max_abs" else sums[k] + st[k]
        finally:
            model.train(was)
        n, first_n = global_sum(sums["n"]), global_sum(sums["first_n"])
        if n == 0:
            log.info("step-0 on-policy check skipped: no on-policy row has sampling log-probs from the rollout "
                     "backend")
            return None
        stats = {"max_abs": float(global_max(sums["max_abs"])), "mean_abs": global_sum(sums["sum_abs"]) / n,
                 "first_mean_abs": global_sum(sums["first_sum_abs"]) / max(first_n, 1.0), "tokens": n}
        dtype = compute_dtype(cfg)
        which, bound = tolerance(dtype, cfg.rollout.onpolicy_tol)
        stats["tolerance"], stats["passed"] = bound, float(stats[f"{which}_abs"] <= bound)
        self.stats = stats
        log.info("step-0 on-policy check: max |ratio-1| = %.3g, mean = %.3g over %d tokens (first tokens %.3g); "
                 "%s <= %g: %s", stats["max_abs"], stats["mean_abs"], int(n), stats["first_mean_abs"], which, bound,
                 "passed" if stats["passed"] else "FAILED")
        if not stats["passed"]:
            causes = _likely_causes(cfg, stats, backend, which, bound)
            causes = "\n".join(f"  {i + 1}. {c}" for i, c in enumerate(causes))
            raise TrainingStopped(
                f"step-0 on-policy check failed before any update: the trainer's log-probs of the first step's "
                f"completions are not the rollout's (max |ratio-1| = {stats['max_abs']:.4g}, mean = "
                f"{stats['mean_abs']:.4g} over {int(n)} tokens; {which} must be <= {bound:g} in {dtype}). The same "
                f"weights sampled and score these tokens, so the ratio must be 1: training "
                f"now would be off-policy from the first step. Likely causes, most likely first:\n{causes}\n"
                "Nothing was trained and no checkpoint was written. rollout.onpolicy_check=false turns the check "
                "off; rollout.onpolicy_tol=X sets the bound on max |ratio-1|")
        return stats
