"""Kimi k1.5 length penalty (mmgrpo.vlm.methods.kimi_length): values worked out by hand from the paper's formula, and
the method in a tiny trainer (enabled by config, the penalty of each row recomputed from the batch and in the total
reward)."""
import pytest
import torch

from mmgrpo.vlm.methods.kimi_length import length_penalty


def test_one_group_by_hand():
    # lengths 2, 4, 6: min 2, max 6 -> lambda = 0.5 - (l - 2) / 4 = 0.5, 0.0, -0.5
    # correct, wrong, correct -> 0.5, min(0, 0.0) = 0, -0.5
    out = length_penalty(torch.tensor([2, 4, 6]), torch.tensor([True, False, True]), torch.tensor([0, 0, 0]))
    assert out.tolist() == [0.5, 0.0, -0.5]
    # a short wrong answer gains nothing: lambda 0.5 -> min(0, 0.5) = 0; a long wrong one loses 0.5
    out = length_penalty(torch.tensor([2, 6]), torch.tensor([False, False]), torch.tensor([0, 0]))
    assert out.tolist() == [0.0, -0.5]


def test_groups_are_separate_equal_lengths_give_zero_and_excluded_rows_do_not_count():
    lengths = torch.tensor([3, 3, 3, 1, 5, 9])
    correct = torch.tensor([True, True, False, True, True, True])
    gids = torch.tensor([4, 4, 4, 7, 7, 7])
    rows = torch.tensor([True, True, True, True, True, False])  # row 5 (length 9) takes no part
    out = length_penalty(lengths, correct, gids, rows)
    # group 4: all length 3 -> 0; group 7 without row 5: min 1, max 5 -> lambda 0.5, -0.5; row 5 -> 0
    assert out.tolist() == [0.0, 0.0, 0.0, 0.5, -0.5, 0.0]


def test_tiny_trainer_adds_the_penalty_to_the_reward(tmp_path, tiny_dirs, th):
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "reward.accuracy_key=acc",
                      "methods.kimi_length.enabled=true", "methods.kimi_length.coef=0.5",
                      "methods.kimi_length.threshold=0.5")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    assert [m.name for m in tr.methods] == ["kimi_length"]
    hist = tr.train()
    rb = tr.state.batch
    acc = rb.rewards["acc"]
    want = length_penalty(rb.completion_mask.sum(1), acc >= 0.5, rb.group_ids)
    assert torch.equal(rb.rewards["length_kimi"], want)
    torch.testing.assert_close(rb.rewards["total"], acc + 0.5 * want)
    assert hist[-1]["kimi_length/penalty_mean"] == pytest.approx(float(want.mean()), abs=1e-6)
