"""TempSamp-R1 shaping target (issue #23 item 4): the release shapes only the IoU and then adds the format term,
score = f(IoU) + 0.1 * format; the trainer must do the same by default (methods.tempsamp_r1.shape_reward=auto)."""
import math

import pytest
import torch

from mmgrpo.vlm.methods.tempsamp_r1 import shape_key
from mmgrpo.vlm.train import steps


def f_release(iou, tau=0.8):
    """The release's shaping, written out by hand: tau + 0.01 ln(r - tau + 1) above tau, else
    tau - (e^(tau - r) - 1) / (e - 1)."""
    if iou >= tau:
        return tau + 0.01 * math.log(iou - tau + 1.0)
    return tau - (math.exp(tau - iou) - 1.0) / (math.e - 1.0)


def _batch(tr, th):
    tr.state.stream = tr.new_stream()
    return steps.collect(tr, 0)


def _set_rewards(rb, iou, fmt, weights):
    iou, fmt = torch.tensor(iou), torch.tensor(fmt)
    rb.rewards = {"iou": iou, "format_loose": fmt, "total": weights["iou"] * iou + weights["format_loose"] * fmt}


def test_shapes_iou_then_adds_format_like_the_release(tmp_path, tiny_dirs, th):
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    w = {"iou": 1.0, "format_loose": 0.1}  # the release's loose check: an <answer> block with a span
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.tempsamp_r1.enabled=true",
                      "reward.weights={iou: 1.0, format_loose: 0.1}", "run.max_steps=1")
    tr = GRPOTrainer(cfg, samples=th.video_samples(2))
    rb = _batch(tr, th)
    gt = rb.is_offpolicy
    # the real ground-truth row: IoU 1, so its shaped reward is f(1) + 0.1 * its format score
    assert torch.all(rb.rewards["iou"][gt] == 1.0)
    want = [f_release(1.0) + 0.1 * float(x) for x in rb.rewards["format_loose"][gt]]
    assert rb.reward_used[gt].tolist() == pytest.approx(want, abs=1e-6)

    # hand-set rewards through the trainer's advantage path
    _set_rewards(rb, [1.0, 0.5, 0.0, 1.0] * 2, [1.0, 1.0, 0.0, 1.0] * 2, w)
    steps.advantages(tr, rb)
    used = rb.reward_used[:4].tolist()
    assert used[0] == pytest.approx(0.8 + 0.01 * math.log(1.2) + 0.1, abs=1e-6)  # 0.9018, the value
    assert used[0] == pytest.approx(0.901823, abs=1e-6)
    assert used[1] == pytest.approx(0.8 - (math.exp(0.3) - 1) / (math.e - 1) + 0.1, abs=1e-6)
    assert used[2] == pytest.approx(0.8 - (math.exp(0.8) - 1) / (math.e - 1), abs=1e-6)  # IoU 0 -> 0.0868
    # advantages are the group z-scores of exactly these shaped rewards
    g = torch.tensor(used, dtype=torch.float64)
    z = (g - g.mean()) / (g.std() + cfg.algo.adv_eps)
    torch.testing.assert_close(rb.advantages[:4].double(), z, atol=1e-5, rtol=0)

    # the previous behaviour, one switch away: shape the weighted total (1.1 -> 0.8 + 0.01 ln 1.3 = 0.8026)
    tr.cfg.methods.tempsamp_r1.shape_reward = "total"
    ts = next(m for m in tr.methods if m.name == "tempsamp_r1")
    ts.key = shape_key(tr.cfg.methods.tempsamp_r1, tr.cfg.reward.weights, tr.acc_key)
    steps.advantages(tr, rb)
    assert rb.reward_used[0].item() == pytest.approx(0.8 + 0.01 * math.log(1.3), abs=1e-6)


def test_iou_only_weights_unchanged_bitwise(tmp_path, tiny_dirs, th):
    """The demo trains with reward.weights={iou: 1.0}: shaping the IoU and shaping the total are the same numbers,
    bit for bit (the demo's results do not move)."""
    from mmgrpo.core import tempsamp_shape
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.tempsamp_r1.enabled=true", "reward.weights={iou: 1.0}",
                      "run.max_steps=1")
    tr = GRPOTrainer(cfg, samples=th.video_samples(2))
    assert next(m for m in tr.methods if m.name == "tempsamp_r1").key == "iou"
    rb = _batch(tr, th)
    iou = torch.rand(8, generator=torch.Generator().manual_seed(0))
    rb.rewards = {"iou": iou, "total": 1.0 * iou}
    steps.advantages(tr, rb)
    assert torch.equal(rb.reward_used, tempsamp_shape(iou))


def test_bad_shape_reward_is_refused(tmp_path, tiny_dirs, th):
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.tempsamp_r1.enabled=true", "methods.tempsamp_r1.shape_reward=box_iou",
                      "reward.weights={iou: 1.0}", "run.max_steps=1")
    with pytest.raises(ValueError, match="shape_reward='box_iou'"):
        GRPOTrainer(cfg, samples=th.video_samples(2))


def test_alpha2_must_be_positive(tmp_path, tiny_dirs, th):
    with pytest.raises(ValueError, match="alpha2 must be > 0"):
        th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.tempsamp_r1.enabled=true", "methods.tempsamp_r1.alpha2=0")


def test_bad_shape_reward_is_refused_even_when_off_and_before_the_model_loads(tmp_path, th):
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    cfg = th.make_cfg(tmp_path, tmp_path / "no-model", "methods.tempsamp_r1.shape_reward=box_iou", "reward.weights={iou: 1.0}")
    with pytest.raises(ValueError, match="shape_reward='box_iou'"):
        GRPOTrainer(cfg, samples=th.video_samples(2))
