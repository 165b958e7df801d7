"""Video-R1's OCR (1 − WER) reward and Visual-RFT's multi-box IoU / confidence rewards, against hand values."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmgrpo.vlm.rewards import build_reward_fn
from mmgrpo.vlm.rewards.multibox import (
    confidence_reward,
    greedy_match,
    multibox_iou_reward,
    parse_scored_boxes,
    visual_rft_iou,
)
from mmgrpo.vlm.rewards.ocr import ocr_wer_reward, word_edit_distance, word_error_rate

PROP = settings(max_examples=80, deadline=None)
words = st.lists(st.sampled_from(["a", "b", "c", "dd"]), max_size=6)


# ---- word error rate -----------------------------------------------------------------------------------------
def test_wer_hand_values():
    assert word_error_rate("the cat sat", "the cat sat") == 0.0
    assert word_error_rate("the cat sat", "the dog sat") == pytest.approx(1 / 3)  # one substitution
    assert word_error_rate("the cat sat", "the sat") == pytest.approx(1 / 3)  # one deletion
    assert word_error_rate("the cat sat", "the fat cat sat down") == pytest.approx(2 / 3)  # two insertions
    assert word_error_rate("a b", "x y z w") == pytest.approx(4 / 2)  # 2 subs + 2 ins: WER above 1
    assert word_error_rate("", "x y") == 2.0  # divided by max(1, 0)
    assert word_error_rate("Stop", "stop") == 1.0  # case-sensitive, as the release
    # kitten/sitting as words: k→s, e→i, +g = 3
    assert word_edit_distance(list("kitten"), list("sitting")) == 3


def test_ocr_reward_hand_values():
    gt = "<answer>OPEN 24 HOURS</answer>"
    assert ocr_wer_reward("<think>x</think><answer> OPEN 24 HOURS </answer>", gt) == 1.0
    assert ocr_wer_reward("<answer>OPEN 24 DAYS</answer>", gt) == pytest.approx(2 / 3)
    assert ocr_wer_reward("<answer>OPEN 24 DAYS</answer>", "OPEN 24 HOURS") == pytest.approx(2 / 3)  # plain GT
    assert ocr_wer_reward("<answer>a b c d e f g</answer>", gt) == 0.0  # WER 7/3 clipped
    assert ocr_wer_reward("no block OPEN 24 HOURS", gt) == 0.0  # no closed block: "" → WER 1
    # first block only
    assert ocr_wer_reward("<answer>OPEN</answer><answer>OPEN 24 HOURS</answer>", gt) == pytest.approx(1 / 3)


@PROP
@given(words)
def test_wer_identical_is_zero(a):
    assert word_error_rate(" ".join(a), " ".join(a)) == 0.0


@PROP
@given(words, words)
def test_edit_distance_symmetric_and_bounded(a, b):
    d = word_edit_distance(a, b)
    assert d == word_edit_distance(b, a)
    assert abs(len(a) - len(b)) <= d <= max(len(a), len(b))
    assert (d == 0) == (a == b)


@PROP
@given(words, words, words)
def test_edit_distance_triangle(a, b, c):
    assert word_edit_distance(a, c) <= word_edit_distance(a, b) + word_edit_distance(b, c)


# ---- Visual-RFT multi-box ------------------------------------------------------------------------------------
def test_parse_scored_boxes_release_format():
    t = ("<think>x</think><answer>[{'Position': [0, 0, 10, 10], 'Confidence': 0.9},\n"
         "{'Position': [1, 2, 3, 4], 'Confidence': 1}]</answer>")
    assert parse_scored_boxes(t) == [((0, 0, 10, 10), 0.9), ((1, 2, 3, 4), 1.0)]
    # doubled brackets are repaired; a truncated list keeps its complete objects
    assert parse_scored_boxes("<answer>[[{'Position': [0, 0, 1, 1], 'Confidence': 0.5}]]</answer>") == [
        ((0, 0, 1, 1), 0.5)]
    cut = "<answer>[{'Position': [0, 0, 1, 1], 'Confidence': 0.5}, {'Position': [2, 2"
    assert parse_scored_boxes(cut) == [((0, 0, 1, 1), 0.5)]
    for bad in ("<answer>[0, 0, 1, 1]</answer>", "<answer>[]</answer>", "no answer",
                "<answer>[{'Position': [0, 0, 1, 1]}]</answer>",  # the release needs Confidence
                "<answer>[{'Position': [0, 0, 1], 'Confidence': 1}]</answer>"):
        assert parse_scored_boxes(bad) is None, bad


def test_visual_rft_iou_hand_values():
    assert visual_rft_iou([0, 0, 10, 10], [5, 5, 15, 15]) == pytest.approx(25 / 175)
    assert visual_rft_iou([0, 0, 10, 10], [10, 0, 20, 10]) == 0.0
    assert visual_rft_iou([10, 10, 0, 0], [0, 0, 10, 10]) == 0.0  # corners not reordered


def test_greedy_match_and_rewards_hand_values():
    gts = [(0, 0, 10, 10), (20, 0, 30, 10)]
    preds = [((20, 0, 30, 8), 0.6),    # IoU 0.8 with GT 2
             ((0, 0, 10, 8), 0.9),     # IoU 0.8 with GT 1
             ((0, 0, 10, 8), 0.3),     # duplicate position: dropped
             ((50, 50, 60, 60), 0.2)]  # no overlap
    m = greedy_match(gts, preds)
    assert m == [(pytest.approx(0.8), 0.9), (pytest.approx(0.8), 0.6), (0.0, 0.2)]
    assert multibox_iou_reward(m, 2) == pytest.approx(1.6 / 3)  # divided by max(#GT, #pred) = 3
    assert confidence_reward(m) == pytest.approx((0.9 + 0.6 + 0.8) / 3)
    # fewer predictions than GT: divided by #GT
    assert multibox_iou_reward(greedy_match(gts, [((0, 0, 10, 8), 1.0)]), 2) == pytest.approx(0.4)


def test_greedy_match_threshold_and_order():
    # IoU exactly 0.5 does not match (strict >)
    assert greedy_match([(0, 0, 10, 10)], [((0, 0, 10, 5), 1.0)]) == [(0.0, 1.0)]
    # the higher-confidence prediction takes the GT first even though the other overlaps it more
    gts = [(0, 0, 10, 10)]
    m = greedy_match(gts, [((0, 0, 10, 10), 0.4), ((0, 0, 10, 7), 0.8)])
    assert m == [(pytest.approx(0.7), 0.8), (0.0, 0.4)]
    assert confidence_reward(m) == pytest.approx((0.8 + 0.6) / 2)


def test_registry_multibox_and_ocr():
    rec = {"id": "r", "task": "rec", "image_size": [100, 100], "boxes": [[0, 0, 10, 10], [20, 0, 30, 10]]}
    fn = build_reward_fn({"box_iou_multi": 1.0, "box_confidence": 0.5}, task="rec", box_frame="abs")
    out = fn.score(["<answer>[{'Position': [0, 0, 10, 8], 'Confidence': 0.9}]</answer>", "<answer>[0,0,1,1]</answer>"],
                   [rec, rec])
    assert out["box_iou_multi"] == [pytest.approx(0.4), 0.0]
    assert out["box_confidence"] == [pytest.approx(0.9), 0.0]
    assert out["total"] == [pytest.approx(0.4 + 0.45), 0.0]
    assert out["parse_failed"] == [False, True]
    # norm1000 frame: 100 → 10 px on a 100-px image
    fn2 = build_reward_fn({"box_iou_multi": 1.0}, task="rec", box_frame="norm1000")
    assert fn2.score(["<answer>[{'Position': [0, 0, 100, 80], 'Confidence': 1}]</answer>"], [rec])[
        "box_iou_multi"] == [pytest.approx(0.4)]

    ocr = {"id": "o", "task": "mcq", "answer": "OPEN 24 HOURS"}
    fo = build_reward_fn({"ocr_wer": 1.0}, task="mcq")
    o = fo.score(["<answer>OPEN 24 DAYS</answer>", "OPEN"], [ocr, ocr])
    assert o["ocr_wer"] == [pytest.approx(2 / 3), 0.0]
    assert o["parse_failed"] == [False, True]
    with pytest.raises(ValueError, match="answer"):
        fo.score(["<answer>x</answer>"], [{"id": "o2", "task": "mcq", "answer": 3}])


def test_trainer_accuracy_key_follows_the_new_rewards():
    from types import SimpleNamespace

    from mmgrpo.vlm.rewards.registry import accuracy_key

    def cfg(w):
        return SimpleNamespace(accuracy_key="auto", weights=w)

    assert accuracy_key(cfg({"ocr_wer": 1.0}), "mcq") == "ocr_wer"  # an OCR sample has no letter to score
    assert accuracy_key(cfg({"box_iou_multi": 1.0, "box_confidence": 1.0}), "rec") == "box_iou_multi"
    assert accuracy_key(cfg({"mcq": 1.0}), "mcq") == "mcq" and accuracy_key(cfg({"format": 1.0}), "rec") == "box_iou"
