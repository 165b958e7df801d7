"""GRPO-Guard (flow_grpo.methods.grpo_guard): the normalised log-ratio against mean_d(delta * eps) computed from
torch.distributions, and a tiny trainer run (the rollout's recorded means are the old policy's Gaussian means;
the update applies)."""
import torch

from flow_grpo.methods.grpo_guard import guard_log_ratio


def test_guard_log_ratio_is_the_noise_projection():
    g = torch.Generator().manual_seed(0)
    B, D = 3, 5
    mu_old, mu = torch.randn(B, D, generator=g, dtype=torch.float64), torch.randn(B, D, generator=g,
                                                                                 dtype=torch.float64)
    s = torch.tensor([0.3, 0.05, 1.2], dtype=torch.float64)
    eps = torch.randn(B, D, generator=g, dtype=torch.float64)
    x = mu_old + s[:, None] * eps  # the recorded transition, drawn from the old Gaussian
    # the plain log-ratio the project scores: mean over dims of the per-dim log densities
    lp = torch.distributions.Normal(mu, s[:, None]).log_prob(x).mean(1)
    lp_old = torch.distributions.Normal(mu_old, s[:, None]).log_prob(x).mean(1)
    got = guard_log_ratio(lp - lp_old, mu, mu_old, s.view(B, 1))
    want = ((mu - mu_old) * eps).mean(1)  # by hand: mean_d (mu - mu_old) * eps_old
    assert torch.allclose(got.double(), want, atol=1e-5)
    # unchanged mean: g = 0 (ratio 1) whatever the std
    assert torch.allclose(guard_log_ratio(torch.zeros(B), mu_old, mu_old, s), torch.zeros(B, dtype=torch.float32))
    # the plain ratio's bias: E[Delta] = -mean (mu - mu_old)^2 / (2 s^2) < 0; the guard's is 0 (500k draws)
    n = 500_000
    e = torch.randn(n, 1, generator=g, dtype=torch.float64)
    d, s1 = 0.1, 0.2
    plain = (e * d) / s1 - d ** 2 / (2 * s1 ** 2)  # Delta for one dim with mu - mu_old = d
    guard = guard_log_ratio(plain.squeeze(1), torch.full((n, 1), d), torch.zeros(n, 1), torch.full((n,), s1))
    assert abs(float(plain.mean()) + d ** 2 / (2 * s1 ** 2)) < 3e-3 and abs(float(guard.mean())) < 1e-3


def test_tiny_trainer_records_old_means(tmp_path):
    from flow_grpo.sampler import score_column

    from ..conftest import make_trainer

    tr = make_trainer("sd3", "flow", tmp_path, **{"methods.grpo_guard.enabled": "true", "sample.cfg": "false"})
    try:
        assert [m.name for m in tr.methods][-1] == "grpo_guard"
        before = [p.detach().clone() for p in tr.params]
        m = tr.train()[-1]
        traj = tr.state.last_traj
        assert traj.old_means is not None and traj.old_means.shape == traj.latents.shape
        changed = any(not torch.equal(a, p) for a, p in zip(before, tr.params))
        assert changed and "grpo_guard/log_ratio_mean" in m
        # the recorded means are the rollout policy's: the initial weights give them back
        with torch.no_grad():
            for p, b in zip(tr.params, before):
                p.copy_(b)
            out = score_column(tr.adapter, traj, traj.chunks[0], 0)
        c0, c1 = traj.chunks[0]
        assert torch.allclose(out.mean, traj.old_means[c0:c1, 0], atol=1e-5)
    finally:
        tr.close()


def test_on_policy_gradient_is_std_times_the_plain_one():
    # at mu = mu_old (one optimizer step per rollout) d g / d theta = s * d Delta / d theta (finite differences)
    g = torch.Generator().manual_seed(1)
    mu_old, direction = torch.randn(2, 4, generator=g, dtype=torch.float64), torch.randn(2, 4, generator=g,
                                                                                        dtype=torch.float64)
    s = torch.tensor([0.4, 0.07], dtype=torch.float64)
    x = mu_old + s[:, None] * torch.randn(2, 4, generator=g, dtype=torch.float64)

    def plain(t):
        mu = mu_old + t * direction
        return (torch.distributions.Normal(mu, s[:, None]).log_prob(x).mean(1)
                - torch.distributions.Normal(mu_old, s[:, None]).log_prob(x).mean(1))

    def guard(t):
        return guard_log_ratio(plain(t), mu_old + t * direction, mu_old, s).double()

    h = 1e-4
    d_plain = (plain(h) - plain(-h)) / (2 * h)
    d_guard = (guard(h) - guard(-h)) / (2 * h)
    assert torch.allclose(d_guard, s * d_plain, rtol=1e-3)
