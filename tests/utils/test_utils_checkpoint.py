"""Checkpoints: atomic save under SIGKILL, manifest verification, corruption skipping, retention, RNG state."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from mmgrpo.utils.checkpoint import (
    CheckpointError,
    CheckpointManager,
    atomic_torch_save,
    atomic_write_text,
    capture_rng_state,
    restore_rng_state,
)
from mmgrpo.utils._fsio import atomic_write

LOGGER = "mmgrpo.checkpoint"


def _state(step: int, n: int = 16) -> dict:
    return {"model": {"w": torch.full((n,), float(step)), "b": torch.arange(3)}, "meta": {"step": step}}


def test_save_load_round_trip_and_manifest(tmp_path: Path):
    lin = torch.nn.Linear(4, 3)
    # optimizer-shaped state (a real optimizer.step() would import torch._dynamo: seconds, for nothing tested here)
    opt_sd = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(3, 4)}},
              "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 1]}]}
    mgr = CheckpointManager(tmp_path / "ck")

    def write_dir(p: Path):  # like save_pretrained: a directory with files
        p.mkdir()
        (p / "config.json").write_text('{"a": 1}')

    path = mgr.save(7, {"model": lin.state_dict(), "optimizer": opt_sd, "rng": capture_rng_state(),
                        "meta": {"step": 7, "name": "x"}}, metric=0.5, extra_files={"adapter": write_dir})
    assert path == tmp_path / "ck" / "step-00000007"
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["step"] == 7 and manifest["metric"] == 0.5
    assert set(manifest["files"]) == {"model.pt", "optimizer.pt", "rng.pt", "meta.pt", "adapter/config.json"}
    for rel, info in manifest["files"].items():  # sizes and hashes computed independently here
        data = (path / rel).read_bytes()
        assert info["size"] == len(data) and info["sha256"] == hashlib.sha256(data).hexdigest()
    assert not [p for p in (tmp_path / "ck").iterdir() if p.name.startswith(".tmp")]

    state, got = mgr.load_latest()
    assert got == path
    lin2 = torch.nn.Linear(4, 3)
    lin2.load_state_dict(state["model"])
    assert all(torch.equal(a, b) for a, b in zip(lin.state_dict().values(), lin2.state_dict().values()))
    assert torch.equal(state["optimizer"]["state"][0]["exp_avg"], opt_sd["state"][0]["exp_avg"])
    assert state["optimizer"]["param_groups"] == opt_sd["param_groups"]
    assert state["meta"] == {"step": 7, "name": "x"}


def test_empty_root(tmp_path: Path):
    mgr = CheckpointManager(tmp_path / "nothing")
    assert mgr.load_latest() == (None, None)
    assert mgr.resolve("auto") is None


def _newest_two(tmp_path: Path) -> CheckpointManager:
    mgr = CheckpointManager(tmp_path, keep_last=5)
    mgr.save(1, _state(1, 4096))
    mgr.save(2, _state(2, 4096))
    return mgr


def test_truncated_file_is_skipped_with_log(tmp_path: Path, caplog):
    mgr = _newest_two(tmp_path)
    f = tmp_path / "step-00000002" / "model.pt"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        state, path = mgr.load_latest()
    assert path == tmp_path / "step-00000001" and state["meta"]["step"] == 1
    assert float(state["model"]["w"][0]) == 1.0
    msgs = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any("step-00000002" in m and "model.pt" in m and "truncated" in m for m in msgs), msgs


def test_same_size_corruption_fails_hash(tmp_path: Path, caplog):
    mgr = _newest_two(tmp_path)
    f = tmp_path / "step-00000002" / "model.pt"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _, path = mgr.load_latest()
    assert path.name == "step-00000001"
    assert any("sha256" in r.getMessage() for r in caplog.records)


def test_missing_manifest_and_missing_file_skipped(tmp_path: Path, caplog):
    mgr = _newest_two(tmp_path)
    mgr.save(3, _state(3))
    (tmp_path / "step-00000003" / "manifest.json").unlink()
    (tmp_path / "step-00000002" / "meta.pt").unlink()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        state, path = mgr.load_latest()
    assert path.name == "step-00000001" and state["meta"]["step"] == 1
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "step-00000003" in text and "manifest" in text and "meta.pt" in text and "missing" in text


def test_unreadable_file_without_hash_check_is_skipped(tmp_path: Path, caplog):
    CheckpointManager(tmp_path, keep_last=5).save(1, _state(1))
    CheckpointManager(tmp_path, keep_last=5).save(2, _state(2))
    f = tmp_path / "step-00000002" / "meta.pt"
    f.write_bytes(b"\0" * f.stat().st_size)  # same size, garbage content
    mgr = CheckpointManager(tmp_path, check_hashes=False)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _, path = mgr.load_latest()
    assert path.name == "step-00000001"
    assert any("cannot load meta.pt" in r.getMessage() for r in caplog.records)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_tmp_dirs_ignored_and_cleaned(tmp_path: Path):
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, _state(1))
    stale = tmp_path / f".tmp-step-00000002-{_dead_pid()}"
    stale.mkdir()
    (stale / "model.pt").write_bytes(b"partial")
    live = tmp_path / f".tmp-step-00000003-{os.getppid()}"  # a live writer's dir is left alone
    live.mkdir()
    foreign = tmp_path / f".tmp-step-00000004-{_dead_pid()}"  # dead pid, but written from another host
    foreign.mkdir()
    (foreign / ".writer").write_text("some-other-node")
    state, path = mgr.load_latest()
    assert path.name == "step-00000001"
    assert not stale.exists() and live.exists() and foreign.exists()
    old = time.time() - 2 * 24 * 3600
    os.utime(foreign, (old, old))
    mgr.load_latest()
    assert not foreign.exists()  # an abandoned foreign temp dir is cleaned once old


def test_retention_keeps_last_n_plus_best(tmp_path: Path):
    mgr = CheckpointManager(tmp_path, keep_last=2, keep_best=True, best_mode="max")
    for step, metric in [(1, 0.1), (2, 0.9), (3, 0.2), (4, 0.3), (5, None)]:
        mgr.save(step, _state(step), metric=metric)
    assert [s for s, _ in mgr.list_checkpoints()] == [2, 4, 5]
    assert mgr.best_checkpoint().name == "step-00000002"

    mgr_min = CheckpointManager(tmp_path / "min", keep_last=1, best_mode="min")
    for step, metric in [(1, 0.5), (2, 0.1), (3, 0.7), (4, 0.6)]:
        mgr_min.save(step, _state(step), metric=metric)
    assert [s for s, _ in mgr_min.list_checkpoints()] == [2, 4]

    mgr_nobest = CheckpointManager(tmp_path / "nobest", keep_last=2, keep_best=False)
    for step, metric in [(1, 9.0), (2, 0.0), (3, 0.0)]:
        mgr_nobest.save(step, _state(step), metric=metric)
    assert [s for s, _ in mgr_nobest.list_checkpoints()] == [2, 3]

    keep_all = CheckpointManager(tmp_path / "all", keep_last=None)
    for step in range(4):
        keep_all.save(step, _state(step))
    assert len(keep_all.list_checkpoints()) == 4


def test_retention_never_deletes_the_checkpoint_just_written(tmp_path: Path):
    mgr = CheckpointManager(tmp_path, keep_last=1, keep_best=False)
    mgr.save(10, _state(10))
    p = mgr.save(3, _state(3))  # older step number than the existing one: still kept
    assert p.exists() and (tmp_path / "step-00000010").exists()
    state = mgr.load(p)
    assert state["meta"]["step"] == 3


def test_resave_same_step_replaces(tmp_path: Path):
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, {"meta": {"v": 1}})
    mgr.save(1, {"meta": {"v": 2}})
    state, _ = mgr.load_latest()
    assert state == {"meta": {"v": 2}}
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000001"]


def test_resolve_semantics(tmp_path: Path):
    mgr = _newest_two(tmp_path)
    for v in (None, "", "none", "None"):
        assert mgr.resolve(v) is None
    assert mgr.resolve("auto") == tmp_path / "step-00000002"
    assert mgr.resolve(str(tmp_path / "step-00000001")) == tmp_path / "step-00000001"
    assert mgr.resolve(tmp_path) == tmp_path / "step-00000002"  # a checkpoints root: its latest valid
    with pytest.raises(CheckpointError, match="does not exist"):
        mgr.resolve(str(tmp_path / "nope"))
    (tmp_path / "step-00000001" / "meta.pt").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"step-00000001.*meta\.pt"):
        mgr.resolve(str(tmp_path / "step-00000001"))
    (tmp_path / "step-00000002" / "manifest.json").unlink()
    assert mgr.resolve("auto") is None  # nothing valid left
    with pytest.raises(CheckpointError, match="manifest"):
        mgr.resolve(str(tmp_path / "step-00000002"))


def test_invalid_arguments(tmp_path: Path):
    with pytest.raises(ValueError):
        CheckpointManager(tmp_path, best_mode="best")
    with pytest.raises(ValueError):
        CheckpointManager(tmp_path, keep_last=0)
    mgr = CheckpointManager(tmp_path)
    with pytest.raises(ValueError, match="entry name"):
        mgr.save(1, {"../evil": 1})
    with pytest.raises(RuntimeError, match="did not create"):
        mgr.save(1, {"a": 1}, extra_files={"x": lambda p: None})
    assert not list(tmp_path.iterdir())  # the failed save left no temp dir
    p = mgr.save(2, {"a": 1}, metric=float("nan"))
    assert json.loads((p / "manifest.json").read_text())["metric"] is None


# -------------------------------------------------------------------------------------- kill during a write
_CHILD = textwrap.dedent(
    """
    import sys, time, torch
    from mmgrpo.utils.checkpoint import CheckpointManager
    root, mode = sys.argv[1], sys.argv[2]
    mgr = CheckpointManager(root, keep_last=2)

    def state(step):
        return {"model": {"w": torch.full((2_000_000,), float(step))}, "meta": {"step": step}}

    mgr.save(1, state(1))
    print("SAVED 1", flush=True)
    if mode == "hang":
        def slow_blob(p):  # an extra file whose writer is killed half-way through
            with open(p, "wb") as f:
                f.write(b"x" * (1 << 20))
                f.flush()
                print("MIDWRITE", flush=True)
                while True:
                    f.write(b"y" * (1 << 16))
                    f.flush()
                    time.sleep(0.01)
        mgr.save(2, state(2), extra_files={"blob": slow_blob})
    else:  # save big checkpoints back to back until killed
        step = 2
        while True:
            mgr.save(step, state(step))
            print(f"SAVED {step}", flush=True)
            step += 1
    """
)


def _spawn(tmp_path: Path, mode: str) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    return subprocess.Popen([sys.executable, str(script), str(tmp_path / "ck"), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _read_until(proc: subprocess.Popen, token: str, timeout: float = 60.0) -> list[str]:
    lines, t0 = [], time.time()
    while time.time() - t0 < timeout:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"child exited early: {proc.stderr.read()}")
        lines.append(line.strip())
        if line.strip() == token:
            return lines
    raise AssertionError(f"timeout waiting for {token!r}")


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_sigkill_during_checkpoint_writes(tmp_path: Path):
    """Two real writer processes (started together so their torch imports overlap), SIGKILLed mid-save:
    (a) deterministically inside a save (an extra file's writer is half-way through), (b) at an arbitrary moment
    of a loop of back-to-back 8 MB saves. In both, load_latest() returns the last complete checkpoint."""
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    hang, loop = _spawn(tmp_path / "a", "hang"), _spawn(tmp_path / "b", "loop")
    try:
        # (a) kill while step 2 is being written
        _read_until(hang, "MIDWRITE")
        os.kill(hang.pid, signal.SIGKILL)
        hang.wait(timeout=30)
        assert hang.returncode == -signal.SIGKILL
        root = tmp_path / "a" / "ck"
        tmps = [p for p in root.iterdir() if p.name.startswith(".tmp-step-00000002")]
        assert len(tmps) == 1 and (tmps[0] / "model.pt").exists()  # the killed write really was in progress
        assert not (root / "step-00000002").exists()
        state, path = CheckpointManager(root).load_latest()
        assert path == root / "step-00000001"
        assert state["meta"]["step"] == 1 and bool((state["model"]["w"] == 1.0).all())
        assert not tmps[0].exists()  # the dead writer's temp dir was cleaned

        # (b) kill somewhere inside a later save of the loop
        lines = _read_until(loop, "SAVED 3")
        time.sleep(0.15)
        os.kill(loop.pid, signal.SIGKILL)
        loop.wait(timeout=30)
        lines += [x.strip() for x in loop.stdout.read().splitlines()]
    finally:
        _kill(hang)
        _kill(loop)
    last_reported = max(int(x.split()[1]) for x in lines if x.startswith("SAVED"))
    root = tmp_path / "b" / "ck"
    state, path = CheckpointManager(root).load_latest()
    step = state["meta"]["step"]
    assert path.name == f"step-{step:08d}"
    assert step >= last_reported  # a reported save is never lost (the next one may also have completed)
    assert bool((state["model"]["w"] == float(step)).all()) and state["model"]["w"].numel() == 2_000_000


# -------------------------------------------------------------------------------------- RNG + atomic helpers
def _draw():
    return (random.random(), random.getrandbits(64), np.random.rand(3).tolist(), torch.rand(4).tolist(),
            torch.randint(0, 10**9, (2,)).tolist())


def test_rng_state_exact_restore(tmp_path: Path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    _draw()
    rng = capture_rng_state()
    first = _draw()
    _draw()
    restore_rng_state(rng)
    assert _draw() == first
    # through a checkpoint file (what a resumed run does)
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, {"rng": rng})
    _draw()
    state, _ = mgr.load_latest()
    restore_rng_state(state["rng"])
    assert _draw() == first


def test_atomic_helpers(tmp_path: Path):
    p = tmp_path / "a" / "f.txt"
    atomic_write_text(p, "one")
    atomic_write_text(p, "two")
    assert p.read_text() == "two"
    with pytest.raises(RuntimeError):
        def boom(tmp: Path):
            tmp.write_text("partial")
            raise RuntimeError("fail mid-write")
        atomic_write(p, boom)
    assert p.read_text() == "two"  # old content intact, temp file removed
    assert sorted(x.name for x in p.parent.iterdir()) == ["f.txt"]
    q = atomic_torch_save({"t": torch.arange(5)}, tmp_path / "t.pt")
    assert torch.equal(torch.load(q)["t"], torch.arange(5))


# ------------------------------------------------------------------------------------------ no code from checkpoints
class _Evil:
    """Unpickling it runs ``touch target`` (what a crafted checkpoint file does)."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        import shlex

        return os.system, (f"touch {shlex.quote(self.target)}",)


def craft(step_dir: Path, filename: str, target: Path) -> None:
    """Replace ``filename`` of a checkpoint by a pickle that would create ``target``, with a correct manifest (its
    writer controls the manifest too)."""
    f = step_dir / filename
    torch.save({"state": _Evil(target)}, f)
    man = json.loads((step_dir / "manifest.json").read_text())
    man["files"][filename] = {"size": f.stat().st_size, "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
    (step_dir / "manifest.json").write_text(json.dumps(man))


def test_crafted_pickle_with_valid_manifest_is_refused_and_never_runs(tmp_path: Path):
    from mmgrpo.utils.checkpoint import UnsafeCheckpointError, verify_checkpoint

    mgr = CheckpointManager(tmp_path / "ck", keep_last=None)
    mgr.save(1, {"model": torch.ones(2), "rng": capture_rng_state()})  # numpy RNG arrays load under weights_only
    p2 = mgr.save(2, {"model": torch.ones(2), "scheduler": {"last_epoch": 2}})
    target = tmp_path / "pwned"
    craft(p2, "scheduler.pt", target)
    verify_checkpoint(p2)  # the manifest matches: it proves nothing
    assert mgr.resolve("auto") == p2
    for load in (lambda: mgr.load(p2), mgr.load_latest):  # load_latest must not fall back to step 1 silently
        with pytest.raises(UnsafeCheckpointError, match=r"scheduler\.pt refused: .*could run code.*posix\.system"):
            load()
    assert not target.exists()
    st = mgr.load(mgr.step_dir(1))
    restore_rng_state(st["rng"])  # the numpy state (an ndarray) loads with the allowlisted globals only


def test_refuse_unsafe_pickles_accepts_real_dcp_metadata_and_refuses_a_crafted_one(tmp_path: Path):
    import pickle
    import warnings

    import torch.distributed.checkpoint as dcp

    from mmgrpo.utils.checkpoint import UnsafeCheckpointError, refuse_unsafe_pickles

    lin = torch.nn.Linear(3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group": a single-process save
        dcp.save({"model": lin.state_dict()}, checkpoint_id=tmp_path / "acc" / "model")
    refuse_unsafe_pickles(tmp_path / "acc")  # what torch.distributed.checkpoint writes passes
    target = tmp_path / "pwned"
    (tmp_path / "acc" / "model" / ".metadata").write_bytes(pickle.dumps(_Evil(target)))
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata refused.*posix\.system"):
        refuse_unsafe_pickles(tmp_path / "acc")
    assert not target.exists()
