"""Golden tests: each converter on a hand-written input file against a hand-written expected JSONL."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmgrpo.vlm.data import DataError, load_jsonl
from mmgrpo.vlm.data import converters as C

FIX = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]


def _expected(name):
    return [json.loads(line) for line in (FIX / name).read_text(encoding="utf-8").splitlines() if line.strip()]


def _dicts(samples):
    return [s.to_dict() for s in samples]


def test_charades_sta_golden_csv_durations():
    samples, rep = C.convert_charades_sta(FIX / "charades_sta.txt", durations=FIX / "charades_durations.csv",
                                          video_dir="videos")
    assert _dicts(samples) == _expected("charades_sta.expected.jsonl")
    assert (rep.n_in, rep.n_out, rep.n_clamped) == (4, 4, 2)


def test_charades_sta_dict_durations_and_errors(tmp_path):
    samples, _ = C.convert_charades_sta(FIX / "charades_sta.txt", durations={"3MSZA": 30.0, "AO8RW": 30.2},
                                        video_dir="videos")
    assert _dicts(samples) == _expected("charades_sta.expected.jsonl")
    # a missing duration: raise names file, line and field; skip counts it
    with pytest.raises(DataError) as ei:
        C.convert_charades_sta(FIX / "charades_sta.txt", durations={"3MSZA": 30.0})
    msg = str(ei.value)
    assert "charades_sta.txt:4" in msg and "'duration'" in msg and "AO8RW" in msg
    samples, rep = C.convert_charades_sta(FIX / "charades_sta.txt", durations={"3MSZA": 30.0}, on_error="skip")
    assert len(samples) == 2 and rep.skipped == {"missing_field": 2}
    # reversed span: error by default, swapped on request; far past the duration: error
    bad = tmp_path / "bad.txt"
    bad.write_text("VID1 9.0 3.0##reversed\nVID1 2.0 99.0##way past the end\nno hashes here\n")
    with pytest.raises(DataError, match=r"bad.txt:1.*reversed span"):
        C.convert_charades_sta(bad, durations={"VID1": 30.0})
    s, rep = C.convert_charades_sta(bad, durations={"VID1": 30.0}, swap_reversed=True, on_error="skip")
    assert [x.spans for x in s] == [[[3.0, 9.0]]] and rep.n_swapped == 1
    assert rep.skipped == {"span_out_of_range": 1, "malformed": 1}


def test_charades_sta_probe_durations(tmp_path):
    from mmgrpo.video.testing import write_index_video

    write_index_video(tmp_path / "VID1.mp4", 40, 8.0)  # 5 s
    txt = tmp_path / "c.txt"
    txt.write_text("VID1 1.0 4.5##someone waves\n")
    (s,), _ = C.convert_charades_sta(txt, durations=None, probe_root=tmp_path)
    assert s.duration == pytest.approx(5.0) and s.spans == [[1.0, 4.5]] and s.video == "VID1.mp4"


def test_dense_captions_golden():
    samples, rep = C.convert_dense_captions(FIX / "activitynet_captions.json")
    assert _dicts(samples) == _expected("activitynet_captions.expected.jsonl")
    assert rep.n_clamped == 1


def test_dense_captions_mismatched_lengths():
    with pytest.raises(DataError, match=r"id='v1'.*'timestamps'.*2 timestamps for 1 sentences"):
        C.convert_dense_captions({"v1": {"duration": 10, "timestamps": [[0, 1], [2, 3]], "sentences": ["a"]}})


def test_time_r1_golden():
    samples, _ = C.convert_time_r1(FIX / "time_r1.json")
    assert _dicts(samples) == _expected("time_r1.expected.jsonl")
    with pytest.raises(DataError, match="start-end"):
        C.convert_time_r1([{"path": "a.mp4", "question": "q", "answer": "soon", "duration": 10}])


def test_nextgqa_golden():
    samples, _ = C.convert_nextgqa(FIX / "nextgqa.json")
    assert _dicts(samples) == _expected("nextgqa.expected.jsonl")
    with pytest.raises(DataError, match="labelled C, expected B"):
        C.convert_nextgqa([{"video": "v", "question": "q", "options": ["(A) x", "(C) y"], "duration": 5,
                            "glue": [[1, 2]], "answer": "(A)"}])


def test_video_r1_golden():
    samples, rep = C.convert_video_r1(FIX / "video_r1.json")
    assert _dicts(samples) == _expected("video_r1.expected.jsonl")  # the numerical item is an open-answer sample
    assert not rep.skipped and rep.n_in == 3


def test_refcoco_golden_and_xywh(tmp_path):
    samples, _ = C.convert_refcoco(FIX / "refcoco.jsonl")
    assert _dicts(samples) == _expected("refcoco.expected.jsonl")
    (s,), _ = C.convert_refcoco([{"image": "a.jpg", "expression": "cat", "bbox": [10, 20, 30, 40]}],
                                bbox_format="xywh", sizes={"a.jpg": (100, 80)})
    assert s.boxes == [[10.0, 20.0, 40.0, 60.0]] and s.image_size == [100, 80]
    from PIL import Image

    Image.new("RGB", (50, 30)).save(tmp_path / "b.png")
    (s,), _ = C.convert_refcoco([{"image": "b.png", "text": "thing", "box": [1, 2, 3, 4]}],
                                read_sizes_from=tmp_path)
    assert s.image_size == [50, 30]
    with pytest.raises(DataError, match="outside the image"):
        C.convert_refcoco([{"image": "b.png", "text": "thing", "box": [1, 2, 300, 4], "image_size": [50, 30]}])


def test_option_and_answer_helpers():
    assert C.split_options("(A) red (B) dark blue (C) green") == ["red", "dark blue", "green"]
    assert C.split_options(["A. x", "B) y", "(C) z", "D: w"]) == ["x", "y", "z", "w"]
    opts = ["red", "blue", "green"]
    for a in ("(B)", "B", "b", "B. blue", "<answer>B</answer>", "blue", 1):
        assert C.answer_letter(a, opts) == "B"
    with pytest.raises(DataError):
        C.answer_letter("D", opts)


def test_cli_converts_and_loads(tmp_path):
    out = tmp_path / "anet.jsonl"
    r = subprocess.run([sys.executable, str(REPO / "data" / "convert.py"), "activitynet",
                        str(FIX / "activitynet_captions.json"), str(out)], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "4 samples from 4 records" in r.stdout and "1 span end(s) clamped" in r.stdout
    samples, rep = load_jsonl(out, check_media=False, resolve_paths=False)
    assert [s.to_dict() for s in samples] == _expected("activitynet_captions.expected.jsonl")
    bad = subprocess.run([sys.executable, str(REPO / "data" / "convert.py"), "time_r1", str(tmp_path / "no.json"),
                          str(tmp_path / "x.jsonl")], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert bad.returncode == 1 and "no.json" in bad.stderr and "file not found" in bad.stderr


def test_cli_charades_sta_without_durations_names_the_flags(tmp_path, capsys):
    """The converter needs the videos' durations: without --durations / --probe-root it stops with exit 2 naming
    the command-line flags (it used to raise 'convert_charades_sta needs durations (dict or CSV) or probe_root', the
    API's argument names, in a traceback) (issue 32 item 6)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("convert_cli", REPO / "data" / "convert.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    ann = tmp_path / "charades_sta_test.txt"
    ann.write_text("3MSZA 24.3 30.4##person turn a light on.\n")
    for extra, msg in (([], "charades_sta needs the videos' durations: --durations"),
                       (["--durations", str(tmp_path / "Charades_v1_test.csv")], "--durations "),
                       (["--probe-root", str(tmp_path / "videos")], "--probe-root ")):
        with pytest.raises(SystemExit) as ei:
            cli.main(["charades_sta", str(ann), str(tmp_path / "out.jsonl"), *extra])
        err = capsys.readouterr().err
        assert ei.value.code == 2 and msg in err, err
        assert "probe_root" not in err.replace("--probe-root", "")
