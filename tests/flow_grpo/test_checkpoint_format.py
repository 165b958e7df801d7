"""The flow trainer's checkpoints (mmgrpo.engine.checkpoint, docs/checkpoints.md): checkpoints written by the code
before the one format -- replicated entries with the skip count in ``counters``, and the sharded layout
(``shards/accelerate`` from ``accelerator.save_state`` + ``shards/ema_rank<r>.pt``, written here by one process) --
still resume, to exactly the state a resume from the new format gives; the skip-and-halt count comes back."""
import os

import torch

from mmgrpo.utils.checkpoint import CheckpointManager

from .conftest import make_trainer

EXTRA = {"run.save_every": 1, "run.keep_last": 5, "optim.lr_schedule": "cosine", "optim.warmup_steps": 1}


def _old_trainer_entry(tr, consecutive):
    st = tr._trainer_state()
    for k in ("consecutive_skips", "last_skip_cause", "scaler"):
        st.pop(k)
    st["counters"] = {**st["counters"], "consecutive_skips": consecutive}
    return st


def _old_saves(tr, root, consecutive):
    """Both layouts of the code before the one format, from the trainer's current state."""
    from mmgrpo.engine.checkpoint import gather_rng

    rng = gather_rng()
    mgr = CheckpointManager(root / "replicated", keep_last=None, keep_best=False, prefix="epoch")
    rep = mgr.save(tr.epoch, {**tr.state_dict(), "trainer": _old_trainer_entry(tr, consecutive), "rng": rng})
    mgr = CheckpointManager(root / "sharded", keep_last=None, keep_best=False, prefix="epoch")
    stage = root / "stage"
    stage.mkdir()
    tr.accelerator.save_state(str(stage / "accelerate"))
    torch.save(tr.ema.state_dict(), stage / "ema_rank0.pt")
    state = {"trainer": _old_trainer_entry(tr, consecutive), "config": tr.state_dict()["config"],
             "reference": dict(tr.reference_info), "rng": rng}
    shd = mgr.save(tr.epoch, state, extra_files={"shards": lambda p: os.rename(stage, p)})
    return rep, shd


def _final(tr):
    return ({n: p.detach().clone() for n, p in tr.named_params}, [s.clone() for s in tr.ema.shadow],
            tr.optimizer.state_dict(), tr.lr_scheduler.state_dict(), tr.global_step, dict(tr.counters))


def _assert_equal(a, b):
    assert a[0].keys() == b[0].keys() and all(torch.equal(a[0][n], b[0][n]) for n in a[0])
    assert all(torch.equal(x, y) for x, y in zip(a[1], b[1]))
    oa, ob = a[2]["state"], b[2]["state"]
    assert oa.keys() == ob.keys() and all(torch.equal(oa[i][k], ob[i][k]) for i in oa for k in oa[i])
    assert a[3:] == b[3:]


def test_checkpoints_of_the_earlier_formats_resume_exactly(tmp_path):
    a = make_trainer("flux", "fast", tmp_path / "a", **EXTRA, **{"run.num_epochs": 1})
    a.train()
    new = a.ckpt.latest_valid()
    rep, shd = _old_saves(a, tmp_path / "old", consecutive=1)
    assert (new / "rng.pt").is_file() and (shd / "shards" / "ema_rank0.pt").is_file()
    assert "consecutive_skips" not in CheckpointManager(new.parent).load(new)["trainer"]["counters"]
    finals = []
    for name, path in (("new", new), ("replicated", rep), ("sharded", shd)):
        tr = make_trainer("flux", "fast", tmp_path / name, **EXTRA, **{"run.num_epochs": 2,
                                                                       "run.resume_from": str(path)})
        assert tr.maybe_resume() is not None and tr.epoch == 1
        assert tr.skips.consecutive == (0 if name == "new" else 1)  # the old count, from counters
        assert "consecutive_skips" not in tr.counters
        tr.train()
        assert tr.epoch == 2
        finals.append(_final(tr))
        tr.close()
    _assert_equal(finals[0], finals[1])
    _assert_equal(finals[0], finals[2])
