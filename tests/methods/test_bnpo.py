"""BNPO through the trainer: the advantages are the Beta-normalised ones of the step's rewards (core function, whose
values are checked by hand in tests/core/test_advantage_variants.py); a reward outside the range stops the run
with the option's name; agg='bnpo' (TRL's name) is an error naming local_token_mean."""
import pytest
import torch

from mmgrpo.core.advantage_variants import bnpo_advantages
from mmgrpo.vlm.train.trainer import GRPOTrainer


def test_trainer_uses_beta_normalised_advantages(tmp_path, tiny_dirs, th):
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "methods.bnpo.enabled=true")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    hist = tr.train()
    rb = tr.state.batch
    want = bnpo_advantages(rb.rewards["total"], rb.group_ids)
    torch.testing.assert_close(rb.advantages, want.advantages.float())
    assert (hist[-1]["bnpo/alpha"], hist[-1]["bnpo/beta"]) == pytest.approx(want.beta_params)


def test_old_agg_name_points_to_the_new_one(tmp_path, tiny_dirs, th):
    with pytest.raises(ValueError, match="'bnpo' was renamed 'local_token_mean'.*methods.bnpo"):
        th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "algo.agg=bnpo")
    from mmgrpo.core.losses import aggregate_loss

    with pytest.raises(ValueError, match="local_token_mean"):
        aggregate_loss(torch.ones(1, 1), torch.ones(1, 1), "bnpo")
