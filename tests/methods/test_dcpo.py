"""DCPO through the trainer: the advantages are the smooth standardisation of each prompt's rewards (checked against
the core function fed the same rewards), the history survives a checkpoint, and the dynamic clip runs with two
updates. Formulas: tests/core/test_loss_variants.py, tests/core/test_advantage_variants.py."""
import math

import pytest
import torch

from mmgrpo.core.advantage_variants import PromptStats, dcpo_smooth_advantages
from mmgrpo.vlm.train.trainer import GRPOTrainer


def test_trainer_advantages_and_dynamic_clip(tmp_path, tiny_dirs, th):
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "algo.num_iterations=2",
                      "methods.dcpo.enabled=true")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    hist = tr.train()
    rb = tr.state.batch
    want = dcpo_smooth_advantages(rb.rewards["total"], rb.group_ids, ["i0"] * 4 + ["i1"] * 4, PromptStats(),
                                  eps=cfg.algo.adv_eps).advantages
    torch.testing.assert_close(rb.advantages, want)
    assert math.isfinite(hist[-1]["train/dcpo_high_mean"]) and hist[-1]["train/dcpo_high_mean"] > 1.0
    assert hist[-1]["dcpo/prompts_tracked"] == 2.0
    sd = tr.methods[0].state_dict()
    assert sd["table"]["i0"][:2] == [1.0, 4.0]  # one visit, four rewards
    # a resumed method continues the history
    m2 = type(tr.methods[0])(cfg, tr)
    m2.load_state_dict(sd)
    assert m2.stats.table == tr.methods[0].stats.table


def test_refuses_batch_scale(tmp_path, tiny_dirs, th):
    from mmgrpo.vlm.methods import check_config

    with pytest.raises(ValueError, match="adv_scale=group"):
        check_config(th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.dcpo.enabled=true",
                                 "algo.adv_scale=batch"))
