"""Parsers: documented formats, statuses, and hypothesis fuzzing (they must never raise)."""
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmgrpo.vlm.rewards.parsing import (
    Box,
    ParseStatus,
    Span,
    completion_text,
    extract_answer,
    extract_block,
    find_boxes,
    find_choices,
    find_numbers,
    find_spans,
    parse_box,
    parse_boxes,
    parse_choice,
    parse_number,
    parse_span,
    parse_spans,
    parse_structure,
)

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------------------------------------------------
# answer blocks
# ---------------------------------------------------------------------------------------------------------------


def test_last_answer_block_wins_and_tags_are_case_insensitive():
    t = "<think>a</think><answer>first</answer> hmm <Answer>second</ANSWER>"
    blk = extract_answer(t)
    assert (blk.content, blk.source, blk.closed, blk.n_blocks) == ("second", "answer", True, 2)
    assert extract_block("< answer >x</ answer >") == "x"


def test_unclosed_answer_tag_by_config():
    t = "<answer>done</answer> <answer>partial"
    assert extract_block(t, allow_unclosed=True) == "partial"
    assert extract_block(t, allow_unclosed=False) == "done"  # last complete block
    assert extract_block("<answer>partial", allow_unclosed=False) is None
    assert extract_answer("<answer>partial", allow_unclosed=True).closed is False


def test_fallback_and_statuses():
    assert extract_answer("no tags").status is ParseStatus.NO_ANSWER_BLOCK
    blk = extract_answer("no tags", fallback_to_text=True)
    assert (blk.status, blk.source, blk.content) == (ParseStatus.OK, "text", "no tags")
    for empty in (None, "", "   ", 3, object()):
        assert extract_answer(empty).status is ParseStatus.EMPTY


def test_completion_text_accepts_chat_messages():
    assert completion_text("x") == "x"
    assert completion_text([{"role": "assistant", "content": "y"}]) == "y"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "a"}, {"text": "b"}]}]) == "ab"
    assert completion_text(None) is None and completion_text([]) is None and completion_text(5) is None


def test_structure_strict_and_loose():
    ok = "<think>reason</think>\n<answer>1 to 2</answer>\n"
    st_ = parse_structure(ok)
    assert st_.strict and st_.loose
    assert not parse_structure(ok + "trailing").strict
    assert not parse_structure("pre " + ok).strict
    assert not parse_structure("<think>a</think><answer>b</answer><answer>c</answer>").strict
    assert not parse_structure("<answer>b</answer><think>a</think>").strict
    assert not parse_structure("<think>a<answer>x</answer></think><answer>b</answer>").strict
    assert parse_structure("<answer>b</answer>").loose and not parse_structure("<answer>b").loose
    # Qwen3-style: <think> is in the prompt
    assert parse_structure("a</think><answer>b</answer>", think_in_prompt=True).strict
    assert not parse_structure("a</think><answer>b</answer>").strict
    assert parse_structure("<Think>a</Think><Answer>b</Answer>").strict  # TempSamp's capitalised tags


# ---------------------------------------------------------------------------------------------------------------
# spans
# ---------------------------------------------------------------------------------------------------------------

SPAN_CASES = [
    ("12.5 to 17.8", (12.5, 17.8)),
    ("12.5 - 17.8", (12.5, 17.8)),
    ("12.5-17.8", (12.5, 17.8)),
    ("12.5\u201317.8 seconds", (12.5, 17.8)),  # en dash
    ("12.5 \u2014 17.8", (12.5, 17.8)),  # em dash
    ("from 12.5s to 17.8s", (12.5, 17.8)),
    ("from 12.5 seconds to 17.8 seconds.", (12.5, 17.8)),
    ("between 12 and 18", (12.0, 18.0)),
    ("00:01:02.5 to 00:01:10", (62.5, 70.0)),
    ("1:02:03 - 1:02:04", (3723.0, 3724.0)),
    ("01:02 to 01:10.5", (62.0, 70.5)),
    ('{"start_time": "12.5", "end_time": 17.8}', (12.5, 17.8)),
    ('{"start_time": 12.5, "end_time": "17.8"}', (12.5, 17.8)),
    ("{'start': '00:12', 'end': '00:17.5'}", (12.0, 17.5)),
    ('{"end_time": 17.8, "start_time": 12.5}', (12.5, 17.8)),  # key order does not matter
    ("start_time = 3, end_time = 4", (3.0, 4.0)),
    ("[12.5, 17.8]", (12.5, 17.8)),
    ("(12.5, 17.8)", (12.5, 17.8)),
    ("12.5, 17.8", (12.5, 17.8)),  # only two numbers
    (".5 to 2", (0.5, 2.0)),
    ("The event happens 3.25 ~ 7.5", (3.25, 7.5)),
]


@pytest.mark.parametrize("text,expected", SPAN_CASES)
def test_span_formats(text, expected):
    for wrapped in (f"<answer>{text}</answer>", f"<think>x</think><answer> {text} </answer>"):
        p = parse_span(wrapped)
        assert p.ok and p.source == "answer"
        assert (p.value.start, p.value.end) == pytest.approx(expected)
        assert p.value.reversed is False


def test_reversed_span_is_swapped_and_flagged():
    p = parse_span("<answer>17.8 to 12.5</answer>")
    assert (p.value.start, p.value.end, p.value.reversed) == (12.5, 17.8, True)
    p = parse_span('<answer>{"start_time": 9, "end_time": 3}</answer>')
    assert (p.value.start, p.value.end, p.value.reversed) == (3.0, 9.0, True)


def test_multiple_spans_and_selection():
    spans, invalid = find_spans("first 1 to 2, then [3, 4] and {\"start\": 5, \"end\": 6}")
    assert [(s.start, s.end) for s in spans] == [(1, 2), (3, 4), (5, 6)] and not invalid
    nested, _ = find_spans("[[1.5, 2.5], [10, 12]]")
    assert [(s.start, s.end) for s in nested] == [(1.5, 2.5), (10, 12)]
    assert [tuple(s) for s in parse_spans("<answer>0 to 1 and 5 to 6</answer>").value] == [(0, 1), (5, 6)]
    # auto: first span inside an answer block, last span of the fallback text
    assert tuple(parse_span("<answer>0 to 1 and 5 to 6</answer>").value) == (0, 1)
    assert tuple(parse_span("maybe 0 to 1, no: 5 to 6").value) == (5, 6)
    assert tuple(parse_span("<answer>0 to 1 and 5 to 6</answer>", which="last").value) == (5, 6)
    assert tuple(parse_span("maybe 0 to 1, no: 5 to 6", which="first").value) == (0, 1)


def test_span_junk_is_none_with_status():
    assert parse_span("<answer>NaN to 5</answer>").status is ParseStatus.INVALID
    assert parse_span('<answer>{"start_time": "inf", "end_time": 3}</answer>').status is ParseStatus.INVALID
    assert parse_span("<answer>" + "9" * 400 + " to 5</answer>").status is ParseStatus.INVALID  # overflow → inf
    assert parse_span("<answer>00:75 to 01:00</answer>").status is ParseStatus.INVALID  # 75 s is not a clock
    assert parse_span("<answer>a while</answer>").status is ParseStatus.NO_MATCH
    assert parse_span("<answer>12.5</answer>").status is ParseStatus.NO_MATCH  # a single time is not a span
    assert parse_span("<answer>at 12.5, 17.8, 20</answer>").status is ParseStatus.NO_MATCH  # a bare list
    assert parse_span("<answer> </answer>").status is ParseStatus.EMPTY
    assert parse_span("no block", fallback_to_text=False).status is ParseStatus.NO_ANSWER_BLOCK
    # version numbers and digits inside words are not times
    assert parse_span("<answer>Qwen2.5 to v3</answer>").status is ParseStatus.NO_MATCH


def test_span_tolerates_negative_only_in_keyed_values():
    p = parse_span('<answer>{"start_time": -3, "end_time": 4}</answer>')
    assert (p.value.start, p.value.end) == (-3.0, 4.0)  # clamped later by the reward
    p = parse_span("<answer>-3 to 4</answer>")  # '-' here is text, not a sign
    assert (p.value.start, p.value.end) == (3.0, 4.0)


@settings(max_examples=100, deadline=None)
@given(
    s=st.integers(0, 10**6).map(lambda k: k / 100),
    e=st.integers(0, 10**6).map(lambda k: k / 100),
    sep=st.sampled_from([" to ", " - ", "-", "\u2013", " and ", " ~ "]),
    unit=st.sampled_from(["", "s", " seconds"]),
)
def test_span_roundtrip(s, e, sep, unit):
    p = parse_span(f"<answer>{s:.2f}{unit}{sep}{e:.2f}{unit}</answer>")
    assert p.ok
    assert (p.value.start, p.value.end) == (min(s, e), max(s, e))
    assert p.value.reversed == (s > e)


@settings(max_examples=60, deadline=None)
@given(s=st.integers(0, 99 * 3600), e=st.integers(0, 99 * 3600), frac=st.integers(0, 99))
def test_span_roundtrip_clock(s, e, frac):
    def clock(t):
        return f"{t // 3600:02d}:{t % 3600 // 60:02d}:{t % 60:02d}.{frac:02d}"

    p = parse_span(f"<answer>from {clock(s)} to {clock(e)}</answer>")
    a, b = s + frac / 100, e + frac / 100
    assert (p.value.start, p.value.end) == pytest.approx((min(a, b), max(a, b)))


# ---------------------------------------------------------------------------------------------------------------
# choices
# ---------------------------------------------------------------------------------------------------------------

CHOICE_CASES = [
    ("(C)", ("C",)),
    ("C.", ("C",)),
    ("C", ("C",)),
    ("c", ("C",)),
    ("The answer is C", ("C",)),
    ("The answer is C because the dog barks.", ("C",)),
    ("Answer: C) a bird", ("C",)),
    ("answer: (B)", ("B",)),
    ("Option B", ("B",)),
    ("**B**", ("B",)),
    ("A, C", ("A", "C")),
    ("C, A", ("A", "C")),
    ("(A) and (C)", ("A", "C")),
    ("A and C.", ("A", "C")),
    ("B: a cat", ("B",)),
    ("C <glue>3.00 to 7.50</glue>", ("C",)),  # GQA: letter then the evidence tag
    ("I think the answer is (D)", ("D",)),
    ("a bird", ("C",)),  # exact option text
    ("A bird.", ("C",)),
]


@pytest.mark.parametrize("text,expected", CHOICE_CASES)
def test_choice_formats(text, expected):
    opts = ["(A) a dog", "(B) a cat", "(C) a bird", "(D) a fish"]
    p = parse_choice(f"<answer>{text}</answer>", options=opts)
    assert p.ok and p.value == expected


def test_choice_does_not_read_articles_or_pronouns_as_letters():
    for text in ("A person opens the door", "I don't know", "It is unclear"):
        assert parse_choice(f"<answer>{text}</answer>").status is ParseStatus.NO_MATCH, text


def test_choice_out_of_range_letter_is_invalid():
    p = parse_choice("<answer>E</answer>", options=["x", "y", "z", "w"])
    assert p.status is ParseStatus.INVALID and p.value is None
    assert parse_choice("<answer>E</answer>").value == ("E",)  # no options: any letter A-Z
    assert find_choices("F", n_options=6) == (("F",), False)


# ---------------------------------------------------------------------------------------------------------------
# numbers and boxes
# ---------------------------------------------------------------------------------------------------------------


def test_numbers():
    assert find_numbers("3 apples, -2.5, 1,234.5 and 1e3 or 3/4") == ([3.0, -2.5, 1234.5, 1000.0, 0.75], False)
    assert parse_number("<answer>about 42 meters</answer>").value == 42.0
    assert parse_number("first 1 then 2").value == 2.0  # fallback text: last number
    assert parse_number("<answer>1/0</answer>").status is ParseStatus.INVALID
    assert parse_number("<answer>none</answer>").status is ParseStatus.NO_MATCH


def test_boxes():
    p = parse_box('<answer>[{"bbox_2d": [10, 20, 30.5, 40], "label": "cat"}]</answer>')
    assert tuple(p.value) == (10, 20, 30.5, 40) and not p.value.reversed
    p = parse_boxes("<answer>[30, 40, 10, 20] and <|box_start|>(1,2),(3,4)<|box_end|></answer>")
    assert [tuple(b) for b in p.value] == [(10, 20, 30, 40), (1, 2, 3, 4)]
    assert p.value[0].reversed and not p.value[1].reversed
    assert parse_box("<answer>[1, 2, 3]</answer>").status is ParseStatus.NO_MATCH
    assert parse_box("<answer>[1, 2, 3, 1e999]</answer>").status is ParseStatus.INVALID


# ---------------------------------------------------------------------------------------------------------------
# fuzzing: never raise, consistent results
# ---------------------------------------------------------------------------------------------------------------

PIECES = [
    "<answer>", "</answer>", "<Answer>", "<think>", "</think>", "<glue>", "</glue>", " to ", "-", "\u2013", " and ",
    "12.5", "0", "1:02:03.5", "99:99", "3:", ":4", ".", "s", " seconds", "[", "]", "(", ")", ",", "{", "}",
    '"start_time":', '"end_time":', "'start':", "=", '"', "NaN", "inf", "9" * 350, "-1e999", "A", "(C)", "c.",
    "The answer is", "Answer:", "bbox_2d", "\n", " ", "\u00df", "\x00", "1/0",
]  # fmt: skip
texts = st.one_of(st.text(max_size=300), st.lists(st.sampled_from(PIECES), max_size=40).map("".join))


def _check_parsed(p, kind):
    assert isinstance(p.status, ParseStatus)
    assert (p.value is not None) == (p.status is ParseStatus.OK)
    if p.value is None:
        return
    vals = p.value if isinstance(p.value, list) else [p.value]
    for v in vals:
        if kind is Span:
            assert isinstance(v, Span) and math.isfinite(v.start) and math.isfinite(v.end) and v.start <= v.end
        elif kind is Box:
            assert isinstance(v, Box) and all(math.isfinite(c) for c in v) and v.x1 <= v.x2 and v.y1 <= v.y2
        elif kind is float:
            assert math.isfinite(v)
        else:
            assert v and all(len(x) == 1 and "A" <= x <= "Z" for x in v) and list(v) == sorted(set(v))


@FUZZ
@given(t=texts, fallback=st.booleans(), unclosed=st.booleans())
def test_parsers_never_raise(t, fallback, unclosed):
    kw = dict(fallback_to_text=fallback, allow_unclosed=unclosed)
    _check_parsed(parse_span(t, **kw), Span)
    _check_parsed(parse_spans(t, **kw), Span)
    _check_parsed(parse_choice(t, options=["x", "y", "z"], **kw), str)
    _check_parsed(parse_choice(t, **kw), str)
    _check_parsed(parse_number(t, **kw), float)
    _check_parsed(parse_box(t, **kw), Box)
    _check_parsed(parse_boxes(t, **kw), Box)
    st_ = parse_structure(t)
    assert not st_.strict or st_.loose
    parse_structure(t, think_in_prompt=True)
    extract_block(t, "glue", allow_unclosed=unclosed)


@settings(max_examples=20, deadline=None)
@given(x=st.one_of(st.none(), st.integers(), st.floats(), st.binary(max_size=10), st.lists(st.integers(), max_size=3)))
def test_parsers_accept_non_strings(x):
    for fn in (parse_span, parse_spans, parse_choice, parse_number, parse_box, parse_boxes):
        assert not fn(x).ok
    assert not parse_structure(x).loose
