"""BranchGRPO tree plan, reward fusion, depth-wise advantages, pruning and NFE accounting, checked by hand."""
import math

import pytest
import torch

from flow_grpo.methods import branch_grpo as bg


def _small():
    # K = 3, splits at steps 0 and 2:   0 -> (1, 2) -> (3, 4) -> (5, 6), (7, 8)
    return bg.build_tree(3, [0, 2])


def test_parse_split_points_release_rules():
    assert bg.parse_split_points(20, [9, 0, 6, 3]) == [0, 3, 6, 9]
    assert bg.parse_split_points(20, None, rounds=4) == [0, 5, 10, 15]
    assert bg.parse_split_points(10, None, rounds=3) == [0, 3, 6]
    assert bg.parse_split_points(20, [25, -1]) == [0, 19]
    assert bg.parse_split_points(20, None, rounds=0) == []


def test_build_tree_by_hand():
    t = _small()
    assert t.parent.tolist() == [-1, 0, 0, 1, 2, 3, 3, 4, 4]
    assert t.depth.tolist() == [0, 1, 1, 2, 2, 3, 3, 3, 3]
    assert t.leaves.tolist() == [5, 6, 7, 8]
    assert t.ancestor_at(8, 1) == 2 and t.ancestor_at(5, 3) == 5
    with pytest.raises(ValueError):
        bg.build_tree(3, [3])


def test_nfe_accounting_release_setting_by_hand():
    c = bg.tree_cost(20, [0, 3, 6, 9])
    # nodes entering steps: 1 | 2,2,2 | 4,4,4 | 8,8,8 | 16 x 10
    assert c.rollout_nfe == 1 + 6 + 12 + 24 + 160 == 203
    assert c.leaves == 16 and c.rollout_nfe_per_leaf == pytest.approx(12.6875)
    # edges per step: 2,2,2 | 4,4,4 | 8,8,8 | 16 x 11
    assert c.train_transitions == 6 + 12 + 24 + 176 == 218
    assert bg.tree_cost(20, [0, 3, 6, 9], trained_steps=range(19)).train_transitions == 202
    assert c.flat_rollout_nfe_per_sample == 20
    # the closed form agrees with the explicit tree
    t = bg.build_tree(20, [0, 3, 6, 9])
    assert sum(int((t.depth == k).sum()) for k in range(20)) == 203


def test_nfe_accounting_no_split_is_flat():
    c = bg.tree_cost(10, [], trained_steps=[2, 3])
    assert (c.leaves, c.rollout_nfe, c.train_transitions) == (1, 10, 2)


def test_fuse_mean_by_hand():
    r = bg.fuse_rewards(_small(), torch.tensor([1.0, 2.0, 3.0, 6.0]))
    assert r.tolist() == pytest.approx([3.0, 1.5, 4.5, 1.5, 4.5, 1.0, 2.0, 3.0, 6.0])


def test_fuse_prob_by_hand():
    lp = torch.tensor([0.0, 0.0, -math.log(3), 0.0, 0.0, 0.0, math.log(3), 0.0, 0.0])
    r = bg.fuse_rewards(_small(), torch.tensor([1.0, 2.0, 3.0, 6.0]), mode="prob", edge_log_probs=lp)
    # node 3: softmax(0, ln 3) = (1/4, 3/4) -> 1.75; node 4: 4.5; root: softmax(0, -ln 3) = (3/4, 1/4)
    assert r.tolist() == pytest.approx([0.75 * 1.75 + 0.25 * 4.5, 1.75, 4.5, 1.75, 4.5, 1, 2, 3, 6])
    with pytest.raises(ValueError, match="edge_log_probs"):
        bg.fuse_rewards(_small(), torch.tensor([1.0, 2.0, 3.0, 6.0]), mode="prob")


def test_depth_advantages_by_hand():
    t = _small()
    adv = bg.depth_advantages(t, bg.fuse_rewards(t, torch.tensor([1.0, 2.0, 3.0, 6.0])))
    s1 = math.sqrt(2 * 1.5**2)  # unbiased std of (1.5, 4.5)
    s3 = math.sqrt(14 / 3)      # unbiased std of (1, 2, 3, 6)
    ref = [0.0, -1.5 / s1, 1.5 / s1, -1.5 / s1, 1.5 / s1, -2 / s3, -1 / s3, 0.0, 3 / s3]
    assert adv.tolist() == pytest.approx(ref, rel=1e-6)
    # a depth whose rewards are all equal gets 0
    flat = bg.depth_advantages(t, bg.fuse_rewards(t, torch.tensor([1.0, 2.0, 2.0, 1.0])))
    assert flat[[1, 2, 3, 4]].tolist() == [0.0] * 4
    child, parent, a = bg.edge_advantages(t, adv)
    assert child.tolist() == list(range(1, 9)) and parent.tolist() == [0, 0, 1, 2, 3, 3, 4, 4]
    assert a.tolist() == pytest.approx(ref[1:])


def test_pruning_schedules():
    base = [15, 16, 17, 18]
    assert bg.depth_pruning_depths(base, step=500) == set(base)
    assert bg.depth_pruning_depths(base, 0, True, 30, None, [0, 3, 6, 9]) == set(base)
    assert bg.depth_pruning_depths(base, 60, True, 30, None, [0, 3, 6, 9]) == {13, 14, 15, 16}
    assert bg.depth_pruning_depths(base, 10_000, True, 30, None, [0, 3, 6, 9]) == {9, 10, 11, 12}
    assert bg.depth_pruning_depths(base, 10_000, True, 30, 12, [0, 3, 6, 9]) == {12, 13, 14, 15}
    assert bg.should_prune(10, 100, 0.1) and not bg.should_prune(11, 100, 0.1) and bg.should_prune(5, None)


def _chains():
    # K = 4, one split at step 0: chains 1-3-5-7 and 2-4-6-8
    t = bg.build_tree(4, [0])
    assert t.parent.tolist() == [-1, 0, 0, 1, 2, 3, 4, 5, 6]
    adv = torch.tensor([0.0, 0.1, -0.1, 0.5, 1.0, -1.0, 0.2, 2.0, -0.3])
    return t, adv


def test_width_pruning_mode1_best_per_chain():
    t, adv = _chains()
    keep = bg.width_pruning_keep(t, adv, mode=1, ratio=0.5)
    # late edges (parent depth > 0): chain of node 1 -> {3, 5, 7}, of node 2 -> {4, 6, 8}; keep int(3 * .5) -> 1 each
    assert torch.nonzero(keep).flatten().tolist() == [1, 2, 4, 7]


def test_width_pruning_mode2_global_best_and_worst():
    t, adv = _chains()
    keep = bg.width_pruning_keep(t, adv, mode=2, ratio=0.5)
    # 6 late edges, keep max(2, 3) = 3: the best one (7: 2.0) and the two worst (5: -1.0, 8: -0.3)
    assert torch.nonzero(keep).flatten().tolist() == [1, 2, 5, 7, 8]
    assert bg.width_pruning_keep(t, adv, mode=0).tolist() == [False] + [True] * 8
    # candidates (e.g. after depth pruning) restrict the pool
    cand = torch.ones(9, dtype=torch.bool)
    cand[7] = False
    keep = bg.width_pruning_keep(t, adv, mode=2, ratio=0.5, candidates=cand)
    assert torch.nonzero(keep).flatten().tolist() == [1, 2, 4, 5]  # pool {3,4,5,6,8}: k=2 -> best 4, worst 5


def test_flat_layout_paths_owner_and_advantages_by_hand():
    t = _small()
    assert bg.leaf_paths(t).tolist() == [[1, 3, 5], [1, 3, 6], [2, 4, 7], [2, 4, 8]]
    assert bg.edge_owner(t).tolist() == [[True] * 3, [False, False, True], [True] * 3, [False, False, True]]
    adv = torch.arange(9, dtype=torch.float64) / 10
    keep = torch.ones(9, dtype=torch.bool)
    keep[3] = False  # prune the edge into node 3 (step 1 of leaves 5 and 6)
    a, m = bg.leaf_step_advantages(t, adv, keep)
    assert m.tolist() == [[True, False, True], [False, False, True], [True] * 3, [False, False, True]]
    assert a.flatten().tolist() == pytest.approx([0.1, 0, 0.5, 0, 0, 0.6, 0.2, 0.4, 0.7, 0, 0, 0.8])
    # each trained edge appears exactly once: as many trained cells as edges kept
    assert int(m.sum()) == int(keep[1:].sum())
