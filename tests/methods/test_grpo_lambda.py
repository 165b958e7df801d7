"""GRPO-lambda: which groups get the length penalty (by hand), the penalty inside them (Kimi's, by hand), and the
trainer adding it to the total reward."""
import pytest
import torch

from mmgrpo.vlm.methods.grpo_lambda import grpo_lambda_penalty, select_groups
from mmgrpo.vlm.train.trainer import GRPOTrainer


def test_selection_by_threshold_and_top_fraction():
    ratios = {0: 0.75, 1: 0.25, 2: 0.5, 3: 1.0}
    assert select_groups(ratios, 0.5) == {0, 2, 3}
    assert select_groups(ratios, 0.8) == {3}
    assert select_groups(ratios, top_fraction=0.5) == {3, 0}
    assert select_groups({0: 0.5, 1: 0.5}, top_fraction=0.5) == {0}  # tie: the lower id


def test_penalty_only_in_high_ratio_groups_by_hand():
    # group 0: 3 of 4 correct (selected), lengths 2, 4, 6, 10; group 1: 1 of 4 correct (plain reward)
    lengths = torch.tensor([2, 4, 6, 10, 2, 4, 6, 10])
    correct = torch.tensor([True, True, True, False, True, False, False, False])
    gids = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    pen, chosen = grpo_lambda_penalty(lengths, correct, gids, ratio_threshold=0.5)
    assert chosen == {0}
    # Kimi: lambda = 0.5 - (len - 2) / 8 -> 0.5, 0.25, 0, -0.5 (wrong: min(0, -0.5))
    assert pen.tolist() == pytest.approx([0.5, 0.25, 0.0, -0.5, 0, 0, 0, 0])


def test_trainer_adds_the_switched_penalty(tmp_path, tiny_dirs, th):
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "reward.accuracy_key=acc",
                      "methods.grpo_lambda.enabled=true", "methods.grpo_lambda.threshold=0.5",
                      "methods.grpo_lambda.coef=0.5", "methods.grpo_lambda.ratio_threshold=0.25")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    hist = tr.train()
    rb = tr.state.batch
    acc = rb.rewards["acc"]
    want, chosen = grpo_lambda_penalty(rb.completion_mask.sum(1), acc >= 0.5, rb.group_ids, ratio_threshold=0.25)
    assert torch.equal(rb.rewards["length_lambda"], want)
    torch.testing.assert_close(rb.rewards["total"], acc + 0.5 * want)
    assert hist[-1]["grpo_lambda/penalised_groups"] == pytest.approx(len(chosen) / 2)
