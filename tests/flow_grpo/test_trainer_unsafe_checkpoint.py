"""A crafted checkpoint file never runs code: flow_grpo's resume_from=auto refuses it, naming the file (the manifest
was rewritten to match, as whoever writes the folder can)."""
from flow_grpo import checkpoint
import hashlib
import json
import os
import shlex

import pytest
import torch

from mmgrpo.utils.checkpoint import UnsafeCheckpointError

from .conftest import make_trainer


class _Evil:
    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.target)}",)


def test_resume_auto_refuses_a_crafted_checkpoint_file(tmp_path):
    extra = {"run.resume_from": "auto", "run.save_every": 1}
    make_trainer("flux", "fast", tmp_path, **extra).train()
    step = tmp_path / "checkpoints" / "epoch-00000001"
    target = tmp_path / "pwned"
    f = step / "optimizer.pt"
    torch.save({"state": {}, "param_groups": [], "x": _Evil(target)}, f)
    man = json.loads((step / "manifest.json").read_text())
    man["files"]["optimizer.pt"] = {"size": f.stat().st_size, "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
    (step / "manifest.json").write_text(json.dumps(man))
    tr = make_trainer("flux", "fast", tmp_path, **{**extra, "run.num_epochs": 2})
    with pytest.raises(UnsafeCheckpointError, match=f"{f} refused: .*posix.system"):
        tr.train()
    tr.close()
    assert not target.exists()


def test_resume_auto_refuses_a_crafted_sharded_state(tmp_path, craft_sharded_state):
    """A ``state/`` folder (torch.distributed.checkpoint) with a pickled non-tensor entry: DCP would read it with
    torch.load(weights_only=False) on resume, even in a single-process run. Refused, naming folder and entry."""
    extra = {"run.resume_from": "auto", "run.save_every": 1}
    first = make_trainer("flux", "fast", tmp_path, **extra)
    first.train()
    first.close()
    step = tmp_path / "checkpoints" / "epoch-00000001"
    target = tmp_path / "pwned"
    entry = craft_sharded_state(step, first.model, first.optimizer, target, extra={"ema": checkpoint.ema_sharded(first.trained)})
    tr = make_trainer("flux", "fast", tmp_path, **{**extra, "run.num_epochs": 2})
    with pytest.raises(UnsafeCheckpointError, match=f"{step / 'state'} refused: entry '{entry}' is a "
                                                    "BytesStorageMetadata item"):
        tr.train()
    tr.close()
    assert not target.exists()


def test_resume_auto_refuses_a_rank_metadata_file(tmp_path, craft_sharded_state):
    """Issue 31 item 2 through the trainer: a ``state/`` whose ``.metadata`` is gone and whose ``__0.metadata`` is a
    pickle that would create a file (DCP falls back to it with plain ``pickle.load``). Refused, naming the file."""
    extra = {"run.resume_from": "auto", "run.save_every": 1}
    first = make_trainer("flux", "fast", tmp_path, **extra)
    first.train()
    first.close()
    step = tmp_path / "checkpoints" / "epoch-00000001"
    target = tmp_path / "pwned"
    name = craft_sharded_state(step, first.model, first.optimizer, target, extra={"ema": checkpoint.ema_sharded(first.trained)},
                               how="rank_metadata")
    tr = make_trainer("flux", "fast", tmp_path, **{**extra, "run.num_epochs": 2})
    with pytest.raises(UnsafeCheckpointError, match=rf"{step / 'state'} refused: .*{name}"):
        tr.train()
    tr.close()
    assert not target.exists()
