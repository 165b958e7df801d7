"""The synthetic captioning task (mmgrpo.synthetic.caption) and the qa prompt / format it trains through."""
import numpy as np

from mmgrpo.synthetic import caption as cap
from mmgrpo.synthetic.shapes import BACKGROUND, COLOURS


def test_samples_are_deterministic_balanced_and_render_their_truth(tmp_path):
    a, b = cap.make_samples(36, "train", 0), cap.make_samples(36, "train", 0)
    assert [s for _, s in a] == [s for _, s in b]
    assert [s for _, s in a] != [s for _, s in cap.make_samples(36, "val", 0)]
    classes = [(s["meta"]["colour"], s["meta"]["shape"]) for _, s in a]
    assert len(set(classes)) == 18 and all(classes.count(c) == 2 for c in set(classes))
    content, s = a[0]
    img = cap.render(content)
    assert s["answer"] == f"a {s['meta']['colour']} {s['meta']['shape']}" and s["meta"]["problem_type"] == "free-form"
    # only the background and the shape's colour, the shape's pixels inside its box
    colours = {tuple(p) for p in img.reshape(-1, 3)}
    assert colours == {BACKGROUND, COLOURS[s["meta"]["colour"]]}
    x, y = content["xy"]
    side = content["side"]
    mask = np.any(img != BACKGROUND, axis=-1)
    assert mask[y:y + side, x:x + side].sum() == mask.sum() > 0
    path = cap.write_split(str(tmp_path), "val", 3, 0)
    rows = cap.load_split(path)
    assert len(rows) == 3 and rows[0]["image"].endswith("images/val_00000.png")


def test_verifier_by_hand():
    ok = cap.caption_correct
    assert ok("<answer>a red circle</answer>", "red", "circle")
    assert ok("The circle is RED.", "red", "circle")  # no answer block: the whole text
    assert not ok("<answer>a red circle</answer> blue square", "blue", "square")  # the block decides
    assert not ok("<answer>a red and blue circle</answer>", "red", "circle")  # another colour
    assert not ok("<answer>a red circle or square</answer>", "red", "circle")  # another shape
    assert not ok("<answer>a reddish circle</answer>", "red", "circle")  # whole words only
    assert not ok("<answer></answer>", "red", "circle") and not ok(None, "red", "circle")
    r = cap.verifier_reward()
    s = {"meta": {"colour": "green", "shape": "square"}}
    assert r(["<answer>green square</answer>", "<answer>green</answer>"], [s, s]) == [1.0, 0.0]


def test_judge_pairs_are_labelled_by_the_verifier_and_half_positive():
    pairs = cap.judge_pairs(400, "judge_train", 0)
    assert all(p["label"] == cap.caption_correct(p["answer"], p["colour"], p["shape"]) for p in pairs)
    assert all(p["label"] == 1 for p in pairs[::2])  # paraphrases of the truth
    assert sum(p["label"] for p in pairs[1::2]) == 0  # the wrong ones
    assert {p["answer"] for p in pairs} & {""}  # degenerate candidates occur


def test_qa_prompt_ground_truth_and_format():
    from mmgrpo.vlm.data.prompts import build_messages, format_ground_truth_answer
    from mmgrpo.vlm.rewards.format import well_formed

    s = dict(cap.make_samples(1, "val", 0)[0][1], image="x.png")
    msgs = build_messages(s, mode="no_think")
    assert msgs[-1]["content"][1]["text"] == "Describe the object in the image.\nAnswer in a few words."  # as written
    gt = format_ground_truth_answer(s, mode="no_think")
    assert gt == f"<answer>{s['answer']}</answer>" and well_formed(gt, "qa", mode="no_think")
    for bad in ("<answer></answer>", "<answer>  </answer>", "<answer>a\nb</answer>", "a red circle",
                "<answer>a <b> c</answer>"):
        assert not well_formed(bad, "qa", mode="no_think"), bad
