"""Golden tests of mmgrpo.core.advantage_variants: BNPO's Beta normalisation with the density written out by hand
(math.gamma), DCPO's smooth standardisation with statistics computed by the statistics module."""
import math
import statistics

import pytest
import torch

from mmgrpo.core.advantage_variants import PromptStats, beta_moments, bnpo_advantages, dcpo_smooth_advantages


def _beta_pdf(p, a, b):
    return p ** (a - 1) * (1 - p) ** (b - 1) * math.gamma(a + b) / (math.gamma(a) * math.gamma(b))


def test_beta_moments_by_hand():
    a, b = beta_moments(torch.tensor([0.25, 0.75]))
    # m = 0.5, v = 0.125 (unbiased), m(1-m)/v - 1 = 1
    assert (a, b) == pytest.approx((0.5, 0.5))


def test_bnpo_advantages_by_hand():
    # two groups of 4 binary rewards: success rates 0.25 and 0.75 -> a = b = 0.5 -> alpha = beta = 1 + 0.5/3
    r = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    out = bnpo_advantages(r, g)
    al = 1 + 0.5 / 3
    assert out.beta_params == pytest.approx((al, al))
    f25, f75 = _beta_pdf(0.25, al, al), _beta_pdf(0.75, al, al)
    want = [0.75 / f25] + [-0.25 / f25] * 3 + [0.25 / f75] * 3 + [-0.75 / f75]
    assert out.advantages.tolist() == pytest.approx(want, rel=1e-6)
    assert out.zero_std_fraction == 0.0


def test_bnpo_reward_range_tied_groups_and_invalid_rows():
    # rewards in [0, 2] mapped to [0, 1]; group 1 ties (advantage 0); row 7 invalid (0, no statistics)
    r = torch.tensor([2.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, float("nan")])
    g = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    valid = torch.tensor([True] * 7 + [False])
    out = bnpo_advantages(r, g, valid=valid, max_reward=2.0)
    # rates: g0 = mean(1, 0, 0.5) = 0.5, g1 = 0.5, g2 = one member -> 0 (the release's rule)
    a, b = beta_moments(torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64))
    al, be = max(1 + a / 3, 1), max(1 + b / 3, 1)
    f = _beta_pdf(0.5, al, be)
    assert out.advantages[:3].tolist() == pytest.approx([0.5 / f, -0.5 / f, 0.0], abs=1e-7)
    assert out.advantages[3:].tolist() == [0.0] * 5
    assert bool(out.zero_std_mask[3:6].all())
    with pytest.raises(ValueError, match="max_reward"):
        bnpo_advantages(torch.tensor([1.1, 0.0]), torch.tensor([0, 0]))


def test_dcpo_first_visit_is_grpo_and_a_tied_group_keeps_a_history_signal():
    st = PromptStats()
    g = torch.tensor([0, 0, 0, 0])
    r1 = [1.0, 0.0, 0.0, 0.0]
    out1 = dcpo_smooth_advantages(torch.tensor(r1), g, ["p"] * 4, st, eps=0.0)
    mu, sd = statistics.mean(r1), statistics.stdev(r1)
    assert out1.advantages.tolist() == pytest.approx([(x - mu) / sd for x in r1])
    # second visit, every reward 0: GRPO gives 0; history of 8 rewards (one 1): A_tot = (0 - 1/8) / stdev
    r2 = [0.0] * 4
    out2 = dcpo_smooth_advantages(torch.tensor(r2), g, ["p"] * 4, st, eps=0.0)
    hist = r1 + r2
    a_tot = (0 - statistics.mean(hist)) / statistics.stdev(hist)
    assert out2.advantages.tolist() == pytest.approx([a_tot / 2] * 4)  # min(|0/2 + a/2|, |0/2 + a/2|)
    # third visit: the smaller of SA_new = 2/3 A_new + 1/3 A_tot and SA_tot = 1/3 A_new + 2/3 A_tot, by |.|
    r3 = [1.0, 1.0, 0.0, 0.0]
    out3 = dcpo_smooth_advantages(torch.tensor(r3), g, ["p"] * 4, st, eps=0.0)
    hist += r3
    m3, s3 = statistics.mean(r3), statistics.stdev(r3)
    mt, stt = statistics.mean(hist), statistics.stdev(hist)
    want = []
    for x in r3:
        an, at = (x - m3) / s3, (x - mt) / stt
        sn, stot = 2 / 3 * an + at / 3, an / 3 + 2 / 3 * at
        want.append(sn if abs(sn) < abs(stot) else stot)
    assert out3.advantages.tolist() == pytest.approx(want)
    # the history round-trips through a checkpoint
    st2 = PromptStats()
    st2.load_state_dict(st.state_dict())
    assert st2.table == st.table and st.table["p"][0] == 3


def test_dcpo_groups_are_separate_and_invalid_rows_leave_the_statistics():
    st = PromptStats()
    r = torch.tensor([1.0, 0.0, 5.0, 0.5, 0.5, 0.0])
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    valid = torch.tensor([True, True, False, True, True, True])
    out = dcpo_smooth_advantages(r, g, ["a", "a", "a", "b", "b", "b"], st, valid=valid, eps=0.0)
    s = statistics.stdev([1.0, 0.0])
    assert out.advantages[:3].tolist() == pytest.approx([0.5 / s, -0.5 / s, 0.0])
    assert st.table["a"][1] == 2  # the invalid reward was not counted
    with pytest.raises(ValueError, match="mixes prompt keys"):
        dcpo_smooth_advantages(r[:2], g[:2], ["a", "b"], st)
