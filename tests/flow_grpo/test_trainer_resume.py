"""Exact resume after a real SIGKILL.

Child processes (forked from this one, so they skip the 30 s of imports a fresh interpreter needs; they are real
processes and receive a real SIGKILL) train with a checkpoint after every epoch:

1. child 1 is killed right after its 1st checkpoint appears (it is then inside epoch 2);
2. child 2 resumes (``resume_from=auto``) and is killed *inside* the write of checkpoint 2 (it blocks in
   ``torch.save`` of the optimizer entry);
3. this process resumes (auto: checkpoint 2 is incomplete, so checkpoint 1) and finishes the run.

The result must equal an uninterrupted run bit for bit on CPU: LoRA weights, EMA, optimizer state, LR schedule,
counters. While child 2 runs, this process computes the uninterrupted run.
"""
import multiprocessing as mp
import os
import signal
import time

import torch

from mmgrpo.utils.checkpoint import CheckpointManager, verify_checkpoint

from .conftest import make_trainer

EXTRA = {"run.num_epochs": 3, "run.save_every": 1, "run.keep_last": 2, "optim.lr_schedule": "cosine",
         "optim.warmup_steps": 1, "ema.update_every": 1, "optim.kl_coef": 0.01, "run.resume_from": "auto"}


def _child(out: str, block_in_save_of: int) -> None:
    """Train in a forked child; optionally block forever inside the write of checkpoint ``block_in_save_of``."""
    if block_in_save_of:
        real_save = torch.save

        def save(obj, f, *a, **k):
            p = str(f)
            if f".tmp-epoch-{block_in_save_of:08d}-" in p and p.endswith("optimizer.pt"):
                real_save(obj, f, *a, **k)  # a partial checkpoint: some entries written, no manifest
                open(os.path.join(out, "in_save"), "w").close()
                time.sleep(600)
            return real_save(obj, f, *a, **k)

        torch.save = save
    tr = make_trainer("flux", "fast", out, **EXTRA)
    tr.train()


def _wait_for(pred, proc, timeout=120.0):
    t0 = time.time()
    while not pred():
        assert proc.is_alive(), f"child exited early with code {proc.exitcode}"
        assert time.time() - t0 < timeout, "timed out waiting for the child"
        time.sleep(0.005)


def _state(tr):
    return ({n: p.detach().clone() for n, p in tr.named_params}, [s.clone() for s in tr.ema.shadow],
            tr.optimizer.state_dict(), tr.lr_scheduler.state_dict(), tr.state.global_step, dict(tr.state.counters))


def test_sigkill_then_resume_is_bitwise_exact(tmp_path):
    run = tmp_path / "run"
    ctx = mp.get_context("fork")
    mgr = CheckpointManager(run / "checkpoints", prefix="epoch")
    make_trainer("flux", "fast", tmp_path / "warm", **EXTRA).close()  # lazy imports happen before the forks
    # 1. kill after the 1st checkpoint appears (mid epoch 2)
    c1 = ctx.Process(target=_child, args=(str(run), 0))
    c1.start()
    _wait_for(lambda: (run / "checkpoints" / "epoch-00000001" / "manifest.json").is_file(), c1)
    os.kill(c1.pid, signal.SIGKILL)
    c1.join()
    assert c1.exitcode == -signal.SIGKILL
    assert [s for s, _ in mgr.list_checkpoints()] == [1]
    # 2. resume, then kill inside the write of checkpoint 2
    c2 = ctx.Process(target=_child, args=(str(run), 2))
    c2.start()
    ref = make_trainer("flux", "fast", tmp_path / "ref", **EXTRA)  # meanwhile: the uninterrupted run, here
    ref.train()
    want = _state(ref)
    _wait_for(lambda: (run / "in_save").is_file(), c2)
    os.kill(c2.pid, signal.SIGKILL)
    c2.join()
    assert c2.exitcode == -signal.SIGKILL
    partial = [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-epoch-00000002")]
    assert len(partial) == 1 and (partial[0] / "optimizer.pt").is_file()
    assert not (partial[0] / "manifest.json").exists()
    assert mgr.latest_valid() == run / "checkpoints" / "epoch-00000001"  # the previous checkpoint still loads
    # 3. resume here and finish
    tr = make_trainer("flux", "fast", run, **EXTRA)
    hist = tr.train()
    assert [h["epoch"] for h in hist] == [1, 2]  # resumed from checkpoint 1, not from the partial 2
    got = _state(tr)
    for n in want[0]:
        assert torch.equal(got[0][n], want[0][n]), n
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))
    (sa, sb) = got[2], want[2]
    assert sa["param_groups"] == sb["param_groups"]
    for k in sb["state"]:
        for name, v in sb["state"][k].items():
            assert torch.equal(sa["state"][k][name], v), (k, name)
    assert got[3] == want[3] and got[4] == want[4] == 3 and got[5] == want[5]
    assert not partial[0].exists()  # the dead writer's temp dir was cleaned up
    # what a checkpoint holds
    man = verify_checkpoint(run / "checkpoints" / "epoch-00000003")
    assert set(man["entries"]) == {"trainable", "optimizer", "scheduler", "ema", "trainer", "methods", "config", "reference",
                                   "rng"}
    st = mgr.load(run / "checkpoints" / "epoch-00000003")
    assert st["trainer"]["data"]["epoch"] == 3 and st["trainer"]["global_step"] == 3
    assert st["reference"]["kind"] == "lora_disabled" and len(st["reference"]["base_fingerprint"]) == 64
    assert set(st["rng"]["per_rank"][0]) >= {"python", "numpy", "torch"}
    assert "lora" in man["extra_files"]
    assert [s for s, _ in mgr.list_checkpoints()] == [2, 3]  # keep_last=2


def test_time_budget_last_epoch_saves_exports_and_carries_over_resume(tmp_path, tick_clock):
    """run.max_train_seconds: the epoch in which the budget runs out is the last (checkpoint + LoRA export), and a
    resumed run continues the same budget (fake clock: every reading advances 1 s; 1 s per epoch)."""
    from mmgrpo.utils.budget import TimeBudget

    extra = {"run.num_epochs": 10, "run.save_every": 0, "run.resume_from": "auto", "run.max_train_seconds": 1.5}
    tr = make_trainer("flux", "fast", tmp_path, **extra)
    tr.guard.budget = TimeBudget(1.5, clock=tick_clock)
    hist = tr.train()
    assert tr.guard.budget_stopped and tr.state.epoch == 2 and [m["time/train_budget_s"] for m in hist] == [1.0, 2.0]
    assert CheckpointManager(tmp_path / "checkpoints", prefix="epoch").latest_valid() is not None
    assert (tmp_path / "lora_final").exists()
    again = make_trainer("flux", "fast", tmp_path, **extra)
    assert again.train() == [] and again.state.epoch == 2 and again.guard.budget.spent == 2.0


def test_trainer_ema_warmup_by_hand():
    """ema.warmup: the n-th update uses decay min(decay, (1 + n) / (10 + n)); the count survives state_dict."""
    from flow_grpo.ema import EMA

    p = torch.nn.Parameter(torch.tensor([0.0]))
    ema = EMA([p], decay=0.2, warmup=True)
    expect = 0.0
    for n, value in enumerate([1.0, 3.0, -2.0, 5.0]):
        with torch.no_grad():
            p.fill_(value)
        d = min(0.2, (1 + n) / (10 + n))  # 0.1, 0.1818..., then capped at 0.2
        expect = d * expect + (1 - d) * value
        ema.update()
        assert abs(ema.shadow[0].item() - expect) < 1e-6
    again = EMA([p], decay=0.2, warmup=True)
    again.load_state_dict(ema.state_dict())
    assert again.num_updates == 4 and again.current_decay() == 0.2
    plain = EMA([p], decay=0.9, warmup=False)
    assert plain.current_decay() == 0.9


def test_trainer_ema_warmup_follows_the_optimizer_step():
    from flow_grpo.ema import EMA

    p = torch.nn.Parameter(torch.tensor([0.0]))
    ema = EMA([p], decay=0.9, warmup=True)
    with torch.no_grad():
        p.fill_(2.0)
    ema.update(8)  # first update at optimizer step 8 (update_every=8): decay min(0.9, 9/18) = 0.5
    assert abs(ema.shadow[0].item() - 1.0) < 1e-6 and ema.current_decay(80) == 0.9
