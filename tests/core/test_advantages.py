"""Golden and property tests for mmgrpo.core.advantages. Expected values come from `statistics`/`math`."""
import math
import statistics

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mmgrpo.core import (
    anchor_offpolicy_advantages,
    group_advantages,
    multi_reward_advantages,
    offpolicy_diagnostics,
    pairwise_win_rate,
    tempsamp_shape,
)


def _ref_adv(rewards, groups, scale="group", eps=1e-4, unbiased=True):
    """Independent reference: plain Python loops and the `statistics` module."""
    std = statistics.stdev if unbiased else statistics.pstdev
    out = []
    batch_sd = std(rewards) if len(rewards) > 1 else 0.0
    for r, g in zip(rewards, groups):
        members = [x for x, h in zip(rewards, groups) if h == g]
        if max(members) == min(members):
            out.append(0.0)
            continue
        mu = statistics.fmean(members)
        if scale == "group":
            out.append((r - mu) / (std(members) + eps))
        elif scale == "batch":
            out.append((r - mu) / (batch_sd + eps))
        else:
            out.append(r - mu)
    return out


REWARDS = [1.0, 2.0, 3.0, 0.5, 0.5, 4.0, 7.0, 7.0, 7.0]
GROUPS = [3, 3, 3, 9, 9, 9, 1, 1, 1]  # arbitrary, non-contiguous ids


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("unbiased", [True, False])
def test_golden_scales(scale, unbiased):
    out = group_advantages(torch.tensor(REWARDS), torch.tensor(GROUPS), scale=scale, unbiased=unbiased)
    ref = _ref_adv(REWARDS, GROUPS, scale, unbiased=unbiased)
    assert torch.allclose(out.advantages.double(), torch.tensor(ref, dtype=torch.float64), atol=1e-6)
    assert out.zero_std_mask.tolist() == [False] * 6 + [True] * 3
    assert out.zero_std_fraction == pytest.approx(1 / 3)
    assert out.num_groups == 3


def test_hand_values_group_scale():
    # group [1,2,3]: mean 2, unbiased std 1 -> A = [-1, 0, 1] / (1 + 1e-4)
    out = group_advantages(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 0, 0]), eps=1e-4)
    assert torch.allclose(out.advantages, torch.tensor([-1.0, 0.0, 1.0]) / 1.0001)
    # population std of [1,2,3] is sqrt(2/3)
    out = group_advantages(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 0, 0]), eps=0.0, unbiased=False)
    assert torch.allclose(out.advantages, torch.tensor([-1.0, 0.0, 1.0]) / math.sqrt(2 / 3))


def test_clamp_and_eps():
    out = group_advantages(torch.tensor([0.0, 0.0, 0.0, 1.0]), torch.zeros(4, dtype=torch.long), clamp=1.0)
    assert out.advantages.max().item() == pytest.approx(1.0)
    # mean 0.25, unbiased std sqrt(0.75/3) = 0.5 -> A = -0.25/0.5001 (and 0.75/0.5001 clamped to 1)
    assert out.advantages[:3].tolist() == pytest.approx([-0.25 / 0.5001] * 3)


def test_per_step_rewards_are_normalised_per_column():
    r = torch.tensor([[1.0, 5.0], [3.0, 5.0], [2.0, 0.0], [2.0, 4.0]])
    g = torch.tensor([0, 0, 1, 1])
    out = group_advantages(r, g)
    for k in range(2):
        ref = _ref_adv(r[:, k].tolist(), g.tolist())
        assert torch.allclose(out.advantages[:, k].double(), torch.tensor(ref, dtype=torch.float64), atol=1e-6)
    assert out.zero_std_mask.tolist() == [[False, True], [False, True], [True, False], [True, False]]
    assert out.zero_std_fraction == pytest.approx(0.5)


def test_valid_mask_excludes_samples_and_singletons_are_zero():
    r = torch.tensor([1.0, 2.0, 100.0, 5.0])
    g = torch.tensor([0, 0, 0, 1])
    out = group_advantages(r, g, valid=torch.tensor([True, True, False, True]))
    ref = _ref_adv([1.0, 2.0], [0, 0])
    assert out.advantages[:2].tolist() == pytest.approx(ref, abs=1e-6)
    assert out.advantages[2].item() == 0.0  # invalid
    assert out.advantages[3].item() == 0.0 and bool(out.zero_std_mask[3])  # singleton group


def test_nonfinite_rewards_raise_unless_invalid():
    r = torch.tensor([1.0, float("nan"), 2.0])
    with pytest.raises(ValueError, match="non-finite"):
        group_advantages(r, torch.tensor([0, 0, 0]))
    out = group_advantages(r, torch.tensor([0, 0, 0]), valid=torch.tensor([True, False, True]))
    assert torch.isfinite(out.advantages).all()


def test_bad_group_ids():
    with pytest.raises(TypeError):
        group_advantages(torch.ones(2), torch.tensor([0.0, 1.0]))
    with pytest.raises(ValueError):
        group_advantages(torch.ones(2), torch.tensor([0, 1, 2]))


finite = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(finite, st.integers(0, 3)), min_size=1, max_size=24),
       st.floats(0.1, 50.0), st.floats(-100.0, 100.0))
@example(pairs=[(0.0, 0), (2.220446049250313e-16, 0)], a=1.0, b=1.0)  # found by hypothesis: 1.0 vs 1.0 + 2**-52
def test_properties_zero_mean_affine_invariance(pairs, a, b):
    r = torch.tensor([p[0] for p in pairs], dtype=torch.float64)
    g = torch.tensor([p[1] for p in pairs])
    out = group_advantages(r, g, scale="group", eps=0.0)
    adv = out.advantages
    for gid in torch.unique(g):
        m = g == gid
        assert abs(adv[m].sum().item()) < 1e-6 * max(1, m.sum().item())  # zero mean per group
        if bool((r[m] == r[m][0]).all()):
            assert (adv[m] == 0).all() and out.zero_std_mask[m].all()  # constant group: exactly zero, flagged
    r2 = a * r + b
    out2 = group_advantages(r2, g, scale="group", eps=0.0)  # positive affine map of the rewards
    # Invariance needs a spread the floats can resolve: a * r + b rounds each reward by up to one ulp of its
    # magnitude, which moves the advantages by about ulp * magnitude / spread. Compare groups whose spread is
    # >= 1e-9 of their magnitude (so that error is < 1e-6); tinier spreads are not the same rewards after the map.
    resolvable = torch.zeros_like(g, dtype=torch.bool)
    for gid in torch.unique(g):
        m = g == gid
        assert abs(out2.advantages[m].sum().item()) < 1e-6 * max(1, m.sum().item())  # zero mean, even at ulp scale
        resolvable[m] = all(float(x[m].max() - x[m].min()) >= 1e-9 * max(1.0, float(x[m].abs().max()))
                            for x in (r, r2))
    nz = ~out.zero_std_mask & ~out2.zero_std_mask & resolvable
    assert torch.allclose(out2.advantages[nz], adv[nz], atol=1e-5, rtol=1e-5)


def test_multi_reward_modes():
    iou = torch.tensor([0.1, 0.9, 0.5, 0.5])
    fmt = torch.tensor([1.0, 0.0, 1.0, 0.0])
    g = torch.tensor([0, 0, 1, 1])
    s = multi_reward_advantages({"iou": iou, "format": fmt}, g, weights={"iou": 2.0, "format": 1.0})
    ref = _ref_adv((2 * iou + fmt).tolist(), g.tolist())
    assert s.advantages.tolist() == pytest.approx(ref, abs=1e-6)
    # GDPO: normalise each, weighted sum, then batch-standardise (independent reference below)
    a_iou = _ref_adv(iou.tolist(), g.tolist())
    a_fmt = _ref_adv(fmt.tolist(), g.tolist())
    summed = [2 * x + y for x, y in zip(a_iou, a_fmt)]
    mu, sd = statistics.fmean(summed), statistics.stdev(summed)
    ref2 = [(x - mu) / (sd + 1e-4) for x in summed]
    d = multi_reward_advantages({"iou": iou, "format": fmt}, g, weights={"iou": 2.0, "format": 1.0},
                                mode="normalize_then_sum")
    assert d.advantages.tolist() == pytest.approx(ref2, abs=1e-5)
    d2 = multi_reward_advantages(torch.stack([iou, fmt], 1), g, weights=[2.0, 1.0], mode="normalize_then_sum",
                                 renormalize=False)
    assert d2.advantages.tolist() == pytest.approx(summed, abs=1e-5)
    with pytest.raises(KeyError):
        multi_reward_advantages({"iou": iou}, g, weights={"nope": 1.0})


def test_pairwise_win_rate():
    # group 0: a > b > c ; group 1: two tied
    pref = torch.zeros(5, 5)
    pref[0, 1] = pref[0, 2] = pref[1, 2] = 1.0
    pref[3, 4] = pref[4, 3] = 0.5
    pref[0, 3] = 1.0  # cross-group entries must be ignored
    r = pairwise_win_rate(pref, torch.tensor([0, 0, 0, 1, 1]))
    assert r.tolist() == pytest.approx([1.0, 0.5, 0.0, 0.5, 0.5])
    s = torch.tensor([3.0, 2.0, 1.0, 7.0, 7.0, 4.0])  # verdicts from scores: 1 if s_i > s_j, 0.5 on ties
    pref = (s[:, None] > s[None, :]).double() + 0.5 * (s[:, None] == s[None, :]).double()
    r2 = pairwise_win_rate(pref, torch.tensor([0, 0, 0, 1, 1, 2]))
    assert r2.tolist() == pytest.approx([1.0, 0.5, 0.0, 0.5, 0.5, 0.5])


def test_pairwise_win_rate_soft_by_hand_reads_only_same_group_pairs():
    """Soft judge probabilities, hand-computed; entries outside a group (even NaN) are never read. This is the one
    implementation: flow_grpo.rewards.win_rate is an alias and PairwisePreferenceReward calls it."""
    from flow_grpo.rewards import win_rate

    nan = float("nan")
    pref = torch.tensor([[0.0, 0.2, 0.7, nan],
                         [0.8, 0.0, 0.4, nan],
                         [0.3, 0.6, 0.0, nan],
                         [nan, nan, nan, 0.0]])
    gid = torch.tensor([5, 5, 5, 9])
    expected = [(0.2 + 0.7) / 2, (0.8 + 0.4) / 2, (0.3 + 0.6) / 2, 0.5]  # 0.45, 0.6, 0.45; singleton: 0.5
    r = pairwise_win_rate(pref, gid)
    assert r.dtype == torch.float32 and r.tolist() == pytest.approx(expected, abs=1e-7)
    assert torch.equal(win_rate(pref, gid), r)
    with pytest.raises(ValueError, match="square"):
        pairwise_win_rate(torch.zeros(3, 2), torch.tensor([0, 0, 1]))
    with pytest.raises(TypeError, match="integer"):
        pairwise_win_rate(torch.zeros(2, 2), torch.tensor([0.0, 1.0]))


def _tempsamp_ref(r, tau=0.8, a1=0.01, a2=1.0):
    if r >= tau:
        return tau + a1 * math.log((r - tau) + 1)
    return tau - (math.exp(a2 * (tau - r)) - 1) / (math.exp(a2) - 1)


@pytest.mark.parametrize("r", [0.0, 0.3, 0.8, 0.95, 1.0])
def test_tempsamp_shape_golden(r):
    assert tempsamp_shape(torch.tensor([r], dtype=torch.float64)).item() == pytest.approx(_tempsamp_ref(r), abs=1e-12)


def test_tempsamp_shape_paper_points():
    out = tempsamp_shape(torch.tensor([0.0, 0.8, 1.0]))
    assert out[0].item() == pytest.approx(0.0868, abs=1e-4)  # IoU 0 -> 0.087
    assert out[1].item() == pytest.approx(0.8)  # continuous at tau
    assert out[2].item() == pytest.approx(0.8018, abs=1e-4)  # IoU 1 -> 0.8018
    xs = torch.linspace(0, 1, 101, dtype=torch.float64)
    assert (tempsamp_shape(xs).diff() > 0).all()  # strictly increasing


def test_anchoring_and_diagnostics():
    # group 0: on-policy [0.2, 0.5, 0.6] + GT 1.0 ; group 1: on-policy [0.5, 0.5] + GT 1.0
    r = torch.tensor([0.2, 0.5, 0.6, 1.0, 0.5, 0.5, 1.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    off = torch.tensor([False, False, False, True, False, False, True])
    out = anchor_offpolicy_advantages(r, g, off, lam=1.2)
    a_on = _ref_adv([0.2, 0.5, 0.6], [0, 0, 0])
    assert out.advantages[:3].tolist() == pytest.approx(a_on, abs=1e-6)
    assert out.advantages[3].item() == pytest.approx(1.2 * max(a_on), abs=1e-6)
    assert out.advantages[4:].tolist() == pytest.approx([0.0, 0.0, 0.0])  # max on-policy A is 0
    assert anchor_offpolicy_advantages(r, g, off, min_value=0.5).advantages[6].item() == pytest.approx(0.5)

    mixed = group_advantages(r, g)  # joint normalisation: GT pushes the mean up
    d = offpolicy_diagnostics(r, mixed.advantages, g, off)
    # group 0: mu_op 1.3/3, mu_g 0.575 ; group 1: mu_op 0.5, mu_g 2/3
    assert d["mu_onpolicy"] == pytest.approx((1.3 / 3 + 0.5) / 2)
    assert d["mu_group"] == pytest.approx((0.575 + 2 / 3) / 2)
    # 0.5 is above mu_op=0.433 but below the mixed mean 0.575 -> 1 flip of 5 on-policy samples
    assert d["sign_flip_rate"] == pytest.approx(1 / 5)
    assert d["groups_no_positive_onpolicy"] == pytest.approx(0.5)  # group 1 has none > 0 (both negative)


