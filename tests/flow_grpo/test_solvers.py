"""DPM-Solver++(2M) (MixGRPO-Flash's ODE solver) against diffusers' own multistep scheduler, its place in the
rollout (SDE log-probs unchanged), and RL guidance (RLG) at inference."""
import math

import pytest
import torch

from flow_grpo.solvers import dpmpp2m_step, rlg_combine

from .conftest import H, W, make_adapter


def _shifted_sigmas(K: int, shift: float = 3.0) -> list[float]:
    """SD3-style grid: shift t / (1 + (shift - 1) t) on linspace(1, 0, K+1) (starts at 1, ends at 0)."""
    t = torch.linspace(1, 0, K + 1, dtype=torch.float64)
    return (shift * t / (1 + (shift - 1) * t)).tolist()


def _field(x: torch.Tensor, s: float) -> torch.Tensor:
    """A smooth nonlinear stand-in for the model's velocity."""
    return torch.tanh(1.3 * x) * (0.5 + s) + 0.2 * torch.sin(3.0 * x + s)


def _diffusers_dpmpp2m(sigmas: list[float]):
    from diffusers import DPMSolverMultistepScheduler

    sch = DPMSolverMultistepScheduler(use_flow_sigmas=True, prediction_type="flow_prediction",
                                      algorithm_type="dpmsolver++", solver_order=2, solver_type="midpoint",
                                      final_sigmas_type="zero", lower_order_final=True, flow_shift=3.0)
    K = len(sigmas) - 1
    sch.set_timesteps(K)
    # our grid instead of its own: sigmas (K+1, ending at 0) and the matching timesteps; begin at index 0
    sch.sigmas = torch.tensor(sigmas, dtype=torch.float32)
    sch.timesteps = torch.tensor([s * 1000 for s in sigmas[:-1]], dtype=torch.float32)
    sch.set_begin_index(0)
    return sch


@pytest.mark.parametrize("K", [3, 6, 10])
def test_dpmpp2m_equals_diffusers_multistep_scheduler(K):
    """Same sigmas, same model outputs at every step: our latents equal diffusers' DPMSolverMultistepScheduler
    (flow sigmas, flow_prediction, dpmsolver++, order 2, midpoint) to 2e-6 absolute (latents of size ~1). Why not
    bitwise: our coefficients are float64 Python numbers, diffusers computes the lambdas as float32 tensors, so each
    step differs by a few float32 ulps. A wrong solver is far outside: Euler differs by > 1e-3 here."""
    sig = _shifted_sigmas(K)
    sch = _diffusers_dpmpp2m(sig)
    g = torch.Generator().manual_seed(K)
    x = torch.randn(2, 4, 8, 8, generator=g)
    x_ref = x.clone()
    x_euler = x.clone()
    x0_prev = None
    max_gap_euler = 0.0
    for k in range(K):
        v = _field(x, sig[k])  # the model output, computed once from our latent and fed to both solvers
        x_ref = sch.step(v, sch.timesteps[k], x.clone(), return_dict=False)[0]
        x_new, x0_prev = dpmpp2m_step(v, x, sig[k], sig[k + 1], x0_prev, sig[k - 1] if k else None)
        torch.testing.assert_close(x_new, x_ref, atol=2e-6, rtol=0)
        x_euler = x + (sig[k + 1] - sig[k]) * v
        max_gap_euler = max(max_gap_euler, float((x_euler - x_ref).abs().max()))
        x = x_new
    if K > 3:  # with K=3 the only second-order step is so short that Euler is close too
        assert max_gap_euler > 1e-3


def test_dpmpp2m_first_order_is_euler_and_final_step_is_x0():
    """First order = the Euler step (algebraically, see the docstring); the step to sigma=0 returns x0 = x - sigma v
    even with history (lower_order_final), and sigma_prev = 1 drops the second-order term (h_0 = inf)."""
    g = torch.Generator().manual_seed(0)
    x, v, x0p = (torch.randn(3, 5, generator=g) for _ in range(3))
    out, x0 = dpmpp2m_step(v, x, 0.7, 0.4)
    torch.testing.assert_close(out, x + (0.4 - 0.7) * v, atol=1e-6, rtol=0)
    torch.testing.assert_close(x0, x - 0.7 * v)
    out, _ = dpmpp2m_step(v, x, 0.3, 0.0, x0p, 0.6)
    torch.testing.assert_close(out, x - 0.3 * v)
    out, _ = dpmpp2m_step(v, x, 0.8, 0.5, x0p, 1.0)
    torch.testing.assert_close(out, x + (0.5 - 0.8) * v, atol=1e-6, rtol=0)


def test_dpmpp2m_second_order_by_hand():
    """One second-order step with scalar numbers worked out by hand from the DPM-Solver++(2M) formula."""
    s1, s0, t = 0.8, 0.5, 0.2
    x, v, x0p = torch.tensor([0.3]), torch.tensor([-1.1]), torch.tensor([0.9])
    lam = lambda s: math.log((1 - s) / s)  # noqa: E731
    h, h0 = lam(t) - lam(s0), lam(s0) - lam(s1)
    x0 = 0.3 - 0.5 * (-1.1)  # 0.85
    d = x0 + 0.5 * (h / h0) * (x0 - 0.9)
    expect = (t / s0) * 0.3 + (1 - t) * (1 - math.exp(-h)) * d
    out, _ = dpmpp2m_step(v, x, s0, t, x0p, s1)
    assert abs(out.item() - expect) < 1e-6


def test_dpmpp2m_rejects_bad_grids():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="sigma_next"):
        dpmpp2m_step(x, x, 0.3, 0.5)
    with pytest.raises(ValueError, match="sigma_prev"):
        dpmpp2m_step(x, x, 0.5, 0.3, x, 0.4)
    with pytest.raises(ValueError, match="one float"):
        dpmpp2m_step(x, x, torch.tensor([0.5, 0.6]), 0.3)


def test_post_window_mask():
    from flow_grpo.sampler import post_window_mask

    sde = torch.tensor([[0, 1, 1, 0, 0], [0, 0, 0, 0, 0], [1, 0, 1, 0, 0]], dtype=torch.bool)
    expect = torch.tensor([[0, 0, 0, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(post_window_mask(sde), expect)


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_solver_choice_leaves_sde_log_probs_unchanged(kind):
    """The window's states, transitions and log-probs are bit-identical under euler and dpmpp2m (only the steps
    after the window change), and the final latents do differ."""
    from flow_grpo.config import SamplingConfig
    from flow_grpo.sampler import sample_trajectories

    ad = make_adapter(kind, lora=False)
    out = {}
    for solver in ("euler", "dpmpp2m"):
        cfg = SamplingConfig(num_steps=6, height=H, width=W, batch_size=4, cfg=kind == "sd3",
                             guidance_scale=4.5 if kind == "sd3" else 3.5, sde_kind="flow", noise_level=0.7,
                             step_mode="window", window_policy="fixed", window_size=2, window_range=[1, 5],
                             ode_solver=solver)
        out[solver] = sample_trajectories(ad, ["a cat", "a dog"] * 2, cfg, [1, 2, 3, 4], [5, 6, 7, 8],
                                          [0, 0, 1, 1], [0, 0, 1, 1])
    e, d = out["euler"], out["dpmpp2m"]
    assert torch.equal(e.log_probs, d.log_probs) and bool((e.log_probs != 0).all())
    assert torch.equal(e.latents, d.latents) and torch.equal(e.next_latents, d.next_latents)
    assert (e.final_latents - d.final_latents).abs().max() > 1e-4


def test_ode_solver_option_is_validated():
    from flow_grpo.config import SamplingConfig
    from flow_grpo.sampler import generate_images

    with pytest.raises(ValueError, match="ode_solver"):
        generate_images(None, ["a"], [0], SamplingConfig(ode_solver="heun"))


# ------------------------------------------------------------------------------------------------------------- RLG
def test_rlg_combine_by_hand():
    vb = torch.tensor([1.0, 2.0, -0.5])
    vt = torch.tensor([3.0, -2.0, 0.5])
    assert torch.equal(rlg_combine(vb, vt, 0.5), torch.tensor([2.0, 0.0, 0.0]))
    assert torch.equal(rlg_combine(vb, vt, 2.0), torch.tensor([5.0, -6.0, 1.5]))
    assert torch.equal(rlg_combine(vb, vt, -1.0), torch.tensor([-1.0, 6.0, -1.5]))
    # the end points are the inputs exactly, where v_base + 1 * (v_tuned - v_base) would round (fp32: 1 - 1e-8 = 1)
    vb, vt = torch.tensor([1.0]), torch.tensor([1e-8])
    assert (vb + 1.0 * (vt - vb)).item() != vt.item()
    assert torch.equal(rlg_combine(vb, vt, 1.0), vt) and torch.equal(rlg_combine(vb, vt, 0.0), vb)
    with pytest.raises(ValueError, match="finite"):
        rlg_combine(vb, vt, float("nan"))


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_rlg_end_points_reproduce_base_and_tuned_images(kind):
    """w=0 gives the images of the base pipeline (a separately built one, no LoRA at all) and w=1 those of the
    tuned pipeline, bit for bit; w=0.5 is neither."""
    from flow_grpo.config import SamplingConfig
    from flow_grpo.sampler import generate_images

    tuned = make_adapter(kind, lora=True)
    with torch.no_grad():  # a non-zero LoRA (peft initialises B to 0, i.e. tuned == base)
        g = torch.Generator().manual_seed(3)
        for n, p in tuned.transformer.named_parameters():
            if "lora_B" in n:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    base = make_adapter(kind, lora=False)
    cfg = SamplingConfig(num_steps=3, height=H, width=W, batch_size=2, cfg=kind == "sd3",
                         guidance_scale=4.5 if kind == "sd3" else 3.5)
    prompts, seeds = ["a cat", "a dog"], [11, 12]
    img_base = generate_images(base, prompts, seeds, cfg)
    img_tuned = generate_images(tuned, prompts, seeds, cfg)
    assert not torch.equal(img_base, img_tuned)
    assert torch.equal(generate_images(tuned, prompts, seeds, cfg, rlg_weight=0.0), img_base)
    assert torch.equal(generate_images(tuned, prompts, seeds, cfg, rlg_weight=1.0), img_tuned)
    half = generate_images(tuned, prompts, seeds, cfg, rlg_weight=0.5)
    assert not torch.equal(half, img_base) and not torch.equal(half, img_tuned)


# ------------------------------------------------------------------------------------------- MixGRPO-Flash's grid
def _mask(n, K, lo, hi):
    m = torch.zeros(n, K, dtype=torch.bool)
    m[:, lo:hi] = True
    return m


def test_compress_post_grid_by_hand():
    """Linear grid sig_k = 1 - k/10 (K=10), so interpolating at fractional index p gives 1 - p/10 exactly."""
    from flow_grpo.sampler import compress_post_grid

    sig = torch.linspace(1, 0, 11)
    # window [0, 4): L = 3, (10-3)*0.4 = 2.8 -> 2 points: sig[4] = 0.6 and 0
    g, last = compress_post_grid(sig, _mask(2, 10, 0, 4), 0.4)
    assert last == 3 and g.tolist() == pytest.approx([1.0, 0.9, 0.8, 0.7, 0.6, 0.0], abs=1e-7)
    # window [0, 2): L = 1, (10-1)*0.5 = 4.5 -> 4 points at indices 2, 4.667, 7.333, 10
    g, _ = compress_post_grid(sig, _mask(2, 10, 0, 2), 0.5)
    assert g.tolist() == pytest.approx([1.0, 0.9, 0.8, 1 - 14 / 30, 1 - 22 / 30, 0.0], abs=1e-6)
    # window ending at K-2: (10-8)*0.4 = 0.8 -> the release keeps 1 point (stops at sig[9]); we keep 2 (reach 0)
    g, _ = compress_post_grid(sig, _mask(1, 10, 7, 9), 0.4)
    assert g.tolist() == pytest.approx([1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0], abs=1e-7)
    g, _ = compress_post_grid(sig, _mask(1, 10, 5, 8), 0.4)  # L = 7: (10-7)*0.4 = 1.2 -> 2 points
    assert g.tolist() == pytest.approx([1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.0], abs=1e-7)
    m = _mask(2, 10, 0, 4)
    m[1, 4] = True
    with pytest.raises(ValueError, match="same SDE window"):
        compress_post_grid(sig, m, 0.4)


def test_mix_flash_rollout_fewer_nfes_same_window_log_probs():
    """K=8, window [1, 3): L = 2, (8-2)*0.4 = 2.4 -> 2 points, 3 + 1 = 4 model calls instead of 8; the window's
    transitions and log-probs equal the uncompressed rollout's bit for bit."""
    from flow_grpo.config import SamplingConfig
    from flow_grpo.sampler import sample_trajectories

    ad = make_adapter("flux", lora=False)
    out = {}
    for ratio in (1.0, 0.4):
        cfg = SamplingConfig(num_steps=8, height=H, width=W, batch_size=4, cfg=False, guidance_scale=3.5,
                             sde_kind="flow", noise_level=0.7, step_mode="window", window_policy="fixed",
                             window_size=2, window_range=[1, 6], ode_solver="dpmpp2m", post_compress_ratio=ratio)
        out[ratio] = sample_trajectories(ad, ["a cat", "a dog"], cfg, [1, 2], [5, 6], [0, 0], [0, 0])
    full, flash = out[1.0], out[0.4]
    assert (full.nfe_per_trajectory, flash.nfe_per_trajectory) == (8.0, 4.0)
    assert torch.equal(full.log_probs, flash.log_probs) and torch.equal(full.next_latents, flash.next_latents)
    assert (full.final_latents - flash.final_latents).abs().max() > 1e-4


def test_mix_flash_preset_and_option_checks():
    from flow_grpo.config import SamplingConfig, load_train_config
    from flow_grpo.sampler import sample_trajectories

    s = load_train_config(None, ["method=mix_flash"]).sample
    assert (s.ode_solver, s.post_compress_ratio, s.window_shift_every, s.window_size, s.window_policy) == \
        ("dpmpp2m", 0.4, 20, 4, "sliding")
    assert load_train_config(None, ["method=mix"]).sample.ode_solver == "euler"
    with pytest.raises(ValueError, match="needs sample.ode_solver=dpmpp2m"):
        sample_trajectories(None, ["a"], SamplingConfig(post_compress_ratio=0.4), [0], [0], [0], [0])


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_mix_flash_trains_an_epoch(kind, tmp_path):
    """The trainer runs method=mix_flash (K=4, window [0, 2): 2 + 1 compressed post step = 3 model calls)."""
    from .conftest import make_trainer

    tr = make_trainer(kind, "mix_flash", tmp_path, **{"sample.window_range": "[0,3]"})
    tr.train(num_epochs=1)
    t = tr.state.last_traj
    assert t.nfe_per_trajectory == 3 * (2 if kind == "sd3" else 1)
    assert tr.state.global_step == 1 and bool(t.train_mask.any())
