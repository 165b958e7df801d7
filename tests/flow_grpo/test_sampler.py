"""Sampler: exact on-policy log-probs, step plans, determinism, TP-GRPO / G2RPO completions."""
import dataclasses

import pytest
import torch

from flow_grpo.config import SamplingConfig
from flow_grpo.completions import ode_complete
from flow_grpo.methods.g2rpo import granular_schedule
from flow_grpo.methods.plans import make_step_plan
from flow_grpo.sampler import sample_trajectories, score_column
from flow_grpo.scoring import score_rewards
from flow_grpo.sde import sde_step

from .conftest import H, W, block_reward, make_adapter

PROMPTS = ["a cat", "a dog"] * 3  # 2 groups of 3 interleaved -> use explicit group ids
GIDS = [0, 1] * 3


def _cfg(kind, **kw):
    base = dict(num_steps=5, height=H, width=W, guidance_scale=4.5 if kind == "sd3" else 3.5,
                cfg=(kind == "sd3"), sde_kind="cps", noise_level=0.8, step_mode="all", batch_size=4,
                window_size=2, window_range=[0, 4], single_steps=[0, 1, 2])
    base.update(kw)
    return SamplingConfig(**base)


def _sample(ad, cfg, reward=None, seeds_offset=0, **kw):
    n = len(PROMPTS)
    return sample_trajectories(ad, PROMPTS, cfg, [seeds_offset + i for i in range(n)],
                               [100 + seeds_offset + i for i in range(n)], [g + 7 for g in GIDS], GIDS,
                               reward_fn=reward, **kw)


def _nontrivial_lora(ad):
    with torch.no_grad():
        for n, p in ad.transformer.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)


@pytest.mark.parametrize("kind,cfg_on,sde_kind,mode", [
    ("sd3", True, "flow", "all"), ("sd3", False, "cps", "window"), ("sd3", True, "dance", "fraction"),
    ("flux", False, "flow", "all"), ("flux", False, "cps", "single"),
])
def test_ratio_exactly_one_on_policy(kind, cfg_on, sde_kind, mode):
    """Log-probs recomputed by the training path (with grad, LoRA active) == rollout log-probs, bit for bit."""
    ad = make_adapter(kind)
    _nontrivial_lora(ad)
    cfg = _cfg(kind, cfg=cfg_on, sde_kind=sde_kind, step_mode=mode)
    traj = _sample(ad, cfg)
    assert traj.train_mask.any()
    n_checked = 0
    for ch in traj.chunks:
        for col in range(len(traj.step_indices)):
            with torch.enable_grad():
                out = score_column(ad, traj, ch, col)
            assert out.log_prob.requires_grad
            m = traj.train_mask[ch[0]:ch[1], col]
            assert torch.equal(out.log_prob.detach()[m], traj.log_probs[ch[0]:ch[1], col][m])
            n_checked += int(m.sum())
            ratio = torch.exp(out.log_prob.detach()[m] - traj.log_probs[ch[0]:ch[1], col][m])
            assert torch.equal(ratio, torch.ones_like(ratio))
    assert n_checked == int(traj.train_mask.sum())


def test_log_probs_are_the_gaussian_of_the_stored_transition():
    """Independent check of a stored log-prob: recompute mu, std by hand from the velocity and compare with
    torch.distributions.Normal."""
    ad = make_adapter("sd3")
    cfg = _cfg("sd3", sde_kind="flow", noise_level=0.7, step_mode="all")
    traj = _sample(ad, cfg)
    col, (c0, c1) = 1, traj.chunks[0]
    s, sn = traj.sigmas[col].item(), traj.sigmas_next[col].item()
    with torch.no_grad():
        v = ad.predict_velocity(traj.latents[c0:c1, col], s, ad.encode_prompts(PROMPTS[c0:c1]), 4.5, True)
    x = traj.latents[c0:c1, col]
    g = 0.7 * (s / (1 - s)) ** 0.5
    mu = x + (sn - s) * (v + g**2 / (2 * s) * (x + (1 - s) * v))
    std = g * (s - sn) ** 0.5
    ref = torch.distributions.Normal(mu.double(), std).log_prob(traj.next_latents[c0:c1, col].double())
    torch.testing.assert_close(traj.log_probs[c0:c1, col].double(), ref.mean(dim=(1, 2, 3)), atol=2e-5, rtol=1e-6)


def test_step_plans():
    seeds = list(range(40))
    K = 6
    p = make_step_plan(SamplingConfig(num_steps=K, step_mode="all"), seeds)
    assert p.train_mask[:, :K - 1].all() and not p.train_mask[:, K - 1].any() and not p.sde_mask[:, K - 1].any()
    p = make_step_plan(SamplingConfig(num_steps=K, step_mode="fraction", timestep_fraction=0.6), seeds)
    assert (p.train_mask.sum(1) == 3).all() and not p.train_mask[:, K - 1].any()
    assert p.sde_mask[:, :K - 1].all()
    assert len({tuple(r.tolist()) for r in p.train_mask}) > 1  # random per sample
    cfg = SamplingConfig(num_steps=K, step_mode="window", window_size=2, window_range=[1, 5])
    p = make_step_plan(cfg, seeds)
    for i in range(len(seeds)):
        idx = torch.nonzero(p.sde_mask[i]).flatten().tolist()
        assert len(idx) == 2 and idx[1] == idx[0] + 1 and 1 <= idx[0] <= 3 and idx[1] < K - 1
        assert torch.equal(p.sde_mask[i], p.train_mask[i]) and p.window_start[i] == idx[0]
    assert len(set(p.window_start.tolist())) == 3  # all admissible starts used over 40 seeds
    fixed = make_step_plan(dataclasses.replace(cfg, window_policy="fixed"), seeds)
    assert (fixed.window_start == 1).all()
    slid = [int(make_step_plan(dataclasses.replace(cfg, window_policy="sliding_wrap", window_shift_every=2), [0],
                               iteration=s).window_start[0]) for s in range(8)]
    assert slid == [1, 1, 2, 2, 3, 3, 1, 1]  # moves every 2 iterations, wraps around (MixGRPO's: test_presets.py)
    p = make_step_plan(SamplingConfig(num_steps=K, step_mode="single", single_steps=[0, 2, 7]), seeds)
    assert (p.sde_mask.sum(1) == 1).all() and set(p.window_start.tolist()) <= {0, 2}
    # same plan seed -> same plan (a group shares its window)
    a = make_step_plan(cfg, [5, 5, 9])
    assert torch.equal(a.sde_mask[0], a.sde_mask[1])
    with pytest.raises(ValueError):
        make_step_plan(SamplingConfig(num_steps=K, step_mode="window", window_size=4, window_range=[0, 3]), [0])


@pytest.mark.parametrize("mode", ["window", "single"])
def test_only_intended_steps_are_sde_and_trained(mode):
    """ODE outside the plan: the latents after a non-SDE step equal the Euler step; trained columns = plan."""
    ad = make_adapter("sd3")
    cfg = _cfg("sd3", step_mode=mode, cfg=False)
    traj = _sample(ad, cfg)
    plan = make_step_plan(cfg, [g + 7 for g in GIDS])
    assert torch.equal(traj.sde_mask, plan.sde_mask)
    full = torch.zeros_like(plan.train_mask)
    full[:, traj.step_indices] = traj.train_mask
    assert torch.equal(full, plan.train_mask)
    # stochastic entries: x_{k+1} != Euler step, non-stochastic entries in stored columns: == Euler step
    for col, k in enumerate(traj.step_indices.tolist()):
        for c0, c1 in traj.chunks:
            x = traj.latents[c0:c1, col]
            with torch.no_grad():
                v = ad.predict_velocity(x, traj.sigmas[col].item(), ad.encode_prompts(PROMPTS[c0:c1]), 4.5, False)
            euler = sde_step(v, x, traj.sigmas[col].item(), traj.sigmas_next[col].item(), kind="ode").prev_sample
            same = (traj.next_latents[c0:c1, col] == euler).flatten(1).all(1)
            assert torch.equal(same, ~plan.sde_mask[c0:c1, k])


def test_seeds_reproduce_trajectories_and_batch_layout_independence():
    ad = make_adapter("flux")
    cfg = _cfg("flux", sde_kind="flow", step_mode="all")
    a = _sample(ad, cfg)
    b = _sample(ad, cfg)
    assert torch.equal(a.next_latents, b.next_latents) and torch.equal(a.images, b.images)
    c = _sample(ad, cfg, seeds_offset=50)
    assert not torch.equal(a.images, c.images)
    # a different chunking gives (numerically) the same trajectories: noise depends on (seed, step) only
    d = _sample(ad, dataclasses.replace(cfg, batch_size=6))
    torch.testing.assert_close(d.final_latents, a.final_latents, atol=1e-4, rtol=0)


def test_ode_complete_batched_equals_one_at_a_time():
    ad = make_adapter("sd3")
    ad.set_resolution(H, W)
    sig = ad.sigmas(6, H, W)
    x = ad.initial_noise([1, 2, 3], H, W)
    emb = ad.encode_prompts(["a", "b", "c"])
    scheds = [sig[1:], sig[3:], granular_schedule(sig, 2, 2)]
    with torch.no_grad():
        out, calls = ode_complete(ad, x, emb, scheds, 4.5, True)
        assert calls == max(len(s) for s in scheds) - 1
        for i in range(3):
            one, _ = ode_complete(ad, x[i:i + 1], emb.index([i]), [scheds[i]], 4.5, True)
            torch.testing.assert_close(out[i:i + 1], one, atol=1e-5, rtol=0)
            # and a plain Euler loop
            y = x[i:i + 1]
            for k in range(len(scheds[i]) - 1):
                v = ad.predict_velocity(y, scheds[i][k].item(), emb.index([i]), 4.5, True)
                y = y + (scheds[i][k + 1] - scheds[i][k]) * v
            torch.testing.assert_close(out[i:i + 1], y, atol=1e-5, rtol=0)
    assert granular_schedule(sig, 2, 2).tolist() == sig[[2, 4, 6]].tolist()
    assert granular_schedule(sig, 1, 2).tolist() == sig[[1, 3, 5, 6]].tolist()


def _ode_rollout(ad, seeds, prompts, cfg):
    sig = ad.sigmas(cfg.num_steps, H, W)
    ad.set_resolution(H, W)
    x = ad.initial_noise(seeds, H, W)
    emb = ad.encode_prompts(prompts)
    with torch.no_grad():
        for k in range(cfg.num_steps):
            v = ad.predict_velocity(x, sig[k].item(), emb, cfg.guidance_scale, cfg.cfg)
            x = sde_step(v, x, sig[k].item(), sig[k + 1].item(), kind="ode").prev_sample
    return block_reward(ad.decode(x, H, W), prompts, [{}] * len(prompts))["block"]


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_tp_grpo_rewards(kind):
    ad = make_adapter(kind)
    cfg = _cfg(kind, step_mode="window", window_size=2, window_range=[1, 4], credit="tp_grpo", cfg=False)
    traj = _sample(ad, cfg, reward=block_reward)
    N = len(PROMPTS)
    tol = 0.5 / 255  # batched vs single forward passes may flip a uint8 rounding
    assert traj.step_rewards.shape == (N, 3)
    assert torch.equal(traj.step_rewards[:, -1], traj.rewards["total"])  # R_n = final reward
    # R_0 by construction: a pure-ODE rollout from the trajectory's OWN x_T ...
    r0 = _ode_rollout(ad, list(range(N)), PROMPTS, cfg)
    torch.testing.assert_close(traj.step_rewards[:, 0], r0, atol=tol, rtol=0)
    # ... which a fresh x_T (the TP-GRPO release bug) would not reproduce: the check can fail
    r0_fresh = _ode_rollout(ad, [1000 + i for i in range(N)], PROMPTS, cfg)
    assert int(((r0_fresh - traj.step_rewards[:, 0]).abs() > 3 * tol).sum()) >= N // 2
    # R_1: ODE completion from the state after the first SDE step, one sample at a time
    sig = ad.sigmas(cfg.num_steps, H, W)
    emb = ad.encode_prompts(PROMPTS)
    for i in (0, 3):
        k1 = int(traj.window_start[i]) + 1
        col = int((traj.step_indices == k1).nonzero())
        with torch.no_grad():
            y, _ = ode_complete(ad, traj.latents[i:i + 1, col], emb.index([i]), [sig[k1:]], cfg.guidance_scale, False)
        r1 = block_reward(ad.decode(y, H, W), PROMPTS[i:i + 1], [{}])["block"]
        torch.testing.assert_close(traj.step_rewards[i, 1:2], r1, atol=tol, rtol=0)
    # NFEs: main K + completions of length K - w0 and K - w0 - 1, each minus the first step reused from the rollout
    w0 = traj.window_start.float()
    assert traj.nfe_per_trajectory == pytest.approx(float((5 + (4 - w0) + (3 - w0)).mean()))


def _euler(ad, x, emb, sched, gs, cfg_on):
    """Plain Euler over ``sched`` with a scalar sigma per step (independent of ode_complete)."""
    for a, b in zip(sched[:-1].tolist(), sched[1:].tolist()):
        x = x + (b - a) * ad.predict_velocity(x, a, emb, gs, cfg_on)
    return x


@pytest.mark.parametrize("kind,mode,K,cfg_on", [("flux", "all", 6, False), ("sd3", "window", 5, True)])
def test_tp_grpo_reuses_the_rollout_euler_step(kind, mode, K, cfg_on):
    """Completions start from the stored ode_next (sigma_{k+1}) instead of x_k (sigma_k): the rewards equal an
    independent full recomputation from traj.latents over sig[k:], with one model evaluation less each."""
    from flow_grpo.methods.tp_grpo import tp_grpo_step_rewards as _tp_grpo_rewards

    ad = make_adapter(kind)
    cfg = _cfg(kind, num_steps=K, step_mode=mode, window_size=2, window_range=[0, K - 1], window_policy="random",
               credit="tp_grpo", cfg=cfg_on)
    decoded = []
    decode = ad.decode
    ad.decode = lambda x, h, w: (decoded.append(x.clone()), decode(x, h, w))[1]
    N = len(PROMPTS)
    traj = sample_trajectories(ad, PROMPTS, cfg, list(range(N)), [100 + i for i in range(N)],
                               [20 + i for i in range(N)], GIDS, reward_fn=block_reward)  # a plan per sample
    ad.decode = decode
    n = traj.step_rewards.shape[1] - 1
    assert traj.ode_next_latents is not None and traj.ode_next_latents.shape == traj.latents.shape
    if mode == "window":
        assert len(set(traj.window_start.tolist())) > 1  # the window plan really differs between samples
        # and some column is trained only by other chunks (the rollout's pure-ODE branch stores it too)
        assert any(not traj.train_mask[c0:c1, col].any() for c0, c1 in traj.chunks
                   for col in range(len(traj.step_indices)))
    comp_lat = torch.cat(decoded[len(traj.chunks):])  # completion decodes come after the rollout's
    sig = ad.sigmas(K, H, W)
    emb = ad.encode_prompts(PROMPTS)
    ref_lat = torch.zeros_like(comp_lat)
    pos = torch.stack([torch.nonzero(traj.train_mask[i]).flatten() for i in range(N)])
    with torch.no_grad():
        for j in range(n):
            for i in range(N):
                k = int(traj.step_indices[pos[i, j]])
                ref_lat[j * N + i] = _euler(ad, traj.latents[i:i + 1, pos[i, j]], emb.index([i]), sig[k:],
                                            cfg.guidance_scale, cfg_on)[0]
    torch.testing.assert_close(comp_lat, ref_lat, atol=1e-5, rtol=0)
    ref_R = block_reward(ad.decode(ref_lat, H, W), PROMPTS * n, [{}] * (N * n))["block"].view(n, N).t()
    torch.testing.assert_close(traj.step_rewards[:, :n], ref_R, atol=1e-5, rtol=0)
    # NFE: the reuse drops exactly one evaluation per completion (FLUX K=6, n=5: 20 -> 15 per trajectory)
    seen = []
    pv = ad.predict_velocity
    ad.predict_velocity = lambda x, *a, **k: (seen.append(x.shape[0]), pv(x, *a, **k))[1]
    with torch.no_grad():
        R_new, nfe_new, _ = _tp_grpo_rewards(ad, traj, emb, sig, block_reward, None, traj.rewards["total"])
        items_new = sum(seen)
        seen.clear()
        R_old, nfe_old, _ = _tp_grpo_rewards(ad, dataclasses.replace(traj, ode_next_latents=None), emb, sig,
                                             block_reward, None, traj.rewards["total"])
        items_old = sum(seen)
    ad.predict_velocity = pv
    assert nfe_old - nfe_new == n and items_old - items_new == n * N
    if kind == "flux":
        assert (nfe_old, nfe_new) == (20, 15) and traj.nfe_per_trajectory == K + 15
    torch.testing.assert_close(R_new, traj.step_rewards, atol=1e-6, rtol=0)  # same run, same numbers
    torch.testing.assert_close(R_old, R_new, atol=1e-5, rtol=0)


def test_ode_complete_empty_schedule_and_no_ode_next_for_other_credits():
    """k = K-1: the completion from ode_next is empty (schedule [0]) -> no model call, the latent is unchanged.
    Other credits do not allocate ode_next_latents."""
    ad = make_adapter("flux")
    ad.set_resolution(H, W)
    x = ad.initial_noise([1, 2], H, W)
    out, calls = ode_complete(ad, x, ad.encode_prompts(["a", "b"]), [torch.zeros(1), torch.zeros(1)], 3.5, False)
    assert calls == 0 and torch.equal(out, x)
    traj = _sample(ad, _cfg("flux", num_steps=3, step_mode="window", window_size=1, window_range=[0, 2]))
    assert traj.ode_next_latents is None


def test_g2rpo_rewards():
    ad = make_adapter("sd3")
    cfg = _cfg("sd3", step_mode="single", credit="g2rpo", cfg=False, sde_kind="flow",
               noise_level=0.7)  # methods.g2rpo.granularities: the default [1, 2]
    traj = _sample(ad, cfg, reward=block_reward)
    assert traj.step_rewards.shape == (len(PROMPTS), 2)
    assert torch.equal(traj.step_rewards[:, 0], traj.rewards["total"])
    # granularity-2 reward of sample 0, recomputed one at a time
    i = 0
    col = int(traj.train_mask[i].nonzero()[0])
    k = int(traj.step_indices[col])
    sig = ad.sigmas(cfg.num_steps, H, W)
    with torch.no_grad():
        y, _ = ode_complete(ad, traj.next_latents[i:i + 1, col], ad.encode_prompts(PROMPTS[:1]),
                            [granular_schedule(sig, k + 1, 2)], cfg.guidance_scale, False)
    r = block_reward(ad.decode(y, H, W), PROMPTS[:1], [{}])["block"]
    torch.testing.assert_close(traj.step_rewards[i, 1:2], r, atol=0.5 / 255, rtol=0)
    assert not torch.equal(traj.step_rewards[:, 1], traj.step_rewards[:, 0])


def test_score_rewards_validation():
    imgs = torch.zeros(2, 4, 4, 3, dtype=torch.uint8)
    tot, comp = score_rewards(lambda i, p, m: {"a": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0, 1.0])},
                              imgs, ["x", "y"], [{}, {}], {"a": 0.5, "b": 2.0})
    assert tot.tolist() == [0.5, 3.0]
    with pytest.raises(ValueError, match="weights"):
        score_rewards(lambda i, p, m: {"a": torch.ones(2), "b": torch.ones(2)}, imgs, ["x", "y"], [{}, {}])
    with pytest.raises(ValueError, match="non-finite"):
        score_rewards(lambda i, p, m: {"a": torch.tensor([1.0, float("nan")])}, imgs, ["x", "y"], [{}, {}])
    with pytest.raises(ValueError, match="values for"):
        score_rewards(lambda i, p, m: {"a": torch.ones(3)}, imgs, ["x", "y"], [{}, {}])
