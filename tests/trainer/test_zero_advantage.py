"""A VLM run whose every group has equal rewards (no reward signal: e.g. 100 % parse failures) trains nothing: its
steps are skipped steps, and the run ends with exit code 4 (or 3 after run.max_consecutive_skips) naming the parse
rate and the reward spread, instead of exit 0 with weights identical to the base (issue 32 item 2)."""
import pytest
import torch

from mmgrpo.engine.errors import NothingTrained, TrainingStopped
from mmgrpo.utils import exit_codes
from mmgrpo.vlm.train.trainer import GRPOTrainer


def _unparseable(tmp_path, tiny_dirs, th, *extra):
    # the tiny random policy never writes <think>...</think><answer>...</answer>: every reward 0
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "data.prompt_mode=think",
                      "reward.weights={iou: 1.0, format: 0.5}", "algo.kl_coef=0", *extra)
    return GRPOTrainer(cfg, samples=th.video_samples(2))


def test_all_parse_failures_exit_4_with_the_reason(tmp_path, tiny_dirs, th, capsys):
    tr = _unparseable(tmp_path, tiny_dirs, th)
    before = th.trainable(tr)
    rc = exit_codes.run_training("mmgrpo train", tr.train)
    err = capsys.readouterr().err
    assert rc == exit_codes.NOTHING_TRAINED == 4, err
    assert "nothing was trained" in err and "no reward signal" in err
    assert "parse failures 8 = 100 %" in err and "std 0 over the step" in err
    assert tr.state.counters["skipped_steps"] == 2 and tr.state.counters["zero_advantage_steps"] == 2
    assert all(torch.equal(p, before[n]) for n, p in th.trainable(tr).items())
    assert not (tmp_path / "run" / "checkpoints").exists() or not list((tmp_path / "run" / "checkpoints").iterdir())


def test_zero_advantage_steps_feed_max_consecutive_skips(tmp_path, tiny_dirs, th):
    tr = _unparseable(tmp_path, tiny_dirs, th, "run.max_steps=3", "run.max_consecutive_skips=2")
    with pytest.raises(TrainingStopped, match="2 consecutive optimizer steps were skipped .*no reward signal"):
        tr.train()


def test_with_a_kl_term_steps_are_taken_but_a_run_without_any_signal_still_fails(tmp_path, tiny_dirs, th):
    tr = _unparseable(tmp_path, tiny_dirs, th, "algo.kl_coef=0.04")
    with pytest.raises(NothingTrained, match="none of the run's 2 step\\(s\\) had a reward signal"):
        tr.train()
    assert tr.state.counters["skipped_steps"] == 0 and tr.state.counters["zero_advantage_steps"] == 2


def test_a_step_with_some_signal_trains(tmp_path, tiny_dirs, th):
    """The guard does not fire when some group has unequal rewards (text_reward varies within a group)."""
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    tr.train()
    assert tr.state.counters["zero_advantage_steps"] == 0 and tr.state.counters["skipped_steps"] == 0


def test_allow_no_reward_signal_takes_the_zero_gradient_steps_and_ends_0(tmp_path, tiny_dirs, th):
    """The switch back to the releases' behaviour (TRL takes zero-gradient steps), for pipeline rehearsals."""
    tr = _unparseable(tmp_path, tiny_dirs, th, "run.allow_no_reward_signal=true")
    assert exit_codes.run_training("mmgrpo train", tr.train) == 0
    assert tr.state.counters["skipped_steps"] == 0 and tr.state.counters["zero_advantage_steps"] == 2
    assert list((tmp_path / "run" / "checkpoints").glob("step-00000002"))
