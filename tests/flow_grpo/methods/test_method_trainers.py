"""The wave-2 methods registered in the flow credit table, run by the trainer on the tiny SD3 and the tiny FLUX (a
couple of epochs each), and their advantages through the trainer checked against hand values (on SD3)."""
from flow_grpo import checkpoint
from flow_grpo.data import epoch_samples
from flow_grpo.train import steps
import math

import pytest
import torch

from flow_grpo.sampler import sample_trajectories

from ..conftest import block_reward, make_trainer


def _traj(tr):
    prompts, meta, gids, xs, ns, ps = epoch_samples(tr.cfg, tr.prompts, tr.metadata, 0)
    return sample_trajectories(tr.adapter, prompts, tr.cfg.sample, xs, ns, ps, gids, meta, block_reward)


def _train_two_epochs(method, tmp_path, kind="sd3", **extra):
    tr = make_trainer(kind, method, tmp_path, **{"run.num_epochs": 2, "sample.cfg": "false", **extra})
    before = {n: p.detach().clone() for n, p in tr.named_params}
    hist = tr.train()
    changed = [n for n, p in tr.named_params if not torch.equal(p.detach(), before[n])]
    assert len(hist) == 2 and changed and all("lora_" in n for n in changed)
    return tr, hist


# ------------------------------------------------------------------------------------------------------ VGPO
def test_vgpo_advantages_through_the_trainer_by_hand(tmp_path):
    tr = make_trainer("sd3", "vgpo", tmp_path, **{"sample.cfg": "false", "methods.vgpo.tau": 0.1})
    traj = _traj(tr)
    assert traj.step_rewards.shape == (4, 3)  # window of 2 SDE steps: V_0, V_1, V_2 = R
    # group 0: identical trajectories (no spread: absolute term only); group 1: G = R - V_{k-1}
    traj.step_rewards = torch.tensor([[0.5, 0.5, 0.7], [0.5, 0.5, 0.7], [0.0, 0.3, 0.2], [0.0, 0.1, 0.4]])
    adv, _ = steps.advantages(tr, traj)
    got = torch.stack([adv[i][traj.train_mask[i]] for i in range(4)])
    assert got[0].tolist() == pytest.approx([2.0, 2.0]) and got[1].tolist() == pytest.approx([2.0, 2.0])
    # group 1, step 1: G = [0.2, 0.4], step 2: G = [-0.1, 0.3]; population std 0.1 and 0.2
    w1, w2 = math.exp(-1.0), math.exp(-2.0)
    z1, z2 = 0.1 / (0.1 + 1e-4), 0.2 / (0.2 + 1e-4)
    assert got[2].tolist() == pytest.approx([(1 - w1) * -z1 + w1 * 2.0, (1 - w2) * -z2 + w2 * -1.0], rel=1e-5)
    assert got[3].tolist() == pytest.approx([(1 - w1) * z1 + w1 * 4.0, (1 - w2) * z2 + w2 * 3.0], rel=1e-5)


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_vgpo_trains_two_epochs(kind, tmp_path):
    _, hist = _train_two_epochs("vgpo", tmp_path, kind)
    assert "vgpo/abs_weight" in hist[-1] and hist[-1]["train/ratio_mean"] == 1.0


def test_vgpo_refuses_a_non_contiguous_plan(tmp_path):
    with pytest.raises(ValueError, match="window or all"):
        tr = make_trainer("sd3", "vgpo", tmp_path, **{"sample.step_mode": "single"})
        _traj(tr)


# ------------------------------------------------------------------------------------------------------ DiffusionNFT
def test_nft_plan_and_rollout_are_deterministic_with_the_trained_timesteps(tmp_path):
    from flow_grpo.config import load_train_config

    c = load_train_config(None, ["method=nft"])
    assert (c.sample.step_mode, c.sample.credit, c.sample.cfg, c.optim.kl_type, c.optim.kl_coef) == \
        ("nft", "nft", False, "velocity", 1e-4)
    tr = make_trainer("sd3", "nft", tmp_path, **{"sample.cfg": "false"})
    traj = _traj(tr)
    assert not bool(traj.sde_mask.any())  # no SDE step: a deterministic solver
    per_sample = traj.train_mask.sum(1)
    assert per_sample.tolist() == [int(4 * 0.99)] * 4  # int(K * 0.99) = 3 of the K = 4 timesteps
    assert len({tuple(traj.train_mask[i].tolist()) for i in range(4)}) > 1  # a subset per sample (plan_per_sample)


def test_nft_loss_through_the_trainer_matches_forward_loss(tmp_path):
    from flow_grpo.methods import nft
    from mmgrpo.utils.seeding import sample_seed

    tr = make_trainer("sd3", "nft", tmp_path, **{"optim.kl_coef": 0.0, "sample.cfg": "false"})
    traj = _traj(tr)
    traj.rewards["total"] = torch.tensor([0.0, 1.0, 2.0, 4.0])
    adv, _ = steps.advantages(tr, traj)
    col = int(traj.train_mask.sum(0).argmax())  # the timestep most samples train
    mask = traj.train_mask[:, col].float()
    loss, metrics, _, cnt = tr.loss(traj, traj.chunks[0], col, adv, n_global=7.0)
    # by hand: r from the advantages, the same noise, then 5 * sum_i mask_i l_i / 7
    k = int(traj.step_indices[col])
    noise = torch.stack([torch.randn(traj.final_latents.shape[1:], generator=torch.Generator().manual_seed(
        sample_seed(int(traj.noise_seeds[i]), 11, k, tr.state.global_step))) for i in range(4)])
    r = nft.reward_weight(adv[:, col])
    out = nft.forward_loss(tr.adapter, traj.final_latents, float(traj.sigmas[col]), tr.adapter.encode_prompts(
        traj.prompts), noise, r, tr.credit.old)
    ref = 5.0 * float((out.per_sample.detach() * mask).sum()) / 7.0
    assert mask.sum() >= 2 and ref > 0
    assert float(loss.detach()) == pytest.approx(ref, rel=1e-5) and cnt == int(mask.sum())
    # advantages: group mean, population std of the whole batch + 1e-4 (the release's global_std tracker)
    s = torch.tensor([0.0, 1.0, 2.0, 4.0]).std(unbiased=False).item()
    assert adv[0][traj.train_mask[0]][0].item() == pytest.approx(-0.5 / (s + 1e-4), rel=1e-5)


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_nft_trains_two_epochs_and_the_old_adapter_follows_the_schedule(kind, tmp_path):
    tr, hist = _train_two_epochs("nft", tmp_path, kind, **{"methods.nft.decay_type": 1})
    m = hist[-1]
    assert "train/nft_policy_loss" in m and "train/ratio_mean" not in m
    # decay type 1: d = min(0.001 * step, 0.5); after epoch 2 the optimizer step is 2 -> d = 0.002
    assert hist[0]["nft/old_decay"] == pytest.approx(0.001) and m["nfe_per_trajectory"] == 4
    assert m["nft/old_decay"] == pytest.approx(0.002)
    # the old weights are the EMA of the current ones: not equal to them (d > 0), but close
    cur = [p.detach() for p in tr.params]
    old = tr.credit.old.shadow
    assert any(not torch.equal(a.float(), b) for a, b in zip(cur, old))
    assert tr.credit.state_dict()["old"]["decay"] == pytest.approx(0.002)


def test_nft_resume_restores_the_old_adapter(tmp_path):
    tr, _ = _train_two_epochs("nft", tmp_path, **{"run.save_every": 1})
    sd = {**checkpoint.state_dict(tr.trained), **tr.run_entries()}
    tr2 = make_trainer("sd3", "nft", tmp_path / "b", **{"sample.cfg": "false"})
    tr2.load_state_dict(sd)
    for a, b in zip(tr.credit.old.shadow, tr2.credit.old.shadow):
        assert torch.equal(a, b)
    sd.pop("methods")
    with pytest.raises(ValueError, match="credit=nft"):
        tr2.load_state_dict(sd)


# ------------------------------------------------------------------------------------------------------ BranchGRPO
TREE = {"sample.cfg": "false", "data.group_size": 4, "data.groups_per_epoch": 1, "sample.num_steps": 4,
        "methods.branch_grpo.split_points": "[0,1]"}  # 4 steps, splits at steps 0 and 1: leaves 0,1 | 2,3 share step 0


def _traj_with_members(tr, epoch=0):
    prompts, meta, gids, xs, ns, ps = epoch_samples(tr.cfg, tr.prompts, tr.metadata, epoch)
    return sample_trajectories(tr.adapter, prompts, tr.cfg.sample, xs, ns, ps, gids, meta, block_reward,
                               iteration=epoch, members=[s % tr.cfg.data.group_size for s in range(len(prompts))],
                               method=tr.credit)


def test_tree_rollout_shares_each_prefix_and_trains_each_edge_once(tmp_path):
    tr = make_trainer("sd3", "branch_grpo", tmp_path, **TREE)
    traj = _traj_with_members(tr)
    col = {int(k): j for j, k in enumerate(traj.step_indices.tolist())}
    x1 = traj.latents[:, col[1]]  # the state after step 0 (before step 1)
    assert torch.equal(x1[0], x1[1]) and torch.equal(x1[2], x1[3]) and not torch.equal(x1[0], x1[2])
    x2 = traj.latents[:, col[2]]  # after the second split every leaf has its own state
    assert all(not torch.equal(x2[i], x2[j]) for i in range(4) for j in range(i))
    # owners: step 0 edges by leaves 0 and 2, step 1 and 2 by every leaf; the last step is never trained
    assert traj.train_mask.tolist() == [[True, True, True], [False, True, True], [True, True, True],
                                        [False, True, True]]


def test_tree_advantages_through_the_trainer_by_hand(tmp_path):
    tr = make_trainer("sd3", "branch_grpo", tmp_path, **TREE)
    traj = _traj_with_members(tr)
    traj.rewards["total"] = torch.tensor([1.0, 2.0, 3.0, 6.0])
    adv, stats = steps.advantages(tr, traj)
    s1, s2 = math.sqrt(2 * 1.5 ** 2), math.sqrt(14 / 3)  # unbiased stds of (1.5, 4.5) and (1, 2, 3, 6)
    assert adv[:, 0].tolist() == pytest.approx([-1.5 / s1, 0.0, 1.5 / s1, 0.0], rel=1e-5)
    for c in (1, 2):  # after the last split: the leaves' own z-scores at every depth
        assert adv[:, c].tolist() == pytest.approx([-2 / s2, -1 / s2, 0.0, 3 / s2], rel=1e-5, abs=1e-7)
    assert stats["tree/complete_trees"] == 1.0


def test_tree_width_pruning_through_the_trainer_by_hand(tmp_path):
    kw = {**TREE, "data.group_size": 2, "methods.branch_grpo.split_points": "[0]", "methods.branch_grpo.width_pruning": 2}
    tr = make_trainer("sd3", "branch_grpo", tmp_path, **kw)
    traj = _traj_with_members(tr)
    traj.rewards["total"] = torch.tensor([0.2, 0.9])
    adv, _ = steps.advantages(tr, traj)
    assert traj.train_mask.tolist() == [[True] * 3, [True] * 3]  # each leaf owns its chain; last step excluded
    assert adv[:, 1].tolist() == pytest.approx([-2 ** -0.5, 2 ** -0.5], rel=1e-5)  # +-1/sqrt(2) at every depth
    traj.advantages = adv
    for m in tr.methods:  # the train masks, as the recipe applies them
        traj = m.on_advantages(traj)
    mask = traj.train_mask
    # 4 edges after the split (steps 1, 2 of both leaves), keep max(2, int(4 * 0.5)) = 2: the best (leaf 1, step
    # 1: node 4 comes first among the equal advantages) and the worst (leaf 0, step 2: node 5 comes last)
    assert mask.tolist() == [[True, False, True], [True, True, False]]


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_branch_grpo_trains_two_epochs(kind, tmp_path):
    _, hist = _train_two_epochs("branch_grpo", tmp_path, kind, **TREE)
    assert hist[-1]["train/ratio_mean"] == 1.0


def test_tree_refuses_a_group_size_that_is_not_the_leaf_count(tmp_path):
    tr = make_trainer("sd3", "branch_grpo", tmp_path, **{**TREE, "methods.branch_grpo.split_points": "[0,1,2]"})
    traj = _traj_with_members(tr)  # 4 of the 8 leaves sampled
    with pytest.raises(ValueError, match="data.group_size=8"):
        steps.advantages(tr, traj)
    tr = make_trainer("sd3", "branch_grpo", tmp_path / "b", **{**TREE, "methods.branch_grpo.split_points": "[0]"})
    with pytest.raises(ValueError, match="data.group_size=2"):
        _traj_with_members(tr)  # members 2, 3 have no leaf


# ------------------------------------------------------------------------------------------------------ B2-DiffuRL
B2 = {"sample.cfg": "false", "data.group_size": 3, "data.groups_per_epoch": 1, "sample.num_steps": 4,
      "methods.b2_diffurl.num_stages": 2, "methods.b2_diffurl.split_left": 2, "methods.b2_diffurl.split_right": 3}


def test_b2_branches_share_the_prefix_and_the_segment_grows_backward(tmp_path):
    tr = make_trainer("sd3", "b2", tmp_path, **B2)
    traj = _traj_with_members(tr, epoch=0)  # stage 0: s = 2, branch step 2, trains step 2 only
    assert traj.step_indices.tolist() == [2] and bool(traj.train_mask.all())
    x2, y2 = traj.latents[:, 0], traj.next_latents[:, 0]
    assert torch.equal(x2[0], x2[1]) and torch.equal(x2[0], x2[2])  # same x_T and prefix
    assert not torch.equal(y2[0], y2[1])  # own noise from the branch step on
    # sample.shared_prefix: steps 0, 1 and the branch step 2 (its input x_2 is still shared) once, step 3 per
    # branch: (3 + 3) / 3 NFEs per trajectory instead of K = 4
    assert traj.nfe_per_trajectory == 2.0
    traj = _traj_with_members(tr, epoch=1)  # stage 1: s = 2 + 1 * 2 // 2 = 3: steps 1 and 2
    assert traj.step_indices.tolist() == [1, 2]


def test_b2_selects_the_best_and_worst_branch_by_hand(tmp_path):
    tr = make_trainer("sd3", "b2", tmp_path, **B2)
    traj = _traj_with_members(tr)
    traj.rewards["total"] = torch.tensor([0.1, 0.5, 0.3])  # z = (-1, 1, 0): unbiased std 0.2
    adv, stats = steps.advantages(tr, traj)
    assert adv[:, 0].tolist() == pytest.approx([-1.0, 1.0, 0.0], rel=1e-6)
    assert stats["b2/selected_fraction"] == pytest.approx(2 / 3)
    # next epoch, same prompt: z over {0.1, 0.5, 0.3} (history) and {0.3, 0.3, 0.9}: mean 0.4, unbiased std
    # sqrt(0.38 / 5); only the best branch passes a threshold (the worst has z = -0.36 > -0.5)
    traj.rewards["total"] = torch.tensor([0.3, 0.3, 0.9])
    adv, _ = steps.advantages(tr, traj)
    sd = math.sqrt(0.38 / 5)
    assert adv[:, 0].tolist() == pytest.approx([0.0, 0.0, 0.5 / sd], rel=1e-5)
    # the history is the credit's checkpointed state
    tr2 = make_trainer("sd3", "b2", tmp_path / "b", **B2)
    tr2.load_state_dict({**checkpoint.state_dict(tr.trained), **tr.run_entries()})
    assert [{k: v.tolist() for k, v in h.items()} for h in tr2.credit.history] == \
        [{k: v.tolist() for k, v in h.items()} for h in tr.credit.history]
    assert len(tr.credit.history) == 2


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_b2_trains_two_epochs(kind, tmp_path):
    _, hist = _train_two_epochs("b2", tmp_path, kind, **B2)
    assert hist[-1]["train/ratio_mean"] == 1.0


def test_nft_checkpoint_resume_is_exact(tmp_path):
    """1 epoch, checkpoint, resume for the 2nd = 2 epochs in one go (weights, old adapter, optimizer)."""
    kw = {"sample.cfg": "false", "run.save_every": 1, "run.resume_from": "auto"}
    full = make_trainer("sd3", "nft", tmp_path / "full", **{**kw, "run.num_epochs": 2})
    full.train()
    first = make_trainer("sd3", "nft", tmp_path / "split", **{**kw, "run.num_epochs": 1})
    first.train()
    second = make_trainer("sd3", "nft", tmp_path / "split", **{**kw, "run.num_epochs": 2})
    hist = second.train()
    assert [h["epoch"] for h in hist] == [1]
    for (n, a), (_, b) in zip(full.named_params, second.named_params):
        assert torch.equal(a, b), n
    assert all(torch.equal(a, b) for a, b in zip(full.credit.old.shadow, second.credit.old.shadow))
    # and the old adapter is not trivially equal to the weights (the check would not see a lost state)
    assert any(not torch.equal(a.float(), b) for a, b in zip(second.params, second.credit.old.shadow))


@pytest.mark.parametrize("tree", [TREE, {**TREE, "data.group_size": 16, "sample.num_steps": 20, "sample.batch_size": 16,
                                         "methods.branch_grpo.split_points": "[0,3,6,9]"}], ids=["small", "release"])
def test_tree_trunk_evaluated_once_with_the_log_probs_of_the_recomputing_path(tmp_path, tree):
    """``sample.shared_prefix``: a node of the tree is evaluated once, not once per leaf below it, and the
    trajectories equal the path that recomputes the shared prefix per leaf. Counts by hand: small (K = 4, splits
    {0, 1}, 4 leaves) 1 + 2 + 4 + 4 = 11 NFEs; the release (K = 20, splits {0, 3, 6, 9}, 16 leaves)
    1 + 2*3 + 4*3 + 8*3 + 16*10 = 203 = 12.69 per leaf instead of 20. Sharing is within a rollout chunk
    (``sample.batch_size``), so the release case rolls its 16 leaves in one chunk."""
    shared = _traj_with_members(make_trainer("sd3", "branch_grpo", tmp_path / "a", **tree))
    flat = _traj_with_members(make_trainer("sd3", "branch_grpo", tmp_path / "b",
                                           **{**tree, "sample.shared_prefix": "false"}))
    K, G = int(tree["sample.num_steps"]), int(tree["data.group_size"])
    assert flat.nfe_per_trajectory == K
    assert shared.nfe_per_trajectory == {4: 11, 20: 203}[K] / G
    if K == 20:
        assert flat.nfe_per_trajectory / shared.nfe_per_trajectory >= 1.5
    # the smaller model batch of a shared step may round differently (measured: <= 5e-7): float32 rounding, no more
    for a, b in ((shared.log_probs, flat.log_probs), (shared.latents, flat.latents),
                 (shared.final_latents, flat.final_latents)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert torch.equal(shared.train_mask, flat.train_mask)
    assert shared.log_probs.abs().max() > 0
