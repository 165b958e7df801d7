"""Tests of the stateless SDE kernel against independent computations."""
import math

import pytest
import torch

from flow_grpo.sde import gaussian_log_prob, kl_on_mean, kl_on_velocity, sde_step

SIGMAS_SD35 = [1.0, 0.9603, 0.9130, 0.8571, 0.7895, 0.7059, 0.6000, 0.4615, 0.2727, 0.0089]


def _rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


@pytest.mark.parametrize("kind", ["flow", "cps"])
@pytest.mark.parametrize("sigma,sigma_next", [(1.0, 0.96), (0.7, 0.6), (0.27, 0.0089)])
def test_zero_noise_level_is_euler(kind, sigma, sigma_next):
    x, v = _rand(3, 4, 5, 5, seed=1), _rand(3, 4, 5, 5, seed=2)
    out = sde_step(v, x, sigma, sigma_next, kind=kind, noise_level=0.0, noise=_rand(3, 4, 5, 5, seed=3))
    euler = x + (sigma_next - sigma) * v  # computed by hand
    torch.testing.assert_close(out.mean, euler, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out.prev_sample, euler, atol=1e-6, rtol=1e-6)
    ode = sde_step(v, x, sigma, sigma_next, kind="ode")
    torch.testing.assert_close(ode.prev_sample, euler, atol=1e-6, rtol=1e-6)
    assert ode.log_prob is None


def test_hand_formulas_flow_dance_cps():
    x, v = _rand(2, 3, 4, seed=4), _rand(2, 3, 4, seed=5)
    s, sn, a = 0.6, 0.45, 0.7
    dt = sn - s
    g = a * math.sqrt(s / (1 - s))
    out = sde_step(v, x, s, sn, kind="flow", noise_level=a, noise=torch.zeros_like(x))
    # Flow-GRPO written form: x*(1+g^2 dt/(2s)) + v*(1+g^2(1-s)/(2s))*dt
    ref = x * (1 + g**2 / (2 * s) * dt) + v * (1 + g**2 * (1 - s) / (2 * s)) * dt
    torch.testing.assert_close(out.mean, ref)
    assert float(out.std.flatten()[0]) == pytest.approx(g * math.sqrt(-dt), rel=1e-6)
    # DanceGRPO written form: score = -(x - (1-s) x0)/s^2, mean = x + dt (v - eta^2/2 score), std = eta sqrt(-dt)
    eta = 0.3
    x0 = x - s * v
    score = -(x - (1 - s) * x0) / s**2
    out = sde_step(v, x, s, sn, kind="dance", noise_level=eta, noise=torch.zeros_like(x))
    torch.testing.assert_close(out.mean, x + dt * (v - eta**2 / 2 * score))
    assert float(out.std.flatten()[0]) == pytest.approx(eta * math.sqrt(-dt), rel=1e-6)
    # CPS
    a = 0.8
    st = sn * math.sin(a * math.pi / 2)
    out = sde_step(v, x, s, sn, kind="cps", noise_level=a, noise=torch.zeros_like(x))
    torch.testing.assert_close(out.mean, (x - s * v) * (1 - sn) + (x + (1 - s) * v) * math.sqrt(sn**2 - st**2))
    assert float(out.std.flatten()[0]) == pytest.approx(st, rel=1e-6)


def test_flow_at_sigma_one_uses_sigma_next():
    x, v = _rand(2, 8, seed=6), _rand(2, 8, seed=7)
    out = sde_step(v, x, 1.0, 0.96, kind="flow", noise_level=0.7, noise=torch.zeros_like(x))
    g = 0.7 * math.sqrt(1.0 / (1 - 0.96))
    assert torch.isfinite(out.mean).all()
    assert float(out.noise_scale.flatten()[0]) == pytest.approx(g, rel=1e-6)
    # the first step injects noise of std g_0 * sqrt(sigma_0 - sigma_1) ~ 0.70 (Flow-GRPO's sde, noise_level 0.7)
    assert float(out.std.flatten()[0]) == pytest.approx(g * math.sqrt(0.04), rel=1e-6)
    assert float(out.std.flatten()[0]) == pytest.approx(0.70, abs=1e-3)


@pytest.mark.parametrize("kind", ["flow", "dance", "cps"])
def test_log_prob_matches_torch_distributions(kind):
    x, v = _rand(4, 3, 6, 6, seed=8), _rand(4, 3, 6, 6, seed=9)
    sigma = torch.tensor([0.9, 0.7, 0.5, 0.3])
    sigma_next = sigma - 0.1
    out = sde_step(v, x, sigma, sigma_next, kind=kind, noise_level=0.8, generator=torch.Generator().manual_seed(0))
    ref = torch.distributions.Normal(out.mean.double(), out.std.double().expand_as(out.mean)).log_prob(
        out.prev_sample.double()).mean(dim=(1, 2, 3))
    torch.testing.assert_close(out.log_prob.double(), ref, atol=1e-5, rtol=1e-6)
    # scoring the same sample gives the same log-prob
    scored = sde_step(v, x, sigma, sigma_next, kind=kind, noise_level=0.8, prev_sample=out.prev_sample)
    assert torch.equal(scored.log_prob, out.log_prob)
    assert torch.equal(scored.prev_sample, out.prev_sample)


def test_cps_tempered_log_prob():
    x, v = _rand(2, 5, seed=10), _rand(2, 5, seed=11)
    out = sde_step(v, x, 0.5, 0.4, kind="cps", noise_level=0.8, noise=_rand(2, 5, seed=12), cps_tempered=True)
    torch.testing.assert_close(out.log_prob, -((out.prev_sample - out.mean) ** 2).mean(1))
    exact = sde_step(v, x, 0.5, 0.4, kind="cps", noise_level=0.8, prev_sample=out.prev_sample)
    # exact = tempered / (2 s^2) + constants
    s = 0.4 * math.sin(0.8 * math.pi / 2)
    torch.testing.assert_close(exact.log_prob, out.log_prob / (2 * s**2) - math.log(s) - 0.5 * math.log(2 * math.pi))


def test_ode_scoring_raises_and_zero_std():
    x, v = _rand(2, 5, seed=13), _rand(2, 5, seed=14)
    with pytest.raises(ValueError):
        sde_step(v, x, 0.5, 0.4, kind="ode", prev_sample=x)
    out = sde_step(v, x, 0.3, 0.0, kind="cps", noise_level=0.8, generator=torch.Generator().manual_seed(0))
    assert out.log_prob is None  # s = sigma_next * sin(.) = 0 at the last step
    with pytest.raises(ValueError):
        sde_step(v, x, 0.3, 0.0, kind="cps", noise_level=0.8, prev_sample=x)
    with pytest.raises(ValueError):
        sde_step(v, x, 0.3, 0.5, kind="flow")
    with pytest.raises(ValueError):
        sde_step(v, x, 0.3, 0.2, kind="nope")


@pytest.mark.parametrize("kind", ["flow", "dance", "cps"])
def test_empirical_std_matches(kind):
    n, d = 4000, 16
    x = _rand(1, d, seed=15).expand(n, d).contiguous()
    v = _rand(1, d, seed=16).expand(n, d).contiguous()
    out = sde_step(v, x, 0.8, 0.7, kind=kind, noise_level=0.7, generator=torch.Generator().manual_seed(1))
    emp_std = out.prev_sample.std(dim=0)
    emp_mean = out.prev_sample.mean(dim=0)
    std = float(out.std.flatten()[0])
    assert std > 0
    # std of a sample std with n=4000 is ~ std/sqrt(2n) ~ 1.1% of std
    torch.testing.assert_close(emp_std, torch.full((d,), std), rtol=0.05, atol=0)
    torch.testing.assert_close(emp_mean, out.mean[0], atol=5 * std / math.sqrt(n), rtol=0)


def test_per_sample_generators_reproduce():
    x, v = _rand(3, 4, seed=17), _rand(3, 4, seed=18)
    gens = [torch.Generator().manual_seed(s) for s in (5, 6, 7)]
    out = sde_step(v, x, 0.5, 0.4, generator=gens)
    # sample 1 alone with the same seed gives the same draw
    one = sde_step(v[1:2], x[1:2], 0.5, 0.4, generator=[torch.Generator().manual_seed(6)])
    assert torch.equal(out.prev_sample[1:2], one.prev_sample)


def _gauss_velocity(x, t, m, s2):
    """Exact marginal velocity E[eps - x0 | x_t = x] for x0 ~ N(m, s2 I), x_t = (1-t)x0 + t eps."""
    var = (1 - t) ** 2 * s2 + t**2
    centred = x - (1 - t) * m
    e_eps = t / var * centred
    e_x0 = m + (1 - t) * s2 / var * centred
    return e_eps - e_x0


@pytest.mark.parametrize("kind,a", [("flow", 0.7), ("dance", 0.5), ("ode", 0.0)])
def test_sde_keeps_flow_marginals_gaussian_toy(kind, a):
    """x0 ~ N(m, s^2): walk from t=0.9 to t=0.2 with many small steps using the exact velocity; the law of the
    result must be the interpolation marginal N((1-t)m, (1-t)^2 s^2 + t^2) (Euler-Maruyama: exact as dt -> 0)."""
    n = 10000
    m = torch.tensor([1.5, -0.5, 0.0, 2.0])
    d = m.numel()
    s2 = 0.25
    t0, t1, steps = 0.9, 0.2, 50
    g = torch.Generator().manual_seed(123)
    x = (1 - t0) * (m + math.sqrt(s2) * torch.randn(n, d, generator=g)) + t0 * torch.randn(n, d, generator=g)
    ts = torch.linspace(t0, t1, steps + 1)
    for k in range(steps):
        v = _gauss_velocity(x, float(ts[k]), m, s2)
        x = sde_step(v, x, float(ts[k]), float(ts[k + 1]), kind=kind, noise_level=a, generator=g).prev_sample
    mean_ref = (1 - t1) * m
    var_ref = (1 - t1) ** 2 * s2 + t1**2
    torch.testing.assert_close(x.mean(0), mean_ref, atol=0.03, rtol=0)
    torch.testing.assert_close(x.var(0), torch.full((d,), var_ref), atol=0.03, rtol=0)


@pytest.mark.parametrize("a", [0.5, 0.8, 1.0])
def test_cps_exact_marginal_for_exact_predictions(a):
    """CPS preserves the interpolation coefficients in ONE step of any size when x0_hat/x1_hat are exact, i.e. for a
    point-mass data distribution x0 = m: x_t ~ N((1-t)m, t^2) must map to N((1-t')m, t'^2)."""
    n = 20000
    m = torch.tensor([1.5, -0.5, 0.0, 2.0])
    d = m.numel()
    t0, t1 = 0.9, 0.3
    g = torch.Generator().manual_seed(7)
    x = (1 - t0) * m + t0 * torch.randn(n, d, generator=g)
    v = _gauss_velocity(x, t0, m, 0.0)  # = eps - m exactly
    x = sde_step(v, x, t0, t1, kind="cps", noise_level=a, generator=g).prev_sample
    torch.testing.assert_close(x.mean(0), (1 - t1) * m, atol=0.015, rtol=0)
    torch.testing.assert_close(x.var(0), torch.full((d,), t1**2), atol=0.006, rtol=0)


def test_cps_with_posterior_means_keeps_mean_but_shrinks_variance():
    """Documented CPS property (not a bug of ours): with imperfect (posterior-mean) predictions of a non-degenerate
    x0, CPS keeps the marginal mean (the step is linear in x) but under-disperses, also as dt -> 0, because it
    drops the posterior variance of x0 at every step. The Flow-GRPO/Dance SDEs do not (test above)."""
    n, m, s2, t0, t1 = 10000, torch.tensor([1.5, -0.5]), 0.25, 0.9, 0.2
    g = torch.Generator().manual_seed(3)
    x = (1 - t0) * (m + math.sqrt(s2) * torch.randn(n, 2, generator=g)) + t0 * torch.randn(n, 2, generator=g)
    ts = torch.linspace(t0, t1, 21)
    for k in range(20):
        v = _gauss_velocity(x, float(ts[k]), m, s2)
        x = sde_step(v, x, float(ts[k]), float(ts[k + 1]), kind="cps", noise_level=0.8, generator=g).prev_sample
    torch.testing.assert_close(x.mean(0), (1 - t1) * m, atol=0.02, rtol=0)
    assert float(x.var(0).max()) < 0.8 * ((1 - t1) ** 2 * s2 + t1**2)


def test_marginal_test_can_fail_without_drift_correction():
    """Sanity check of the test above: adding noise on top of the plain Euler drift inflates the variance."""
    n, d = 10000, 2
    m, s2, t0, t1, steps = torch.zeros(d), 0.25, 0.9, 0.2, 50
    g = torch.Generator().manual_seed(123)
    x = (1 - t0) * (m + math.sqrt(s2) * torch.randn(n, d, generator=g)) + t0 * torch.randn(n, d, generator=g)
    ts = torch.linspace(t0, t1, steps + 1)
    for k in range(steps):
        v = _gauss_velocity(x, float(ts[k]), m, s2)
        std = sde_step(v, x, float(ts[k]), float(ts[k + 1]), kind="flow", noise_level=0.7).std
        x = x + (ts[k + 1] - ts[k]) * v + std * torch.randn(n, d, generator=g)
    assert float(x.var(0).mean()) > (1 - t1) ** 2 * s2 + t1**2 + 0.1


def test_kl_functions():
    mu, mu_ref = _rand(3, 2, 4, seed=20), _rand(3, 2, 4, seed=21)
    std = torch.tensor([0.5, 0.2, 1.0]).view(3, 1, 1)
    kl = kl_on_mean(mu, mu, std)
    assert torch.equal(kl, torch.zeros(3))
    kl = kl_on_mean(mu, mu_ref, std)
    # exact KL of N(mu, std^2) || N(mu_ref, std^2), averaged over dims
    p = torch.distributions.Normal(mu.double(), std.double().expand_as(mu))
    q = torch.distributions.Normal(mu_ref.double(), std.double().expand_as(mu))
    torch.testing.assert_close(kl.double(), torch.distributions.kl_divergence(p, q).mean(dim=(1, 2)))
    torch.testing.assert_close(kl_on_velocity(mu, mu_ref), ((mu - mu_ref) ** 2).mean(dim=(1, 2)))


def test_gaussian_log_prob_rejects_zero_std():
    with pytest.raises(ValueError):
        gaussian_log_prob(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 1))


def test_sigma_shapes_and_dtype():
    x, v = _rand(2, 3, seed=22).half(), _rand(2, 3, seed=23).half()
    out = sde_step(v, x, torch.tensor([0.5, 0.6]), torch.tensor([0.4, 0.5]), generator=torch.Generator())
    assert out.prev_sample.dtype == torch.float32 and out.log_prob.shape == (2,)
    with pytest.raises(ValueError):
        sde_step(v, x, torch.tensor([0.5, 0.6, 0.7]), 0.3)
