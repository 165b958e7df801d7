r"""BranchGRPO (Fredreic1849/BranchGRPO, FLUX): tree rollouts, reward fusion, depth-wise advantages, pruning.

Pure functions on an explicit tree; nothing here runs a model.

**Tree rollout.** One tree per prompt. The root is :math:`x_T`; every denoising step k = 0..K-1 turns each node at
depth k into its children at depth k+1: ``branching`` (2) children with independent noise if k is a split point,
one child otherwise. So depth = number of steps taken, and every node at depth d < K has a model forward at step d.
With split points S, the number of nodes entering step k is :math:`n_k=b^{|\{s\in S:s<k\}|}` and the tree has
:math:`b^{|S|}` leaves (the group). Nodes are numbered in the release's creation order: by depth, then parent, then
child index (:func:`build_tree`). Release defaults (``finetune_flux_branchgrpo_8gpus.sh``): K = 20, S = {0, 3, 6, 9}
(16 leaves), η = 0.3 (DanceGRPO's SDE), shift 3, clip range 1e-3, adv clip 5, lr 1e-5.

**Split noise.** The release draws the noise of a split step as :math:`\xi\cdot` ``split_noise_scale`` (4.0 in its
script) but scores the child with the *unscaled* Gaussian, so the stored log-prob is not the density the child was
drawn from (the on-policy ratio is still 1, both sides use the same Gaussian). :class:`TreePlan` carries the scale;
1.0 (our default) keeps the log-prob exact, 4.0 reproduces the release.

**Reward fusion** (:func:`fuse_rewards`): leaves carry the image rewards; an internal node gets the mean reward of
its leaf descendants (``mode="mean"``), or ``mode="prob"`` (``--tree_prob_weighted``): bottom-up,
:math:`R(n)=\sum_c \mathrm{softmax}_c(\alpha\,\ell_c)\,R(c)` over its children c with :math:`\ell_c` the child edge's
log-prob, α = 1; a single child passes its reward up.

**Depth-wise advantages** (:func:`depth_advantages`): within one tree, the nodes of each depth are z-scored together,
:math:`A=(R-\mu_d)/(\sigma_d+10^{-8})` with the unbiased std (``torch.std``); a depth with one node, or with
:math:`\sigma_d<10^{-6}`, gets A = 0. Each edge parent -> child is a training transition (the parent's latent and
step, the child's latent and log-prob) with the **child's** advantage, clipped to ±5 in the PPO loss.

**Pruning** (training only; sampling and rewards are unchanged), applied while ``step <= int(max_steps *
pruning_step_ratio)`` (:func:`should_prune`):

* depth pruning (:func:`depth_pruning_depths`): drop the edges whose child depth is in a set; with sliding, the set
  moves up by ``step // interval`` (capped so its shallowest depth stops at ``stop_depth``, default the last split
  point);
* width pruning (:func:`width_pruning_keep`), on the edges after the last split (parent depth > last split):
  mode 1 groups them by their ancestor at depth last_split + 1 (i.e. by the chain that leads to one leaf) and keeps
  the best ``max(1, int(n * ratio))`` of each group by advantage; mode 2 keeps, over all of them,
  ``max(2, int(n * ratio))`` edges: the best half (rounded down) and the worst rest.

**Cost** (:func:`tree_cost`): rollout NFEs :math:`\sum_k n_k` per tree vs K per flat trajectory; trained transitions
= edges of the trained steps (:math:`\sum_{k\in\text{train}} n_{k+1}`) vs the trained steps per flat trajectory; both
also per leaf (per effective sample: a final image with a reward). Example (K = 20, S = {0, 3, 6, 9}, b = 2): 203
rollout NFEs for 16 leaves = 12.69 per leaf vs 20 flat.

**Flat layout** (for a sampler that stores one trajectory per leaf): leaf i's step k is the edge into node
``leaf_paths(tree)[i, k]``; the leaves of one node share its noise if each step draws its noise from a seed of that
child node (``node_seeds[leaf_paths]``), so every shared prefix is reproduced exactly and can be computed once
(prefix cache) or recomputed (no NFE saving). Each edge is trained once, by the first leaf through it
(:func:`edge_owner`), with the child's advantage (:func:`leaf_step_advantages`).

**In the recipe** (``method=branch_grpo``: ``step_mode=tree``, ``credit=branch_grpo``; :class:`BranchGRPO`): one tree
per group, the
group's samples are its leaves in the flat layout (``data.group_size`` must equal the leaf count), the shared root
is the group's :math:`x_T` (``same_noise_per_group``) and the plan's noise keys make every shared edge identical.
Mean fusion, depth pruning (sliding by epoch; the release slides by optimizer step) and width pruning (the
method's ``on_advantages``, every epoch: the release's ``pruning_step_ratio`` window is not wired) are wired; ``prob`` fusion
exists here as a tested function but is not wired (the credit inputs carry no edge log-probs). The sampler evaluates each
node once (``sample.shared_prefix``, default on: rows of a rollout chunk whose latent and conditioning are bitwise
equal at a step share one model call), so the logged ``nfe_per_trajectory`` is the tree's count (12.69 per leaf at the
release setting) when a chunk (``sample.batch_size``) holds whole trees; ``tree/rollout_nfe_per_leaf_shared`` gives
the release's count for comparison. ``sample.shared_prefix=false`` recomputes each prefix per leaf (K per leaf); the
two agree to float rounding (the smaller model batch of a shared step), not bit for bit.

Differences from the release, deliberate: ties in width pruning are broken by node number (the release's order is
its depth-first transition list); mode 2 on a single edge keeps it once (the release lists it twice); the
``use_group`` path of the release (leaf-level group advantages, internal nodes without one) is not reproduced: it
leaves internal nodes' advantage ``None`` and fails when they are trained. The release's mixed ODE/SDE tree
(``--mix_ode_sde_tree``, off in its script) is not implemented here.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import torch
from torch import Tensor

from .base import FlowMethod

__all__ = [
    "Tree",
    "TreePlan",
    "TreeCost",
    "parse_split_points",
    "build_tree",
    "tree_cost",
    "fuse_rewards",
    "depth_advantages",
    "edge_advantages",
    "should_prune",
    "depth_pruning_depths",
    "width_pruning_keep",
    "leaf_paths",
    "edge_owner",
    "leaf_step_advantages",
]


def parse_split_points(num_steps: int, points: Optional[Sequence[int]] = None, rounds: int = 4) -> list[int]:
    """Split steps of the release's ``parse_split_points``: explicit points clamped to [0, K-1] and sorted, else
    ``rounds`` uniform points ``i * (K // rounds)``. Duplicates are removed (the release keeps them in the list, but
    a step splits once however often it is listed)."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if points is not None and len(points) > 0:
        return sorted({min(max(int(p), 0), num_steps - 1) for p in points})
    if rounds <= 0:
        return []
    interval = num_steps // rounds
    return sorted({min(i * interval, num_steps - 1) for i in range(rounds)})


@dataclass
class Tree:
    """A rollout tree. ``parent`` (M,) long (-1 for the root), ``depth`` (M,) long; node m's incoming edge is the
    step ``depth[m] - 1`` transition from ``parent[m]``. Nodes are ordered by depth, then parent, then child."""

    parent: Tensor
    depth: Tensor
    num_steps: int
    split_points: tuple

    @property
    def num_nodes(self) -> int:
        return int(self.parent.shape[0])

    def nodes_at(self, d: int) -> Tensor:
        return torch.nonzero(self.depth == d).flatten()

    @property
    def leaves(self) -> Tensor:
        return self.nodes_at(self.num_steps)

    def children(self, m: int) -> Tensor:
        return torch.nonzero(self.parent == m).flatten()

    def ancestor_at(self, m: int, d: int) -> int:
        """The ancestor of node m at depth d <= depth[m] (m itself if equal)."""
        while int(self.depth[m]) > d:
            m = int(self.parent[m])
        return m


@dataclass
class TreePlan:
    """What a sampler needs: the tree and, per step, the node count and whether it splits."""

    tree: Tree
    branching: int
    split_noise_scale: float = 1.0

    def nodes_entering(self, k: int) -> int:
        return int((self.tree.depth == k).sum())

    def splits(self, k: int) -> bool:
        return k in self.tree.split_points


def build_tree(num_steps: int, split_points: Iterable[int], branching: int = 2) -> Tree:
    """The complete tree of a rollout with K = ``num_steps`` steps that splits into ``branching`` children at each
    split step (see the module docstring)."""
    if branching < 2:
        raise ValueError(f"branching must be >= 2, got {branching}")
    splits = tuple(sorted(set(int(s) for s in split_points)))
    if any(s < 0 or s >= num_steps for s in splits):
        raise ValueError(f"split points {splits} must lie in [0, {num_steps - 1}]")
    parent, depth = [-1], [0]
    frontier = [0]
    for k in range(num_steps):
        nxt = []
        for p in frontier:
            for _ in range(branching if k in splits else 1):
                parent.append(p)
                depth.append(k + 1)
                nxt.append(len(parent) - 1)
        frontier = nxt
    return Tree(torch.tensor(parent), torch.tensor(depth), num_steps, splits)


@dataclass
class TreeCost:
    """NFE accounting of one tree vs flat rollouts (see :func:`tree_cost`)."""

    leaves: int
    rollout_nfe: int                  # model forwards to sample the tree (no CFG)
    train_transitions: int            # edges of the trained steps (one forward + backward each)
    flat_rollout_nfe_per_sample: int  # K
    flat_train_per_sample: int        # trained steps of a flat trajectory

    @property
    def rollout_nfe_per_leaf(self) -> float:
        return self.rollout_nfe / self.leaves

    @property
    def train_per_leaf(self) -> float:
        return self.train_transitions / self.leaves

    def as_dict(self) -> dict[str, float]:
        return {"leaves": self.leaves, "rollout_nfe": self.rollout_nfe, "rollout_nfe_per_leaf": self.rollout_nfe_per_leaf,
                "train_transitions": self.train_transitions, "train_per_leaf": self.train_per_leaf,
                "flat_rollout_nfe_per_sample": self.flat_rollout_nfe_per_sample,
                "flat_train_per_sample": self.flat_train_per_sample}


def tree_cost(num_steps: int, split_points: Iterable[int], branching: int = 2,
              trained_steps: Optional[Iterable[int]] = None) -> TreeCost:
    """Counts from the closed forms :math:`n_k=b^{|\\{s<k\\}|}` (rollout NFE :math:`\\sum_{k<K} n_k`) and
    :math:`\\sum_{k\\in\\text{train}} n_{k+1}` (trained transitions; default: every step, as the release)."""
    splits = sorted(set(int(s) for s in split_points))
    n = [branching ** sum(1 for s in splits if s < k) for k in range(num_steps + 1)]
    steps = list(range(num_steps)) if trained_steps is None else sorted(set(int(k) for k in trained_steps))
    if any(k < 0 or k >= num_steps for k in steps):
        raise ValueError(f"trained steps {steps} must lie in [0, {num_steps - 1}]")
    return TreeCost(leaves=n[num_steps], rollout_nfe=sum(n[:num_steps]),
                    train_transitions=sum(n[k + 1] for k in steps), flat_rollout_nfe_per_sample=num_steps,
                    flat_train_per_sample=len(steps))


def fuse_rewards(tree: Tree, leaf_rewards: Tensor, mode: str = "mean", edge_log_probs: Optional[Tensor] = None,
                 alpha: float = 1.0) -> Tensor:
    """(M,) float64 node rewards from the (L,) leaf rewards (leaves in ``tree.leaves`` order). ``edge_log_probs``
    (M,) is the log-prob of each node's incoming edge (``mode="prob"`` only)."""
    leaves = tree.leaves
    lr = torch.as_tensor(leaf_rewards, dtype=torch.float64).flatten()
    if lr.shape[0] != leaves.shape[0]:
        raise ValueError(f"{lr.shape[0]} leaf rewards for {leaves.shape[0]} leaves")
    M = tree.num_nodes
    if mode == "mean":
        total = torch.zeros(M, dtype=torch.float64)
        count = torch.zeros(M, dtype=torch.float64)
        total[leaves] = lr
        count[leaves] = 1.0
        for d in range(tree.num_steps, 0, -1):
            nodes = tree.nodes_at(d)
            par = tree.parent[nodes]
            total.index_add_(0, par, total[nodes])
            count.index_add_(0, par, count[nodes])
        return total / count
    if mode == "prob":
        if edge_log_probs is None:
            raise ValueError("mode='prob' needs edge_log_probs (M,)")
        lp = torch.as_tensor(edge_log_probs, dtype=torch.float64).flatten()
        if lp.shape[0] != M:
            raise ValueError(f"edge_log_probs must be ({M},), got {tuple(lp.shape)}")
        r = torch.full((M,), float("nan"), dtype=torch.float64)
        r[leaves] = lr
        for d in range(tree.num_steps - 1, -1, -1):
            for m in tree.nodes_at(d).tolist():
                ch = tree.children(m)
                r[m] = r[ch[0]] if ch.numel() == 1 else (torch.softmax(alpha * lp[ch], 0) * r[ch]).sum()
        return r
    raise ValueError(f"unknown fusion mode {mode!r}: mean | prob")


def depth_advantages(tree: Tree, node_rewards: Tensor, std_floor: float = 1e-6, eps: float = 1e-8) -> Tensor:
    """(M,) float64 advantages: z-score of the node rewards within each depth (unbiased std); 0 for a depth with
    one node or std < ``std_floor``."""
    r = torch.as_tensor(node_rewards, dtype=torch.float64).flatten()
    adv = torch.zeros_like(r)
    for d in range(tree.num_steps + 1):
        nodes = tree.nodes_at(d)
        if nodes.numel() <= 1:
            continue
        v = r[nodes]
        sd = v.std()
        if sd < std_floor:
            continue
        adv[nodes] = (v - v.mean()) / (sd + eps)
    return adv


def edge_advantages(tree: Tree, node_advantages: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The training transitions: (child node ids (M-1,), their parent ids, their advantages); the transition of
    child c is the step ``depth[c] - 1`` from ``parent[c]`` to c, credited with c's advantage."""
    child = torch.nonzero(tree.parent >= 0).flatten()
    return child, tree.parent[child], torch.as_tensor(node_advantages)[child]


def should_prune(step: int, max_steps: Optional[int], ratio: float = 1.0) -> bool:
    """The release applies pruning while ``step <= int(max_steps * pruning_step_ratio)`` (always without
    ``max_steps``)."""
    if max_steps is None:
        return True
    return step <= int(max_steps * ratio)


def depth_pruning_depths(base_depths: Sequence[int], step: int = 0, slide: bool = False, interval: int = 1,
                         stop_depth: Optional[int] = None, split_points: Sequence[int] = ()) -> set[int]:
    """Child depths whose transitions are not trained. Without ``slide`` the set is ``base_depths``; with it every
    depth moves up by ``min(step // interval, max(0, min(base) - stop))``, where ``stop`` defaults to the last split
    point (so the window stops once its shallowest depth reaches it)."""
    base = sorted(int(d) for d in base_depths)
    if not base:
        return set()
    if not slide:
        return set(base)
    stop = (max(split_points) if len(split_points) else 0) if stop_depth is None else int(stop_depth)
    shift = min(max(0, step // max(1, int(interval))), max(0, base[0] - stop))
    return {d - shift for d in base}


def width_pruning_keep(tree: Tree, node_advantages: Tensor, mode: int, ratio: float = 0.5,
                       candidates: Optional[Tensor] = None) -> Tensor:
    """(M,) bool keep mask over the nodes' incoming edges (the root's entry is False: it has no edge).

    Only edges after the last split (parent depth > last split point) are pruned; ``candidates`` (M,) bool, if
    given, restricts everything to the edges still present (e.g. after depth pruning). Mode 0 keeps everything."""
    adv = torch.as_tensor(node_advantages, dtype=torch.float64).flatten()
    has_edge = tree.parent >= 0
    keep = has_edge.clone() if candidates is None else (has_edge & torch.as_tensor(candidates, dtype=torch.bool))
    if mode == 0 or not tree.split_points:
        return keep
    last = max(tree.split_points)
    pdepth = torch.where(has_edge, tree.depth - 1, torch.full_like(tree.depth, -1))
    late = torch.nonzero(keep & (pdepth > last)).flatten()
    if late.numel() == 0:
        return keep
    keep[late] = False
    if mode == 1:
        groups: dict[int, list[int]] = {}
        for c in late.tolist():
            groups.setdefault(tree.ancestor_at(int(tree.parent[c]), last + 1), []).append(c)
        for members in groups.values():
            m = torch.tensor(members)
            order = torch.sort(-adv[m], stable=True).indices
            keep[m[order[: max(1, int(len(members) * ratio))]]] = True
    elif mode == 2:
        order = late[torch.sort(-adv[late], stable=True).indices]
        k = max(2, int(late.numel() * ratio))
        best = k // 2
        keep[order[:best]] = True
        if k - best > 0:
            keep[order[-(k - best):]] = True
    else:
        raise ValueError(f"unknown width pruning mode {mode}: 0 | 1 | 2")
    return keep


def leaf_paths(tree: Tree) -> Tensor:
    """(L, K) long: ``[i, k]`` = the node at depth k+1 on leaf i's path (the child of its step-k edge)."""
    leaves = tree.leaves.tolist()
    out = torch.empty(len(leaves), tree.num_steps, dtype=torch.long)
    for i, leaf in enumerate(leaves):
        m = leaf
        for k in range(tree.num_steps - 1, -1, -1):
            out[i, k] = m
            m = int(tree.parent[m])
    return out


def edge_owner(tree: Tree) -> Tensor:
    """(L, K) bool: leaf i is the first leaf (in leaf order) whose path holds the edge ``leaf_paths[i, k]``."""
    paths = leaf_paths(tree)
    owner = torch.zeros_like(paths, dtype=torch.bool)
    for k in range(tree.num_steps):
        seen: set[int] = set()
        for i, m in enumerate(paths[:, k].tolist()):
            if m not in seen:
                seen.add(m)
                owner[i, k] = True
    return owner


def leaf_step_advantages(tree: Tree, node_advantages: Tensor, keep: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """(advantages (L, K) float64, train mask (L, K) bool) in the flat layout: leaf i's step k carries the advantage
    of node ``leaf_paths[i, k]`` and is trained iff leaf i owns that edge and ``keep`` (M,) (pruning) keeps it."""
    paths = leaf_paths(tree)
    mask = edge_owner(tree)
    if keep is not None:
        mask &= torch.as_tensor(keep, dtype=torch.bool)[paths]
    adv = torch.as_tensor(node_advantages, dtype=torch.float64)[paths]
    return torch.where(mask, adv, torch.zeros_like(adv)), mask


# ------------------------------------------------------------------------------------------- the method
# One tree per group (sample.same_noise_per_group: the root x_T), the group's samples are its leaves in the flat
# layout: leaf j = the sample with member index j; data.group_size must equal branching ** len(split points).
def _tree_of(num_steps: int, o) -> Tree:
    return build_tree(num_steps, parse_split_points(num_steps, o.split_points), o.branching)


def plan_tree(cfg, plan_seeds, iteration: int, members, o):
    """step_mode=tree: every step but the last is SDE (DanceGRPO's step in the release); the noise of leaf j at step
    k comes from the node its step-k edge leads to (siblings share every edge before their split); leaf j trains the
    edges it owns (each edge once), except the last step and the depth-pruned child depths (slid by epoch). ``o``:
    ``methods.branch_grpo``."""
    from mmgrpo.utils.seeding import sample_seed

    from .plans import StepPlan

    K = cfg.num_steps
    tree = _tree_of(K, o)
    L = int(tree.leaves.numel())
    if any(m >= L for m in members):
        raise ValueError(f"step_mode=tree: the tree (split points {list(tree.split_points)}, branching "
                         f"{o.branching}) has {L} leaves: set data.group_size={L}")
    paths, owner = leaf_paths(tree), edge_owner(tree)
    pruned = depth_pruning_depths(o.depth_pruning, iteration, o.depth_slide, o.slide_interval,
                                  None if o.stop_depth < 0 else o.stop_depth, tree.split_points)
    keep_step = torch.tensor([k < K - 1 and (k + 1) not in pruned for k in range(K)])
    n = len(plan_seeds)
    p = StepPlan.empty(n, K)
    p.sde_mask[:, : K - 1] = True
    keys = torch.empty(n, K, dtype=torch.int64)
    for i, (ps, j) in enumerate(zip(plan_seeds, members)):
        p.train_mask[i] = owner[j] & keep_step
        keys[i] = torch.tensor([sample_seed(int(ps), 10, int(m)) for m in paths[j].tolist()])
    p.noise_keys = keys
    return p


def tree_credit(inp, o):
    """Per group: leaf rewards -> :func:`fuse_rewards` (mean) -> :func:`depth_advantages`; sample (leaf) j's step-k
    column gets the advantage of the node its step-k edge leads to, clamped to ``optim.adv_clip_max``. A tree with
    a missing or invalid leaf gets 0 everywhere (its fusion would be biased). ``mode="prob"`` fusion is not wired
    (the credit inputs carry no edge log-probs)."""
    from .base import CreditOutput

    K = inp.sampling.num_steps
    N, T = inp.train_mask.shape
    if inp.members is None:
        raise ValueError("credit=branch_grpo needs the samples' member indices (step_mode=tree)")
    tree = _tree_of(K, o)
    L = int(tree.leaves.numel())
    paths = leaf_paths(tree)
    (r_all, g_all, m_all, v_all), sl = inp.gather([inp.rewards["total"], inp.group_ids, inp.members, inp.valid])
    A = torch.zeros(r_all.shape[0], K, dtype=torch.float64)
    complete = 0
    for g in torch.unique(g_all).tolist():
        idx = torch.nonzero(g_all == g).flatten()
        if idx.numel() != L or sorted(m_all[idx].tolist()) != list(range(L)):
            raise ValueError(f"credit=branch_grpo: group {g} has members {sorted(m_all[idx].tolist())}, the tree "
                             f"(split points {list(tree.split_points)}) has {L} leaves: set data.group_size={L}")
        if not bool(v_all[idx].all()):
            continue
        leaf_r = torch.empty(L, dtype=torch.float64)
        leaf_r[m_all[idx]] = r_all[idx].double()
        node_adv = depth_advantages(tree, fuse_rewards(tree, leaf_r)).clamp(-inp.opts.clamp, inp.opts.clamp)
        A[idx] = node_adv[paths[m_all[idx]]]
        complete += 1
    adv = A[sl][:, inp.step_indices].float()
    # NFE accounting: the release's count, to compare with the logged nfe_per_trajectory (equal with
    # sample.shared_prefix when a rollout chunk holds whole trees; K when prefixes are recomputed)
    cost = tree_cost(K, tree.split_points, o.branching)
    return CreditOutput(adv, {"tree/complete_trees": float(complete),
                              "tree/rollout_nfe_per_leaf_shared": cost.rollout_nfe_per_leaf})


def width_pruning_mask(adv: Tensor, mask: Tensor, inp, o) -> Tensor:
    """``methods.branch_grpo.width_pruning`` > 0: per tree, the trained (sample, column) cells are its edges with
    their node's advantage; :func:`width_pruning_keep` keeps some of the edges after the last split. Applied at every
    epoch (the release's ``pruning_step_ratio`` window is not wired)."""
    tree = _tree_of(inp.sampling.num_steps, o)
    paths = leaf_paths(tree)
    steps = inp.step_indices
    # gathered on the full step grid (N, K): each process's columns are the steps its own trees train
    K = int(paths.shape[1])
    a_full = torch.zeros(adv.shape[0], K)
    a_full[:, steps] = adv.float()
    m_full = torch.zeros(mask.shape[0], K, dtype=torch.bool)
    m_full[:, steps] = mask
    (a_all, m_all, g_all, mem_all), sl = inp.gather([a_full, m_full, inp.group_ids, inp.members])
    out = m_all.clone()
    for g in torch.unique(g_all).tolist():
        idx = torch.nonzero(g_all == g).flatten()
        node_adv = torch.zeros(tree.num_nodes, dtype=torch.float64)
        cand = torch.zeros(tree.num_nodes, dtype=torch.bool)
        nodes = paths[mem_all[idx]]  # (n_g, K): the node each trained cell's edge leads to
        cells = m_all[idx]
        node_adv[nodes[cells]] = a_all[idx][cells].double()
        cand[nodes[cells]] = True
        keep = width_pruning_keep(tree, node_adv, o.width_pruning, o.width_ratio, candidates=cand)
        out[idx] = cells & keep[nodes]
    return out[sl][:, steps]


class BranchGRPO(FlowMethod):
    """BranchGRPO: the tree plan, the depth-wise credit and (``width_pruning`` > 0) the width pruning of the trained
    edges after the advantages."""

    name = "branch_grpo"

    def __init__(self, cfg, run=None):
        super().__init__(cfg, run)
        self.o = cfg.methods.branch_grpo

    def check_sampling(self, s) -> None:
        if s.step_mode != "tree":
            raise ValueError("sample.credit=branch_grpo needs sample.step_mode=tree")
        if s.plan_per_sample or not s.same_noise_per_group:
            raise ValueError("sample.credit=branch_grpo needs sample.plan_per_sample=false and "
                             "same_noise_per_group=true (one tree per group: shared root x_T and prefix noise)")

    def plan(self, s, plan_seeds, iteration: int, members):
        if members is None:
            raise ValueError("step_mode=tree needs the index of every sample in its group (members)")
        return plan_tree(s, plan_seeds, iteration, members, self.o)

    def advantage_estimator(self):
        return functools.partial(tree_credit, o=self.o)

    def on_advantages(self, traj):
        if self.o.width_pruning > 0:
            traj.train_mask = width_pruning_mask(traj.advantages, traj.train_mask, self.run.credit_inputs(traj),
                                                 self.o)
        return traj
