"""A flow run whose every group has equal rewards trains nothing: its optimizer steps are skipped steps and the run
exits 4 (3 after optim.max_consecutive_skips) naming the reward spread (issue 32 item 2; with
optim.drop_zero_adv=false it used to take zero-gradient AdamW steps and exit 0)."""
import pytest
import torch

from mmgrpo.engine.errors import NothingTrained, TrainingStopped
from mmgrpo.utils import exit_codes

from .conftest import make_trainer


def const_reward(images, prompts, metadata):
    return {"const": torch.full((len(images),), 0.25)}


@pytest.mark.parametrize("drop_zero_adv", ["true", "false"])
def test_constant_reward_run_exits_4_without_export(tmp_path, capsys, drop_zero_adv):
    tr = make_trainer("flux", "fast", tmp_path, rewards={"const": const_reward},
                      **{"run.num_epochs": 2, "optim.drop_zero_adv": drop_zero_adv, "optim.kl_coef": 0.0})
    before = {n: p.detach().clone() for n, p in tr.named_params}
    rc = exit_codes.run_training("flow_grpo train", tr.train)
    tr.close()
    err = capsys.readouterr().err
    assert rc == exit_codes.NOTHING_TRAINED == 4, err
    assert "nothing was trained in 2 epoch(s)" in err and "no reward signal" in err and "std 0 over the epoch" in err
    assert tr.state.counters["applied_steps"] == 0 and tr.state.counters["zero_advantage_epochs"] == 2
    assert all(torch.equal(p, before[n]) for n, p in tr.named_params)
    assert not (tmp_path / "lora_final").exists()


def test_zero_advantage_epochs_feed_max_consecutive_skips(tmp_path):
    tr = make_trainer("flux", "fast", tmp_path, rewards={"const": const_reward},
                      **{"run.num_epochs": 4, "optim.max_consecutive_skips": 2, "optim.kl_coef": 0.0,
                         "optim.drop_zero_adv": "false"})
    with pytest.raises(TrainingStopped, match="2 consecutive optimizer steps were skipped .*no reward signal"):
        tr.train()
    tr.close()


def test_with_a_kl_term_steps_are_taken_but_the_run_still_fails(tmp_path):
    tr = make_trainer("flux", "fast", tmp_path, rewards={"const": const_reward},
                      **{"run.num_epochs": 2, "optim.kl_coef": 0.01, "optim.drop_zero_adv": "false"})
    with pytest.raises(NothingTrained, match="none of the run's 2 epoch\\(s\\) had a reward signal"):
        tr.train()
    tr.close()
    assert tr.state.counters["applied_steps"] > 0 and not (tmp_path / "lora_final").exists()


def test_allow_no_reward_signal_takes_the_zero_gradient_steps_and_ends_0(tmp_path):
    tr = make_trainer("flux", "fast", tmp_path, rewards={"const": const_reward},
                      **{"run.num_epochs": 2, "optim.kl_coef": 0.0, "optim.drop_zero_adv": "false",
                         "run.allow_no_reward_signal": "true"})
    assert exit_codes.run_training("flow_grpo train", tr.train) == 0
    tr.close()
    assert tr.state.counters["applied_steps"] == 2 and tr.state.counters["zero_advantage_epochs"] == 2
    assert (tmp_path / "lora_final").is_dir()
