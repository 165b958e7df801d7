"""Sampling plans (``sample.step_mode``): which steps of each sample are SDE and which are trained. One function per
plan here (:data:`PLANS`), or a method's own (its registry entry's ``plan``, :meth:`FlowMethod.plan`); the sampler
calls :func:`make_step_plan`.

=================  =====================================================  ==============================
``step_mode``      SDE steps / trained steps (the last step is never)      method
=================  =====================================================  ==============================
``all``            all but the last / all but the last                     Flow-GRPO, TP-GRPO (full)
``fraction``       all but the last / int((K-1) f) random steps             DanceGRPO (``timestep_fraction``)
``window``         ``[w0, w0+n)`` / same; ODE elsewhere                    Flow-GRPO-Fast, MixGRPO, TP-GRPO
``single``         one step k / k; ODE elsewhere                           G²RPO
``nft``            none (deterministic rollouts) / sampled at training     DiffusionNFT (``methods/nft.py``)
``tree``           the split steps of a per-group tree / same              BranchGRPO (``methods/branch_grpo.py``)
``b2``             a shared trunk, branches K-s steps before the end        B²-DiffuRL (``methods/b2_diffurl.py``)
=================  =====================================================  ==============================
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from mmgrpo.utils.seeding import sample_seed



def _sample_seed(base: int, *coords: int) -> int:
    return sample_seed(int(base), *[int(c) for c in coords])


@dataclass
class StepPlan:
    sde_mask: torch.Tensor    # (N, K) bool: step k of sample i is stochastic
    train_mask: torch.Tensor  # (N, K) bool: step k of sample i is trained (subset of sde_mask, never the last)
    window_start: torch.Tensor  # (N,) long: first SDE step (window/single), 0 otherwise
    # optional (N, K) int64: the SDE noise of sample i at step k is drawn from sample_seed(noise_keys[i, k], k)
    # instead of sample_seed(noise_seeds[i], k); plans that share a prefix between samples (tree / branch
    # rollouts) give the samples of a branch point the same keys before it
    noise_keys: Optional[torch.Tensor] = None

    @classmethod
    def empty(cls, n: int, K: int) -> "StepPlan":
        return cls(torch.zeros(n, K, dtype=torch.bool), torch.zeros(n, K, dtype=torch.bool),
                   torch.zeros(n, dtype=torch.long))

def fraction_train_count(num_steps: int, fraction: float) -> int:
    """Steps trained per sample in ``fraction`` mode: ``int((K-1) * f)``, rounded down as DanceGRPO's
    ``int(len(timesteps) * timestep_fraction)`` (K=16, f=0.5: 7). A count of 0 is an error here (the release would
    silently train nothing)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"sample.timestep_fraction must be in (0, 1], got {fraction}")
    m = int((num_steps - 1) * fraction)
    if m < 1:
        raise ValueError(f"sample.timestep_fraction={fraction} trains int(({num_steps}-1)*{fraction}) = 0 steps per "
                         f"sample: raise sample.timestep_fraction or sample.num_steps")
    return m


def window_bounds(cfg) -> tuple[int, int]:
    """The window range ``[lo, hi)`` of ``cfg``: negative bounds count from K (``-2`` = K-2), hi is capped at K-1."""
    K = cfg.num_steps
    lo, hi = (int(b) + K if int(b) < 0 else int(b) for b in cfg.window_range)
    return lo, min(hi, K - 1)


def sliding_window(iteration: int, lo: int, hi: int, size: int, shift_every: int, stride: int,
                   wrap: bool = False) -> tuple[int, int]:
    """Steps ``[start, end)`` of the sliding SDE window at sampling iteration ``iteration`` (0-based).

    MixGRPO's progressive schedule (``wrap=False``; its GRPOTrainingStates with prog_overlap and roll_back): the
    start moves from ``lo`` by ``stride`` every ``shift_every`` iterations; the window is ``[start, min(start + size,
    hi))``, so it shrinks near ``hi`` and is empty for the whole interval in which ``start == hi``; once the start
    would pass ``hi`` it rolls back to ``lo``. The starts are therefore ``lo, lo + stride, ..., lo + J*stride`` with
    ``J = (hi - lo) // stride``; a stride that does not divide ``hi - lo`` restarts at ``lo`` without an empty window.
    The release sets ``lo = 0, hi = K-2`` (steps K-2 and K-1 are never SDE).

    ``wrap=True`` (the project's earlier schedule, not MixGRPO): full-size windows only, the start cycles through
    ``lo + (moves * stride) mod (hi - size - lo + 1)``."""
    moves = iteration // max(1, shift_every)
    if wrap:
        start = lo + (moves * stride) % (hi - size - lo + 1)
        return start, start + size
    start = lo + (moves % ((hi - lo) // stride + 1)) * stride
    return start, min(start + size, hi)



def make_step_plan(cfg, plan_seeds: Sequence[int], iteration: int = 0, members: Optional[Sequence[int]] = None,
                   method=None) -> StepPlan:
    """Per-sample SDE/train masks (pure function of the config, the seeds and the sampling ``iteration``, the epoch
    counter that drives the sliding window). The last step is never trained; ODE in every mode (its Gaussian is
    degenerate / too sharp). A plan that belongs to a method (``tree``, ``b2``, ``nft``) is that method's
    :meth:`~flow_grpo.methods.base.FlowMethod.plan` (``method``: the run's credit method)."""
    if cfg.num_steps < 2:
        raise ValueError("num_steps must be >= 2 (the last step is never trained)")
    if cfg.step_mode in PLANS:
        return PLANS[cfg.step_mode](cfg, plan_seeds, iteration)
    from . import REGISTRY, plan_names

    owner = next((s.name for s in REGISTRY if s.plan == cfg.step_mode), None)
    if owner is None:
        raise ValueError(f"unknown step_mode {cfg.step_mode!r}: {' | '.join(plan_names())}")
    if method is None or method.name != owner:
        raise ValueError(f"sample.step_mode={cfg.step_mode} is the sampling plan of {owner}: set sample.credit={owner}")
    if members is not None:
        members = [int(m) for m in members]
        if len(members) != len(plan_seeds):
            raise ValueError(f"step_mode={cfg.step_mode}: {len(members)} members for {len(plan_seeds)} samples")
    return method.plan(cfg, plan_seeds, iteration, members)


def plan_all(cfg, plan_seeds: Sequence[int], iteration: int) -> StepPlan:
    p = StepPlan.empty(len(plan_seeds), cfg.num_steps)
    p.sde_mask[:, :-1] = True
    p.train_mask[:, :-1] = True
    return p


def plan_fraction(cfg, plan_seeds: Sequence[int], iteration: int) -> StepPlan:
    K = cfg.num_steps
    p = StepPlan.empty(len(plan_seeds), K)
    p.sde_mask[:, :-1] = True
    m = fraction_train_count(K, cfg.timestep_fraction)
    for i, s in enumerate(plan_seeds):
        g = torch.Generator().manual_seed(_sample_seed(s, 1))
        p.train_mask[i, torch.randperm(K - 1, generator=g)[:m]] = True
    return p


def plan_window(cfg, plan_seeds: Sequence[int], iteration: int) -> StepPlan:
    p = StepPlan.empty(len(plan_seeds), cfg.num_steps)
    lo, hi = window_bounds(cfg)
    w = int(cfg.window_size)
    if w < 1 or hi - lo < w or lo < 0:
        raise ValueError(f"window of size {w} does not fit in window_range [{lo}, {hi}) "
                         f"(negative bounds count from num_steps; the range is capped at num_steps-1="
                         f"{cfg.num_steps - 1})")
    if cfg.window_policy in ("sliding", "sliding_wrap") and int(cfg.window_stride) < 1:
        raise ValueError(f"sample.window_stride must be >= 1, got {cfg.window_stride}")
    n_starts = hi - w - lo + 1
    for i, s in enumerate(plan_seeds):
        if cfg.window_policy == "fixed":
            w0, w1 = lo, lo + w
        elif cfg.window_policy == "random":
            g = torch.Generator().manual_seed(_sample_seed(s, 2))
            w0 = lo + int(torch.randint(n_starts, (1,), generator=g))
            w1 = w0 + w
        elif cfg.window_policy in ("sliding", "sliding_wrap"):
            w0, w1 = sliding_window(iteration, lo, hi, w, cfg.window_shift_every, int(cfg.window_stride),
                                    wrap=cfg.window_policy == "sliding_wrap")
        else:
            raise ValueError(f"unknown window_policy {cfg.window_policy!r}: fixed | random | sliding | "
                             f"sliding_wrap")
        p.sde_mask[i, w0:w1] = True
        p.train_mask[i, w0:w1] = True
        p.window_start[i] = w0
    return p


def plan_single(cfg, plan_seeds: Sequence[int], iteration: int) -> StepPlan:
    last = cfg.num_steps - 1
    p = StepPlan.empty(len(plan_seeds), cfg.num_steps)
    cands = [int(k) for k in cfg.single_steps if 0 <= int(k) < last]
    if not cands:
        raise ValueError(f"single_steps {cfg.single_steps} has no step in [0, {last})")
    for i, s in enumerate(plan_seeds):
        g = torch.Generator().manual_seed(_sample_seed(s, 3))
        k = cands[int(torch.randint(len(cands), (1,), generator=g))]
        p.sde_mask[i, k] = True
        p.train_mask[i, k] = True
        p.window_start[i] = k
    return p


#: the plans of this module, by ``sample.step_mode`` (methods add theirs: :data:`flow_grpo.methods.REGISTRY`)
PLANS = {"all": plan_all, "fraction": plan_fraction, "window": plan_window, "single": plan_single}
