"""The GPU check (eval/gpu_check, scripts/gpu_check.sh) cannot rot: its dry run (CPU, tiny widths, every section)
runs here; the runner's isolation, budgets and deadline on stand-in sections; the MFU FLOP count by hand."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_flops_by_hand():
    from eval.gpu_check.common import vlm_step_flops

    kw = dict(n_layer_params=1000, n_vis_params=50, hidden=8, vocab=100, layers=2, attn_dim=8, prompt_tokens=10,
              rows=3, completion_len=4, vision_patches=20)
    shared = vlm_step_flops(shared_prefix=True, **kw)
    # prompt once + 3 x 4 completion tokens; pairs: 10*11/2 + 3 * (10*4 + 4*5/2)
    assert shared["tokens_llm"] == 22 and shared["attended_pairs"] == 55 + 3 * 50
    fwd = 2 * 1000 * 22 + 2 * 8 * 100 * 12 + 4 * 2 * 8 * 205
    assert shared["forward_llm"] == fwd and shared["forward_vision"] == 2 * 50 * 20
    assert shared["model_flops"] == 3 * fwd + 2000 and shared["lora_work_flops"] == 2 * fwd + 2000
    naive = vlm_step_flops(shared_prefix=False, **kw)
    assert naive["tokens_llm"] == 3 * 14 and naive["attended_pairs"] == 3 * 14 * 15 / 2


def _stand_ins(monkeypatch):
    from eval.gpu_check import run

    monkeypatch.setattr(run, "SECTIONS", (
        run.Section("a_ok", "selftest:ok", 30, 0, "succeeds"),
        run.Section("b_fails", "selftest:fails", 30, 0, "raises"),
        run.Section("c_hangs", "selftest:hangs", 600, 0, "hangs past the deadline"),
        run.Section("d_late", "selftest:ok", 30, 0, "no time left")))
    return run


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" not in f.read()
    except FileNotFoundError:
        return False


def test_runner_isolates_sections_and_keeps_the_deadline(tmp_path, monkeypatch, capsys):
    run = _stand_ins(monkeypatch)
    t0 = time.time()
    code = run.main([str(tmp_path / "out"), "--dry-run", "--isolate", "process", "--deadline", "8",
                     "--work", str(tmp_path / "work")])
    took = time.time() - t0
    r = json.loads((tmp_path / "out" / "report.json").read_text())
    s = r["sections"]
    assert code == 1 and took < 30  # the hang was killed at the deadline, not waited for
    assert s["a_ok"]["status"] == "ok" and s["a_ok"]["results"]["headline"] == {"value": 1.0}
    assert s["b_fails"]["status"] == "error" and "planned failure" in s["b_fails"]["error"]
    assert s["b_fails"]["results"]["partial"] == 1  # what it wrote before failing is kept
    assert s["c_hangs"]["status"] == "timeout" and s["c_hangs"]["results"]["partial"] == 2
    assert s["d_late"]["status"] == "skipped" and "deadline" in s["d_late"]["error"]
    time.sleep(0.5)
    assert not _alive(s["c_hangs"]["results"]["grandchild_pid"])  # the section's whole process group went
    assert (tmp_path / "out" / "summary.md").exists() and "gpu_check.log" in os.listdir(tmp_path / "out")
    assert not (tmp_path / "work").exists()  # scratch folder removed


def test_runner_rejects_unknown_sections_and_needs_cuda_without_dry_run(tmp_path):
    from eval.gpu_check import run

    with pytest.raises(SystemExit, match="unknown section"):
        run.main([str(tmp_path), "--dry-run", "--only", "nope"])
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="no CUDA device"):
            run.main([str(tmp_path)])


@pytest.mark.slow
def test_dry_run_every_section(tmp_path):
    """bash scripts/gpu_check.sh OUT --dry-run: every section on CPU at tiny widths (the same code as on the GPU)."""
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, TMPDIR=str(tmp_path))
    t0 = time.time()
    p = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), str(out), "--dry-run"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=1200)
    took = time.time() - t0
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:] + (out / "gpu_check.log").read_text()[-5000:]
    r = json.loads((out / "report.json").read_text())
    from eval.gpu_check.run import SECTIONS

    assert {k: v["status"] for k, v in r["sections"].items()} == {s.name: "ok" for s in SECTIONS}
    s = {k: v["results"] for k, v in r["sections"].items()}
    for mode in ("vlm_lora", "vlm_full"):
        st = s[mode]["steps"][-1]
        assert st["flops"]["model_flops"] > 0 and st["achieved_tflops"] > 0 and st["mfu"] is None  # no MFU on CPU
        assert {"generation", "old_ref_logprobs", "forward_backward", "optimizer"} <= set(st["phases_seconds"])
        assert st["generated_tokens"] == st["rows"] * st["completion_len"] or st["generated_tokens"] > 0
        assert st["planner"]["predicted_bytes"] > 0 and s[mode]["onpolicy"]["passed"]
    assert s["vlm_full"]["full_ft_with_fp32_masters"]["fits"]
    assert s["trl"]["headline"]["trl_over_ours"] > 0 and s["trl"]["ours"]["prompt_tokens"] == s["trl"]["trl"]["prompt_tokens"]
    assert s["flux_512"]["headline"]["rollout_overhead"] > 0 and s["flux_512"]["epochs"][0]["applied_steps"] == 1
    for k in ("sd3", "wan", "flux_1024"):
        assert s[k]["headline"]["samples_per_s"] > 0
    assert s["pytest_gpu"]["counts"].get("skipped", 0) >= 5 and s["pytest_gpu"]["counts"].get("failed", 0) == 0
    assert s["env"]["matmul"]["tflops"] > 0
    md = (out / "summary.md").read_text()
    assert "| figure |" in md and "dry run (not a GPU figure)" in md
    print(f"dry run: {took:.0f} s wall, load {os.getloadavg()[0]:.1f}")
