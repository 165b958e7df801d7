"""eval/perf/logprob_memory.py in --smoke mode (two real subprocesses, ~10 s) and run.py's ``extra_keys``."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import textwrap

import pytest

PERF = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "eval", "perf")


def _load(name, alias):
    import sys

    if PERF not in sys.path:
        sys.path.insert(0, PERF)
    spec = importlib.util.spec_from_file_location(alias, os.path.join(PERF, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.extended  # slow script/benchmark check: bash scripts/test.sh --full
def test_logprob_memory_smoke(tmp_path, capsys):
    mod = _load("logprob_memory", "perf_logprob_memory_under_test")
    out_json = tmp_path / "r.json"
    value = mod.main(["--smoke", "--json", str(out_json), "--chunk", "32"])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    m = re.match(r"^logprob_memory_ratio=(\d+\.\d\d)$", lines[-1])
    assert m and abs(float(m.group(1)) - value) <= 0.006
    res = json.loads(out_json.read_text())
    assert res["config"]["vocab"] == 151_936 and res["config"]["chunk"] == 32
    assert res["extra_keys"]["logprob_grad_max_rel_diff"] <= 1e-5
    assert res["logprob_max_abs_diff"] <= 1e-6
    mb = res["extra_peak_mb"]
    assert mb["full"] > 0 and mb["chunked"] > 0 and value == mb["full"] / mb["chunked"]
    # 128 tokens in 4 chunks of 32: the full side holds several (128, V) fp32 tensors, the chunked side ~(32, V)
    assert value > 1.5
    # TRL 1.16's fused-head path ran too (issue #42): its log-probs, shifted by the mass of the vision ids it does
    # not suppress, are the full side's; its ratio is printed and lifted to run.py's top level
    trl = res["trl"]
    assert trl["outputs"] == ["log_probs", "entropy"] and mb["trl"] > 0
    assert trl["checked_against"] == "full"
    assert trl["logprob_max_abs_diff_after_suppression"] <= 1e-5 < trl["logprob_max_abs_diff"]
    vs_trl = res["extra_keys"]["logprob_memory_ratio_vs_trl"]
    assert vs_trl == mb["trl"] / mb["chunked"]
    assert f"logprob_memory_ratio_vs_trl={vs_trl:.2f}" in lines and res["baseline"] == "full-logit log-softmax"
    assert "hidden 64" in res["operating_point"]["text"] and "vocab 151,936" in res["operating_point"]["text"]


def test_runner_lifts_extra_keys(tmp_path):
    run = _load("run", "perf_run_extra_keys_under_test")
    (tmp_path / "logprob_memory.py").write_text(textwrap.dedent("""
        import argparse, json
        p = argparse.ArgumentParser(); p.add_argument("--quick", action="store_true"); p.add_argument("--json")
        a = p.parse_args()
        json.dump({"extra_keys": {"logprob_grad_max_rel_diff": 3e-7},
                   "operating_point": {"text": "8 completions x 512 tokens, hidden 128"}}, open(a.json, "w"))
        print("logprob_memory_ratio=12.5")
    """))
    out = run.main(["--quick", "--only", "logprob_memory_ratio", "--folder", str(tmp_path), "--budget", "20"])
    assert out["logprob_memory_ratio"] == 12.5 and out["logprob_grad_max_rel_diff"] == 3e-7
    # the ratio's operating point travels with it (issue #42)
    assert out["operating_points"] == {"logprob_memory_ratio": "8 completions x 512 tokens, hidden 128"}
