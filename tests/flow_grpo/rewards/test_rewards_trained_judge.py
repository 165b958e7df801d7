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
        left, right = jp.unstrip(np.asarray(Image.open(r["meta"]["pair"]).convert("RGB")))
        assert left.shape == right.shape == (32, 32, 3)
        meta = t2i.parse_prompt(r["meta"]["caption"])
        good, bad = (left, right) if r["answer"] == "1" else (right, left)
        assert t2i.verify(good, meta)["correct"] and not t2i.verify(bad, meta)["correct"]
        # the composite the judge sees is compose() of the two images; the tags are what each image shows
        im = np.asarray(Image.open(r["image"]).convert("RGB"))
        np.testing.assert_array_equal(im, jp.compose(left, right))
        assert r["meta"]["tags"] == [jp.image_tags(left), jp.image_tags(right)]
        e = meta["include"][0]
        key = f"{e['color']} {e['class']}" if e.get("color") else e["class"]
        assert r["meta"]["tags"][int(r["answer"]) - 1][jp.TAG_HEADS.index(key)] == e["count"]


def test_compose_upscales_and_veils_image_2_by_hand():
    a = np.full((32, 32, 3), 255, dtype=np.uint8)
    a[0:4, 0:4] = (220, 40, 40)  # one red 4 x 4 block in the top-left corner
    c = jp.compose(a, a)
    assert c.shape == (112, 252, 3) == jp.COMPOSITE_HW + (3,)
    # nearest neighbour x 3.5: source pixel i covers output columns floor(3.5 i) .. ; the block ends at 14
    assert (c[:14, :14] == (220, 40, 40)).all() and (c[14:, :112] == 255).all() and (c[:14, 14:112] == 255).all()
    assert (c[:, 112:140] == jp.GAP_GREY).all()
    # Image 2 = 0.75 x + 0.25 x 128: white -> 223.25 -> 223, red (220, 40, 40) -> (197, 62, 62)
    assert (c[:14, 140:154] == (197, 62, 62)).all() and (c[14:, 140:] == 223).all()
    s = jp.pair_strip(a, a)
    assert s.shape == (32, 32 + jp.GAP + 32, 3)
    l, r = jp.unstrip(s)
    np.testing.assert_array_equal(l, a) and np.testing.assert_array_equal(r, a)
    with pytest.raises(ValueError, match="square"):
        jp.compose(np.zeros((32, 30, 3), np.uint8), np.zeros((32, 30, 3), np.uint8))


def _tags(**counts):
    t = [0] * len(jp.TAG_HEADS)
    for k, n in counts.items():
        t[jp.TAG_HEADS.index(k.replace("_", " "))] = n
    return t


def test_describe_in_the_captions_words_by_hand():
    t = _tags(red_square=2, blue_circle=1)
    assert jp.describe(t, "three red squares") == "two red squares and a blue circle"
    assert jp.describe(t, "a blue circle") == "a blue circle and two red squares"
    assert jp.describe(t, "a square") == "two squares and a circle"  # no colour in the caption: none said
    assert jp.describe(_tags(red_circle=1, green_circle=2), "a circle") == "three circles"
    assert jp.describe(_tags(), "a circle") == "nothing"
    assert jp.describe(_tags(yellow_triangle=4), "two yellow triangles") == "four yellow triangles"
    assert (jp.think_text("a red square", [_tags(red_square=1), _tags(red_circle=1)])
            == "Image 1: a red square. Image 2: a red circle.")
    two = [_tags(red_square=1), _tags(red_square=2, blue_circle=1)]
    assert (jp.think_text("a red square", two, "describe_mark")
            == "Image 1: a red square (match). Image 2: two red squares and a blue circle (no match).")
    assert (jp.think_text("a red square", two, "describe_check")
            == "Image 1: a+ red+ square+ (match). Image 2: two- red+ squares- and- a+ blue- circle- (no match).")
    with pytest.raises(ValueError, match="think style"):
        jp.think_text("a red square", two, "long")
    assert jp.answer_text(2, "x") == "<think>x</think><answer>Image 2 is better</answer>"
    with pytest.raises(ValueError, match="one-entry"):
        jp.describe(t, "a red circle and a blue square")


def test_image_tags_count_what_is_drawn():
    img = t2i.render(t2i.parse_prompt("three blue triangles"), size=32, seed=1)
    t = jp.image_tags(img)
    assert t == _tags(triangle=3, blue=3, blue_triangle=3)


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
    # strict (default): the answer block once, nothing after it; the lenient reader accepts the repeats
    rep = ["<answer>Image 1 is better</answer><answer>Image 1 is better</answer>",
           "<answer>Image 1 is better</answer> and more", " <think> a </think>\n<answer> Image 1 is better </answer>\n"]
    one = [{"id": "r", "answer": "1"}] * 3
    strict, lenient = PairVerdictReward(), PairVerdictReward(strict=False)
    assert strict(rep, one)["score"] == [0.0, 0.0, 1.0] and strict.stats == {"not_strict": 2, "ok": 1}
    assert lenient(rep, one)["score"] == [1.0, 1.0, 1.0]


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
    # a judge trained with the caption before the image: its folder says so and the scorer follows
    ta = TaskAdapter(proc, get_adapter("qwen2_5_vl"), DataConfig(task="mcq", prompt_mode="no_think",
                                                                 query_position="before"))
    before = ta.prepare(Sample.from_dict(row)).text
    (tmp_path / "judge").mkdir()
    (tmp_path / "judge" / "judge_config.json").write_text('{"query_position": "before", "max_new_tokens": 40}')
    from flow_grpo.rewards.trained_judge import read_judge_config

    cfg = read_judge_config(str(tmp_path / "judge"))
    assert cfg == {"query_position": "before", "max_new_tokens": 40}
    mine = proc.apply_chat_template(judge_messages(row["meta"]["caption"], cfg["query_position"]),
                                    add_generation_prompt=True, tokenize=False)
    assert mine == before != pp.text and mine.index("Caption") < mine.index("<|vision_start|>")
    (tmp_path / "judge" / "judge_config.json").write_text('{"query_postion": "before"}')
    with pytest.raises(ValueError, match="unknown keys"):
        read_judge_config(str(tmp_path / "judge"))


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
            left, right = a[:, :jp.CELL].mean(), (a[:, jp.CELL + jp.GAP:].mean() - 32) / 0.75  # undo the veil
            texts.append("no verdict" if left == right else f"<answer>Image {1 if left > right else 2} is better</answer>")
        return texts, [False] * len(texts)

    judge.judge.generate_batch = generate_batch
    imgs = np.stack([np.full((32, 32, 3), v, dtype=np.uint8) for v in (200, 50, 120, 120)])
    wr = PairwisePreferenceReward(judge, name="wr", symmetric=True)
    out = wr(imgs, ["a circle"] * 4, [{"group_id": 0}] * 4)
    # 0 beats all; 1 loses all; 2 and 3 beat 1, lose to 0, tie (unreadable) with each other
    np.testing.assert_allclose(out["wr"].numpy(), [1.0, 0.0, 1.5 / 3, 1.5 / 3])
    assert out["wr/judge_failures"].tolist() == [0, 0, 2, 2]
    assert set(seen) == {(112, 252, 3)} and len(seen) == 12  # 6 pairs x 2 orders, each one composite image
    with pytest.raises(ValueError, match="uint8"):
        judge(imgs.astype(np.float32), imgs, ["a"] * 4)


@pytest.mark.extended  # slow script/benchmark check: bash scripts/test.sh --full
def test_judge_loop_smoke(tmp_path):
    """scripts/judge_loop.py --smoke: data, SFT base, GRPO through the trainer, both judges saved as loadable
    folders (model + processor) and measured on the held-out pairs."""
    import subprocess
    import sys

    out = tmp_path / "jl"
    r = subprocess.run([sys.executable, "scripts/judge_loop.py", "--out", str(out), "--smoke", "--stage", "judge",
                        "--ship", str(tmp_path / "shipped")], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((out / "judge.json").read_text())
    for k in ("untrained", "sft", "grpo"):
        h = res[k]["heldout"]
        assert h["n_pairs"] == 8 and 0.0 <= h["accuracy"] <= 1.0
        assert (out / f"judge_{k}" / "processor_config.json").exists()
        assert json.loads((out / f"judge_{k}" / "judge_config.json").read_text())["query_position"] == "before"
    assert "vision_heldout" in res["sft"]["build"] and (out / "judge_tower" / "tower_report.json").exists()
    assert "| untrained (tower pre-trained, format-only SFT) |" in (out / "results.md").read_text()
    rep = json.loads((tmp_path / "shipped" / "judge_report.json").read_text())
    assert rep["args"]["smoke"] and set(rep["heldout"]) == {"untrained", "sft", "grpo"} and len(rep["heldout_head"]) == 8
    assert (tmp_path / "shipped" / "judge_config.json").exists() and (tmp_path / "shipped" / "config.json").exists()


def test_two_se_by_hand():
    from scripts.judge_loop import two_se

    # means 2 and 1; variances (ddof 1) 1 and 1, n 3 each: SE = sqrt(1/3 + 1/3) = 0.8165, 2 SE = 1.633
    assert two_se([1.0, 2.0, 3.0], [0.0, 1.0, 2.0]) == "+1.000 (2 SE 1.633: within)"
    assert two_se([3.0, 3.1, 2.9], [1.0, 1.1, 0.9]).endswith("exceeds)")
    assert two_se([1.0], [0.0, 1.0]) == "–"


SHIPPED = __import__("pathlib").Path(jp.__file__).resolve().parents[2] / "data" / "checkpoints" / "pair_judge"


@pytest.mark.skipif(not (SHIPPED / "config.json").exists(), reason="no shipped pair judge")
def test_shipped_pair_judge_is_current_and_judges(tmp_path):
    """The shipped judge (scripts/judge_loop.py --stage judge --ship data/checkpoints/pair_judge) was built on
    today's pair generator (its first held-out pairs regenerate), its report shows it far above the untrained
    judge, and it judges those pairs, each in both orders, through the flow reward's scorer."""
    from PIL import Image

    rep = json.loads((SHIPPED / "judge_report.json").read_text())
    assert rep["heldout"]["sft"]["accuracy"] >= 0.9 and rep["heldout"]["untrained"]["accuracy"] == 0.5
    assert rep["args"]["vision_steps"] > 0 and rep["args"]["think"] == "describe_check"
    head = rep["heldout_head"]
    # pair i depends on the seed and i only (the file order is shuffled afterwards): the first 8 of 300 = 8 of 8
    rows = sorted((json.loads(l) for l in open(jp.write_split(str(tmp_path), "heldout", len(head),
                                                                 seed=rep["args"]["seed"]))), key=lambda r: r["id"])
    assert [{"id": r["id"], "answer": r["answer"], "caption": r["meta"]["caption"], "tags": r["meta"]["tags"]}
            for r in rows[:len(head)]] == head, "stale pair judge: rebuild it"
    a, b, caps, want = [], [], [], []
    for r in rows[:len(head)]:
        x, y = jp.unstrip(np.asarray(Image.open(r["meta"]["pair"]).convert("RGB")))
        a += [x, y]
        b += [y, x]
        caps += [r["meta"]["caption"]] * 2
        want += [1.0, 0.0] if r["answer"] == "1" else [0.0, 1.0]
    out = TrainedPairJudge(str(SHIPPED))(np.stack(a), np.stack(b), caps)
    assert np.mean(np.asarray(out["pref"]) == np.asarray(want)) >= 0.8


def test_flow_run_without_reward_signal_is_recorded_not_fatal(tmp_path):
    """scripts/judge_loop.run_flow: exit status 4 with the trainer's 'nothing was trained' line (every group tied:
    a position-only judge in both orders) is a result (the policy stays the base), any other failure stops."""
    import sys

    from scripts.judge_loop import run_flow

    say = "print('flow_grpo: nothing was trained in 3 epoch(s)'); raise SystemExit({})"
    assert run_flow([sys.executable, "-c", say.format(4)], tmp_path / "a.log", tmp_path) is False
    assert (tmp_path / "nothing_trained.txt").read_text().startswith("flow_grpo: nothing was trained")
    assert run_flow([sys.executable, "-c", "print('ok')"], tmp_path / "b.log", tmp_path) is True
    with pytest.raises(SystemExit, match="failed"):
        run_flow([sys.executable, "-c", say.format(1)], tmp_path / "c.log", tmp_path)
