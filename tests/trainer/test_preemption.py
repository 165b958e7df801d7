"""SIGTERM / SIGINT (cluster preemption, Ctrl-C): checkpoint, exit code 6, exact resume; a second signal aborts.

Real processes receive real signals: ``mmgrpo train`` (the CLI's ``main``) runs in children forked from this process
(no second ~15 s import of torch + transformers), on the tiny Qwen2.5-VL with injected samples and reward. Each child
signals itself at a chosen point of step 2 (deterministic), or the parent signals it while it writes a checkpoint:

* A: SIGTERM while step 2 collects its rollouts -> the step is discarded, checkpoint of step 1, exit 4;
* B: SIGINT (Ctrl-C) after step 2's optimizer update -> the step is finished, checkpoint of step 2, exit 4, and no
  traceback;
* C: SIGTERM after step 2's update, then a second SIGTERM (from this process) while the step-2 checkpoint is being
  written -> the child dies at once by SIGTERM, the torn write is a temp dir, step 1 still verifies.

Each run is then resumed here (``run.resume_from=auto``) and must end bitwise equal to an uninterrupted run
computed in this process (same process and memory layout; CPU, one thread).
"""
import os
import signal
import sys
import time
from pathlib import Path

import torch

from mmgrpo.utils.checkpoint import CheckpointManager
from mmgrpo.utils.exit_codes import INTERRUPTED as EXIT_INTERRUPTED

STEPS = 3
ARGS = ["model.freeze_vision=true", f"run.max_steps={STEPS}", "optim.lr=0.01", "optim.weight_decay=0.01",
        "optim.max_grad_norm=1.0", "run.resume_from=auto", "data.task=mcq", "rollout.max_new_tokens=5"]


def _fork_cli(th, cfg, stderr_path, hook, repeat_window=None):
    """``mmgrpo train`` (cli.main) in a forked child whose exit status is main's return value; ``hook(trainer)``
    patches the trainer the CLI builds (the config and the injected samples / reward replace the CLI's parsing)."""
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
        import mmgrpo.vlm.train.trainer as tm
        import mmgrpo.utils.config as uc
        import mmgrpo.utils.signals as sg
        from mmgrpo.vlm.cli import main

        if repeat_window is not None:
            sg.REPEAT_WINDOW = repeat_window
        uc.parse_config_cli = lambda *a, **k: cfg
        real = tm.GRPOTrainer
        tm.GRPOTrainer = lambda c: hook(real(c, samples=th.image_samples(3), reward_fn=th.text_reward))
        code = main(["train"])
    except BaseException:  # noqa: BLE001 - report and leave without running pytest's teardown
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def _signal_in_step2(method, sig):
    """Hook: the child sends itself ``sig`` right after the recipe's ``method`` (collect / optimize, functions of
    :mod:`mmgrpo.vlm.train.steps` the loop calls) of this trainer's step 2 returns."""

    def hook(tr):
        import mmgrpo.vlm.train.trainer as tm

        orig = getattr(tm, method)

        def wrapped(run, *a, **k):
            out = orig(run, *a, **k)
            if run is tr and tr.state.step == 1:
                os.kill(os.getpid(), sig)
            return out

        setattr(tm, method, wrapped)
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
    return tr.policy.trainable_state_dict(), tr.optimizer.state_dict()


def _assert_bitwise(a, b):
    (pa, oa), (pb, ob) = a, b
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)
    assert oa["state"].keys() == ob["state"].keys()
    for i in oa["state"]:
        for k, v in oa["state"][i].items():
            assert torch.equal(v, ob["state"][i][k]), (i, k)
    assert oa["param_groups"] == ob["param_groups"]


def test_sigterm_sigint_checkpoint_exit_4_and_exact_resume_second_signal_aborts(tmp_path, tiny_dirs, th):
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    model = tiny_dirs("qwen2_5_vl")

    def cfg(name, *extra):
        return th.make_cfg(tmp_path / name, model, *ARGS, *extra)

    def ckpts(name):
        return [s for s, _ in CheckpointManager(tmp_path / name / "run" / "checkpoints").list_checkpoints()]

    err = {n: tmp_path / f"{n}.err" for n in "abc"}
    marker = tmp_path / "in_save.txt"

    def hang_in_save(tr):  # C: the step-2 checkpoint write stops half-way (after optimizer.pt) until killed
        save = torch.save

        def save_then_hang(obj, f, *a, **k):
            save(obj, f, *a, **k)
            p = Path(str(f))
            if p.name == "optimizer.pt" and p.parent.name.startswith(".tmp-step-00000002-"):
                marker.write_text(str(p.parent))
                time.sleep(600)

        torch.save = save_then_hang
        return _signal_in_step2("optimize", signal.SIGTERM)(tr)

    pids = {"a": _fork_cli(th, cfg("a"), err["a"], _signal_in_step2("collect", signal.SIGTERM)),
            "b": _fork_cli(th, cfg("b"), err["b"], _signal_in_step2("optimize", signal.SIGINT)),
            "c": _fork_cli(th, cfg("c", "run.save_every=1"), err["c"], hang_in_save, repeat_window=0.0)}
    try:
        ref = GRPOTrainer(cfg("ref"), samples=th.image_samples(3), reward_fn=th.text_reward)  # uninterrupted
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
    # A: discarded step 2, checkpoint of step 1, exit 4, one line naming the checkpoint
    assert os.WIFEXITED(status["a"]) and os.WEXITSTATUS(status["a"]) == EXIT_INTERRUPTED, text["a"]
    assert ("mmgrpo train: SIGTERM received: stopped at step 1 (its rollouts were discarded); checkpoint written: "
            f"{tmp_path / 'a' / 'run' / 'checkpoints' / 'step-00000001'}") in text["a"]
    assert ckpts("a") == [1] and "Traceback" not in text["a"]
    # B: Ctrl-C finishes step 2 and writes it; no traceback
    assert os.WIFEXITED(status["b"]) and os.WEXITSTATUS(status["b"]) == EXIT_INTERRUPTED, text["b"]
    assert "SIGINT received: stopped at step 2; checkpoint written:" in text["b"] and "Traceback" not in text["b"]
    assert ckpts("b") == [2]
    # C: the second SIGTERM killed it at once, mid-write: a temp dir without manifest, step 1 intact
    assert os.WIFSIGNALED(status["c"]) and os.WTERMSIG(status["c"]) == signal.SIGTERM, text["c"]
    assert "SIGTERM received again: aborting now" in text["c"]
    torn = Path(marker.read_text())
    assert torn.is_dir() and not (torn / "manifest.json").exists() and ckpts("c") == [1]
    assert CheckpointManager(tmp_path / "c" / "run" / "checkpoints").latest_valid().name == "step-00000001"
    # every run resumes (auto) to the end, bitwise equal to the uninterrupted one
    for name, start in (("a", 1), ("b", 2), ("c", 1)):
        tr = GRPOTrainer(cfg(name), samples=th.image_samples(3), reward_fn=th.text_reward)
        hist = tr.train()
        assert len(hist) == STEPS - start and tr.state.step == STEPS, name
        _assert_bitwise(_state(tr), want)
        assert tr.state.stream.position == ref.state.stream.position, name
    assert not torn.exists()  # the dead writer's temp dir was removed


# ------------------------------------------------------------------------------------------------ two processes
MP_ARGS = ["run.prompts_per_step=3", "rollout.group_size=4", "rollout.max_new_tokens=4", "run.micro_batch_size=8",
           "data.task=mcq", "optim.max_grad_norm=1.0", "model.freeze_vision=true", f"run.max_steps={STEPS}",
           "run.resume_from=auto", "run.grad_sync=manual"]


def _mp_worker(rank, port, model, root, th):
    """One of two gloo processes: an uninterrupted run, then a run whose rank 1 alone gets SIGTERM while step 2
    collects, then its resume; compares the resumed weights with the uninterrupted ones in this same process."""
    import json

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", RANK=str(rank),
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")  # OMP: see test_multiproc
    torch.set_num_threads(1)
    from accelerate.state import AcceleratorState, GradientState

    from mmgrpo.vlm.train.trainer import GRPOTrainer
    from mmgrpo.engine.errors import TrainingInterrupted

    AcceleratorState._reset_state(reset_partial_state=True)  # the parent's single-process state
    GradientState._reset_state()

    def make(name):
        return GRPOTrainer(th.make_cfg(root / name, model, *MP_ARGS), samples=th.image_samples(3),
                           reward_fn=th.text_reward)

    ref = make("ref")
    ref.train()
    want = _state(ref)
    tr = make("run")
    if rank == 1:
        _signal_in_step2("collect", signal.SIGTERM)(tr)
    res = {"rank": rank}
    try:
        tr.train()
    except TrainingInterrupted as e:
        res.update(signame=e.signame, where=e.where, checkpoint=e.checkpoint, step=tr.state.step)
    again = make("run")
    res["resumed_steps"] = len(again.train())
    try:
        _assert_bitwise(_state(again), want)
        res["bitwise"] = True
    except AssertionError:
        res["bitwise"] = False
    (root / f"result{rank}.json").write_text(json.dumps(res))


def test_two_processes_agree_to_stop_at_the_same_step_and_resume_exactly(tmp_path, tiny_dirs, th):
    import json
    import socket

    model = tiny_dirs("qwen2_5_vl")
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
                _mp_worker(r, port, model, tmp_path, th)
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
    ck = tmp_path / "run" / "run" / "checkpoints" / "step-00000001"
    # rank 1 got the signal, rank 0 learned it through the reduction: both stopped at step 1 (step 2 discarded)
    assert r1["signame"] == "SIGTERM" and r0["signame"] == "a signal on another process"
    assert r0["step"] == r1["step"] == 1 and r0["where"] == r1["where"] == "step 1 (its rollouts were discarded)"
    assert r0["checkpoint"] == r1["checkpoint"] == str(ck)  # written by rank 0, broadcast (RunGuard.checkpoint)
    assert r0["resumed_steps"] == r1["resumed_steps"] == STEPS - 1
    assert r0["bitwise"] and r1["bitwise"]


def test_ctrl_c_before_the_loop_exits_130_without_traceback(monkeypatch, capsys, tmp_path):
    """Ctrl-C while the model loads (no handler yet, nothing to save): one line and 130, not a traceback."""
    import mmgrpo.vlm.train.trainer as tm
    import mmgrpo.utils.config as uc
    from mmgrpo.vlm.cli import main

    def loading(cfg):
        raise KeyboardInterrupt

    from types import SimpleNamespace

    cfg = SimpleNamespace(run=SimpleNamespace(output_dir=str(tmp_path)))  # the CLI releases the run lock at the end
    monkeypatch.setattr(uc, "parse_config_cli", lambda *a, **k: cfg)
    monkeypatch.setattr(tm, "GRPOTrainer", loading)
    assert main(["train"]) == 130
    assert capsys.readouterr().err.strip() == ("mmgrpo train: interrupted before training started (no checkpoint "
                                               "written)")
