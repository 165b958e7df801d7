"""CISPO / SAPO / DHPO through the trainer: on policy (one update per rollout) their update is GRPO's (the ratio is
1, every gradient -A grad log pi), checked against a GRPO run of the same seed; with two updates their own terms
run (metrics logged). Formulas: tests/core/test_loss_variants.py."""
import math

import pytest
import torch

from mmgrpo.vlm.train.trainer import GRPOTrainer


@pytest.fixture(scope="module")
def grpo_weights(tmp_path_factory, tiny_dirs, th):
    cfg = th.make_cfg(tmp_path_factory.mktemp("grpo"), tiny_dirs("qwen2_5_vl"), "run.max_steps=1")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    tr.train()
    return th.trainable(tr)


@pytest.mark.parametrize("name", ["cispo", "sapo", "dhpo"])
def test_on_policy_update_equals_grpo(tmp_path, tiny_dirs, th, grpo_weights, name):
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", f"methods.{name}.enabled=true")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    assert [m.name for m in tr.methods] == [name]
    tr.train()
    w = th.trainable(tr)
    for k, v in grpo_weights.items():
        torch.testing.assert_close(w[k], v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,metric", [("cispo", "train/cispo_capped_frac"), ("sapo", "train/sapo_gate_mean"),
                                         ("dhpo", "train/clip_frac")])
def test_two_updates_run_the_variant(tmp_path, tiny_dirs, th, name, metric):
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "algo.num_iterations=2",
                      f"methods.{name}.enabled=true")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    before = th.trainable(tr)
    hist = tr.train()
    assert math.isfinite(hist[-1][metric]) and hist[-1]["train/skipped_steps"] == 0
    assert any(not torch.equal(before[k], v) for k, v in th.trainable(tr).items())


def test_refuses_reg_grpo_and_a_second_loss(tmp_path, tiny_dirs, th):
    from mmgrpo.vlm.methods import check_config

    with pytest.raises(ValueError, match="loss_type=clip"):
        check_config(th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.cispo.enabled=true",
                                 "algo.loss_type=reg"))
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.cispo.enabled=true", "methods.sapo.enabled=true")
    with pytest.raises(ValueError, match="both provide the policy loss"):
        GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
