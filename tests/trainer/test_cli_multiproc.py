"""CLI: help without torch; a JSONL run end to end (the multi-process check is in test_multiproc.py)."""
import json
import subprocess
import sys

import pytest
import torch


def test_train_help_lists_every_option_without_torch():
    code = ("import sys\nfrom mmgrpo.vlm.cli import main\ntry:\n    main(['train', '--help'])\nexcept SystemExit:\n"
            "    pass\nprint('TORCH_LOADED', 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "TORCH_LOADED False" in out
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.utils.config import iter_fields

    names = [f[0] if isinstance(f, tuple) else getattr(f, "name", str(f)) for f in iter_fields(TrainConfig)]
    for key in ("methods.tempsamp_r1.mode", "methods.t_grpo.mu", "algo.loss_type", "methods.tw_grpo.alpha", "methods.selection.criterion",
                "run.resume_from", "data.on_missing_media", "rollout.mask_truncated_completions"):
        assert key in out, key
    assert len(names) > 60


def test_cli_train_from_jsonl_end_to_end(tmp_path, tiny_dirs, monkeypatch):
    import mmgrpo.vlm.train.trainer as trainer_mod
    from mmgrpo.vlm.cli import main
    from mmgrpo.vlm.models.tiny import synthetic_image

    real = trainer_mod.build_rewards

    def with_signal(*a, **k):  # the random tiny policy never answers: add a text-dependent term so groups differ
        fn, acc = real(*a, **k)  # (a run without any reward signal exits 4: tests/trainer/test_zero_advantage.py)

        def reward(texts, samples):
            out = fn(texts, samples)
            out["total"] = out["total"] + torch.tensor([float(sum(map(ord, t)) % 7) / 6.0 for t in texts])
            return out
        return reward, acc

    monkeypatch.setattr(trainer_mod, "build_rewards", with_signal)

    rows = []
    for i in range(3):
        synthetic_image(i, 56, 56).save(tmp_path / f"img{i}.png")
        rows.append({"id": f"s{i}", "task": "mcq", "query": "which colour?", "image": f"img{i}.png",
                     "options": ["red", "green", "blue"], "answer": "B"})
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "run"
    args = ["train", f"model.path={tiny_dirs('qwen2_5_vl')}", "model.dtype=float32",
            f"data.train_file={tmp_path / 'train.jsonl'}", "data.task=mcq", "reward.weights={mcq: 1.0, format: 0.5}",
            "data.image_min_pixels=3136", "data.image_max_pixels=3136", "rollout.group_size=2",
            "rollout.max_new_tokens=4", "run.max_steps=2", "run.prompts_per_device=2", f"run.output_dir={out}",
            "run.tensorboard=false", "methods.tempsamp_r1.enabled=false"]
    assert main(args) == 0
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and "reward/mcq/mean" in metrics[0]
    assert (out / "config.yaml").exists() and list((out / "checkpoints").glob("step-00000002"))
    # a missing image with on_missing_media=error fails before training, naming the file
    rows[1]["image"] = "gone.png"
    (tmp_path / "bad.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(Exception, match="gone.png"):
        main(args[:3] + [f"data.train_file={tmp_path / 'bad.jsonl'}", "data.on_missing_media=error",
                         f"run.output_dir={tmp_path / 'run2'}"] + args[4:-3] + ["run.tensorboard=false"])


def test_cli_stopped_run_exits_3_with_the_reason_and_checkpoint(tmp_path, tiny_dirs, monkeypatch, capsys):
    """A fault policy that stops the run (here: reward.on_failure=stop) ends `mmgrpo train` with exit code 3 and a
    one-line reason naming the checkpoint to resume from -- not a traceback, and not a lost run."""
    import mmgrpo.vlm.train.trainer as trainer_mod
    from mmgrpo.vlm.cli import main
    from mmgrpo.vlm.models.tiny import synthetic_image

    def judge_down(texts, samples):
        raise ConnectionError("judge unreachable")

    monkeypatch.setattr(trainer_mod, "build_rewards", lambda *a, **k: (judge_down, None))
    synthetic_image(0, 56, 56).save(tmp_path / "img0.png")
    row = {"id": "s0", "task": "mcq", "query": "which colour?", "image": "img0.png", "options": ["a", "b"],
           "answer": "B"}
    (tmp_path / "train.jsonl").write_text(json.dumps(row) + "\n")
    code = main(["train", f"model.path={tiny_dirs('qwen2_5_vl')}", "model.dtype=float32",
                 f"data.train_file={tmp_path / 'train.jsonl'}", "data.task=mcq", "data.image_min_pixels=3136",
                 "data.image_max_pixels=3136", "rollout.group_size=2", "rollout.max_new_tokens=2",
                 "run.prompts_per_device=1", f"run.output_dir={tmp_path / 'run'}", "run.tensorboard=false",
                 "reward.retries=0", "reward.on_failure=stop"])
    err = capsys.readouterr().err
    assert code == 3
    assert "training stopped at step 0: reward function failed 1 time(s); last error: ConnectionError" in err
    assert "step-00000000" in err and "resume with run.resume_from=auto" in err
