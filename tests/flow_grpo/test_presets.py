"""Each flow preset reproduces its release (issue #23, items 1-3). Expected values are derived by hand from the
releases' code (read for facts only): advantage statistics, MixGRPO's sliding window, DanceGRPO's step subsets,
shared initial noise and last step."""
from flow_grpo.data import epoch_samples
from flow_grpo.train import steps
import math
import re

import pytest
import torch

from flow_grpo.config import SamplingConfig, load_train_config
from flow_grpo.methods.plans import fraction_train_count, make_step_plan, sliding_window
from flow_grpo.sampler import sample_trajectories
from flow_grpo.sde import sde_step

from .conftest import block_reward, make_trainer


# ------------------------------------------------------------------------------------------------ advantages (item 1)
R = [0.0, 1.0, 2.0, 4.0]  # samples 0, 1 form group 0 and samples 2, 3 group 1 (G = 2, 2 groups per epoch)
POP_BATCH_STD = math.sqrt(((0 - 1.75) ** 2 + (1 - 1.75) ** 2 + (2 - 1.75) ** 2 + (4 - 1.75) ** 2) / 4)  # np.std
# torch.std of [0, 1] is 1/sqrt(2), of [2, 4] sqrt(2); DanceGRPO / MixGRPO / G2RPO add 1e-8
TORCH_STD_ADV = [-0.5 / (2 ** -0.5 + 1e-8), 0.5 / (2 ** -0.5 + 1e-8), -1 / (2 ** 0.5 + 1e-8), 1 / (2 ** 0.5 + 1e-8)]


def _traj(tr):
    prompts, meta, gids, xs, ns, ps = epoch_samples(tr.cfg, tr.prompts, tr.metadata, 0)
    assert gids == [0, 0, 1, 1]
    return sample_trajectories(tr.adapter, prompts, tr.cfg.sample, xs, ns, ps, gids, meta, block_reward)


def _trained_values(adv, traj):
    """(N, n) advantages of each sample's trained columns, in step order."""
    return torch.stack([adv[i][traj.train_mask[i]] for i in range(len(traj))])


@pytest.mark.parametrize("method,expected", [
    # Flow-GRPO (PerPromptStatTracker, global_std=True): (r - prompt mean) / (np.std(all rewards) + 1e-4)
    ("flow", [-0.5 / (POP_BATCH_STD + 1e-4), 0.5 / (POP_BATCH_STD + 1e-4),
              -1 / (POP_BATCH_STD + 1e-4), 1 / (POP_BATCH_STD + 1e-4)]),
    # DanceGRPO, MixGRPO: (r - group mean) / (torch.std(group) + 1e-8)
    ("dance", TORCH_STD_ADV),
    ("mix", TORCH_STD_ADV),
])
def test_outcome_advantages_follow_the_release(method, expected, tmp_path):
    tr = make_trainer("sd3", method, tmp_path, **{"sample.cfg": "false", "sample.window_range": "[0,-2]"})
    traj = _traj(tr)
    traj.rewards["total"] = torch.tensor(R)
    adv, _ = steps.advantages(tr, traj)
    got = _trained_values(adv, traj)
    for i in range(4):
        assert got[i].tolist() == pytest.approx([expected[i]] * got.shape[1], abs=1e-6)


def test_g2rpo_sums_torch_std_advantages_over_granularities(tmp_path):
    """G2RPO: per granularity (r - mean) / (torch.std + 1e-8), summed, then clamped."""
    tr = make_trainer("sd3", "g2rpo", tmp_path, **{"sample.cfg": "false"})
    traj = _traj(tr)
    traj.step_rewards = torch.tensor([R, R]).t()  # the same rewards at both granularities
    adv, _ = steps.advantages(tr, traj)
    assert _trained_values(adv, traj)[:, 0].tolist() == pytest.approx([2 * a for a in TORCH_STD_ADV], abs=1e-6)


def test_tp_grpo_step_advantages_use_the_population_std(tmp_path):
    """TP-GRPO: one PerPromptStatTracker per step, np.std (divides by G) + 1e-4. R_0 = R_1 = 0 makes d_1 = 0 (no
    turning point), so the step rewards are [0, R_2]: step 1 gets 0, step 2 the z-score of R_2 = [0, 1 | 2, 4],
    i.e. +-0.5/(0.5+1e-4) = +-0.9998 and +-1/(1+1e-4) (dividing by G-1 would give +-0.7070)."""
    tr = make_trainer("sd3", "tp_grpo", tmp_path, **{"sample.cfg": "false"})
    traj = _traj(tr)
    assert traj.step_rewards.shape == (4, 3)
    traj.step_rewards = torch.tensor([[0.0, 0.0, r] for r in R])
    adv, _ = steps.advantages(tr, traj)
    got = _trained_values(adv, traj)
    assert got[:, 0].tolist() == [0.0] * 4
    assert got[:, 1].tolist() == pytest.approx([-0.5 / 0.5001, 0.5 / 0.5001, -1 / 1.0001, 1 / 1.0001], abs=1e-6)


def test_fast_preset_statistics_follow_the_release():
    """Flow-GRPO-Fast's SD3 / GenEval-FLUX configs: global_std=True, np.std (population) + 1e-4."""
    o = load_train_config(None, ["method=fast"]).optim
    assert (o.adv_scale, o.adv_std_ddof, o.adv_eps) == ("batch", 0, 1e-4)


def test_demo_pins_the_statistics_its_numbers_were_measured_with():
    """The demo's recorded results used the group std (ddof 1): its recipe (configs/demo/t2i.yaml) says so
    explicitly, for the full and the smoke run."""
    from pathlib import Path

    import yaml

    t2i = yaml.safe_load((Path(__file__).parents[2] / "configs" / "demo" / "t2i.yaml").read_text())
    for prof in ("full", "smoke"):
        settings = {**t2i["grpo"], **(t2i[prof].get("grpo") or {})}
        assert str(settings["optim.adv_scale"]) == "group" and str(settings["optim.adv_std_ddof"]) == "1", settings
    cfg = load_train_config(None, ["method=fast", "optim.adv_scale=group", "optim.adv_std_ddof=1"]).optim
    assert (cfg.adv_scale, cfg.adv_std_ddof, cfg.adv_eps) == ("group", 1, 1e-4)


def test_bad_ddof_is_a_clear_error(tmp_path):
    """optim.adv_std_ddof is Literal[0, 1]: refused when the config is parsed, before any model is built."""
    with pytest.raises(ValueError, match=r"optim.adv_std_ddof.*2.*\[0, 1\]"):
        make_trainer("sd3", "dance", tmp_path, **{"sample.cfg": "false", "optim.adv_std_ddof": 2})


def test_a_config_edited_after_parsing_is_checked_by_the_trainer(tmp_path):
    """The hand-written kl_type / reward.mode checks gave way to the declared Literal choices, checked again when
    the trainer starts: a config edited in Python after it was built still fails naming the key and the choices."""
    from flow_grpo.train.trainer import FlowGRPOTrainer

    from .conftest import make_adapter, train_overrides

    for key, value, choices in [("kl_type", "exact", "['mean', 'mean_exact', 'velocity']"),
                                ("adv_std_ddof", 2, "[0, 1]")]:
        cfg = load_train_config(None, train_overrides("sd3", "dance", tmp_path, **{"sample.cfg": "false"}))
        setattr(cfg.optim, key, value)
        with pytest.raises(ValueError, match=rf"config key 'optim\.{key}': invalid value {value!r}, expected one of "
                                             rf"{re.escape(choices)}"):
            FlowGRPOTrainer(cfg, adapter=make_adapter("sd3", lora=False), reward_fn={"block": block_reward})


# ------------------------------------------------------------------------------------ MixGRPO sliding window (item 2)
def _window(cfg, it):
    p = make_step_plan(cfg, [0], iteration=it)
    assert torch.equal(p.sde_mask, p.train_mask)
    return torch.nonzero(p.train_mask[0]).flatten().tolist()


def test_mix_preset_is_the_release_launcher():
    s = load_train_config(None, ["method=mix"]).sample
    assert (s.window_size, s.window_range, s.window_shift_every, s.window_stride) == (4, [0, -2], 25, 1)
    assert s.window_policy == "sliding" and s.same_noise_per_group and s.sde_kind == "flow" and s.noise_level == 0.7


# K = 25, window 4, one move per 25 iterations, allowed range [0, K-2) = [0, 23) (release: max_timesteps = K-2 and
# range(cur, min(cur + 4, 23))); the start passes 23 after 24 positions, so the cycle is 24 * 25 = 600 iterations.
MIX_TABLE = [
    (0, [0, 1, 2, 3]), (24, [0, 1, 2, 3]), (25, [1, 2, 3, 4]), (499, [19, 20, 21, 22]),
    (500, [20, 21, 22]), (525, [21, 22]), (550, [22]), (575, []), (599, []),  # shrinks, then one empty interval
    (600, [0, 1, 2, 3]), (625, [1, 2, 3, 4]), (1175, []), (1200, [0, 1, 2, 3]),  # rolled back to the start
]


@pytest.mark.parametrize("it,window", MIX_TABLE)
def test_mix_window_table(it, window):
    cfg = load_train_config(None, ["method=mix", "sample.num_steps=25"]).sample
    assert _window(cfg, it) == window


def test_mix_never_uses_the_last_two_steps():
    cfg = load_train_config(None, ["method=mix", "sample.num_steps=25"]).sample
    for it in range(0, 1200, 25):
        p = make_step_plan(cfg, [0, 1], iteration=it)
        assert not p.sde_mask[:, 23:].any()


@pytest.mark.parametrize("stride,expected", [
    # K = 10: range [0, 8), window 2, one move per iteration
    (3, [[0, 1], [3, 4], [6, 7], [0, 1], [3, 4]]),           # 9 > 8: restarts at 0, no wrap to 1, no empty window
    (2, [[0, 1], [2, 3], [4, 5], [6, 7], [], [0, 1]]),       # start 8 == the end: empty for one interval
])
def test_mix_stride(stride, expected):
    cfg = SamplingConfig(num_steps=10, step_mode="window", window_policy="sliding", window_size=2,
                         window_range=[0, -2], window_shift_every=1, window_stride=stride)
    assert [_window(cfg, it) for it in range(len(expected))] == expected


def _release_schedule(K, size, every, stride, iterations):
    """MixGRPO's GRPOTrainingStates (progressive, prog_overlap, roll_back) restated as a state machine: the window
    of an iteration is read before the state is updated."""
    cur, it_in_group, top, out = 0, 0, K - 2, []
    for _ in range(iterations):
        out.append(list(range(cur, min(cur + size, top))))
        it_in_group += 1
        if it_in_group >= every:
            it_in_group, cur = 0, cur + stride
        if cur > top:
            cur, it_in_group = 0, 0
    return out


@pytest.mark.parametrize("K,size,every,stride", [(25, 4, 25, 1), (10, 3, 2, 2), (16, 4, 3, 3), (8, 6, 1, 1)])
def test_sliding_window_equals_the_release_state_machine(K, size, every, stride):
    n = 3 * every * (K + 1)  # several full cycles
    cfg = SamplingConfig(num_steps=K, step_mode="window", window_policy="sliding", window_size=size,
                         window_range=[0, -2], window_shift_every=every, window_stride=stride)
    assert [_window(cfg, it) for it in range(n)] == _release_schedule(K, size, every, stride, n)


def test_sliding_wrap_keeps_the_earlier_schedule():
    """window_policy=sliding_wrap: full-size windows, start cycling modulo the number of starts (not MixGRPO)."""
    cfg = load_train_config(None, ["method=mix", "sample.num_steps=25", "sample.window_policy=sliding_wrap"]).sample
    assert _window(cfg, 500) == [0, 1, 2, 3]  # 20 starts in [0, 23): move 20 wraps to 0
    assert sliding_window(7, 1, 5, 2, 2, 1, wrap=True) == (1, 3)  # range [1, 5), size 2: starts 1, 2, 3, then 1


def test_sliding_window_moves_per_sampling_iteration_not_per_optimizer_step(tmp_path):
    """Two optimizer steps per epoch; the window still moves once per epoch: K = 4, range [0, K-2) = [0, 2),
    window 1 -> epochs 0, 1, 2, 3 train steps [0], [1], [] (nothing trained, no crash), [0]."""
    tr = make_trainer("sd3", "mix", tmp_path, **{
        "sample.cfg": "false", "sample.window_size": 1, "sample.window_range": "[0,-2]",
        "sample.window_shift_every": 1, "sample.batch_size": 1, "optim.updates_per_epoch": 2, "run.num_epochs": 4})
    seen = []
    for epoch in range(4):
        tr.train(num_epochs=1)
        t = tr.state.last_traj
        seen.append(sorted({int(t.step_indices[j]) for j in range(t.train_mask.shape[1]) if t.train_mask[:, j].any()}))
    assert seen == [[0], [1], [], [0]]
    assert tr.state.global_step == 6  # 2 optimizer steps in each epoch that trained (the empty epoch has none)


def test_step_credit_refuses_an_empty_window():
    from .conftest import make_adapter

    cfg = SamplingConfig(num_steps=4, height=64, width=64, cfg=False, guidance_scale=4.5, step_mode="window",
                         window_policy="sliding", window_size=1, window_range=[0, -2], window_shift_every=1,
                         credit="tp_grpo")
    with pytest.raises(ValueError, match="empty"):
        sample_trajectories(make_adapter("sd3"), ["a", "b"], cfg, [0, 1], [2, 3], [4, 4], [0, 0],
                            reward_fn=block_reward, iteration=2)


# ----------------------------------------------------------------------------------------------- DanceGRPO (item 3)
def test_fraction_count_rounds_down_like_the_release():
    # int(len(timesteps) * timestep_fraction) with len = K - 1
    assert fraction_train_count(16, 0.5) == 7   # round() would give 8
    assert fraction_train_count(16, 0.6) == 9
    assert fraction_train_count(4, 0.6) == 1    # round() would give 2
    assert fraction_train_count(11, 0.99) == 9
    with pytest.raises(ValueError, match="0 steps"):
        fraction_train_count(2, 0.6)
    p = make_step_plan(SamplingConfig(num_steps=16, step_mode="fraction", timestep_fraction=0.5), list(range(8)))
    assert (p.train_mask.sum(1) == 7).all() and not p.train_mask[:, 15].any()


def test_dance_preset_draws_a_subset_per_sample_and_shares_x_T_per_group(tmp_path):
    tr = make_trainer("sd3", "dance", tmp_path, **{"sample.cfg": "false", "sample.num_steps": 16,
                                                  "data.group_size": 4})
    assert tr.cfg.sample.plan_per_sample and tr.cfg.sample.same_noise_per_group
    prompts, meta, gids, xs, ns, ps = epoch_samples(tr.cfg, tr.prompts, tr.metadata, 0)
    assert gids == [0, 0, 0, 0, 1, 1, 1, 1]
    plan = make_step_plan(tr.cfg.sample, ps)
    assert (plan.train_mask.sum(1) == 9).all()  # int(15 * 0.6)
    # every sample of a group has its own subset (the release draws one randperm per sample)
    assert len({tuple(r.tolist()) for r in plan.train_mask[:4]}) == 4
    # one x_T per group (--init_same_noise), different across groups
    assert xs[:4] == [xs[0]] * 4 and xs[4:] == [xs[4]] * 4 and xs[0] != xs[4]
    x = tr.adapter.initial_noise(xs, 64, 64)
    assert all(torch.equal(x[i], x[0]) for i in range(4)) and not torch.equal(x[0], x[4])


def test_dance_last_step_equals_the_release():
    """The release samples its last step (sigma_{K-1} -> 0) with the SDE, std eta*sqrt(sigma_{K-1}), but decodes the
    step's x0 prediction x - sigma_{K-1} v and never trains the step, so its noise changes nothing. Our last step is
    the Euler step to 0, which is that same x0 prediction bit for bit; the release's Gaussian of that step is
    available from the dance kernel (checked against torch.distributions.Normal)."""
    g = torch.Generator().manual_seed(0)
    x, v = torch.randn(3, 4, 8, 8, generator=g), torch.randn(3, 4, 8, 8, generator=g)
    s, eta = 0.25, 0.3
    ode = sde_step(v, x, s, 0.0, kind="ode")
    assert torch.equal(ode.prev_sample, x - s * v)  # the release's pred_original_sample
    # the release's last-step Gaussian: mean = x + dsigma v + dsigma * (-eta^2/2) * score,
    # score = -(x - (1 - sigma) x0_hat) / sigma^2, std = eta * sqrt(sigma - 0)
    x0 = x - s * v
    mean = x - s * v + (-s) * (-0.5 * eta ** 2) * (-(x - x0 * (1 - s)) / s ** 2)
    std = eta * math.sqrt(s)
    y = mean + std * torch.randn(x.shape, generator=g)
    out = sde_step(v, x, s, 0.0, kind="dance", noise_level=eta, prev_sample=y)
    torch.testing.assert_close(out.mean, mean, atol=1e-6, rtol=1e-6)
    assert float(out.std.flatten()[0]) == pytest.approx(std, rel=1e-6)
    ref = torch.distributions.Normal(mean.double(), std).log_prob(y.double()).mean(dim=(1, 2, 3))
    torch.testing.assert_close(out.log_prob.double(), ref, atol=1e-5, rtol=1e-6)
