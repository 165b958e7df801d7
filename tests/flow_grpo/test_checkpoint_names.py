"""Flow checkpoints hold epochs and are named ``epoch-*`` (issue 15); a halted run's ``step-*`` folder (a folder of
another kind) still resolves when given as ``run.resume_from``."""
import torch

from mmgrpo.utils.checkpoint import CheckpointManager

from .conftest import make_trainer


def test_epoch_manager_lists_only_its_own_folders_and_resolves_a_folder_of_another_kind(tmp_path):
    halted = CheckpointManager(tmp_path / "halted", keep_last=None, keep_best=False)  # step-* (optimizer steps)
    for n in (1, 2):
        halted.save(n, {"x": torch.tensor([n])})
    mgr = CheckpointManager(tmp_path / "checkpoints", keep_last=2, keep_best=False, prefix="epoch")
    assert mgr.latest_valid() is None and mgr.resolve("auto") is None
    assert mgr.resolve(str(tmp_path / "halted")).name == "step-00000002"  # the newest of that folder
    for n in (1, 2, 3):
        mgr.save(n, {"x": torch.tensor([n])})
    assert [p.name for _, p in mgr.list_checkpoints()] == ["epoch-00000002", "epoch-00000003"]  # keep_last=2
    (tmp_path / "checkpoints" / "step-00000009").mkdir()  # not a checkpoint of this manager: ignored
    assert mgr.latest_valid().name == "epoch-00000003"


def test_trainer_writes_epoch_folders(tmp_path):
    ov = {"run.keep_last": 1, "run.keep_best": "false", "sample.cfg": "false", "run.num_epochs": 2}
    tr = make_trainer("sd3", "fast", tmp_path, **ov)
    try:
        tr.train()
    finally:
        tr.close()
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["epoch-00000002"]
