"""What the flow recipe (:mod:`flow_grpo.train.trainer`) hands to a method, on top of the shared protocol
(:class:`mmgrpo.engine.method.Method`, whose docstring lists the stage hooks and which methods use each):

* :class:`FlowMethod`: the protocol with the flow's batch (:class:`~flow_grpo.sampler.Trajectories`, N samples, T
  trained columns) and the declarations the sampler reads (ODE completions of intermediate states, the Euler step
  they start from, a method's own sampling plan);
* a credit's ``advantage_estimator()`` returns a function of explicit tensors::

    CreditInputs(rewards {"total", components, "valid"}: (N,), step_rewards (N, S) or None, group_ids (N,),
                 valid (N,), train_mask (N, T), step_indices (T,), sigmas (T,), AdvOptions, gather, device)
        -> CreditOutput(advantages (N, T), stats)

  N = this process's samples, T = the rollout's trained columns (``Trajectories.step_indices``). Statistics that
  need the whole batch use ``inputs.gather`` (rows of every process, plus the slice of this process's rows). T and
  the step of a column differ between processes (each trains the steps its own samples drew): gather per-sample
  (N, ...) tensors, trained values (``adv[mask]``) or (N, K) tensors on the full step grid, never (N, T) columns
  (``gather`` refuses tensors whose trailing dims differ between processes);
* a method that replaces the policy loss (DiffusionNFT) returns from ``loss()`` a function ``(traj, chunk, col,
  adv, n_global, dummy) -> (loss, metrics, kl, count)`` of one micro-batch (rollout chunk x trained column).

A credit that needs rewards of intermediate states (TP-GRPO, G²RPO, VGPO) sets ``has_step_rewards`` and implements
:meth:`FlowMethod.step_rewards`, which the sampler calls after the final images are scored; it returns the (N, S)
step rewards, the extra NFEs per trajectory and an (N,) validity. A method with its own sampling plan (registry
``plan``: BranchGRPO's tree, B²-DiffuRL's trunk, DiffusionNFT's timesteps) implements :meth:`FlowMethod.plan`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Optional

import torch

from mmgrpo.engine.method import Method


@dataclass(frozen=True)
class AdvOptions:
    """Group statistics of the advantages (``optim.adv_scale``, ``adv_clip_max``, ``adv_eps``, ``adv_std_ddof``)."""

    scale: str = "group"
    clamp: float = 5.0
    eps: float = 1e-4
    unbiased: bool = True

    def kw(self) -> dict:
        return dict(scale=self.scale, clamp=self.clamp, eps=self.eps, unbiased=self.unbiased)

    @classmethod
    def from_optim(cls, o) -> "AdvOptions":
        """From ``optim.*``; ``adv_std_ddof`` 0 = population std (np.std), 1 = Bessel-corrected (torch.std)."""
        return cls(o.adv_scale, o.adv_clip_max, o.adv_eps, o.adv_std_ddof == 1)


def local_gather(tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], slice]:
    """``gather`` of one process: the rows themselves."""
    return list(tensors), slice(0, tensors[0].shape[0])


@dataclass
class CreditInputs:
    rewards: Mapping[str, torch.Tensor]     # (N,) per name: "total" (the scalar reward), components, "valid"
    group_ids: torch.Tensor                 # (N,) long, global group ids
    valid: torch.Tensor                     # (N,) bool: samples with a usable reward
    train_mask: torch.Tensor                # (N, T) bool: the plan's trained steps
    step_indices: torch.Tensor              # (T,) step index k of each trained column
    sigmas: torch.Tensor                    # (T,) sigma_k of each trained column
    opts: AdvOptions = field(default_factory=AdvOptions)
    weights: Mapping[str, float] = field(default_factory=dict)  # reward component weights
    step_rewards: Optional[torch.Tensor] = None  # (N, S) rewards of intermediate states (credits that have them)
    gather: Callable[[list], tuple[list, slice]] = local_gather
    device: Any = "cpu"
    sampling: Any = None                         # the rollout's SamplingConfig (num_steps, the plan)
    members: Optional[torch.Tensor] = None       # (N,) index of each sample in its group (tree / branch credits)
    prompt_keys: Optional[torch.Tensor] = None   # (N,) int64 stable hash of each prompt (per-prompt history)


@dataclass
class ColumnContext:
    """One micro-batch of the default policy loss (rollout chunk x trained column), handed to
    :meth:`FlowMethod.adjust_log_ratio` and ``on_loss(ctx, loss)``: ``out`` the current policy's step Gaussian
    (:class:`~flow_grpo.sde.SDEStepOutput`, B rows), ``velocity`` (B, *latent), ``mask`` (B,) bool trained pairs,
    ``n_global`` the loss normaliser (trained pairs of the update over all processes)."""

    run: Any
    traj: Any
    chunk: tuple
    col: int
    out: Any
    velocity: torch.Tensor
    mask: torch.Tensor
    n_global: float


@dataclass
class CreditOutput:
    advantages: torch.Tensor  # (N, T) float32; masked afterwards by train_mask & valid
    stats: dict = field(default_factory=dict)


class FlowMethod(Method[Any]):  # the batch: flow_grpo.sampler.Trajectories (not imported: it imports the plans)
    """A flow method. ``cfg``: the run's TrainConfig (its options: ``cfg.methods.<name>``); ``run``: the
    :class:`~flow_grpo.train.trainer.FlowGRPOTrainer`, or None when a method serves the sampler alone (tests,
    scripts)."""

    #: the sampler scores ODE completions of intermediate states: :meth:`step_rewards`
    has_step_rewards: ClassVar[bool] = False
    #: the rollout stores x_k + (s_{k+1} - s_k) v(x_k) per trained column (completions start from it)
    keeps_ode_next: ClassVar[bool] = False
    #: the rollout stores the mean of each trained transition's Gaussian under the sampling policy
    #: (``Trajectories.old_means``, (N, T, *latent)): GRPO-Guard's ratio needs the old mean
    keeps_means: ClassVar[bool] = False
    #: ``on_advantages`` leaves out every trajectory whose advantages are all 0 (an epoch without any reward signal
    #: then has empty updates, not skipped optimizer steps)
    drops_zero_advantages: ClassVar[bool] = False

    def adjust_log_ratio(self, ctx: "ColumnContext", log_ratio: torch.Tensor) -> torch.Tensor:
        """The default policy loss (:func:`flow_grpo.train.steps.column_loss`): the (B, 1) log importance ratio of one
        micro-batch before it is clipped; a method may replace it (GRPO-Guard's normalised ratio)."""
        return log_ratio

    def check_sampling(self, s) -> None:
        """Refuse a rollout configuration (``SamplingConfig``) the method cannot use."""

    def step_rewards(self, adapter, traj, embeds, sig, reward_fn, weights, r_final):
        """(N, S) rewards of intermediate states, completion NFEs per trajectory, (N,) validity."""
        raise NotImplementedError(f"{self.name} scores no intermediate states")

    def plan(self, s, plan_seeds, iteration: int, members):
        """The method's own sampling plan (``sample.step_mode`` = its registry ``plan``): a StepPlan."""
        raise NotImplementedError(f"{self.name} has no sampling plan of its own")


def group_stats(inp: CreditInputs) -> dict:
    """Groups of the gathered batch left empty / with one valid member (advantage 0), and invalid samples."""
    (g_all, v_all), _ = inp.gather([inp.group_ids, inp.valid])
    counts = torch.bincount(torch.unique(g_all, return_inverse=True)[1], weights=v_all.double())
    return {"adv/groups_empty": float((counts == 0).sum()),      # every member dropped: no sample trains
            "adv/groups_singleton": float((counts == 1).sum()),  # one member left: no baseline -> A = 0
            "reward/invalid": float((~v_all).sum())}


def advantage_stats(adv: torch.Tensor, mask: torch.Tensor, gather) -> dict:
    """Mean |A|, std, max and min of the trained (sample, step) advantages of the gathered batch.

    Only the trained values are gathered (1-D, in (sample, step) order): each process's (N, T) columns are the steps
    *its* samples train, so T and the meaning of a column differ between processes (per-sample / per-group plans:
    fast, dance, g2rpo, tp_grpo, ...). Rows in rank order and columns in step order give the single-process order."""
    (trained,), _ = gather([adv[mask]])
    return {"adv/mean_abs": float(trained.abs().mean()) if trained.numel() else 0.0,
            "adv/std": float(trained.std()) if trained.numel() > 1 else 0.0,
            "adv/max": float(trained.max()) if trained.numel() else 0.0,
            "adv/min": float(trained.min()) if trained.numel() else 0.0}
