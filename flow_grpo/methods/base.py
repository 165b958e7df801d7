"""The flow credit table: credit functions, sampling plans and train-mask functions, each a registry entry.

A *credit function* turns the rewards of a rollout into advantages, with explicit tensors in and out::

    CreditInputs(rewards {"total", components, "valid"}: (N,), step_rewards (N, S) or None, group_ids (N,),
                 valid (N,), train_mask (N, T), step_indices (T,), sigmas (T,), AdvOptions, gather, device)
        -> CreditOutput(advantages (N, T), stats)

N = this process's samples, T = the rollout's trained columns (``Trajectories.step_indices``). Statistics that
need the whole batch use ``inputs.gather`` (rows of every process, plus the slice of this process's rows). T and
the step of a column differ between processes (each trains the steps its own samples drew): gather per-sample
(N, ...) tensors, trained values (``adv[mask]``) or (N, K) tensors on the full step grid, never (N, T) columns
(``gather`` refuses tensors whose trailing dims differ between processes). A
credit that needs rewards of intermediate states (TP-GRPO, G²RPO) also has a ``step_rewards`` function that the
sampler calls after the final images are scored; it returns the (N, S) step rewards, the extra NFEs per
trajectory and an (N,) validity.

A credit may carry a ``runtime(trainer)`` hook (see :class:`Credit`): the trainer then samples inside its
``rollout()`` context, uses its ``loss`` instead of the PPO column loss, calls its ``end_epoch(traj)`` and checkpoints
its state; users: DiffusionNFT (a forward-process loss with an EMA "old" adapter), Adv-GRPO (a reward model trained
against the policy after the epoch's update).

A *sampling plan* ``plan(cfg, plan_seeds, iteration) -> StepPlan`` says which steps of each sample are SDE and
which are trained (``sample.step_mode``). A plan whose function has ``needs_members = True`` is called with a 4th
argument, each sample's index in its group (tree / branch rollouts: BranchGRPO, B²-DiffuRL), and may set
``StepPlan.noise_keys`` (N, K) so that the samples of one branch point draw the same noise before it. A *train-mask function* ``fn(cfg, advantages, mask, inputs) -> mask``
narrows the trained (sample, step) pairs after the advantages (``optim.drop_zero_adv``, best-of-n); every entry
whose ``active(cfg)`` holds is applied, in registration order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import torch


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
    sampling: Any = None                         # the rollout's SamplingConfig (method keys, e.g. sample.vgpo_*)
    members: Optional[torch.Tensor] = None       # (N,) index of each sample in its group (tree / branch credits)
    prompt_keys: Optional[torch.Tensor] = None   # (N,) int64 stable hash of each prompt (per-prompt history)
    runtime: Any = None                          # the credit's runtime object (state kept across epochs), if any


@dataclass
class CreditOutput:
    advantages: torch.Tensor  # (N, T) float32; masked afterwards by train_mask & valid
    stats: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Credit:
    """One row of the credit table (see the module docstring)."""

    name: str
    advantages: Callable[[CreditInputs], CreditOutput]
    step_rewards: Optional[Callable] = None     # (adapter, traj, embeds, sig, reward_fn, weights, r_final)
    check: Optional[Callable[[Any], None]] = None  # (SamplingConfig) -> None, raises on a plan it cannot use
    keeps_ode_next: bool = False                # the rollout stores x_k + (s_{k+1} - s_k) v(x_k) per column
    # runtime(trainer) -> object, for a method that is not a reverse-process policy gradient (DiffusionNFT): any of
    # rollout() (context manager around sampling, e.g. another set of weights), loss(traj, chunk, col, adv,
    # n_global, dummy) -> (loss, metrics, kl, count) replacing the PPO column loss, end_epoch(traj) after the epoch's
    # updates (the epoch's Trajectories; returns metrics), state_dict() / load_state_dict(sd) (checkpointed with the
    # trainer). Users: DiffusionNFT (old adapter), Adv-GRPO (the adversarial reward model's update)
    runtime: Optional[Callable[[Any], Any]] = None


@dataclass(frozen=True)
class TrainMask:
    name: str
    active: Callable[[Any], bool]                      # (TrainConfig) -> bool
    fn: Callable[..., torch.Tensor]                    # (TrainConfig, adv, mask, CreditInputs) -> mask


CREDITS: dict[str, Credit] = {}
PLANS: dict[str, Callable] = {}
TRAIN_MASKS: dict[str, TrainMask] = {}


def register_credit(credit: Credit) -> Credit:
    if credit.name in CREDITS:
        raise ValueError(f"credit {credit.name!r} is registered twice")
    CREDITS[credit.name] = credit
    return credit


def register_plan(name: str):
    def deco(fn):
        if name in PLANS:
            raise ValueError(f"sampling plan {name!r} is registered twice")
        PLANS[name] = fn
        return fn
    return deco


def register_train_mask(entry: TrainMask) -> TrainMask:
    if entry.name in TRAIN_MASKS:
        raise ValueError(f"train mask {entry.name!r} is registered twice")
    TRAIN_MASKS[entry.name] = entry
    return entry


def get_credit(name: str) -> Credit:
    if name not in CREDITS:
        raise ValueError(f"unknown credit {name!r}: {' | '.join(CREDITS)}")
    return CREDITS[name]


def credit_name(credit: str, reward_mode: str) -> str:
    """The table row of ``sample.credit`` under ``reward.mode``: GDPO's per-reward normalisation
    (``reward.mode=per_reward``) is the outcome credit computed on the reward components."""
    return "per_reward" if credit == "outcome" and reward_mode == "per_reward" else credit


def active_train_masks(cfg) -> list[TrainMask]:
    """The train-mask functions ``cfg`` turns on, in registration order (``active`` validates their options, so
    the trainer calls this before training)."""
    return [entry for entry in TRAIN_MASKS.values() if entry.active(cfg)]


def apply_train_masks(cfg, adv: torch.Tensor, mask: torch.Tensor, inputs: CreditInputs) -> torch.Tensor:
    """Every active train-mask function, in registration order."""
    for entry in active_train_masks(cfg):
        mask = entry.fn(cfg, adv, mask, inputs)
    return mask


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
