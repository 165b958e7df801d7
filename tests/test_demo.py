"""The demo's wiring: every stage's command is built (dry run), and the report schema is produced."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_demo_dry_run_lists_every_stage(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "demo.py"), "--smoke", "--dry-run", "--rebuild",
                           "--out", str(out)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cmds = (out / "commands.sh").read_text()
    for needle in ["build_grounding_base.py", "synthetic_tvg.py", "generate_vlm.py", "mmgrpo.vlm.cli train",
                   "model.lora.enabled=true", "adapter="]:
        assert needle in cmds, needle
    if (REPO / "scripts" / "build_tiny_flow.py").exists():
        for needle in ["build_tiny_flow.py", "synthetic_t2i.py", "generate_t2i.py", "flow_grpo.cli train", "lora="]:
            assert needle in cmds, needle
    else:  # the T2I base recipe is not in this checkout: the demo must say so, not crash
        assert "t2i skipped" in proc.stdout and "flow_grpo.cli train" not in cmds


def test_report_schema(tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    import demo  # noqa: E402

    res = {"tvg": {"before": {"mIoU": 20.0, "R1@0.5": 10.0}, "after": {"mIoU": 30.5, "R1@0.5": 25.0}},
           "t2i": {"before": {"mini_geneval": {"accuracy": 0.10}}, "after": {"mini_geneval": {"accuracy": 0.30}},
                   "partial": {"before": 0.2, "after": 0.4},
                   "probes": {"before": {"n_images": 96, "right_count": 36.5, "n_objects": 200, "shape_ok": 85.0,
                                         "colour_ok": 99.0},
                              "after": {"n_images": 96, "right_count": 79.2, "n_objects": 210, "shape_ok": 84.0,
                                        "colour_ok": None}}}}
    demo.write_report(tmp_path, res, {"tvg_grpo": 12.0}, 100.0, smoke=False)
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["tvg"]["after"]["mIoU"] == 30.5 and m["t2i"]["before"]["accuracy"] == 10.0
    assert abs(m["t2i"]["after"]["accuracy"] - 30.0) < 1e-9 and m["seconds"] == 100.0
    rep = (tmp_path / "report.md").read_text()
    assert "+8 (met)" in rep and "+15 (met)" in rep
    assert "number of objects: 36.5 % -> 79.2 % (of 96)" in rep and "colour: 99.0 % -> - %" in rep
    assert m["t2i_probes"]["after"]["right_count"] == 79.2
    assert m["tvg_validation"] is None  # no validation curve in this result
    res["tvg"]["validation"] = [{"step": 0, "mIoU": 20.0, "R1@0.5": 9.0, "parse_rate": 100.0},
                                {"step": 10, "mIoU": 31.25, "R1@0.5": 24.0, "parse_rate": 100.0}]
    res["tvg"]["checkpoint"] = "step-00000010"
    demo.write_report(tmp_path, res, {"tvg_grpo": 12.0}, 100.0, smoke=False)
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["tvg_validation"][1] == {"step": 10, "mIoU": 31.25, "R1@0.5": 24.0, "parse_rate": 100.0}
    rep = (tmp_path / "report.md").read_text()
    assert "| 10 | 31.2 | 24.0 | 100.0 |" in rep and "checkpoint `step-00000010`" in rep
    assert m["tvg"]["after"]["mIoU"] == 30.5  # the keys are unchanged
    demo.write_report(tmp_path, {"tvg": res["tvg"]}, {}, 50.0, smoke=False)  # --tasks tvg: T2I not run
    rep = (tmp_path / "report.md").read_text()
    assert "+8 (met)" in rep and "+15 (not run)" in rep and "NOT met" not in rep
    res["tvg"]["after"]["mIoU"] = 25.0
    demo.write_report(tmp_path, res, {}, 50.0, smoke=False)
    assert "+8 (NOT met)" in (tmp_path / "report.md").read_text()


def test_report_headline_is_strict_with_lenient_second(tmp_path):
    """Issue #41: the strict protocol is the headline, the lenient parser second; the well-formed share before /
    after, its target, and raw outputs (pipes escaped) are in the report."""
    sys.path.insert(0, str(REPO / "scripts"))
    import demo  # noqa: E402

    def ev(miou, r1, l_miou, l_r1, wf, trunc):
        return {"mIoU": miou, "R1@0.5": r1, "protocol": "official", "well_formed": wf, "truncated": trunc,
                "lenient": {"mIoU": l_miou, "R1@0.5": l_r1}, "official": {"mIoU": miou, "R1@0.5": r1}}

    tvg = {"before": ev(24.4, 16.0, 24.4, 19.1, 100.0, 0.0), "after": ev(25.8, 21.3, 32.5, 40.0, 0.0, 47.2),
           "samples": [{"id": "q0", "before": "<answer>2.00 to 4.00</answer>", "after": "<answer>2.00 to 4.00.00|"}]}
    demo.write_report(tmp_path, {"tvg": tvg}, {}, 60.0, smoke=False)
    rep = (tmp_path / "report.md").read_text()
    assert "| temporal grounding | mIoU (strict: Time-R1's evaluation) | 24.4 | 25.8 | 1.4 | +8 (NOT met) |" in rep
    assert "| temporal grounding | R1@0.5 (strict: Time-R1's evaluation) | 16.0 | 21.3 | 5.3 | +8 (NOT met) |" in rep
    assert "| temporal grounding | well-formed answers | 100.0 | 0.0 | | >= 95 (NOT met) |" in rep
    assert "| temporal grounding | mIoU (lenient parser, not the headline) | 24.4 | 32.5 | 8.1 | |" in rep
    assert "cut at the token cap: 0.0 % before, 47.2 % after" in rep
    assert "| q0 | `<answer>2.00 to 4.00</answer>` | `<answer>2.00 to 4.00.00\\|` |" in rep
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["tvg"]["after"] == {"mIoU": 25.8, "R1@0.5": 21.3, "protocol": "official", "well_formed": 0.0,
                                 "truncated": 47.2, "lenient": {"mIoU": 32.5, "R1@0.5": 40.0}}
    tvg["after"].update({"mIoU": 40.0, "well_formed": 97.5})
    demo.write_report(tmp_path, {"tvg": tvg}, {}, 60.0, smoke=False)
    rep = (tmp_path / "report.md").read_text()
    assert "| 24.4 | 40.0 | 15.6 | +8 (met) |" in rep and "| 100.0 | 97.5 | | >= 95 (met) |" in rep


def test_tvg_summary_reads_both_protocols_and_the_shape():
    sys.path.insert(0, str(REPO / "scripts"))
    import demo  # noqa: E402

    m = {"n": 4, "mIoU": 3.2, "R1@0.5": 0.7, "protocol": {"name": "official", "parse_mode": "time_r1_eval"},
         "protocols": {"official": {"mIoU": 3.2, "R1@0.5": 0.7}, "lenient": {"mIoU": 35.1, "R1@0.5": 40.2}},
         "generation": {"well_formed_rate": 25.0, "n_truncated": 3, "mean_output_tokens": 24.0}}
    s = demo.tvg_summary(m)
    assert s["protocol"] == "official" and s["lenient"]["mIoU"] == 35.1 and s["official"]["R1@0.5"] == 0.7
    assert s["well_formed"] == 25.0 and s["truncated"] == 75.0 and demo.headline_parse_mode(m) == "time_r1_eval"


def test_tvg_curves_show_the_answers_shape(tmp_path, monkeypatch):
    """The TVG training plot carries the format guard's well-formed share and mean length next to the rewards
    (issue #41: a format collapse shows there, not in the rewards), in that order; absent keys are left out."""
    sys.path.insert(0, str(REPO / "scripts"))
    import demo  # noqa: E402
    import mmgrpo.utils.logging as logging_mod

    run = tmp_path / "tvg" / "grpo"
    run.mkdir(parents=True)
    rows = [{"step": i, "reward/iou/mean": 0.2, "reward/format/mean": 1.0, "completions/well_formed": 1.0 - i / 10,
             "completions/mean_length": 9.0 + i, "reward/total/mean": 0.3} for i in range(3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    seen = {}
    monkeypatch.setattr(logging_mod, "plot_curves", lambda mj, keys, out, smooth=0.0: seen.setdefault("keys", keys))
    demo.plot_training_curves(tmp_path)
    assert seen["keys"] == ["reward/iou/mean", "reward/format/mean", "completions/well_formed",
                            "completions/mean_length"]
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/iou/mean": 0.2}) + "\n")
    seen.clear()
    demo.plot_training_curves(tmp_path)
    assert seen["keys"] == ["reward/iou/mean"]


def test_grounding_probes_by_hand(tmp_path):
    """Video-blind baseline and query swap on hand-computed spans (docs/demo_models.md explains why they matter)."""
    sys.path.insert(0, str(REPO / "scripts"))
    import demo  # noqa: E402

    anns = [{"id": "a0", "task": "tvg", "query": "When does the red circle appear?", "video": "a.mp4",
             "duration": 10.0, "spans": [[0.0, 2.0]]},
            {"id": "a1", "task": "tvg", "query": "When does the blue square appear?", "video": "a.mp4",
             "duration": 10.0, "spans": [[4.0, 6.0]]}]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(a) + "\n" for a in anns))
    (tmp_path / "eval_before").mkdir()
    (tmp_path / "eval_before" / "predictions.jsonl").write_text(
        json.dumps({"id": "a0", "output": "<answer>0.00 to 2.00</answer>"}) + "\n"
        + json.dumps({"id": "a1", "output": "<answer>4.00 to 6.00</answer>"}) + "\n")
    rep = {"video_blind_baselines": {"duration_relative_span": {"span": [0.2, 0.8]}}}
    p = demo.grounding_probes(tmp_path / "eval.jsonl", tmp_path, rep)
    q = p["query_swap"]["before"]
    assert q["n"] == 2 and abs(q["own_mIoU"] - 100.0) < 1e-9 and abs(q["other_mIoU"]) < 1e-9
    # blind span [2, 8]: IoU 0 with [0, 2] (touching), 2/6 with [4, 6]
    assert abs(p["video_blind"]["mIoU"] - 100.0 * (0 + 2 / 6) / 2) < 1e-6
    assert "after" not in p["query_swap"]


def test_smoke_demo_runs_end_to_end(tmp_path):
    """The README's main command in its seconds-scale profile: every stage really runs (shipped bases, a few
    videos/prompts, one GRPO step/epoch) and the report has numbers for both tasks. Numbers mean nothing here."""
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "demo.py"), "--smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    m = json.loads((out / "metrics.json").read_text())
    assert m["smoke"] is True and m["seconds"] > 0
    for ph in ("before", "after"):
        assert isinstance(m["tvg"][ph]["mIoU"], float) and 0.0 <= m["tvg"][ph]["mIoU"] <= 100.0
        assert isinstance(m["t2i"][ph]["accuracy"], float) and 0.0 <= m["t2i"][ph]["accuracy"] <= 100.0
    assert (out / "tvg" / "eval_after" / "predictions.jsonl").exists()
    rep = (out / "report.md").read_text()
    # the headline is Time-R1's evaluation, the lenient parser second, with the answers' shape (issue #41)
    assert "| temporal grounding | mIoU (strict: Time-R1's evaluation) |" in rep
    assert "| temporal grounding | mIoU (lenient parser, not the headline) |" in rep
    assert "| temporal grounding | well-formed answers |" in rep and "## Temporal-grounding answers (held-out)" in rep
    assert m["tvg"]["after"]["protocol"] == "official" and isinstance(m["tvg"]["after"]["well_formed"], float)


def test_t2i_count_probe_by_hand(tmp_path):
    """count_probe on hand-drawn images: 'two red circles' drawn with 2 red circles (right count, shapes and
    colours right), and 'a blue square' drawn as 2 blue circles (wrong count, both shapes wrong)."""
    import numpy as np
    from PIL import Image, ImageDraw

    sys.path.insert(0, str(REPO / "scripts"))
    import demo  # noqa: E402

    def image(color, boxes, shape):
        img = Image.new("RGB", (32, 32), (255, 255, 255))
        d = ImageDraw.Draw(img)
        for b in boxes:
            (d.ellipse if shape == "circle" else d.rectangle)(b, fill=color)
        return img

    red, blue = (220, 40, 40), (40, 80, 220)
    image(red, [(1, 1, 13, 13), (17, 1, 29, 13)], "circle").save(tmp_path / "0.png")
    image(blue, [(1, 1, 13, 13), (17, 17, 29, 29)], "circle").save(tmp_path / "1.png")
    rows = [{"image": "0.png", "metadata": {"include": [{"class": "circle", "color": "red", "count": 2}]}},
            {"image": "1.png", "metadata": {"include": [{"class": "square", "color": "blue", "count": 1}]}},
            {"image": "1.png", "metadata": {"include": [{"class": "square", "count": 1},
                                                        {"class": "circle", "count": 1}]}}]  # two entries: skipped
    (tmp_path / "images.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = demo.count_probe(tmp_path)
    assert p["n_images"] == 2 and p["n_objects"] == 4
    assert p["right_count"] == 50.0 and p["shape_ok"] == 50.0 and p["colour_ok"] == 100.0
    assert demo.count_probe(tmp_path / "missing") == {"n_images": 0, "right_count": None, "n_objects": 0,
                                                      "shape_ok": None, "colour_ok": None}


def test_recipes_drive_the_commands(tmp_path):
    """The demo's settings come from configs/demo/*.yaml: a recipe key set on the command line reaches the
    generated commands (base checkpoint, benchmark generator arguments, GRPO settings), unknown keys are errors."""
    out = tmp_path / "demo"
    other = tmp_path / "other_base"  # another grounding base: a folder with a config.json is used as shipped
    other.mkdir()
    (other / "config.json").write_text("{}")
    # a base SFT'd with the query before the video: GRPO and evaluation must put it there too
    (other / "sft_report.json").write_text(json.dumps({"prompt": {"mode": "no_think", "query_position": "before"}}))
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "demo.py"), "--dry-run", "--tasks", "tvg",
                           "--out", str(out), f"tvg.base={other}", "tvg.benchmark_args=[--version, '2']",
                           "tvg.full.grpo.run.max_steps=7", "tvg.eval.decoding.max_new_tokens=30"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cmds = (out / "commands.sh").read_text().splitlines()
    data = next(c for c in cmds if "synthetic_tvg.py" in c)
    assert data.endswith("--version 2")
    train = next(c for c in cmds if "mmgrpo.vlm.cli train" in c)
    assert "run.max_steps=7" in train and "run.max_steps=250" not in train and "methods.tempsamp_r1.enabled" not in train
    assert f"model.path={other} " in train and not any("build_" in c for c in cmds)
    assert all("decoding.max_new_tokens=30" in c for c in cmds if "generate_vlm.py" in c)
    assert all("data.query_position=before" in c for c in cmds if "generate_vlm.py" in c or "mmgrpo.cli train" in c)
    bad = subprocess.run([sys.executable, str(REPO / "scripts" / "demo.py"), "--dry-run", "--out", str(out),
                          "tvg.full.grpo_steps=3"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert bad.returncode == 2 and "tvg.full.grpo_steps" in bad.stderr


def test_recipe_values_render_as_overrides():
    sys.path.insert(0, str(REPO / "scripts"))
    import demo  # noqa: E402

    r = demo.load_recipes()
    assert demo.kv({"a.b": True, "c": {"x": 1.0, "y": {"m": "partial"}}, "d": [1, "z"], "e": None}) == \
        ["a.b=true", "c={x: 1.0, y: {m: partial}}", "d=[1, z]", "e=null"]
    assert "reward.weights={iou: 1.0, format: 0.1}" in demo.kv(r.tvg.grpo)
    assert "optim.lr=5e-4" in demo.kv(r.tvg.full.grpo) and r.tvg.smoke.n_train == 4 and r.tvg.full.n_train == 600


def test_benchmark_sizes_and_arguments_come_from_the_base(tmp_path):
    """A base built from a --data-dir reports its generator's own sizes (data.info); the demo regenerates that
    benchmark, and refuses generator arguments that would make another one (its held-out split would differ)."""
    sys.path.insert(0, str(REPO / "scripts"))
    import demo  # noqa: E402

    info = {"version": 2, "seed": 0, "n_train": 3000, "n_eval": 100, "n_val": 60, "clock": "light", "lanes": 3,
            "n_events": [2, 3]}
    rep = {"args": {"n_train": 400, "n_eval": 100, "seed": 0}, "data": {"info": info}}
    assert demo.benchmark_sizes(rep) == {"n_train": 3000, "n_eval": 100, "seed": 0}
    assert demo.benchmark_sizes({"args": {"n_train": 400, "n_eval": 100, "seed": 1}})["n_train"] == 400  # version 1
    demo.check_benchmark_args(rep, ["--version", "2", "--clock", "light", "--events", "2", "3"])
    for bad in (["--version", "2", "--clock", "light"],  # default events 3-5
                ["--version", "2", "--events", "2", "3"],  # no clock
                ["--clock", "light", "--events", "2", "3"]):  # version 1
        with pytest.raises(SystemExit, match="does not match the base's own benchmark"):
            demo.check_benchmark_args(rep, bad)
    demo.check_benchmark_args({"args": {}}, ["--version", "2"])  # a base without data.info: nothing to check
    r = demo.load_recipes()
    shipped = json.loads((REPO / r.tvg.base / "sft_report.json").read_text())
    demo.check_benchmark_args(shipped, r.tvg.benchmark_args)  # the shipped recipe matches the shipped base
