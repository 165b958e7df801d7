"""eval/score.py: golden metrics on hand-made prediction files (expected values computed by hand below)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `eval` is a top-level folder of the repo, not an installed package
    sys.path.insert(0, str(ROOT))

from eval.score import ScoreInputError, main, read_jsonl, score, score_gqa, score_mcq, score_rec, score_tvg  # noqa: E402


def _write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _ann(i, duration, span, dataset):
    return {"id": i, "task": "tvg", "duration": duration, "spans": [span], "query": "q", "meta": {"dataset": dataset}}


TVG_ANNS = [
    _ann("e1", 30, [10, 20], "charades"),
    _ann("e2", 30, [10, 20], "charades"),
    _ann("e3", 30, [10, 20], "charades"),
    _ann("e4", 30, [10, 20], "charades"),
    _ann("e5", 30, [10, 20], "charades"),
    _ann("e6", 30, [20, 30], "charades"),
    _ann("e7", 120, [60, 90], "anet"),
    _ann("e8", 120, [60, 90], "anet"),  # no prediction
    _ann("e9", 30, [10, 20], "charades"),
]
TVG_PREDS = [
    {"id": "e1", "output": "<think>the man opens it</think><answer>10.0 to 20.0</answer>", "model": "m"},  # IoU 1
    {"id": "e2", "output": "<answer>0 to 5</answer>"},  # disjoint: 0
    {"id": "e3", "output": "<answer>20 to 12.5</answer>"},  # reversed → [12.5, 20]: 7.5/10
    {"id": "e4", "output": "I cannot tell."},  # unparseable: 0
    {"id": "e5", "output": "<answer>0 to 30</answer> wait <answer>14 to 20</answer>"},  # last block: 6/10
    {"id": "e6", "output": "<answer>25 to 45</answer>"},  # past the end → [25, 30] vs [20, 30]: 5/10
    {"id": "e7", "output": "<answer>00:01:00 to 00:01:20</answer>"},  # [60, 80] vs [60, 90]: 20/30
    {"id": "e9", "output": "The event happens from 10 to 16 seconds."},  # fallback text: 6/10
    {"id": "zz", "output": "<answer>1 to 2</answer>"},  # not in annotations
]
IOUS = [1.0, 0.0, 0.75, 0.0, 0.6, 0.5, 2 / 3, 0.0, 0.6]


def test_tvg_golden_metrics():
    m = score_tvg(TVG_PREDS, TVG_ANNS, protocol="lenient")
    assert m["n"] == 9 and m["n_missing"] == 1 and m["n_unmatched_predictions"] == 1
    assert m["R1@0.3"] == pytest.approx(100 * 6 / 9)  # 1, .75, .6, .5, .667, .6
    assert m["R1@0.5"] == pytest.approx(100 * 6 / 9)  # 0.5 counts as ≥ 0.5
    assert m["R1@0.7"] == pytest.approx(100 * 2 / 9)  # 1, .75
    assert m["mIoU"] == pytest.approx(100 * (1 + 0.75 + 0.6 + 0.5 + 2 / 3 + 0.6) / 9)
    assert m["mIoU"] == pytest.approx(100 * sum(IOUS) / 9)
    assert m["n_parse_failed"] == 1 and m["parse_failure_rate"] == pytest.approx(100 / 8)  # e4 of 8 outputs
    assert m["n_fallback"] == 2  # e4, e9 had no answer block
    assert m["n_reversed"] == 1 and m["n_clamped"] == 1
    assert m["config"]["fallback_to_text"] is True


def test_tvg_without_fallback():
    m = score_tvg(TVG_PREDS, TVG_ANNS, fallback_to_text=False, protocol="lenient")
    assert m["R1@0.5"] == pytest.approx(100 * 5 / 9)  # e9 now fails
    assert m["mIoU"] == pytest.approx(100 * (sum(IOUS) - 0.6) / 9)
    assert m["parse_failure_rate"] == pytest.approx(100 * 2 / 8)
    assert m["config"]["fallback_to_text"] is False and "whole text" not in m["config"]["answer_source"]


def test_tvg_breakdowns_and_per_sample():
    res = score("tvg", TVG_PREDS, TVG_ANNS, by="dataset,duration_bucket", protocol="lenient")
    by = res.metrics["by"]
    ch = by["dataset"]["charades"]
    assert ch["n"] == 7 and ch["mIoU"] == pytest.approx(100 * (1 + 0.75 + 0.6 + 0.5 + 0.6) / 7)
    an = by["dataset"]["anet"]
    assert an["n"] == 2 and an["n_missing"] == 1 and an["mIoU"] == pytest.approx(100 * (2 / 3) / 2)
    assert an["R1@0.5"] == pytest.approx(50.0) and an["parse_failure_rate"] == 0.0
    # default edges (30, 60, 120, 300): 30 s is in [30, 60), 120 s in [120, 300)
    assert set(by["duration_bucket"]) == {"30-60s", "120-300s"}
    assert by["duration_bucket"]["30-60s"]["n"] == 7
    rows = {r["id"]: r for r in res.per_sample}
    assert len(rows) == 9
    assert rows["e3"]["pred_span"] == [12.5, 20.0] and rows["e3"]["reversed"] is True
    assert rows["e6"]["pred_span"] == [25.0, 30.0] and rows["e6"]["clamped"] is True
    assert rows["e8"]["missing"] is True and rows["e8"]["parse_status"] == "missing"
    assert rows["e4"]["parse_status"] == "no_match"
    assert rows["e1"]["model"] == "m"  # other prediction fields are kept
    assert rows["e1"]["groups"] == {"dataset": "charades", "duration_bucket": "30-60s"}


def test_tvg_clip_relative_and_multi_gt():
    anns = [
        {"id": "c1", "duration": 300, "video_start": 100, "video_end": 130, "spans": [[110, 120]]},
        {"id": "c2", "duration": 60, "spans": [[0, 10], [30, 40]]},
    ]
    preds = [{"id": "c1", "output": "<answer>10 to 20</answer>"}, {"id": "c2", "output": "<answer>30 to 35</answer>"}]
    res = score("tvg", preds, anns, protocol="lenient")
    assert [r["iou"] for r in res.per_sample] == pytest.approx([1.0, 0.5])
    assert res.per_sample[0]["pred_span"] == [110.0, 120.0]  # reported in absolute seconds
    m = score_tvg(preds, anns, clip_relative=False, protocol="lenient")
    assert m["mIoU"] == pytest.approx(100 * 0.5 / 2)


def test_mcq_golden_metrics():
    opts = ["dog", "cat", "bird", "fish"]
    anns = [
        {"id": "m1", "task": "mcq", "options": opts, "answer": "C"},
        {"id": "m2", "task": "mcq", "options": opts, "answer": "C"},
        {"id": "m3", "task": "mcq", "options": opts, "answer": "A, C"},
        {"id": "m4", "task": "mcq", "options": opts, "answer": ["A", "C"]},
        {"id": "m5", "task": "mcq", "options": opts, "answer": "B"},
        {"id": "m6", "task": "mcq", "options": opts, "answer": "D"},
        {"id": "m7", "task": "mcq", "options": opts, "answer": "B"},  # missing
    ]
    preds = [
        {"id": "m1", "output": "<think>..</think><answer>(C)</answer>"},  # 1, soft 1
        {"id": "m2", "output": "<answer>The answer is B</answer>"},  # 0, 0
        {"id": "m3", "output": "<answer>A</answer>"},  # 0, soft 1/2
        {"id": "m4", "output": "<answer>C, A</answer>"},  # 1, 1
        {"id": "m5", "output": "<answer>I don't know</answer>"},  # parse failure
        {"id": "m6", "output": "<answer>fish</answer>"},  # option text → D
    ]
    m = score_mcq(preds, anns, protocol="lenient")
    assert m["n"] == 7 and m["n_missing"] == 1
    assert m["accuracy"] == pytest.approx(100 * 3 / 7)
    assert m["soft_accuracy"] == pytest.approx(100 * 3.5 / 7)
    assert m["parse_failure_rate"] == pytest.approx(100 / 6)


def test_mcq_numeric_answers_mra():
    anns = [{"id": "n1", "answer": "3.5"}, {"id": "n2", "answer": 10}]
    preds = [{"id": "n1", "output": "<answer>3.5</answer>"}, {"id": "n2", "output": "<answer>12 m</answer>"}]
    m = score_mcq(preds, anns, protocol="lenient")
    assert m["accuracy"] == pytest.approx(50.0) and m["n_numeric"] == 2
    assert m["mra"] == pytest.approx(100 * (1.0 + 0.6) / 2)  # |12−10|/10 = 0.2 < 1−θ for 6 of 10 θ
    assert score_mcq(preds, anns, numeric_rel_tol=0.2, protocol="lenient")["accuracy"] == pytest.approx(100.0)


def test_gqa_golden_metrics():
    o = ["a", "b", "c", "d"]
    anns = [
        {"id": "g1", "task": "gqa", "duration": 30, "spans": [[10, 20]], "options": o, "answer": "C"},
        {"id": "g2", "task": "gqa", "duration": 30, "spans": [[10, 20], [25, 30]], "options": o, "answer": "A"},
        {"id": "g3", "task": "gqa", "duration": 30, "spans": [[0, 10]], "options": o, "answer": "B"},
        {"id": "g4", "task": "gqa", "duration": 30, "spans": [[5, 15]], "options": o, "answer": "D"},
    ]
    preds = [
        {"id": "g1", "output": "<answer>(C)</answer><glue>[[12, 18]]</glue>"},  # right; IoU .6, IoP 1
        {"id": "g2", "output": "<answer>A, 22 to 28</answer>"},  # right; best GT [25,30]: IoU 3/8, IoP 3/6
        {"id": "g3", "output": "<answer>C</answer><glue>0 to 10</glue>"},  # wrong; IoU 1, IoP 1
        {"id": "g4", "output": "<answer>D</answer>"},  # right; no evidence span
    ]
    m = score_gqa(preds, anns, protocol="lenient")
    assert m["accuracy"] == pytest.approx(75.0)
    assert m["mIoU"] == pytest.approx(100 * (0.6 + 3 / 8 + 1 + 0) / 4)
    assert m["mIoP"] == pytest.approx(100 * (1 + 0.5 + 1 + 0) / 4)
    assert m["IoU@0.3"] == pytest.approx(75.0) and m["IoU@0.5"] == pytest.approx(50.0)
    assert m["IoP@0.3"] == pytest.approx(75.0) and m["IoP@0.5"] == pytest.approx(75.0)
    assert m["Acc@GQA"] == pytest.approx(50.0)  # g1, g2: right and IoP ≥ 0.5
    # union IoU for g2: [22, 28] vs [10, 20] ∪ [25, 30]: 3 / (6 + 15 − 3)
    assert m["mIoU_union"] == pytest.approx(100 * (0.6 + 3 / 18 + 1 + 0) / 4)
    assert m["parse_failure_rate"] == 0.0 and m["span_parse_failure_rate"] == pytest.approx(25.0)


def test_rec_golden_metrics():
    anns = [
        {"id": "r1", "task": "rec", "image_size": [640, 480], "boxes": [[64, 96, 320, 288]]},
        {"id": "r2", "task": "rec", "image_size": [640, 480], "boxes": [[0, 0, 320, 240]]},
        {"id": "r3", "task": "rec", "image_size": [640, 480], "boxes": [[0, 0, 320, 240]]},
    ]
    preds = [
        {"id": "r1", "output": '<answer>{"bbox_2d": [100, 200, 500, 600]}</answer>'},  # → [64, 96, 320, 288]: 1
        {"id": "r2", "output": "<answer>[0, 0, 250, 500]</answer>"},  # → [0, 0, 160, 240]: 0.5
        {"id": "r3", "output": "<answer>the left dog</answer>"},
    ]
    m = score_rec(preds, anns, box_frame="qwen2_vl", protocol="lenient")
    assert m["Acc@0.5"] == pytest.approx(100 * 2 / 3) and m["mIoU"] == pytest.approx(100 * 1.5 / 3)
    assert m["parse_failure_rate"] == pytest.approx(100 / 3)
    assert m["config"]["box_frame_kind"] == "norm1000"


def test_rec_resized_frame_from_annotation_prediction_or_smart_resize():
    gt = [[320, 240, 640, 480]]
    anns = [
        {"id": "a", "image_size": [640, 480], "resized_image_size": [320, 240], "boxes": gt},
        {"id": "b", "image_size": [640, 480], "boxes": gt},
        {"id": "c", "image_size": [640, 480], "boxes": gt},
    ]
    preds = [
        {"id": "a", "output": "<answer>[160, 120, 320, 240]</answer>"},  # ×2
        {"id": "b", "output": "<answer>[80, 60, 160, 120]</answer>", "resized_image_size": [160, 120]},  # ×4
        # smart_resize(480, 640) = (476, 644): x·640/644, y·480/476 → [320, 240, 640, 480]
        {"id": "c", "output": "<answer>[322, 238, 644, 476]</answer>"},
    ]
    res = score("rec", preds, anns, box_frame="qwen2_5_vl", protocol="lenient")
    assert [r["iou"] for r in res.per_sample] == pytest.approx([1.0, 1.0, 1.0])
    assert [r["resized_image_size_source"] for r in res.per_sample] == ["annotation", "prediction", "smart_resize"]


def test_input_errors_name_file_line_and_field(tmp_path):
    ann = _write(tmp_path / "ann.jsonl", TVG_ANNS[:2])
    dup = _write(tmp_path / "preds.jsonl", [TVG_PREDS[0], TVG_PREDS[1], TVG_PREDS[0]])
    with pytest.raises(ScoreInputError, match=r"preds\.jsonl:3: duplicate prediction id 'e1' \(first at .*preds\.jsonl:1\)"):
        score_tvg(read_jsonl(dup), read_jsonl(ann))
    bad_ann = _write(tmp_path / "bad.jsonl", [TVG_ANNS[0], {"id": "x", "task": "tvg", "spans": [[1, 2]]}])
    preds = _write(tmp_path / "p.jsonl", TVG_PREDS[:1])
    with pytest.raises(ScoreInputError, match=r"bad\.jsonl:2: .*'duration'"):
        score_tvg(read_jsonl(preds), read_jsonl(bad_ann))
    rev = _write(tmp_path / "rev.jsonl", [{"id": "x", "duration": 30, "spans": [[5, 1]]}])
    with pytest.raises(ScoreInputError, match=r"rev\.jsonl:1: .*'spans\[0\]'"):
        score_tvg(read_jsonl(preds), read_jsonl(rev))
    (tmp_path / "junk.jsonl").write_text('{"id": "a", "output": "x"}\n{not json\n')
    with pytest.raises(ScoreInputError, match=r"junk\.jsonl:2: invalid JSON"):
        read_jsonl(tmp_path / "junk.jsonl")
    with pytest.raises(ScoreInputError, match=r"predictions\[0\]: field 'output' missing"):
        score_tvg([{"id": "e1"}], TVG_ANNS[:1])
    with pytest.raises(ScoreInputError, match=r"task is|'task' is 'mcq'"):
        score_tvg([], [{"id": "q", "task": "mcq", "options": ["a", "b"], "answer": "A"}])
    m = score_tvg([], [TVG_ANNS[0], {"id": "q", "task": "mcq"}], skip_other_tasks=True)
    assert m["n"] == 1 and m["n_other_task_skipped"] == 1 and m["parse_failure_rate"] is None


def test_cli_writes_metrics_and_per_sample(tmp_path):
    ann = _write(tmp_path / "ann.jsonl", TVG_ANNS)
    preds = _write(tmp_path / "preds.jsonl", TVG_PREDS)
    out, per = tmp_path / "m" / "metrics.json", tmp_path / "per.jsonl"
    argv = ["tvg", "--predictions", str(preds), "--annotations", str(ann), "--out", str(out), "--protocol", "lenient",
            "--allow-missing"]
    assert main(argv + ["--by", "dataset", "--per-sample", str(per)]) == 0
    m = json.loads(out.read_text())
    assert m["mIoU"] == pytest.approx(100 * sum(IOUS) / 9) and "charades" in m["by"]["dataset"]
    assert len(per.read_text().splitlines()) == 9
    assert main(argv + ["--no-fallback"]) == 0
    assert json.loads(out.read_text())["R1@0.5"] == pytest.approx(100 * 5 / 9)


def test_script_runs_without_torch(tmp_path):
    """`python eval/score.py` works as a script and never imports torch."""
    ann = _write(tmp_path / "ann.jsonl", TVG_ANNS)
    preds = _write(tmp_path / "preds.jsonl", TVG_PREDS)
    code = (
        "import runpy, sys; sys.argv = sys.argv[1:]; "
        "sys.modules['torch'] = None; "  # any `import torch` now raises ImportError
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    cmd = [sys.executable, "-c", code, str(ROOT / "eval" / "score.py"), "tvg"]
    cmd += ["--predictions", str(preds), "--annotations", str(ann), "--protocol", "lenient", "--allow-missing"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["mIoU"] == pytest.approx(100 * sum(IOUS) / 9)


def test_rec_patch_factor_is_the_familys_merged_patch():
    """A family's box frame alias brings its merged-patch side (its adapter's 2 x patch_size) for resized boxes."""
    from eval.score import _options

    assert [_options("rec", box_frame=f)["patch_factor"] for f in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "norm1000",
                                                                    "resized_abs")] == [28, 28, 32, 28, 28]
