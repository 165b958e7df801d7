"""build_reward_fn: per-task rewards, weights, parse_failed, clip-relative time, NaN guard, errors."""
import math

import pytest
import torch

import mmgrpo.vlm.rewards.registry as registry
from mmgrpo.vlm.rewards import REWARDS, SampleError, build_reward_fn

TVG = {"id": "v1", "task": "tvg", "duration": 30.0, "spans": [[10.0, 20.0]]}


def test_tvg_rewards_and_total():
    fn = build_reward_fn(
        {"iou": 1.0, "format": 0.5, "iou_boundary": 0.0, "iou_gaussian": 0.0, "iou_threshold": 0.0}, "tvg"
    )
    comps = [
        "<think>ok</think><answer>10 to 20</answer>",  # exact
        "<think>ok</think><answer>15 to 25</answer>",  # IoU 5/15
        "no answer block 10 to 20",  # fallback off: parse failure
        "<answer>40 to 50</answer>",  # past the end: clamps to [30, 30] → 0
    ]
    out = fn(comps, [TVG] * 4)
    assert set(out) == {"iou", "format", "iou_boundary", "iou_gaussian", "iou_threshold", "total", "parse_failed"}
    assert all(v.shape == (4,) for v in out.values())
    assert out["iou"].dtype == torch.float32 and out["parse_failed"].dtype == torch.bool
    assert out["iou"].tolist() == pytest.approx([1.0, 5 / 15, 0.0, 0.0])
    assert out["format"].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert out["total"].tolist() == pytest.approx([1.5, 5 / 15 + 0.5, 0.0, 0.0])
    assert out["parse_failed"].tolist() == [False, False, True, False]
    # Time-R1: (1/3)(1 − 5/30)(1 − 5/30); Gaussian: exp(−50 / (2·0.01·900)); thresholds: IoU 1/3 ≥ 0.3 only
    assert out["iou_boundary"][1].item() == pytest.approx((1 / 3) * (25 / 30) ** 2)
    assert out["iou_gaussian"][1].item() == pytest.approx(math.exp(-50 / 18))
    assert out["iou_threshold"].tolist() == pytest.approx([1.0, 1 / 3, 0.0, 0.0])


def test_fallback_config_and_plain_lists():
    fn = build_reward_fn({"iou": 1.0}, "tvg", fallback_to_text=True)
    res = fn.score(["the event is from 10 to 20 seconds"], [TVG])
    assert res["iou"] == [1.0] and res["parse_failed"] == [False] and res["total"] == [1.0]
    # TRL conversational completions
    res = fn.score([[{"role": "assistant", "content": "<answer>10 to 20</answer>"}]], [TVG])
    assert res["iou"] == [1.0]


def test_clip_relative_times():
    s = {"id": "clip", "duration": 300.0, "video_start": 100.0, "video_end": 130.0, "spans": [[110.0, 120.0]]}
    fn = build_reward_fn({"iou": 1.0, "iou_boundary": 1.0}, "tvg")
    res = fn.score(["<answer>10 to 20</answer>", "<answer>5 to 20</answer>"], [s, s])
    # "5 to 20" → absolute [105, 120] vs [110, 120]: IoU 10/15; D = 130 − 100 = 30 → (2/3)(1 − 5/30)(1 − 0)
    assert res["iou"] == pytest.approx([1.0, 2 / 3])
    assert res["iou_boundary"] == pytest.approx([1.0, (2 / 3) * (25 / 30)])
    absolute = build_reward_fn({"iou": 1.0}, "tvg", clip_relative=False)
    # read as absolute [10, 20]: clamped into the clip → [100, 100] → 0
    assert absolute.score(["<answer>10 to 20</answer>"], [s])["iou"] == [0.0]


def test_multi_gt_takes_best_span():
    s = {"id": "m", "duration": 60.0, "spans": [[0.0, 10.0], [30.0, 40.0]]}
    fn = build_reward_fn({"iou": 1.0, "iou_multi": 1.0}, "tvg")
    res = fn.score(["<answer>30 to 40</answer>", "<answer>[[0, 10], [30, 40]]</answer>"], [s, s])
    assert res["iou"] == pytest.approx([1.0, 1.0])
    assert res["iou_multi"] == pytest.approx([10 / 20, 1.0])


def test_mcq_and_numeric():
    s = {"id": "q", "task": "mcq", "options": ["dog", "cat", "bird", "fish"], "answer": "A, C"}
    fn = build_reward_fn({"mcq": 1.0, "mcq_soft": 1.0}, "mcq")
    res = fn.score(["<answer>A</answer>", "<answer>(A), (C)</answer>", "<answer>A, B</answer>", "??"], [s] * 4)
    assert res["mcq"] == [0.0, 1.0, 0.0, 0.0]
    assert res["mcq_soft"] == [0.5, 1.0, 0.0, 0.0]
    assert res["parse_failed"] == [False, False, False, True]
    n = {"id": "n", "task": "mcq", "answer": "10"}
    fn = build_reward_fn({"numeric": 1.0, "numeric_mra": 1.0}, "mcq", numeric_rel_tol=0.05)
    res = fn.score(["<answer>10.4</answer>", "<answer>12</answer>"], [n, n])
    assert res["numeric"] == [1.0, 0.0]
    assert res["numeric_mra"] == pytest.approx([1.0, 0.6])


def test_gqa_letter_and_evidence():
    s = {"id": "g", "task": "gqa", "duration": 30.0, "spans": [[10.0, 20.0]], "options": ["a", "b", "c"], "answer": "C"}
    fn = build_reward_fn({"mcq": 1.0, "iou": 1.0, "iop": 1.0, "iou_multi": 0.0}, "gqa")
    res = fn.score(
        ["<answer>(C)</answer><glue>[[12, 18]]</glue>", "<answer>B, 10 to 25</answer>", "<answer>C</answer>"], [s] * 3
    )
    assert res["mcq"] == [1.0, 0.0, 1.0]
    assert res["iou"] == pytest.approx([0.6, 10 / 15, 0.0])
    assert res["iop"] == pytest.approx([1.0, 10 / 15, 0.0])
    assert res["parse_failed"] == [False, False, True]  # no evidence span in the third


def test_rec_frames():
    s = {"id": "r", "task": "rec", "image_size": [640, 480], "boxes": [[64, 96, 320, 288]]}
    fn = build_reward_fn({"box_iou": 1.0, "box_acc": 1.0}, "rec", box_frame="qwen2_vl")
    res = fn.score(['<answer>{"bbox_2d": [100, 200, 500, 600]}</answer>', "<answer>none</answer>"], [s, s])
    assert res["box_iou"] == pytest.approx([1.0, 0.0]) and res["box_acc"] == [1.0, 0.0]
    assert res["parse_failed"] == [False, True]
    s25 = {"id": "r2", "image_size": [896, 672], "resized_image_size": [448, 336], "boxes": [[20, 40, 60, 80]]}
    fn = build_reward_fn({"box_iou": 1.0}, "rec", box_frame="qwen2_5_vl")
    assert fn.score(["<answer>[10, 20, 30, 40]</answer>"], [s25])["box_iou"] == pytest.approx([1.0])
    with pytest.raises(SampleError, match="resized_image_size"):
        fn.score(["<answer>[10, 20, 30, 40]</answer>"], [s])


def test_length_bonus_with_group_condition():
    words = lambda s: len(s.split())  # noqa: E731
    fn = build_reward_fn({"iou": 1.0, "length": 1.0}, "tvg", token_counter=words, length_lo=3, length_hi=6)
    long_ok = "<answer>10 to 20</answer> a b c"  # 6 words, correct
    short_ok = "<answer>10 to 20</answer>"  # 3 words, correct
    too_long = "<answer>10 to 20</answer> a b c d"  # 7 words
    wrong = "<answer>0 to 5</answer> a b c"  # incorrect
    res = fn.score([long_ok, short_ok, too_long, wrong], [TVG] * 4)
    assert res["length"] == [0.2, 0.2, 0.0, 0.0]  # default bonus 0.2
    assert res["total"] == pytest.approx([1.2, 1.2, 1.0, 0.0])
    # only one correct completion in the group: no bonus (Video-R1)
    res = fn.score([long_ok, wrong], [TVG] * 2)
    assert res["length"] == [0.0, 0.0]
    fn2 = build_reward_fn(
        {"iou": 1.0, "length": 1.0},
        "tvg",
        token_counter=words,
        length_lo=3,
        length_hi=6,
        length_bonus=0.5,
        length_group_condition=False,
    )
    assert fn2.score([long_ok, wrong], [TVG] * 2)["length"] == [0.5, 0.0]


def test_non_finite_reward_raises_naming_reward_and_sample(monkeypatch):
    monkeypatch.setattr(registry, "span_iou", lambda tp: float("nan"))
    fn = build_reward_fn({"iou": 1.0}, "tvg")
    with pytest.raises(ValueError, match=r"'iou'.*id=v1"):
        fn(["<answer>1 to 2</answer>"], [TVG])


def test_bad_samples_name_id_and_field():
    fn = build_reward_fn({"iou": 1.0}, "tvg")
    with pytest.raises(SampleError, match=r"id=bad.*'duration'"):
        fn.score(["x"], [{"id": "bad", "duration": float("nan"), "spans": [[0, 1]]}])
    with pytest.raises(SampleError, match=r"id=bad.*'spans\[0\]'"):
        fn.score(["x"], [{"id": "bad", "duration": 5, "spans": [[3, 1]]}])
    with pytest.raises(ValueError, match="2 completions but 1 samples"):
        fn.score(["x", "y"], [TVG])


def test_build_errors():
    with pytest.raises(ValueError, match="unknown reward"):
        build_reward_fn({"iuo": 1.0}, "tvg")
    with pytest.raises(ValueError, match="does not apply"):
        build_reward_fn({"box_iou": 1.0}, "tvg")
    with pytest.raises(ValueError, match="unknown task"):
        build_reward_fn({"iou": 1.0}, "vqa")
    with pytest.raises(TypeError, match="unknown reward cfg"):
        build_reward_fn({"iou": 1.0}, "tvg", sigmaa=0.2)
    with pytest.raises(ValueError, match="box_frame"):
        build_reward_fn({"box_iou": 1.0}, "rec")
    with pytest.raises(ValueError, match="token_counter"):
        build_reward_fn({"iou": 1.0, "length": 0.2}, "tvg")
    with pytest.raises(ValueError, match="finite"):
        build_reward_fn({"iou": float("nan")}, "tvg")
    assert all(isinstance(v[1], str) for v in REWARDS.values())
