"""Parsers of the UnifiedReward judges' released output formats (no model).

The golden outputs are written from the releases' documentation: the example output block that each released
prompt template carries (UnifiedReward-Think: ``<think>`` with per-dimension ``Image k (s/10)`` scores and a
``Total score`` block, then ``<answer>Image k is better</answer>``; UnifiedReward-2.0 pointwise ACS: three
``<Dim> Score (1-5): s`` lines; UnifiedReward-qwen pointwise: ``Final Score: s``).  Expected values are by hand."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flow_grpo.rewards.unified_reward import (
    UnifiedRewardPointwise,
    UnifiedRewardThinkPairwise,
    parse_acs,
    parse_final_score,
    parse_think_pair,
)
from flow_grpo.rewards.unified_reward_templates import TEMPLATES

# the Think-qwen-7b template's example, with its order of images per line (Image 2 first on line 2)
THINK_QWEN25_DOC = (
    "<think>\n1. Semantic consistency: Image 1 (9/10) - ...; Image 2 (7/10) - ...\n"
    "2. Aesthetics: Image 2 (8/10) - ...; Image 1 (8/10) - ...\n"
    "3. Authenticity: Image 1 (8/10) - ...; Image 2 (5/10) - ...\n"
    "[Additional dimensions if any]: Image 2 (8/10) - ...; Image 1 (6/10) - ...\n"
    "Total score:\nImage 1: 9+8+8+6=31\nImage 2: 7+8+5+8=28\n</think>\n<answer>Image 1 is better</answer>")
# the Think-qwen3vl template's example: 3-line blocks, indented
THINK_QWEN3_DOC = """<think>
        1. Semantic consistency: 
            Image 1 (9/10) - The cat is there.; 
            Image 2 (7/10) - No table.
        2. Aesthetics: 
            Image 1 (8/10) - ...; 
            Image 2 (8/10) - ...
        3. Authenticity: 
            Image 1 (5/10) - ...; 
            Image 2 (8/10) - ...
        Total score:
        Image 1: 9+8+5=22
        Image 2: 7+8+8=23
        </think>
        <answer>Image 2 is better</answer>"""


def test_templates_are_the_released_texts():
    """Lengths and the sentences the parsers depend on (the answer strings and the example format)."""
    q25, kind = TEMPLATES["think_qwen25"]
    assert kind == "pair" and len(q25) == 1592 and q25.endswith("Text Caption: [{prompt}]")
    assert "output exactly one of the following strings: 'Image 1 is better' or 'Image 2 is better'" in q25
    q3, kind = TEMPLATES["think_qwen3"]
    assert kind == "pair" and len(q3) == 3191 and "「{prompt}」" in q3 and "<answer>Image 1 is better</answer>" in q3
    fs, kind = TEMPLATES["final_score"]
    assert kind == "point" and len(fs) == 810 and "assign a score from 1 to 5 after 'Final Score:'" in fs
    acs, kind = TEMPLATES["acs"]
    assert kind == "point" and len(acs) == 733 and "Alignment Score (1-5): X\nCoherence Score (1-5): Y\n" in acs
    for text, _ in TEMPLATES.values():
        assert text.count("{") == 1 and text.count("}") == 1  # only the {prompt} field


def test_think_pair_golden_outputs():
    v = parse_think_pair(THINK_QWEN25_DOC)
    assert (v.winner, v.failure, v.pref, v.answer) == (1, None, 1.0, "Image 1 is better")
    assert v.dim_scores == {1: (9.0, 8.0, 8.0, 6.0), 2: (7.0, 8.0, 5.0, 8.0)}  # read per image, whatever the order
    assert v.totals == {1: 31.0, 2: 28.0}
    v = parse_think_pair(THINK_QWEN3_DOC)
    assert (v.winner, v.failure, v.pref) == (2, None, 0.0)
    assert v.dim_scores == {1: (9.0, 8.0, 5.0), 2: (7.0, 8.0, 8.0)} and v.totals == {1: 22.0, 2: 23.0}
    # Pref-GRPO's video variant of the same format
    assert parse_think_pair("<think>x</think><answer>Video 2 is better</answer>").winner == 2
    # case and spacing are tolerated; the verdict is the answer's, not the totals'
    assert parse_think_pair("<think>Image 1: 1+1=2\nImage 2: 5+5=10</think><ANSWER> image  1 IS better </ANSWER>"
                            ).winner == 1


@pytest.mark.parametrize("text, reason", [
    (None, "not_text"), (3, "not_text"), ("", "empty"), ("  \n", "empty"),
    ("<think>1. Semantic consistency: Image 1 (9/10)", "truncated"),           # cut inside the reasoning
    ("<think>ok</think>\n<answer>Image 1 is", "truncated"),                     # cut inside the answer
    ("Image 1 is better", "no_answer"),                                         # no tags at all
    ("<think>a</think> The answer: Image 2 is better.", "no_answer"),
    ("<answer>Image 1 is better, Image 2 is better</answer>", "ambiguous"),     # both orders
    ("<answer>Image 1 is better</answer><answer>Image 2 is better</answer>", "ambiguous"),
    ("<answer>Both are equal</answer>", "unrecognised"),
    ("<answer>Image 3 is better</answer>", "unrecognised"),
])
def test_think_pair_failures_are_reasons_not_exceptions(text, reason):
    v = parse_think_pair(text)
    assert (v.winner, v.failure, v.pref) == (None, reason, 0.5)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), st.binary().map(lambda b: b.decode("latin-1")),
                 st.sampled_from([THINK_QWEN25_DOC, THINK_QWEN3_DOC]).flatmap(
                     lambda s: st.integers(0, len(s)).map(lambda k: s[:k]))))
def test_think_pair_never_raises_on_garbage_or_truncations(text):
    v = parse_think_pair(text)
    assert v.pref in (0.0, 0.5, 1.0)
    assert (v.winner is None) == (v.failure is not None)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, len(THINK_QWEN25_DOC)))
def test_a_truncated_think_output_has_a_verdict_only_once_the_answer_is_closed(k):
    v = parse_think_pair(THINK_QWEN25_DOC[:k])
    done = THINK_QWEN25_DOC[:k].endswith("</answer>")
    assert (v.winner == 1) == done
    if not done:
        assert v.failure in ("truncated", "no_answer", "empty")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=40),
       st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=40))
def test_both_winners_in_any_order_and_padding_is_a_failure(pre, post):
    for a, b in ((1, 2), (2, 1)):
        v = parse_think_pair(f"<answer>{pre} Image {a} is better. {post} Image {b} is better</answer>")
        assert v.failure == "ambiguous" and v.pref == 0.5


def test_pointwise_golden_outputs():
    v = parse_final_score("a red cube (object): 1\nred (attribute): 1\nFinal Score: 4")
    assert v.scores == {"Final": 4.0} and v.failure is None
    assert parse_final_score("Final Score: 3.5").scores == {"Final": 3.5}
    # UnifiedReward-2.0's documented example output (decimal scores)
    v = parse_acs("Alignment Score (1-5): 2.694700002670288\nCoherence Score (1-5): 2.371500015258789\n"
                  "Style Score (1-5): 2.802500009536743")
    assert v.failure is None and v.scores == {"Alignment": 2.694700002670288, "Coherence": 2.371500015258789,
                                              "Style": 2.802500009536743}


@pytest.mark.parametrize("text, reason", [
    ("Final Score:", "no_score"), ("no score here", "no_score"), ("Final Score: 7", "out_of_range"),
    ("Final Score: 0", "out_of_range"), ("Final Score: 2\nFinal Score: 5", "ambiguous"), (None, "not_text"),
])
def test_final_score_failures(text, reason):
    assert parse_final_score(text).failure == reason


def test_acs_failures():
    assert parse_acs("Alignment Score (1-5): 3\nStyle Score (1-5): 4").failure == "no_score"  # Coherence missing
    assert parse_acs("Alignment Score (1-5): 3\nCoherence Score (1-5): 3\nStyle Score (1-5): 9").failure == \
        "out_of_range"
    assert parse_acs("Final Score: 3").failure == "no_score"
    # a repeated identical line is fine, a contradicting one is not
    ok = "Alignment Score (1-5): 3\nCoherence Score (1-5): 3\nStyle Score (1-5): 4\n"
    assert parse_acs(ok + "Style Score (1-5): 4").failure is None
    assert parse_acs(ok + "Style Score (1-5): 2").failure == "ambiguous"


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_pointwise_parsers_never_raise(text):
    for parse in (parse_final_score, parse_acs):
        v = parse(text)
        assert (v.failure is None) == bool(v.scores)


def _pointwise(template, weights=None):
    """The reward without its model (GenerativeJudge): the text -> score mapping alone."""
    r = UnifiedRewardPointwise.__new__(UnifiedRewardPointwise)
    from collections import Counter

    from flow_grpo.rewards.unified_reward import _POINT_PARSERS

    r.name, r.nan_policy = "unified_reward", "raise"
    r.parse, r.dims = _POINT_PARSERS[template]
    r.weights = {d: 1.0 for d in r.dims} | dict(weights or {})
    r.stats = Counter()
    return r


def test_pointwise_scores_from_texts_by_hand():
    r = _pointwise("final_score")
    out = r.scores_from_texts(["Final Score: 5", "Final Score: 2", "garbage", "Final Score: 3"],
                              truncated=[False, False, True, False])
    np.testing.assert_allclose(out["unified_reward"], [1.0, 0.25, 0.5, 0.5])  # (s - 1) / 4; failure -> 0.5
    np.testing.assert_array_equal(out["valid"], [True, True, False, True])
    np.testing.assert_array_equal(out["unified_reward/parse_failed"], [0, 0, 1, 0])
    assert r.stats == {"judged": 4, "failed": 1, "failed/truncated": 1}
    # ACS with Pref-GRPO's weights (Coherence dropped): (a - 1)/4 and (t - 1)/4 averaged
    r = _pointwise("acs", {"Coherence": 0.0})
    out = r.scores_from_texts(["Alignment Score (1-5): 5\nCoherence Score (1-5): 1\nStyle Score (1-5): 3"])
    np.testing.assert_allclose(out["unified_reward"], [(1.0 + 0.5) / 2])
    np.testing.assert_allclose(out["unified_reward/coherence"], [1.0])


def test_pairwise_prefs_from_texts_count_failures():
    s = UnifiedRewardThinkPairwise.__new__(UnifiedRewardThinkPairwise)
    from collections import Counter

    s.stats = Counter()
    out = s.prefs_from_texts([THINK_QWEN25_DOC, THINK_QWEN3_DOC, "<answer>Image 1 is better; Image 2 is better"
                              "</answer>", "<think>cut"], truncated=[False, False, False, True])
    np.testing.assert_allclose(out["pref"], [1.0, 0.0, 0.5, 0.5])
    np.testing.assert_array_equal(out["failed"], [False, False, True, True])
    assert s.stats == {"judged": 4, "failed": 2, "failed/ambiguous": 1, "failed/truncated": 1}


def test_parsers_stay_linear_on_adversarial_lengths():
    """Unclosed tags and long runs (a runaway generation) parse in linear time: each input below took minutes
    with a lazy-regex answer search; the bound is loose for a loaded CI machine."""
    import time

    for text in ("<answer>" * 50_000 + "x", "<answer>" * 20_000 + "</answer>" + "<answer>" * 20_000,
                 "Image 1: " + "1 " * 100_000, "<think>" + "Image 1 (" * 50_000, "Final Score " * 50_000):
        t0 = time.perf_counter()
        assert parse_think_pair(text).failure is not None
        parse_acs(text), parse_final_score(text)
        assert time.perf_counter() - t0 < 5.0
