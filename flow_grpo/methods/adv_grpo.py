r"""Adv-GRPO (Mao et al. 2025, "The Image as Its Own Reward"; release showlab/Adv-GRPO): GRPO against a reward model
that is itself trained adversarially, with reference ("real") images as positives and the policy's own samples as
negatives, so that the policy cannot keep a score by drifting away from real images (reward hacking).

In the recipe (``method=adv_grpo`` or ``sample.credit=adv_grpo``) the policy side is plain GRPO (outcome
advantages of the configured rewards); the reward model is a reward component (``methods.adv_grpo.reward``,
default ``adv_dino``: :class:`flow_grpo.rewards.dino.AdversarialDinoReward`, a trainable head on frozen DINOv2
features) that :class:`AdvGRPO` updates through its hooks:

* after an epoch's policy update (``end_of_step``), if the schedule says so, ``methods.adv_grpo.steps`` Adam steps
  (its own optimizer: ``lr``, ``betas``) on the hinge loss :func:`flow_grpo.rewards.dino.discriminator_loss` with the
  epoch's images as negatives and one reference image per sample (its prompt's reference number ``member %
  refs_per_prompt``) as positives;
* schedule (``methods.adv_grpo.schedule``, ``every`` = k): ``alternate`` is the release's loop (its
  ``train_sd3_fast_dino*.py``): epoch e trains the reward model and makes no policy step unless (e+1) % k == 0,
  when it makes a policy step and leaves the reward model alone (k = ``d_times`` = 10 in its configs: 9 of 10
  rollouts train the reward model); the policy's step is removed by the method's ``on_advantages`` (every
  trained pair of the epoch masked, so the update is empty: no optimizer step, no EMA update).
  ``interleave``: the policy trains every epoch, the reward model after epochs with (e+1) % k == 0;
* its state (head weights, Adam state, the generator of the patch draws, the update count) is checkpointed with the
  trainer and restored exactly on resume.

Each update costs a DINO forward of the epoch's images and of their references (logged: ``adv_grpo/d_loss``,
``adv_grpo/d_acc`` (the release's CLS accuracy), ``adv_grpo/d_logit_real`` / ``adv_grpo/d_logit_fake``,
``adv_grpo/reward_updates``, ``adv_grpo/policy_epoch``).
One process only for now: the update would need the gathered images of every process (refused with a message).
"""
from __future__ import annotations

import numpy as np
import torch

from .base import FlowMethod
from .outcome import outcome_advantages

__all__ = ["policy_epoch", "reward_model_epoch", "AdvGRPO"]


def policy_epoch(schedule: str, every: int, epoch: int) -> bool:
    """Does epoch ``epoch`` (0-based) make a policy step? ``alternate``: only when (epoch+1) % every == 0."""
    return schedule != "alternate" or (epoch + 1) % every == 0


def reward_model_epoch(schedule: str, every: int, epoch: int) -> bool:
    """Is the reward model updated after epoch ``epoch``? ``alternate``: on every epoch without a policy step;
    ``interleave``: when (epoch+1) % every == 0."""
    if schedule == "alternate":
        return (epoch + 1) % every != 0
    if schedule == "interleave":
        return (epoch + 1) % every == 0
    raise ValueError(f"methods.adv_grpo.schedule must be 'alternate' or 'interleave', got {schedule!r}")


class AdvGRPO(FlowMethod):
    """Adv-GRPO in the recipe: the outcome credit; the reward model's optimizer, schedule and checkpoint state (see
    the module docstring); the release's alternation (``on_advantages``: no policy step in an epoch that trains the
    reward model); the reward-model update after the epoch's policy updates (``end_of_step``)."""

    name = "adv_grpo"

    def __init__(self, cfg, run=None):
        from mmgrpo.utils.seeding import sample_seed

        super().__init__(cfg, run)
        if run is not None and (run.sharded or run.world > 1):
            raise ValueError("sample.credit=adv_grpo runs in one process: its reward model is updated from this "
                             f"process's images only (this run has {run.world} processes)")
        self.o = cfg.methods.adv_grpo
        # the patch draws of the hinge loss: own generator (checkpointed), the run's RNG stream is left alone
        self.generator = torch.Generator().manual_seed(sample_seed(cfg.run.seed, 17))
        self.updates = 0
        self._model = None
        self.optimizer = None

    @property
    def model(self):
        """The reward component being trained (looked up on first use: the reward stack is built after the
        methods) and its Adam optimizer."""
        if self._model is None:
            name, wrapped = self.o.reward, self.run.rewards.wrapped
            if name not in wrapped:
                raise ValueError(f"methods.adv_grpo.reward={name!r} is not one of the run's rewards {sorted(wrapped)} "
                                 "(add it to reward.weights, e.g. reward.weights={mini_geneval: 1, adv_dino: 1})")
            fn = wrapped[name].fn
            if not all(hasattr(fn, a) for a in ("head", "backbone", "refs")):
                raise TypeError(f"methods.adv_grpo.reward={name!r} is a {type(fn).__name__}, not a trainable reward "
                                "model (flow_grpo.rewards.dino.AdversarialDinoReward: head, backbone, refs)")
            self._model = fn
            self.optimizer = torch.optim.Adam(fn.head.parameters(), lr=self.o.lr, betas=tuple(self.o.betas))
        return self._model

    def advantage_estimator(self):
        return outcome_advantages

    def rollout_context(self):
        """Checks the reward model before the first rollout (a wrong name fails before any sampling)."""
        import contextlib

        self.model.head.eval()
        return contextlib.nullcontext()

    def on_advantages(self, traj):
        """The release's alternation: no policy step in an epoch that trains the reward model."""
        a = self.o
        if a.schedule == "alternate" and not policy_epoch(a.schedule, a.every, self.run.state.epoch):
            traj.train_mask = torch.zeros_like(traj.train_mask)
        return traj

    def end_of_step(self, traj, metrics: dict) -> None:
        ep = self.run.state.epoch
        metrics["adv_grpo/policy_epoch"] = float(policy_epoch(self.o.schedule, self.o.every, ep))
        if traj is not None and reward_model_epoch(self.o.schedule, self.o.every, ep):
            metrics.update(self.update_from(traj))
        metrics["adv_grpo/reward_updates"] = float(self.updates)

    def update_from(self, traj) -> dict:
        """One reward-model update on a rollout: its images negative, one reference per sample positive."""
        from flow_grpo.media import to_uint8_nhwc

        neg = to_uint8_nhwc(traj.images)
        members = traj.members.tolist() if traj.members is not None else None
        pos = self.model.refs.for_samples(traj.prompts, traj.metadata, int(neg.shape[1]), members)
        return self.update(pos, neg)

    def update(self, pos_u8: np.ndarray, neg_u8: np.ndarray) -> dict:
        from flow_grpo.rewards.dino import discriminator_loss

        m, c = self.model, self.o
        cls_r, patch_r = m.backbone.tokens(pos_u8)  # frozen backbone: tokens once, ``steps`` head updates
        cls_f, patch_f = m.backbone.tokens(neg_u8)
        m.head.train()
        for _ in range(c.steps):
            loss, stats = discriminator_loss(m.head, cls_r, patch_r, cls_f, patch_f, patch_weight=c.patch_weight,
                                             n_patches=c.n_patches, generator=self.generator,
                                             normalize=not c.train_on_raw_features)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        m.head.eval()
        self.updates += 1
        return stats

    def state_dict(self) -> dict:
        m = self.model
        return {"head": {k: v.detach().cpu().clone() for k, v in m.head.state_dict().items()},
                "optimizer": self.optimizer.state_dict(), "generator": self.generator.get_state(),
                "updates": self.updates}

    def load_state_dict(self, sd: dict) -> None:
        from flow_grpo.rewards._weights import load_strict

        m = self.model
        load_strict(m.head, sd["head"], "checkpoint (methods.adv_grpo reward head)",
                    hint="the reward model's architecture (head_hidden, DINO width) differs from the checkpoint's")
        self.optimizer.load_state_dict(sd["optimizer"])
        self.generator.set_state(sd["generator"])
        self.updates = int(sd["updates"])
