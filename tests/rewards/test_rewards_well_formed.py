"""The project's strict answer-shape rule (``mmgrpo.vlm.rewards.format.well_formed``, reward ``format_exact``) and
TempSamp-R1's strict format check (``release_format(..., "tempsamp_r1", strict=True)``)."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mmgrpo.vlm.data import prompts
from mmgrpo.vlm.rewards import build_reward_fn
from mmgrpo.vlm.rewards.format import well_formed
from mmgrpo.vlm.rewards.protocols import release_format

TVG = dict(id="t", task="tvg", video="v.mp4", duration=30.0, spans=[[2.0, 4.0]], query="q")


@pytest.mark.parametrize("text, ok", [
    ("<answer>2.00 to 4.00</answer>", True),
    ("  <answer> 2.00 to 4.00 </answer>\n", True),  # whitespace around the block and inside the line
    ("<answer>2 to 4.5</answer>", True),
    # the demo's collapse (issue #41): the span, then repeated ".00" up to the token cap, no closing tag
    ("<answer>2.00 to 4.00.00.00.00.00.00.00.00.00.00 to 4.00.00.00.00.00", False),
    ("<answer>2.00 to 4.00.00.00</answer>", False),  # closed, but trailing characters inside the block
    ("<answer>2.00 to 4.00</answer> 5.00", False),  # text after the block
    ("<answer>2.00 to 4.00</answer><answer>1 to 2</answer>", False),  # two blocks
    ("<answer>2.00 to 4.00", False),  # cut at the cap
    ("<answer>2.00 -  4.00</answer>", False),  # not the prompt's "start to end"
    ("<answer>2.00s to 4.00s</answer>", False),
    ("<answer>2.00 to\n4.00</answer>", False),  # a newline inside the answer
    ("<Answer>2.00 to 4.00</Answer>", False),  # tags exact lower-case, as the releases match them
    ("The answer is <answer>2.00 to 4.00</answer>", False),
    ("<think>x</think><answer>2.00 to 4.00</answer>", False),  # no_think asks for the answer only
    ("", False),
    (None, False),
])
def test_tvg_no_think(text, ok):
    assert well_formed(text, "tvg", mode="no_think") is ok


def test_think_and_hybrid_structure():
    good = "<think>the red circle appears at 2 s</think> <answer>2.00 to 4.00</answer>"
    assert well_formed(good, "tvg", mode="think") and well_formed(good, "tvg", mode="hybrid")
    assert not well_formed("<answer>2.00 to 4.00</answer>", "tvg", mode="think")  # the think block is required
    assert well_formed("<answer>2.00 to 4.00</answer>", "tvg", mode="hybrid")  # optional in hybrid
    assert not well_formed("<think>a <answer>1 to 2</answer></think><answer>1 to 2</answer>", "tvg", mode="think")
    assert not well_formed("<think>unclosed <answer>1 to 2</answer>", "tvg", mode="think")
    assert not well_formed("<think>a</think>b<answer>1 to 2</answer>", "tvg", mode="think")  # text between


@pytest.mark.parametrize("task, content, ok", [
    ("mcq", "C", True), ("mcq", " C ", True), ("mcq", "A, C", True), ("mcq", "(C)", False),
    ("mcq", "C. red", False), ("mcq", "The answer is C", False), ("mcq", "c", False), ("numeric", "7.42", True),
    ("numeric", "-3", True), ("numeric", "7.42 meters", False),
    ("rec", "[10, 20, 110, 220]", True), ("rec", "[0.1000, 0.2000, 0.5000, 0.9000]", True),
    ("rec", "[10, 20, 110]", False), ("rec", "[10, 20, 110, 220] [1, 2, 3, 4]", False),
    ("rec", '{"bbox_2d": [10, 20, 110, 220]}', False),
    ("gqa", "(B) <glue>1.50 to 2.50</glue>", True), ("gqa", "B <glue>1.50 to 2.50, 10.00 to 12.00</glue>", True),
    ("gqa", "(B)", False), ("gqa", "(B) <glue>1.50 to 2.50", False),
])
def test_task_grammars(task, content, ok):
    assert well_formed(f"<answer>{content}</answer>", task, mode="no_think") is ok


def test_json_answer_format():
    ok = '<answer>{"start_time": 2.0, "end_time": 4.5}</answer>'
    assert well_formed(ok, "tvg", mode="no_think", answer_format="json")
    assert not well_formed(ok, "tvg", mode="no_think")  # the seconds format was asked for
    for bad in ('{"start_time": "2.0", "end_time": 4.5}', '{"start_time": 2.0}', '{"start_time": 2, "end_time": 4} x',
                '{"start_time": NaN, "end_time": 4}', '{"start_time": true, "end_time": 4}'):
        assert not well_formed(f"<answer>{bad}</answer>", "tvg", mode="no_think", answer_format="json"), bad


def test_bad_arguments_are_errors():
    with pytest.raises(ValueError, match="unknown task"):
        well_formed("<answer>C</answer>", "vqa")
    with pytest.raises(ValueError, match="mode"):
        well_formed("<answer>C</answer>", "mcq", mode="nothink")


GQA = dict(id="g", task="gqa", video="v.mp4", duration=30.0, spans=[[1.5, 2.5], [10.0, 12.0]], query="q",
           options=["a", "b", "c"], answer="B")  # fmt: skip
MCQ = dict(id="m", task="mcq", video="v.mp4", query="q", options=["a", "b", "c"], answer="C")
REC = dict(id="r", task="rec", image="i.jpg", query="q", image_size=[640, 480], boxes=[[64, 96, 320, 288]])


@pytest.mark.parametrize("answer_format", ["seconds", "json"])
@pytest.mark.parametrize("mode", ["think", "no_think"])
def test_ground_truth_answers_are_well_formed(answer_format, mode):
    """Every answer the data area writes as a completion (TempSamp-R1's member, SFT targets) has the shape the prompt
    asks for: the rule and the prompt templates agree."""
    gt = lambda s, **kw: prompts.format_ground_truth_answer(s, mode=mode, answer_format=answer_format, **kw)  # noqa: E731
    for s in (TVG, GQA, MCQ):
        assert well_formed(gt(s), s["task"], mode=mode, answer_format=answer_format), gt(s)
    for frame in ("qwen2_vl", "qwen2_5_vl", "abs", "norm1"):
        comp = gt(REC, box_frame=frame, resized_size=[320, 240])
        assert well_formed(comp, "rec", mode=mode), comp


seconds = st.integers(0, 99_999).map(lambda n: f"{n / 100:.2f}")  # "0.00" .. "999.99", as the prompt asks


@given(a=seconds, b=seconds, junk=st.text(alphabet=".0123456789 to<>/answer\n", min_size=1, max_size=12),
       k=st.integers(1, 10))
def test_property_clean_span_passes_and_trailing_garbage_fails(a, b, junk, k):
    clean = f"<answer>{a} to {b}</answer>"
    assert well_formed(clean, "tvg", mode="no_think")
    if junk.strip():  # anything non-blank after the closing tag
        assert not well_formed(clean + junk, "tvg", mode="no_think")
    # the collapse's shape: ".00" repeated after the end value, closed or cut at the cap
    assert not well_formed(f"<answer>{a} to {b}{'.00' * k}</answer>", "tvg", mode="no_think")
    assert not well_formed(f"<answer>{a} to {b}{'.00' * k}", "tvg", mode="no_think")


def test_format_exact_reward_uses_the_prompt_structure():
    outs = ["<answer>2.00 to 4.00</answer>", "<answer>2.00 to 4.00.00</answer>"]
    fn = build_reward_fn({"iou": 1.0, "format_exact": 0.1}, "tvg", prompt_mode="no_think")
    r = fn.score(outs, [TVG, TVG])
    assert r["format_exact"] == [1.0, 0.0]
    assert r["total"] == pytest.approx([1.1, r["iou"][1]])  # 1.0 * IoU + 0.1 * format
    think = build_reward_fn({"format_exact": 1.0}, "tvg")  # default prompt_mode think: a bare answer is malformed
    assert think.score(outs[:1], [TVG])["format_exact"] == [0.0]
    with pytest.raises(ValueError, match="prompt_mode"):
        build_reward_fn({"format_exact": 1.0}, "tvg", prompt_mode="none")


def test_tempsamp_r1_strict_format():
    """TempSamp-R1's strict variant (its TIMELENS_STRICT_FORMAT=1): one closed block, the text ends with </answer>,
    no newline inside, a number pair joined by to / and / '-' inside; the loose default only needs the pair in the
    first closed block."""
    strict = lambda t: release_format(t, "tempsamp_r1", strict=True)  # noqa: E731
    loose = lambda t: release_format(t, "tempsamp_r1")  # noqa: E731
    assert strict("<answer> 2.00 to 4.00 </answer>") == 1.0 and strict("<answer>2.00 to 4.00</answer>  \n") == 1.0
    assert strict("I think <answer>2.00 and 4.00</answer>") == 1.0  # text before the block is allowed
    assert strict("<answer>2.00 to 4.00.00.00 to 4.00</answer>") == 1.0  # the pair is searched, not matched
    for bad in ("<answer>2.00 to 4.00</answer> done", "<answer>1 to 2</answer><answer>2.00 to 4.00</answer>",
                "<answer>2.00 to\n4.00</answer>", "<answer>2.00 to 4.00.00.00", "<answer>soon</answer>"):
        assert strict(bad) == 0.0, bad
    assert loose("<answer>2.00 to 4.00</answer> done") == 1.0 and loose("<answer>2.00 to\n4.00</answer>") == 1.0
    fn = build_reward_fn({"iou": 1.0, "format": 0.1}, "tvg", parse_mode="tempsamp_r1", strict_format=True)
    assert fn.score(["<answer>2.00 to 4.00</answer> done"], [TVG])["format"] == [0.0]
    with pytest.raises(ValueError, match="tempsamp_r1"):
        build_reward_fn({"format": 0.1}, "tvg", strict_format=True)


def test_trainer_rewards_check_the_prompts_structure():
    """The trainer's reward builder gives format_exact the run's prompt mode and answer format; the demo's recipe
    (TempSamp-R1 parse mode + strict format) is accepted with a no-think prompt."""
    from mmgrpo.vlm.config import RewardConfig
    from mmgrpo.vlm.rewards.registry import build_rewards

    json_answer = '<answer>{"start_time": 2.0, "end_time": 4.0}</answer>'
    fn, _ = build_rewards(RewardConfig(weights={"iou": 1.0, "format_exact": 0.1}), "tvg", "qwen2_5_vl", None,
                          prompt_mode="no_think", answer_format="json")
    assert fn.score([json_answer, "<answer>2.00 to 4.00</answer>"], [TVG, TVG])["format_exact"] == [1.0, 0.0]
    demo, _ = build_rewards(RewardConfig(weights={"iou": 1.0, "format": 0.1}, parse_mode="tempsamp_r1",
                                         options={"strict_format": True}), "tvg", "qwen2_5_vl", None,
                            prompt_mode="no_think")
    out = demo.score(["<answer>2.00 to 4.00</answer>", "<answer>2.00 to 4.00.00.00 to 4.00"], [TVG, TVG])
    assert out["format"] == [1.0, 0.0] and out["iou"][0] == 1.0
    # unclosed: TempSamp-R1 reads the whole text and its last pair, "00 to 4.00": [0, 4] against [2, 4]
    assert out["iou"][1] == pytest.approx(0.5)
