"""TP-GRPO turning points on hand-worked reward sequences (see mmgrpo/core/step_credit.py docstring)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmgrpo.core import (
    balance_turning_points,
    incremental_rewards,
    step_advantages,
    turning_point_rewards,
    turning_points,
)


def T(rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_no_turning_point():
    # d = [-1, 3, -1], Delta = 1: step1 disagrees with the rest; step2 flips back but R3 - R2 < 0; last never.
    R = T([[0, -1, 2, 1]])
    assert turning_points(R).tolist() == [[False, False, False]]
    c = turning_point_rewards(R, torch.tensor([0]))
    assert c.step_rewards.tolist() == [[-1, 3, -1]]  # plain increments


def test_flip_in_the_middle():
    # d = [-1, 2, 1], Delta = 2: step 2 flips back to the trend and the rest keeps it -> turning point.
    R = T([[0, -1, 1, 2]])
    assert turning_points(R).tolist() == [[False, True, False]]
    c = turning_point_rewards(R, torch.tensor([0]))
    assert c.step_rewards.tolist() == [[-1, 3, 1]]  # r_2 = R_3 - R_1 = 3


def test_first_step_turning_point():
    R = T([[0, 1, 2, 3]])  # step 1 agrees with what follows (R3 - R1 = 2 > 0)
    assert turning_points(R).tolist() == [[True, False, False]]
    assert turning_point_rewards(R, torch.tensor([0])).step_rewards.tolist() == [[3, 1, 1]]  # r_1 = R_3 - R_0


def test_all_equal_rewards():
    R = T([[0.5, 0.5, 0.5, 0.5]])
    c = turning_point_rewards(R, torch.tensor([0]))
    assert not c.turning.any()
    assert c.step_rewards.tolist() == [[0, 0, 0]]


def test_last_step_never_turning_point():
    # d = [1, -2, 3], Delta = 2: step 3 flips back to the trend but R_n - R_n = 0, so it can't qualify.
    R = T([[0, 1, -1, 2]])
    flags = turning_points(R)
    assert flags.tolist() == [[True, False, False]]
    rnd = torch.Generator().manual_seed(0)
    many = torch.randn(200, 6, generator=rnd, dtype=torch.float64)
    assert not turning_points(many)[:, -1].any()


def test_increments():
    assert incremental_rewards(T([[1, 4, 2]])).tolist() == [[3, -2]]


def test_balancing_per_group_keeps_largest_delta():
    # group 0: three positive-Delta first-step TPs (Delta 3, 5, 4) and one negative (Delta -2)
    R = T([
        [0, 1, 2, 3],      # Delta 3, TP at step 1
        [0, 2, 4, 5],      # Delta 5, TP at step 1
        [0, 1, 3, 4],      # Delta 4, TP at step 1
        [0, -1, -1.5, -2],  # Delta -2, TP at step 1
        [0, 1, 2, 3],      # group 1: single sign, all kept
    ])
    g = torch.tensor([0, 0, 0, 0, 1])
    c = turning_point_rewards(R, g, balance=True, balance_scope="group")
    assert c.turning_raw[:, 0].tolist() == [True] * 5
    assert c.turning[:, 0].tolist() == [False, True, False, True, True]  # one pos (largest |Delta|=5) + one neg
    # unflagged rows fall back to increments
    assert c.step_rewards[0].tolist() == [1, 1, 1]
    assert c.step_rewards[1].tolist() == [5, 2, 1]
    # batch scope: 4 positives vs 1 negative over everything -> keep 1 positive (Delta 5) and the negative
    cb = turning_point_rewards(R, g, balance=True, balance_scope="batch")
    assert cb.turning[:, 0].tolist() == [False, True, False, True, False]
    cn = turning_point_rewards(R, g, balance=False)
    assert cn.turning.equal(cn.turning_raw)


def test_balancing_is_layout_independent_per_group():
    R = torch.randn(16, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    g = torch.arange(16) // 4
    c = turning_point_rewards(R, g)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(2))
    # Permuting the batch layout must not change how many turning points each group keeps
    # (the released code balances per device batch, which does depend on the layout).
    cp = turning_point_rewards(R[perm], g[perm])
    for gid in range(4):
        m, mp = g == gid, g[perm] == gid
        assert c.turning[m].sum() == cp.turning[mp].sum()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(-3, 3), min_size=3, max_size=6), min_size=1, max_size=8).filter(
    lambda rows: len({len(r) for r in rows}) == 1))
def test_tp_properties(rows):
    R = T(rows)
    c = turning_point_rewards(R, torch.zeros(len(rows), dtype=torch.long))
    d = incremental_rewards(R)
    # unflagged steps carry the increment, flagged steps the remaining reward R_n - R_{k-1}
    expect = torch.where(c.turning, R[:, -1:] - R[:, :-1], d)
    assert c.step_rewards.equal(expect)
    assert not c.turning[:, -1].any()
    assert (c.turning <= c.turning_raw).all()
    # balanced: if both signs are flagged, their counts are equal
    pos = (c.turning & (c.delta.unsqueeze(1) > 0)).sum()
    neg = (c.turning & (c.delta.unsqueeze(1) < 0)).sum()
    assert pos == neg or pos == 0 or neg == 0


def test_step_advantages_and_broadcast():
    r = T([[1, 0], [3, 0], [5, 2], [5, 4]])
    g = torch.tensor([0, 0, 1, 1])
    A = step_advantages(r, g, clamp=None)
    s = 1.0  # population std (TP-GRPO's np.std) of [1,3] and of [2,4]
    assert A[:, 0].tolist() == pytest.approx([-1 / (s + 1e-4), 1 / (s + 1e-4), 0, 0], abs=1e-6)
    assert A[:, 1].tolist() == pytest.approx([0, 0, -1 / (s + 1e-4), 1 / (s + 1e-4)], abs=1e-6)
    s = 2 ** 0.5  # Bessel-corrected std of the same pairs (torch.std), on request
    A = step_advantages(r, g, clamp=None, unbiased=True)
    assert A[:, 0].tolist() == pytest.approx([-1 / (s + 1e-4), 1 / (s + 1e-4), 0, 0], abs=1e-6)
    assert step_advantages(r * 100, g, clamp=0.5).abs().max() <= 0.5


def test_errors():
    with pytest.raises(ValueError):
        turning_points(torch.ones(3))
    with pytest.raises(ValueError):
        turning_point_rewards(T([[0, float("nan")]]), torch.tensor([0]))
    with pytest.raises(ValueError):
        balance_turning_points(torch.zeros(1, 2, dtype=torch.bool), torch.zeros(1), None, "group")


def test_step_advantages_default_is_tp_grpo_release():
    """TP-GRPO's release z-scores each step with np.std (divides by G) + 1e-4: one group with step rewards
    [[0], [1]] -> mean 0.5, std 0.5 -> +-0.5 / 0.5001 = +-0.99980 (dividing by G-1 would give +-0.70700)."""
    A = step_advantages(T([[0.0], [1.0]]), torch.tensor([0, 0]))
    assert A[:, 0].tolist() == pytest.approx([-0.5 / 0.5001, 0.5 / 0.5001], abs=1e-7)
    assert A[1, 0].item() == pytest.approx(0.99980004, abs=1e-7)
    # eps is added to the std outside the square root: with eps = 0.5 the result is 0.5 / (0.5 + 0.5)
    assert step_advantages(T([[0.0], [1.0]]), torch.tensor([0, 0]), eps=0.5)[1, 0].item() == pytest.approx(0.5)
