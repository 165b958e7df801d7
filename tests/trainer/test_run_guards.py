"""Runs that would train nothing, or trample another run, fail loudly (VLM trainer, tiny Qwen2.5-VL on CPU):
configs checked before loading (exit 2), steps without a valid group are skipped steps and a run of only those
ends with exit 4 and no final checkpoint, one run per output folder (exit 5), and a damaged final checkpoint is
rewritten by a resume."""
import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from mmgrpo.vlm.cli import main
from mmgrpo.engine.errors import NothingTrained, OutputDirLocked, TrainingStopped
from mmgrpo.vlm.train.trainer import GRPOTrainer
from mmgrpo.utils.checkpoint import CheckpointManager, verify_checkpoint


def _image_run(tmp_path, model_dir, *extra):
    """CLI args of a 2-step run on 3 image samples stored as files (like a user's data folder)."""
    from mmgrpo.vlm.models.tiny import synthetic_image

    rows = []
    for i in range(3):
        synthetic_image(i, 56, 56).save(tmp_path / f"img{i}.png")
        rows.append({"id": f"s{i}", "task": "mcq", "query": "which colour?", "image": f"img{i}.png",
                     "options": ["red", "green", "blue"], "answer": "B"})
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return ["train", f"model.path={model_dir}", "model.dtype=float32", f"data.train_file={tmp_path / 'train.jsonl'}",
            "data.task=mcq", "reward.weights={mcq: 1.0, format: 0.5}", "data.image_min_pixels=3136",
            "data.image_max_pixels=3136", "rollout.group_size=2", "rollout.max_new_tokens=4", "run.max_steps=2",
            "run.prompts_per_device=2", f"run.output_dir={tmp_path / 'run'}", "run.tensorboard=false",
            "run.progress_bar=false", *extra]


@pytest.mark.parametrize("bad, msg", [("run.max_steps=-1", "run.max_steps must be >= 1"),
                                      ("run.max_steps=0", "run.max_steps must be >= 1"),
                                      ("optim.lr=-1", "optim.lr must be a finite number >= 0"),
                                      ("optim.lr=nan", "optim.lr must be a finite number >= 0"),
                                      ("optim.betas=[0.9, 1.5]", "optim.betas")])
def test_bad_numbers_are_refused_before_anything_loads(bad, msg, capsys):
    # model.path does not exist: the config error must come first (nothing is loaded)
    with pytest.raises(SystemExit) as ei:
        main(["train", "model.path=/nonexistent", bad])
    assert ei.value.code == 2 and msg in capsys.readouterr().err


def test_all_media_missing_run_exits_4_without_final_checkpoint(tmp_path, tiny_dirs, capsys):
    """data.media_root=/nonexistent: the media check at load time drops every sample; the run ends with exit 4
    before the model loads, a message saying why, and no checkpoint (it used to write step-00000002 and exit 0 with
    data/groups=0)."""
    rc = main(_image_run(tmp_path, tiny_dirs("qwen2_5_vl"), "data.media_root=/nonexistent"))
    err = capsys.readouterr().err
    assert rc == 4, err
    assert "no sample left after the media check" in err and "missing_media: 3" in err and "Traceback" not in err
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert not (tmp_path / "run" / ".lock").exists()  # released


def _failing(texts, samples):
    raise ConnectionError("reward server down")


def test_failed_rewards_are_skipped_steps_and_stop_after_k(tmp_path, tiny_dirs, th):
    """Every reward call fails (on_failure=drop): each step has no valid group -> skipped (weights, AdamW and the
    LR schedule untouched) and counted towards run.max_consecutive_skips."""
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=5", "run.max_consecutive_skips=2",
                      "reward.retries=0", "reward.retry_backoff=0")
    tr = GRPOTrainer(cfg, samples=th.video_samples(2), reward_fn=_failing)
    w0 = th.trainable(tr)
    with pytest.raises(TrainingStopped, match=r"2 consecutive optimizer steps were skipped \(no optimizer step of "
                                              r"this run was applied\) \(last cause: no valid group"):
        tr.train()
    assert tr.state.counters["skipped_steps"] == 2 and tr.state.counters["reward_failed_calls"] == 2
    assert all(torch.equal(v, w0[k]) for k, v in th.trainable(tr).items())
    assert tr.optimizer.state_dict()["state"] == {} and tr.scheduler.last_epoch == 0


def test_only_skipped_steps_raise_nothing_trained(tmp_path, tiny_dirs, th):
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_consecutive_skips=0", "reward.retries=0",
                      "reward.retry_backoff=0")
    tr = GRPOTrainer(cfg, samples=th.video_samples(2), reward_fn=_failing)
    with pytest.raises(NothingTrained, match="all 2 optimizer step.*faults/reward_failed_calls=2"):
        tr.train()
    assert not (tmp_path / "run" / "checkpoints").exists()


HOLDER = """
import sys, time
from mmgrpo.utils.runlock import acquire_run_lock
lock = acquire_run_lock(sys.argv[1])
print("locked", flush=True)
time.sleep(600)
"""


def test_a_second_run_into_a_locked_folder_refuses_before_loading(tmp_path, capsys, tiny_dirs, monkeypatch):
    """Another (real) process holds run.output_dir: the trainer refuses before loading data or the model (the data
    file does not even exist), naming the holder; the CLI exits 5."""
    import mmgrpo.vlm.train.setup as setup

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the lock was checked")

    monkeypatch.setattr(setup, "load_policy", no_load)
    model = tiny_dirs("qwen2_5_vl")  # a folder the preflight accepts: the lock is what refuses
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "locked"
        rc = main(["train", f"model.path={model}", "data.train_file=/nonexistent.jsonl", f"run.output_dir={out}"])
        err = capsys.readouterr().err
        assert rc == 5 and f"in use by another run (pid {holder.pid} on host" in err
        from mmgrpo.vlm.config import TrainConfig
        from mmgrpo.utils.config import load_config

        cfg = load_config(TrainConfig, None, [f"model.path={model}", f"run.output_dir={out}"])
        with pytest.raises(OutputDirLocked, match=f"pid {holder.pid}"):
            GRPOTrainer(cfg, samples=[{"id": "x"}])  # the trainer itself refuses (also without the CLI)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


def test_damaged_final_checkpoint_is_rewritten_by_resume(tmp_path, tiny_dirs, th):
    """The VLM trainer's final weights are its last checkpoint (written atomically, verified by its manifest): a
    damaged one is skipped on resume, the last step is trained again and the final checkpoint rewritten."""
    args = ("run.save_every=1", "run.resume_from=auto", "run.keep_last=2")
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), *args)
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    tr.train()
    want = th.trainable(tr)
    final = tmp_path / "run" / "checkpoints" / "step-00000002"
    policy = final / "policy.pt"
    policy.write_bytes(policy.read_bytes()[:100])  # truncated
    del tr
    tr = GRPOTrainer(th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), *args), samples=th.image_samples(2),
                     reward_fn=th.text_reward)
    assert len(tr.train()) == 1 and tr.state.step == 2
    verify_checkpoint(final)
    st = CheckpointManager(tmp_path / "run" / "checkpoints").load(final)
    assert st["trainer"]["step"] == 2
    got = th.trainable(tr)
    assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in want)  # same run, replayed (same process)
