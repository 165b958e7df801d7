"""Video-R1's accuracy reward over its five problem types (issue #33 item 3) and VideoChat-R1's GQA format: values
computed by hand from the formulas in the module docstrings (release rules: tulerfeng/Video-R1 grpo.py
accuracy_reward; OpenGVLab/VideoChat-R1 grpo_gqa.py format_reward)."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmgrpo.vlm.rewards.protocols import release_format, videochat_r1_glue
from mmgrpo.vlm.rewards.registry import build_reward_fn
from mmgrpo.vlm.rewards.video_r1 import (rouge_l, rouge_n, rouge_tokens, video_r1_accuracy, video_r1_regression,
                                         video_r1_rouge)


def test_rouge_tokens():
    assert rouge_tokens("She's OK! The 2 dogs--ran.") == ["she", "s", "ok", "the", "2", "dogs", "ran"]
    assert rouge_tokens("  ") == []


def test_rouge_by_hand():
    ref, hyp = rouge_tokens("the cat sat on the mat"), rouge_tokens("the cat lay on the mat")
    # unigrams: overlap the x2 + cat + on + mat = 5 of 6 each side; bigrams: (the cat) (on the) (the mat) = 3 of 5;
    # LCS "the cat on the mat" = 5 of 6
    assert rouge_n(ref, hyp, 1) == pytest.approx(5 / 6)
    assert rouge_n(ref, hyp, 2) == pytest.approx(3 / 5)
    assert rouge_l(ref, hyp) == pytest.approx(5 / 6)
    assert video_r1_rouge("the cat sat on the mat", "the cat lay on the mat") == pytest.approx(34 / 45)
    # P != R: reference a b c d, hypothesis a c: ROUGE-1 P 1 R 1/2 F 2/3; no common bigram; LCS 2 -> F 2/3
    assert video_r1_rouge("a b c d", "a c") == pytest.approx(4 / 9)
    assert video_r1_rouge("a b", "") == 0.0 and video_r1_rouge("same words", "Same, words!") == pytest.approx(1.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from("a b c d e".split()), max_size=8), st.lists(st.sampled_from("a b c x".split()),
                                                                            max_size=8))
def test_rouge_properties(ref, hyp):
    for v in (rouge_n(ref, hyp, 1), rouge_n(ref, hyp, 2), rouge_l(ref, hyp)):
        assert 0.0 <= v <= 1.0
    assert rouge_l(ref, hyp) == pytest.approx(rouge_l(hyp, ref))  # F of LCS is symmetric
    if ref:
        assert rouge_n(ref, ref, 1) == pytest.approx(1.0) and rouge_l(ref, ref) == pytest.approx(1.0)
    assert rouge_l(ref, hyp) <= rouge_n(ref, hyp, 1) + 1e-12  # an LCS is a common unigram multiset


def test_regression_as_released():
    assert video_r1_regression("2", "2.5") == pytest.approx(1 - (0.5 + 1e-9) / (2.5 + 1e-9))
    assert video_r1_regression("2.5", "2.5") == pytest.approx(1 - 1e-9 / (2.5 + 1e-9), abs=0)
    assert video_r1_regression("10", "2.5") == 0.0  # relative error clipped at 1
    assert video_r1_regression("0", "0") == 0.0  # the 1e-9 terms: a reference 0 answered 0 scores 0 (as released)
    assert video_r1_regression("two", "2.5") == 0.0 and video_r1_regression(None, "2.5") == 0.0


@pytest.mark.parametrize("text, ref, ptype, want", [
    ("<think>x</think><answer> B </answer>", "B", "multiple choice", 1.0),
    ("<think>x</think><answer>(B)</answer>", "B", "multiple choice", 0.0),
    ("<answer>3</answer>", "<answer>3</answer>", "numerical", 1.0),
    ("<answer>3.0</answer>", "3", "numerical", 0.0),  # the decimal-mark rule
    ("<answer>3.141</answer>", "3.14", "numerical", 1.0),  # equal after rounding to 2 decimals
    ("<answer>EXIT ONLY</answer>", "EXIT ONLY", "OCR", 1.0),
    ("<answer>EXIT</answer>", "EXIT ONLY", "OCR", 0.5),  # one deletion of two reference words
    ("<answer>the cat lay on the mat</answer>", "the cat sat on the mat", "free-form", 34 / 45),
    ("no answer block", "the cat", "free-form", 0.0),
    ("<answer>2</answer>", "2.5", "regression", 1 - (0.5 + 1e-9) / (2.5 + 1e-9)),
])
def test_video_r1_accuracy_by_type(text, ref, ptype, want):
    r, found = video_r1_accuracy(text, ref, ptype)
    assert r == pytest.approx(want) and found == ("<answer>" in text)


def _samples():
    return [
        {"id": "a", "task": "mcq", "query": "q", "video": "v.mp4", "options": ["x", "y"], "answer": "B"},
        {"id": "b", "task": "qa", "query": "q", "video": "v.mp4", "answer": "3", "meta": {"problem_type": "numerical"}},
        {"id": "c", "task": "qa", "query": "q", "image": "i.png", "answer": "EXIT ONLY", "meta": {"problem_type": "OCR"}},
        {"id": "d", "task": "qa", "query": "q", "video": "v.mp4", "answer": "She opens a laptop.",
         "meta": {"problem_type": "free-form"}},
        {"id": "e", "task": "qa", "query": "q", "video": "v.mp4", "answer": "2.5", "meta": {"problem_type": "regression"}},
    ]


def test_registry_scores_the_mixed_data_per_sample_type():
    fn = build_reward_fn({"video_r1_accuracy": 1.0, "format": 1.0}, "mcq", parse_mode="video_r1")
    answers = ["B", "3", "EXIT ONLY", "She opens a laptop.", "2.5"]
    out = fn.score([f"<think>t</think><answer>{a}</answer>" for a in answers], _samples())
    assert out["video_r1_accuracy"][:4] == [1.0, 1.0, 1.0, 1.0]
    assert out["video_r1_accuracy"][4] == pytest.approx(1 - 1e-9 / (2.5 + 1e-9), abs=0)
    assert out["format"] == [1.0] * 5 and out["parse_failed"] == [False] * 5
    wrong = fn.score(["<think>t</think><answer>A</answer>", "<answer>4</answer>", "<think>t</think> EXIT", "", "x"],
                     _samples())
    assert wrong["video_r1_accuracy"] == [0.0, 0.0, 0.0, 0.0, 0.0]
    assert wrong["format"] == [1.0, 0.0, 0.0, 0.0, 0.0] and wrong["parse_failed"] == [False, False, True, True, True]
    with pytest.raises(Exception, match="open-answer"):  # a letter reward cannot score a free-text sample
        build_reward_fn({"mcq": 1.0}, "mcq").score(["<answer>3</answer>"], [_samples()[1]])


def test_stemmer_option():
    with pytest.raises(ValueError, match="rouge_stemmer"):
        build_reward_fn({"video_r1_accuracy": 1.0}, "mcq", rouge_stemmer="snowball")


@pytest.mark.parametrize("s, want", [
    ("[(5.2, 10.4)]", [(5.2, 10.4)]), ("[(1, 2),(3.5,4)]", [(1.0, 2.0), (3.5, 4.0)]), ("[(1, 2),]", [(1.0, 2.0)]),
    ("[]", []), ("[(10, 5)]", None), ("[[1, 2]]", None), ("[(1, 2)] and more", None), ("[(-1, 2)]", None),
    ("(1, 2)", None)])
def test_videochat_glue_list(s, want):
    assert videochat_r1_glue(s) == want


def test_nextgqa_format_is_videochat_r1_gqa():
    assert release_format("<think>a</think>\n<answer>A</answer> <glue>[(1.0, 2.0)]</glue>", "nextgqa") == 1.0
    # the project's old prompt: the evidence inside the answer block -- no <glue> after it
    assert release_format("<think>a</think><answer>(A) <glue>1.00 to 2.00</glue></answer>", "nextgqa") == 0.0
    assert release_format("<think>a</think><answer>A</answer><glue>1.00 to 2.00</glue>", "nextgqa") == 0.0
    assert release_format("<answer>A</answer><glue>[(1, 2)]</glue>", "nextgqa") == 0.0
    assert not math.isnan(release_format("", "nextgqa"))
