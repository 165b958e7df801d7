"""GRPO-D scheduled KL through the trainer: with the schedule at 0 on step 0 the update equals a run without KL (the
method's term cancels algo.kl_coef exactly); the weight is logged. Schedule values by hand:
tests/core/test_loss_variants.py."""
import pytest
import torch

from mmgrpo.vlm.train.trainer import GRPOTrainer


def _run(path, d, th, *over):
    tr = GRPOTrainer(th.make_cfg(path, d, "run.max_steps=2", *over), samples=th.image_samples(2),
                     reward_fn=th.text_reward)
    return tr, tr.train()


def test_weight_zero_during_warmup_equals_no_kl(tmp_path, tiny_dirs, th):
    # two steps: on the second the policy has left the reference, so a KL term changes the update (shown by the
    # constant-KL run); a schedule held at 0 (warm-up) cancels algo.kl_coef and gives the no-KL update
    d = tiny_dirs("qwen2_5_vl")
    plain, _ = _run(tmp_path / "a", d, th)
    sched, hist = _run(tmp_path / "b", d, th, "algo.kl_coef=0.5", "methods.kl_schedule.enabled=true",
                       "methods.kl_schedule.start=0", "methods.kl_schedule.warmup=5")
    const, hist_c = _run(tmp_path / "c", d, th, "algo.kl_coef=0.5")
    assert [h["kl_schedule/beta"] for h in hist] == [0.0, 0.0]
    assert hist_c[-1]["train/kl"] > 0
    w0, w, wc = th.trainable(plain), th.trainable(sched), th.trainable(const)
    for k in w0:
        torch.testing.assert_close(w[k], w0[k], rtol=1e-5, atol=1e-6)
    assert any(not torch.allclose(wc[k], w0[k], rtol=1e-5, atol=1e-6) for k in w0)


def test_needs_a_reference(tmp_path, tiny_dirs, th):
    from mmgrpo.vlm.methods import check_config

    with pytest.raises(ValueError, match="kl_coef"):
        check_config(th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.kl_schedule.enabled=true"))
