"""Flow checkpoints hold epochs and are named ``epoch-*`` (issue 15); runs written before under ``step-*`` still
resume, and retention counts both kinds."""
import torch

from mmgrpo.utils.checkpoint import CheckpointManager

from .conftest import make_trainer


def test_epoch_manager_resumes_and_prunes_old_step_folders(tmp_path):
    old = CheckpointManager(tmp_path, keep_last=None)  # the former flow layout
    for n in (1, 2):
        old.save(n, {"x": torch.tensor([n])})
    assert [p.name for _, p in old.list_checkpoints()] == ["step-00000001", "step-00000002"]
    mgr = CheckpointManager(tmp_path, keep_last=2, keep_best=False, prefix="epoch")
    assert mgr.latest_valid().name == "step-00000002" and mgr.resolve("auto").name == "step-00000002"
    assert mgr.resolve(str(tmp_path)).name == "step-00000002"  # a folder of checkpoints given as resume_from
    assert mgr.save(3, {"x": torch.tensor([3])}).name == "epoch-00000003"
    assert [p.name for _, p in mgr.list_checkpoints()] == ["step-00000002", "epoch-00000003"]  # keep_last=2
    mgr.save(4, {"x": torch.tensor([4])})
    assert [p.name for _, p in mgr.list_checkpoints()] == ["epoch-00000003", "epoch-00000004"]
    old.save(4, {"x": torch.tensor([-4])})  # same number under both names: the epoch folder is the newer
    assert mgr.latest_valid().name == "epoch-00000004" and int(mgr.load(mgr.latest_valid())["x"]) == 4


def test_trainer_writes_epoch_folders_and_resumes_a_step_folder(tmp_path):
    ov = {"run.keep_last": 1, "run.keep_best": "false", "sample.cfg": "false"}
    tr = make_trainer("sd3", "fast", tmp_path, **ov)
    try:
        tr.train()
        want = {n: p.detach().clone() for n, p in tr.named_params}
    finally:
        tr.close()
    ck = tmp_path / "checkpoints"
    assert [p.name for p in ck.iterdir()] == ["epoch-00000001"]
    (ck / "epoch-00000001").rename(ck / "step-00000001")  # what a run before the rename left behind
    tr = make_trainer("sd3", "fast", tmp_path, **ov, **{"run.num_epochs": 2})
    try:
        assert tr.maybe_resume() == ck / "step-00000001" and tr.epoch == 1
        assert all(torch.equal(p, want[n]) for n, p in tr.named_params)
        tr.train()
    finally:
        tr.close()
    assert [p.name for p in ck.iterdir()] == ["epoch-00000002"]  # keep_last=1 pruned the step folder
