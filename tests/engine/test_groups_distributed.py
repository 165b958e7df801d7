"""Groups split across two real processes (gloo) give the single-process advantages and loss."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmgrpo.core import group_advantages

sys.path.insert(0, str(Path(__file__).parent))
from _groups_worker import make_batch, token_mean_loss  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(180)
def test_two_processes_match_single_process(tmp_path):
    out = tmp_path / "res"
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--nnodes", "1",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
           str(Path(__file__).parent / "_groups_worker.py"), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0 = json.loads(Path(f"{out}.0").read_text())
    r1 = json.loads(Path(f"{out}.1").read_text())
    assert r0["world"] == r1["world"] == 2

    rewards, gids, logp, old, mask = make_batch()
    single = group_advantages(rewards, gids)
    assert torch.tensor(r0["adv"] + r1["adv"]).equal(single.advantages)  # bit-identical
    assert r0["zero_frac"] == r1["zero_frac"] == pytest.approx(single.zero_std_fraction)
    assert r0["num_groups"] == single.num_groups == 4
    full_loss = token_mean_loss(logp, old, single.advantages.double(), mask).item()
    # token_mean with the global token count: per-process losses add up to the single-process loss
    assert r0["loss"] + r1["loss"] == pytest.approx(full_loss, rel=1e-12, abs=1e-15)
