"""DiffusionNFT: the loss, its gradient and the schedules against values computed by hand / finite differences."""
import math

import pytest
import torch

from flow_grpo.methods import nft

# Two samples of two elements each (D = 2): small enough to write every number down.
V = [[0.3, -0.2], [0.1, 0.4]]       # v_theta
VO = [[0.1, 0.0], [0.2, 0.5]]       # v_old
X0 = [[0.5, -0.5], [1.0, 0.0]]
EPS = [[0.2, 0.1], [-0.3, 0.6]]
T = [0.6, 0.3]
R = [0.8, 0.25]


def _plain_loss(v, beta, r=R, t=T, x0=X0, eps=EPS, vo=VO, w=None, amax=5.0):
    """The loss in plain Python floats, written from the formula; ``w`` optionally freezes the weights.
    Returns (loss, weights)."""
    total, weights = 0.0, []
    for i in range(2):
        xt = [(1 - t[i]) * x0[i][j] + t[i] * eps[i][j] for j in range(2)]
        vp = [beta * v[i][j] + (1 - beta) * vo[i][j] for j in range(2)]
        vn = [(1 + beta) * vo[i][j] - beta * v[i][j] for j in range(2)]
        dp = [xt[j] - t[i] * vp[j] - x0[i][j] for j in range(2)]
        dn = [xt[j] - t[i] * vn[j] - x0[i][j] for j in range(2)]
        wp, wn = (max(sum(abs(d) for d in dp) / 2, 1e-5), max(sum(abs(d) for d in dn) / 2, 1e-5)) if w is None \
            else w[i]
        weights.append((wp, wn))
        pos = sum(d * d for d in dp) / 2 / wp
        neg = sum(d * d for d in dn) / 2 / wn
        total += (r[i] * pos + (1 - r[i]) * neg) / beta
    return amax * total / 2, weights


def _tensors():
    v = torch.tensor(V, requires_grad=True)
    x0, eps, t = torch.tensor(X0), torch.tensor(EPS), torch.tensor(T)
    return v, torch.tensor(VO), x0, nft.noised(x0, eps, t), t


@pytest.mark.parametrize("beta", [1.0, 0.1])
def test_loss_value_by_hand(beta):
    v, vo, x0, xt, t = _tensors()
    out = nft.nft_loss(v, vo, x0, xt, t, torch.tensor(R), beta=beta)
    ref, _ = _plain_loss(V, beta)
    assert float(out.loss.detach()) == pytest.approx(ref, rel=1e-5)


def test_one_number_fully_by_hand():
    # sample 0, beta = 1: x_t = 0.4*[0.5,-0.5] + 0.6*[0.2,0.1] = [0.32,-0.14]; v+ = v = [0.3,-0.2];
    # x0+ = x_t - 0.6 v+ = [0.14,-0.02]; d+ = [-0.36, 0.48]; w+ = 0.42; pos = (0.1296+0.2304)/2/0.42
    # v- = 2 v_old - v = [-0.1, 0.2]; x0- = [0.38,-0.26]; d- = [-0.12,0.24]; w- = 0.18; neg = (0.0144+0.0576)/2/0.18
    pos, neg = 0.18 / 0.42, 0.036 / 0.18
    v, vo, x0, xt, t = _tensors()
    out = nft.nft_loss(v, vo, x0, xt, t, torch.tensor(R), beta=1.0)
    assert float(out.positive[0]) == pytest.approx(pos, rel=1e-5)
    assert float(out.negative[0]) == pytest.approx(neg, rel=1e-5)
    assert float(out.per_sample[0].detach()) == pytest.approx(0.8 * pos + 0.2 * neg, rel=1e-5)


@pytest.mark.parametrize("beta", [1.0, 0.1])
def test_gradient_closed_form_and_finite_differences(beta):
    v, vo, x0, xt, t = _tensors()
    out = nft.nft_loss(v, vo, x0, xt, t, torch.tensor(R), beta=beta)
    out.loss.backward()
    g = v.grad.double()
    # finite differences of the plain-float loss with the (detached) weights frozen at their values
    _, w = _plain_loss(V, beta)
    h = 1e-6
    fd = torch.zeros(2, 2, dtype=torch.float64)
    for i in range(2):
        for j in range(2):
            vp = [row[:] for row in V]
            vm = [row[:] for row in V]
            vp[i][j] += h
            vm[i][j] -= h
            fd[i, j] = (_plain_loss(vp, beta, w=w)[0] - _plain_loss(vm, beta, w=w)[0]) / (2 * h)
    torch.testing.assert_close(g, fd, rtol=1e-4, atol=1e-6)
    # closed form: d l_i / d v = (2 t / D) [-r d+/w+ + (1-r) d-/w-], times A_max / B (beta cancels)
    for i in range(2):
        xt_i = [(1 - T[i]) * X0[i][j] + T[i] * EPS[i][j] for j in range(2)]
        for j in range(2):
            vpos = beta * V[i][j] + (1 - beta) * VO[i][j]
            vneg = (1 + beta) * VO[i][j] - beta * V[i][j]
            dpos = xt_i[j] - T[i] * vpos - X0[i][j]
            dneg = xt_i[j] - T[i] * vneg - X0[i][j]
            ref = 5.0 / 2 * (2 * T[i] / 2) * (-R[i] * dpos / w[i][0] + (1 - R[i]) * dneg / w[i][1])
            assert float(g[i, j]) == pytest.approx(ref, rel=1e-4, abs=1e-7)


def test_on_policy_half_weight_has_no_gradient_and_full_weight_is_flow_matching():
    v, _, x0, xt, t = _tensors()
    vo = v.detach().clone()  # on-policy: v_theta == v_old
    nft.nft_loss(v, vo, x0, xt, t, torch.tensor([0.5, 0.5]), beta=0.3).loss.backward()
    assert v.grad.abs().max() < 1e-6
    v.grad = None
    nft.nft_loss(v, vo, x0, xt, t, torch.tensor([1.0, 1.0]), beta=0.3).loss.backward()
    # gradient of the weighted flow-matching loss 5 * mean_i mean_j (x_t - t v - x0)^2 / w, w frozen
    d = xt - t[:, None] * v.detach() - x0
    w = d.abs().mean(1, keepdim=True)
    ref = 5.0 / 2 * (2 / 2) * (-t[:, None]) * d / w
    torch.testing.assert_close(v.grad, ref, rtol=1e-5, atol=1e-7)


def test_kl_term_and_its_validation():
    v, vo, x0, xt, t = _tensors()
    vref = torch.zeros(2, 2)
    base = nft.nft_loss(v, vo, x0, xt, t, torch.tensor(R), beta=1.0)
    out = nft.nft_loss(v, vo, x0, xt, t, torch.tensor(R), beta=1.0, v_ref=vref, kl_beta=0.01)
    kl = [(0.09 + 0.04) / 2, (0.01 + 0.16) / 2]
    assert out.kl.tolist() == pytest.approx(kl, rel=1e-5)
    assert float(out.loss - base.loss) == pytest.approx(0.01 * sum(kl) / 2, rel=1e-4)
    with pytest.raises(ValueError, match="v_ref"):
        nft.nft_loss(v, vo, x0, xt, t, torch.tensor(R), kl_beta=0.01)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        nft.nft_loss(v, vo, x0, xt, t, torch.tensor([1.5, 0.0]))


def test_adaptive_weight_floor_and_detached():
    x = torch.zeros(2, 3, requires_grad=True)
    w = nft.adaptive_weight(x, torch.tensor([[0.0, 0.0, 0.0], [0.3, -0.6, 0.0]]))
    assert w.dtype == torch.float64 and not w.requires_grad
    assert w.flatten().tolist() == pytest.approx([1e-5, 0.3])


def test_reward_weight_by_hand():
    a = torch.tensor([-7.0, -5.0, -2.5, 0.0, 2.5, 5.0, 7.0])
    assert nft.reward_weight(a).tolist() == pytest.approx([0, 0, 0.25, 0.5, 0.75, 1, 1])
    assert nft.reward_weight(a, mode="positive_only").tolist() == pytest.approx([.5, .5, .5, .5, .75, 1, 1])
    assert nft.reward_weight(a, mode="negative_only").tolist() == pytest.approx([0, 0, .25, .5, .5, .5, .5])
    assert nft.reward_weight(a, mode="one_only").tolist() == pytest.approx([.5, .5, .5, .5, .6, .6, .6])
    assert nft.reward_weight(a, mode="binary").tolist() == pytest.approx([.4, .4, .4, .5, .6, .6, .6])
    assert nft.reward_weight(torch.tensor([1.0]), adv_clip_max=2.0).tolist() == pytest.approx([0.75])
    with pytest.raises(ValueError, match="adv_mode"):
        nft.reward_weight(a, mode="nope")


def test_advantages_group_mean_global_population_std():
    adv = nft.advantages(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([0, 0, 1, 1]))
    s = math.sqrt(1.25)  # population std of 1..4
    assert adv.tolist() == pytest.approx([-0.5 / (s + 1e-4), 0.5 / (s + 1e-4)] * 2, rel=1e-6)


def test_noised_and_x0_roundtrip():
    x0, eps = torch.tensor([[1.0, -2.0]]), torch.tensor([[0.5, 0.5]])
    xt = nft.noised(x0, eps, 0.25)
    assert xt.tolist() == [[0.875, -1.375]]
    # the true velocity eps - x0 recovers x0 exactly
    assert nft.x0_from_velocity(xt, eps - x0, 0.25).tolist() == [[1.0, -2.0]]


def test_old_decay_schedules():
    assert [nft.old_decay(s, 0) for s in (0, 10, 10_000)] == [0.0, 0.0, 0.0]
    assert [nft.old_decay(s, 1) for s in (0, 100, 499, 10_000)] == pytest.approx([0.0, 0.1, 0.499, 0.5])
    assert [nft.old_decay(s, 2) for s in (0, 74, 75, 76, 200, 10_000)] == pytest.approx(
        [0.0, 0.0, 0.0, 0.0075, 0.9375, 0.999])
    assert nft.old_decay(12, None, flat=10, uprate=0.1, uphold=0.15) == pytest.approx(0.15)
    with pytest.raises(ValueError, match="decay_type"):
        nft.old_decay(1, 7)


def test_ema_update_in_place():
    old, new = [torch.tensor([1.0, 2.0])], [torch.tensor([3.0, 4.0])]
    nft.ema_update_(old, new, 0.25)
    assert old[0].tolist() == [2.5, 3.5]
    nft.ema_update_(old, new, 0.0)  # decay 0: the old adapter becomes a copy
    assert old[0].tolist() == [3.0, 4.0]


def test_train_timestep_indices_is_a_per_sample_subset():
    idx = nft.train_timestep_indices(4, 10, 0.99, generator=torch.Generator().manual_seed(0))
    assert idx.shape == (4, 9)  # int(10 * 0.99) = 9
    for row in idx.tolist():
        assert len(set(row)) == 9 and all(0 <= k < 10 for k in row)
    assert len({tuple(r) for r in idx.tolist()}) > 1  # not one shared order
    with pytest.raises(ValueError):
        nft.train_timestep_indices(1, 10, 0.05)


def test_forward_loss_on_a_tiny_sd3_on_policy_half_weight_gives_no_gradient():
    from flow_grpo.ema import EMA
    from tests.flow_grpo.conftest import make_adapter

    ad = make_adapter("sd3")
    params = ad.trainable_parameters()
    with torch.no_grad():  # move the LoRA off its zero init so the adapter differs from the reference
        for p in params:
            p.add_(0.05 * torch.randn_like(p))
    old = EMA(params, decay=0.0)  # the old adapter is a copy of the current one: on-policy
    emb = ad.encode_prompts(["a cat", "a dog"])
    ad.set_resolution(64, 64)
    x0 = ad.initial_noise([1, 2], 64, 64) * 0.5
    noise = ad.initial_noise([3, 4], 64, 64)
    out = nft.forward_loss(ad, x0, 0.6, emb, noise, torch.tensor([0.5, 0.5]), old, beta=1.0, kl_beta=0.1)
    out.loss.backward()
    g_half = sum(float(p.grad.abs().sum()) for p in params if p.grad is not None)
    assert float(out.old_deviation.max()) == 0.0 and float(out.kl.min()) > 0
    for p in params:
        p.grad = None
    out = nft.forward_loss(ad, x0, 0.6, emb, noise, torch.tensor([1.0, 1.0]), old, beta=1.0)
    out.loss.backward()
    g_full = sum(float(p.grad.abs().sum()) for p in params if p.grad is not None)
    # r = 1/2 on-policy: only the KL term's gradient remains; r = 1 without KL: flow matching on x0
    assert g_full > 0
    for p in params:
        p.grad = None
    nft.forward_loss(ad, x0, 0.6, emb, noise, torch.tensor([0.5, 0.5]), old, beta=1.0).loss.backward()
    assert sum(float(p.grad.abs().sum()) for p in params if p.grad is not None) < 1e-6 * g_full
    assert g_half > 0
