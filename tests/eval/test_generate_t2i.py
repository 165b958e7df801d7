"""eval/generate_t2i.py end to end on CPU: a tiny SD3 pipeline saved to a folder and loaded through the CLI path.

Reward values in images.jsonl are re-derived from the saved PNGs with independent code (brightness = mean/255,
Mini-GenEval with mmgrpo.synthetic.t2i.verify), aggregates with numpy; resume gives byte-identical rows.
"""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from eval import generate_t2i  # noqa: E402

torch.set_num_threads(1)
FAST = ["num_steps=3", "height=64", "width=64", "progress=false", "rewards=[mini_geneval,brightness]"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from mmgrpo.synthetic.t2i import make_prompts
    from flow_grpo.models import load_adapter
    from flow_grpo.models import save_tiny_pipeline

    root = tmp_path_factory.mktemp("gen_t2i")
    pipe = save_tiny_pipeline(str(root / "sd3"), "sd3")
    prompts = root / "prompts.jsonl"
    rows = make_prompts(3, seed=0, split="heldout")
    prompts.write_text("".join(json.dumps(m) + "\n" for m in rows))
    ad = load_adapter(pipe)  # a trained-looking LoRA, exported the way the trainer does it
    ad.add_lora(rank=4, alpha=8)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for n, p in ad.transformer.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    (root / "ckpt").mkdir()
    ad.save_lora(str(root / "ckpt" / "lora"))
    return {"root": root, "pipe": pipe, "prompts": str(prompts), "meta": rows}


def _run(*args):
    return generate_t2i.main(list(args) + FAST)


def _rows(d):
    return [json.loads(x) for x in (Path(d) / "images.jsonl").read_text().splitlines()]


def test_generate_score_and_resume(env, capsys):
    from mmgrpo.synthetic.t2i import verify
    from PIL import Image

    from mmgrpo.utils.seeding import sample_seed

    common = [f"pipeline={env['pipe']}", f"prompts={env['prompts']}", "images_per_prompt=2", "batch_size=4"]
    full = env["root"] / "full"
    assert _run(*common, f"out_dir={full}") == 0
    rows = _rows(full)
    assert [(r["prompt_index"], r["sample"]) for r in rows] == [(p, k) for p in range(3) for k in range(2)]
    bright, strict = [], []
    for r in rows:
        assert r["seed"] == sample_seed(0, r["prompt_index"], r["sample"])
        src = env["meta"][r["prompt_index"]]
        assert r["prompt"] == src["prompt"] and r["tag"] == src["tag"]
        assert r["metadata"] == {k: v for k, v in src.items() if k != "prompt"}
        img = np.asarray(Image.open(full / r["image"]).convert("RGB"))
        assert img.shape == (64, 64, 3)
        assert r["rewards"]["brightness"] == pytest.approx(img.mean() / 255.0, abs=1e-6)
        assert r["rewards"]["mini_geneval/strict"] == float(verify(img, r["metadata"])["correct"])
        bright.append(img.mean() / 255.0)
        strict.append(r["rewards"]["mini_geneval/strict"])
    a0, a1 = (np.asarray(Image.open(full / rows[i]["image"])) for i in (0, 1))
    assert np.abs(a0.astype(int) - a1.astype(int)).max() > 0  # two seeds of one prompt: different images
    m = json.loads((full / "metrics.json").read_text())
    assert m["n_images"] == 6 and m["n_prompts"] == 3 and m["images_per_prompt"] == 2
    assert m["rewards"]["brightness"]["mean"] == pytest.approx(np.mean(bright), abs=1e-6)
    assert m["rewards"]["brightness"]["std"] == pytest.approx(np.std(bright), abs=1e-6)
    assert m["mini_geneval"]["accuracy"] == pytest.approx(np.mean(strict))
    tags = sorted({r["tag"] for r in rows})
    assert sorted(m["by_tag"]) == tags and sum(v["n"] for v in m["by_tag"].values()) == 6
    assert sorted(p.name for p in (full / "grids").iterdir()) == ["batch_00000.png", "batch_00001.png"]
    s = json.loads((full / "settings.json").read_text())
    assert s["sampling"]["num_steps"] == 3 and s["sampling"]["cfg"] is True and len(s["sampling"]["sigmas"]) == 4
    assert s["model"]["fingerprint"]["digest"] and s["model"]["lora"] is None
    assert s["prompts"]["n_prompts"] == 3 and s["versions"]["diffusers"]
    b = m["rewards"]["brightness"]
    assert f"| brightness | {b['mean']:.4f} ± {b['std']:.4f} |" in (full / "report.md").read_text()
    capsys.readouterr()

    # interrupted after the first batch, torn last row, then resumed: byte-identical rows and images
    part = env["root"] / "part"
    assert _run(*common, f"out_dir={part}", "max_batches=1") == 0
    lines = (part / "images.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 4 and not (part / "metrics.json").exists()
    (part / "images.jsonl").write_text("".join(lines[:3]) + lines[3][:25])
    assert _run(*common, f"out_dir={part}") == 0
    assert (part / "images.jsonl").read_bytes() == (full / "images.jsonl").read_bytes()
    for r in rows:
        assert (part / r["image"]).read_bytes() == (full / r["image"]).read_bytes()
    # a different sampler setting must not be appended to this run
    assert _run(*common, f"out_dir={part}", "guidance_scale=2.0") == 1
    assert "sampling.guidance_scale" in capsys.readouterr().err


def test_lora_checkpoint_changes_images(env):
    common = [f"pipeline={env['pipe']}", f"prompts={env['prompts']}", "max_prompts=1", "grid_nrow=0"]
    base, tuned = env["root"] / "base1", env["root"] / "lora1"
    assert _run(*common, f"out_dir={base}") == 0
    assert _run(*common, f"out_dir={tuned}", f"lora={env['root'] / 'ckpt'}") == 0
    s = json.loads((tuned / "settings.json").read_text())
    assert s["model"]["lora"] == str((env["root"] / "ckpt" / "lora").resolve())
    assert "pytorch_lora_weights.safetensors" in s["model"]["lora_fingerprint"]["files"]
    from PIL import Image

    x, y = (np.asarray(Image.open(d / "images" / "000000.png")).astype(int) for d in (base, tuned))
    assert np.abs(x - y).mean() > 1.0
    with pytest.raises(FileNotFoundError, match="pytorch_lora_weights"):
        generate_t2i.resolve_lora(env["pipe"])


def test_rlg_weight_through_the_cli(env, capsys):
    """rlg_weight=0 / 1 with the LoRA reproduce the base / LoRA runs' PNGs exactly (same process; the LoRA is loaded
    by pipe.load_lora_weights and switched off for the base), 0.5 lies between; RLG without a LoRA is refused."""
    from PIL import Image

    common = [f"pipeline={env['pipe']}", f"prompts={env['prompts']}", "max_prompts=1", "grid_nrow=0"]
    base, tuned = env["root"] / "rlg_base", env["root"] / "rlg_tuned"
    assert _run(*common, f"out_dir={base}") == 0
    assert _run(*common, f"out_dir={tuned}", f"lora={env['root'] / 'ckpt'}") == 0
    img = {}
    for w in ("0", "1", "0.5"):
        d = env["root"] / f"rlg_{w}"
        assert _run(*common, f"out_dir={d}", f"lora={env['root'] / 'ckpt'}", f"rlg_weight={w}") == 0
        assert json.loads((d / "settings.json").read_text())["sampling"]["rlg_weight"] == float(w)
        img[w] = np.asarray(Image.open(d / "images" / "000000.png"))
    ref = {k: np.asarray(Image.open(d / "images" / "000000.png")) for k, d in (("0", base), ("1", tuned))}
    assert np.array_equal(img["0"], ref["0"]) and np.array_equal(img["1"], ref["1"])
    assert not np.array_equal(img["0.5"], ref["0"]) and not np.array_equal(img["0.5"], ref["1"])
    assert _run(*common, f"out_dir={env['root'] / 'rlg_nolora'}", "rlg_weight=2") != 0
    assert "rlg_weight=2.0 needs lora=DIR" in capsys.readouterr().err


def test_compute_metrics_by_hand():
    def row(i, tag, strict, bright):
        return {"index": i, "prompt_index": i // 2, "tag": tag,
                "rewards": {"mini_geneval/strict": strict, "brightness": bright}}

    rows = [row(3, "b", 0.0, 0.8), row(0, "a", 1.0, 0.2), row(1, "a", 0.0, 0.4), row(2, "a", 1.0, 0.6)]
    m = generate_t2i.compute_metrics(rows, images_per_prompt=2)
    assert m["n_images"] == 4 and m["n_prompts"] == 2
    assert m["rewards"]["brightness"]["mean"] == pytest.approx(0.5)
    # population std: deviations -0.3, -0.1, 0.1, 0.3 -> sqrt((0.09 + 0.01 + 0.01 + 0.09) / 4)
    assert m["rewards"]["brightness"]["std"] == pytest.approx(0.05 ** 0.5)
    assert m["rewards"]["brightness"]["min"] == 0.2 and m["rewards"]["brightness"]["max"] == 0.8
    assert m["by_tag"]["a"] == {"n": 3, "rewards": {"mini_geneval/strict": pytest.approx(2 / 3),
                                                    "brightness": pytest.approx(0.4)}}
    # image-level accuracy 2/4; GenEval "overall" = mean of per-tag accuracies (2/3 + 0) / 2
    assert m["mini_geneval"]["accuracy"] == pytest.approx(0.5)
    assert m["mini_geneval"]["overall"] == pytest.approx(1 / 3)
    assert m["mini_geneval"]["by_tag"] == {"a": pytest.approx(2 / 3), "b": 0.0}


def test_guidance_distilled_adapters_default_to_no_cfg_and_refuse_it():
    """FLUX and FLUX-Kontext (a FluxAdapter subclass) say supports_cfg=False: no CFG by default, cfg=true refused."""
    g = generate_t2i

    from flow_grpo.models.flux import FluxAdapter
    from flow_grpo.models.flux_kontext import FluxKontextAdapter
    from flow_grpo.models.sd3 import SD3Adapter

    for cls, default in ((SD3Adapter, True), (FluxAdapter, False), (FluxKontextAdapter, False)):
        ad = object.__new__(cls)  # only the class attribute is read
        assert g._use_cfg(g.EvalT2IConfig(), ad) is default
        if not default:
            with pytest.raises(ValueError, match="embedded guidance"):
                g._use_cfg(g.EvalT2IConfig(cfg=True), ad)
