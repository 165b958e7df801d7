"""Cross-check with the data area: a ground-truth answer written by ``mmgrpo.vlm.data.prompts`` (TempSamp-R1's
off-policy member, SFT targets) must score perfectly under the reward parsers, in every answer format."""
import pytest

from mmgrpo.vlm.data import prompts
from mmgrpo.vlm.rewards import build_reward_fn

TVG = dict(id="t", task="tvg", video="v.mp4", duration=300.0, video_start=100.0, video_end=130.0,
           spans=[[110.25, 120.5]], query="q")  # fmt: skip
GQA = dict(id="g", task="gqa", video="v.mp4", duration=30.0, spans=[[1.5, 2.5], [10.0, 12.0]], query="q",
           options=["a", "b", "c"], answer="B")  # fmt: skip
MCQ = dict(id="m", task="mcq", video="v.mp4", query="q", options=["a", "b", "c"], answer="C")
REC = dict(id="r", task="rec", image="i.jpg", query="q", image_size=[640, 480], boxes=[[64, 96, 320, 288]])
REC_TRAIN = {**REC, "resized_image_size": [320, 240]}  # added by the trainer from the processor's image grid


@pytest.mark.parametrize("answer_format", ["seconds", "json"])
@pytest.mark.parametrize("mode", ["think", "no_think"])
def test_ground_truth_answers_score_perfectly(answer_format, mode):
    gt = lambda s, **kw: prompts.format_ground_truth_answer(s, mode=mode, answer_format=answer_format, **kw)  # noqa: E731
    fmt = "format" if mode == "think" else "format_loose"
    out = build_reward_fn({"iou": 1.0, "iou_boundary": 1.0, fmt: 1.0}, "tvg").score([gt(TVG)], [TVG])
    assert out["iou"] == pytest.approx([1.0]) and out["iou_boundary"] == pytest.approx([1.0]) and out[fmt] == [1.0]
    out = build_reward_fn({"mcq": 1.0, "iou": 1.0, "iou_multi": 1.0, "iop": 1.0}, "gqa").score([gt(GQA)], [GQA])
    assert out["mcq"] == [1.0] and out["iou"] == pytest.approx([1.0]) and out["iou_multi"] == pytest.approx([1.0])
    assert out["iop"] == pytest.approx([1.0]) and out["parse_failed"] == [False]
    assert build_reward_fn({"mcq": 1.0}, "mcq").score([gt(MCQ)], [MCQ])["mcq"] == [1.0]
    for frame in ("qwen2_vl", "qwen3_vl", "qwen2_5_vl", "abs", "norm1"):
        comp = gt(REC, box_frame=frame, resized_size=REC_TRAIN["resized_image_size"])
        out = build_reward_fn({"box_iou": 1.0}, "rec", box_frame=frame).score([comp], [REC_TRAIN])
        assert out["box_iou"] == pytest.approx([1.0], abs=1e-3), (frame, comp)
