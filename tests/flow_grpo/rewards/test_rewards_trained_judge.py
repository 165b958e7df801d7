"""The trained-judge loop (issue #40 item 4): the pair data (verified by the renderer's own check), the judge's
verifiable reward (values by hand), the flow scorer's chat (equal to what ``mmgrpo train`` renders for a judge
sample) and its wiring (a scripted judge whose verdicts are worked out by hand from the composed pixels)."""
import json
import random

import numpy as np
import pytest

from flow_grpo.rewards.trained_judge import PairVerdictReward, TrainedPairJudge, judge_messages
from mmgrpo.synthetic import judge_pairs as jp
from mmgrpo.synthetic import t2i


def test_pairs_are_verified_balanced_and_split_by_caption(tmp_path):
    path = jp.write_split(str(tmp_path), "heldout", 12, seed=3)
    rows = [json.loads(l) for l in open(path)]
    held = {m["prompt"] for m in t2i.all_prompts("heldout")}
    assert sorted(r["answer"] for r in rows) == ["1"] * 6 + ["2"] * 6
    from PIL import Image

    for r in rows:
        assert r["meta"]["caption"] in held and r["task"] == "qa" and r["meta"]["problem_type"] == "free-form"
        im = np.asarray(Image.open(r["image"]).convert("RGB"))
        assert im.shape == (32, 32 + jp.GAP + 32, 3) and (im[:, 32:32 + jp.GAP] == jp.GAP_GREY).all()
        left, right = im[:, :32], im[:, 32 + jp.GAP:]
        meta = t2i.parse_prompt(r["meta"]["caption"])
        good, bad = (left, right) if r["answer"] == "1" else (right, left)
        assert t2i.verify(good, meta)["correct"] and not t2i.verify(bad, meta)["correct"]


def test_perturb_changes_what_it_says():
    meta = t2i.parse_prompt("three red squares")
    rng = random.Random(0)
    seen = set()
    for _ in range(40):
        new, kind = jp.perturb(meta, rng)
        e0, e = meta["include"][0], new["include"][0]
        seen.add(kind)
        changed = {k for k in ("class", "color", "count") if e.get(k) != e0.get(k)}
        assert changed == ({"class"} if kind == "shape" else {"color"} if kind == "color" else
                           {"count"} if kind == "count" else set())
        assert len(new["include"]) == (2 if kind == "extra" else 1)
    assert seen == {"shape", "color", "count", "extra"}
    with pytest.raises(ValueError, match="one-entry"):
        jp.perturb(t2i.parse_prompt("a red circle and a blue square"), rng)


def test_pair_verdict_reward_by_hand():
    r = PairVerdictReward()
    texts = ["<answer>Image 1 is better</answer>", "<think>x</think><answer>Image 2 is better</answer>",
             "<answer>Image 2 is better</answer>", "<answer>Image 1 is better, Image 2 is better</answer>",
             "Image 1", "<answer>Image 1 is better"]
    samples = [{"id": str(i), "answer": a} for i, a in enumerate("121111")]
    out = r(texts, samples)
    assert out["score"] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert out["failed"] == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert out["picks_1"] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert r.stats == {"ok": 3, "ambiguous": 1, "no_answer": 1, "truncated": 1}
    with pytest.raises(ValueError, match="'1' or '2'"):
        r(["<answer>Image 1 is better</answer>"], [{"id": "x", "answer": "A"}])


def test_scorer_chat_is_the_trainers_chat(tmp_path):
    """The flow scorer's prompt text equals the VLM trainer's rendering of a judge sample (TaskAdapter)."""
    from mmgrpo.vlm.config import DataConfig
    from mmgrpo.vlm.data.schema import Sample
    from mmgrpo.vlm.data.task import TaskAdapter
    from mmgrpo.vlm.models.adapters import get_adapter
    from mmgrpo.vlm.models.tiny import build_tiny_model

    _, proc = build_tiny_model("qwen2_5_vl", seed=0)
    row = json.loads(open(jp.write_split(str(tmp_path), "train", 1, seed=0)).readline())
    ta = TaskAdapter(proc, get_adapter("qwen2_5_vl"), DataConfig(task="mcq", prompt_mode="no_think"))
    pp = ta.prepare(Sample.from_dict(row))
    mine = proc.apply_chat_template(judge_messages(row["meta"]["caption"]), add_generation_prompt=True,
                                    tokenize=False)
    assert mine == pp.text and jp.query(row["meta"]["caption"]) in mine


def test_trained_judge_composes_a_left_and_reads_the_verdict():
    """Scripted judge: it answers 'Image 1' when the composite's left half is brighter; a win rate over a group
    of flat images is then the brightness rank, worked out by hand."""
    from mmgrpo.vlm.models.tiny import build_tiny_model
    from flow_grpo.rewards.base import PairwisePreferenceReward

    model, proc = build_tiny_model("qwen2_5_vl", seed=0)
    judge = TrainedPairJudge(model=model, processor=proc)
    seen = []

    def generate_batch(conversations, images):
        texts = []
        for conv, (im,) in zip(conversations, images):
            a = np.asarray(im)
            seen.append(a.shape)
            left, right = a[:, :32].mean(), a[:, 32 + jp.GAP:].mean()
            texts.append("no verdict" if left == right else f"<answer>Image {1 if left > right else 2} is better</answer>")
        return texts, [False] * len(texts)

    judge.judge.generate_batch = generate_batch
    imgs = np.stack([np.full((32, 32, 3), v, dtype=np.uint8) for v in (200, 50, 120, 120)])
    wr = PairwisePreferenceReward(judge, name="wr", symmetric=True)
    out = wr(imgs, ["a circle"] * 4, [{"group_id": 0}] * 4)
    # 0 beats all; 1 loses all; 2 and 3 beat 1, lose to 0, tie (unreadable) with each other
    np.testing.assert_allclose(out["wr"].numpy(), [1.0, 0.0, 1.5 / 3, 1.5 / 3])
    assert out["wr/judge_failures"].tolist() == [0, 0, 2, 2]
    assert set(seen) == {(32, 68, 3)} and len(seen) == 12  # 6 pairs x 2 orders, each one composite image
    with pytest.raises(ValueError, match="uint8"):
        judge(imgs.astype(np.float32), imgs, ["a"] * 4)


@pytest.mark.extended  # slow script/benchmark check: bash scripts/test.sh --full
def test_judge_loop_smoke(tmp_path):
    """scripts/judge_loop.py --smoke: data, SFT base, GRPO through the trainer, both judges saved as loadable
    folders (model + processor) and measured on the held-out pairs."""
    import subprocess
    import sys

    out = tmp_path / "jl"
    r = subprocess.run([sys.executable, "scripts/judge_loop.py", "--out", str(out), "--smoke", "--stage", "judge"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((out / "judge.json").read_text())
    for k in ("base", "grpo"):
        h = res[k]["heldout"]
        assert h["n_pairs"] == 8 and 0.0 <= h["accuracy"] <= 1.0
        assert (out / f"judge_{k}" / "processor_config.json").exists()
    assert "| SFT base (untrained) |" in (out / "results.md").read_text()
