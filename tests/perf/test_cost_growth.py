"""Smoke test of eval/perf/cost_growth.py (issue #18 item 5): the smallest grid runs, pairs naive and ours in every
cell, writes its JSON and both plots, and prints its headline last."""
from __future__ import annotations

import importlib
import json
import os
import statistics
import sys

import pytest

PERF = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "eval", "perf")


@pytest.mark.extended  # slow script/benchmark check: bash scripts/test.sh --full
def test_cost_growth_smoke(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    pytest.importorskip("matplotlib")
    n = torch.get_num_threads()
    if PERF not in sys.path:
        sys.path.insert(0, PERF)
    cg = importlib.import_module("cost_growth")
    try:
        out = cg.main(["--smoke", "--G", "2", "--out-dir", str(tmp_path), "--model-dir", str(tmp_path / "vlm")])
    finally:
        torch.set_num_threads(n)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    last = lines[-1]
    assert last.startswith("cost_growth_max_speedup=")
    res = json.loads((tmp_path / "cost_growth_smoke.json").read_text())
    assert (tmp_path / "cost_growth_vlm_smoke.png").stat().st_size > 1000
    assert (tmp_path / "cost_growth_flow_smoke.png").stat().st_size > 1000
    cell = res["vlm"]["cells"]["G2_tok128"]
    assert cell["video_tokens"] == 128 and cell["prompt_tokens"] > 128
    for side in ("naive", "ours"):
        assert len(cell[f"{side}_wall_s"]) == len(cell[f"{side}_peak_mb"]) == 1
        assert min(cell[f"{side}_wall_s"] + cell[f"{side}_cpu_s"]) > 0
    paired = [a / b for a, b in zip(cell["naive_wall_s"], cell["ours_wall_s"])]
    assert cell["speedup"] == pytest.approx(statistics.median(paired))
    assert float(last.split("=")[1]) == pytest.approx(out["extra_keys"]["cost_growth_max_speedup"], abs=0.006)
    # the headline's operating point is the best cell's, printed just before it (issue #42)
    best = max(res["vlm"]["cells"].values(), key=lambda d: d["speedup"])
    op = res["operating_point"]
    assert lines[-2] == f"operating point: {op['text']}"
    assert (op["G"], op["new_tokens"], op["prompt_tokens"]) == (best["G"], best["T"], best["prompt_tokens"])
    assert f"prompt {best['prompt_tokens']} tokens ({best['video_tokens']} video)" in op["text"]
    # the completion-length sweep (issue #42): G=2, T in {2, 4} at the smoke prompt; each cell paired, with the
    # loss's token-count ratio G(P+T) / (P+G(T-1)) computed from its own prompt length
    assert (tmp_path / "cost_growth_lengths_smoke.png").stat().st_size > 1000
    lens = res["lengths"]
    assert lens["G"] == 2 and lens["Ts"] == [2, 4] and set(lens["cells"]) == {"T2_tok128", "T4_tok128"}
    for T in (2, 4):
        c = lens["cells"][f"T{T}_tok128"]
        assert c["T"] == T and c["G"] == 2 and c["prompt_tokens"] == cell["prompt_tokens"]
        P = c["prompt_tokens"]
        assert c["loss_token_ratio"] == pytest.approx(2 * (P + T) / (P + 2 * (T - 1)))
        assert c["speedup_cpu"] == pytest.approx(c["naive_cpu_s"][0] / c["ours_cpu_s"][0])
    assert lens["size"]["hidden"] == 64 and lens["size"]["layers"] == 2
    flow = res["flow"]["cells"]
    assert set(flow) == {"K2_px32", "K3_px32"} and flow["K2_px32"]["vs_base_median"] == pytest.approx(1.0)
    assert all(d["wall_median_s"] > 0 for d in flow.values())
