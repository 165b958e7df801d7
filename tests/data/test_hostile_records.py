"""Hostile values in input records (issue 31, items 10 and 13): a field of the wrong type, a 400-digit number, JSON
nested thousands of levels deep, an integer past Python's 4300-digit limit. Each is one bad record whose message
names file, line (JSONL) or record, and field; ``on_error="skip"`` skips and counts it and keeps the rest. Before,
the converter ended with a bare ValueError / OverflowError / RecursionError naming nothing, even in skip mode, and
the training loader did the same for the last three."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmgrpo.utils.json_records import MAX_DEPTH, JSONRecordError, depth, parse_record
from mmgrpo.vlm.data import DataError, load_jsonl
from mmgrpo.vlm.data import converters as C

REPO = Path(__file__).resolve().parents[2]
BIG = "1" + "0" * 400               # a JSON integer float() cannot hold
HUGE = "9" * 5000                   # past Python's int-string limit: json.loads raises a plain ValueError
DEEP = "[" * 5000 + "]" * 5000      # json.loads raises RecursionError
MID = "[" * 200 + "]" * 200         # parses, but deeper than MAX_DEPTH


def _tr(qid, **kw):
    rec = {"qid": qid, "path": f"{qid}.mp4", "question": "when?", "answer": "1.0-2.0", "duration": 30}
    rec.update(kw)
    return json.dumps(rec)


def _time_r1_lines():
    """(JSONL lines, {line: (field or None, message part)}) of the bad records; lines 1 and 8 are good."""
    lines = [_tr("q1"),
             _tr("q2", duration="abc"),
             _tr("q3").replace('"duration": 30', f'"duration": {BIG}'),
             _tr("q4").replace('"duration": 30', f'"duration": 30, "x": {DEEP}'),
             _tr("q5").replace('"duration": 30', f'"duration": 30, "x": {HUGE}'),
             _tr("q6", timestamp=5).replace('"answer": "1.0-2.0", ', ""),
             _tr("q7", duration=[30]),
             _tr("q8")]
    bad = {2: ("duration", "must be a number, got 'abc'"), 3: ("duration", "must be a number, got 1000000"),
           4: (None, "nested too deeply"), 5: (None, "Exceeds the limit (4300 digits)"),
           6: ("timestamp", "must be [start, end], got 5"), 7: ("duration", "must be a number, got [30]")}
    return lines, bad


def test_converter_names_file_line_and_field_and_skip_mode_keeps_the_rest(tmp_path):
    lines, bad = _time_r1_lines()
    f = tmp_path / "timerft.jsonl"
    f.write_text("\n".join(lines) + "\n")
    samples, rep = C.convert_time_r1(f, on_error="skip")
    assert [s.id for s in samples] == ["q1", "q8"]
    assert rep.n_in == 8 and rep.n_out == 2 and sum(rep.skipped.values()) == 6
    assert rep.skipped == {"invalid": 4, "malformed_json": 2}
    got = {e.line: e for e in rep.errors}
    assert sorted(got) == sorted(bad)
    for ln, (fieldname, part) in bad.items():
        e = got[ln]
        assert e.path == str(f) and e.field == fieldname and part in e.message, (ln, str(e))
        assert str(e).startswith(f"{f}:{ln}")
    # raise mode: the first problem, located (bad lines are read before the records are converted)
    for ln in (2, 3, 7):
        f.write_text("\n".join([lines[0], lines[ln - 1]]) + "\n")
        with pytest.raises(DataError, match=rf"timerft\.jsonl:2, id='q{ln}', field 'duration': must be a number"):
            C.convert_time_r1(f)


def test_every_converter_catches_wrong_types_per_record(tmp_path):
    """A wrong-typed value in each converter's numeric fields: a counted skip naming the field."""
    anet = tmp_path / "anet.json"
    anet.write_text(json.dumps({"v1": {"duration": "abc", "timestamps": [[1, 2]], "sentences": ["a"]},
                                "v2": {"duration": 20, "timestamps": [[1, 2]], "sentences": ["b"]}}))
    s, rep = C.convert_dense_captions(anet, on_error="skip")
    assert [x.id for x in s] == ["v2_0"] and rep.errors[0].field == "duration"
    gqa = tmp_path / "gqa.json"
    row = {"video": "v", "question": "q", "options": ["(A) x", "(B) y"], "answer": "(A)", "glue": [[1, 2]]}
    gqa.write_text(json.dumps([{**row, "qid": "a", "duration": {"s": 1}}, {**row, "qid": "b", "duration": 10}]))
    s, rep = C.convert_nextgqa(gqa, on_error="skip")
    assert [x.id for x in s] == ["b"] and rep.errors[0].field == "duration" and rep.errors[0].sample_id == "a"
    ts = tmp_path / "ts.jsonl"
    row = {"problem": 'To accurately pinpoint the event "a dog" in the video, answer', "answer": "1 to 2",
           "videos": ["v.mp4"]}
    ts.write_text("\n".join(json.dumps({**row, "id": i, "duration": d}) for i, d in [(0, None), (1, "x"), (2, 9)]))
    s, rep = C.convert_tempsamp(ts, on_error="skip")
    assert [x.id for x in s] == ["2"] and [e.line for e in rep.errors] == [1, 2]
    rc = tmp_path / "rc.json"
    row = {"image": "i.jpg", "sentence": "the cat", "bbox": [1, 2, 3, 4], "width": 10, "height": 10}
    rc.write_text(json.dumps([{**row, "id": "a", "bbox": [1, "two", 3, 4]}, {**row, "id": "b", "width": "wide"},
                              {**row, "id": "c", "width": 10.5}, {**row, "id": "d"}]))
    s, rep = C.convert_refcoco(rc, on_error="skip")
    assert [x.id for x in s] == ["d"]
    assert [(e.sample_id, e.field) for e in rep.errors] == [("a", "bbox[0]"), ("b", "width"), ("c", "width")]
    assert str(rep.errors[0]).startswith(f"{rc}, id='a'")
    sta = tmp_path / "sta.txt"
    sta.write_text("V1 1.0 2.0##a cat\nV2 1.0 2.0##a dog\n")
    s, rep = C.convert_charades_sta(sta, durations={"V1": "long", "V2": 30}, on_error="skip")
    assert [x.id for x in s] == ["V2_2"] and (rep.errors[0].line, rep.errors[0].field) == (1, "duration")
    with pytest.raises(ValueError, match="needs durations"):  # a missing setting is never a skipped record
        C.convert_charades_sta(sta, on_error="skip")


def test_convert_cli_skip_mode_counts_and_raise_mode_names_the_record(tmp_path):
    lines, _ = _time_r1_lines()
    f = tmp_path / "in.jsonl"
    f.write_text("\n".join(lines[:3] + lines[7:]) + "\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = [sys.executable, str(REPO / "data" / "convert.py"), "time_r1", str(f), str(tmp_path / "out.jsonl")]
    r = subprocess.run(run + ["--on-error", "skip"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "2 samples from 4 records; skipped invalid: 2" in r.stdout
    assert f"{f}:2, id='q2', field 'duration': must be a number, got 'abc'" in r.stderr
    r = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"error: {f}:2, id='q2', field 'duration': must be a number, got 'abc'" in r.stderr


def test_training_loader_locates_hostile_lines_and_skips_them(tmp_path):
    good = {"id": "ok", "task": "tvg", "query": "q", "video": "v.mp4", "duration": 10, "spans": [[1, 2]]}

    def line(sid, **kw):
        return json.dumps({**good, "id": sid, **kw})

    rows = [line("a").replace('"duration": 10', f'"duration": {BIG}'),
            line("b").replace('[[1, 2]]', f'[[1, {BIG}]]'),
            line("c").replace('"spans"', f'"meta": {{"x": {DEEP}}}, "spans"'),
            line("d").replace('"spans"', f'"meta": {{"x": {MID}}}, "spans"'),
            line("e").replace('"spans"', f'"meta": {{"x": {HUGE}}}, "spans"'),
            line("ok")]
    f = tmp_path / "train.jsonl"
    f.write_text("\n".join(rows) + "\n")
    samples, rep = load_jsonl(f, on_error="skip", check_media=False)
    assert [s.id for s in samples] == ["ok"]
    assert rep.n_skipped == 5 and rep.counts == {"invalid": 2, "malformed_json": 3}
    msgs = {e.line: str(e) for e in rep.errors}
    assert msgs[1] == f"{f}:1, id='a', field 'duration': must be a positive number of seconds, got <401-digit integer>"
    assert msgs[2].startswith(f"{f}:2, id='b', field 'spans[0]': must be a pair of finite numbers")
    assert msgs[3] == f"{f}:3: JSON nested too deeply to parse (more than {MAX_DEPTH} levels allowed)"
    assert msgs[4] == f"{f}:4: JSON nested 202 levels deep (at most {MAX_DEPTH} allowed)"
    assert msgs[5].startswith(f"{f}:5: unreadable JSON: Exceeds the limit (4300 digits)")
    for ln in range(1, 6):  # raise mode: the same message, first problem only
        f.write_text(rows[ln - 1] + "\n")
        with pytest.raises(DataError) as ei:
            load_jsonl(f, check_media=False)
        assert str(ei.value) == msgs[ln].replace(":%d" % ln, ":1", 1)


def test_flow_prompt_files_name_file_and_line(tmp_path):
    from flow_grpo.data import load_prompts

    for bad, part in [(f'{{"prompt": "a", "tag": {DEEP}}}', "nested too deeply"),
                      (f'{{"prompt": "a", "n": {HUGE}}}', "Exceeds the limit"),
                      (f'{{"prompt": "a", "m": {MID}}}', "nested 201 levels deep")]:
        f = tmp_path / "p.jsonl"
        f.write_text('{"prompt": "a cat"}\n' + bad + "\n")
        with pytest.raises(ValueError, match=rf"p\.jsonl:2: invalid JSON \(.*{part}"):
            load_prompts(str(f))


@settings(max_examples=60, deadline=None)
@given(st.recursive(st.none() | st.integers() | st.text(max_size=3),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=2), c, max_size=3),
                    max_leaves=20))
def test_depth_matches_a_recursive_definition(obj):
    def ref(x):
        if isinstance(x, dict):
            return 1 + max((ref(v) for v in x.values()), default=0)
        if isinstance(x, list):
            return 1 + max((ref(v) for v in x), default=0)
        return 0
    assert depth(obj) == ref(obj)
    assert parse_record(json.dumps(obj)) == obj


def test_parse_record_limits():
    assert parse_record("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    with pytest.raises(JSONRecordError, match="nested 65 levels"):
        parse_record("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    with pytest.raises(JSONRecordError, match=r"malformed JSON: Expecting value \(column 2\)"):
        parse_record("[")
