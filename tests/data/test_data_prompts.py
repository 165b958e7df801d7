"""Prompt templates: message structure per task/mode, answer formats, and ground-truth answers that parse back."""
import json

import pytest

from mmgrpo.vlm.data import MODES, Sample, build_messages, format_ground_truth_answer, format_span, system_prompt

TVG = Sample(id="t", task="tvg", query="the red circle appears", video="/v/a.mp4", duration=30.0,
             spans=[[12.5, 17.75]]).validate()
TVG_CLIP = Sample(id="tc", task="tvg", query="the dog jumps", video="/v/a.mp4", duration=100.0,
                  spans=[[10.0, 20.5]], video_start=5.0, video_end=60.0).validate()
MCQ = Sample(id="m", task="mcq", query="What colour is the circle?", video="/v/a.mp4",
             options=["red", "green", "blue"], answer="C").validate()
GQA = Sample(id="g", task="gqa", query="why did the baby fall?", video="/v/b.mp4", duration=40.0,
             spans=[[12.5, 18.0], [20.0, 22.0]], options=["tired", "slipped"], answer="B").validate()
REC = Sample(id="r", task="rec", query="woman in blue", image="/i/c.jpg", boxes=[[103.9, 300.0, 238.2, 477.4]],
             image_size=[640, 480]).validate()


def test_format_span_hand_values():
    assert format_span(12.5, 17.75) == "12.50 to 17.75"
    assert json.loads(format_span(12.5, 17.754, "json")) == {"start_time": 12.5, "end_time": 17.75}


def test_build_messages_structure():
    msgs = build_messages(TVG_CLIP, "think", "seconds", media_kwargs={"fps": 2.0})
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[0]["content"] == system_prompt("think") and "<think>" in msgs[0]["content"]
    video, text = msgs[1]["content"]
    assert video == {"type": "video", "video": "/v/a.mp4", "video_start": 5.0, "video_end": 60.0, "fps": 2.0}
    assert text["type"] == "text" and '"the dog jumps"' in text["text"] and "start to end" in text["text"]
    img = build_messages(REC, "no_think")[1]["content"][0]
    assert img == {"type": "image", "image": "/i/c.jpg"}
    mcq_text = build_messages(MCQ, "hybrid")[1]["content"][1]["text"]
    assert "(A) red\n(B) green\n(C) blue" in mcq_text
    assert "JSON" in build_messages(TVG, answer_format="json")[1]["content"][1]["text"]
    assert "The video is 55.00 seconds long." in build_messages(TVG_CLIP, include_duration=True)[1]["content"][1][
        "text"]
    assert len(build_messages(TVG, system=False)) == 1
    assert len({system_prompt(m) for m in MODES}) == 3
    with pytest.raises(ValueError, match="mode"):
        build_messages(TVG, "cot")
    with pytest.raises(ValueError, match="answer_format"):
        build_messages(TVG, "think", "frames")


def test_ground_truth_answers_hand_values():
    assert format_ground_truth_answer(TVG, "no_think") == "<answer>12.50 to 17.75</answer>"
    assert format_ground_truth_answer(TVG, "think") == "<think></think><answer>12.50 to 17.75</answer>"
    # clip-relative: [10, 20.5] - 5
    assert format_ground_truth_answer(TVG_CLIP, "hybrid") == "<answer>5.00 to 15.50</answer>"
    assert format_ground_truth_answer(TVG_CLIP, clip_relative=False) == "<answer>10.00 to 20.50</answer>"
    assert format_ground_truth_answer(MCQ) == "<answer>C</answer>"
    assert format_ground_truth_answer(GQA) == "<answer>(B) <glue>12.50 to 18.00, 20.00 to 22.00</glue></answer>"
    assert format_ground_truth_answer(REC) == "<answer>[104, 300, 238, 477]</answer>"
    # Qwen2.5-VL writes pixels of the resized input (448x336 here): x * 448/640, y * 336/480
    assert format_ground_truth_answer(REC, box_frame="qwen2_5_vl", resized_size=(448, 336)) == \
        "<answer>[73, 210, 167, 334]</answer>"
    assert format_ground_truth_answer(REC, box_frame="qwen2_vl") == "<answer>[162, 625, 372, 995]</answer>"
    with pytest.raises(ValueError, match="resized_size"):
        format_ground_truth_answer(REC, box_frame="qwen2_5_vl")


CASES = [
    (TVG, "tvg", {"iou": 1.0}, {}),
    (TVG_CLIP, "tvg", {"iou": 1.0}, {}),
    (MCQ, "mcq", {"mcq": 1.0}, {}),
    (GQA, "gqa", {"mcq": 1.0, "iou_multi": 1.0}, {}),
    (REC, "rec", {"box_iou": 0.99}, {"box_frame": "abs"}),
]


@pytest.mark.parametrize("mode", ["think", "no_think", "hybrid"])
@pytest.mark.parametrize("answer_format", ["seconds", "json"])
@pytest.mark.parametrize("sample, task, minimum, cfg", CASES, ids=lambda x: getattr(x, "id", None))
def test_ground_truth_parses_back_with_the_reward_parser(sample, task, minimum, cfg, mode, answer_format):
    from mmgrpo.vlm.rewards import registry

    gt = format_ground_truth_answer(sample, mode, answer_format)
    fn = registry.build_reward_fn({**{k: 1.0 for k in minimum}, "format": 1.0}, task, **cfg)
    out = fn.score([gt], [sample.to_dict()])
    assert out["parse_failed"] == [False], gt
    for name, lo in minimum.items():
        assert out[name][0] >= lo, (name, gt, out)
    # the strict think format holds exactly in think mode (TempSamp-R1: the GT member scores format 1)
    assert out["format"][0] == (1.0 if mode == "think" else 0.0)


def test_query_position_before_puts_the_text_first_in_the_prompt():
    from types import SimpleNamespace

    from mmgrpo.vlm.config import DataConfig
    from mmgrpo.vlm.models.tiny import build_tiny_tokenizer
    from mmgrpo.vlm.data.task import TaskAdapter

    after = build_messages(TVG, "no_think")[1]["content"]
    before = build_messages(TVG, "no_think", query_position="before")[1]["content"]
    assert [c["type"] for c in after] == ["video", "text"] and before == after[::-1]
    with pytest.raises(ValueError, match="query_position"):
        build_messages(TVG, query_position="first")
    text = build_tiny_tokenizer().apply_chat_template(build_messages(TVG, "no_think", query_position="before"),
                                                     tokenize=False, add_generation_prompt=True)
    assert text.index('"the red circle appears"') < text.index("<|vision_start|>")
    # the trainer / eval harness read it from data.query_position (default: after, the released recipes' order)
    ta = TaskAdapter(None, SimpleNamespace(family="qwen2_5_vl"), DataConfig(prompt_mode="no_think",
                                                                            query_position="before"))
    assert ta.messages(TVG)[1]["content"] == before
    assert TaskAdapter(None, SimpleNamespace(family="qwen2_5_vl"), DataConfig())
    assert DataConfig().query_position == "after"
