"""What the VLM recipe (:mod:`mmgrpo.vlm.train.trainer`) hands to a method, on top of the shared protocol
(:class:`mmgrpo.engine.method.Method`, whose docstring lists the stage hooks and which methods use each):

* :class:`VLMMethod`: the protocol with the VLM's batch (:class:`~mmgrpo.vlm.data.batch.RolloutBatch`, N rows,
  group ids (N,) int64, T completion positions) and the declarations the recipe reads once at setup (which rows,
  log-probs and logits it must provide);
* :class:`Estimator`: what ``advantage_estimator()`` returns, the parts of the advantage a method replaces;
* :class:`LossInputs`, :func:`grpo_loss` (the default policy loss, composed of :mod:`mmgrpo.core.losses` pieces) and
  :class:`PolicyLoss`: what ``loss()`` returns, a policy loss with its share of the step.

The formulas live in each method's module as pure functions, with tests against hand-computed values.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from mmgrpo.engine.method import Method

if TYPE_CHECKING:  # torch stays out of the import of the registry (``mmgrpo train --help``)
    import torch

    from mmgrpo.vlm.data.batch import RolloutBatch

__all__ = ["VLMMethod", "Estimator", "LossInputs", "PolicyLoss", "grpo_loss", "grpo_share"]


class VLMMethod(Method["RolloutBatch"]):
    """A VLM method. ``cfg``: the run's TrainConfig; ``run``: the :class:`~mmgrpo.vlm.train.trainer.GRPOTrainer`."""

    #: every row of a group must be sampled on one process (group-level terms, injected members, refills)
    needs_whole_groups: bool = False
    #: old log-probs must be computed before the update even with ``algo.num_iterations=1``
    needs_old_logp: bool = False
    #: the old-policy forward must return the logits (or head inputs) for ``on_logits``
    needs_logits: bool = False
    #: the training forward must return the logits (or head inputs) for ``on_loss``
    needs_train_logits: bool = False
    #: members of each group the method adds in ``after_rollout`` (the policy samples G minus these)
    injected_per_group: int = 0
    #: extra sampling rounds a step may take to refill what ``on_advantages`` dropped (DAPO dynamic sampling)
    extra_rounds: int = 0
    #: ``on_epoch`` may change the trained samples (media prefetching then stops at epoch boundaries)
    reselects_data: bool = False
    #: this step's loss has a term that needs no advantage (an SFT term: CHORD, ReLIFT), so a step whose advantages
    #: are all 0 is still taken (read every step: a method may set it per step)
    trains_without_advantages: bool = False
    #: ``state_dict()`` is this process's own (buffers of the groups it sampled: Prompt Replay, the sample buffer,
    #: ReLIFT): checkpoints keep every process's, and a resume on as many processes gives each its own
    state_per_process: bool = False


@dataclass(frozen=True)
class Estimator:
    """The parts of the group advantage a method replaces (each part comes from at most one enabled method):

    * ``shape(rb) -> (N,)``: the reward that enters the advantage (default: ``rb.rewards["total"]``), read after every
      ``on_rewards`` hook ran;
    * ``gathered(rewards, group_ids, scale=, eps=, valid=) -> AdvantageOutput``: a drop-in for
      :func:`mmgrpo.core.group_advantages` on the batch gathered over processes;
    * ``local(rb, rewards, kw) -> AdvantageOutput``: advantages computed on this process's whole groups instead."""

    shape: Callable | None = None
    gathered: Callable | None = None
    local: Callable | None = None


@dataclass
class LossInputs:
    """One training micro-batch as the loss sees it (n rows, T positions, on the model's device). The recipe fills
    every field; a test may give the tensors and ``algo`` only (local counts)."""

    logp: "torch.Tensor"  # (n, T) current policy, with gradient
    old_logp: "torch.Tensor"  # (n, T) the policy that sampled (= logp.detach() on-policy)
    advantages: "torch.Tensor"  # (n,)
    mask: "torch.Tensor"  # (n, T) loss tokens (all 0 in a weight-0 padding forward)
    group_ids: "torch.Tensor | None" = None  # (n,)
    token_weights: "torch.Tensor | None" = None  # (n, T) TW-GRPO / importance / entropy weights
    ref_logp: "torch.Tensor | None" = None  # (n, T) the KL reference (algo.kl_coef > 0)
    logits: Any = None  # the training forward's logits or HeadInputs, for methods with needs_train_logits
    offpolicy: "torch.Tensor | None" = None  # (n,) bool: injected / replayed rows (LUFFY, CHORD train them apart)
    # global counts of the step: tokens, sequences, rows, micro_batches, offpolicy_tokens, offpolicy_sequences
    totals: dict = field(default_factory=dict)
    rows: int = 0  # rows of this micro-batch (0: logp's)
    algo: Any = None  # the run's AlgoConfig (required; a field with a default only for the field order)
    max_len: int | None = None  # rollout.max_new_tokens (Dr.GRPO's L; None: T)
    index: "torch.Tensor | None" = None  # (n,) the micro-batch's rows in the step's batch (per-row method state)

    def __post_init__(self):
        if self.algo is None:  # not imported here: mmgrpo.vlm.config imports the method registry
            raise ValueError("LossInputs needs algo= (the run's AlgoConfig)")
        self.rows = self.rows or int(self.logp.shape[0])


def grpo_loss(li: LossInputs, clip_low: float | None = None, clip_high: float | None = None,
              surrogate: Callable | None = None, policy_agg: Callable | None = None) -> Any:
    """The default policy loss: PPO's clipped surrogate on token (or GSPO sequence, ``algo.ratio_level``) ratios,
    times the token weights, plus ``algo.kl_coef`` times the ``algo.kl_estimator`` KL to the reference, aggregated as
    ``algo.agg`` over the step's global counts. ``clip_low`` / ``clip_high``: other bounds than ``algo.*`` (NGRPO).
    ``surrogate(log_ratio, li) -> ((n, T) loss, metrics)`` replaces the clipped surrogate (CISPO, SAPO, DCPO, DHPO:
    :mod:`mmgrpo.core.loss_variants`); ``policy_agg(per_token_policy_loss, li) -> scalar`` aggregates the policy term
    instead of ``algo.agg`` (Balanced Aggregation), the KL term then being aggregated as ``algo.agg`` on its own.
    Returns a :class:`mmgrpo.core.PolicyLossOutput` (metrics: kl, clip fractions, ratios, approx_kl, num_tokens)."""
    import torch

    from mmgrpo.core.losses import (PolicyLossOutput, aggregate_loss, clipped_surrogate, kl_penalty, log_ratio,
                                    masked_kl, masked_mean, ratio_metrics, sequence_log_ratio)

    a = li.algo
    maskb = li.mask.bool()
    lr = log_ratio(li.logp, li.old_logp, maskb)
    metrics: dict[str, float] = {}
    kl_t = None
    if a.kl_coef != 0.0:
        if li.ref_logp is None:
            raise ValueError("algo.kl_coef != 0 needs reference log-probs")
        kl_t = masked_kl(li.logp, li.ref_logp, maskb, a.kl_estimator)
        metrics["kl"] = masked_mean(kl_t, maskb).item()
    elif li.ref_logp is not None:
        with torch.no_grad():
            metrics["kl"] = masked_mean(kl_penalty(li.logp, li.ref_logp, a.kl_estimator), maskb).item()
    used = sequence_log_ratio(lr, maskb) if a.ratio_level == "sequence" else lr
    if surrogate is None:
        pg, clip_m = clipped_surrogate(used, li.advantages, maskb, a.clip_low if clip_low is None else clip_low,
                                       a.clip_high if clip_high is None else clip_high, a.dual_clip)
    else:
        pg, clip_m = surrogate(used, li)
    metrics.update(clip_m)
    if li.token_weights is not None:
        pg = pg * li.token_weights.to(pg.dtype).detach()
    t = li.totals
    if policy_agg is not None:
        pg = torch.where(maskb, pg, torch.zeros_like(pg))
        loss = policy_agg(pg, li)
        if kl_t is not None:
            loss = loss + a.kl_coef * aggregate_loss(kl_t, maskb, a.agg, li.max_len, t.get("tokens"),
                                                     t.get("sequences"))
        return PolicyLossOutput(loss=loss, metrics={**metrics, **ratio_metrics(lr, maskb)},
                                per_token_loss=pg if kl_t is None else pg + a.kl_coef * kl_t)
    per_token = pg if kl_t is None else pg + a.kl_coef * kl_t
    per_token = torch.where(maskb, per_token, torch.zeros_like(per_token))
    loss = aggregate_loss(per_token, maskb, a.agg, li.max_len, t.get("tokens"), t.get("sequences"))
    metrics.update(ratio_metrics(lr, maskb))
    return PolicyLossOutput(loss=loss, metrics=metrics, per_token_loss=per_token)


def grpo_share(loss: "torch.Tensor", li: LossInputs) -> "torch.Tensor":
    """One micro-batch's loss as its share of the step's: ``local_token_mean`` (a local mean per micro-batch)
    averages over all micro-batches; token / sequence means use global counts already."""
    if li.algo.agg == "local_token_mean":
        return loss / max(li.totals.get("micro_batches", 1.0), 1.0)
    return loss


@dataclass(frozen=True)
class PolicyLoss:
    """A policy loss and its micro-batch share: ``fn(LossInputs) -> PolicyLossOutput``; ``share(loss, LossInputs)``
    turns the loss (with the methods' ``on_loss`` terms added) into the micro-batch's share of the step's loss."""

    fn: Callable = grpo_loss
    share: Callable = grpo_share
