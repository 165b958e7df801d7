"""The hook API between the VLM GRPO loop (``mmgrpo.vlm.train.trainer``) and the methods of ``mmgrpo.vlm.methods``.

A method is a :class:`VLMMethod` subclass that overrides only the hooks it needs; every default is a no-op, so
the loop can call every enabled method at every named point without knowing which methods exist. Methods are
built once per trainer (``mmgrpo.vlm.methods.build_methods``) in the registry's order, and the loop calls each hook
on the enabled methods in that order. Per step, the named points are, top to bottom:

====================  ===========================================================================================
point                 hooks (called in registry order on the enabled methods)
====================  ===========================================================================================
construction          ``check_config(cfg)`` (classmethod, every registered method, before the model
                      loads); ``__init__(cfg, trainer)`` (enabled methods)
train start           ``on_train_start(resumed)`` (data selection round 0), ``on_epoch(epoch)`` (stream hook)
prompts               ``prepare_prompts(step, preps)``: before sampling (mode, perturbed media, hints)
sampling              ``generations_per_group(G)``; after sampling: ``extra_rows(prepared prompt)`` (injected
                      members, e.g. the ground truth)
rewards               ``on_rewards(rb, ctx)``: after scoring, before advantages (bonuses, extra validity)
advantages            ``shape_rewards(rb, r)`` -> the reward entering the advantage; ``local_advantages(rb, r, kw)``
                      (a per-process estimator replacing the gathered group statistics) or ``advantage_fn()``
                      (a drop-in for ``core.group_advantages`` on the gathered batch); ``after_advantages(rb,
                      valid)`` (diagnostics)
collect rounds        ``extra_rounds()``; ``filter_batch(rb)`` per round; ``finish_batch(rb, n, want)``
precompute            ``needs_old_logp`` / ``needs_logits``; ``before_precompute(rb)``; ``on_logits(rb, idx,
                      logits, lp)`` per micro-batch; ``after_precompute(rb)`` (token weights)
loss                  ``loss_mask(rb, mask)``; ``loss_kwargs(kw)`` (clip bounds, ...); ``loss_share(rows,
                      totals)`` (how a micro-batch's loss is normalised); ``extra_loss(rb, idx, logits, mask,
                      kw)`` per training micro-batch (``needs_train_logits``: a term added to the policy loss)
update                ``after_update()`` after every applied optimizer update
checkpoint            ``state_dict()`` / ``load_state_dict(sd)`` (saved under ``trainer.methods.<name>``)
metrics               ``metrics(rb, m)``
====================  ===========================================================================================

Hooks take and return tensors of the :class:`~mmgrpo.vlm.train.batch.RolloutBatch` (N rows, group ids (N,) int64,
T completion positions); the formulas live in each method's module, with tests against hand-computed values.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:  # torch stays out of the import of the registry (``mmgrpo train --help``)
    import torch

    from mmgrpo.vlm.train.batch import RolloutBatch


class VLMMethod:
    """Base class: every hook is a no-op. ``name`` is the registry name (metrics / error messages)."""

    name: str = ""
    #: every row of a group must be sampled on one process (group-level terms, injected members, refills)
    needs_whole_groups: bool = False
    #: old log-probs must be computed before the update even with ``algo.num_iterations=1``
    needs_old_logp: bool = False
    #: the precompute forward must return the logits (or head inputs) for ``on_logits``
    needs_logits: bool = False
    #: the training forward must return the logits (or head inputs) for ``extra_loss``
    needs_train_logits: bool = False
    #: the prompt stream calls ``on_epoch`` when an epoch begins (and prefetching stops at epoch boundaries)
    uses_epoch_hook: bool = False

    def __init__(self, cfg: Any, trainer: Any):
        self.cfg, self.trainer = cfg, trainer

    @classmethod
    def check_config(cls, cfg: Any) -> None:
        """Refuse options / combinations the method cannot run with. Called before the model loads, for every
        registered method, enabled or not (return early when off unless an option must be valid anyway)."""

    # ------------------------------------------------------------------ train start / data
    def on_train_start(self, resumed: bool) -> None:
        """Before the first step of a run (``resumed``: the state came from a checkpoint)."""

    def on_epoch(self, epoch: int) -> int | None:
        """When epoch ``epoch`` > 0 of the prompt stream begins; may return a new number of samples."""
        return None

    # ------------------------------------------------------------------ sampling
    def generations_per_group(self, G: int) -> int:
        """How many of a group's G members the policy samples (the rest come from ``extra_rows``)."""
        return G

    def extra_rows(self, pp: Any) -> list[dict]:
        """Rows appended after a group's sampled members: dicts with ids, mask, text, lp, offpolicy, truncated."""
        return []

    def prepare_prompts(self, step: int, preps: list) -> list:
        """Before sampling, once per sampling round: this process's ``(position, PreparedPrompt, generations)``
        tuples; may return them with new PreparedPrompts (another system prompt, perturbed frames, a hint; see
        ``TaskAdapter.rebuild``). The reward still scores against ``pp.reward_sample``."""
        return preps

    # ------------------------------------------------------------------ rewards / advantages
    def on_rewards(self, rb: "RolloutBatch", ctx: dict) -> None:
        """After scoring: may change ``rb.rewards`` (keep "total" the weighted total), ``rb.valid``, ``rb.info``.
        ``ctx``: step, preps (position, prepared prompt, generations), reward_samples (per row)."""

    def shape_rewards(self, rb: "RolloutBatch", r: "torch.Tensor") -> "torch.Tensor":
        """The (N,) reward that enters the advantage (default: unchanged)."""
        return r

    def local_advantages(self, rb: "RolloutBatch", r: "torch.Tensor", kw: dict):
        """An ``AdvantageOutput`` computed on this process's whole groups, or None (the default gathered path)."""
        return None

    def advantage_fn(self) -> Callable | None:
        """A replacement for ``core.group_advantages(rewards, group_ids, scale=, eps=, valid=)`` or None."""
        return None

    def after_advantages(self, rb: "RolloutBatch", valid: "torch.Tensor") -> None:
        """After ``rb.advantages`` / ``reward_used`` / ``zero_std`` are set (diagnostics into ``rb.info``)."""

    # ------------------------------------------------------------------ collect rounds
    def extra_rounds(self) -> int:
        """Extra sampling rounds allowed per step to refill filtered groups (0: one round)."""
        return 0

    def filter_batch(self, rb: "RolloutBatch") -> "RolloutBatch":
        """One round's batch after invalid rows left: drop rows / groups."""
        return rb

    def finish_batch(self, rb: "RolloutBatch", n_groups: int, want: int) -> tuple["RolloutBatch", int]:
        """The step's batch after all rounds (``want`` groups per process were asked for)."""
        return rb, n_groups

    # ------------------------------------------------------------------ precompute / loss
    def before_precompute(self, rb: "RolloutBatch") -> None:
        """Allocate per-token tensors (e.g. ``rb.token_weights``)."""

    def on_logits(self, rb: "RolloutBatch", idx: "torch.Tensor", logits: Any, lp: "torch.Tensor") -> None:
        """Per precompute micro-batch ``idx``: logits (or ``HeadInputs``) and (rows, T) log-probs of the old
        policy."""

    def after_precompute(self, rb: "RolloutBatch") -> None:
        """After old / reference log-probs exist (e.g. importance weights)."""

    def loss_mask(self, rb: "RolloutBatch", mask: "torch.Tensor") -> "torch.Tensor":
        """(N, T) mask of the tokens entering the loss and its normalising counts."""
        return mask

    def loss_kwargs(self, kw: dict) -> dict:
        """Keyword arguments of ``core.policy_loss`` (clip bounds, loss type, ...)."""
        return kw

    def loss_share(self, rows: int, totals: dict) -> float | None:
        """Factor turning one micro-batch's loss into its share of the step's loss, or None (the default).
        ``totals``: global ``tokens``, ``sequences``, ``rows``, ``micro_batches``."""
        return None

    def extra_loss(self, rb: "RolloutBatch", idx: "torch.Tensor", logits: Any, mask: "torch.Tensor",
                   kw: dict) -> "torch.Tensor | None":
        """Per training micro-batch (``needs_train_logits``): a scalar added to the policy loss before its
        micro-batch share (``loss_share``) is taken. ``logits``: the current policy's (rows, T, V) logits or
        ``HeadInputs`` WITH gradient; ``mask``: (rows, T) loss tokens (all zero in a weight-0 padding forward);
        ``kw``: the ``core.policy_loss`` keyword arguments (aggregation, global counts)."""
        return None

    def after_update(self) -> None:
        """After every applied optimizer update (a skipped, non-finite update does not call it)."""

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict | None:
        """The method's own state for checkpoints (tensors, numbers, strings, lists, dicts), or None."""
        return None

    def load_state_dict(self, sd: dict) -> None:
        """Restore :meth:`state_dict` on resume."""

    # ------------------------------------------------------------------ metrics
    def metrics(self, rb: "RolloutBatch", m: dict) -> None:
        """Add this step's method metrics to ``m``."""
