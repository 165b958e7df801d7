"""Balanced Aggregation through the trainer: the step's loss equals the formula over the whole batch, whatever the
micro-batch split (global counts). Formula by hand: tests/core/test_loss_variants.py."""
import pytest
import torch

from mmgrpo.vlm.train.trainer import GRPOTrainer


@pytest.mark.parametrize("mb", [8, 4])
def test_loss_is_the_whole_batch_formula(tmp_path, tiny_dirs, th, mb):
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "methods.balanced_agg.enabled=true",
                      f"run.micro_batch_size={mb}")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    hist = tr.train()
    rb = tr.state.batch
    adv = rb.advantages
    n = float((rb.loss_mask.sum(1) > 0).sum())
    assert hist[-1]["balanced_agg/pos_seq_share"] == pytest.approx(float((adv > 0).sum()) / n)
    assert hist[-1]["balanced_agg/neg_seq_share"] == pytest.approx(float((adv < 0).sum()) / n)
    # on policy the per-token loss is -A (ratio 1): L = N+/N * (-sum_{+} A_i |o_i| / T+) + N-/N * (...)
    L = rb.loss_mask.sum(1).double()
    a = adv.double()
    pos, neg = a > 0, a < 0
    want = (pos.sum() / n) * (-(a * L)[pos].sum() / L[pos].sum()) + (neg.sum() / n) * (-(a * L)[neg].sum() / L[neg].sum())
    assert hist[-1]["train/loss"] == pytest.approx(float(want), abs=1e-5)


def test_refuses_local_token_mean(tmp_path, tiny_dirs, th):
    from mmgrpo.vlm.methods import check_config

    with pytest.raises(ValueError, match="local_token_mean"):
        check_config(th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.balanced_agg.enabled=true",
                                 "algo.agg=local_token_mean"))
