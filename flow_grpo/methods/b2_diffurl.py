r"""B²-DiffuRL (hu-zijing/B2-DiffuRL, arXiv 2503.11240; SD1.4 + DDIM η = 1): branch plans from one trajectory and the
backward-progressive training window, as pure functions.

**Branch-based sampling.** Each *trunk* is one :math:`x_T` and one sampled prefix; at step ``branch_step`` =
K - s the trunk splits into ``branches`` (release: ``split_time`` = 5) continuations with independent noise that
run to the end. The branches of a trunk share :math:`x_T` and every latent before ``branch_step``, so the difference
of their final rewards is caused only by steps ``branch_step .. K-1``: those are the steps trained
(:func:`branch_plan`). The prefix is computed once per trunk (:func:`rollout_nfe`: ``trunks * b + N * s`` forwards
instead of ``N * K``). Sampler contract: sample i uses :math:`x_T` = ``trunk_seeds[trunk_ids[i]]`` and, at step k,
the SDE noise of the base seed ``noise_seed_table(...)[i, k]`` (the trunk's seed before the branch step, the
sample's own after), so a replay of any single sample reproduces the shared prefix bit for bit.

**Backward-progressive training.** Training runs in stages; stage i of ``num_stages`` branches at
:math:`s_i=\text{left}+\lfloor i\,(\text{right}-\text{left}+1)/\text{num\_stages}\rfloor` steps before the end
(:func:`progressive_split_step`; the release's ``run_process.sh``: K = 20, left = 14, right = 20, 100 stages, 2
epochs per stage), so the trained segment starts with the last steps and grows toward the start.

**Credit** (the release's ``run_select.py`` / ``run_train.py``):

* rewards are z-scored per prompt over the current stage and the previous ``history_cnt`` (8) stages' rewards of
  that prompt: :math:`z=(R-\mu)/(\sigma+10^{-8})`, unbiased std (:func:`history_zscore`);
* within each trunk only the best branch is trained if its :math:`z\ge` ``pos_threshold`` (0.5) and the worst if
  its :math:`z<` ``neg_threshold`` (-0.5); at most two samples per trunk (:func:`select_branches`);
* advantage :math:`A=\mathrm{clip}(z,\pm5)\cdot(\beta_1\ \text{if}\ z>0\ \text{else}\ \beta_2)` (both 1), PPO-clip
  with ε = 0.1 on every step of the trained segment.

**In the recipe** (``method=b2``: ``step_mode=b2``, ``credit=b2_diffurl``; :class:`B2DiffuRL`): one trunk per group
(its :math:`x_T` from ``same_noise_per_group``, its prefix noise from the group's plan seed), the group's samples are
the branches; the stage is ``epoch // methods.b2_diffurl.epochs_per_stage``; the per-prompt history (one entry per
epoch, i.e. per sampling round as the release's stage) is the method's checkpointed state; unselected branches are left out of the
update (``optim.drop_zero_adv``).

Differences, deliberate: (1) our engine never trains the last step (σ→0: its flow-SDE Gaussian is degenerate; the
release's DDIM step is not), so the trained segment is ``[K - s, K - 1)`` (``exclude_last=False`` gives the
release's ``[K - s, K)`` for a sampler whose last step has a density); (2) a prompt whose combined history holds a
single reward gets z = 0 (the release's ``std`` of one value is NaN); (3) a pure function cannot keep the release's
``history_scores.pkl``: the caller passes the history in and stores the one returned (the recipe keeps it in
the method's state, saved in its checkpoints); (4) prompts are keyed by a hash of their text (the release: the
decoded text).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence

import torch
from torch import Tensor

from .base import FlowMethod

__all__ = [
    "BranchPlan",
    "progressive_split_step",
    "training_segment",
    "branch_plan",
    "noise_seed_table",
    "rollout_nfe",
    "history_zscore",
    "select_branches",
]


def progressive_split_step(stage: int, num_stages: int, left: int, right: int) -> int:
    """Trained trailing steps s of stage ``stage`` (0-based): ``left + stage * (right - left + 1) // num_stages``."""
    if num_stages < 1 or not 0 <= stage < num_stages:
        raise ValueError(f"stage {stage} not in [0, {num_stages})")
    if not 1 <= left <= right:
        raise ValueError(f"need 1 <= left <= right, got left={left}, right={right}")
    return left + stage * (right - left + 1) // num_stages


def training_segment(num_steps: int, split_step: int, exclude_last: bool = True) -> tuple[int, int]:
    """Trained step indices ``[K - s, hi)`` with hi = K - 1 (``exclude_last``) or K."""
    if not 1 <= split_step <= num_steps:
        raise ValueError(f"split_step {split_step} must lie in [1, {num_steps}]")
    lo, hi = num_steps - split_step, num_steps - 1 if exclude_last else num_steps
    if hi <= lo:
        raise ValueError(f"split_step={split_step} trains only the last step, which is never trained here "
                         f"(its Gaussian is degenerate): use split_step >= 2")
    return lo, hi


@dataclass
class BranchPlan:
    """N = trunks * branches samples, trunk-major (sample i = trunk ``i // branches``, branch ``i % branches``).
    ``sde_mask`` (N, K): stochastic steps (all but the last, as the release's DDIM η = 1 sampler: the trunk prefix is
    stochastic too, it is just shared); ``train_mask`` (N, K): the trained segment; ``branch_step``: first step
    whose noise differs between the branches of a trunk."""

    trunk_ids: Tensor
    branch_ids: Tensor
    branch_step: int
    sde_mask: Tensor
    train_mask: Tensor

    @property
    def num_trunks(self) -> int:
        return int(self.trunk_ids.max()) + 1 if self.trunk_ids.numel() else 0


def branch_plan(num_steps: int, split_step: int, num_trunks: int, branches: int,
                exclude_last: bool = True) -> BranchPlan:
    if branches < 2:
        raise ValueError(f"branches must be >= 2 (a single branch has nothing to compare), got {branches}")
    if num_trunks < 1:
        raise ValueError(f"num_trunks must be >= 1, got {num_trunks}")
    lo, hi = training_segment(num_steps, split_step, exclude_last)
    n = num_trunks * branches
    idx = torch.arange(n)
    sde = torch.zeros(n, num_steps, dtype=torch.bool)
    sde[:, : num_steps - 1] = True
    if not exclude_last:
        sde[:, -1] = True
    train = torch.zeros_like(sde)
    train[:, lo:hi] = True
    return BranchPlan(idx // branches, idx % branches, lo, sde, train)


def noise_seed_table(plan: BranchPlan, trunk_seeds: Sequence[int], sample_seeds: Sequence[int]) -> Tensor:
    """(N, K) int64 base seed of the SDE noise of sample i at step k: ``trunk_seeds[trunk]`` before the branch step
    (shared prefix), ``sample_seeds[i]`` from it on."""
    n, K = plan.sde_mask.shape
    if len(trunk_seeds) != plan.num_trunks or len(sample_seeds) != n:
        raise ValueError(f"need {plan.num_trunks} trunk seeds and {n} sample seeds, got {len(trunk_seeds)} and "
                         f"{len(sample_seeds)}")
    t = torch.as_tensor(list(trunk_seeds), dtype=torch.int64)[plan.trunk_ids]
    s = torch.as_tensor(list(sample_seeds), dtype=torch.int64)
    before = torch.arange(K).unsqueeze(0) < plan.branch_step
    return torch.where(before, t.unsqueeze(1), s.unsqueeze(1))


def rollout_nfe(num_steps: int, branch_step: int, num_trunks: int, branches: int) -> int:
    """Model forwards of a branched rollout (prefix once per trunk): ``trunks * branch_step + N * (K -
    branch_step)``; a flat rollout of the same N samples costs ``N * K``."""
    return num_trunks * branch_step + num_trunks * branches * (num_steps - branch_step)


def history_zscore(rewards: Tensor, keys: Sequence[Hashable], history: Sequence[Mapping[Hashable, Tensor]] = (),
                   history_cnt: int = 8, eps: float = 1e-8) -> tuple[Tensor, list[dict]]:
    """Per-prompt z-scores over the last ``history_cnt`` stages plus this one. Returns (z (N,), new history): the
    new history is the last ``history_cnt`` stages including this one (each a dict key -> rewards of that stage).
    With ``history_cnt = 0`` only the current stage is used and the returned history is empty."""
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    if len(keys) != r.shape[0]:
        raise ValueError(f"{len(keys)} keys for {r.shape[0]} rewards")
    if history_cnt < 0:
        raise ValueError(f"history_cnt must be >= 0, got {history_cnt}")
    past = list(history)[-history_cnt:] if history_cnt > 0 else []
    current: dict = {}
    for k, v in zip(keys, r.tolist()):
        current.setdefault(k, []).append(v)
    current = {k: torch.tensor(v, dtype=torch.float64) for k, v in current.items()}
    stats = {}
    for k, cur in current.items():
        combined = torch.cat([torch.as_tensor(h[k], dtype=torch.float64).flatten() for h in past if k in h] + [cur])
        stats[k] = (combined.mean(), combined.std() if combined.numel() > 1 else None)
    z = torch.zeros_like(r)
    for i, k in enumerate(keys):
        mean, std = stats[k]
        if std is not None:
            z[i] = (r[i] - mean) / (std + eps)
    new_history = (past + [current])[-history_cnt:] if history_cnt > 0 else []
    return z, new_history


def select_branches(z: Tensor, trunk_ids: Tensor, pos_threshold: float = 0.5, neg_threshold: float = -0.5,
                    adv_clip_max: float = 5.0, beta_pos: float = 1.0, beta_neg: float = 1.0) -> tuple[Tensor, Tensor]:
    """(keep (N,) bool, advantages (N,)): per trunk the first branch with the highest z if it is >=
    ``pos_threshold`` and the first with the lowest z if it is < ``neg_threshold``; the advantage of a kept sample is
    ``clip(z, ±adv_clip_max) * (beta_pos if z > 0 else beta_neg)``, 0 elsewhere."""
    if neg_threshold > pos_threshold:
        raise ValueError(f"neg_threshold ({neg_threshold}) must be <= pos_threshold ({pos_threshold})")
    z = torch.as_tensor(z, dtype=torch.float64).flatten()
    trunk_ids = torch.as_tensor(trunk_ids).flatten()
    keep = torch.zeros_like(z, dtype=torch.bool)
    for t in torch.unique(trunk_ids).tolist():
        members = torch.nonzero(trunk_ids == t).flatten()
        zz = z[members]
        best, worst = members[int(torch.argmax(zz))], members[int(torch.argmin(zz))]
        if z[best] >= pos_threshold:
            keep[best] = True
        if z[worst] < neg_threshold:
            keep[worst] = True
    adv = torch.clamp(z, -adv_clip_max, adv_clip_max) * torch.where(z > 0, beta_pos, beta_neg)
    return keep, torch.where(keep, adv, torch.zeros_like(adv))


# ------------------------------------------------------------------------------------------- the method
# One trunk per group (sample.same_noise_per_group: one x_T per group; the group's plan seed gives the shared
# prefix noise), the group's samples are the trunk's branches (data.group_size = the release's split_time, 5).
def plan_b2(cfg, plan_seeds, iteration: int, members, o):
    """step_mode=b2: every step but the last is SDE; steps before the branch step use the group's noise (shared
    prefix), later ones each sample's own; the trained segment is ``[K - s, K - 1)`` with s of the stage
    ``iteration // o.epochs_per_stage`` (capped at the last stage and at K). ``o``: ``methods.b2_diffurl``."""
    from mmgrpo.utils.seeding import sample_seed

    from .plans import StepPlan

    K = cfg.num_steps
    stage = min(iteration // max(1, o.epochs_per_stage), o.num_stages - 1)
    s = min(progressive_split_step(stage, o.num_stages, o.split_left, o.split_right), K)
    lo, hi = training_segment(K, s)
    n = len(plan_seeds)
    p = StepPlan.empty(n, K)
    p.sde_mask[:, : K - 1] = True
    p.train_mask[:, lo:hi] = True
    p.window_start[:] = lo
    trunk = torch.tensor([sample_seed(int(ps), 8) for ps in plan_seeds], dtype=torch.int64)
    own = torch.tensor([sample_seed(int(ps), 9, m) for ps, m in zip(plan_seeds, members)], dtype=torch.int64)
    p.noise_keys = torch.where(torch.arange(K).unsqueeze(0) < lo, trunk.unsqueeze(1), own.unsqueeze(1))
    return p


def b2_credit(inp, history: list, o) -> tuple:
    """Per-prompt z-scores of the valid final rewards over the last ``o.history`` epochs and this one
    (:func:`history_zscore`, unbiased std + 1e-8), then :func:`select_branches` per group (= trunk) with
    ``o.pos_threshold`` / ``o.neg_threshold`` and ``optim.adv_clip_max``; every trained step of a selected branch gets
    its advantage, the others 0 (the preset's ``optim.drop_zero_adv`` leaves them out of the update). ``history``:
    the per-prompt reward history so far; returns (CreditOutput, the new history)."""
    from .base import CreditOutput

    N, T = inp.train_mask.shape
    if inp.prompt_keys is None:
        raise ValueError("credit=b2_diffurl needs the prompts' keys (CreditInputs.prompt_keys)")
    (r_all, g_all, v_all, k_all), sl = inp.gather([inp.rewards["total"], inp.group_ids, inp.valid,
                                                    inp.prompt_keys])
    z = torch.zeros(r_all.shape[0], dtype=torch.float64)
    if bool(v_all.any()):
        zv, history = history_zscore(r_all[v_all].double(), k_all[v_all].tolist(), history, o.history)
        z[v_all] = zv
    keep, adv = select_branches(z, g_all, o.pos_threshold, o.neg_threshold, adv_clip_max=inp.opts.clamp)
    keep &= v_all
    adv = torch.where(keep, adv, torch.zeros_like(adv))
    out = adv[sl].float().unsqueeze(1).expand(N, T).clone()
    return CreditOutput(out, {"b2/selected_fraction": float(keep.float().mean())}), history


class B2DiffuRL(FlowMethod):
    """B²-DiffuRL: the trunk plan and the branch-selection credit; the per-prompt reward history of
    :func:`history_zscore` is the method's state (checkpointed), updated once per epoch by the credit."""

    name = "b2_diffurl"

    def __init__(self, cfg, run=None):
        super().__init__(cfg, run)
        self.o = cfg.methods.b2_diffurl
        self.history: list[dict] = []

    def check_sampling(self, s) -> None:
        if s.step_mode != "b2":
            raise ValueError("sample.credit=b2_diffurl needs sample.step_mode=b2")
        if s.plan_per_sample or not s.same_noise_per_group:
            raise ValueError("sample.credit=b2_diffurl needs sample.plan_per_sample=false and "
                             "same_noise_per_group=true (one trunk per group: shared x_T and prefix noise)")

    def plan(self, s, plan_seeds, iteration: int, members):
        if members is None:
            raise ValueError("step_mode=b2 needs the index of every sample in its group (members)")
        return plan_b2(s, plan_seeds, iteration, members, self.o)

    def advantage_estimator(self):
        return self.credit

    def credit(self, inp):
        out, self.history = b2_credit(inp, self.history, self.o)
        return out

    def state_dict(self) -> dict:
        return {"history": [{int(k): v.tolist() for k, v in h.items()} for h in self.history]}

    def load_state_dict(self, sd: dict) -> None:
        self.history = [{int(k): torch.tensor(v, dtype=torch.float64) for k, v in h.items()} for h in sd["history"]]
