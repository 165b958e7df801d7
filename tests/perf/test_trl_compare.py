"""eval/perf/trl_compare.py (issue #42): each ``ours*`` worker is what it is called, read from what its sampling
actually computed (vision-tower patches and LLM tokens counted by forward hooks), not from a config flag.

Before issue #42 ``ours_naive`` built its rollout backend without ``shared_prefix`` whenever the setting was false,
so the backend's default (shared) ran: "naive" sampling prefilled each prompt once.  One real training step of each
worker's trainer on the tiny model (B=1 prompt, G=2, 2 new tokens; a few seconds)."""
from __future__ import annotations

import importlib
import os
import sys

import pytest

PERF = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "eval", "perf")


@pytest.fixture(scope="module")
def tc():
    if PERF not in sys.path:
        sys.path.insert(0, PERF)
    return importlib.import_module("trl_compare")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tc):
    import common

    d = tmp_path_factory.mktemp("trl_compare") / "tiny"
    common.save_bench_vlm(str(d), "tiny")
    return str(d)


@pytest.mark.parametrize("name", ["ours", "ours_naive"])
def test_worker_samples_as_named(tc, model_dir, name):
    torch = pytest.importorskip("torch")
    n = torch.get_num_threads()
    args = tc.parse_args(["--smoke", "--B", "1", "--G", "2", "--T", "2", "--image-size", "56",
                          "--model-dir", model_dir])
    try:
        tr, backend, probe, out_dir = tc.build_ours(args, grouped=name == "ours")
        patches = tc.count_vision_patches(tr.policy.model)
        rep = tc.ours_steps(tr, backend, probe, patches, 1)
    finally:
        torch.set_num_threads(n)
    # 56x56 image -> 4x4 patches of 14 px = 16 patches; prompt = chat template + 4 merged image tokens + text
    assert rep["patches_per_prompt"] == 16 and rep["completion_tokens"] == 2
    P = rep["prompt_tokens"]
    if name == "ours":  # one prefill of the prompt, then one decode step of the 2 rows
        assert rep["sampling_vision_patches"] == 16 and rep["sampling_llm_tokens"] == P + 2
        assert rep["logprob_impl"] == "prefix_group"
    else:  # the prompt repeated G=2 times: 2 vision passes, 2 prefills
        assert rep["sampling_vision_patches"] == 32 and rep["sampling_llm_tokens"] == 2 * P + 2
        assert rep["logprob_impl"] == "naive" and rep["shared_prefix"] is False
    work = tc.check_sampling(name, rep, B=1, G=2)
    assert work == {"prompt_encodings": 1.0 if name == "ours" else 2.0,
                    "prompt_prefills": 1.0 if name == "ours" else 2.0}
    # the same counts under the other name are refused
    with pytest.raises(SystemExit, match="shares the prompt prefix" if name == "ours" else "repeats the prompt"):
        tc.check_sampling("ours_naive" if name == "ours" else "ours", rep, B=1, G=2)


def test_sampling_work_by_hand(tc):
    """B=2 prompts of P=100 tokens, 256 patches each, G=4, T=10: shared = 2 encodings and 2*100 + 8*9 LLM
    tokens; repeated = 8 and 8*100 + 8*9."""
    shared = {"completion_tokens": 10, "prompt_tokens": 100, "patches_per_prompt": 256,
              "sampling_vision_patches": 512, "sampling_llm_tokens": 200 + 72}
    repeated = dict(shared, sampling_vision_patches=2048, sampling_llm_tokens=800 + 72)
    assert tc.sampling_work(shared, 2, 4) == {"prompt_encodings": 2.0, "prompt_prefills": 2.0}
    assert tc.sampling_work(repeated, 2, 4) == {"prompt_encodings": 8.0, "prompt_prefills": 8.0}
    tc.check_sampling("trl", repeated, 2, 4)
    with pytest.raises(SystemExit, match="worker trl shares the prompt prefix"):
        tc.check_sampling("trl", shared, 2, 4)
    # a vision tower shared but the LLM prompt repeated is caught too
    with pytest.raises(SystemExit):
        tc.check_sampling("ours", dict(shared, sampling_llm_tokens=800 + 72), 2, 4)


@pytest.mark.slow
def test_the_run_prints_its_operating_point_and_target(tc, model_dir, tmp_path, capsys):
    """The whole harness on the tiny model (issue #42): each worker's sampling is checked, the ratio's operating
    point is printed and kept in the JSON, the target is restated at its own operating point, and the headline is
    the last line."""
    import json
    import re

    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    n = torch.get_num_threads()
    try:
        res = tc.main(["--smoke", "--B", "1", "--G", "2", "--T", "2", "--image-size", "56", "--model-dir", model_dir,
                       "--json", str(tmp_path / "r.json")])
    finally:
        torch.set_num_threads(n)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert re.fullmatch(r"trl_speedup=\d+\.\d\d", lines[-1])
    op = res["operating_point"]
    assert f"operating point: {op['text']}" in lines
    assert (op["new_tokens"], op["B"], op["G"], op["prompt_tokens"]) == (2, 1, 2, res["prompt_tokens"])
    assert op["media_tokens"] == 4 and "tiny Qwen2.5-VL (hidden 64, 2 layers" in op["text"]
    assert any(ln.startswith(f"target (CPU): trl_speedup >= {tc.TARGET_SPEEDUP} at {tc.TARGET_NEW_TOKENS} new tokens; "
                             f"this run: ") and ln.endswith(" at 2") for ln in lines)
    assert json.loads((tmp_path / "r.json").read_text())["operating_point"] == op
    assert res["sampling_work"]["ours"]["prompt_prefills"] == 1.0 and res["sampling_work"]["trl"]["prompt_prefills"] == 2.0
