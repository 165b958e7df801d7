"""eval/score.py --protocol official|lenient: small prediction sets where each release rule makes a difference, with
both protocols' numbers computed by hand (comments), and the empty/partial predictions guard (issue #14)."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from eval.score import main, score  # noqa: E402


def _w(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _tvg(i, span, dur=30.0):
    return {"id": i, "task": "tvg", "duration": dur, "spans": [span]}


# ------------------------------------------------------------------------------------------------------------ TVG
TVG_ANNS = [_tvg("a1", [10, 20]), _tvg("a2", [10, 20]), _tvg("a3", [10, 20]), _tvg("a4", [10, 20]),
            _tvg("a5", [20, 30]), _tvg("a6", [10, 20]), _tvg("a7", [10, 20])]
TVG_PREDS = [
    {"id": "a1", "output": "<answer>10 to 20</answer>"},  # L 1, O 1
    {"id": "a2", "output": "<answer>10 to 20, or 0 to 5</answer>"},  # L first span: 1; O last span: 0
    {"id": "a3", "output": "<answer>20 to 12.5</answer>"},  # L swapped [12.5, 20]: .75; O reversed: 0
    {"id": "a4", "output": "<answer>12.5s to 17.5s</answer>"},  # L .5; O no "A to B": parse failure, 0
    {"id": "a5", "output": "<answer>25 to 45</answer>"},  # L clamped [25, 30] vs [20, 30]: .5; O 5/25 = .2
    {"id": "a6", "output": "<answer>10 to 15</answer>"},  # IoU .5 in both: R1@0.5 counts it (>=) / not (>)
]  # a7: no prediction (L: 0 over 7; O: not counted, Time-R1 averages over its predictions)


def test_tvg_official_is_time_r1_evaluation_and_lenient_is_the_project_parser():
    m = score("tvg", TVG_PREDS, TVG_ANNS).metrics
    assert m["protocol"]["name"] == "official" and m["protocol"]["parse_mode"] == "time_r1_eval"
    assert "xiaomi-research/time-r1" in m["protocol"]["reference"]
    o, le = m["protocols"]["official"], m["protocols"]["lenient"]
    assert m["mIoU"] == o["mIoU"] == pytest.approx(100 * (1 + 0 + 0 + 0 + 0.2 + 0.5) / 6)
    assert o["n_scored"] == 6 and o["n_missing"] == 1
    assert o["R1@0.3"] == pytest.approx(100 * 2 / 6)  # 1 and .5 (> .3)
    assert o["R1@0.5"] == pytest.approx(100 * 1 / 6)  # only 1: .5 is not > .5
    assert o["R1@0.7"] == pytest.approx(100 * 1 / 6)
    assert o["n_parse_failed"] == 1 and o["parse_failure_rate"] == pytest.approx(100 / 6)  # a4
    assert le["mIoU"] == pytest.approx(100 * (1 + 1 + 0.75 + 0.5 + 0.5 + 0.5) / 7)
    assert le["R1@0.5"] == pytest.approx(100 * 6 / 7) and le["R1@0.7"] == pytest.approx(100 * 3 / 7)
    assert le["n_parse_failed"] == 0 and le["n_missing"] == 1
    lm = score("tvg", TVG_PREDS, TVG_ANNS, protocol="lenient").metrics
    assert lm["mIoU"] == pytest.approx(le["mIoU"]) and lm["protocol"]["name"] == "lenient"


def test_tvg_official_mode_can_name_another_release():
    m = score("tvg", TVG_PREDS, TVG_ANNS, official_mode="tempsamp_r1").metrics["protocols"]["official"]
    # TempSamp-R1: a2 last "A to B" → [0, 5]: 0; a3 reversed: 0; a4 "12.5s to 17.5s" → (12, 17): 5/10;
    # a5 .2; a6 .5; missing a7 counts 0 (only Time-R1's and NExT-GQA's evaluations skip missing predictions)
    assert m["mIoU"] == pytest.approx(100 * (1 + 0 + 0 + 0.5 + 0.2 + 0.5) / 7)
    assert m["R1@0.5"] == pytest.approx(100 * 3 / 7)  # >= like the project: 1, .5, .5
    with pytest.raises(ValueError, match="does not apply to task 'tvg'"):
        score("tvg", TVG_PREDS, TVG_ANNS, official_mode="video_r1_eval")


def test_per_sample_records_carry_the_other_protocol():
    res = score("tvg", TVG_PREDS, TVG_ANNS)
    rows = {r["id"]: r for r in res.per_sample}
    assert rows["a3"]["protocol"] == "official" and rows["a3"]["iou"] == 0.0 and rows["a3"]["pred_span"] == [20, 12.5]
    assert rows["a3"]["other"] == {"protocol": "lenient", "iou": pytest.approx(0.75), "parse_status": "ok",
                                   "pred_span": [12.5, 20.0]}
    assert rows["a5"]["clamped"] is True  # outside the video; official reports it as n_outside_video
    assert res.metrics["n_outside_video"] == 1 and res.metrics["protocols"]["lenient"]["n_clamped"] == 1


# ------------------------------------------------------------------------------------------------------------ MCQ
OPTS = ["dog", "cat", "bird", "fish"]
MCQ_ANNS = [{"id": f"m{i}", "task": "mcq", "options": OPTS, "answer": a} for i, a in
            enumerate(["C", "C", "C", "B", "D", "A", "A"], start=1)] + [
    {"id": "n1", "task": "mcq", "answer": "7807"}, {"id": "n2", "task": "mcq", "answer": "7.42"},
    {"id": "n3", "task": "mcq", "answer": "3.14"}, {"id": "n4", "task": "mcq", "answer": 42}]
MCQ_PREDS = [
    {"id": "m1", "output": "<answer>C</answer>"},  # L 1, O 1
    {"id": "m2", "output": "<answer>(C)</answer>"},  # L 1, O parse failure
    {"id": "m3", "output": "<answer>The answer is C</answer>"},  # L 1, O parse failure
    {"id": "m4", "output": "<answer>b</answer>"},  # L 1 (lower case as the whole answer), O parse failure
    {"id": "m5", "output": "<answer>fish</answer>"},  # L 1 (option text of D), O parse failure
    {"id": "m6", "output": "A"},  # no block: L falls back to the text, O compares the whole output: both 1
    {"id": "m7", "output": "<answer> A </answer>"},  # both 1
    {"id": "n1", "output": "<answer>7,807</answer>"},  # L 1; O decimal mark only in the answer: 0 (parsed)
    {"id": "n2", "output": "<answer>7.42 meters</answer>"},  # L 1; O float() fails: parse failure
    {"id": "n3", "output": "<answer>3.14159</answer>"},  # L exact: 0; O rounds to 3.14: 1
    {"id": "n4", "output": "<answer>42.0</answer>"},  # L 1; O "42" has no mark, "42.0" has: 0
]


def test_mcq_official_is_video_r1_evaluation():
    m = score("mcq", MCQ_PREDS, MCQ_ANNS).metrics
    o, le = m["protocols"]["official"], m["protocols"]["lenient"]
    assert o["parse_mode"] == "video_r1_eval" and "tulerfeng/Video-R1" in o["reference"]
    assert o["accuracy"] == pytest.approx(100 * 4 / 11)  # m1, m6, m7, n3
    assert le["accuracy"] == pytest.approx(100 * 10 / 11)  # all but n3
    assert o["n_parse_failed"] == 5  # m2, m3, m4, m5, n2
    assert le["n_parse_failed"] == 0
    assert o["mra"] == pytest.approx(100 * 3 / 4)  # n2 unparsed scores 0; the others are within 1 %
    assert le["mra"] == pytest.approx(100.0)
    assert "soft_accuracy" not in o and "soft_accuracy" in le


# ------------------------------------------------------------------------------------------------------------ REC
def _rec(i, box, size=(100, 100)):
    return {"id": i, "task": "rec", "image_size": list(size), "boxes": [box]}


REC_ANNS = [_rec("r1", [0, 0, 50, 50]), _rec("r2", [0, 0, 50, 50]), _rec("r3", [0, 0, 50, 50]),
            _rec("r4", [0, 0, 50, 50]), _rec("r5", [0, 0, 100, 50]), _rec("r6", [0, 0, 50, 50]),
            _rec("r7", [0, 0, 50, 50])]
REC_PREDS = [
    {"id": "r1", "output": '<answer>{"bbox_2d": [0, 0, 50, 50]}</answer>'},  # L 1, O 1
    {"id": "r2", "output": '<answer>{"bbox_2d": [0.0, 0.0, 50.0, 50.0]}</answer>'},  # L 1; O floats: failure
    {"id": "r3", "output": '<answer>{"bbox_2d": [50, 50, 0, 0]}</answer>'},  # L reordered: 1; O reversed: 0
    {"id": "r4", "output": '<answer>{"a": [60, 60, 90, 90], "b": [0, 0, 50, 50]}</answer>'},  # L first: 0; O last: 1
    {"id": "r5", "output": '<answer>{"bbox_2d": [0, 0, 50, 50]}</answer>'},  # IoU .5 both: Acc >= / not >
    {"id": "r6", "output": "<answer>[0, 0, 50, 50]</answer>"},  # L 1; O needs {...}: failure
    {"id": "r7", "output": '<answer>{"bbox_2d": [0, 0, 120, 50]}</answer>'},  # L clamped to 100: .5; O 2500/6000
]


def test_rec_official_is_vlm_r1_evaluation():
    m = score("rec", REC_PREDS, REC_ANNS, box_frame="abs").metrics
    o, le = m["protocols"]["official"], m["protocols"]["lenient"]
    assert o["parse_mode"] == "vlm_r1_eval" and "om-ai-lab/VLM-R1" in o["reference"]
    assert o["Acc@0.5"] == pytest.approx(100 * 2 / 7)  # r1, r4
    assert o["mIoU"] == pytest.approx(100 * (1 + 0 + 0 + 1 + 0.5 + 0 + 2500 / 6000) / 7)
    assert o["n_parse_failed"] == 2  # r2, r6
    assert le["Acc@0.5"] == pytest.approx(100 * 6 / 7)  # all but r4
    assert le["mIoU"] == pytest.approx(100 * (1 + 1 + 1 + 0 + 0.5 + 1 + 0.5) / 7)
    assert le["n_parse_failed"] == 0


# ------------------------------------------------------------------------------------------------------------ GQA
def _gqa(i, span, ans):
    return {"id": i, "task": "gqa", "duration": 30.0, "spans": [span], "options": ["a", "b", "c", "d"], "answer": ans}


GQA_ANNS = [_gqa("g1", [10, 20], "C"), _gqa("g2", [20, 30], "A"), _gqa("g3", [10, 20], "B"), _gqa("g4", [0, 10], "D")]
GQA_PREDS = [
    {"id": "g1", "output": "<answer>(C) <glue>15 to 15</glue></answer>"},  # point in GT: L IoP 0, O IoP 1
    {"id": "g2", "output": "<answer>A <glue>25 to 45</glue></answer>"},  # L clamp: IoU .5, IoP 1; O .2, .25
    {"id": "g3", "output": "<answer>B <glue>18 to 12</glue></answer>"},  # L swap: .6, 1; O reversed: 0, 0
]  # g4 missing: L counts 0, O skips (NExT-GQA evaluates the questions it has predictions for)


def test_gqa_official_is_nextgqa_grounding_evaluation():
    m = score("gqa", GQA_PREDS, GQA_ANNS).metrics
    o, le = m["protocols"]["official"], m["protocols"]["lenient"]
    assert o["parse_mode"] == "nextgqa" and "doc-doc/NExT-GQA" in o["reference"]
    assert o["n_scored"] == 3
    assert o["accuracy"] == pytest.approx(100.0)
    assert o["mIoU"] == pytest.approx(100 * 0.2 / 3) and o["mIoP"] == pytest.approx(100 * 1.25 / 3)
    assert o["IoP@0.5"] == pytest.approx(100 / 3) and o["IoU@0.3"] == 0.0
    assert o["Acc@GQA"] == pytest.approx(100 / 3)  # g1: right and IoP 1 >= .5
    assert le["accuracy"] == pytest.approx(75.0)
    assert le["mIoU"] == pytest.approx(100 * (0 + 0.5 + 0.6 + 0) / 4) and le["mIoP"] == pytest.approx(50.0)
    assert le["Acc@GQA"] == pytest.approx(50.0)  # g2, g3


# ------------------------------------------------------------------------------------- CLI: both protocols, missing
def test_cli_prints_both_protocols_and_refuses_partial_predictions(tmp_path, capsys):
    ann = _w(tmp_path / "ann.jsonl", TVG_ANNS)
    preds = _w(tmp_path / "preds.jsonl", TVG_PREDS)  # a7 has no prediction
    out = tmp_path / "metrics.json"
    argv = ["tvg", "--predictions", str(preds), "--annotations", str(ann), "--out", str(out)]
    assert main(argv) == 1 and not out.exists()
    err = capsys.readouterr().err
    assert "1 of 7 annotations have no prediction" in err and "--allow-missing" in err
    assert "official" in err and "lenient" in err and "parse failures" in err
    assert main(argv + ["--allow-missing"]) == 0
    m = json.loads(out.read_text())
    assert m["n_missing"] == 1 and set(m["protocols"]) == {"official", "lenient"}
    assert "warning: 1 of 7 annotations have no prediction" in capsys.readouterr().err


def test_cli_refuses_an_empty_predictions_file(tmp_path, capsys):
    ann = _w(tmp_path / "ann.jsonl", TVG_ANNS)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    argv = ["tvg", "--predictions", str(empty), "--annotations", str(ann)]
    assert main(argv) == 1
    assert "no prediction matches any of the 7 annotations" in capsys.readouterr().err
    assert main(argv + ["--allow-missing", "--protocol", "lenient"]) == 0
    assert json.loads(capsys.readouterr().out)["mIoU"] == 0.0
    full = _w(tmp_path / "full.jsonl", TVG_PREDS + [{"id": "a7", "output": "<answer>10 to 20</answer>"}])
    assert main(["tvg", "--predictions", str(full), "--annotations", str(ann)]) == 0


def test_report_shows_both_protocols(tmp_path):
    from eval.report import render_markdown, summarize

    m = score("tvg", TVG_PREDS, TVG_ANNS).metrics
    m["kind"] = "vlm"
    (tmp_path / "metrics.json").write_text(json.dumps(m))
    s = summarize(tmp_path)
    md = render_markdown(s)
    assert "## Protocols" in md and "| official | xiaomi-research/time-r1" in md and "| lenient |" in md
    assert s["protocols"]["official"]["metrics"]["n_parse_failed"] == 1
    assert s["metrics"]["mIoU"] == pytest.approx(m["protocols"]["official"]["mIoU"])


def test_compare_warns_when_runs_use_different_protocols(tmp_path):
    from eval.compare import compare

    for name, proto in (("a", "official"), ("b", "lenient")):
        d = tmp_path / name
        d.mkdir()
        m = score("tvg", TVG_PREDS, TVG_ANNS, protocol=proto).metrics
        m["kind"] = "vlm"
        (d / "metrics.json").write_text(json.dumps(m))
    cmp = compare([tmp_path / "a", tmp_path / "b"])
    assert any("different scoring protocols" in w for w in cmp["warnings"])
    assert not any("different scoring protocols" in w for w in compare([tmp_path / "a", tmp_path / "a"])["warnings"])
