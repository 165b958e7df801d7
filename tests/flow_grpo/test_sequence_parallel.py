"""Sequence parallelism (Ulysses, diffusers' context-parallel hooks): on 2 gloo processes the velocity and an SDE
step's log-prob equal the one-process values bit for bit, and the LoRA gradients summed over the group equal the
one-process gradients within float tolerance, on the tiny Wan2.1 T2V and Wan2.2 A14B (both experts, steps on both
sides of the boundary). The launch (~1 min) is in _sp_worker.py."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from flow_grpo.models.sequence_parallel import enable_sequence_parallel

from .conftest import tiny_adapter

HERE = Path(__file__).parent


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_one(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--nnodes", "1", "--master_addr",
           "127.0.0.1", "--master_port", str(_port()), str(HERE / "_sp_worker.py"), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "result.json").read_text())
    assert set(res) == {"wan", "wan22"}
    for kind, r in res.items():
        assert r["velocity"] == 0.0 and r["log_prob"] == 0.0, (kind, r)
        assert r["grad"] <= 1e-6 * max(1.0, r["grad_scale"]) and r["grad_scale"] > 1e-3, (kind, r)
    assert res["wan22"]["n_params"] == 2 * res["wan"]["n_params"]  # both experts' LoRA got their gradients


@pytest.mark.parametrize("kind,kw,match", [
    ("hunyuan_video15", {"num_frames": 5}, "no context-parallel plan"),
    ("ltx2", {"num_frames": 5, "max_sequence_length": 16, "stg_blocks": [1]}, "not supported"),
])
def test_unsupported_kinds_are_refused(kind, kw, match):
    with pytest.raises(ValueError, match=match):
        enable_sequence_parallel(tiny_adapter(kind, **kw), 2)


def test_degree_and_group_errors():
    ad = tiny_adapter("wan", num_frames=5, max_sequence_length=16)
    with pytest.raises(ValueError, match=">= 2"):
        enable_sequence_parallel(ad, 1)
    with pytest.raises(RuntimeError, match="process group"):
        enable_sequence_parallel(ad, 2)
