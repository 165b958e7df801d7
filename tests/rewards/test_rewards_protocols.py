"""Per-release parse modes (mmgrpo.vlm.rewards.protocols): one test per rule, expected values written from the released
code's documented behaviour (the rule each test checks is named in its docstring), never from this module's output."""
import pytest

from mmgrpo.vlm.rewards import build_reward_fn
from mmgrpo.vlm.rewards.parsing import ParseStatus
from mmgrpo.vlm.rewards.protocols import (
    PARSE_MODES,
    check_parse_mode,
    nextgqa_iou_iop,
    release_format,
    strict_answer_text,
    strict_box,
    strict_span,
    video_r1_numeric_correct,
    videochat_r1_letter,
    vlm_r1_box_iou,
)
from mmgrpo.vlm.rewards.tasks import ParseConfig, prepare_choice, prepare_temporal, span_boundary_iou, span_iou

TVG = {"id": "t", "duration": 30.0, "spans": [[10.0, 20.0]]}


def _iou(text, mode, sample=TVG):
    return span_iou(prepare_temporal(text, sample, ParseConfig(parse_mode=mode)))


# ----------------------------------------------------------------------------------------------------- Time-R1
def test_time_r1_takes_the_last_span_of_the_last_block():
    """Time-R1 reward: last <answer> block, last 'A to B' in it (the lenient parser takes the first)."""
    text = "<answer>0 to 30</answer> no: <answer>10 to 20, or 0 to 5</answer>"
    assert strict_span(text, "time_r1")[0] == (0.0, 5.0)
    assert _iou(text, "time_r1") == 0.0
    assert _iou(text, "lenient") == 1.0  # first span of the last block


def test_time_r1_rejects_unclosed_answer_units_dashes_and_clocks():
    """Time-R1 reward: a closed <answer> block and 'A to B' / 'A and B' with unsigned decimals only."""
    assert strict_span("<answer>10 to 20", "time_r1")[1] is ParseStatus.NO_ANSWER_BLOCK
    for bad in ("<answer>10s to 20s</answer>", "<answer>10-20</answer>", "<answer>10 – 20</answer>",
                "<answer>10to20</answer>"):
        assert strict_span(bad, "time_r1")[0] is None, bad
    # clock times are not read as such: "00:10 to 00:20" contains "10 to 00"
    assert strict_span("<answer>00:10 to 00:20</answer>", "time_r1")[0] == (10.0, 0.0)
    assert strict_span("<answer>10 AND 20</answer>", "time_r1")[0] == (10.0, 20.0)  # to/and in any case
    assert strict_span("<Answer>10 to 20</Answer>", "time_r1")[0] is None  # the tag itself is exact
    assert _iou("<answer>10s to 20s</answer>", "lenient") == 1.0


def test_time_r1_keeps_reversed_spans_and_does_not_clamp():
    """Time-R1 reward: intersection max(0, min(e) − max(s)) on the numbers as written; union from the raw ends."""
    assert strict_span("<answer>20 to 12.5</answer>", "time_r1")[0] == (20.0, 12.5)
    assert _iou("<answer>20 to 12.5</answer>", "time_r1") == 0.0
    assert _iou("<answer>20 to 12.5</answer>", "lenient") == pytest.approx(0.75)  # swapped
    end = {"id": "e", "duration": 30.0, "spans": [[20.0, 30.0]]}
    assert _iou("<answer>25 to 45</answer>", "time_r1", end) == pytest.approx(5 / 25)
    assert _iou("<answer>25 to 45</answer>", "lenient", end) == pytest.approx(5 / 10)  # clamped to [25, 30]


def test_time_r1_boundary_reward_is_unclamped():
    """Time-R1 iou_v2 = IoU·(1−|Δs|/D)·(1−|Δe|/D) with D the duration, on the raw prediction."""
    end = {"id": "e", "duration": 30.0, "spans": [[20.0, 30.0]]}
    tp = prepare_temporal("<answer>25 to 45</answer>", end, ParseConfig(parse_mode="time_r1"))
    assert span_boundary_iou(tp) == pytest.approx(0.2 * (1 - 5 / 30) * (1 - 15 / 30))


def test_time_r1_eval_reads_the_whole_output_case_sensitively():
    """Time-R1 evaluation: the last 'A to B' anywhere in the output (block or not; unclosed fine), lower-case."""
    assert strict_span("It happens from 3 to 5, then 10 to 20.", "time_r1_eval")[0] == (10.0, 20.0)
    assert strict_span("<answer>12.5 to 17.8", "time_r1_eval")[0] == (12.5, 17.8)
    assert strict_span("<answer>10 TO 20</answer>", "time_r1_eval")[0] is None
    # non-overlapping scan: "1 to 2 to 3" yields only "1 to 2"
    assert strict_span("1 to 2 to 3", "time_r1_eval")[0] == (1.0, 2.0)


# ------------------------------------------------------------------------------------------------- TempSamp-R1
def test_tempsamp_r1_first_block_then_dash_then_two_numbers():
    """TempSamp-R1 (re-implementation) reward: first closed block else the whole text; last 'A to B' (any
    spacing), else last 'A - B', else the first two stand-alone numbers."""
    assert strict_span("<answer>1 to 2</answer><answer>3 to 4</answer>", "tempsamp_r1")[0] == (1.0, 2.0)
    assert strict_span("<answer>3-5 or 6 - 8</answer>", "tempsamp_r1")[0] == (6.0, 8.0)
    assert strict_span("no tags: 4to9", "tempsamp_r1")[0] == (4.0, 9.0)
    assert strict_span("<answer>start 7, end 11</answer>", "tempsamp_r1")[0] == (7.0, 11.0)
    # "12.5s": \b(\d+\.?\d*)\b only matches "12." (a word boundary sits between "." and "5"), same for "17."
    assert strict_span("<answer>12.5s to 17.5s</answer>", "tempsamp_r1")[0] == (12.0, 17.0)
    assert strict_span("<answer>25.3s to 30s</answer>", "tempsamp_r1")[0] is None  # only "25." stands alone
    assert _iou("<answer>18 to 12</answer>", "tempsamp_r1") == 0.0  # not swapped


# ----------------------------------------------------------------------------------------------------- Video-R1
MCQ = {"id": "m", "options": ["dog", "cat", "bird", "fish"], "answer": "C"}


def _letters(text, mode, sample=MCQ):
    return prepare_choice(text, sample, ParseConfig(parse_mode=mode)).value


def test_video_r1_multiple_choice_needs_the_exact_letter():
    """Video-R1: the stripped content of the first <answer> block must equal the ground-truth letter."""
    assert _letters("<answer>C</answer>", "video_r1") == ("C",)
    assert _letters("<answer>\n C \n</answer>", "video_r1") == ("C",)  # whitespace inside the tags is trimmed
    for wrong in ("<answer>(C)</answer>", "<answer>C.</answer>", "<answer>c</answer>",
                  "<answer>The answer is C</answer>", "<answer>bird</answer>", "<answer>(D)</answer>"):
        assert _letters(wrong, "video_r1") is None, wrong
        assert _letters(wrong, "lenient") is not None, wrong  # the lenient parser reads them all
    assert _letters("<answer>A</answer> <answer>C</answer>", "video_r1") == ("A",)  # the first block


def test_video_r1_reward_needs_a_block_but_its_evaluation_falls_back_to_the_whole_output():
    """Video-R1 reward: no block = empty answer = wrong; eval_bench.py: no (or empty) block = the whole output."""
    assert _letters("C", "video_r1") is None
    assert strict_answer_text("C", "video_r1")[1] is ParseStatus.NO_ANSWER_BLOCK
    assert _letters("C", "video_r1_eval") == ("C",)
    assert _letters("<answer></answer>C", "video_r1_eval") is None  # whole text "<answer></answer>C" != "C"
    assert _letters("I pick C", "video_r1_eval") is None
    assert _letters("<answer>C", "video_r1_eval") is None  # unclosed: the whole text is compared


def test_video_r1_numbers_decimal_mark_rule_and_two_decimals():
    """Video-R1 "numerical": '.' or ',' in both or neither; float after removing commas; equal at 2 decimals."""
    assert video_r1_numeric_correct("7,807", "7807") == 0.0  # a mark in the answer only
    assert video_r1_numeric_correct("7,807", "7,807") == 1.0
    assert video_r1_numeric_correct("7.42 meters", "7.42") == 0.0  # float() fails
    assert video_r1_numeric_correct("3.14159", "3.14") == 1.0  # both round to 3.14
    assert video_r1_numeric_correct("3.146", "3.14") == 0.0  # 3.15 vs 3.14
    assert video_r1_numeric_correct("42.0", "42") == 0.0
    assert video_r1_numeric_correct("42", "42") == 1.0
    fn = build_reward_fn({"numeric": 1.0}, "mcq", parse_mode="video_r1")
    samples = [{"id": "a", "answer": 7807}, {"id": "b", "answer": "3.14"}, {"id": "c", "answer": 42}]
    out = fn.score(["<answer>7,807</answer>", "<answer>3.14159</answer>", "<answer>42.0</answer>"], samples)
    assert out["numeric"] == [0.0, 1.0, 0.0]
    lenient = build_reward_fn({"numeric": 1.0}, "mcq").score(
        ["<answer>7,807</answer>", "<answer>3.14159</answer>", "<answer>42.0</answer>"], samples)
    assert lenient["numeric"] == [1.0, 0.0, 1.0]


# ------------------------------------------------------------------------------------------------------ VLM-R1
def test_vlm_r1_integer_boxes_first_in_reward_last_in_eval():
    """VLM-R1 reward: first integer [x1,y1,x2,y2] of the first block; evaluation: the last one inside {...}."""
    two = '<answer>{"a": [1, 2, 3, 4], "b": [10, 20, 30, 40]}</answer>'
    assert strict_box(two, "vlm_r1")[0] == (1, 2, 3, 4)
    assert strict_box(two, "vlm_r1_eval")[0] == (10, 20, 30, 40)
    assert strict_box("<answer>[1, 2, 3, 4]</answer>", "vlm_r1")[0] == (1, 2, 3, 4)
    assert strict_box("<answer>[1, 2, 3, 4]</answer>", "vlm_r1_eval")[0] is None  # no braces
    for bad in ('<answer>{"b": [10.5, 20, 30, 40]}</answer>', '<answer>{"b": [ 10, 20, 30, 40 ]}</answer>',
                '<answer>{"b": [10, 20, 30, 40]}', "[10, 20, 30, 40]"):
        assert strict_box(bad, "vlm_r1_eval")[0] is None, bad


def test_vlm_r1_iou_needs_more_than_one_pixel_of_overlap_and_keeps_reversed_corners():
    """VLM-R1 IoU: intersection only when max(x1) < min(x2) − 1 (same for y), then the continuous overlap;
    areas (x2−x1)(y2−y1) as written."""
    assert vlm_r1_box_iou((0, 0, 50, 50), (0, 0, 100, 50)) == pytest.approx(2500 / 5000)
    assert vlm_r1_box_iou((0, 0, 11, 10), (10, 0, 20, 10)) == 0.0  # 1 px wide overlap
    assert vlm_r1_box_iou((0, 0, 12, 10), (10, 0, 20, 10)) == pytest.approx(20 / (120 + 100 - 20))
    assert vlm_r1_box_iou((50, 50, 0, 0), (0, 0, 50, 50)) == 0.0  # reversed: no intersection
    fn = build_reward_fn({"box_iou": 1.0, "box_acc": 1.0}, "rec", box_frame="abs", parse_mode="vlm_r1")
    s = {"id": "r", "image_size": [100, 100], "boxes": [[0, 0, 100, 50]]}
    out = fn.score(['<answer>{"bbox_2d": [0, 0, 50, 50]}</answer>', "<answer>[50, 50, 0, 0]</answer>"], [s, s])
    assert out["box_iou"] == pytest.approx([0.5, 0.0])
    assert out["box_acc"] == [0.0, 0.0]  # VLM-R1 counts IoU > 0.5
    lenient = build_reward_fn({"box_acc": 1.0}, "rec", box_frame="abs").score(
        ['<answer>{"bbox_2d": [0, 0, 50, 50]}</answer>'], [s])
    assert lenient["box_acc"] == [1.0]


# ----------------------------------------------------------------------------------------------------- NExT-GQA
def test_nextgqa_iop_of_a_point_and_of_reversed_or_disjoint_spans():
    """NExT-GQA get_tIoU: a zero-length prediction inside the GT (ends included) has IoP 1, IoU 0; IoP of a
    reversed span is 0; disjoint spans give a negative overlap that the max over GT spans (from 0) removes."""
    assert nextgqa_iou_iop((15, 15), (10, 20)) == (0.0, 1.0)
    assert nextgqa_iou_iop((20, 20), (10, 20)) == (0.0, 1.0)
    assert nextgqa_iou_iop((21, 21), (10, 20)) == (0.0, 0.0)
    assert nextgqa_iou_iop((18, 12), (10, 20))[1] == 0.0
    assert nextgqa_iou_iop((0, 5), (10, 20)) == (pytest.approx(-5 / 20), pytest.approx(-1.0))
    assert nextgqa_iou_iop((25, 45), (20, 30)) == (pytest.approx(5 / 25), pytest.approx(5 / 20))  # no clamp


def test_videochat_r1_letter_rule():
    """VideoChat-R1 GQA: strip, drop fixed 'The answer is'-style prefixes, '' for >10 words without A-G, else
    the first of A-G anywhere."""
    assert videochat_r1_letter("The answer is (C)") == "C"
    assert videochat_r1_letter(" (B) <glue>1 to 2</glue>") == "B"
    assert videochat_r1_letter("a person opens the door") == ""
    assert videochat_r1_letter("the man picks up a cup then leaves the room and goes out") == ""
    assert videochat_r1_letter("Because the man ...") == "B"  # the first capital A-G, whatever the word


# ----------------------------------------------------------------------------------------------------- format
def test_release_format_rewards():
    """Time-R1: full match of <think>.*?</think>\\s*<answer>.*?</answer> on the stripped text; Video-R1: the same on
    the text as generated; VLM-R1: search, with an integer box inside {...} in the answer; TempSamp-R1 (loose):
    a number pair in the first closed answer block."""
    two_answers = "<think>a</think><answer>1 to 2</answer><answer>3 to 4</answer>"
    padded = "  <think>a</think> <answer>1 to 2</answer>\n"
    assert release_format(two_answers, "time_r1") == 1.0
    assert build_reward_fn({"format": 1.0}, "tvg").score([two_answers], [TVG])["format"] == [0.0]  # project: one
    assert release_format(padded, "time_r1") == 1.0 and release_format(padded, "video_r1") == 0.0
    assert release_format("<Think>a</Think><Answer>C</Answer>", "video_r1") == 0.0
    box = '<think>x</think><answer>{"bbox_2d": [1, 2, 3, 4]}</answer>'
    assert release_format("preamble " + box, "vlm_r1") == 1.0
    assert release_format("<think>x</think><answer>[1, 2, 3, 4]</answer>", "vlm_r1") == 0.0  # no braces
    assert release_format("<answer>1.5 - 3</answer>", "tempsamp_r1") == 1.0  # no think block needed
    assert release_format("<answer>about one</answer>", "tempsamp_r1") == 0.0
    fn = build_reward_fn({"iou": 1.0, "format": 0.5}, "tvg", parse_mode="time_r1")
    assert fn.score([two_answers], [TVG])["format"] == [1.0]


# ----------------------------------------------------------------------------------------------------- config
def test_modes_are_checked_against_the_task():
    assert check_parse_mode("time_r1", "tvg") == "time_r1"
    with pytest.raises(ValueError, match="does not apply to task 'tvg'"):
        check_parse_mode("video_r1", "tvg")
    with pytest.raises(ValueError, match="unknown parse_mode"):
        build_reward_fn({"iou": 1.0}, "tvg", parse_mode="timer1")
    assert all(pm.release for pm in PARSE_MODES.values())


def test_train_config_validates_reward_parse_mode_before_loading():
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.utils.config import apply_overrides

    cfg = apply_overrides(TrainConfig(), ["reward.parse_mode=time_r1"])
    assert cfg.reward.parse_mode == "time_r1"
    with pytest.raises(ValueError, match="does not apply to task 'tvg'"):
        apply_overrides(TrainConfig(), ["reward.parse_mode=vlm_r1"])


def test_build_rewards_passes_the_mode_to_the_reward_function():
    from mmgrpo.vlm.config import RewardConfig
    from mmgrpo.vlm.rewards.registry import build_rewards

    fn, _ = build_rewards(RewardConfig(weights={"iou": 1.0}, parse_mode="time_r1"), "tvg", "qwen2_5_vl", None,
                          prompt_mode="no_think")
    out = fn.score(["<answer>10 to 20, or 0 to 5</answer>"], [TVG])
    assert out["iou"] == [0.0]
    with pytest.raises(ValueError, match="set it in one place"):
        build_rewards(RewardConfig(weights={"iou": 1.0}, parse_mode="time_r1", options={"parse_mode": "tempsamp_r1"}),
                      "tvg", "qwen2_5_vl", None, prompt_mode="no_think")
