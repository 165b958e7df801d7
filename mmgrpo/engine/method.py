"""One method protocol for both recipes (:mod:`mmgrpo.vlm.train.trainer`, :mod:`flow_grpo.train.trainer`).

A method is a :class:`Method` subclass in its own module that overrides the hooks it needs; every hook is a no-op
by default, so each recipe calls every enabled method at every named stage, in registry order, without knowing
which methods exist (and never probes for a hook). The batch type ``B`` is the front-end's: a
:class:`~mmgrpo.vlm.data.batch.RolloutBatch` (VLM: N completions, T tokens) or a
:class:`~flow_grpo.sampler.Trajectories` (flow: N images, T trained denoising steps).

=======================  =============================================  ==============================================
stage (in step order)    hook                                           used by (VLM / flow)
=======================  =============================================  ==============================================
setup (once)             ``check(cfg)`` (classmethod, before the model  every method that validates options
                         loads); ``advantage_estimator()`` and          NGRPO, GDPO, TempSamp-R1 anchor / every credit;
                         ``loss()``: replace the default estimator or   Reg-GRPO / DiffusionNFT
                         the default policy loss (one method each)
train start              ``on_train_start(resumed)``                    data selection / Adv-GRPO
epoch start              ``on_epoch(epoch)``                            data selection (re-selects) / -
before the rollout       ``before_rollout(step, prompts)``              hybrid CoT, DeepVideo-R1 augmentation / -
around the rollout       ``rollout_context()``                          - / DiffusionNFT (old weights sample)
after the rollout        ``after_rollout(rows)``                        TempSamp-R1 (ground-truth member) / -
rewards                  ``on_rewards(batch)``                          T-GRPO, DAPO overlong, hybrid CoT, ... / reward
                                                                        ensembles, PAR, log-tamed aggregation
advantages               ``on_advantages(batch)``                       SEED-GRPO, DAPO filter, overlong mask / train
                                                                        masks (best-of-n, tree width, ...)
old log-probs            ``on_logits(batch, rows, logits, logp)`` per   TW-GRPO, token entropy / -
                         micro-batch; ``on_logprobs(batch)``            token entropy, vLLM IS / -
loss                     ``on_loss(inputs, loss)``                      entropy bonus / GARDO's gated KL (flow's
                                                                        ``adjust_log_ratio``: GRPO-Guard)
optimizer step           ``after_optimizer_step()``                     reference sync / GARDO (reference reset check)
end of step              ``end_of_step(batch, metrics)``                every method's metrics / DiffusionNFT old
                                                                        adapter, Adv-GRPO reward model
checkpoint               ``state_dict()`` / ``load_state_dict(sd)``     augmentation, reference sync / NFT, Adv-GRPO,
                                                                        B2-DiffuRL
=======================  =============================================  ==============================================

A method's options are a dataclass, the config section ``methods.<name>`` (declared next to the method's registry
entry, so that ``--help`` lists them without importing torch). The math of a method is plain functions of tensors
in its module, tested against values computed by hand; the hooks only wire them to the batch.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, ClassVar, ContextManager, Generic, TypeVar

B = TypeVar("B")  # the front-end's batch

__all__ = ["Method"]


class Method(Generic[B]):
    """Base of every method of both front-ends: the stage hooks of the module docstring, each a no-op.

    ``cfg`` is the run's whole config (the method reads its own section, ``cfg.methods.<name>``, and whatever shared
    settings it depends on); ``run`` is the recipe's run object (the model, the policy, the rollout backend, ...),
    for the few methods that act on them."""

    #: the registry name (metrics, error messages, the checkpoint entry of the method's state)
    name: ClassVar[str] = ""

    def __init__(self, cfg: Any, run: Any):
        self.cfg, self.run = cfg, run

    # ------------------------------------------------------------------ setup
    @classmethod
    def check(cls, cfg: Any) -> None:
        """Refuse options / combinations the method cannot run with, before the model loads."""

    def advantage_estimator(self) -> Callable | None:
        """The function that replaces the default group advantages, or None (the front-end says its signature)."""
        return None

    def loss(self) -> Callable | None:
        """The function that replaces the default policy loss, or None (the front-end says its signature)."""
        return None

    # ------------------------------------------------------------------ stage hooks
    def on_train_start(self, resumed: bool) -> None:
        """Before the first step of the run (``resumed``: the state came from a checkpoint)."""

    def on_epoch(self, epoch: int) -> None:
        """When the prompt stream begins epoch ``epoch`` > 0 (every process at the same point of the stream)."""

    def before_rollout(self, step: int, prompts: list) -> list:
        """The prompts about to be sampled; may return rebuilt ones (another system prompt, perturbed media)."""
        return prompts

    def rollout_context(self) -> ContextManager:
        """A context the rollout runs in (e.g. another set of weights swapped in)."""
        return contextlib.nullcontext()

    def after_rollout(self, rows: list) -> list:
        """The sampled rows, before scoring; may add members (e.g. a ground-truth completion per group)."""
        return rows

    def on_rewards(self, batch: B) -> None:
        """After scoring, before the advantages: change rewards (bonuses, shaping), validity, ``batch.info``."""

    def on_advantages(self, batch: B) -> B:
        """After the advantages: scale them, narrow what is trained (loss / train mask), drop rows or groups."""
        return batch

    def on_logits(self, batch: B, rows: Any, logits: Any, logp: Any) -> None:
        """Per micro-batch of the old-policy forward (the method asked for logits): per-token tensors."""

    def on_logprobs(self, batch: B) -> None:
        """After the old and reference log-probs of the whole batch exist (e.g. importance weights)."""

    def on_loss(self, inputs: Any, loss: Any) -> Any:
        """Per training micro-batch: the policy loss, returned with the method's term added."""
        return loss

    def after_optimizer_step(self) -> None:
        """After every applied optimizer step (a skipped, non-finite one does not call it)."""

    def end_of_step(self, batch: B, metrics: dict) -> None:
        """After the step's updates: add the method's metrics to ``metrics``, update its own state."""

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict | None:
        """The method's own state for checkpoints (tensors, numbers, strings, lists, dicts), or None."""
        return None

    def load_state_dict(self, sd: dict) -> None:
        """Restore :meth:`state_dict` on resume."""
