r"""Adv-GRPO (Mao et al. 2025, "The Image as Its Own Reward"; release showlab/Adv-GRPO): GRPO against a reward model
that is itself trained adversarially, with reference ("real") images as positives and the policy's own samples as
negatives, so that the policy cannot keep a score by drifting away from real images (reward hacking).

In the trainer (``method=adv_grpo`` or ``sample.credit=adv_grpo``) the policy side is plain GRPO (outcome
advantages of the configured rewards); the reward model is a reward component (``methods.adv_grpo.reward``,
default ``adv_dino``: :class:`flow_grpo.rewards.dino.AdversarialDinoReward`, a trainable head on frozen DINOv2
features) that :class:`AdvGRPORuntime` updates through the credit table's runtime hook:

* after an epoch's policy update (``end_epoch``), if the schedule says so, ``methods.adv_grpo.steps`` Adam steps
  (its own optimizer: ``lr``, ``betas``) on the hinge loss :func:`flow_grpo.rewards.dino.discriminator_loss` with the
  epoch's images as negatives and one reference image per sample (its prompt's reference number ``member %
  refs_per_prompt``) as positives;
* schedule (``methods.adv_grpo.schedule``, ``every`` = k): ``alternate`` is the release's loop (its
  ``train_sd3_fast_dino*.py``): epoch e trains the reward model and makes no policy step unless (e+1) % k == 0,
  when it makes a policy step and leaves the reward model alone (k = ``d_times`` = 10 in its configs: 9 of 10
  rollouts train the reward model); the policy's step is removed by the train-mask entry ``adv_grpo_alternate``
  (every trained pair of the epoch masked, so the update is empty: no optimizer step, no EMA update).
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

from .base import Credit, CreditInputs, TrainMask, register_credit, register_train_mask
from .outcome import outcome_advantages

__all__ = ["policy_epoch", "reward_model_epoch", "AdvGRPORuntime"]


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


class AdvGRPORuntime:
    """The reward model's optimizer, schedule and checkpoint state (see the module docstring)."""

    def __init__(self, trainer):
        from mmgrpo.utils.seeding import sample_seed

        if trainer.sharded or trainer.world > 1:
            raise ValueError("sample.credit=adv_grpo runs in one process: its reward model is updated from this "
                             f"process's images only (this run has {trainer.world} processes)")
        self.trainer = trainer
        self.cfg = trainer.cfg.methods.adv_grpo
        reward_model_epoch(self.cfg.schedule, self.cfg.every, 0)  # validates the schedule name
        # the patch draws of the hinge loss: own generator (checkpointed), the run's RNG stream is left alone
        self.generator = torch.Generator().manual_seed(sample_seed(trainer.cfg.run.seed, 17))
        self.updates = 0
        self._model = None
        self.optimizer = None

    @property
    def model(self):
        """The reward component being trained (looked up on first use: the reward stack is built after the
        runtime) and its Adam optimizer."""
        if self._model is None:
            name, wrapped = self.cfg.reward, self.trainer.rewards.wrapped
            if name not in wrapped:
                raise ValueError(f"methods.adv_grpo.reward={name!r} is not one of the run's rewards {sorted(wrapped)} "
                                 "(add it to reward.weights, e.g. reward.weights={mini_geneval: 1, adv_dino: 1})")
            fn = wrapped[name].fn
            if not all(hasattr(fn, a) for a in ("head", "backbone", "refs")):
                raise TypeError(f"methods.adv_grpo.reward={name!r} is a {type(fn).__name__}, not a trainable reward "
                                "model (flow_grpo.rewards.dino.AdversarialDinoReward: head, backbone, refs)")
            self._model = fn
            self.optimizer = torch.optim.Adam(fn.head.parameters(), lr=self.cfg.lr, betas=tuple(self.cfg.betas))
        return self._model

    def rollout(self):
        """Checks the reward model before the first rollout (a wrong name fails before any sampling)."""
        import contextlib

        self.model.head.eval()
        return contextlib.nullcontext()

    def end_epoch(self, traj=None) -> dict:
        ep = self.trainer.epoch
        out = {"adv_grpo/policy_epoch": float(policy_epoch(self.cfg.schedule, self.cfg.every, ep))}
        if traj is not None and reward_model_epoch(self.cfg.schedule, self.cfg.every, ep):
            out.update(self.update_from(traj))
        out["adv_grpo/reward_updates"] = float(self.updates)
        return out

    def update_from(self, traj) -> dict:
        """One reward-model update on a rollout: its images negative, one reference per sample positive."""
        from flow_grpo.media import to_uint8_nhwc

        neg = to_uint8_nhwc(traj.images)
        members = traj.members.tolist() if traj.members is not None else None
        pos = self.model.refs.for_samples(traj.prompts, traj.metadata, int(neg.shape[1]), members)
        return self.update(pos, neg)

    def update(self, pos_u8: np.ndarray, neg_u8: np.ndarray) -> dict:
        from flow_grpo.rewards.dino import discriminator_loss

        m, c = self.model, self.cfg
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


def _alternate_active(cfg) -> bool:
    return cfg.sample.credit == "adv_grpo" and cfg.methods.adv_grpo.schedule == "alternate"


def _alternate_mask(cfg, adv: torch.Tensor, mask: torch.Tensor, inputs: CreditInputs) -> torch.Tensor:
    """The release's alternation: no policy step in an epoch that trains the reward model."""
    epoch = inputs.runtime.trainer.epoch
    a = cfg.methods.adv_grpo
    return mask if policy_epoch(a.schedule, a.every, epoch) else torch.zeros_like(mask)


register_credit(Credit("adv_grpo", outcome_advantages, runtime=AdvGRPORuntime))
register_train_mask(TrainMask("adv_grpo_alternate", _alternate_active, _alternate_mask))
