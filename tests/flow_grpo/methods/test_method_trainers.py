"""The wave-2 methods registered in the flow credit table, run by the trainer on the tiny SD3 (a couple of epochs
each), and their advantages through the trainer checked against hand values."""
import math

import pytest
import torch

from flow_grpo.sampler import sample_trajectories

from ..conftest import block_reward, make_trainer


def _traj(tr):
    prompts, meta, gids, xs, ns, ps = tr._epoch_samples(0)
    return sample_trajectories(tr.adapter, prompts, tr.cfg.sample, xs, ns, ps, gids, meta, block_reward)


def _train_two_epochs(method, tmp_path, **extra):
    tr = make_trainer("sd3", method, tmp_path, **{"run.num_epochs": 2, "sample.cfg": "false", **extra})
    before = {n: p.detach().clone() for n, p in tr.named_params}
    hist = tr.train()
    changed = [n for n, p in tr.named_params if not torch.equal(p.detach(), before[n])]
    assert len(hist) == 2 and changed and all("lora_" in n for n in changed)
    return tr, hist


# ------------------------------------------------------------------------------------------------------ VGPO
def test_vgpo_advantages_through_the_trainer_by_hand(tmp_path):
    tr = make_trainer("sd3", "vgpo", tmp_path, **{"sample.cfg": "false", "sample.vgpo_tau": 0.1})
    traj = _traj(tr)
    assert traj.step_rewards.shape == (4, 3)  # window of 2 SDE steps: V_0, V_1, V_2 = R
    # group 0: identical trajectories (no spread: absolute term only); group 1: G = R - V_{k-1}
    traj.step_rewards = torch.tensor([[0.5, 0.5, 0.7], [0.5, 0.5, 0.7], [0.0, 0.3, 0.2], [0.0, 0.1, 0.4]])
    adv, _ = tr.compute_advantages(traj)
    got = torch.stack([adv[i][traj.train_mask[i]] for i in range(4)])
    assert got[0].tolist() == pytest.approx([2.0, 2.0]) and got[1].tolist() == pytest.approx([2.0, 2.0])
    # group 1, step 1: G = [0.2, 0.4], step 2: G = [-0.1, 0.3]; population std 0.1 and 0.2
    w1, w2 = math.exp(-1.0), math.exp(-2.0)
    z1, z2 = 0.1 / (0.1 + 1e-4), 0.2 / (0.2 + 1e-4)
    assert got[2].tolist() == pytest.approx([(1 - w1) * -z1 + w1 * 2.0, (1 - w2) * -z2 + w2 * -1.0], rel=1e-5)
    assert got[3].tolist() == pytest.approx([(1 - w1) * z1 + w1 * 4.0, (1 - w2) * z2 + w2 * 3.0], rel=1e-5)


def test_vgpo_trains_two_epochs(tmp_path):
    _, hist = _train_two_epochs("vgpo", tmp_path)
    assert "vgpo/abs_weight" in hist[-1] and hist[-1]["train/ratio_mean"] == 1.0


def test_vgpo_refuses_a_non_contiguous_plan(tmp_path):
    with pytest.raises(ValueError, match="window or all"):
        tr = make_trainer("sd3", "vgpo", tmp_path, **{"sample.step_mode": "single"})
        _traj(tr)
