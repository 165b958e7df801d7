"""Curricula and replay (issue #38 item 3): pass-rate filter, Prompt Replay, R1V2 selective sample buffer, the IoU
curriculum -- values worked out by hand, then each in a tiny trainer."""
import pytest
import torch

from mmgrpo.vlm.methods.iou_curriculum import curriculum_reward, should_advance
from mmgrpo.vlm.methods.pass_rate_filter import group_pass_rates, window_keep
from mmgrpo.vlm.methods.prompt_replay import ReplayBuffer
from mmgrpo.vlm.methods.sample_buffer import draw_weighted, group_priorities


def test_pass_rates_and_window_by_hand():
    acc = torch.tensor([0.9, 0.2, 0.6, 0.0, 0.1, 0.7, 0.8, float("nan")])
    gids = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2])
    rows = torch.tensor([True] * 7 + [False])  # row 7 (no reward) takes no part
    rates = group_pass_rates(acc, gids, rows, 0.5)
    # group 0: 0.9, 0.6 pass of 3 -> 2/3; group 1: none -> 0; group 2: 0.7, 0.8 of 2 -> 1
    assert rates == pytest.approx({0: 2 / 3, 1: 0.0, 2: 1.0})
    assert window_keep(gids, rates, 0.01, 0.99).tolist() == [0, 1, 2]
    assert window_keep(gids, rates, 0.0, 1.0).tolist() == list(range(8))
    assert window_keep(gids, rates, 0.7, 1.0).tolist() == [5, 6, 7]


def test_iou_curriculum_reward_and_rule_by_hand():
    iou = torch.tensor([0.2, 0.5, 0.8, float("nan")], dtype=torch.float64)
    assert curriculum_reward(iou, 0.5)[:3].tolist() == [0.0, 1.0, 1.0]
    assert curriculum_reward(iou, 0.5, "gated")[:3].tolist() == [0.0, 0.5, 0.8]
    assert torch.isnan(curriculum_reward(iou, 0.5)[3])
    assert not should_advance([0.9, 0.9], 3, 0.6)  # window not full
    assert should_advance([0.5, 0.6, 0.7, 0.8], 4, 0.6)  # mean 0.65 >= 0.6; late half 0.75 >= early 0.55
    assert not should_advance([0.5, 0.6, 0.6, 0.6], 4, 0.6)  # mean 0.575 < 0.6
    assert not should_advance([0.9, 0.9, 0.6, 0.6], 4, 0.6)  # mean 0.75 but getting worse (0.6 < 0.9)


def test_replay_buffer_priority_cooldown_and_reuse_by_hand():
    b = ReplayBuffer(capacity=3, cooldown=1, max_reuse=2)
    b.update("a", 0.5, "A", 0.01, 0.99)   # priority 0
    b.update("b", 0.25, "B", 0.01, 0.99)  # 0.25
    b.update("c", 1.0, "C", 0.01, 0.99)   # outside the window: not stored
    b.update("d", 0.9, "D", 0.01, 0.99)   # 0.4
    b.update("e", 0.6, "E", 0.01, 0.99)   # 0.1 -> capacity 3: the worst (d, 0.4) leaves
    assert list(b.entries) == ["a", "b", "e"]
    assert b.take(2, step=5, exclude=set()) == ["A", "E"]
    assert b.take(2, step=6, exclude=set()) == ["B"]  # a, e cool down (6 - 5 = 1, not > 1)
    assert b.take(3, step=7, exclude={"e"}) == ["A"]  # a's second use: it leaves
    assert "a" not in b.entries and b.entries["e"][3] == 1
    b.update("b", 0.0, "B", 0.01, 0.99)  # b became too hard: out
    assert "b" not in b.entries


def test_sample_buffer_priorities_and_draw():
    adv = torch.tensor([1.0, -1.0, 0.0, 0.0, 0.5, -0.5, 0.0])
    gids = torch.tensor([0, 0, 1, 1, 2, 2, 2])
    rows = torch.ones(7, dtype=torch.bool)
    assert group_priorities(adv, gids, rows) == pytest.approx({0: 1.0, 2: 1.0 / 3})
    assert draw_weighted([1.0, 2.0], 5, 0) == [0, 1]
    # proportional to priority: over many seeds the heavier index is drawn first about 2/3 of the time
    first = [draw_weighted([1.0, 2.0], 1, s)[0] for s in range(600)]
    assert abs(sum(first) / 600 - 2 / 3) < 0.06


def _train(tmp_path, tiny_dirs, th, *over, steps=2, samples=4):
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), f"run.max_steps={steps}", "reward.accuracy_key=acc",
                      "data.check_samples=0", *over)
    tr = GRPOTrainer(cfg, samples=th.image_samples(samples), reward_fn=th.text_reward)
    return tr, tr.train()


def test_trainer_pass_rate_filter_keeps_only_the_window(tmp_path, tiny_dirs, th):
    tr, hist = _train(tmp_path, tiny_dirs, th, "methods.pass_rate_filter.enabled=true",
                      "methods.pass_rate_filter.low=0.2", "methods.pass_rate_filter.high=0.8",
                      "methods.pass_rate_filter.correct_threshold=0.5", "methods.pass_rate_filter.max_rounds=1",
                      steps=1)
    rb = tr.state.batch
    rates = group_pass_rates(rb.rewards["acc"], rb.group_ids, ~rb.is_offpolicy, 0.5)
    assert all(0.2 <= p <= 0.8 for p in rates.values())
    assert 0.0 <= hist[-1]["pass_rate_filter/kept_frac"] <= 1.0


def test_trainer_iou_curriculum_thresholds_the_accuracy(tmp_path, tiny_dirs, th):
    tr, hist = _train(tmp_path, tiny_dirs, th, "methods.iou_curriculum.enabled=true",
                      "methods.iou_curriculum.thresholds=[0.3,0.6]", "methods.iou_curriculum.window=1",
                      "methods.iou_curriculum.advance_at=0.0", steps=2)
    rb = tr.state.batch
    # step 2 runs at level 1 (window 1, advance_at 0: the rule holds after step 1): theta = 0.6
    want = (rb.rewards["acc"] >= 0.6).float()
    assert torch.equal(rb.rewards["iou_curriculum"], want)
    torch.testing.assert_close(rb.rewards["total"], want)  # total = acc + 1 * (1[acc >= 0.6] - acc)
    assert [h["iou_curriculum/threshold"] for h in hist] == [0.3, 0.6]
    assert tr.methods[0].state_dict()["level"] == 1


def test_trainer_prompt_replay(tmp_path, tiny_dirs, th):
    tr, hist = _train(tmp_path, tiny_dirs, th, "methods.prompt_replay.enabled=true",
                      "methods.prompt_replay.fraction=0.5", "methods.prompt_replay.cooldown=0", steps=3)
    # step 1 has an empty buffer; steps 2, 3 replay one of their two prompts (text_reward gives mixed groups, so
    # every trained prompt is of medium difficulty and enters the buffer)
    assert [h["prompt_replay/replayed"] for h in hist] == [0.0, 1.0, 1.0]
    assert hist[0]["prompt_replay/buffer"] == 2.0


def test_trainer_sample_buffer_replays_stored_groups(tmp_path, tiny_dirs, th):
    """Step 1 has mixed rewards (its groups are stored); from step 2 every reward is equal (zero advantages), so
    each of step 2's two zero-advantage groups brings back one stored group, with its texts and advantages."""
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    calls = []

    def reward(texts, samples):
        calls.append(1)
        out = th.text_reward(texts, samples)
        if len(calls) > 1:  # after step 1: all equal
            out["acc"] = torch.full_like(out["acc"], 0.5)
            out["total"] = out["acc"].clone()
        return out

    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=2", "reward.accuracy_key=acc",
                      "data.check_samples=0", "methods.sample_buffer.enabled=true",
                      "methods.sample_buffer.max_share=1.0")
    tr = GRPOTrainer(cfg, samples=th.image_samples(4), reward_fn=reward)
    h1 = tr.train(steps=1)
    b1 = tr.state.batch
    h2 = tr.train(steps=1)
    b2 = tr.state.batch
    assert h1[-1]["sample_buffer/replayed"] == 0 and h2[-1]["sample_buffer/replayed"] == 2
    assert h2[-1]["sample_buffer/zero_groups"] == 2
    rep = b2.group_ids < 0
    assert int(rep.sum()) == b1.n and bool(b2.is_offpolicy[rep].all()) and not bool(b2.is_offpolicy[~rep].any())
    # the replayed rows are step 1's (as a set: the draw order is by priority)
    got = sorted(zip([b2.texts[i] for i in rep.nonzero().flatten().tolist()], b2.advantages[rep].tolist()))
    want = sorted(zip(b1.texts, b1.advantages.tolist()))
    assert got == want
    assert bool((b2.advantages[~rep] == 0).all())
