"""Release prompt templates (issue #33 item 1): the rendered chat text, through the real Qwen2.5-VL tokenizer's chat
template, equals the literal strings of each release (copied here from the release files named in each template's
``sources``: Time-R1 timer1_trainer_ft.py, VideoChat-R1 grpo_trainer_video_{tg,gqa}.py, Video-R1 grpo.py, VLM-R1
qwen_module.py, TempSamp-R1's data file, Video-RTS and TW-GRPO grpo.py), written out in full rather than composed;
and the project template renders the demo's prompt byte for byte as before this change."""
import json

import pytest

from mmgrpo.vlm.data import Sample
from mmgrpo.vlm.data import converters as C
from mmgrpo.vlm.data.templates import TEMPLATES, check_template, ground_truth, render_messages, template_names

SYS = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"  # Qwen2.5-VL's default system turn
V = "<|vision_start|><|video_pad|><|vision_end|>"
IMG = "<|vision_start|><|image_pad|><|vision_end|>"


def chat(user: str, system: str = SYS) -> str:
    return system + "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def proc():
    import importlib.util

    pytest.importorskip("tiktoken")
    if importlib.util.find_spec("dashscope") is None:
        pytest.skip("dashscope (ships qwen.tiktoken) not installed: pip install 'mmgrpo[dev]'")
    from mmgrpo.vlm.models.real_tokenizer import build_qwen2_5_vl_processor

    return build_qwen2_5_vl_processor()


def render(proc, sample, name, **kw):
    return proc.apply_chat_template(render_messages(sample, name, **kw), add_generation_prompt=True, tokenize=False)


def tvg(query="Person opens the door.", **kw):
    return Sample.from_dict({"id": "t", "task": "tvg", "query": query, "video": "v.mp4", "duration": 30.0,
                             "spans": [[2.5, 7.25]], **kw}).validate()


# ------------------------------------------------------------------------------------------------ Time-R1
def test_time_r1_v1_text_before_video_no_system_query_lower_cased(proc):
    want = chat(
        'To accurately pinpoint the event "person opens the door" in the video, determine the precise time period of '
        'the event.\n\nOutput your thought process within the <think> </think> tags, including analysis with either '
        'specific time ranges (xx.xx to xx.xx) in <timestep> </timestep> tags.\n\nThen, provide the start and end '
        'times (in seconds, precise to two decimal places) in the format "start time to end time" within the <answer> '
        '</answer> tags. For example: "12.54 to 17.83".' + V)
    assert render(proc, tvg(), "time_r1_v1") == want
    assert ground_truth(tvg(), "time_r1_v1") == "<think></think><answer>2.50 to 7.25</answer>"


def test_time_r1_v2(proc):
    want = chat(
        'To accurately pinpoint the event "a person is sitting on the bed" in the video, determine the precise time '
        'period of the event.\n\nProvide the start and end times (in seconds, precise to two decimal places) in the '
        'format "start time to end time" within the <answer> </answer> tags. For example: "12.54 to 17.83".' + V)
    assert render(proc, tvg("A person is sitting on the bed."), "time_r1_v2") == want


def test_videochat_r1_tg(proc):
    want = chat(
        'To accurately pinpoint the event "person opens the door" in the video, determine the precise time period of '
        'the event.\n\nOutput your thought process within the <think> </think> tags, including analysis with either '
        'specific timestamps (xx.xx) or time ranges (xx.xx to xx.xx) in <timestep> </timestep> tags.\n\nThen, provide '
        'the start and end times (in seconds, precise to two decimal places) in the format "start time to end time" '
        'within the <answer> </answer> tags. For example: "12.54 to 17.83".' + V)
    assert render(proc, tvg(), "videochat_r1_tg") == want


# ------------------------------------------------------------------------------------------------ VideoChat-R1 GQA
def test_videochat_r1_gqa_options_as_the_python_list(proc):
    # NExT-GQA in the VideoChat-R1 layout, converted; [OPTION] is str() of its "(A) ..." list (an apostrophe makes
    # Python quote that element with double quotes)
    (s,), _ = C.convert_nextgqa([{"video": "4010069381.mp4", "question": "why did the boy pick up one present",
                                  "options": ["(A) to give to the girl", "(B) it's his turn", "(C) to open it"],
                                  "duration": 30.0, "glue": [[3.2, 7.5]], "answer": "(C)"}])
    want = chat(
        'Answer the question: "why did the boy pick up one present" according to the content of the video. Select the '
        'answer from :[\'(A) to give to the girl\', "(B) it\'s his turn", \'(C) to open it\'].\n\nOutput your thought '
        'process within the <think> </think> tags, including analysis with either specific timestamps (xx.xx) or time '
        'ranges (xx.xx to xx.xx) in <timestep> </timestep> tags.\n\nThen, provide your answer within the <answer> '
        '</answer> tags, output the corresponding letter of the option. At the same time, in the <glue> </glue> tags, '
        'present the precise time period in seconds of the video clips on which you base your answer to this question '
        'in the format of [(s1, e1), (s2, e2), ...]. For example: <answer>A</answer><glue>[(5.2, 10.4)]</glue>.\n' + V)
    assert render(proc, s, "videochat_r1_gqa") == want
    assert ground_truth(s, "videochat_r1_gqa") == "<think></think><answer>C</answer><glue>[(3.20, 7.50)]</glue>"


# ------------------------------------------------------------------------------------------------ TempSamp-R1
# the first line of the re-implementation's data/timelens_grpo_train.jsonl (55a9228)
TIMELENS_LINE = {
    "problem": "<video>To accurately pinpoint the event \"Show the process of adding the True Lime packets into the "
               "blended mixture.\" in the video, determine the precise time period of the event. Provide the start and "
               "end times (in seconds, precise to two decimal places) in the format \"start time to end time\" within "
               "<answer> </answer> tags. For example: <answer> 12.5 to 17.8 </answer>.",
    "answer": "<answer> 98.0 to 103.0 </answer>", "problem_type": "temporal grounding", "data_type": "video",
    "videos": ["video_shards/cosmo_cap/jBLU9qd26M0.mp4"], "difficulty": 0.3333, "duration": 173.173, "gt_len": 5.0}
TIMELENS_TEXT = ('To accurately pinpoint the event "Show the process of adding the True Lime packets into the blended '
                 'mixture." in the video, determine the precise time period of the event. Provide the start and end '
                 'times (in seconds, precise to two decimal places) in the format "start time to end time" within '
                 '<answer> </answer> tags. For example: <answer> 12.5 to 17.8 </answer>.')


@pytest.mark.parametrize("query_from", ["event", "problem"])
def test_tempsamp_r1_renders_the_data_problem_video_first(proc, query_from):
    (s,), _ = C.convert_tempsamp([TIMELENS_LINE], query_from=query_from)
    assert render(proc, s, "tempsamp_r1") == chat(V + TIMELENS_TEXT)
    # the release's build_gt_response: spaces inside the answer tags, two decimals
    assert ground_truth(s, "tempsamp_r1") == "<answer> 98.00 to 103.00 </answer>"


def test_tempsamp_r1_on_charades_puts_the_query_in_the_same_text(proc):
    assert render(proc, tvg(), "tempsamp_r1") == chat(V + TIMELENS_TEXT.replace(
        "Show the process of adding the True Lime packets into the blended mixture.", "Person opens the door."))


def test_query_from_problem_is_not_wrapped_in_the_project_prompt():
    """#32 item 5: `convert.py tempsamp --query-from problem` gave the project template a whole release prompt as
    the event, which it wrapped in its own instruction (the question twice)."""
    (s,), _ = C.convert_tempsamp([TIMELENS_LINE], query_from="problem")
    text = render_messages(s, "mmgrpo", mode="no_think")[-1]["content"][-1]["text"]
    assert text == TIMELENS_TEXT and text.count("To accurately pinpoint") == 1


# ------------------------------------------------------------------------------------------------ Video-R1
VR1_Q = ("\nPlease think about this question as if you were a human pondering deeply. Engage in an internal dialogue "
         "using expressions such as 'let me think', 'wait', 'Hmm', 'oh, I see', 'let's break it down', etc, or other "
         "natural language thought expressions It's encouraged to include self-reflection or verification in the "
         "reasoning process. Provide your detailed reasoning between the <think> </think> tags, and then give your "
         "final answer between the <answer> </answer> tags.")
# Video-R1-260k items as its README / grpo.py describe them (problem, options "A. x", solution, problem_type,
# data_type, path)
VR1_ITEMS = [
    {"problem_id": 1, "problem": "What is the man holding when he enters the room?", "data_type": "video",
     "problem_type": "multiple choice", "options": ["A. a cup", "B. a phone", "C. a book", "D. nothing"],
     "solution": "<answer>B</answer>", "path": "./LLaVA-Video-178K/a.mp4", "data_source": "LLaVA-Video-178K"},
    {"problem_id": 2, "problem": "How many chairs are in the room?", "data_type": "video", "problem_type": "numerical",
     "options": [], "solution": "<answer>3</answer>", "path": "./STAR/b.mp4", "data_source": "STAR"},
    {"problem_id": 3, "problem": "What is written on the sign?", "data_type": "image", "problem_type": "OCR",
     "options": [], "solution": "<answer>EXIT ONLY</answer>", "path": "./OCR/c.png", "data_source": "TextVQA"},
    {"problem_id": 4, "problem": "Describe what the woman does after she sits down.", "data_type": "video",
     "problem_type": "free-form", "options": [], "solution": "<answer>She opens a laptop and starts typing.</answer>",
     "path": "./LLaVA-Video-178K/d.mp4", "data_source": "LLaVA-Video-178K"},
    {"problem_id": 5, "problem": "What is the distance between the sofa and the TV in meters?", "data_type": "video",
     "problem_type": "regression", "options": [], "solution": "<answer>2.5</answer>", "path": "./VSI/e.mp4",
     "data_source": "VSI"},
]
VR1_SUFFIX = {
    1: " Please provide only the single option letter (e.g., A, B, C, D, etc.) within the <answer> </answer> tags.",
    2: " Please provide the numerical value (e.g., 42 or 3.14) within the <answer> </answer> tags.",
    3: " Please transcribe text from the image/video clearly and provide your text answer within the <answer> "
       "</answer> tags.",
    4: " Please provide your text answer within the <answer> </answer> tags.",
    5: " Please provide the numerical value (e.g., 42 or 3.14) within the <answer> </answer> tags.",
}


def test_video_r1_five_problem_types(proc):
    samples, rep = C.convert_video_r1(VR1_ITEMS, media_dir="Video-R1-data")
    assert [s.task for s in samples] == ["mcq", "qa", "qa", "qa", "qa"] and rep.n_out == 5
    assert [s.meta.get("problem_type") for s in samples[1:]] == ["numerical", "OCR", "free-form", "regression"]
    assert samples[0].video == "Video-R1-data/LLaVA-Video-178K/a.mp4"
    mc = ("What is the man holding when he enters the room?Options:\nA. a cup\nB. a phone\nC. a book\nD. nothing\n")
    assert render(proc, samples[0], "video_r1") == chat(V + mc + VR1_Q + VR1_SUFFIX[1])
    assert render(proc, samples[2], "video_r1") == chat(IMG + "What is written on the sign?" + VR1_Q + VR1_SUFFIX[3])
    for s, k in zip(samples[1:], (2, 3, 4, 5)):
        media = IMG if s.image else V
        assert render(proc, s, "video_r1") == chat(media + VR1_ITEMS[k - 1]["problem"] + VR1_Q + VR1_SUFFIX[k])
    assert [ground_truth(s, "video_r1") for s in samples] == [
        "<think></think><answer>B</answer>", "<think></think><answer>3</answer>",
        "<think></think><answer>EXIT ONLY</answer>",
        "<think></think><answer>She opens a laptop and starts typing.</answer>",
        "<think></think><answer>2.5</answer>"]


def test_video_r1_media_dir_applies_to_absolute_release_paths():
    """#32 item 5: `--image-dir` was ignored for Video-R1's "/MVBench/..." paths (os.path.join drops the prefix)."""
    recs = [dict(VR1_ITEMS[0], path="/MVBench/video/x.mp4"), dict(VR1_ITEMS[1], path="./STAR/b.mp4")]
    a, b = C.convert_video_r1(recs, media_dir="/data/Evaluation")[0]
    assert a.video == "/data/Evaluation/MVBench/video/x.mp4" and b.video == "/data/Evaluation/STAR/b.mp4"
    assert C.convert_video_r1(recs)[0][0].video == "/MVBench/video/x.mp4"  # no media dir: as written


# ------------------------------------------------------------------------------------------------ VLM-R1 REC
VLM_R1_TAIL = (" First output the thinking process in <think> </think> tags and then output the final answer in "
               "<answer> </answer> tags. Output the final answer in JSON format.")


def test_vlm_r1_rec_renders_the_data_problem_image_first(proc):
    line = {"id": 11, "image": "train2014/COCO_train2014_000000581857.jpg", "width": 640, "height": 480,
            "conversations": [{"from": "human", "value": "<image>Please provide the bounding box coordinate of the "
                                                           "region this sentence describes: the lady with the blue "
                                                           "shirt."},
                              {"from": "gpt", "value": "[103, 299, 238, 477]"}]}
    (s,), _ = C.convert_refcoco([line])
    assert s.query == "the lady with the blue shirt."
    want = chat(IMG + "Please provide the bounding box coordinate of the region this sentence describes: the lady "
                      "with the blue shirt." + VLM_R1_TAIL)
    assert render(proc, s, "vlm_r1_rec") == want
    # rebuilt from the expression when the record has no instruction (other RefCOCO files)
    (r,), _ = C.convert_refcoco([{"image": "a.jpg", "expression": "man in red", "bbox": [1, 2, 30, 40],
                                  "width": 64, "height": 48}])
    assert render(proc, r, "vlm_r1_rec") == chat(IMG + "Please provide the bounding box coordinate of the region this "
                                                       "sentence describes: man in red." + VLM_R1_TAIL)
    assert ground_truth(r, "vlm_r1_rec", box_frame="abs") == '<think></think><answer>{"bbox_2d": [1, 2, 30, 40]}</answer>'


# ------------------------------------------------------------------------------------------------ Video-RTS, TW-GRPO
def test_video_rts_and_tw_grpo(proc):
    s = Sample.from_dict({"id": "m", "task": "mcq", "query": "What happens first?", "video": "v.mp4",
                          "options": ["a dog runs", "a cat sleeps"], "answer": "A"}).validate()
    want = chat(V + "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
                    "The assistant first thinks about the reasoning process in the mind and then provides the user with "
                    "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
                    "</answer> tags, respectively, i.e., <think> reasoning process here </think><answer> answer here "
                    "</answer>What happens first?\nOptions:\nA. a dog runs\nB. a cat sleeps\n Please provide only the "
                    "single option letter (e.g., A, B, C, D, etc.) within the <answer> </answer> tags.")
    assert render(proc, s, "video_rts") == want
    want = chat(V + "What happens first?\n(A) a dog runs\n(B) a cat sleeps  Output the thinking process in <think> "
                    "</think> and final answer (letters separated by , if multiple) in <answer> </answer> tags.")
    assert render(proc, s, "tw_grpo_mixed") == want


# ------------------------------------------------------------------------------------------------ the project's own
def test_project_template_is_unchanged_for_the_demo():
    """The demo (configs/demo/tvg.yaml: the base's no_think prompt, query before the video) renders byte for byte as
    before the release templates existed (expected text produced by the previous build_messages)."""
    from transformers import AutoProcessor

    p = AutoProcessor.from_pretrained("data/checkpoints/tiny_vlm_grounding", local_files_only=True)
    s = {"id": "tvg_0001", "task": "tvg", "query": "the red circle appears", "video": "videos/0001.mp4",
         "duration": 12.0, "spans": [[3.5, 6.0]]}
    got = p.apply_chat_template(render_messages(s, "mmgrpo", mode="no_think", answer_format="seconds",
                                                box_frame="qwen2_5_vl", query_position="before"),
                                add_generation_prompt=True, tokenize=False)
    assert got == json.loads(
        '"<|im_start|>system\\nYou are a helpful assistant that watches videos and images carefully. Give only the '
        'final answer inside <answer> </answer> tags, with no reasoning, i.e. <answer> answer here </answer>.'
        '<|im_end|>\\n<|im_start|>user\\nTo accurately pinpoint the event \\"the red circle appears\\" in the video, '
        'determine the precise time period of the event. Output the start and end times in seconds with two '
        'decimals, as \\"start to end\\", for example \\"12.54 to 17.83\\".<|vision_start|><|video_pad|>'
        '<|vision_end|><|im_end|>\\n<|im_start|>assistant\\n"')


# ------------------------------------------------------------------------------------------------ registry
def test_every_template_records_its_source_and_checks_task_and_mode():
    assert template_names()[0] == "mmgrpo"
    for t in TEMPLATES.values():
        assert t.sources and all(len(x.commit) == 40 and x.repo and x.path for x in t.sources), t.name
    with pytest.raises(ValueError, match="renders tasks"):
        check_template("time_r1_v1", "mcq")
    with pytest.raises(ValueError, match="data.prompt_mode=no_think"):
        check_template("tempsamp_r1", "tvg", "think")
    with pytest.raises(ValueError, match="unknown prompt template"):
        check_template("time_r1", "tvg")
