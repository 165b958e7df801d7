"""eval/report.py and eval/compare.py on hand-made metric / settings / training-log files (expected text by hand)."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from eval import compare, report  # noqa: E402


def _vlm_metrics(miou, r3, r5, r7, pfr, by):
    return {"kind": "vlm", "n": 4, "n_missing": 0, "n_parse_failed": 1, "R1@0.3": r3, "R1@0.5": r5, "R1@0.7": r7,
            "mIoU": miou, "parse_failure_rate": pfr, "n_unmatched_predictions": 0,
            "config": {"task": "tvg"}, "generation": {"n_truncated": 1, "mean_output_tokens": 12.5},
            "by": {"duration_bucket": by}}


def _settings(name, model, fps=2.0, sha="a" * 64, mode="think"):
    return {"kind": "vlm", "task": "tvg", "fingerprint": name * 8,
            "model": {"path": model, "fingerprint": {"digest": model[-1] * 64, "files": {"w.safetensors": {}}},
                      "family": "qwen2_5_vl", "dtype": "bfloat16"},
            "video": {"fps": fps, "min_frames": 4, "max_frames": 768, "min_pixels": 12544, "max_pixels": 602112,
                      "total_pixels": 2809856.0},
            "prompt": {"mode": mode, "answer_format": "seconds", "example_rendered": "x" * 500},
            "decoding": {"greedy": True, "max_new_tokens": 1024, "batch_size": 4},
            "data": {"annotations": "/d/charades_test.jsonl", "sha256": sha, "n": 4},
            "run": {"name": name, "out_dir": f"/runs/{name}", "created": "today"}}


def _run_dir(root, name, metrics, settings=None):
    d = root / name
    d.mkdir()
    (d / "metrics.json").write_text(json.dumps(metrics))
    if settings is not None:
        (d / "settings.json").write_text(json.dumps(settings))
    return d


BY_BASE = {"0-30s": {"n": 3, "mIoU": 30.0, "R1@0.3": 33.33333, "R1@0.5": 33.33333, "R1@0.7": 0.0,
                     "parse_failure_rate": 33.33333},
           "30-60s": {"n": 1, "mIoU": 35.0, "R1@0.3": 100.0, "R1@0.5": 0.0, "R1@0.7": 0.0, "parse_failure_rate": 0.0}}
BY_FT = {"0-30s": {"n": 3, "mIoU": 40.0}, "30-60s": {"n": 1, "mIoU": 62.0}}


@pytest.fixture
def runs(tmp_path):
    base = _run_dir(tmp_path, "base", _vlm_metrics(31.25, 50.0, 25.0, 0.0, 25.0, BY_BASE), _settings("base", "/m/base"))
    ft = _run_dir(tmp_path, "ft", _vlm_metrics(45.5, 75.0, 50.0, 25.0, 0.0, BY_FT), _settings("ft", "/m/ft"))
    fps1 = _run_dir(tmp_path, "ft_fps1", _vlm_metrics(40.0, 75.0, 50.0, 0.0, 0.0, BY_FT),
                    _settings("ft_fps1", "/m/ft", fps=1.0, mode="no_think"))
    other = _run_dir(tmp_path, "ft_other_data", _vlm_metrics(20.0, 25.0, 0.0, 0.0, 0.0, BY_FT),
                     _settings("ft_other_data", "/m/ft", sha="b" * 64))
    return base, ft, fps1, other


def test_report_markdown_and_json(runs):
    base = runs[0]
    s = report.write_report(base)
    md = (base / "report.md").read_text()
    assert list(s["metrics"]) == ["R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "parse_failure_rate", "n"]
    for line in ("| R1@0.3 | 50.00 |", "| R1@0.5 | 25.00 |", "| R1@0.7 | 0.00 |", "| mIoU | 31.25 |",
                 "| parse_failure_rate | 25.00 |", "| n | 4 |", "| generation.n_truncated | 1 |",
                 "| generation.mean_output_tokens | 12.50 |", "## By duration_bucket",
                 "| duration_bucket | n | R1@0.3 | R1@0.5 | R1@0.7 | mIoU | parse_failure_rate |",
                 "| 0-30s | 3 | 33.33 | 33.33 | 0.00 | 30.00 | 33.33 |",
                 "| 30-60s | 1 | 100.00 | 0.00 | 0.00 | 35.00 | 0.00 |",
                 "- prompt: think, answer format seconds",
                 "- video: fps 2.0, frames 4-768, pixels/frame 12544-602112, total 2809856.0"):
        assert line in md, line
    assert json.loads((base / "report.json").read_text()) == json.loads(json.dumps(s))
    # long prompt texts are hashed, per-file tables and run bookkeeping dropped from the flattened settings
    assert s["settings"]["prompt.example_rendered"].startswith("sha256:")
    assert not any(k.startswith("run.") or ".files" in k for k in s["settings"])
    assert report.main([str(base.parent / "missing")]) == 1


def test_compare_base_vs_finetuned(runs, tmp_path, capsys):
    base, ft = runs[:2]
    out = tmp_path / "cmp" / "cmp.md"
    assert compare.main([str(base), str(ft), "--out", str(out)]) == 0
    md = out.read_text()
    for line in ("| metric | base | ft | Δ ft |", "| R1@0.3 | 50.00 | 75.00 | +25.00 |",
                 "| R1@0.7 | 0.00 | 25.00 | +25.00 |", "| mIoU | 31.25 | 45.50 | +14.25 |",
                 "| parse_failure_rate | 25.00 | 0.00 | -25.00 |", "| n | 4 | 4 | +0 |",
                 "## mIoU by duration_bucket", "| 0-30s | 30.00 | 40.00 | +10.00 |",
                 "| 30-60s | 35.00 | 62.00 | +27.00 |", "| model.path | /m/base | /m/ft |"):
        assert line in md, line
    assert "Warning" not in md  # only the model differs
    js = json.loads(out.with_suffix(".json").read_text())
    assert js["baseline"] == "base" and js["warnings"] == []
    assert set(js["settings_diff"]) == {"model.path", "model.fingerprint.digest"}
    assert js["rows"][3] == {"metric": "mIoU", "values": [31.25, 45.5], "deltas": {"ft": 14.25}}


def test_compare_warns_when_protocol_or_data_differ(runs):
    base, ft, fps1, other = runs
    c = compare.compare([ft, fps1, base], names=["grpo", "grpo@1fps", "qwen"], baseline="qwen")
    assert c["baseline"] == "qwen"
    assert [r["deltas"] for r in c["rows"] if r["metric"] == "mIoU"] == [{"grpo": 14.25, "grpo@1fps": 8.75}]
    assert len(c["warnings"]) == 1 and "video.fps" in c["warnings"][0] and "prompt.mode" in c["warnings"][0]
    assert c["settings_diff"]["video.fps"] == [2.0, 1.0, 2.0]
    md = compare.render_comparison(c)
    assert "| metric | grpo | grpo@1fps | qwen | Δ grpo | Δ grpo@1fps |" in md
    assert "| mIoU | 45.50 | 40.00 | 31.25 | +14.25 | +8.75 |" in md
    c2 = compare.compare([base, other])
    assert any("different evaluation data (data.sha256)" in w for w in c2["warnings"])
    with pytest.raises(ValueError, match="baseline"):
        compare.compare([base, ft], baseline="nope")


def _t2i(root, name, b_mean, b_std, acc, overall, tags):
    m = {"kind": "t2i", "n_images": 8, "n_prompts": 4, "images_per_prompt": 2,
         "rewards": {"brightness": {"mean": b_mean, "std": b_std, "min": 0.0, "max": 1.0, "n": 8},
                     "mini_geneval/strict": {"mean": acc, "std": 0.5, "min": 0.0, "max": 1.0, "n": 8}},
         "by_tag": {t: {"n": 4, "rewards": {"brightness": b, "mini_geneval/strict": a}} for t, (b, a) in tags.items()},
         "mini_geneval": {"accuracy": acc, "overall": overall, "by_tag": {t: a for t, (_, a) in tags.items()}}}
    s = {"kind": "t2i", "model": {"pipeline": "/p/sd3", "lora": None if name == "base" else f"/l/{name}"},
         "sampling": {"num_steps": 40, "guidance_scale": 4.5, "cfg": True, "height": 512, "width": 512, "seed": 0},
         "prompts": {"file": "/p/prompts.jsonl", "sha256": "c" * 64, "n_prompts": 4, "images_per_prompt": 2}}
    return _run_dir(root, name, m, s)


def test_t2i_report_and_compare(tmp_path):
    base = _t2i(tmp_path, "base", 0.5, 0.1, 0.25, 0.25, {"counting": (0.4, 0.0), "colors": (0.6, 0.5)})
    lora = _t2i(tmp_path, "lora", 0.6, 0.05, 0.75, 0.75, {"counting": (0.5, 0.5), "colors": (0.7, 1.0)})
    md = report.render_markdown(report.summarize(base))
    for line in ("| brightness | 0.5000 ± 0.1000 |", "| mini_geneval accuracy | 0.2500 |", "| n_images | 8 |",
                 "| tag | n | brightness | mini_geneval/strict | mini_geneval accuracy |",
                 "| counting | 4 | 0.4000 | 0.0000 | 0.0000 |",
                 "- sampling: ODE 40 steps, guidance 4.5 (cfg True), 512x512, seed 0"):
        assert line in md, line
    c = compare.compare([base, lora])
    md = compare.render_comparison(c)
    for line in ("| brightness | 0.5000 ± 0.1000 | 0.6000 ± 0.0500 | +0.1000 |",
                 "| mini_geneval overall | 0.2500 | 0.7500 | +0.5000 |",
                 "## mini_geneval accuracy by tag", "| colors | 0.5000 | 1.0000 | +0.5000 |",
                 "| model.lora | - | /l/lora |"):
        assert line in md, line
    assert c["warnings"] == []


def test_training_curves(tmp_path):
    def log(name, rows):
        d = tmp_path / name
        d.mkdir()
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return d

    a = log("grpo", [{"step": 1, "time": 0, "reward/mean": 0.1, "reward/iou/mean": 0.2, "reward/iou/std": 0.1,
                      "train/loss": 1.0},
                     {"step": 2, "time": 1, "reward/mean": None, "reward/iou/mean": 0.3},
                     {"step": 3, "time": 2, "reward/mean": 0.5, "reward/iou/mean": 0.4}])
    b = log("tempsamp", [{"step": 2, "reward/iou/mean": 0.5}, {"step": 1, "reward/iou/mean": 0.25}])
    assert compare.default_curve_keys(compare.read_rows(a)) == ["reward/mean", "reward/iou/mean"]
    png = tmp_path / "curves.png"
    data = compare.plot_training_curves([a, b], png)
    assert data["reward/mean"] == {"grpo": ([1, 3], [0.1, 0.5]), "tempsamp": ([], [])}  # null row left out
    assert data["reward/iou/mean"]["tempsamp"] == ([1, 2], [0.25, 0.5])  # sorted by step
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = tmp_path / "cmp.md"
    base = _run_dir(tmp_path, "r1", _vlm_metrics(1.0, 1.0, 1.0, 1.0, 0.0, {}), None)
    assert compare.main([str(base), "--out", str(out), "--curves", str(a), str(b / "metrics.jsonl"),
                         "--curve-keys", "reward/iou/mean", "--smooth", "0.5"]) == 0
    assert "![training curves](cmp_curves.png)" in out.read_text()
    assert (tmp_path / "cmp_curves.png").is_file()
    cj = json.loads(out.with_suffix(".json").read_text())
    assert list(cj["curves"]) == ["reward/iou/mean"]
    assert any("no settings.json" in w for w in cj["warnings"])


def test_every_benchmark_config_loads():
    """eval/configs/*.yaml parse into their harness config (unknown keys or bad values would raise)."""
    from eval.generate_t2i import EvalT2IConfig
    from eval.generate_vlm import EvalVLMConfig
    from mmgrpo.utils.config import load_config

    tasks = {}
    for f in sorted((ROOT / "eval" / "configs").glob("*.yaml")):
        if f.stem == "mini_geneval":
            c = load_config(EvalT2IConfig, f)
            assert (c.images_per_prompt, c.num_steps, c.rewards) == (4, 40, ["mini_geneval"])
            continue
        c = load_config(EvalVLMConfig, f)
        tasks[f.stem] = c.data.task
        if c.data.task != "rec":  # the training video contract: fps 2 and the 3584*28*28 budget
            # longvideo_seek samples as its training recipe, ParaVT's release, does: 1 fps (vital_seek_longvideo.yaml)
            assert c.data.video_fps == (1.0 if f.stem == "longvideo_seek" else 2.0)
            assert c.data.video_total_pixels == 3584 * 28 * 28
    assert tasks == {"activitynet_captions": "tvg", "charades_sta": "tvg", "mvbench": "mcq", "nextgqa": "gqa",
                     "refcoco": "rec", "synthetic_tvg": "tvg", "vsibench": "mcq", "qvhighlights": "tvg",
                     "seed_bench_r1": "mcq", "longvideobench": "mcq", "mmvu_mc": "mcq",
                     "clevrer_mc": "mcq", "vstar_mcq": "mcq", "longvideo_seek": "mcq"}  # the last two: tool recipes
    from eval.benchmarks import check_benchmark

    for f in sorted((ROOT / "eval" / "configs").glob("*.yaml")):
        if f.stem != "mini_geneval":
            c = load_config(EvalVLMConfig, f)
            if c.score.benchmark:  # the benchmark scorer applies to the config's task
                check_benchmark(c.score.benchmark, c.data.task)
