"""Sample.validate and load_jsonl: every kind of bad line gives a DataError naming file, line and field, or a
counted skip; missing media are reported all at once."""
import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmgrpo.vlm.data import DataError, Sample, load_jsonl, write_jsonl


def tvg(**kw):
    d = {"id": "a", "task": "tvg", "query": "when does the door open?", "video": "v.mp4", "duration": 10.0,
         "spans": [[1.0, 2.5]]}
    d.update(kw)
    return {k: v for k, v in d.items() if v is not None}


GOOD = [
    tvg(),
    {"id": "m", "task": "mcq", "query": "what colour?", "image": "i.png", "options": ["red", "blue"], "answer": "B"},
    {"id": "g", "task": "gqa", "query": "why?", "video": "v.mp4", "duration": 20, "spans": [[1, 2], [5, 7]],
     "options": ["a", "b", "c"], "answer": "A", "video_start": 0.5, "video_end": 15},
    {"id": "r", "task": "rec", "query": "the dog", "image": "i.png", "boxes": [[1, 2, 30, 40]],
     "image_size": [64, 48]},
]


@pytest.mark.parametrize("d", GOOD, ids=lambda d: d["task"])
def test_valid_samples_roundtrip(d):
    s = Sample.from_dict(d).validate()
    again = Sample.from_dict(json.loads(json.dumps(s.to_dict()))).validate()
    assert again == s


BAD = [
    (tvg(task="tvq"), "task", "unknown_task"),
    (tvg(query="   "), "query", "empty_query"),
    (tvg(spans=[[5.0, 2.0]]), "spans[0]", "reversed_span"),
    (tvg(spans=[[2.0, 11.0]]), "spans[0]", "span_out_of_range"),
    (tvg(spans=[[-1.0, 2.0]]), "spans[0]", "span_out_of_range"),
    (tvg(spans=[[3.0, 3.0]]), "spans[0]", "bad_span"),
    (tvg(spans=[[1.0, "x"]]), "spans[0]", "invalid"),
    (tvg(spans=[]), "spans", "missing_field"),
    (tvg(duration=None), "duration", "missing_field"),
    (tvg(duration=-3), "duration", "invalid"),
    (tvg(video=None), "video", "missing_field"),
    (tvg(image="x.png"), "video", "invalid"),
    (tvg(video_start=4.0, spans=[[1.0, 5.0]]), "spans[0]", "span_out_of_range"),
    (tvg(video_start=6.0, video_end=5.0, spans=[[5.5, 5.8]]), "video_start", "invalid"),
    ({"id": "m", "task": "mcq", "query": "q", "video": "v.mp4", "options": ["x"], "answer": "A"}, "options",
     "missing_field"),
    ({"id": "m", "task": "mcq", "query": "q", "video": "v.mp4", "options": ["x", "y"], "answer": "C"}, "answer",
     "invalid"),
    ({"id": "m", "task": "mcq", "query": "q", "video": "v.mp4", "options": ["x", "y"]}, "answer", "missing_field"),
    ({"id": "r", "task": "rec", "query": "q", "image": "i.png", "boxes": [[5, 2, 1, 40]], "image_size": [64, 48]},
     "boxes[0]", "bad_box"),
    ({"id": "r", "task": "rec", "query": "q", "image": "i.png", "boxes": [[1, 2, 99, 40]], "image_size": [64, 48]},
     "boxes[0]", "bad_box"),
    ({"id": "r", "task": "rec", "query": "q", "image": "i.png", "boxes": [[1, 2, 9, 40]]}, "image_size",
     "missing_field"),
]


@pytest.mark.parametrize("d, fieldname, kind", BAD)
def test_invalid_samples_name_the_field(d, fieldname, kind):
    with pytest.raises(DataError) as ei:
        Sample.from_dict(d).validate()
    assert ei.value.field == fieldname and ei.value.kind == kind
    assert f"field {fieldname!r}" in str(ei.value)


def test_missing_and_unknown_fields():
    with pytest.raises(DataError, match="field 'query': missing required field"):
        Sample.from_dict({"id": "a", "task": "tvg"})
    with pytest.raises(DataError, match=r"unknown field\(s\) \['span'\]"):
        Sample.from_dict({"id": "a", "task": "tvg", "query": "q", "span": [[1, 2]]})


def test_swap_reversed_option():
    s = Sample.from_dict(tvg(spans=[[5.0, 2.0]])).validate(swap_reversed=True)
    assert s.spans == [[2.0, 5.0]] and s.meta["swapped_spans"] == 1


def _write_lines(path, lines):
    with open(path, "wb") as fh:
        for ln in lines:
            fh.write(ln if isinstance(ln, bytes) else (ln + "\n").encode("utf-8"))
    return path


@pytest.fixture
def mixed(tmp_path):
    (tmp_path / "v.mp4").write_bytes(b"x")  # existence is all check_media looks at
    lines = [
        json.dumps(tvg(id="ok1")),                           # 1 ok
        "",                                                  # 2 blank: ignored
        '{"id": "broken", "task": ',                         # 3 malformed JSON
        b'{"id": "latin", "task": "tvg", "query": "caf\xe9"}\n',  # 4 not UTF-8
        json.dumps({"id": "nq", "task": "tvg", "video": "v.mp4"}),  # 5 missing query
        json.dumps(tvg(id="unk", task="vqa")),              # 6 unknown task
        json.dumps(tvg(id="rev", spans=[[4, 3]])),         # 7 reversed
        json.dumps(tvg(id="out", spans=[[4, 30]])),        # 8 outside [0, duration]
        json.dumps(tvg(id="emp", query="")),               # 9 empty query
        json.dumps(tvg(id="ok1")),                          # 10 duplicate id
        json.dumps(tvg(id="ok2")),                          # 11 ok
        json.dumps(tvg(id="gone1", video="missing1.mp4")),  # 12 missing media
        json.dumps(tvg(id="gone2", video="sub/missing2.mp4")),  # 13 missing media
    ]
    return _write_lines(tmp_path / "mixed.jsonl", lines)


EXPECT_RAISE = [
    (3, None, "malformed JSON"),
    (4, None, "not valid UTF-8"),
    (5, "query", "missing required field"),
    (6, "task", "unknown task"),
    (7, "spans[0]", "reversed span"),
    (8, "spans[0]", "outside"),
    (9, "query", "non-empty"),
    (10, "id", "duplicate id"),
]


def test_raise_names_file_line_field(mixed, tmp_path):
    """Delete the offending lines one by one: each is reported with its own line number and field."""
    lines = mixed.read_bytes().split(b"\n")
    for lineno, fieldname, msg in EXPECT_RAISE:
        with pytest.raises(DataError) as ei:
            load_jsonl(mixed)
        e = ei.value
        assert (e.line, e.field) == (lineno, fieldname), str(e)
        assert msg in str(e) and str(e).startswith(f"{mixed}:{lineno}")
        lines[lineno - 1] = b""  # blank it out and look for the next problem
        mixed.write_bytes(b"\n".join(lines))
    with pytest.raises(DataError) as ei:  # only the missing media are left: one error listing both
        load_jsonl(mixed)
    msg = str(ei.value)
    assert ei.value.kind == "missing_media" and "2 of 4 sample(s)" in msg
    assert "missing1.mp4" in msg and "sub/missing2.mp4" in msg and ":12" in msg and ":13" in msg


def test_skip_counts_and_logs(mixed, caplog):
    with caplog.at_level(logging.WARNING, logger="mmgrpo.data"):
        samples, rep = load_jsonl(mixed, on_error="skip")
    assert [s.id for s in samples] == ["ok1", "ok2"]
    assert rep.n_lines == 12 and rep.n_loaded == 2 and rep.n_skipped == 10
    assert rep.counts == {"malformed_json": 1, "not_utf8": 1, "missing_field": 1, "unknown_task": 1,
                          "reversed_span": 1, "span_out_of_range": 1, "empty_query": 1, "duplicate_id": 1,
                          "missing_media": 2}
    assert len(rep.missing_media) == 2 and all(p.startswith(str(mixed.parent)) for p in rep.missing_media)
    assert any("mixed.jsonl:6" in r.getMessage() for r in caplog.records)
    assert "10 skipped" in rep.summary()
    # media paths were resolved against the JSONL folder
    assert samples[0].video == str(mixed.parent / "v.mp4")


def test_swap_and_root(tmp_path):
    (tmp_path / "media").mkdir()
    (tmp_path / "media" / "v.mp4").write_bytes(b"x")
    p = _write_lines(tmp_path / "a.jsonl", [json.dumps(tvg(spans=[[4, 3]]))])
    samples, rep = load_jsonl(p, root=tmp_path / "media", swap_reversed=True)
    assert samples[0].spans == [[3.0, 4.0]] and rep.n_swapped_spans == 1
    assert samples[0].video == str(tmp_path / "media" / "v.mp4")
    with pytest.raises(DataError, match="file not found"):
        load_jsonl(tmp_path / "nope.jsonl")


def test_write_then_load(tmp_path):
    samples = [Sample.from_dict(d) for d in GOOD]
    for s in samples:
        s.video = s.video and "v.mp4"
    p = tmp_path / "out.jsonl"
    assert write_jsonl(samples, p) == 4
    back, rep = load_jsonl(p, check_media=False, resolve_paths=False)
    assert [b.to_dict() for b in back] == [s.validate().to_dict() for s in samples] and rep.n_skipped == 0


_num = st.floats(0, 1000, allow_nan=False, allow_infinity=False)


@given(d=st.floats(0.5, 500), a=st.floats(0, 1), b=st.floats(0, 1), q=st.text(min_size=1, max_size=40))
@settings(max_examples=100, deadline=None)
def test_roundtrip_property(tmp_path_factory, d, a, b, q):
    """Any in-range span and any non-blank text survive write -> load unchanged; out-of-range is rejected."""
    s, e = sorted((a * d, b * d))
    sample = Sample.from_dict(tvg(duration=d, spans=[[s, e]], query=q))
    ok = bool(q.strip()) and s < e
    if not ok:
        with pytest.raises(DataError):
            sample.validate()
        return
    p = tmp_path_factory.mktemp("rt") / "x.jsonl"
    write_jsonl([sample], p)
    (back,), _ = load_jsonl(p, check_media=False, resolve_paths=False)
    assert back.spans == [[s, e]] and back.query == q and back.duration == d
