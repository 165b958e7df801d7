"""Golden tests of mmgrpo.core.loss_variants: values by hand or from the papers' formulas written out here, gradients
against hand-derived derivatives and central finite differences."""
import math

import pytest
import torch

from mmgrpo.core.loss_variants import (balanced_aggregate, balanced_counts, cispo_surrogate, dcpo_bounds,
                                       dcpo_surrogate, dhpo_surrogate, kl_schedule, sapo_surrogate)
from mmgrpo.core.losses import clipped_surrogate, log_ratio, sequence_log_ratio

D = torch.float64


def close(t, want):
    torch.testing.assert_close(t.detach().to(D), torch.tensor(want, dtype=D))


def _lr(x, old=None):
    logp = torch.tensor(x, dtype=D, requires_grad=True)
    old = torch.zeros_like(logp) if old is None else torch.tensor(old, dtype=D)
    return logp, log_ratio(logp, old, torch.ones_like(logp, dtype=torch.bool))


def test_cispo_gradient_is_the_clipped_weight_times_advantage():
    # ratios 2, 8 (capped at 5), 1, 0.5 ; A = +1 for row 0, -2 for row 1
    logp, lr = _lr([[math.log(2), math.log(8)], [0.0, math.log(0.5)]])
    adv = torch.tensor([1.0, -2.0], dtype=D)
    pg, m = cispo_surrogate(lr, adv, torch.ones(2, 2, dtype=torch.bool), max_ratio=5.0)
    pg.sum().backward()
    # d/dlogp of -w * A * (logp - old) with w detached: -w * A
    close(logp.grad, [[-2.0, -5.0], [2.0, 1.0]])
    assert m["cispo_capped_frac"] == pytest.approx(0.25)
    # value: -w A log rho
    close(pg.detach(), [[-2 * math.log(2), -5 * math.log(8)], [0.0, 2 * 0.5 * math.log(0.5)]])


def test_cispo_lower_bound_and_on_policy_equals_grpo_gradient():
    logp, lr = _lr([[math.log(0.1), 0.0]])
    pg, _ = cispo_surrogate(lr, torch.tensor([3.0], dtype=D), torch.ones(1, 2, dtype=torch.bool), 5.0, min_ratio=0.5)
    pg.sum().backward()
    close(logp.grad, [[-1.5, -3.0]])  # weight max(0.1, 0.5) = 0.5, then 1
    # on policy (rho = 1): CISPO's gradient is PPO's -A grad log pi
    a, lr1 = _lr([[0.3, -0.2]], old=[[0.3, -0.2]])
    b, lr2 = _lr([[0.3, -0.2]], old=[[0.3, -0.2]])
    m = torch.ones(1, 2, dtype=torch.bool)
    cispo_surrogate(lr1, torch.tensor([0.7], dtype=D), m)[0].sum().backward()
    clipped_surrogate(lr2, torch.tensor([0.7], dtype=D), m)[0].sum().backward()
    assert torch.allclose(a.grad, b.grad)


def _sapo_value(x, adv, tp, tn):
    tau = tp if adv > 0 else tn
    r = math.exp(x)
    return -(4 / tau) / (1 + math.exp(-tau * (r - 1))) * adv


@pytest.mark.parametrize("x,adv", [(0.0, 1.5), (0.4, 1.5), (-0.7, -2.0), (0.9, -0.3)])
def test_sapo_value_and_gradient_against_the_formula(x, adv):
    logp, lr = _lr([[x]])
    pg, _ = sapo_surrogate(lr, torch.tensor([adv], dtype=D), torch.ones(1, 1, dtype=torch.bool), 1.0, 1.05)
    assert float(pg.detach()) == pytest.approx(_sapo_value(x, adv, 1.0, 1.05), rel=1e-12)
    pg.sum().backward()
    h = 1e-6
    fd = (_sapo_value(x + h, adv, 1.0, 1.05) - _sapo_value(x - h, adv, 1.0, 1.05)) / (2 * h)
    assert float(logp.grad) == pytest.approx(fd, rel=1e-6)
    if x == 0.0:  # the gate's slope is 1 on policy: GRPO's gradient -A
        assert float(logp.grad) == pytest.approx(-adv)


def test_dcpo_bounds_by_hand_and_on_the_defining_curve():
    q = torch.tensor([1.0, 0.5, 0.1, 0.01, 0.001], dtype=D)
    lo, hi = dcpo_bounds(q.log(), 0.16, 0.2, 10.0)
    want_hi = [0.5 + 0.5 * math.sqrt(1 + 0.8 / v) for v in q.tolist()]
    want_hi = [min(h, 10.0) for h in want_hi]
    want_lo = [0.5 + 0.5 * math.sqrt(max(1 - 0.64 / v, 0.0)) for v in q.tolist()]
    assert hi.tolist() == pytest.approx(want_hi)
    assert lo.tolist() == pytest.approx(want_lo)
    assert hi[0] == pytest.approx(1.1708203932) and lo[0] == pytest.approx(0.8)  # q = 1: about PPO's region
    assert hi[3] == pytest.approx(5.0) and hi[4] == 10.0 and lo[2] == 0.5  # rare tokens: wide, capped
    # the bound solves (rho - 1) * rho * q = eps
    assert float((hi[1] - 1) * hi[1] * q[1]) == pytest.approx(0.2)
    assert float((1 - lo[0]) * lo[0] * q[0]) == pytest.approx(0.16)  # (q = 0.5 is below 4 eps_low: no lower bound)


def test_dcpo_surrogate_clips_at_the_token_bounds():
    old = torch.tensor([[0.0, math.log(0.01)]], dtype=D)  # q = 1 and 0.01
    logp = torch.tensor([[math.log(1.5), math.log(1.5 * 0.01)]], dtype=D, requires_grad=True)  # rho = 1.5 both
    lr = log_ratio(logp, old, torch.ones(1, 2, dtype=torch.bool))
    pg, m = dcpo_surrogate(lr, torch.tensor([1.0], dtype=D), torch.ones(1, 2, dtype=torch.bool), old)
    pg.sum().backward()
    # q = 1: bound 1.1708 < 1.5 -> clipped, no gradient; q = 0.01: bound 5 > 1.5 -> unclipped, gradient -A rho
    close(pg.detach(), [[-1.1708203932, -1.5]])
    close(logp.grad, [[0.0, -1.5]])
    assert m["clip_frac_high"] == pytest.approx(0.5)


def test_dhpo_endpoints_are_grpo_and_gspo_and_the_mix_by_hand():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    lr = torch.tensor([[0.3, -0.1, 0.05], [0.0, 0.2, 0.0]], dtype=D)
    adv = torch.tensor([1.0, -0.5], dtype=D)
    tok, _ = clipped_surrogate(lr, adv, mask, 0.2, 0.28)
    assert torch.allclose(dhpo_surrogate(lr, adv, mask, 1.0, 0.2, 0.28)[0][mask], tok[mask])
    seq, _ = clipped_surrogate(sequence_log_ratio(lr, mask), adv, mask, 3e-4, 4e-4)
    assert torch.allclose(dhpo_surrogate(lr, adv, mask, 0.0, 0.2, 0.28)[0][mask], seq[mask])
    # w = 0.5, row 0 token 0: rho_t = e^0.3 (clip 1.28), s = e^(0.25/3) (clip 1.0004); A = 1 -> max(-h, -h_c)
    rt, s = math.exp(0.3), math.exp(0.25 / 3)
    h, hc = 0.5 * rt + 0.5 * s, 0.5 * 1.28 + 0.5 * 1.0004
    assert float(dhpo_surrogate(lr, adv, mask, 0.5, 0.2, 0.28)[0][0, 0]) == pytest.approx(max(-h, -hc))


def test_balanced_aggregation_by_hand_and_split_into_micro_batches():
    # rows: A = +1 (2 tokens), -1 (3 tokens), -2 (1 token), 0 (2 tokens)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)
    loss = torch.tensor([[1.0, 3.0, 9.0], [2.0, 2.0, 5.0], [6.0, 9.0, 9.0], [7.0, 7.0, 9.0]], dtype=D)
    adv = torch.tensor([1.0, -1.0, -2.0, 0.0], dtype=D)
    # N+ = 1, N- = 2, N = 4; T+ = 2, T- = 4; positive sum 4, negative sum 9 + 6 = 15
    want = (1 / 4) * 4 / 2 + (2 / 4) * 15 / 4
    assert float(balanced_aggregate(loss, mask, adv)) == pytest.approx(want)
    c = balanced_counts(adv, mask)
    assert c == {"pos_tokens": 2.0, "neg_tokens": 4.0, "pos_seqs": 1.0, "neg_seqs": 2.0, "seqs": 4.0}
    parts = [balanced_aggregate(loss[i:j], mask[i:j], adv[i:j], c) for i, j in ((0, 2), (2, 4))]
    assert float(sum(parts)) == pytest.approx(want)
    # a long wrong answer does not outweigh the right one by its token count: doubling the negative tokens' count
    # leaves the negative half's weight at N-/N
    assert balanced_aggregate(torch.ones(2, 4, dtype=D), torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]]),
                              torch.tensor([1.0, -1.0], dtype=D)).item() == pytest.approx(0.5 + 0.5)


@pytest.mark.parametrize("step,shape,want", [
    (0, "linear", 0.0), (5, "linear", 0.0), (10, "linear", 0.0), (15, "linear", 0.01), (30, "linear", 0.04),
    (99, "linear", 0.04), (15, "cosine", 0.04 - 0.02 * (1 + math.sqrt(0.5))), (12, "cosine", 0.04 + (0.0 - 0.04) * 0.5 * (1 + math.cos(math.pi * 0.1))),
    (3, "constant", 0.0), (10, "constant", 0.04)])
def test_kl_schedule_by_hand(step, shape, want):
    assert kl_schedule(step, 0.0, 0.04, steps=20, shape=shape, warmup=10) == pytest.approx(want)


def test_bad_options_are_errors():
    m = torch.ones(1, 1, dtype=torch.bool)
    z = torch.zeros(1, 1, dtype=D)
    with pytest.raises(ValueError):
        cispo_surrogate(z, torch.ones(1, dtype=D), m, max_ratio=1.0, min_ratio=2.0)
    with pytest.raises(ValueError):
        sapo_surrogate(z, torch.ones(1, dtype=D), m, tau_pos=0.0)
    with pytest.raises(ValueError):
        dhpo_surrogate(z, torch.ones(1, dtype=D), m, token_weight=1.5)
    with pytest.raises(ValueError):
        kl_schedule(0, 0.0, 0.1, steps=0)
