"""The sharded checkpoint (``state/``, torch.distributed.checkpoint) resumes on another number of processes: FSDP2
weights, AdamW moments / step counts and EMA shadows written by 2 processes load bit for bit into 1 process
(sharded, and into a plain unsharded module) and written by 1 into 2; the next AdamW step then equals the one the
writer took. CPU, gloo, processes started by _reshard_worker.py."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("_reshard_worker.py")


def _run(mode, world, out):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, str(WORKER), mode, str(world), str(out)], env=env, capture_output=True,
                       text=True, timeout=150)
    assert r.returncode == 0, r.stderr[-3000:]


def _assert_equal(ref, got):
    for part in ("params", "ema", "after_step"):
        assert ref[part].keys() == got[part].keys()
        for n in ref[part]:
            assert torch.equal(ref[part][n], got[part][n]), (part, n)
    for n, st in ref["optim"].items():
        assert set(st) == {"step", "exp_avg", "exp_avg_sq"} and st.keys() == got["optim"][n].keys()
        for k in st:
            assert torch.equal(st[k], got["optim"][n][k]), (n, k)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("saved_by,loaded_by", [(2, 1), (1, 2)])
def test_sharded_checkpoint_resumes_on_another_process_count(tmp_path, saved_by, loaded_by):
    _run("save", saved_by, tmp_path)
    ref = torch.load(tmp_path / "ref.pt")
    assert (tmp_path / "ckpts" / "step-00000002" / "state" / ".metadata").is_file()
    assert ref["params"]["0.weight"].shape == (5, 4)  # the full weights (5 rows: uneven shards on 2 processes)
    from torch.distributed.checkpoint import FileSystemReader

    keys = set(FileSystemReader(str(tmp_path / "ckpts" / "step-00000002" / "state")).read_metadata()
               .state_dict_metadata)
    assert {"model.0.weight", "model.2.bias", "optim.0.weight.exp_avg", "extra.ema.0.weight"} <= keys
    assert not any(".0.bias" in k for k in keys)  # frozen: neither trained nor written
    _run("load", loaded_by, tmp_path)
    _assert_equal(ref, torch.load(tmp_path / f"got_{loaded_by}.pt"))
    if loaded_by == 1:  # also into a plain, unsharded module without a process group
        _assert_equal(ref, torch.load(tmp_path / "got_plain.pt"))
