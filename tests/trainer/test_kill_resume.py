"""Exact resume after a real SIGKILL, a kill in the middle of a checkpoint write, and checkpoint retention.

The trainer runs in a child process (``os.fork`` of this one, so the ~15 s import of torch + transformers is not
paid again on the loaded 2-core machine; the child loads the tiny Qwen2.5-VL saved to a tmp folder, full
fine-tuning, a checkpoint every step) and is killed with a real SIGKILL.  Run A is SIGKILLed at an arbitrary
point once its 2nd checkpoint exists; run B resumes (``run.resume_from=auto``) and is SIGKILLed while it writes
its step-3 checkpoint; the last resume (in this process, through ``GRPOTrainer.train``) must pick step 2, ignore
the torn write, and end with weights and optimizer state bitwise equal to an uninterrupted run (CPU, one thread).
"""
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch

from mmgrpo.vlm.train.trainer import GRPOTrainer
from mmgrpo.utils.checkpoint import CheckpointManager

STEPS = 3
ARGS = ["model.freeze_vision=true", f"run.max_steps={STEPS}", "run.save_every=1", "run.keep_last=1",
        "run.best_metric=data/epoch", "run.best_mode=min", "optim.lr=0.01", "optim.weight_decay=0.01",
        "optim.max_grad_norm=1.0", "run.resume_from=auto", "data.task=mcq", "rollout.max_new_tokens=5"]


class Child:
    """``fn()`` in a forked child process that never returns into pytest (``os._exit``)."""

    def __init__(self, fn):
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:  # child
            code = 1
            try:
                fn()
                code = 0
            except BaseException:  # noqa: BLE001 - report and leave without running pytest's teardown
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        self.status = None

    def poll(self):
        if self.status is None:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = st
        return self.status

    def kill(self):
        os.kill(self.pid, signal.SIGKILL)
        _, self.status = os.waitpid(self.pid, 0)
        assert os.WIFSIGNALED(self.status) and os.WTERMSIG(self.status) == signal.SIGKILL


def _run(th, out_root, model, hang_step=None, marker=None):
    def fn():
        if hang_step is not None:  # the checkpoint write of step hang_step stops half-way: killed there
            save = torch.save

            def save_then_hang(obj, f, *a, **k):
                save(obj, f, *a, **k)
                p = Path(str(f))
                if p.name == "optimizer.pt" and p.parent.name.startswith(f".tmp-step-{hang_step:08d}-"):
                    Path(marker).write_text(str(p.parent))
                    while True:
                        time.sleep(1)

            torch.save = save_then_hang
        GRPOTrainer(th.make_cfg(out_root, model, *ARGS), samples=th.image_samples(3), reward_fn=th.text_reward).train()

    return Child(fn)


def _wait_for(pred, child, timeout=240.0):
    t0 = time.time()
    while not pred():
        if child.poll() is not None:
            raise AssertionError(f"the training process exited early (status {child.status})")
        if time.time() - t0 > timeout:
            child.kill()
            raise AssertionError("timed out waiting for the training process")
        time.sleep(0.02)


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


def test_sigkill_anywhere_and_during_checkpoint_write_then_exact_resume(tmp_path, tiny_dirs, th):
    model = tiny_dirs("qwen2_5_vl")
    run_b = tmp_path / "b" / "run"
    ck = run_b / "checkpoints"
    # run A: SIGKILL at whatever point it has reached once its 2nd checkpoint exists
    proc = _run(th, tmp_path / "b", model)
    _wait_for(lambda: (ck / "step-00000002" / "manifest.json").exists(), proc)
    proc.kill()
    # run B: resumes, then is killed half-way through writing the step-3 checkpoint
    marker = tmp_path / "hang.txt"
    proc = _run(th, tmp_path / "b", model, hang_step=STEPS, marker=marker)

    # meanwhile the uninterrupted reference, in this process
    ref = GRPOTrainer(th.make_cfg(tmp_path / "a", model, *ARGS), samples=th.image_samples(3), reward_fn=th.text_reward)
    ref.train()
    want = _state(ref)
    # retention: the last 1 plus the best by the logged metric (data/epoch, lower is better; ties -> later step)
    rows = [json.loads(x) for x in (tmp_path / "a" / "run" / "metrics.jsonl").read_text().splitlines()]
    best = min(rows, key=lambda r: (r["data/epoch"], -r["step"]))["step"]
    kept = sorted(s for s, _ in CheckpointManager(tmp_path / "a" / "run" / "checkpoints").list_checkpoints())
    assert kept == sorted({best, STEPS}) and best < STEPS - 1

    _wait_for(marker.exists, proc)
    proc.kill()
    torn = Path(marker.read_text())
    assert torn.is_dir() and (torn / "optimizer.pt").exists() and not (torn / "trainer.pt").exists()
    assert not (ck / f"step-{STEPS:08d}").exists() and (ck / f"step-{STEPS - 1:08d}" / "manifest.json").exists()

    # resume through the trainer: latest valid = step 2, the torn temp dir of the dead writer is removed
    tr = GRPOTrainer(th.make_cfg(tmp_path / "b", model, *ARGS), samples=th.image_samples(3), reward_fn=th.text_reward)
    hist = tr.train()
    assert len(hist) == 1 and tr.state.step == STEPS and not torn.exists()
    _assert_bitwise(_state(tr), want)
    assert tr.state.stream.position == ref.state.stream.position
