"""Settings that only failed after the model loaded are refused before it, with exit code 2 and the setting named;
the planner's estimate is checked against the device's memory; the startup line; SIGTERM ends a rollout early
(issue 32 items 6, 7, 9)."""
import json
import os
import signal

import pytest

from mmgrpo.engine.errors import ConfigError, TrainingInterrupted
from mmgrpo.utils import memory_plan as mp
from mmgrpo.vlm.memory_plan import vlm_config
from mmgrpo.vlm.train.trainer import GRPOTrainer


def _cli(tmp_path, model_dir, *extra):
    from mmgrpo.vlm.cli import main
    from mmgrpo.vlm.models.tiny import synthetic_image

    synthetic_image(0, 56, 56).save(tmp_path / "img0.png")
    (tmp_path / "train.jsonl").write_text(json.dumps({"id": "s0", "task": "mcq", "query": "which?",
                                                      "image": "img0.png", "options": ["a", "b"], "answer": "A"}))
    return main(["train", f"model.path={model_dir}", f"data.train_file={tmp_path / 'train.jsonl'}", "data.task=mcq",
                 "reward.weights={mcq: 1.0}", f"run.output_dir={tmp_path / 'run'}", "run.tensorboard=false", *extra])


def test_flash_attention_without_the_package_exits_2_naming_the_setting(tmp_path, tiny_dirs, capsys, monkeypatch):
    import mmgrpo.vlm.train.setup as setup

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the setting was checked")

    monkeypatch.setattr(setup, "load_policy", no_load)
    rc = _cli(tmp_path, tiny_dirs("qwen2_5_vl"), "model.attn_implementation=flash_attention_2")
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "model.attn_implementation=flash_attention_2 needs the flash-attn package" in err
    assert "Traceback" not in err


def test_a_missing_model_folder_exits_2(tmp_path, capsys):
    rc = _cli(tmp_path, tmp_path / "nope")
    err = capsys.readouterr().err
    assert rc == 2 and "model.path=" in err and "no config.json" in err and "Traceback" not in err


def _truncated_7b(tmp_path, layers=1):
    """A real-width, depth-truncated Qwen2.5-VL-7B folder (config only: the planner needs nothing else)."""
    d = tmp_path / f"qwen2.5-vl-7b_{layers}"
    d.mkdir()
    vlm_config(mp.MODELS["qwen2.5-vl-7b"], layers).to_json_file(str(d / "config.json"))
    return d


def test_a_run_that_cannot_fit_is_refused_before_loading(tmp_path, th, monkeypatch):
    import mmgrpo.utils.preflight as pf

    monkeypatch.setattr(pf, "device_memory", lambda device: (2 * mp.GiB, "available host memory (MemAvailable)"))
    model = _truncated_7b(tmp_path)
    cfg = th.make_cfg(tmp_path, model, "model.lora.enabled=false", "model.dtype=bfloat16")
    with pytest.raises(ConfigError, match=r"predicts \d+\.\d GiB per process .*qwen2.5-vl-7b at 1 layers.*full "
                                          r"fine-tune.*more than the 2.0 GiB.*run.memory_check=warn"):
        GRPOTrainer(cfg, samples=th.image_samples(1))
    # warn: logged, and the run goes on to load the model (which here has no weights)
    cfg = th.make_cfg(tmp_path, model, "model.lora.enabled=false", "run.memory_check=warn")
    with pytest.raises(Exception) as ei:
        GRPOTrainer(cfg, samples=th.image_samples(1))
    assert not isinstance(ei.value, ConfigError)


def test_sigterm_during_a_rollout_ends_decoding_and_checkpoints(tmp_path, tiny_dirs, th):
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "rollout.max_new_tokens=32", "run.max_steps=2")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    calls = []
    watch = tr.backend.step_hook

    def hook(new_tokens, rows_left):
        calls.append(new_tokens)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # preemption arrives while the first step decodes
        return watch(new_tokens, rows_left)

    tr.backend.step_hook = hook
    with pytest.raises(TrainingInterrupted, match="SIGTERM received: stopped at step 0"):
        tr.train()
    assert len(calls) == 1  # decoding stopped at once (it would run up to 32 steps per chunk)
    assert tr.state.step == 0 and list((tmp_path / "run" / "checkpoints").glob("step-*"))


def test_the_startup_line_names_device_distribution_dtypes_and_attention(tmp_path, tiny_dirs, th, caplog):
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "model.lora.enabled=true")
    with caplog.at_level("INFO", logger="mmgrpo.preflight"):
        GRPOTrainer(cfg, samples=th.image_samples(1), reward_fn=th.text_reward)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("mmgrpo train: device"))
    for part in ("device cpu", "1 process", "FSDP off", "weights float32", "autocast no", "attention sdpa", "LoRA"):
        assert part in line, (part, line)
