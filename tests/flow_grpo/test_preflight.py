"""flow_grpo train refuses reward settings that would only fail after the pipeline loaded (a remote reward without
its url, PickScore without its two folders, a weight path that does not exist) with exit code 2 and the setting
named, before loading anything (issue 32 item 6); one device setting, run.device, as in mmgrpo train (item 12)."""
import pytest

from flow_grpo.cli import main
from flow_grpo.rewards import check_reward_settings

from .conftest import train_overrides


@pytest.fixture
def no_load(monkeypatch):
    import flow_grpo.build as build

    def boom(*a, **k):
        raise AssertionError("the pipeline was loaded before the settings were checked")

    monkeypatch.setattr(build, "load_adapter", boom)


@pytest.mark.parametrize("weights, kwargs, msg", [
    ("{remote: 1.0}", "{}", "reward.kwargs.remote.url is required by reward 'remote'"),
    ("{pickscore: 1.0}", "{}", "reward.kwargs.pickscore.model_path is required by reward 'pickscore'"),
    ("{pickscore: 1.0}", "{pickscore: {model_path: /no/PickScore_v1, processor_path: /no/CLIP-H}}",
     "reward.kwargs.pickscore.model_path=/no/PickScore_v1: no such file or folder"),
    ("{remote: 1.0}", "{remote: {url: 'http://127.0.0.1:1/score', image_fromat: png}}",
     "reward.kwargs.remote.image_fromat: reward 'remote' takes no argument 'image_fromat' (did you mean "
     "'image_format'?)"),
])
def test_reward_settings_are_checked_before_loading(tmp_path, capsys, no_load, weights, kwargs, msg):
    rc = main(["train", "model.tiny=sd3", f"reward.weights={weights}", f"reward.kwargs={kwargs}",
               *train_overrides("sd3", "fast", tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert msg in err and "Traceback" not in err


def test_a_missing_pipeline_folder_exits_2(tmp_path, capsys, no_load):
    rc = main(["train", f"model.pipeline_dir={tmp_path / 'nope'}", "reward.weights={brightness: 1.0}",
               *train_overrides("sd3", "fast", tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and "model.pipeline_dir=" in err and "no model_index.json" in err


def test_check_passes_good_settings_and_skips_injected_rewards(tmp_path):
    from flow_grpo.rewards.tiny import save_tiny_pickscore

    kw = save_tiny_pickscore(str(tmp_path / "pick"))
    assert check_reward_settings({"pickscore": 1.0, "brightness": 1.0}, {"pickscore": kw}) == []
    assert check_reward_settings({"remote": 1.0}, {}, skip=["remote"]) == []
    assert check_reward_settings({"my.module:factory": 1.0}, {}) == []  # plugins: checked when built


def test_run_device_is_the_one_device_setting(tmp_path):
    from flow_grpo.config import load_train_config

    assert load_train_config(None, ["run.device=cpu"]).run.device == "cpu"
    with pytest.raises(ValueError, match="run.cpu"):  # the old name is gone, not aliased
        load_train_config(None, ["run.cpu=true"])
    with pytest.raises(ValueError, match="run.device"):
        load_train_config(None, ["run.device=gpu"])


def test_sigterm_while_sampling_stops_at_the_next_chunk_and_checkpoints(tmp_path, monkeypatch):
    """A long rollout no longer has to finish before a signal is seen (issue 32 item 7): sampling stops after the
    chunk in progress, the epoch is discarded and a checkpoint written."""
    import os
    import signal

    from flow_grpo.train import steps
    from mmgrpo.engine.errors import TrainingInterrupted

    from .conftest import make_trainer

    tr = make_trainer("flux", "fast", tmp_path, **{"sample.batch_size": 1, "run.num_epochs": 2})  # 4 chunks
    calls = []
    hook = steps.sampling_progress

    def progress(run):
        inner = hook(run)

        def on_chunk(done, total):
            calls.append((done, total))
            if done == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            return inner(done, total)
        return on_chunk

    monkeypatch.setattr(steps, "sampling_progress", progress)
    with pytest.raises(TrainingInterrupted, match="SIGTERM received: stopped at epoch 0 \\(its samples were discarded"):
        tr.train()
    tr.close()
    assert calls == [(1, 4)] and tr.state.epoch == 0
    assert list((tmp_path / "checkpoints").glob("epoch-*"))
