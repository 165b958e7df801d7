"""A crafted checkpoint file never runs code: resume_from=auto refuses it with an error naming the file.

The attacker writes the whole ``step-*`` folder, manifest included (its sha256 entries match the crafted file), so
the manifest check passes; only loading with ``torch.load(weights_only=True)`` stops it.
"""
import hashlib
import json
import os
import shlex

import pytest
import torch

from mmgrpo.utils.checkpoint import UnsafeCheckpointError


class _Evil:
    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.target)}",)


def _craft(step_dir, filename, target):
    f = step_dir / filename
    torch.save({"state": _Evil(target)}, f)
    man = json.loads((step_dir / "manifest.json").read_text())
    man["files"][filename] = {"size": f.stat().st_size, "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
    (step_dir / "manifest.json").write_text(json.dumps(man))


def test_resume_auto_refuses_a_crafted_checkpoint_file(tmp_path, tiny_dirs, th):
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    model = tiny_dirs("qwen2_5_vl")
    args = ["data.task=mcq", "rollout.max_new_tokens=3", "run.resume_from=auto"]
    GRPOTrainer(th.make_cfg(tmp_path, model, *args, "run.max_steps=1"), samples=th.image_samples(2),
                reward_fn=th.text_reward).train()
    step = tmp_path / "run" / "checkpoints" / "step-00000001"
    target = tmp_path / "pwned"
    _craft(step, "scheduler.pt", target)
    tr = GRPOTrainer(th.make_cfg(tmp_path, model, *args), samples=th.image_samples(2), reward_fn=th.text_reward)
    with pytest.raises(UnsafeCheckpointError, match=f"{step / 'scheduler.pt'} refused: .*posix.system"):
        tr.train()
    assert not target.exists()


def test_resume_auto_refuses_a_crafted_sharded_state(tmp_path, tiny_dirs, th, craft_sharded_state):
    """A ``state/`` folder (torch.distributed.checkpoint) with a pickled non-tensor entry: DCP would read it with
    torch.load(weights_only=False) on resume, even in a single-process run. Refused, naming folder and entry."""
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    model = tiny_dirs("qwen2_5_vl")
    args = ["data.task=mcq", "rollout.max_new_tokens=3", "run.resume_from=auto"]
    first = GRPOTrainer(th.make_cfg(tmp_path, model, *args, "run.max_steps=1"), samples=th.image_samples(2),
                        reward_fn=th.text_reward)
    first.train()
    step = tmp_path / "run" / "checkpoints" / "step-00000001"
    target = tmp_path / "pwned"
    entry = craft_sharded_state(step, first.model, first.optimizer, target)
    tr = GRPOTrainer(th.make_cfg(tmp_path, model, *args), samples=th.image_samples(2), reward_fn=th.text_reward)
    with pytest.raises(UnsafeCheckpointError, match=f"{step / 'state'} refused: entry '{entry}' is a "
                                                    "BytesStorageMetadata item"):
        tr.train()
    assert not target.exists()


def test_resume_auto_refuses_a_rank_metadata_file(tmp_path, tiny_dirs, th, craft_sharded_state):
    """Issue 31 item 2 through the trainer: a ``state/`` whose ``.metadata`` is gone and whose ``__0.metadata`` is a
    pickle that would create a file (DCP falls back to it with plain ``pickle.load``). Refused, naming the file."""
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    model = tiny_dirs("qwen2_5_vl")
    args = ["data.task=mcq", "rollout.max_new_tokens=3", "run.resume_from=auto"]
    first = GRPOTrainer(th.make_cfg(tmp_path, model, *args, "run.max_steps=1"), samples=th.image_samples(2),
                        reward_fn=th.text_reward)
    first.train()
    step = tmp_path / "run" / "checkpoints" / "step-00000001"
    target = tmp_path / "pwned"
    name = craft_sharded_state(step, first.model, first.optimizer, target, how="rank_metadata")
    tr = GRPOTrainer(th.make_cfg(tmp_path, model, *args), samples=th.image_samples(2), reward_fn=th.text_reward)
    with pytest.raises(UnsafeCheckpointError, match=rf"{step / 'state'} refused: .*{name}"):
        tr.train()
    assert not target.exists()
