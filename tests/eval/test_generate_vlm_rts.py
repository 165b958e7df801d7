"""Video-RTS test-time sparse-to-dense frame scaling in eval/generate_vlm.py (tiny Qwen2.5-VL, synthetic mp4s).

* the loop alone, with a stub generator whose answers agree only from N frames: it stops exactly at N and the
  frame / call / token accounting is exact;
* the whole CLI path with the sampler monkeypatched the same way (the frames are the real decoded ones);
* one real tiny-model sampling run: the accounting is consistent with its own trace.
"""
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from eval import generate_vlm  # noqa: E402
from eval.generate_vlm import rts_agree, rts_loop, rts_pick, rts_schedule  # noqa: E402

torch.set_num_threads(1)
FAST = ["data.video_min_pixels=3136", "data.video_max_pixels=3136", "data.video_total_pixels=200704",
        "progress=false", "data.prompt_mode=no_think", "decoding.greedy=false", "decoding.max_new_tokens=4"]


def test_schedule_is_the_release_doubling():
    assert rts_schedule(32, 64, 2) == [32, 64]
    assert rts_schedule(32, 128, 2) == [32, 64, 128]
    assert rts_schedule(32, 100, 2) == [32, 64]  # 128 > cap: the release stops at 64
    assert rts_schedule(4, 4, 2) == [4]
    with pytest.raises(ValueError, match="min_frames"):
        rts_schedule(8, 4, 2)


def test_agreement_rules():
    assert rts_agree("mcq", [("B",), ("B",), ("B",)], 0.5)
    assert not rts_agree("mcq", [("B",), ("C",), ("B",)], 0.5)
    assert rts_agree("mcq", [None, None], 0.5)  # all unparsable: one unique answer, as the release
    assert not rts_agree("mcq", [("A",), None], 0.5)
    # tvg: pairwise IoU >= threshold. [0,10] vs [2,10]: 0.8; [0,10] vs [5,10]: 0.5; [2,10] vs [5,10]: 5/8
    assert rts_agree("tvg", [(0, 10), (2, 10), (5, 10)], 0.5)
    assert not rts_agree("tvg", [(0, 10), (2, 10), (5, 10)], 0.6)
    assert not rts_agree("tvg", [(0, 10), None], 0.0)
    assert rts_pick("mcq", [("C",), ("B",), ("B",), ("C",)], "majority") == 0  # tie → first seen
    assert rts_pick("mcq", [("C",), ("B",), ("B",)], "majority") == 1
    assert rts_pick("mcq", [("C",), ("B",), ("B",)], "first") == 0
    # tvg medoid: summed IoU 0.8+0.5, 0.8+0.625, 0.5+0.625 → index 1
    assert rts_pick("tvg", [(0, 10), (2, 10), (5, 10)], "majority") == 1


def _stub(agree_from: int, k: int, task: str = "mcq"):
    """prepare(n) -> fake prep with n frames and a 10*n-token prompt; draw -> k answers that all agree only when
    n >= agree_from; sample j has j+1 tokens."""
    calls = []

    def prepare(n):
        return SimpleNamespace(item={"input_ids": torch.zeros(1, 10 * n)}, clip=SimpleNamespace(num_frames=n))

    def draw(prep, r):
        n = prep.clip.num_frames
        calls.append(n)
        if task == "mcq":
            texts = ["<answer>B</answer>" if n >= agree_from else f"<answer>{'ABCD'[j % 4]}</answer>"
                     for j in range(k)]
        else:
            texts = [f"<answer>{2 + (0 if n >= agree_from else 3 * j)} to 8</answer>" for j in range(k)]
        return texts, [j + 1 for j in range(k)], [False] * k

    return prepare, draw, calls


@pytest.mark.parametrize("task", ["mcq", "tvg"])
def test_loop_stops_exactly_where_answers_agree(task):
    k = 3
    prepare, draw, calls = _stub(agree_from=16, k=k, task=task)
    prep, text, n_tok, trunc, acc = rts_loop(task, [4, 8, 16, 32], prepare, draw, threshold=0.5)
    assert calls == [4, 8, 16]  # 32 never generated
    assert acc["rts_frames"] == 16 and acc["rts_rounds"] == 3 and acc["rts_generate_calls"] == 3
    assert acc["rts_samples"] == 9 and acc["rts_agreed"] is True
    assert acc["rts_completion_tokens"] == 3 * (1 + 2 + 3)
    assert acc["rts_prompt_tokens"] == k * (40 + 80 + 160)
    assert [r["agreed"] for r in acc["rts_trace"]] == [False, False, True]
    assert text == ("<answer>B</answer>" if task == "mcq" else "<answer>2 to 8</answer>") and n_tok == 1


def test_loop_without_agreement_ends_at_the_cap():
    prepare, draw, calls = _stub(agree_from=10**6, k=4)
    _, text, _, _, acc = rts_loop("mcq", [4, 8], prepare, draw, threshold=0.5)
    assert calls == [4, 8] and acc["rts_frames"] == 8 and acc["rts_agreed"] is False
    assert text == "<answer>A</answer>"  # A, B, C, D: each once → the first


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from mmgrpo.vlm.synthetic.tvg import generate
    from mmgrpo.vlm.models.tiny import save_tiny_model

    root = tmp_path_factory.mktemp("rts")
    tiny = save_tiny_model(root / "tiny", "qwen2_5_vl")
    syn = generate(root / "syn", n_train=0, n_eval=2, seed=0)
    anns = [json.loads(line) for line in Path(syn["eval"]).read_text().splitlines() if line.strip()]
    return {"root": root, "tiny": tiny, "ann": syn["eval"], "anns": anns}


def _args(env, out, *extra):
    return [f"model={env['tiny']}", f"data.annotations={env['ann']}", f"out_dir={out}", "data.max_samples=2",
            "rts.enabled=true", "rts.min_frames=4", "rts.max_frames=16", "rts.num_samples=3", *extra, *FAST]


def test_cli_with_a_stub_sampler_stops_at_eight_frames(env, monkeypatch):
    seen = []

    def fake_draw(backend, params, prep, seeds):
        n = int(prep.clip.num_frames)  # the frames really decoded for this round
        seen.append(n)
        k = len(seeds)
        texts = ["<answer>1 to 4</answer>" if n >= 8 else f"<answer>{j * 3} to {j * 3 + 1}</answer>"
                 for j in range(k)]
        return texts, [2] * k, [False] * k

    monkeypatch.setattr(generate_vlm, "rts_draw", fake_draw)
    out = env["root"] / "stub"
    assert generate_vlm.main(_args(env, out)) == 0
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert seen == [4, 8, 4, 8]  # two items, each stopped at 8 frames; 16 never decoded
    for p in preds:
        assert p["output"] == "<answer>1 to 4</answer>" and p["num_frames"] == 8 and p["rts_frames"] == 8
        assert p["rts_rounds"] == 2 and p["rts_generate_calls"] == 2 and p["rts_samples"] == 6
        assert p["rts_completion_tokens"] == 12
        assert [r["frames"] for r in p["rts_trace"]] == [4, 8]
        assert p["rts_prompt_tokens"] == 3 * sum(r["prompt_tokens"] for r in p["rts_trace"])
        assert p["rts_trace"][1]["prompt_tokens"] > p["rts_trace"][0]["prompt_tokens"]  # more frames, more tokens
    m = json.loads((out / "metrics.json").read_text())
    rts = m["generation"]["rts"]
    assert rts["n"] == 2 and rts["mean_frames"] == 8 and rts["frames_histogram"] == {"8": 2}
    assert rts["total_generate_calls"] == 4 and rts["total_samples"] == 12 and rts["fraction_agreed"] == 1.0
    assert rts["total_completion_tokens"] == 24
    s = json.loads((out / "settings.json").read_text())
    assert s["rts"]["schedule"] == [4, 8, 16] and s["rts"]["num_samples"] == 3


def test_real_tiny_model_run_accounting(env, monkeypatch):
    """Real sampling; the random tiny model writes no <answer> block (all answers unparsable = agreement), so
    agreement is measured on the raw text here: its samples differ and every round of the schedule runs."""
    monkeypatch.setattr(generate_vlm, "rts_answer_key", lambda task, text: text)
    monkeypatch.setattr(generate_vlm, "_key_similarity", lambda task, a, b: float(a == b))
    out = env["root"] / "real"
    res = generate_vlm.run(_cfg(_args(env, out)))
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(preds) == 2
    for p in preds:
        tr = p["rts_trace"]
        assert [r["frames"] for r in tr] == [4, 8, 16]
        assert tr[0]["prompt_tokens"] < tr[1]["prompt_tokens"] < tr[2]["prompt_tokens"]
        assert p["rts_frames"] == tr[-1]["frames"] == p["num_frames"]
        assert p["rts_samples"] == 3 * p["rts_rounds"] and p["rts_generate_calls"] == p["rts_rounds"]
        assert p["rts_completion_tokens"] == sum(r["completion_tokens"] for r in tr)
        assert all(len(r["answers"]) == 3 for r in tr)
        assert tr[-1]["agreed"] or len(tr) == 3  # stopped on agreement or at the cap
        assert all(not r["agreed"] for r in tr[:-1])
    assert res["metrics"]["generation"]["rts"]["total_samples"] == sum(p["rts_samples"] for p in preds)


def _cfg(args):
    from mmgrpo.utils.config import load_config

    return load_config(generate_vlm.EvalVLMConfig, None, list(args))


def test_rts_needs_sampling(env, capsys):
    out = env["root"] / "bad"
    rc = generate_vlm.main(_args(env, out) + ["decoding.greedy=true"])
    assert rc != 0
    assert "decoding.greedy=false" in capsys.readouterr().err
