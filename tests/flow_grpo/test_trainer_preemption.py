"""SIGTERM / SIGINT (cluster preemption, Ctrl-C) for ``flow_grpo train``: checkpoint, exit code 6, exact resume; a
second signal aborts at once without damaging the last complete checkpoint.

Real processes, real signals: the CLI (``flow_grpo.cli.main`` with the usual tiny-run overrides) runs in children
forked from this process (the tiny FLUX pipeline and the ``block`` reward are injected where the CLI builds the
trainer). Each child signals itself at a chosen point of epoch 2, or this process signals it mid-checkpoint-write:

* A: SIGTERM while epoch 2 draws its samples -> the epoch is discarded, checkpoint 1, exit 4;
* B: SIGINT (Ctrl-C) during epoch 2's first update -> the epoch is finished, checkpoint 2, exit 4, no traceback;
* C: SIGTERM during epoch 2's update, then a second SIGTERM from this process while checkpoint 2 is written -> the
  child dies by SIGTERM at once; the torn write is a temp dir and checkpoint 1 still verifies.

Every run is resumed here and must end bitwise equal to an uninterrupted run (LoRA weights, EMA, optimizer, LR
schedule, step counter), as in test_trainer_resume.
"""
import os
import signal
import sys
import time
from pathlib import Path

import torch

from mmgrpo.engine.errors import TrainingStopped
from mmgrpo.utils.checkpoint import CheckpointManager
from mmgrpo.utils.exit_codes import INTERRUPTED as EXIT_INTERRUPTED

from .conftest import block_reward, make_adapter, make_trainer, train_overrides

EXTRA = {"run.num_epochs": 3, "run.save_every": 0, "run.keep_last": 2, "optim.lr_schedule": "cosine",
         "optim.warmup_steps": 1, "ema.update_every": 1, "optim.kl_coef": 0.01, "run.resume_from": "auto"}


def _fork_cli(out, stderr_path, hook, repeat_window=None, **extra):
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 2)
        sys.stderr = os.fdopen(2, "w", buffering=1)  # pytest's capture object otherwise
        import flow_grpo.train.trainer as ft
        import mmgrpo.utils.signals as sg
        from flow_grpo.cli import main

        if repeat_window is not None:
            sg.REPEAT_WINDOW = repeat_window
        real = ft.FlowGRPOTrainer
        ft.FlowGRPOTrainer = lambda cfg: hook(real(cfg, adapter=make_adapter("flux", lora=False),
                                                   reward_fn={"block": block_reward}))
        code = main(["train"] + train_overrides("flux", "fast", out, **{**EXTRA, **extra}))
    except BaseException:  # noqa: BLE001 - report and leave without running pytest's teardown
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _signal_in_epoch2(where, sig):
    """Hook: the child sends itself ``sig`` in epoch 2, while sampling or after its first optimizer update."""

    def hook(tr):
        if where == "sampling":
            import flow_grpo.train.steps as fs

            orig = fs.sample_trajectories

            def sampled(*a, **k):
                out = orig(*a, **k)
                if tr.state.epoch == 1:
                    os.kill(os.getpid(), sig)
                return out

            fs.sample_trajectories = sampled
        else:
            import flow_grpo.train.steps as fs

            orig = fs.update

            def update(*a, **k):
                out = orig(*a, **k)
                if tr.state.epoch == 1 and tr.state.global_step == 1:  # global_step is incremented after the update returns
                    os.kill(os.getpid(), sig)
                return out

            fs.update = update
        return tr

    return hook


def _wait(pid, timeout=240.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            return st
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    raise AssertionError("timed out waiting for the training process")


def _state(tr):
    return ({n: p.detach().clone() for n, p in tr.named_params}, [s.clone() for s in tr.ema.shadow],
            tr.optimizer.state_dict(), tr.lr_scheduler.state_dict(), tr.state.global_step)


def _assert_bitwise(got, want):
    assert all(torch.equal(got[0][n], want[0][n]) for n in want[0])
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))
    sa, sb = got[2], want[2]
    assert sa["param_groups"] == sb["param_groups"]
    for k in sb["state"]:
        for name, v in sb["state"][k].items():
            assert torch.equal(sa["state"][k][name], v), (k, name)
    assert got[3] == want[3] and got[4] == want[4]


def test_sigterm_sigint_checkpoint_exit_4_and_exact_resume_second_signal_aborts(tmp_path):
    make_trainer("flux", "fast", tmp_path / "warm", **EXTRA).close()  # lazy imports happen before the forks
    err = {n: tmp_path / f"{n}.err" for n in "abc"}
    marker = tmp_path / "in_save.txt"

    def ckpts(name):
        return [s for s, _ in CheckpointManager(tmp_path / name / "checkpoints", prefix="epoch").list_checkpoints()]

    def hang_in_save(tr):  # C: checkpoint 2's write stops half-way (after optimizer.pt) until killed
        real_save = torch.save

        def save(obj, f, *a, **k):
            real_save(obj, f, *a, **k)
            p = Path(str(f))
            if p.name == "optimizer.pt" and p.parent.name.startswith(".tmp-epoch-00000002-"):
                marker.write_text(str(p.parent))
                time.sleep(600)

        torch.save = save
        return _signal_in_epoch2("update", signal.SIGTERM)(tr)

    pids = {"a": _fork_cli(tmp_path / "a", err["a"], _signal_in_epoch2("sampling", signal.SIGTERM)),
            "b": _fork_cli(tmp_path / "b", err["b"], _signal_in_epoch2("update", signal.SIGINT)),
            "c": _fork_cli(tmp_path / "c", err["c"], hang_in_save, repeat_window=0.0, **{"run.save_every": 1})}
    try:
        ref = make_trainer("flux", "fast", tmp_path / "ref", **EXTRA)  # meanwhile: the uninterrupted run
        ref.train()
        want = _state(ref)
        status = {n: _wait(pids[n]) for n in "ab"}
        t0 = time.time()
        while not marker.exists():
            assert time.time() - t0 < 240 and os.waitpid(pids["c"], os.WNOHANG) == (0, 0), err["c"].read_text()
            time.sleep(0.02)
        os.kill(pids["c"], signal.SIGTERM)  # the second signal, mid-write
        status["c"] = _wait(pids["c"])
    finally:
        for p in pids.values():
            try:
                os.kill(p, signal.SIGKILL)
                os.waitpid(p, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
    text = {n: err[n].read_text() for n in "abc"}
    assert os.WIFEXITED(status["a"]) and os.WEXITSTATUS(status["a"]) == EXIT_INTERRUPTED, text["a"]
    assert ("flow_grpo train: SIGTERM received: stopped at epoch 1 (its samples were discarded before any update); "
            f"checkpoint written: {tmp_path / 'a' / 'checkpoints' / 'epoch-00000001'}") in text["a"]
    assert ckpts("a") == [1] and "Traceback" not in text["a"]
    assert os.WIFEXITED(status["b"]) and os.WEXITSTATUS(status["b"]) == EXIT_INTERRUPTED, text["b"]
    assert "SIGINT received: stopped at epoch 2; checkpoint written:" in text["b"] and "Traceback" not in text["b"]
    assert ckpts("b") == [2] and not (tmp_path / "b" / "lora_final").exists()  # no final export of a cut run
    assert os.WIFSIGNALED(status["c"]) and os.WTERMSIG(status["c"]) == signal.SIGTERM, text["c"]
    assert "SIGTERM received again: aborting now" in text["c"]
    torn = Path(marker.read_text())
    assert torn.is_dir() and not (torn / "manifest.json").exists() and ckpts("c") == [1]
    for name, start in (("a", 1), ("b", 2), ("c", 1)):
        tr = make_trainer("flux", "fast", tmp_path / name, **EXTRA)
        hist = tr.train()
        assert [h["epoch"] for h in hist] == list(range(start, 3)), name
        _assert_bitwise(_state(tr), want)
        tr.close()
    assert not torn.exists()  # the dead writer's temp dir was removed


# ------------------------------------------------------------------------------------------------ two processes
def _mp_worker(rank, port, root):
    """One of two gloo processes: an uninterrupted run, then a run whose rank 1 alone gets SIGTERM during epoch 2's
    update, then its resume; the resumed state is compared with the uninterrupted one in this same process."""
    import json

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")  # OMP: libgomp is not fork-safe
    torch.set_num_threads(1)
    from accelerate.state import AcceleratorState, GradientState

    from mmgrpo.engine.errors import TrainingInterrupted

    AcceleratorState._reset_state(reset_partial_state=True)  # the parent's single-process state
    GradientState._reset_state()
    extra = {**EXTRA, "run.device": "cpu"}
    ref = make_trainer("flux", "fast", root / "ref", **extra)
    ref.train()
    want = _state(ref)
    tr = make_trainer("flux", "fast", root / "run", **extra)
    if rank == 1:
        _signal_in_epoch2("update", signal.SIGTERM)(tr)
    res = {"rank": rank}
    try:
        tr.train()
    except TrainingInterrupted as e:
        res.update(signame=e.signame, where=e.where, checkpoint=e.checkpoint, epoch=tr.state.epoch)
    again = make_trainer("flux", "fast", root / "run", **extra)
    res["resumed_epochs"] = [h["epoch"] for h in again.train()]
    try:
        _assert_bitwise(_state(again), want)
        res["bitwise"] = True
    except AssertionError:
        res["bitwise"] = False
    (root / f"result{rank}.json").write_text(json.dumps(res))


def test_two_processes_agree_to_stop_at_the_same_epoch_and_resume_exactly(tmp_path):
    import json
    import socket

    make_trainer("flux", "fast", tmp_path / "warm", **EXTRA).close()  # lazy imports happen before the forks
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pids = []
    for r in range(2):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _mp_worker(r, port, tmp_path)
                code = 0
            except BaseException:  # noqa: BLE001
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        pids.append(pid)
    try:
        status = [_wait(p, timeout=400) for p in pids]
    finally:
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
                os.waitpid(p, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
    assert all(os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0 for st in status), status
    r0, r1 = (json.loads((tmp_path / f"result{r}.json").read_text()) for r in range(2))
    ck = tmp_path / "run" / "checkpoints" / "epoch-00000002"
    # rank 1 got the signal, rank 0 learned it through the reduction: both finished epoch 2 and stopped there
    assert r1["signame"] == "SIGTERM" and r0["signame"] == "a signal on another process"
    assert r0["epoch"] == r1["epoch"] == 2 and r0["where"] == r1["where"] == "epoch 2"
    assert r0["checkpoint"] == r1["checkpoint"] == str(ck)  # broadcast: every process names it
    assert r0["resumed_epochs"] == r1["resumed_epochs"] == [2]
    assert r0["bitwise"] and r1["bitwise"]


def test_ctrl_c_before_the_loop_exits_130_and_halted_exits_3(monkeypatch, capsys):
    import flow_grpo.train.trainer as ft
    from flow_grpo.cli import main

    def loading(cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr(ft, "train_from_config", loading)
    assert main(["train", "model.tiny=flux"]) == 130
    assert capsys.readouterr().err.strip() == ("flow_grpo train: interrupted before training started (no checkpoint "
                                               "written)")

    def halted(cfg):
        raise TrainingStopped("flow_grpo: stopping after 3 consecutive skipped optimizer steps", "/x/halted")

    monkeypatch.setattr(ft, "train_from_config", halted)
    assert main(["train", "model.tiny=flux"]) == 3
    assert "flow_grpo train: flow_grpo: stopping after 3 consecutive" in capsys.readouterr().err
