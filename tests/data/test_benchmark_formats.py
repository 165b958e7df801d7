"""Converters of the benchmarks users report on (issue #38 item 6), on lines written in each release's format
(field names and layout from the releases' documentation and loaders; the values are made up)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmgrpo.vlm.data import DataError, load_jsonl
from mmgrpo.vlm.data import converters as C

REPO = Path(__file__).resolve().parents[2]
FIX = Path(__file__).parent / "fixtures"


def test_vsibench_mca_to_mcq_and_na_to_numerical_qa():
    samples, rep = C.convert_vsibench(FIX / "vsibench.jsonl", video_dir="VSI")
    assert rep.n_out == 5 and not rep.skipped
    by = {s.id: s for s in samples}
    count, direction, route = by["0"], by["2"], by["3"]
    assert (count.task, count.answer, count.meta["problem_type"]) == ("qa", "4", "numerical")
    assert count.video == os.path.join("VSI", "arkitscenes/41069025.mp4")  # the release's DATASET/SCENE.mp4
    assert count.meta["question_type"] == "object_counting" and count.options is None
    assert (direction.task, direction.options, direction.answer) == ("mcq", ["left", "right"], "B")
    assert route.options == ["Turn left", "Turn right", "Turn back"] and route.answer == "A"
    assert by["4"].answer == "21.5"
    mca, rep = C.convert_vsibench(FIX / "vsibench.jsonl", subset="mca")
    assert [s.id for s in mca] == ["2", "3"] and rep.skipped["other_subset"] == 3


def test_vsibench_bad_lines_name_the_field():
    with pytest.raises(DataError, match=r"id='9', field 'question_type': unknown question_type 'wall_color'"):
        C.convert_vsibench([{"id": 9, "dataset": "scannet", "scene_name": "s", "question_type": "wall_color",
                             "question": "q", "ground_truth": "A"}])
    with pytest.raises(DataError, match="ground truth 0 has no relative error"):
        C.convert_vsibench([{"id": 1, "dataset": "scannet", "scene_name": "s", "question_type": "object_counting",
                             "question": "q", "ground_truth": "0"}])


def test_qvhighlights_every_window_a_span_and_saliency_in_meta():
    (a, b), rep = C.convert_qvhighlights(FIX / "qvhighlights.jsonl", video_dir="qvh/videos")
    assert rep.n_out == 2
    assert (a.id, a.task, a.spans, a.duration) == ("101", "tvg", [[10.0, 18.0]], 150.0)
    assert a.video == os.path.join("qvh/videos", "abcDEF12345_60.0_210.0.mp4")
    assert a.meta["relevant_clip_ids"] == [5, 6, 7, 8] and a.meta["saliency_scores"][1] == [4, 4, 3]
    assert b.spans == [[0.0, 4.0], [80.0, 86.0]] and b.meta["qid"] == 102
    with pytest.raises(DataError, match=r"qvhighlights_test.jsonl, id='9001'.*no relevant_windows \(the test release"):
        C.convert_qvhighlights(FIX / "qvhighlights_test.jsonl")
    bad = {"qid": 1, "query": "q", "duration": 150, "vid": "v", "relevant_windows": [[0, 2]],
           "relevant_clip_ids": [0, 1], "saliency_scores": [[1, 2, 3]]}
    with pytest.raises(DataError, match="same length"):
        C.convert_qvhighlights([bad])


def test_seed_bench_r1_validation_media_level_and_answer():
    (v, img), rep = C.convert_seed_bench_r1(FIX / "seed_bench_r1_validation_L2.jsonl", media_dir="SBR1")
    assert rep.n_out == 2
    assert v.meta["level"] == "L2"  # from the file name
    assert v.options == ["pour water into cup", "open fridge", "wash pan", "put down knife"] and v.answer == "A"
    assert v.video == os.path.join("SBR1", "videos", "EpicKitchens", "P01_11_2001.mp4")
    assert v.meta["current_observation"] == os.path.join("SBR1", "images", "EpicKitchens", "P01_11_2001.jpg")
    assert img.video is None and img.image.endswith(os.path.join("images", "EpicKitchens", "P02_03_2002.jpg"))
    bad = dict(json.loads((FIX / "seed_bench_r1_validation_L2.jsonl").read_text().splitlines()[0]),
               golden_choice_idx="B")
    with pytest.raises(DataError, match="golden_choice_idx 'B' is not the answer text"):
        C.convert_seed_bench_r1([bad], level="L1")


def test_seed_bench_r1_training_lines_shuffle_three_negatives_reproducibly():
    (s,), _ = C.convert_seed_bench_r1(FIX / "seed_bench_r1_train.jsonl", seed=3)
    assert len(s.options) == 4 and s.options[ord(s.answer) - 65] == "pick up shirt"
    assert set(s.options) - {"pick up shirt"} <= {"open door", "turn off light", "wash dishes", "drop towel",
                                                  "close window"}
    assert "level" not in s.meta
    (again,), _ = C.convert_seed_bench_r1(FIX / "seed_bench_r1_train.jsonl", seed=3)
    assert again.options == s.options and again.answer == s.answer


def test_longvideobench_letters_and_breakdown_keys():
    (a, b), _ = C.convert_longvideobench(FIX / "longvideobench.json", video_dir="LVB")
    assert (a.task, a.answer, len(a.options)) == ("mcq", "B", 4)
    assert a.video == os.path.join("LVB", "videos", "86CxyhFV9MI.mp4") and a.duration == 527.08
    assert (a.meta["duration_group"], a.meta["question_category"]) == (600, "TOS")
    assert (b.answer, len(b.options), b.meta["duration_group"]) == ("D", 5, 15)
    test_line = {k: v for k, v in json.loads((FIX / "longvideobench.json").read_text())[0].items()
                 if k != "correct_choice"}
    with pytest.raises(DataError, match="no correct_choice"):
        C.convert_longvideobench([test_line])


def test_mmvu_subsets_and_local_video_path():
    (mc, oe), rep = C.convert_mmvu(FIX / "mmvu.json", video_dir="MMVU")
    assert mc.task == "mcq" and mc.options == ["10.0", "5.0", "12.0", "15.0", "20.0"] and mc.answer == "C"
    assert mc.video == os.path.join("MMVU", "videos/Chemistry/3.mp4") and mc.meta["subject"] == "Chemistry"
    assert (oe.task, oe.answer, oe.meta["problem_type"]) == ("qa", "Tracking shot", "free-form")
    only_mc, rep = C.convert_mmvu(FIX / "mmvu.json", subset="mc")
    assert [s.id for s in only_mc] == ["validation_7"] and rep.skipped["other_subset"] == 1


def test_clevrer_descriptive_qa_and_one_yes_no_sample_per_choice():
    samples, rep = C.convert_clevrer(FIX / "clevrer.json", video_dir="clevrer")
    assert rep.n_in == 3 and rep.n_out == 5
    by = {s.id: s for s in samples}
    assert (by["10000_0"].task, by["10000_0"].answer, by["10000_0"].meta["problem_type"]) == ("qa", "2", "numerical")
    assert by["10000_1"].meta["problem_type"] == "free-form"
    c0, c1 = by["10000_12_0"], by["10000_12_1"]
    assert c0.options == ["yes", "no"] and (c0.answer, c1.answer) == ("A", "B")
    assert c0.query.endswith("Is the following choice correct? The presence of the red sphere")
    assert c0.meta["question_id"] == 12 and c0.video == os.path.join("clevrer", "video_10000.mp4")
    mc, rep = C.convert_clevrer(FIX / "clevrer.json", subset="mc")
    assert [s.id for s in mc] == ["10000_12_0", "10000_12_1", "10000_12_2"] and rep.skipped["other_subset"] == 2


@pytest.mark.parametrize("fmt,fixture,n", [("vsibench", "vsibench.jsonl", 5), ("qvhighlights", "qvhighlights.jsonl", 2),
                                           ("seed_bench_r1", "seed_bench_r1_validation_L2.jsonl", 2),
                                           ("longvideobench", "longvideobench.json", 2), ("mmvu", "mmvu.json", 2),
                                           ("clevrer", "clevrer.json", 5)])
def test_cli_writes_loadable_jsonl(tmp_path, fmt, fixture, n):
    out = tmp_path / "out.jsonl"
    r = subprocess.run([sys.executable, str(REPO / "data" / "convert.py"), fmt, str(FIX / fixture), str(out)],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert r.returncode == 0, r.stderr
    samples, rep = load_jsonl(out, check_media=False, resolve_paths=False)
    assert len(samples) == n and not rep.errors
