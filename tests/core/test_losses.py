"""Golden tests for mmgrpo.core.losses: hand-worked numbers, autograd identities, torch.distributions KL. The loss
pieces are checked as the recipes compose them (the VLM default loss :func:`mmgrpo.vlm.methods.base.grpo_loss`,
Reg-GRPO's :func:`mmgrpo.vlm.methods.reg_grpo.reg_loss`) and one by one."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmgrpo.core import aggregate_loss, kl_penalty
from mmgrpo.core.losses import clipped_surrogate, log_ratio, ratio_metrics, reg_grpo_loss, sequence_log_ratio
from mmgrpo.vlm.config import AlgoConfig
from mmgrpo.vlm.methods.base import LossInputs, grpo_loss
from mmgrpo.vlm.methods.reg_grpo import reg_loss


def policy_loss(logp, old_logp, advantages, mask, *, token_weights=None, ref_logp=None, group_ids=None, **algo):
    """The recipes' policy loss of these tensors (local counts) with the ``algo.*`` settings ``algo``."""
    li = LossInputs(logp, old_logp, advantages, mask, group_ids=group_ids, token_weights=token_weights,
                    ref_logp=ref_logp, algo=AlgoConfig(**algo))
    return reg_loss(li) if li.algo.loss_type == "reg" else grpo_loss(li)


def _one(logratio, adv, **kw):
    lp = torch.tensor([[logratio]], dtype=torch.float64)
    return policy_loss(lp, torch.zeros_like(lp), torch.tensor([adv], dtype=torch.float64),
                       torch.ones_like(lp, dtype=torch.bool), **kw)


@pytest.mark.parametrize("ratio,adv,kw,expected", [
    (1.5, 1.0, {}, -1.2),                                  # clipped at 1+0.2
    (1.1, 1.0, {}, -1.1),                                  # inside the trust region
    (0.5, 1.0, {}, -0.5),                                  # A>0, ratio low: unclipped (pessimistic) branch
    (0.5, -1.0, {}, 0.8),                                  # A<0, ratio low: clipped at 1-0.2
    (1.5, -1.0, {}, 1.5),                                  # A<0, ratio high: unclipped
    (1.5, 1.0, {"clip_high": 0.28}, -1.28),                # DAPO clip-higher
    (0.5, -1.0, {"clip_low": 0.1, "clip_high": 0.3}, 0.9),
    (5.0, -1.0, {"dual_clip": 3.0}, 3.0),                  # dual-clip caps the loss at -c*A
    (2.0, -1.0, {"dual_clip": 3.0}, 2.0),                  # below the cap: unchanged
    (5.0, 1.0, {"dual_clip": 3.0}, -1.2),                  # dual clip only for A<0
])
def test_clip_golden(ratio, adv, kw, expected):
    out = _one(math.log(ratio), adv, **kw)
    assert out.loss.item() == pytest.approx(expected, abs=1e-9)


def test_clip_fraction_metrics():
    lp = torch.log(torch.tensor([[1.5, 0.5, 1.0, 0.7]], dtype=torch.float64))
    mask = torch.tensor([[True, True, True, False]])
    out = policy_loss(lp, torch.zeros_like(lp), torch.tensor([1.0], dtype=torch.float64), mask)
    assert out.metrics["clip_frac_high"] == pytest.approx(1 / 3)
    assert out.metrics["clip_frac_low"] == 0.0  # A>0: low side not clipped
    assert out.metrics["ratio_max"] == pytest.approx(1.5)
    assert out.metrics["ratio_min"] == pytest.approx(0.5)
    assert out.metrics["ratio_mean"] == pytest.approx(1.0)
    assert out.metrics["approx_kl"] == pytest.approx(0.5 * (math.log(1.5) ** 2 + math.log(0.5) ** 2) / 3)
    out2 = policy_loss(lp, torch.zeros_like(lp), torch.tensor([-1.0], dtype=torch.float64), mask)
    assert out2.metrics["clip_frac_low"] == pytest.approx(1 / 3)


def test_gspo_sequence_ratio():
    # tokens log-ratios [log 2, 0] -> sequence ratio exp(log(2)/2) = sqrt 2 -> clipped at 1.2 for A=1
    lp = torch.tensor([[math.log(2.0), 0.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False]])
    out = policy_loss(lp, torch.zeros_like(lp), torch.tensor([1.0], dtype=torch.float64), mask,
                      ratio_level="sequence", clip_low=0.5)
    assert out.loss.item() == pytest.approx(-math.sqrt(2), abs=1e-9)
    out = policy_loss(lp, torch.zeros_like(lp), torch.tensor([1.0], dtype=torch.float64), mask,
                      ratio_level="sequence")
    assert out.loss.item() == pytest.approx(-1.2, abs=1e-9)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "local_token_mean"])
@pytest.mark.parametrize("ratio_level", ["token", "sequence"])
def test_ratio_one_gradient_is_policy_gradient(agg, ratio_level):
    """At ratio 1 the clipped surrogate's gradient equals the plain policy gradient -A * grad log pi."""
    torch.manual_seed(0)
    logits = torch.randn(3, 5, requires_grad=True, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([0.7, -1.3, 2.0], dtype=torch.float64)
    lp = torch.nn.functional.logsigmoid(logits)
    out = policy_loss(lp, lp.detach(), adv, mask, agg=agg, ratio_level=ratio_level)
    (g1,) = torch.autograd.grad(out.loss, logits)
    lp2 = torch.nn.functional.logsigmoid(logits)
    if ratio_level == "token":
        plain = aggregate_loss(-adv.unsqueeze(1) * lp2, mask, agg)
    else:  # GSPO: d/dθ of exp(mean_t log ratio) at ratio 1 is the token-mean of grad log pi, per sequence
        seq_mean = (lp2 * mask).sum(1) / mask.sum(1)
        plain = aggregate_loss((-adv * seq_mean).unsqueeze(1).expand_as(lp2), mask, agg)
    (g2,) = torch.autograd.grad(plain, logits)
    assert torch.allclose(g1, g2, atol=1e-12)


def test_aggregation_weights_for_unequal_lengths():
    """d loss / d per-token loss = the documented token weights."""
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    lens = [2, 4, 1]
    n = 3
    cases = {
        "token_mean": [1 / 7] * 3,
        "local_token_mean": [1 / 7] * 3,
        "seq_mean_token_mean": [1 / (n * L) for L in lens],
        "seq_mean_token_sum_norm": [1 / (n * 4)] * 3,
    }
    for mode, w in cases.items():
        x = torch.zeros(3, 4, dtype=torch.float64, requires_grad=True)
        (g,) = torch.autograd.grad(aggregate_loss(x, mask, mode), x)
        for i in range(3):
            assert g[i, : lens[i]].tolist() == pytest.approx([w[i]] * lens[i]), mode
            assert (g[i, lens[i]:] == 0).all()
    x = torch.zeros(3, 4, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(aggregate_loss(x, mask, "token_mean", num_tokens=14), x)
    assert g[1, 0].item() == pytest.approx(1 / 14)  # global accumulated token count
    (g,) = torch.autograd.grad(aggregate_loss(x, mask, "seq_mean_token_sum_norm", max_len=10), x)
    assert g[0, 0].item() == pytest.approx(1 / 30)
    with pytest.raises(ValueError):
        aggregate_loss(x, mask, "nope")


def test_seq_mean_counts_only_rows_with_a_loss_token_unlike_trl():
    """docs/trl_parity.md, divergence 1: a fully masked row (a truncated completion under
    mask_truncated_completions) leaves the denominator. TRL's ``loss_type="grpo"``,
    ((l * m).sum(-1) / m.sum(-1).clamp(min=1)).mean(), counts it: with 1 of 3 rows masked its step is 2/3 of ours."""
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    x = torch.tensor([[1.0, 3.0, 9.0], [2.0, 4.0, 6.0], [5.0, 5.0, 5.0]], dtype=torch.float64)
    ours = aggregate_loss(x, mask, "seq_mean_token_mean")
    assert ours.item() == pytest.approx((2.0 + 4.0) / 2)  # row means 2 and 4, over the 2 rows that have tokens
    trl = (2.0 + 4.0 + 0.0) / 3  # the same rows, divided by all 3
    assert ours.item() == pytest.approx(trl * 3 / 2)
    # no fully masked row: the two rules agree
    full = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    assert aggregate_loss(x, full, "seq_mean_token_mean").item() == pytest.approx((2.0 + 4.0 + 5.0) / 3)


def test_kl_estimators_hand_values():
    lp, ref = torch.tensor([-1.0], dtype=torch.float64), torch.tensor([-2.0], dtype=torch.float64)
    assert kl_penalty(lp, ref, "k1").item() == pytest.approx(1.0)
    assert kl_penalty(lp, ref, "k2").item() == pytest.approx(0.5)
    assert kl_penalty(lp, ref, "k3").item() == pytest.approx(math.exp(-1) + 1 - 1)
    assert kl_penalty(lp, lp, "k3").item() == 0.0
    big = kl_penalty(torch.tensor([-100.0]), torch.tensor([0.0]), "k3")
    assert torch.isfinite(big) and big.item() == 10.0  # clamped


@pytest.mark.parametrize("est", ["k1", "k3"])
def test_kl_estimators_are_unbiased(est):
    """Monte-Carlo mean under pi matches torch.distributions' exact KL(pi || ref) (k1, k3 are unbiased)."""
    g = torch.Generator().manual_seed(0)
    p = torch.distributions.Categorical(logits=torch.tensor([0.5, -0.2, 1.0, 0.0]))
    q = torch.distributions.Categorical(logits=torch.tensor([0.0, 0.3, 0.2, -0.5]))
    x = torch.multinomial(p.probs, 400_000, replacement=True, generator=g)
    est_v = kl_penalty(p.log_prob(x).double(), q.log_prob(x).double(), est, clamp=None).mean().item()
    exact = torch.distributions.kl_divergence(p, q).item()
    assert est_v == pytest.approx(exact, abs=3e-3)


def test_kl_term_added_to_loss():
    lp = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    ref = torch.tensor([[-2.0, -1.0]], dtype=torch.float64)
    m = torch.ones_like(lp, dtype=torch.bool)
    out = policy_loss(lp, lp, torch.tensor([0.0], dtype=torch.float64), m, ref_logp=ref, kl_coef=0.1,
                      kl_estimator="k3")
    assert out.loss.item() == pytest.approx(0.1 * (math.exp(-1)) / 2)
    assert out.metrics["kl"] == pytest.approx(math.exp(-1) / 2)
    with pytest.raises(ValueError):
        policy_loss(lp, lp, torch.zeros(1), m, kl_coef=0.1)


def test_token_weights():
    lp = torch.zeros(1, 2, dtype=torch.float64)
    out = policy_loss(lp, lp, torch.tensor([1.0], dtype=torch.float64), torch.ones(1, 2, dtype=torch.bool),
                      token_weights=torch.tensor([[1.0, 1.7]], dtype=torch.float64))
    assert out.loss.item() == pytest.approx(-(1.0 + 1.7) / 2)


def test_per_step_advantages():
    lp = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.0, 0.0]], dtype=torch.float64)
    out = policy_loss(lp, lp, adv, torch.ones(2, 3, dtype=torch.bool))
    assert out.loss.item() == pytest.approx(-(1 + 2 + 3 - 1) / 6)


def test_reg_grpo_golden_and_gradient_finite():
    # two groups of two; sequence log-ratios: g0: [0.2, 0.0] -> normalised [+1/√2·..]; hand-compute below
    lp = torch.tensor([[0.1, 0.1], [0.0, 0.0], [0.3, 0.0], [-0.1, 0.0]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(4, 2, dtype=torch.float64)
    m = torch.ones(4, 2, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)
    g = torch.tensor([0, 0, 1, 1])
    out = policy_loss(lp, old, adv, m, loss_type="reg", group_ids=g)
    # group 0: rho = [0.2, 0.0], mean 0.1, unbiased std = 0.1*sqrt(2) ; group 1: rho = [0.3, -0.1], mean 0.1, std 0.2*sqrt(2)
    s0, s1 = 0.1 * math.sqrt(2), 0.2 * math.sqrt(2)
    ahat = [0.1 / (s0 + 1e-4), -0.1 / (s0 + 1e-4), 0.2 / (s1 + 1e-4), -0.2 / (s1 + 1e-4)]
    ref = sum((a - h) ** 2 for a, h in zip(adv.tolist(), ahat)) / 4
    assert out.loss.item() == pytest.approx(ref, rel=1e-6)
    # at ratio 1 every rho is 0: loss is mean A^2 and gradients stay finite
    lp0 = torch.zeros(4, 2, dtype=torch.float64, requires_grad=True)
    out0 = policy_loss(lp0, lp0.detach(), adv, m, loss_type="reg", group_ids=g)
    assert out0.loss.item() == pytest.approx((adv ** 2).mean().item())
    out0.loss.backward()
    assert torch.isfinite(lp0.grad).all()
    with pytest.raises(ValueError, match="group_ids"):
        reg_grpo_loss(log_ratio(lp, old, m), adv, m, None)


def test_masked_garbage_does_not_leak():
    lp = torch.tensor([[0.0, 1e4]], dtype=torch.float64, requires_grad=True)
    out = policy_loss(lp, torch.tensor([[0.0, -1e4]], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64),
                      torch.tensor([[True, False]]))
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(lp.grad).all()


def test_entropy_metric():
    logits = torch.zeros(1, 2, 4)
    m = ratio_metrics(torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool), logits=logits)
    assert m["entropy"] == pytest.approx(math.log(4), rel=1e-6)


def test_pieces_compose_to_the_default_loss():
    """log_ratio -> (sequence_log_ratio) -> clipped_surrogate -> token mean is the default loss, term by term."""
    g = torch.Generator().manual_seed(0)
    lp, old = torch.randn(3, 4, generator=g, dtype=torch.float64), torch.randn(3, 4, generator=g, dtype=torch.float64)
    adv, m = torch.randn(3, generator=g, dtype=torch.float64), torch.rand(3, 4, generator=g) > 0.3
    for level in ("token", "sequence"):
        lr = log_ratio(lp, old, m)
        used = sequence_log_ratio(lr, m) if level == "sequence" else lr
        pg, clip_m = clipped_surrogate(used, adv, m, 0.2, 0.28)
        want = aggregate_loss(torch.where(m, pg, torch.zeros_like(pg)), m, "token_mean")
        out = policy_loss(lp, old, adv, m, clip_high=0.28, ratio_level=level)
        assert out.loss.item() == want.item() and clip_m.items() <= out.metrics.items()


small = st.floats(min_value=-30, max_value=30, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(small, small, st.floats(-10, 10), st.booleans()), min_size=1, max_size=12),
       st.sampled_from(["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "local_token_mean"]),
       st.sampled_from(["token", "sequence"]), st.booleans())
def test_losses_finite_for_finite_inputs(rows, agg, level, dual):
    lp = torch.tensor([[r[0] for r in rows]], dtype=torch.float32, requires_grad=True)
    old = torch.tensor([[r[1] for r in rows]], dtype=torch.float32)
    adv = torch.tensor([[r[2] for r in rows]], dtype=torch.float32)
    mask = torch.tensor([[r[3] for r in rows]])
    out = policy_loss(lp, old, adv, mask, agg=agg, ratio_level=level, dual_clip=3.0 if dual else None,
                      ref_logp=old, kl_coef=0.1)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(lp.grad).all()
