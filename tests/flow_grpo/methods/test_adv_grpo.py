"""Adv-GRPO (flow_grpo/methods/adv_grpo.py) in the trainer: the schedules by hand, the reward model's update on the
epoch's images against the renderer's references, training on the tiny SD3 and FLUX, and exact resume of the reward
model (head, Adam state, patch-draw generator)."""
import pytest
import torch

from flow_grpo.methods.adv_grpo import policy_epoch, reward_model_epoch
from flow_grpo.rewards.dino import AdversarialDinoReward, DinoBackbone, discriminator_loss

from ..conftest import make_trainer

PROMPTS = "[a red circle, two blue squares, a green triangle]"


def _trainer(kind, out, backbone=None, **extra):
    adv = AdversarialDinoReward(backbone=backbone or DinoBackbone(tiny=True), head_hidden=16, refs_per_prompt=2)
    ov = {"data.prompts": PROMPTS, "sample.cfg": "false", "methods.adv_grpo.schedule": "interleave",
          "methods.adv_grpo.every": 1, "methods.adv_grpo.lr": 1e-2, "methods.adv_grpo.n_patches": 8,
          "sample.window_range": "[0,3]", **extra}
    return make_trainer(kind, "adv_grpo", out, rewards={"adv_dino": adv}, **ov)


def _head(tr):
    return {k: v.detach().clone() for k, v in tr.credit.model.head.state_dict().items()}


def test_schedules_by_hand():
    # alternate (the release, d_times = k): policy on epochs with (e+1) % k == 0, reward model on the others
    assert [policy_epoch("alternate", 3, e) for e in range(6)] == [False, False, True, False, False, True]
    assert [reward_model_epoch("alternate", 3, e) for e in range(6)] == [True, True, False, True, True, False]
    # interleave: policy every epoch, reward model after every k-th
    assert all(policy_epoch("interleave", 2, e) for e in range(4))
    assert [reward_model_epoch("interleave", 2, e) for e in range(4)] == [False, True, False, True]
    with pytest.raises(ValueError, match="schedule"):
        reward_model_epoch("sometimes", 2, 0)


def test_preset_is_the_release_setting():
    from flow_grpo.config import load_train_config

    c = load_train_config(None, ["method=adv_grpo"])
    s, o, a = c.sample, c.optim, c.methods.adv_grpo
    assert (s.sde_kind, s.noise_level, s.step_mode, s.window_policy, s.window_size, s.window_range[0]) == \
        ("cps", 0.8, "window", "fixed", 2, 0)
    assert (s.credit, o.clip_low, o.adv_scale, o.adv_std_ddof, o.adv_eps, o.kl_coef) == \
        ("adv_grpo", 1e-5, "batch", 0, 1e-4, 0.0)
    assert (a.schedule, a.every, a.lr, tuple(a.betas), a.patch_weight, a.n_patches) == \
        ("alternate", 10, 1e-4, (0.5, 0.999), 0.3, 64)
    with pytest.raises(ValueError, match="methods.adv_grpo.every"):
        load_train_config(None, ["method=adv_grpo", "methods.adv_grpo.every=0"])


def test_reward_model_update_is_the_hinge_step_on_the_epochs_images_and_references(tmp_path):
    """One epoch through the trainer = one Adam step (own lr/betas) by hand on the rollout's images (negatives) and
    reference ``member % refs_per_prompt`` of each sample's prompt, rendered by Mini-GenEval (positives)."""
    from flow_grpo.media import to_uint8_nhwc
    from mmgrpo.synthetic import t2i as bench

    tr = _trainer("sd3", tmp_path)
    head0 = _head(tr)
    gen0 = torch.Generator().set_state(tr.credit.generator.get_state())
    tr.train()
    traj = tr.state.last_traj
    neg = to_uint8_nhwc(traj.images)
    pos = torch.stack([torch.from_numpy(bench.render(bench.parse_prompt(p), size=neg.shape[1], seed=int(m) % 2))
                       for p, m in zip(traj.prompts, traj.members)]).numpy()
    m = tr.credit.model
    ref = AdversarialDinoReward(backbone=m.backbone, head_hidden=16)
    ref.head.load_state_dict(head0)
    opt = torch.optim.Adam(ref.head.parameters(), lr=1e-2, betas=(0.5, 0.999))
    cr, pr = m.backbone.tokens(pos)
    cf, pf = m.backbone.tokens(neg)
    loss, _ = discriminator_loss(ref.head, cr, pr, cf, pf, patch_weight=0.3, n_patches=8, generator=gen0)
    opt.zero_grad()
    loss.backward()
    opt.step()
    for k, v in ref.head.state_dict().items():
        assert torch.equal(v, m.head.state_dict()[k]), k
    assert not torch.equal(head0["0.weight"], m.head.state_dict()["0.weight"])


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_trains_the_policy_and_the_reward_model(kind, tmp_path):
    tr = _trainer(kind, tmp_path, **{"run.num_epochs": 2})
    lora0 = {n: p.detach().clone() for n, p in tr.named_params}
    head0 = _head(tr)
    hist = tr.train()
    assert [h["adv_grpo/reward_updates"] for h in hist] == [1.0, 2.0]
    assert all(h["adv_grpo/policy_epoch"] == 1.0 and "adv_grpo/d_loss" in h for h in hist)
    assert "reward/adv_dino/mean" in hist[-1] and tr.state.counters["applied_steps"] == 2
    assert any(not torch.equal(p.detach(), lora0[n]) for n, p in tr.named_params)
    assert not torch.equal(_head(tr)["2.weight"], head0["2.weight"])


def test_alternate_schedule_steps_either_the_reward_model_or_the_policy(tmp_path):
    tr = _trainer("sd3", tmp_path, **{"run.num_epochs": 2, "methods.adv_grpo.schedule": "alternate",
                                      "methods.adv_grpo.every": 2})
    rt = tr.credit
    snaps = [({n: p.detach().clone() for n, p in tr.named_params}, _head(tr))]
    end_of_step = rt.end_of_step

    def snapshot(traj, metrics):
        end_of_step(traj, metrics)
        snaps.append(({n: p.detach().clone() for n, p in tr.named_params}, _head(tr)))

    rt.end_of_step = snapshot
    hist = tr.train()
    (l0, h0), (l1, h1), (l2, h2) = snaps
    # epoch 0: the reward model only (the policy's update is empty: no optimizer step)
    assert all(torch.equal(l1[n], l0[n]) for n in l0) and not torch.equal(h1["2.weight"], h0["2.weight"])
    # epoch 1: the policy only
    assert any(not torch.equal(l2[n], l1[n]) for n in l1) and all(torch.equal(h2[k], h1[k]) for k in h1)
    assert [h["adv_grpo/policy_epoch"] for h in hist] == [0.0, 1.0]
    assert tr.state.counters["empty_updates"] == 1 and tr.state.counters["applied_steps"] == 1


def test_alternate_run_shorter_than_one_cycle_trained_nothing(tmp_path):
    from mmgrpo.engine.errors import NothingTrained

    tr = _trainer("sd3", tmp_path, **{"methods.adv_grpo.schedule": "alternate", "methods.adv_grpo.every": 10})
    with pytest.raises(NothingTrained):
        tr.train()


def test_checkpoint_resume_is_exact(tmp_path):
    """1 epoch, checkpoint, resume for the 2nd = 2 epochs in one go: LoRA, reward head, its Adam state and its
    patch-draw generator bit for bit; a resume that lost the reward model's state would differ."""
    kw = {"run.save_every": 1, "run.resume_from": "auto"}
    bb = DinoBackbone(tiny=True)
    full = _trainer("sd3", tmp_path / "full", bb, **{**kw, "run.num_epochs": 2})
    full.train()
    _trainer("sd3", tmp_path / "split", bb, **{**kw, "run.num_epochs": 1}).train()
    second = _trainer("sd3", tmp_path / "split", bb, **{**kw, "run.num_epochs": 2})
    hist = second.train()
    assert [h["epoch"] for h in hist] == [1]
    for (n, a), (_, b) in zip(full.named_params, second.named_params):
        assert torch.equal(a, b), n
    a, b = full.credit, second.credit
    assert all(torch.equal(v, _head(second)[k]) for k, v in _head(full).items())
    assert torch.equal(a.generator.get_state(), b.generator.get_state()) and a.updates == b.updates == 2
    sa, sb = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i])

    # negative control: the same resume without the reward model's state does not reproduce the run
    class Forgetful(type(b)):
        def load_state_dict(self, sd):
            pass

    lost = _trainer("sd3", tmp_path / "split", bb, **{**kw, "run.num_epochs": 2, "run.resume_from":
                                                      str(tmp_path / "split" / "checkpoints" / "epoch-00000001")})
    lost.credit.__class__ = Forgetful
    lost.train()
    assert not all(torch.equal(v, _head(lost)[k]) for k, v in _head(full).items())


def test_refuses_a_reward_that_is_not_a_reward_model(tmp_path):
    from ..conftest import block_reward

    tr = make_trainer("sd3", "adv_grpo", tmp_path, rewards={"block": block_reward}, **{"sample.cfg": "false",
                      "sample.window_range": "[0,3]"})
    with pytest.raises(ValueError, match="methods.adv_grpo.reward='adv_dino'"):
        tr.train()
