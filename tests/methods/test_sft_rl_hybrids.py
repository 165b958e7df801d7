"""Hybrid SFT + RL (issue #38 item 2): LUFFY's policy shaping and CHORD's annealed, token-weighted SFT term --
values and gradients worked out by hand from the papers' formulas, then each method in a tiny trainer."""
import math

import pytest
import torch

from mmgrpo.vlm.config import AlgoConfig
from mmgrpo.vlm.methods.base import LossInputs
from mmgrpo.vlm.methods.chord import chord_loss, chord_mu, chord_phi
from mmgrpo.vlm.methods.luffy import luffy_loss, policy_shaping

LN = math.log


def _inputs(logp_rows, adv, off):
    logp = torch.tensor(logp_rows, dtype=torch.float64, requires_grad=True)
    return logp, LossInputs(logp=logp, old_logp=logp.detach(), advantages=torch.tensor(adv, dtype=torch.float64),
                            mask=torch.ones_like(logp, dtype=torch.long), offpolicy=torch.tensor(off),
                            algo=AlgoConfig())


def test_policy_shaping_by_hand():
    assert policy_shaping(torch.tensor(0.5), 0.1).item() == pytest.approx(0.5 / 0.6)
    assert policy_shaping(torch.tensor(0.0), 0.1).item() == 0.0


def test_luffy_loss_and_gradient_by_hand():
    # row 0 on-policy (A = 1, ratio 1 -> -A per token); row 1 expert (A = 2): -A p / (p + 0.1), p = 0.5 and 0.25
    logp, li = _inputs([[LN(0.9), LN(0.8)], [LN(0.5), LN(0.25)]], [1.0, 2.0], [False, True])
    out = luffy_loss(li, gamma=0.1)
    want = (-1 - 1 - 2 * 0.5 / 0.6 - 2 * 0.25 / 0.35) / 4  # token mean over the 4 tokens
    assert out.loss.item() == pytest.approx(want, abs=1e-12)
    out.loss.backward()
    # d/dlogp of -A p/(p+g) = -A g p / (p+g)^2 (p = e^logp); on-policy: d(-A rho)/dlogp = -A at rho = 1
    g = logp.grad
    assert g[0].tolist() == pytest.approx([-1 / 4, -1 / 4])
    assert g[1, 0].item() == pytest.approx(-2 * 0.1 * 0.5 / 0.6**2 / 4)
    assert g[1, 1].item() == pytest.approx(-2 * 0.1 * 0.25 / 0.35**2 / 4)
    # with no expert row it is the default loss
    _, li0 = _inputs([[LN(0.9), LN(0.8)]], [1.0], [False])
    assert luffy_loss(li0).loss.item() == pytest.approx(-1.0)


def test_chord_mu_schedule_by_hand():
    mu = [chord_mu(t, peak=0.5, valley=0.02, warmup=2, decay=4) for t in range(8)]
    # warmup 0, 0.25; peak at 2; cosine: t-2 = 1 -> 0.02 + 0.48 * (1 + cos(pi/4)) / 2; 2 -> 0.26; then valley
    assert mu[:3] == pytest.approx([0.0, 0.25, 0.5])
    assert mu[3] == pytest.approx(0.02 + 0.48 * (1 + math.cos(math.pi / 4)) / 2)
    assert mu[4] == pytest.approx(0.26)
    assert mu[6:] == pytest.approx([0.02, 0.02])
    assert chord_phi(torch.tensor(0.25)).item() == pytest.approx(0.1875)


@pytest.mark.parametrize("with_totals", [False, True])
def test_chord_loss_and_gradient_by_hand(with_totals):
    logp, li = _inputs([[LN(0.9), LN(0.8)], [LN(0.5), LN(0.25)]], [1.0, 0.0], [False, True])
    if with_totals:  # the recipe's global counts: 4 tokens of which 2 are expert tokens
        li.totals = {"tokens": 4.0, "sequences": 2.0, "offpolicy_tokens": 2.0, "offpolicy_sequences": 1.0}
    out = chord_loss(li, mu=0.3)
    rl = -1.0  # on-policy token mean over its own 2 tokens: -A = -1
    sft = -(0.25 * LN(0.5) + 0.1875 * LN(0.25)) / 2  # phi(0.5) = 0.25, phi(0.25) = 0.1875
    assert out.loss.item() == pytest.approx(0.7 * rl + 0.3 * sft, abs=1e-12)
    out.loss.backward()
    # phi is held constant: d/dlogp of -mu phi logp / 2 = -mu phi / 2
    assert logp.grad[1].tolist() == pytest.approx([-0.3 * 0.25 / 2, -0.3 * 0.1875 / 2])
    assert logp.grad[0].tolist() == pytest.approx([-0.7 / 2, -0.7 / 2])
    out2 = chord_loss(_inputs([[LN(0.9), LN(0.8)], [LN(0.5), LN(0.25)]], [1.0, 0.0], [False, True])[1], 0.3,
                      token_weight="none")
    assert out2.loss.item() == pytest.approx(0.7 * rl + 0.3 * -(LN(0.5) + LN(0.25)) / 2)


def test_trainer_luffy_injects_the_expert_and_shapes_it(tmp_path, tiny_dirs, th):
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "reward.accuracy_key=acc",
                      "data.check_samples=0", "methods.luffy.enabled=true")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    assert [m.name for m in tr.methods] == ["luffy"]
    hist = tr.train()
    rb = tr.state.batch
    # 2 groups of G = 4: 3 sampled + the ground truth, last in each group
    assert rb.n == 8 and rb.is_offpolicy.tolist() == [False, False, False, True] * 2
    assert [rb.texts[i] for i in (3, 7)] == ["<answer>B</answer>"] * 2
    # the expert enters the group statistics (default group advantages over all 4 members)
    from mmgrpo.core import group_advantages

    torch.testing.assert_close(rb.advantages, group_advantages(rb.rewards["total"], rb.group_ids).advantages.float())
    assert math.isfinite(hist[-1]["train/loss"]) and 0 < hist[-1]["train/luffy/expert_prob"] < 1


def test_trainer_chord_keeps_the_expert_out_of_the_advantages(tmp_path, tiny_dirs, th):
    from mmgrpo.core import group_advantages
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=2", "reward.accuracy_key=acc",
                      "data.check_samples=0", "methods.chord.enabled=true", "methods.chord.warmup_steps=0",
                      "methods.chord.decay_steps=2", "methods.chord.mu_peak=0.4", "methods.chord.mu_valley=0.1")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    hist = tr.train()
    rb = tr.state.batch
    off = rb.is_offpolicy
    assert int(off.sum()) == 2 and bool((rb.advantages[off] == 0).all())
    want = group_advantages(rb.rewards["total"], rb.group_ids, valid=~off).advantages.float()
    torch.testing.assert_close(rb.advantages, want)
    # the mu of steps 1 and 2 (t = 0, 1): cosine from 0.4 to 0.1 over 2 steps: 0.4, 0.1 + 0.3 (1 + cos(pi/2)) / 2
    assert [h["chord/mu"] for h in hist] == pytest.approx([0.4, 0.25])
    assert all(math.isfinite(h["train/chord/sft_loss"]) for h in hist)


def test_relift_hardest_groups_by_hand():
    from mmgrpo.vlm.methods.relift import hardest_groups

    assert hardest_groups({3: 0.0, 1: 0.5, 2: 0.0}, 0.0) == [2, 3]
    assert hardest_groups({3: 0.0, 1: 0.25}, 0.25) == [1, 3]


def test_trainer_relift_sft_on_the_hardest_prompts(tmp_path, tiny_dirs, th):
    """Every answer of sample i0 is wrong (pass rate 0), the others pass: i0 enters the buffer; with sft_batch=1
    its ground truth joins the same step's update as one SFT row (advantage 0), with mu = sft_coef."""
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    def reward(texts, samples):
        out = th.text_reward(texts, samples)
        hard = torch.tensor([s["id"] == "i0" for s in samples])
        out["acc"] = torch.where(hard, torch.zeros_like(out["acc"]), 0.5 + out["acc"] / 2)
        out["total"] = out["acc"].clone()
        return out

    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=2", "reward.accuracy_key=acc",
                      "data.check_samples=0", "methods.relift.enabled=true", "methods.relift.sft_batch=1",
                      "methods.relift.sft_coef=0.5")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=reward)
    hist = tr.train()
    for h in hist:  # both samples every step (2 prompts per step)
        assert h["relift/hard_groups"] == 1 and h["relift/sft_rows"] == 1 and h["relift/buffer"] == 0
    rb = tr.state.batch
    off = rb.is_offpolicy
    assert int(off.sum()) == 1 and rb.texts[int(off.nonzero())] == "<answer>B</answer>"
    assert rb.samples[int(off.nonzero())]["id"] == "i0" and float(rb.advantages[off]) == 0.0
    assert int((rb.group_ids < 0).sum()) == 1
    assert all(math.isfinite(h["train/chord/sft_loss"]) and h["train/chord/sft_loss"] > 0 for h in hist)


def test_trainer_chord_trains_a_step_whose_advantages_are_all_zero(tmp_path, tiny_dirs, th):
    """Step 1: every reward equal, no advantage anywhere; plain GRPO skips such a step, CHORD's SFT term still trains
    it (VLMMethod.trains_without_advantages). Step 2 has a reward signal (a run with none at all still fails)."""
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    calls = []

    def flat_then_mixed(texts, samples):
        calls.append(1)
        out = th.text_reward(texts, samples)
        if len(calls) == 1:
            out["acc"] = torch.full_like(out["acc"], 0.5)
            out["total"] = out["acc"].clone()
        return out

    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=2", "reward.accuracy_key=acc",
                      "data.check_samples=0", "methods.chord.enabled=true")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=flat_then_mixed)
    before = {k: v.detach().clone() for k, v in tr.policy.model.named_parameters() if v.requires_grad}
    hist = tr.train(steps=1)
    assert hist[-1]["faults/zero_advantage_steps"] == 1 and hist[-1]["train/skipped_steps"] == 0
    assert bool((tr.state.batch.advantages == 0).all()) and hist[-1]["train/chord/sft_loss"] > 0
    after = dict(tr.policy.model.named_parameters())
    assert any(not torch.equal(before[k], after[k].detach()) for k in before)
    tr.train(steps=1)
