"""flow_grpo runs that would train nothing or trample another run fail loudly; the final export is atomic and
repaired by a resume; "resumed from ..." is printed (tiny SD3/FLUX pipelines on CPU)."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from flow_grpo.cli import main
from mmgrpo.engine.errors import NothingTrained, TrainingStopped
from mmgrpo.utils.export import EXPORT_MANIFEST, export_problem

from .conftest import make_trainer, train_overrides


@pytest.mark.parametrize("bad, msg", [("data.groups_per_epoch=0", "data.groups_per_epoch must be >= 1"),
                                      ("run.num_epochs=0", "run.num_epochs must be >= 1"),
                                      ("optim.lr=-1", "optim.lr must be a finite number >= 0"),
                                      ("optim.lr=nan", "optim.lr must be a finite number >= 0"),
                                      ("optim.max_consecutive_skips=0", "optim.max_consecutive_skips must be >= 1")])
def test_bad_numbers_are_refused_before_anything_loads(bad, msg, capsys):
    with pytest.raises(SystemExit) as ei:  # the pipeline folder does not exist: the config error comes first
        main(["train", "model.pipeline_dir=/nonexistent", bad])
    assert ei.value.code == 2 and msg in capsys.readouterr().err


def _dead_url() -> str:
    with socket.socket() as s:  # a port nobody listens on (bound, then released)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/score"


def test_dead_reward_server_run_exits_4_without_export(tmp_path, capsys):
    """reward.weights={remote: 1} with the server down: every epoch has no valid reward -> skipped steps; the run
    exits 4 with the reason and writes no lora_final (it used to exit 0 with valid_fraction=0 and a lora_final)."""
    out = tmp_path / "run"
    kw = json.dumps({"remote": {"url": _dead_url(), "retries": 0, "timeout": 2}})
    rc = main(["train", "model.tiny=sd3", "run.progress_bar=false", "run.num_epochs=2", "reward.retries=0",
               "reward.weights={remote: 1.0}", f"reward.kwargs={kw}",
               *train_overrides("sd3", "fast", out, **{"run.num_epochs": 2})])
    err = capsys.readouterr().err
    assert rc == 4, err
    assert "nothing was trained in 2 epoch(s)" in err and "no valid reward" in err and "2 skipped" in err
    assert not (out / "lora_final").exists() and not (out / ".lock").exists()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward/valid_fraction"] for r in rows] == [0.0, 0.0]
    assert [r["steps/skipped_total"] for r in rows] == [1.0, 2.0]


def test_dead_reward_server_with_on_failure_stop_checkpoints_and_exits_3(tmp_path, capsys):
    """reward.on_failure=stop: a failed call writes the state before the epoch and exits 3 (it used to end with a
    RewardCallFailed traceback and rc 1, no checkpoint); a resume redraws that epoch."""
    out = tmp_path / "run"
    kw = json.dumps({"remote": {"url": _dead_url(), "retries": 0, "timeout": 2}})
    rc = main(["train", "model.tiny=sd3", "run.progress_bar=false", "reward.retries=0", "reward.on_failure=stop",
               "reward.weights={remote: 1.0}", f"reward.kwargs={kw}",
               *train_overrides("sd3", "fast", out, **{"run.num_epochs": 2})])
    err = capsys.readouterr().err
    assert rc == 3, err
    assert "reward.on_failure=stop" in err and "Traceback" not in err
    ckpts = sorted((out / "checkpoints").glob("epoch-*"))
    assert len(ckpts) == 1 and str(ckpts[0]) in err
    from mmgrpo.utils.checkpoint import CheckpointManager

    st = CheckpointManager(out / "checkpoints").load(ckpts[0])
    assert st["trainer"]["epoch"] == 0 and st["trainer"]["global_step"] == 0  # the state before epoch 0
    assert not (out / "lora_final").exists() and not (out / ".lock").exists()


def test_no_valid_reward_feeds_max_consecutive_skips_and_nothing_is_exported(tmp_path):
    def failing(images, prompts, metadata):
        raise ConnectionError("reward server down")

    tr = make_trainer("flux", "fast", tmp_path, rewards={"block": failing}, **{"run.num_epochs": 3})
    with pytest.raises(NothingTrained, match="3 skipped"):
        tr.train()
    assert tr.state.counters["applied_steps"] == 0 and not (tmp_path / "lora_final").exists()
    tr.close()


    tr = make_trainer("flux", "fast", tmp_path / "k", rewards={"block": failing},
                      **{"run.num_epochs": 5, "optim.max_consecutive_skips": 2})
    with pytest.raises(TrainingStopped, match="training stopped at epoch 1: 2 consecutive optimizer steps were "
                                             "skipped \\(no optimizer step of this run was applied\\) \\(last cause: "
                                             "no valid reward.*the state was written to .*halted"):
        tr.train()
    tr.close()


@pytest.mark.parametrize("damage", ["truncate", "delete", "outdated"])
def test_final_export_is_atomic_and_repaired_by_resume(tmp_path, damage):
    tr = make_trainer("flux", "fast", tmp_path)
    tr.train()
    tr.close()
    final = tmp_path / "lora_final"
    assert export_problem(final, {"epoch": 1, "global_step": tr.state.global_step}) is None
    weights = next(p for p in final.iterdir() if p.suffix == ".safetensors")
    good = weights.read_bytes()
    want = {k: v.clone() for k, v in load_file(weights).items()}  # (load_file maps the file)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".tmp-", ".old-"))]
    if damage == "truncate":  # killed mid-write by an older version / bit rot
        weights.write_bytes(good[: len(good) // 2])
    elif damage == "delete":  # killed between the checkpoint and the export
        for p in final.iterdir():
            p.unlink()
        final.rmdir()
    else:  # an export of an earlier epoch (the run was killed after its last checkpoint, before exporting)
        m = json.loads((final / EXPORT_MANIFEST).read_text())
        (final / EXPORT_MANIFEST).write_text(json.dumps({**m, "epoch": 0}))
    tr = make_trainer("flux", "fast", tmp_path)  # resume_from=auto: no epochs left
    assert tr.train() == [] and tr.state.epoch == 1
    tr.close()
    assert export_problem(final, {"epoch": 1, "global_step": tr.state.global_step}) is None
    got = load_file(weights)  # the same tensors (same process, restored from the checkpoint); the header's
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)  # metadata order may vary


def test_a_new_run_cleans_folders_of_a_killed_export(tmp_path):
    """A kill during the export leaves .tmp-/.old-lora_final-<pid> (full copies of the weights): the next start
    removes them and keeps the export (issue 31 item 16)."""
    tr = make_trainer("flux", "fast", tmp_path)
    tr.train()
    tr.close()
    final = tmp_path / "lora_final"
    before = {p.name: p.read_bytes() for p in final.iterdir()}
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # a pid that is gone, as after a SIGKILL
    for kind in ("tmp", "old"):
        left = tmp_path / f".{kind}-lora_final-{proc.pid}"
        left.mkdir()
        (left / "adapter_model.safetensors").write_bytes(b"0" * 4096)
    make_trainer("flux", "fast", tmp_path).close()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".tmp-", ".old-"))]
    assert {p.name: p.read_bytes() for p in final.iterdir()} == before


def _cli_args(out, epochs):
    return ["train", "model.tiny=flux", *train_overrides("flux", "fast", out, **{
        "run.progress_bar": "false", "run.save_every": 1, "run.num_epochs": epochs})]


def _run_main(args, log=None):
    """Forked child: ``flow_grpo train`` (in-process ``main``), stderr to ``log``; exit status = its exit code."""
    if log is not None:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 2)
        sys.stderr = open(log, "a", buffering=1)
    sys.exit(main(args))


def test_two_real_runs_into_one_folder_then_stale_lock_and_resume(tmp_path):
    """Run A trains (a process of its own); run B into the same folder refuses with exit 5 naming A; A is
    SIGKILLed; run C (a fresh interpreter) takes over the stale lock with a warning, prints "resumed from ..." and
    exports.  A and B are forked from this process (no second import of torch / diffusers)."""
    import multiprocessing as mp

    import flow_grpo.models.tiny  # noqa: F401 - imported before the forks
    import flow_grpo.train.trainer  # noqa: F401

    out = tmp_path / "run"
    ctx = mp.get_context("fork")
    a = ctx.Process(target=_run_main, args=(_cli_args(out, 100000), str(tmp_path / "a.log")))
    a.start()
    try:
        t0 = time.time()
        while not (out / "checkpoints" / "epoch-00000001" / "manifest.json").exists():
            assert a.is_alive(), "run A ended early: " + (tmp_path / "a.log").read_text()[-2000:]
            assert time.time() - t0 < 120, "run A made no checkpoint"
            time.sleep(0.05)
        b = ctx.Process(target=_run_main, args=(_cli_args(out, 1), str(tmp_path / "b.log")))
        b.start()
        b.join(120)
        err = (tmp_path / "b.log").read_text()
        assert b.exitcode == 5, err
        assert f"in use by another run (pid {a.pid} on host {socket.gethostname()}" in err
        assert a.is_alive()  # A was not disturbed
    finally:
        os.kill(a.pid, signal.SIGKILL)
        a.join()
    assert json.loads((out / ".lock").read_text())["pid"] == a.pid  # left behind by the killed run
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    c = subprocess.run([sys.executable, "-m", "flow_grpo.cli", *_cli_args(out, 2)], env=env, capture_output=True,
                       text=True, timeout=180)
    assert c.returncode == 0, c.stderr
    assert "taking over a stale lock" in c.stderr and f"pid {a.pid}" in c.stderr
    assert "resumed from " + str(out / "checkpoints" / "epoch-") in c.stderr
    assert export_problem(out / "lora_final") is None and not (out / ".lock").exists()
