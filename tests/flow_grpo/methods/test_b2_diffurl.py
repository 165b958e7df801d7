"""B²-DiffuRL branch plans, progressive schedule, history z-scores and branch selection, checked by hand."""
import math

import pytest
import torch

from flow_grpo.methods import b2_diffurl as b2


def test_progressive_schedule_release_setting():
    # run_process.sh: 100 stages, SplitStepLeft=14, SplitStepRight=20 -> 7 levels of ~14.3 stages
    s = [b2.progressive_split_step(i, 100, 14, 20) for i in range(100)]
    assert s[0] == 14 and s[14] == 14 and s[15] == 15 and s[28] == 15 and s[29] == 16 and s[99] == 20
    assert s == sorted(s) and set(s) == set(range(14, 21))
    with pytest.raises(ValueError):
        b2.progressive_split_step(100, 100, 14, 20)


def test_training_segment_moves_toward_the_start():
    assert b2.training_segment(20, 14) == (6, 19)
    assert b2.training_segment(20, 14, exclude_last=False) == (6, 20)
    assert b2.training_segment(20, 20) == (0, 19)
    with pytest.raises(ValueError, match="split_step >= 2"):
        b2.training_segment(20, 1)


def test_branch_plan_by_hand():
    p = b2.branch_plan(num_steps=5, split_step=3, num_trunks=2, branches=3)
    assert p.trunk_ids.tolist() == [0, 0, 0, 1, 1, 1] and p.branch_ids.tolist() == [0, 1, 2] * 2
    assert p.branch_step == 2
    assert p.train_mask[0].tolist() == [False, False, True, True, False]
    assert p.sde_mask[0].tolist() == [True, True, True, True, False]
    assert bool((p.train_mask == p.train_mask[0]).all())
    with pytest.raises(ValueError, match="branches"):
        b2.branch_plan(5, 3, 2, 1)


def test_noise_seed_table_shares_the_prefix():
    p = b2.branch_plan(5, 3, 2, 3)
    t = b2.noise_seed_table(p, [10, 20], [1, 2, 3, 4, 5, 6])
    assert t[0].tolist() == [10, 10, 1, 1, 1]
    assert t[4].tolist() == [20, 20, 5, 5, 5]
    # branches of one trunk agree exactly on the steps before the branch step and nowhere after
    assert bool((t[0:3, :2] == 10).all()) and len(set(t[0:3, 2].tolist())) == 3


def test_rollout_nfe_by_hand():
    assert b2.rollout_nfe(20, 6, 4, 5) == 4 * 6 + 20 * 14 == 304  # flat: 20 * 20 = 400
    assert b2.rollout_nfe(20, 0, 4, 5) == 400


def test_history_zscore_by_hand():
    z, hist = b2.history_zscore(torch.tensor([1.0, 3.0, 2.0, 2.0]), ["a", "a", "b", "b"], [{"a": torch.tensor([5.0])}],
                                history_cnt=2)
    # a: {5, 1, 3} mean 3, unbiased std 2 -> (-1, 0); b: {2, 2} std 0 -> 0
    assert z.tolist() == pytest.approx([-1.0, 0.0, 0.0, 0.0], abs=1e-7)
    assert len(hist) == 2 and hist[1]["a"].tolist() == [1.0, 3.0]
    # only the last history_cnt stages count: {7} is dropped, {5} and the current stage remain
    z, hist = b2.history_zscore(torch.tensor([1.0, 3.0]), ["a", "a"], [{"a": torch.tensor([7.0])},
                                                                      {"a": torch.tensor([5.0])}], history_cnt=1)
    assert z.tolist() == pytest.approx([-1.0, 0.0], abs=1e-7) and len(hist) == 1
    # no history: the plain per-prompt z-score (unbiased); a lone reward gets 0
    z, hist = b2.history_zscore(torch.tensor([0.0, 2.0, 5.0]), ["a", "a", "c"], history_cnt=0)
    assert z.tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2), 0.0]) and hist == []


def test_select_branches_by_hand():
    z = torch.tensor([0.7, 0.2, -0.6, 0.4, 0.1, -0.2, 7.0, 0.0, 0.0])
    trunks = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    keep, adv = b2.select_branches(z, trunks, 0.5, -0.5, beta_neg=2.0)
    assert keep.tolist() == [True, False, True, False, False, False, True, False, False]
    assert adv.tolist() == pytest.approx([0.7, 0, -1.2, 0, 0, 0, 5.0, 0, 0])
    with pytest.raises(ValueError, match="neg_threshold"):
        b2.select_branches(z, trunks, 0.1, 0.2)
