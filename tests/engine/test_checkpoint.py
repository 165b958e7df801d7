"""mmgrpo.engine.checkpoint pieces that need no process group (and the guard's SkipHalt): per-process RNG states, the writer's
folder protocol (sharded tensors staged, moved into the atomic folder), and the refusal of non-tensor DCP items."""
import os
import random

import pytest
import torch

from mmgrpo.engine.checkpoint import gather_rng, load_sharded, restore_rng, save_checkpoint, save_sharded
from mmgrpo.engine.guard import SkipHalt
from mmgrpo.utils.checkpoint import CheckpointManager


def test_skip_halt_counts_in_a_row_halts_at_the_limit_and_round_trips():
    s = SkipHalt(3)
    assert not s.skipped("non-finite loss") and not s.skipped("non-finite gradients", n=1)
    s.applied()
    assert s.consecutive == 0 and s.last_cause == "non-finite gradients"
    assert not s.skipped("a", n=2) and s.skipped("b") and s.halt_due and s.consecutive == 3
    r = SkipHalt(3)
    r.load_state_dict(s.state_dict())
    assert (r.consecutive, r.last_cause, r.halt_due) == (3, "b", True)
    never = SkipHalt(0)  # the VLM trainer's run.max_consecutive_skips=0
    assert not never.skipped("x", n=100) and not never.halt_due


def test_rng_states_are_per_process_and_restored_only_on_the_same_process_count():
    saved = gather_rng()
    assert saved["world"] == 1 and len(saved["per_rank"]) == 1
    want = (random.random(), torch.rand(2))
    assert restore_rng(saved, rank=0, world=1)
    got = (random.random(), torch.rand(2))
    assert want[0] == got[0] and torch.equal(want[1], got[1])
    before = torch.get_rng_state()
    assert not restore_rng(saved, rank=0, world=2) and torch.equal(torch.get_rng_state(), before)


def test_save_checkpoint_moves_the_sharded_tensors_into_the_atomic_folder(tmp_path):
    mgr = CheckpointManager(tmp_path / "ck", keep_last=2, keep_best=False)
    t = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "optim": {"w": {"step": torch.tensor(3.0)}}}
    for step in (1, 2, 3):
        path = save_checkpoint(mgr, step, lambda: {"trainer": {"step": step}}, is_main=True,
                               sharded=lambda d: save_sharded(d, t))
    assert [p.name for _, p in mgr.list_checkpoints()] == ["step-00000002", "step-00000003"]  # retention
    assert sorted(os.listdir(mgr.root)) == ["step-00000002", "step-00000003"]  # no staging folder left
    manifest = mgr.verify(path)
    assert "state/.metadata" in manifest["files"] and mgr.load(path)["trainer"] == {"step": 3}
    got = load_sharded(path / "state", {"model": {"w": torch.zeros(2, 3)}, "optim": {"w": {"step": torch.zeros(())}}})
    assert torch.equal(got["model"]["w"], t["model"]["w"]) and float(got["optim"]["w"]["step"]) == 3.0


def test_only_tensors_go_through_dcp(tmp_path):
    # DCP reads non-tensor items with torch.load(weights_only=False): none may be written
    with pytest.raises(TypeError, match="optim.lr is a float"):
        save_sharded(tmp_path / "x", {"optim": {"lr": 0.1}})
