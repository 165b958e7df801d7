"""Smoke tests of the flow benchmarks (eval/perf): each runs in ``--smoke`` mode on the tiny model, prints its
ratio line last and writes its JSON; the runner parses ratio lines, records failures/timeouts/missing scripts and
never crashes. Benchmarks are not tests: these only check that they run and report sane, self-consistent output."""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import sys
import textwrap

import pytest

PERF = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "eval", "perf")
LINE = re.compile(r"^([a-z_]+)=(\d+\.\d\d)$")


def _load(name: str, alias: str | None = None):
    if PERF not in sys.path:
        sys.path.insert(0, PERF)
    if alias is None:
        return importlib.import_module(name)
    spec = importlib.util.spec_from_file_location(alias, os.path.join(PERF, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def torch_single_thread():
    torch = pytest.importorskip("torch")
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("module,name", [
    ("flow_rollout", "flow_rollout_overhead"),
    ("flow_train", "flow_train_overhead"),
    ("tp_completions", "tp_batched_speedup"),
])
def test_benchmark_smoke(module, name, tmp_path, capsys, torch_single_thread):
    mod = _load(module)
    out_json = tmp_path / "r.json"
    value = mod.main(["--smoke", "--json", str(out_json)])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    m = LINE.match(lines[-1])
    assert m is not None, f"last stdout line is not 'name=X.XX': {lines[-1]!r}"
    assert m.group(1) == name
    assert float(m.group(2)) == pytest.approx(value, abs=0.006)
    res = json.loads(out_json.read_text())
    assert res["name"] == name and res["value"] == pytest.approx(value, abs=1e-3)
    t = res["timings"]
    ratio_key = t["ratio"].split(" / ")
    num, den = t[f"{ratio_key[0]}_s"], t[f"{ratio_key[1]}_s"]
    assert len(num) == len(den) == res["config"]["reps"] >= 2
    assert all(x > 0 for x in num + den)
    # the headline is the median of the paired per-round ratios, recomputed here from the raw timings
    paired = sorted(a / b for a, b in zip(num, den))
    mid = len(paired) // 2
    med = paired[mid] if len(paired) % 2 else (paired[mid - 1] + paired[mid]) / 2
    assert value == pytest.approx(med, rel=1e-3)
    tc = res["timings_cpu"]  # the same calls' thread CPU time (cross-check)
    assert len(tc[f"{ratio_key[0]}_s"]) == len(num) and all(x > 0 for x in tc[f"{ratio_key[0]}_s"])
    assert res["model"]["model"] == "tiny" and res["model"]["transformer_params"] > 0
    assert res["machine"]["torch"]
    # the operating point is printed just before the ratio and kept in the JSON (issue #42)
    op = res["operating_point"]["text"]
    assert lines[-2] == f"operating point: {op}" and "tiny" in op and "thread" in op
    if module == "flow_rollout":
        assert res["ode_image_max_diff_uint8_vs_pipeline"] <= 1  # same model, sigmas and x_T as the pipeline
        assert res["config"]["recorded_transitions"] > 0
    if module == "flow_train":
        assert res["onpolicy_logprob_max_abs_diff"] == 0.0 and res["grad_norm_a"] > 0
        assert res["path"] == "trainer"  # A timed flow_grpo.train.steps.column_loss itself, not a copy of it
    if module == "tp_completions":
        assert res["rewards_max_abs_diff"] <= 1e-4
        assert res["work"]["model_calls_batched"] < res["work"]["model_calls_sequential"]


def test_flow_train_fails_loudly_when_the_trainer_path_breaks(monkeypatch, torch_single_thread):
    """A broken trainer path is an error (run.py then records it, value null), never a silent fallback."""
    mod = _load("flow_train")
    import flow_grpo.train.steps as steps

    def moved(run, *a, **k):  # what a refactor of the recipe does to the stand-in: an attribute it lacks
        return run.some_new_attribute

    monkeypatch.setattr(steps, "column_loss", moved)
    with pytest.raises(RuntimeError, match="trainer path of flow_train_overhead broke .*some_new_attribute"):
        mod.main(["--smoke"])


# ------------------------------------------------------------------------------------------------- runner
def test_parse_last_ratio():
    run = _load("run", alias="perf_run_under_test")
    assert run.parse_last_ratio("x=1\nfoo\nflow_train_overhead=1.07\n\n") == ("flow_train_overhead", 1.07)
    assert run.parse_last_ratio("a=2.5\nb = 3e-1\ntrailing text") == ("b", 0.3)
    assert run.parse_last_ratio("no ratio here\nk=v") is None
    assert run.parse_last_ratio("") is None


def _fake(folder, name, body):
    (folder / name).write_text(textwrap.dedent(body))


def test_runner_records_failures_without_crashing(tmp_path):
    run = _load("run", alias="perf_run_under_test")
    _fake(tmp_path, "flow_rollout.py", """
        import argparse, json
        p = argparse.ArgumentParser(); p.add_argument("--quick", action="store_true"); p.add_argument("--json")
        a = p.parse_args()
        json.dump({"machine": {"torch": "9.9"}, "timings": {"x": 1}}, open(a.json, "w"))
        print("flow_rollout_overhead=0.5")
        print("flow_rollout_overhead=1.04")
    """)
    _fake(tmp_path, "flow_train.py", "import sys\nprint('flow_train_overhead=1.0')\nsys.exit('boom')\n")
    _fake(tmp_path, "tp_completions.py", "import time\ntime.sleep(60)\n")
    _fake(tmp_path, "prefix_group.py", """
        import argparse
        p = argparse.ArgumentParser(); p.add_argument("--quick", action="store_true"); p.parse_args()
        print("prefix_group_speedup=3.25")
    """)  # no --json support: the runner reruns it without
    out_json = tmp_path / "perf.json"
    out = run.main(["--quick", "--folder", str(tmp_path), "--json", str(out_json), "--budget", "6",
                    "--min-timeout", "1.5"])
    saved = json.loads(out_json.read_text())
    for d in (out, saved):
        assert set(k for k, _ in run.BENCHMARKS) <= set(d)
        assert d["flow_rollout_overhead"] == 1.04
        assert d["prefix_group_speedup"] == 3.25
        assert d["flow_train_overhead"] is None and d["tp_batched_speedup"] is None and d["trl_speedup"] is None
    det = saved["details"]
    assert det["flow_rollout_overhead"]["result"]["timings"] == {"x": 1}
    assert saved["machine"]["torch"] == "9.9"
    assert "boom" in det["flow_train_overhead"]["error"]
    assert "timeout" in det["tp_batched_speedup"]["error"]
    assert "not present" in det["trl_speedup"]["error"]
    assert "--json" not in det["prefix_group_speedup"]["command"]
    assert "--quick" in det["prefix_group_speedup"]["command"]
    assert det["prefix_group_speedup"]["dropped_args"] == ["--json"]


def test_runner_only_rejects_unknown(tmp_path):
    run = _load("run", alias="perf_run_under_test")
    with pytest.raises(SystemExit):
        run.main(["--only", "nope", "--folder", str(tmp_path)])


@pytest.mark.parametrize("module,name", [("prefix_group", "prefix_group_speedup"),
                                         ("prefix_generate", "prefix_generate_speedup")])
def test_prefix_benchmark_prints_its_operating_point(module, name, tmp_path, capsys, torch_single_thread):
    """The prefix ratios (issue #42): the headline is the last line, the operating point the one before it, and
    both say the prompt (video tokens), new tokens, G and the model's width and depth the JSON records."""
    mod = _load(module)
    out = mod.main(["--smoke", "--json", str(tmp_path / "r.json")])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert LINE.match(lines[-1]) and lines[-1].startswith(f"{name}=")
    op = out["operating_point"]
    assert lines[-2] == f"operating point: {op['text']}"
    assert op["new_tokens"] in (8, 16) and op["G"] == 8 and op["hidden"] == 64 and op["layers"] == 2
    assert op["media_tokens"] > 0 and op["prompt_tokens"] > op["media_tokens"]
    assert f"prompt {op['prompt_tokens']} tokens ({op['media_tokens']} video)" in op["text"]
    assert json.loads((tmp_path / "r.json").read_text())["operating_point"] == op


def test_data_prefetch_reports_the_fraction_with_and_without_step_1(tmp_path, capsys, torch_single_thread):
    """``data_wait_fraction`` leaves step 1 out (nothing can be prefetched before it); the fraction counting it is
    printed and kept beside it (issue #42 item 4), with the operating point; the headline is the last line."""
    mod = _load("data_prefetch")
    out = mod.main(["--smoke", "--json", str(tmp_path / "r.json")])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert LINE.match(lines[-1]) and lines[-1].startswith("data_wait_fraction=")
    assert float(lines[-1].split("=")[1]) == pytest.approx(out["data_wait_fraction"], abs=0.006)
    ahead = out["prefetched"]
    assert lines[-2] == f"data_wait_fraction_incl_step1={ahead['fraction_all']:.2f}"
    assert out["extra_keys"] == {"data_wait_fraction_incl_step1": ahead["fraction_all"]}
    assert ahead["fraction_all"] >= ahead["fraction_after_first"]  # step 1 waits: nothing was prefetched yet
    op = out["operating_point"]
    assert f"| at {op['text']}" in lines[-3] and "data.prefetch=" in op["text"] and "3 steps" in op["text"]
    assert json.loads((tmp_path / "r.json").read_text())["operating_point"] == op
