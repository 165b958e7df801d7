"""NGRPO (mmgrpo.vlm.methods.ngrpo): calibrated advantages against values computed by hand, and the method in a
tiny trainer (enabled by config, all-wrong groups train, the asymmetric clip bounds reach the loss)."""
import math

import pytest
import torch

from mmgrpo.engine.errors import NothingTrained
from mmgrpo.vlm.methods.ngrpo import ngrpo_advantages


def test_papers_example_one_correct_of_eight_by_hand():
    # 8 binary answers, 1 correct, + the virtual 1: x = (1, 1, 0 x 7), n + k = 9
    mu = 2 / 9
    sd = math.sqrt((2 * (1 - mu) ** 2 + 7 * mu**2) / 8)  # unbiased, as torch.std
    out = ngrpo_advantages(torch.tensor([1.0] + [0.0] * 7), torch.zeros(8, dtype=torch.long), eps=0.0)
    assert out.advantages[0].item() == pytest.approx((1 - mu) / sd, abs=1e-6)
    assert out.advantages[1:].tolist() == pytest.approx([-mu / sd] * 7, abs=1e-6)
    assert (1 - mu) / sd == pytest.approx(1.7638, abs=1e-4) and -mu / sd == pytest.approx(-0.5040, abs=1e-4)
    assert not out.zero_std_mask.any()


def test_all_wrong_keeps_a_signal_all_right_is_zero_and_groups_are_separate():
    r = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.0, 9.0])
    gid = torch.tensor([7, 7, 7, 7, 3, 3, 3, 3, 5, 5, 5])
    valid = torch.ones(11, dtype=torch.bool)
    valid[10] = False  # a failed reward (value ignored, even above max_reward)
    out = ngrpo_advantages(r, gid, eps=1e-4, valid=valid)
    # all wrong (4 x 0 + one 1): mean 0.2, var (4 * 0.04 + 0.64) / 4 = 0.2
    assert out.advantages[:4].tolist() == pytest.approx([-0.2 / (math.sqrt(0.2) + 1e-4)] * 4, abs=1e-6)
    # all right: the virtual sample changes nothing, advantage exactly 0 and flagged
    assert out.advantages[4:8].tolist() == [0.0] * 4 and out.zero_std_mask[4:8].all()
    # (0.5, 0, 1): mean 0.5, var (0 + 0.25 + 0.25) / 2 = 0.25
    assert out.advantages[8:10].tolist() == pytest.approx([0.0, -0.5 / (0.5 + 1e-4)], abs=1e-6)
    assert out.advantages[10].item() == 0.0 and not out.zero_std_mask[10]
    assert out.zero_std_fraction == pytest.approx(1 / 3) and out.num_groups == 3
    # two virtual samples: (0, 0, 1, 1) -> mean 0.5, var 1/3
    two = ngrpo_advantages(torch.zeros(2), torch.zeros(2, dtype=torch.long), num_virtual=2, eps=0.0)
    assert two.advantages.tolist() == pytest.approx([-0.5 / math.sqrt(1 / 3)] * 2, abs=1e-6)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="exceeds methods.ngrpo.max_reward=1"):
        ngrpo_advantages(torch.tensor([1.1, 0.0]), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="adv_scale must be 'group'"):
        ngrpo_advantages(torch.zeros(2), torch.zeros(2, dtype=torch.long), scale="none")


def test_tiny_trainer_all_wrong_groups_train_with_asymmetric_clip(tmp_path, tiny_dirs, th, monkeypatch):
    import mmgrpo.vlm.train.trainer as T

    def all_wrong(texts, samples):
        z = torch.zeros(len(texts))
        return {"acc": z, "total": z.clone(), "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}

    import mmgrpo.core.losses as L

    clips = []
    real = L.clipped_surrogate
    monkeypatch.setattr(L, "clipped_surrogate", lambda *a: (clips.append((a[3], a[4])), real(*a))[1])
    runs = {}
    for name, extra in (("grpo", []), ("ngrpo", ["methods.ngrpo.enabled=true"])):
        cfg = th.make_cfg(tmp_path / name, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", *extra)
        tr = T.GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=all_wrong)
        assert [m.name for m in tr.methods] == ([] if name == "grpo" else ["ngrpo"])
        w0 = th.trainable(tr)
        if name == "grpo":  # every advantage 0: no reward signal, the run trains nothing and says so (exit 4)
            with pytest.raises(NothingTrained, match="no reward signal"):
                tr.train()
        else:
            tr.train()
        runs[name] = (tr.state.batch.advantages.clone(), any(not torch.equal(v, w0[k])
                                                            for k, v in th.trainable(tr).items()))
    assert torch.equal(runs["grpo"][0], torch.zeros(8)) and not runs["grpo"][1]  # GRPO: nothing to learn
    want = -0.2 / (math.sqrt(0.2) + 1e-4)  # G = 4 zeros + one virtual 1 (algo.adv_eps = 1e-4)
    assert runs["ngrpo"][0].tolist() == pytest.approx([want] * 8, abs=1e-6) and runs["ngrpo"][1]
    # GRPO's zero-advantage step is skipped before its loss: every loss call is NGRPO's, with its asymmetric clip
    assert clips and all(c == (0.16, 0.24) for c in clips)


def test_config_refuses_a_second_estimator_before_loading_the_model(tmp_path, th):
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    cfg = th.make_cfg(tmp_path, tmp_path / "no-model", "methods.ngrpo.enabled=true", "methods.tempsamp_r1.enabled=true",
                      "methods.tempsamp_r1.mode=anchor")
    with pytest.raises(ValueError, match="methods.tempsamp_r1.mode=anchor"):
        GRPOTrainer(cfg, samples=th.image_samples(2))
    with pytest.raises(ValueError, match="num_virtual must be >= 1"):
        th.make_cfg(tmp_path, tmp_path / "no-model", "methods.ngrpo.enabled=true", "methods.ngrpo.num_virtual=0")


def test_float32_weighted_maximum_is_the_maximum_not_above_it():
    """IoU 1 + 0.1 x format 1 summed in float32 is 1.10000002 > 1.1: NGRPO must take it as the maximum (issue #41's
    demo reward stopped every NGRPO run at its first perfect answer), and still refuse a reward really above it."""
    top = torch.tensor(1.0, dtype=torch.float32) + torch.tensor(0.1, dtype=torch.float32)
    assert float(top) > 1.1  # the rounding this guards against
    gid = torch.tensor([0, 0, 1, 1])
    out = ngrpo_advantages(torch.stack([top, top, top, torch.tensor(0.6)]), gid, max_reward=1.1)
    assert out.zero_std_mask.tolist() == [True, True, False, False]  # all at the maximum: nothing to learn
    # group 1 = {1.1, 0.6} + virtual 1.1: mean 0.9333..., sample std sqrt(((1/6)^2 * 2 + (1/3)^2) / 2) = 0.288675
    mu, sd = (1.1 + 0.6 + 1.1) / 3, 0.28867513459481287
    assert out.advantages[2].item() == pytest.approx((1.1 - mu) / (sd + 1e-4), rel=1e-5)
    assert out.advantages[3].item() == pytest.approx((0.6 - mu) / (sd + 1e-4), rel=1e-5)
    with pytest.raises(ValueError, match="exceeds methods.ngrpo.max_reward=1.1"):
        ngrpo_advantages(torch.tensor([1.2, 0.5]), torch.tensor([0, 0]), max_reward=1.1)
