"""Official metrics of eval/benchmarks.py against values computed by hand (issue #38 item 6)."""
import json
import os
import random
from pathlib import Path

import pytest

from eval import benchmarks as B

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------ VSI-Bench
@pytest.mark.parametrize("pred,gt,want", [
    (10.0, 10.0, 1.0),
    (11.0, 10.0, 0.9),   # error 0.1 <= 1 - θ for θ = 0.50 .. 0.90 (the release's 0.9 is 0.8999999999999999)
    (12.0, 10.0, 0.6),   # error 0.2: θ = 0.50 .. 0.75; at θ = 0.8, 1 - 0.8 = 0.19999999999999996 < 0.2 in floating
                         # point, as the release computes it
    (3.0, 4.0, 0.6),     # error 0.25: θ = 0.50 .. 0.75 (0.25 <= 0.25 counts: the release's <=)
    (15.0, 10.0, 0.1),   # error 0.5: only θ = 0.5 (1 - 0.5 = 0.5; with the paper's < it would be 0)
    (25.0, 10.0, 0.0),
    (None, 10.0, 0.0),
    (float("nan"), 10.0, 0.0),
])
def test_vsibench_mra_by_hand(pred, gt, want):
    assert B.vsibench_mra(pred, gt) == pytest.approx(want)


def test_vsibench_mra_is_monotone_in_the_error():
    rng = random.Random(0)
    for _ in range(200):
        gt = rng.uniform(0.5, 50)
        e1, e2 = sorted(rng.uniform(0, 1.2) for _ in range(2))
        assert B.vsibench_mra(gt * (1 + e1), gt) >= B.vsibench_mra(gt * (1 + e2), gt)
        assert B.vsibench_mra(gt * (1 + e1), gt) == B.vsibench_mra(gt * (1 - e1), gt) or e1 > 1


def test_vsibench_answer_token():
    assert B.vsibench_token("B. right") == "B"
    assert B.vsibench_token("<think>the lamp is left</think><answer>A</answer>") == "A"
    assert B.vsibench_token("<think>x</think> <answer> 3.5 meters </answer>") == "3.5"
    raw = "<think>x</think><answer>A</answer>"
    assert B.vsibench_token(raw, answer_from="output") == raw
    assert B.vsibench_token("The answer is B") == "The"  # the release reads the first word only
    assert B.vsibench_token(None) == ""


def _ann(i, qtype, answer, options=None):
    return {"id": str(i), "task": "mcq" if options else "qa", "answer": answer, "options": options,
            "meta": {"question_type": qtype}}


def test_vsibench_overall_is_the_mean_of_type_scores_with_rel_direction_merged():
    ab = ["left", "right"]
    anns = [_ann(0, "object_rel_direction_easy", "A", ab), _ann(1, "object_rel_direction_easy", "B", ab),
            _ann(2, "object_rel_direction_medium", "A", ab), _ann(3, "object_rel_direction_hard", "B", ab),
            _ann(4, "object_counting", "10"), _ann(5, "object_counting", "10"),
            _ann(6, "route_planning", "C", ["a", "b", "c"])]
    preds = [{"id": "0", "output": "A"}, {"id": "1", "output": "a"},  # easy 1/2 (case-insensitive: "a" != "B")
             {"id": "2", "output": "A."}, {"id": "3", "output": "A"},  # medium 1, hard 0
             {"id": "4", "output": "11"}, {"id": "5", "output": "15"},  # MRA 0.9 and 0.1 (see above)
             {"id": "6", "output": "c"}]
    m = B.score_vsibench(preds, anns)
    # rel_direction = (0.5 + 1 + 0) / 3 = 0.5; counting = 0.5; route = 1 -> overall (0.5 + 0.5 + 1) / 3
    assert m["object_rel_direction_accuracy"] == pytest.approx(50.0)
    assert m["object_counting_MRA:.5:.95:.05"] == pytest.approx(50.0)
    assert m["route_planning_accuracy"] == pytest.approx(100.0)
    assert m["overall"] is None and m["mean_of_present_types"] == pytest.approx(200 / 3)  # 3 of the 8 types
    assert m["missing_types"] == ["object_abs_distance", "object_size_estimation", "room_size_estimation",
                                  "object_rel_distance", "obj_appearance_order"]
    assert m["n"] == 7 and m["n_missing"] == 0
    assert list(k for k in m if k.endswith(("accuracy", "MRA:.5:.95:.05"))) == [
        "object_counting_MRA:.5:.95:.05", "object_rel_direction_accuracy", "route_planning_accuracy"]
    m2 = B.score_vsibench(preds[:-1], anns)  # a missing prediction scores 0
    assert m2["n_missing"] == 1 and m2["route_planning_accuracy"] == 0.0


def test_vsibench_overall_over_all_eight_types():
    anns, preds = [], []
    for i, t in enumerate(B.VSI_MCA_TYPES):
        anns.append(_ann(i, t, "A", ["x", "y"]))
        preds.append({"id": str(i), "output": "A"})
    for i, t in enumerate(B.VSI_NA_TYPES, start=10):
        anns.append(_ann(i, t, "2.5"))
        preds.append({"id": str(i), "output": "7" if t == "object_counting" else "2.5"})  # counting: error 1.8 -> 0
    m = B.score_vsibench(preds, anns)
    assert m["overall"] == pytest.approx(100 * 7 / 8) and "missing_types" not in m


def test_vsibench_rejects_unknown_types_and_partial_direction_levels():
    with pytest.raises(ValueError, match="unknown VSI-Bench question_type"):
        B.score_vsibench([], [_ann(0, "wall_color", "A", ["x", "y"])])
    with pytest.raises(ValueError, match="three levels"):
        B.score_vsibench([], [_ann(0, "object_rel_direction_easy", "A", ["x", "y"])])


def test_vsibench_on_converted_fixture(tmp_path):
    from mmgrpo.vlm.data import converters as C

    samples, _ = C.convert_vsibench(ROOT / "tests/data/fixtures/vsibench.jsonl")
    anns = [s.to_dict() for s in samples if s.id != "2"]  # one rel_direction level alone cannot be merged
    outs = {"0": "<answer>4</answer>", "1": "<answer>2.0</answer>", "2": "<answer>B</answer>",
            "3": "<answer>B</answer>", "4": "<answer>43</answer>"}
    m = B.score_vsibench([{"id": k, "output": v} for k, v in outs.items()], anns)
    # counting 1; abs_distance |2 - 1.8| / 1.8 = 0.111 <= 1 - θ for θ <= 0.85: 8/10
    assert m["object_counting_MRA:.5:.95:.05"] == pytest.approx(100.0)
    assert m["object_abs_distance_MRA:.5:.95:.05"] == pytest.approx(80.0)
    assert m["room_size_estimation_MRA:.5:.95:.05"] == pytest.approx(0.0)  # 43 vs 21.5: error 1.0
    assert m["route_planning_accuracy"] == 0.0


# ------------------------------------------------------------------------------------------------ QVHighlights
def test_detection_ap_by_hand():
    assert B.detection_ap([[0, 10]], [[0, 10, 0.9]]) == [1.0] * 10
    # a false positive ranked first: precision [0, 1/2], recall [0, 1] -> AP 0.5
    assert B.detection_ap([[0, 10]], [[20, 30, 0.9], [0, 10, 0.5]]) == pytest.approx([0.5] * 10)
    # a duplicate of a matched window is a false positive: tp [1, 0, 1], precision [1, 1/2, 2/3], recall
    # [1/2, 1/2, 1] -> 1/2 * 1 + 1/2 * 2/3
    ap = B.detection_ap([[0, 10], [20, 30]], [[0, 10, 0.9], [1, 10, 0.8], [20, 30, 0.7]])
    assert ap == pytest.approx([0.5 + 1 / 3] * 10)
    # IoU 0.9: a hit up to θ = 0.9, a miss at 0.95
    assert B.detection_ap([[0, 10]], [[1, 10, 1.0]]) == pytest.approx([1.0] * 9 + [0.0])
    assert B.detection_ap([[0, 10]], []) == [0.0] * 10


def test_detection_ap_is_one_for_the_ground_truth_and_in_unit_interval():
    rng = random.Random(1)
    for _ in range(50):
        gt = sorted({(a := rng.randrange(0, 70) * 2, a + rng.randrange(1, 20) * 2) for _ in range(rng.randint(1, 3))})
        assert B.detection_ap(gt, [[s, e, 1.0 - k / 10] for k, (s, e) in enumerate(gt)]) == pytest.approx([1.0] * 10)
        preds = [[s, s + rng.uniform(1, 30), rng.random()] for s in (rng.uniform(0, 120) for _ in range(5))]
        assert all(0.0 <= x <= 1.0 for x in B.detection_ap(gt, preds))


def test_highlight_ap_by_hand():
    # points (recall, precision): (1/2, 1), (1/2, 1/2), (1, 2/3), (1, 1/2) -> levels 1/2: 1, 1: 2/3
    assert B.highlight_ap([1, 0, 1, 0], [0.9, 0.8, 0.7, 0.1]) == pytest.approx((1 + 2 / 3) / 2)
    # tied scores enter together: (1/2, 1/2), (1, 2/3) -> both levels take 2/3
    assert B.highlight_ap([1, 0, 1], [0.5, 0.5, 0.1]) == pytest.approx(2 / 3)
    assert B.highlight_ap([0, 0, 0], [1, 2, 3]) == 0.0 and B.highlight_ap([1, 1], [0, 1]) == 1.0
    assert B.highlight_ap([0, 1, 0, 1], [0.1, 0.9, 0.2, 0.8]) == 1.0  # positives ranked first


def test_qvhighlights_end_to_end_by_hand():
    from mmgrpo.vlm.data import converters as C

    samples, _ = C.convert_qvhighlights(ROOT / "tests/data/fixtures/qvhighlights.jsonl")
    anns = [s.to_dict() for s in samples]
    n101, n102 = 75, 75  # 150 s / 2 s clips
    sal101 = [0.0] * n101
    sal101[6] = 1.0  # clip 6: scores [4, 4, 3] -> a hit at every minimum
    sal102 = [0.0] * n102
    sal102[1] = 1.0  # clip 1: [2, 1, 2] -> a hit for Fair (>= 2) only
    subs = [{"qid": 101, "pred_relevant_windows": [[10, 18, 0.9]], "pred_saliency_scores": sal101},
            {"qid": 102, "pred_relevant_windows": [[80, 86, 0.8], [0, 4, 0.7]], "pred_saliency_scores": sal102}]
    m = B.score_qvhighlights(subs, anns)
    b = m["brief"]
    assert b["MR-full-mAP"] == 100.0 and b["MR-full-R1@0.7"] == 100.0
    assert b["HL-min-Fair-Hit1"] == 100.0 and b["HL-min-Good-Hit1"] == 50.0 and b["HL-min-VeryGood-Hit1"] == 50.0
    # short windows (<= 10 s): both queries (8 s; 4 s and 6 s); none is middle or long -> empty ranges score 0
    assert m["short"]["n"] == 2 and m["middle"]["n"] == 0 and b["MR-middle-mAP"] == 0.0
    # a generative output: one window read from the text, no saliency -> HL not scored
    gen = [{"id": "101", "output": "<think>..</think><answer>10.0 to 18.0</answer>"},
           {"id": "102", "output": "<answer>0 to 4</answer>"}]
    g = B.score_qvhighlights(gen, anns)
    # query 102: one of two windows found -> AP 1/2; R1 hits
    assert g["brief"]["MR-full-mAP"] == 75.0 and g["brief"]["MR-full-R1@0.5"] == 100.0
    assert "not scored" in g["highlight"] and "HL-min-Fair-mAP" not in g["brief"]
    with pytest.raises(ValueError, match="1 of 2 queries have no prediction"):
        B.score_qvhighlights(gen[:1], anns)


@pytest.mark.skipif(not os.environ.get("MMGRPO_MOMENT_DETR_DIR"),
                    reason="set MMGRPO_MOMENT_DETR_DIR to a jayleicn/moment_detr checkout to compare with its release")
def test_qvhighlights_matches_the_released_sample_metrics():
    """standalone_eval/sample_val_preds.jsonl against data/highlight_val_release.jsonl must give the released
    sample_val_preds_metrics_raw.json (measured: all 14 brief numbers and the 80 per-range MR numbers equal)."""
    d = Path(os.environ["MMGRPO_MOMENT_DETR_DIR"])
    read = lambda p: [json.loads(x) for x in p.read_text().splitlines() if x.strip()]  # noqa: E731
    m = B.score_qvhighlights(read(d / "standalone_eval/sample_val_preds.jsonl"),
                             read(d / "data/highlight_val_release.jsonl"))
    want = json.loads((d / "standalone_eval/sample_val_preds_metrics_raw.json").read_text())
    assert m["brief"] == want["brief"]
    for r in ("full", "short", "middle", "long"):
        assert m[r]["MR-mAP"] == want[r]["MR-mAP"] and m[r]["MR-R1"] == want[r]["MR-R1"]


# ------------------------------------------------------------------------------------------------ SEED-Bench-R1
def test_seed_bench_r1_first_answer_block_first_letter():
    assert B.seed_bench_r1_correct("<think>x</think><answer>B. pick up knife</answer>", "B") == 1.0
    assert B.seed_bench_r1_correct("<answer> C </answer><answer>B</answer>", "B") == 0.0  # the first block
    assert B.seed_bench_r1_correct("B", "B") == 0.0  # no block
    assert B.seed_bench_r1_correct("<answer></answer>", "B") == 0.0
    anns = [{"id": "1", "answer": "A", "meta": {"level": "L1"}}, {"id": "2", "answer": "B", "meta": {"level": "L1"}},
            {"id": "3", "answer": "C", "meta": {"level": "L3"}}]
    preds = [{"id": "1", "output": "<answer>A</answer>"}, {"id": "3", "output": "<answer>C</answer>"}]
    m = B.score_seed_bench_r1(preds, anns)
    assert m["by_level"] == {"L1": {"accuracy": 50.0, "n": 2}, "L3": {"accuracy": 100.0, "n": 1}}
    assert m["accuracy"] == pytest.approx(200 / 3) and m["n_missing"] == 1


# ------------------------------------------------------------------------------------------------ CLEVRER
def test_clevrer_per_option_and_per_question():
    from mmgrpo.vlm.data import converters as C

    samples, _ = C.convert_clevrer(ROOT / "tests/data/fixtures/clevrer.json")
    anns = [s.to_dict() for s in samples]
    preds = [{"id": "10000_0", "output": "<answer>2</answer>"}, {"id": "10000_1", "output": "Red."},
             {"id": "10000_12_0", "output": "<answer>yes</answer>"}, {"id": "10000_12_1", "output": "no"},
             {"id": "10000_12_2", "output": "<answer>B</answer>"}]  # the third choice is correct: "B" (no) is wrong
    m = B.score_clevrer(preds, anns)
    assert m["descriptive"] == {"accuracy": 100.0, "n": 2}
    assert m["explanatory"]["per_option"] == pytest.approx(200 / 3) and m["explanatory"]["per_question"] == 0.0
    preds[-1] = {"id": "10000_12_2", "output": "A"}
    assert B.score_clevrer(preds, anns)["explanatory"]["per_question"] == 100.0


def test_cli_writes_metrics(tmp_path):
    import subprocess
    import sys

    from mmgrpo.vlm.data import converters as C

    samples, _ = C.convert_qvhighlights(ROOT / "tests/data/fixtures/qvhighlights.jsonl")
    ann = tmp_path / "a.jsonl"
    ann.write_text("".join(json.dumps(s.to_dict()) + "\n" for s in samples))
    pred = tmp_path / "p.jsonl"
    pred.write_text('{"id": "101", "output": "10 to 18"}\n{"id": "102", "output": "80 to 86"}\n')
    r = subprocess.run([sys.executable, str(ROOT / "eval/benchmarks.py"), "qvhighlights", "--predictions", str(pred),
                        "--annotations", str(ann), "--out", str(tmp_path / "m.json")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "m.json").read_text())["brief"]["MR-full-mAP"] == 75.0


def test_generate_vlm_writes_the_benchmark_metrics(tmp_path):
    """score.benchmark in an eval config: score_run adds the benchmark's own numbers to metrics.json."""
    from eval.generate_vlm import PREDICTIONS, EvalVLMConfig, score_options, score_run
    from mmgrpo.vlm.data import converters as C

    samples, _ = C.convert_qvhighlights(ROOT / "tests/data/fixtures/qvhighlights.jsonl")
    ann = tmp_path / "qvh.jsonl"
    ann.write_text("".join(json.dumps(s.to_dict()) + "\n" for s in samples))
    (tmp_path / PREDICTIONS).write_text(json.dumps({"id": "101", "output": "<answer>10 to 18</answer>"}) + "\n"
                                        + json.dumps({"id": "102", "output": "<answer>0 to 4</answer>"}) + "\n")
    cfg = EvalVLMConfig(out_dir=str(tmp_path))
    cfg.data.annotations, cfg.data.task, cfg.score.benchmark = str(ann), "tvg", "qvhighlights"
    settings = {"score": score_options(cfg, "qwen2_5_vl"), "data": {"annotations": str(ann)}, "fingerprint": "x",
                "decoding": {}}
    m = score_run(cfg, settings, [s.to_dict() for s in samples], tmp_path)
    assert m["benchmark"]["name"] == "qvhighlights" and m["benchmark"]["brief"]["MR-full-mAP"] == 75.0
    assert json.loads((tmp_path / "metrics.json").read_text())["benchmark"]["brief"]["MR-full-R1@0.5"] == 100.0
    from eval.benchmarks import check_benchmark

    with pytest.raises(ValueError, match="scores tvg samples, not 'mcq'"):
        check_benchmark("qvhighlights", "mcq")
    with pytest.raises(ValueError, match="unknown benchmark"):
        check_benchmark("vsi", "mcq")


def test_mcq_scoring_takes_numerical_qa_samples_of_a_mixed_file():
    """VSI-Bench in one run: eval/score.py mcq scores the letters and the numbers (Video-R1's reading: number
    compared after rounding, plus MRA); free-form qa samples are refused by name."""
    from eval.score import ScoreInputError, score
    from mmgrpo.vlm.data import converters as C

    samples, _ = C.convert_vsibench(ROOT / "tests/data/fixtures/vsibench.jsonl")
    anns = [s.to_dict() for s in samples]
    outs = {"0": "<answer>4</answer>", "1": "<answer>2.0</answer>", "2": "<answer>B</answer>",
            "3": "<answer>B</answer>", "4": "<answer>21.5</answer>"}
    m = score("mcq", [{"id": k, "output": v} for k, v in outs.items()], anns).metrics
    assert m["n"] == 5 and m["n_numeric"] == 3
    assert m["accuracy"] == pytest.approx(60.0)  # 4, B, 21.5 right; 2.0 vs 1.8 and B vs A wrong
    free = dict(anns[0], meta={"problem_type": "free-form"}, answer="a red cup")
    with pytest.raises(ScoreInputError, match="problem_type 'free-form' cannot be scored as mcq"):
        score("mcq", [], [free])


def test_the_start_check_reward_of_a_mixed_mcq_file_scores_numbers():
    from eval.generate_vlm import EvalVLMConfig, check_reward_fn

    cfg = EvalVLMConfig()
    cfg.data.task = "mcq"
    fn = check_reward_fn(cfg.data, cfg.score, "qwen2_5_vl", has_qa=True)
    qa = {"id": "1", "task": "qa", "query": "How many chairs?", "video": "v.mp4", "answer": "4",
          "meta": {"problem_type": "numerical"}}
    mcq = {"id": "2", "task": "mcq", "query": "Left or right?", "video": "v.mp4", "options": ["left", "right"],
           "answer": "B"}
    right = fn.score(["<think>x</think><answer>4</answer>", "<think>x</think><answer>B</answer>"], [qa, mcq])
    wrong = fn.score(["<think>x</think><answer>5</answer>", "<think>x</think><answer>A</answer>"], [qa, mcq])
    assert right["video_r1_accuracy"] == [1.0, 1.0] and wrong["video_r1_accuracy"] == [0.0, 0.0]
