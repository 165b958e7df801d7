"""``train()`` called several times on one flow trainer object, as the VLM recipe's twin
(tests/trainer/test_train_calls.py): the first call resumes, later calls continue from the object's state (never
from the older checkpoint on disk), and a call after the run ended writes nothing (no checkpoint, no export). A call's
last epoch is not the run's: eval and the final checkpoint come at ``run.num_epochs`` only, as in the VLM recipe.
4 tiny epochs, 2 trainers (a few CPU seconds)."""
from flow_grpo.train.trainer import FlowGRPOTrainer

from .conftest import make_trainer

SMALL = {"data.groups_per_epoch": 1, "sample.batch_size": 2}  # one group of 2 per epoch


def _written(out):
    return sorted((str(p.relative_to(out)), p.stat().st_mtime_ns) for p in out.rglob("*")
                  if p.is_file() and ("checkpoints" in p.parts or "lora_final" in p.parts))


def test_train_resumes_once_per_object_and_continues(tmp_path, monkeypatch):
    make_trainer("sd3", "flow", tmp_path, **SMALL, **{"run.num_epochs": 1}).train()  # epoch 1: checkpoint, export
    resumes = []
    real = FlowGRPOTrainer.resume
    monkeypatch.setattr(FlowGRPOTrainer, "resume", lambda run: resumes.append(run.state.epoch) or real(run))
    tr = make_trainer("sd3", "flow", tmp_path, **SMALL, **{"run.num_epochs": 3, "run.resume_from": "auto"})
    assert len(tr.train(num_epochs=1)) == 1 and tr.state.epoch == 2 and resumes == [0]  # resumed at 1, one epoch
    ckpts = lambda: sorted(p.name for p in (tmp_path / "checkpoints").glob("epoch-*"))  # noqa: E731
    assert ckpts() == ["epoch-00000001"]  # still the newest on disk: a second resume would undo epoch 2
    assert len(tr.train(num_epochs=5)) == 1 and tr.state.epoch == 3 and resumes == [0]  # capped at run.num_epochs
    assert ckpts() == ["epoch-00000001", "epoch-00000003"]
    done = _written(tmp_path)
    # the run is over: another call takes no epoch and writes nothing
    assert tr.train() == [] and tr.state.epoch == 3 and _written(tmp_path) == done and resumes == [0]
