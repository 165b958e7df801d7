"""eval/export.py: the benchmarks' own submission formats, from annotation lines in each benchmark's public format
(converted with mmgrpo.vlm.data.converters) and model outputs written by hand.  Expected files are spelled out here;
the official scorers' reading rules (lmms-eval's key split, Time-R1's IoU, NExT-GQA's tIoU/IoP, lmms-eval's
normalised box IoU) are restated independently and applied to the exported values.
"""
import ast
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from eval import score as score_mod  # noqa: E402
from eval.export import check_formats, export, nextgqa_key  # noqa: E402
from mmgrpo.vlm.data.converters import convert_charades_sta, convert_dense_captions  # noqa: E402


def _canon(samples):
    return [json.loads(json.dumps(s.to_dict() if hasattr(s, "to_dict") else s.__dict__)) for s in samples]


@pytest.fixture
def charades(tmp_path):
    # Charades-STA test lines: "VID start end##sentence"
    txt = tmp_path / "charades_sta_test.txt"
    txt.write_text("3MSZA 24.3 30.4##person turns on the light.\n"
                   "AB12C 0.0 6.9##a person is putting a book on a shelf.\n")
    samples, _ = convert_charades_sta(txt, durations={"3MSZA": 31.0, "AB12C": 30.0})
    return _canon(samples)


def test_charades_lmms_eval_and_time_r1(charades, tmp_path):
    preds = [{"id": "3MSZA_1", "output": "<think>the light</think> <answer>24.0 to 30.0</answer>"},
             {"id": "AB12C_2", "output": "no idea"}]
    res = score_mod.score("tvg", preds, charades)
    info = export("lmms_eval_tvg", res.per_sample, charades, tmp_path)
    sub = json.loads((tmp_path / "lmms_eval_tvg_submission.json").read_text())
    assert sub == {"3MSZA.mp4>>>person turns on the light.>>>[24.3, 30.4]": preds[0]["output"],
                   "AB12C.mp4>>>a person is putting a book on a shelf.>>>[0.0, 6.9]": "no idea"}
    assert info["n"] == 2 and info["n_duplicate_keys"] == 0
    for k in sub:  # lmms-eval eval_tvg.py: vid, caption, gt = k.split(">>>"); gt = eval(gt)
        vid, caption, gt = k.split(">>>")
        assert isinstance(ast.literal_eval(gt), list) and len(ast.literal_eval(gt)) == 2

    export("time_r1_tvg", res.per_sample, charades, tmp_path)
    rows = [json.loads(x) for x in (tmp_path / "time_r1_predictions.jsonl").read_text().splitlines()]
    assert rows == [{"qid": "3MSZA_1", "pred": [24.0, 30.0], "target": [24.3, 30.4], "output_text": preds[0]["output"]},
                    {"qid": "AB12C_2", "pred": [None, None], "target": [0.0, 6.9], "output_text": "no idea"}]
    # Time-R1 eval_all.py: IoU of pred and target, 0 when pred holds None
    inter = min(30.0, 30.4) - max(24.0, 24.3)
    union = max(30.0, 30.4) - min(24.0, 24.3)
    assert inter / union == pytest.approx(res.per_sample[0]["iou"])


def test_activitynet_lmms_eval_key(tmp_path):
    # ActivityNet Captions val_1.json: {vid: {duration, timestamps, sentences}}
    src = {"v_QOlSCBRmfWY": {"duration": 82.73, "timestamps": [[0.83, 19.86], [17.37, 60.81]],
                             "sentences": ["A young woman is seen standing in a room.", " She then begins to dance."]}}
    samples, _ = convert_dense_captions(src)
    anns = _canon(samples)
    res = score_mod.score("tvg", [{"id": "v_QOlSCBRmfWY_1", "output": "17.0 to 61.0"}], anns)
    export("lmms_eval_tvg", res.per_sample, anns, tmp_path)
    sub = json.loads((tmp_path / "lmms_eval_tvg_submission.json").read_text())
    assert sub == {"v_QOlSCBRmfWY.mp4>>>A young woman is seen standing in a room.>>>[0.83, 19.86]": "",
                   "v_QOlSCBRmfWY.mp4>>>She then begins to dance.>>>[17.37, 60.81]": "17.0 to 61.0"}


def _gqa_ann(sid, video, spans, answer="C", meta=None):
    return {"id": sid, "task": "gqa", "video": video, "duration": 40.0, "query": "why did the boy fall?",
            "options": ["o0", "o1", "o2", "o3", "o4"], "answer": answer, "spans": spans, "meta": meta or {}}


def test_nextgqa_eval_ground_files(tmp_path):
    anns = [_gqa_ann("4010069381_7", "videos/4010069381.mp4", [[10.0, 20.0]]),
            _gqa_ann("q2", "videos/x.mp4", [[5.0, 9.0]], answer="A", meta={"video_id": "3238737531", "qid": 3}),
            _gqa_ann("q3", "videos/y.mp4", [[1.0, 2.0]], meta={"video_id": "y", "qid": 0})]
    preds = [{"id": "4010069381_7", "output": "<answer>C</answer><glue>[12.0, 18.0]</glue>"},
             {"id": "q2", "output": "<answer>B</answer>"}]  # q3 has no prediction
    res = score_mod.score("gqa", preds, anns)
    export("nextgqa", res.per_sample, anns, tmp_path, split="val")
    ground = json.loads((tmp_path / "val_ground.json").read_text())
    qa = json.loads((tmp_path / "val-res.json").read_text())
    pred_span = res.per_sample[0]["pred_span"]
    assert ground == {"4010069381_7": pred_span, "3238737531_3": [-1.0, -1.0]}  # missing q3 left out
    assert qa == {"4010069381_7": {"prediction": 2, "answer": 2}, "3238737531_3": {"prediction": 1, "answer": 0}}

    def t_iou_iop(loc, span):  # eval_ground.get_tIoU restated: loc = ground truth, span = prediction
        if span[0] == span[-1]:
            return (0, 1) if loc[0] <= span[0] <= loc[1] else (0, 0)
        inter = min(loc[1], span[1]) - max(loc[0], span[0])
        union = max(loc[1], span[1]) - min(loc[0], span[0])
        return (inter / union if union > 0 else 0.0), (inter / (span[1] - span[0]))

    assert t_iou_iop([5.0, 9.0], ground["3238737531_3"]) == (0, 0)  # an unparsed span scores nothing
    assert pred_span == [12.0, 18.0]
    assert t_iou_iop([10.0, 20.0], pred_span) == pytest.approx((6 / 10, 1.0))  # by hand: inter 6, union 10
    assert (res.per_sample[0]["iou"], res.per_sample[0]["iop"]) == pytest.approx((0.6, 1.0))


def test_nextgqa_key_rules():
    assert nextgqa_key({"id": "5_2", "video": "a/5.mp4"}) == "5_2"
    assert nextgqa_key({"id": "2", "video": "a/5.mp4"}) == "5_2"
    assert nextgqa_key({"id": "z", "video": "a/5.mp4", "meta": {"video_id": "9", "qid": 4}}) == "9_4"


def _rec_ann():
    return {"id": "ann7", "task": "rec", "image": "train2014/COCO_train2014_000000000009.jpg",
            "query": "the left bowl", "boxes": [[96.0, 48.0, 304.0, 256.0]], "image_size": [640, 480], "meta": {}}


def test_refcoco_boxes_in_original_pixels_and_lmms_eval(tmp_path):
    anns = [_rec_ann()]
    # Qwen2.5-VL frame: absolute pixels of the 320x240 model input -> x2 to the 640x480 original
    preds = [{"id": "ann7", "output": '<think>.</think><answer>{"bbox_2d": [50, 25, 150, 125]}</answer>',
              "resized_image_size": [320, 240]}]
    res = score_mod.score("rec", preds, anns, box_frame="qwen2_5_vl")
    export("refcoco", res.per_sample, anns, tmp_path)
    row = json.loads((tmp_path / "refcoco_predictions.jsonl").read_text())
    assert row["pred_bbox"] == [100.0, 50.0, 300.0, 250.0]
    assert row["gt_bbox"] == [96.0, 48.0, 304.0, 256.0] and row["image_size"] == [640, 480]
    assert row["id"] == "ann7" and row["sentence"] == "the left bowl"

    export("lmms_eval_refcoco", res.per_sample, anns, tmp_path)
    r = json.loads((tmp_path / "lmms_eval_refcoco_results.jsonl").read_text())
    assert r["answer"] == "the left bowl" and r["ann_id"] == "ann7"
    assert r["pred"] == pytest.approx([100 / 640, 50 / 480, 300 / 640, 250 / 480])
    assert r["bbox"] == pytest.approx([96 / 640, 48 / 480, 304 / 640, 256 / 480])
    # lmms-eval compute_iou on the normalised boxes = the pixel IoU (hand: 200*200 / (208*208))
    b1, b2 = r["bbox"], r["pred"]
    inter = max(0, min(b1[2], b2[2]) - max(b1[0], b2[0])) * max(0, min(b1[3], b2[3]) - max(b1[1], b2[1]))
    union = (b1[2] - b1[0]) * (b1[3] - b1[1]) + (b2[2] - b2[0]) * (b2[3] - b2[1]) - inter
    assert inter / union == pytest.approx(200 * 200 / (208 * 208))


def test_check_formats_names_the_problem():
    assert check_formats(["nextgqa", ""], "gqa") == ["nextgqa"]
    with pytest.raises(ValueError, match="unknown export format 'nextqa'"):
        check_formats(["nextqa"], "gqa")
    with pytest.raises(ValueError, match="is for task 'tvg', not 'rec'"):
        check_formats(["lmms_eval_tvg"], "rec")


def test_score_cli_export(charades, tmp_path, capsys):
    ann = tmp_path / "ann.jsonl"
    ann.write_text("".join(json.dumps(a) + "\n" for a in charades))
    pred = tmp_path / "pred.jsonl"
    pred.write_text(json.dumps({"id": "3MSZA_1", "output": "24.0 to 30.0"}) + "\n"
                    + json.dumps({"id": "AB12C_2", "output": "1 to 5"}) + "\n")
    d = tmp_path / "exp"
    assert score_mod.main(["tvg", "--predictions", str(pred), "--annotations", str(ann),
                           "--export", "lmms_eval_tvg,time_r1_tvg", "--export-dir", str(d)]) == 0
    assert sorted(p.name for p in d.iterdir()) == ["lmms_eval_tvg_submission.json", "time_r1_predictions.jsonl"]
    assert score_mod.main(["tvg", "--predictions", str(pred), "--annotations", str(ann),
                           "--export", "nextgqa", "--export-dir", str(d)]) == 2
    assert "is for task 'gqa', not 'tvg'" in capsys.readouterr().err
