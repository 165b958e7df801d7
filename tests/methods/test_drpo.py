"""DRPO: the weights of correct, positive-advantage answers within their group (by hand: softmax of minus the length
z-score, mean 1), every correct answer keeps a positive advantage, and the trainer scales the advantages."""
import math

import pytest
import torch

from mmgrpo.vlm.methods.drpo import drpo_weights
from mmgrpo.vlm.train.trainer import GRPOTrainer


def test_weights_by_hand():
    # group 0: positives rows 0, 1 (lengths 2, 4: z = -1, +1); row 2 correct but A <= 0; row 3 wrong
    lengths = torch.tensor([2, 4, 9, 1, 5, 5])
    correct = torch.tensor([True, True, True, False, True, True])
    adv = torch.tensor([1.0, 0.5, -0.2, -1.3, 0.4, 0.4])
    gids = torch.tensor([0, 0, 0, 0, 1, 1])
    w = drpo_weights(lengths, correct, adv, gids)
    e = math.e
    assert w.tolist() == pytest.approx([2 * e / (e + 1 / e), 2 * (1 / e) / (e + 1 / e), 1, 1, 1, 1], rel=1e-6)
    assert float(w[:2].mean()) == pytest.approx(1.0)
    # a long correct answer keeps a positive advantage; temperature 2 flattens the weights
    assert bool((adv * w)[:2].gt(0).all())
    w2 = drpo_weights(lengths, correct, adv, gids, temperature=2.0)
    assert w2[0] == pytest.approx(2 * math.exp(0.5) / (math.exp(0.5) + math.exp(-0.5)), rel=1e-6)


def test_trainer_scales_the_positive_advantages(tmp_path, tiny_dirs, th):
    from mmgrpo.core import group_advantages

    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "reward.accuracy_key=acc",
                      "methods.drpo.enabled=true", "methods.drpo.threshold=0.5")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    hist = tr.train()
    rb = tr.state.batch
    base = group_advantages(rb.rewards["total"], rb.group_ids, eps=cfg.algo.adv_eps).advantages
    w = drpo_weights(rb.completion_mask.sum(1), rb.rewards["acc"] >= 0.5, base, rb.group_ids)
    torch.testing.assert_close(rb.advantages, base * w)
    assert hist[-1]["drpo/weight_max"] == pytest.approx(float(w.max()))
