"""eval/generate_t2i.py with a text-to-video pipeline (the tiny Wan saved as a folder): each sample is a video,
scored by video rewards and saved as a lossless PNG frame strip; rewards are recomputed here by hand from the file."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from eval import generate_t2i  # noqa: E402

F, H = 5, 32
ARGS = ["num_steps=2", f"height={H}", f"width={H}", f"num_frames={F}", "max_sequence_length=16", "progress=false",
        "guidance_scale=5.0", "hash_weights=none", "batch_size=2", "grid_nrow=2",
        "rewards=[video_per_frame,temporal_consistency]",
        "reward_kwargs={video_per_frame: {reward: brightness, aggregate: min}}"]


@pytest.fixture(scope="module")
def wan_dir(tmp_path_factory):
    from flow_grpo.models import save_tiny_pipeline

    root = tmp_path_factory.mktemp("gen_t2v")
    (root / "prompts.txt").write_text("a red ball rolls\na cat jumps\n")
    return root, save_tiny_pipeline(str(root / "wan"), "wan")


def test_videos_are_saved_as_frame_strips_and_scored(wan_dir):
    root, pipe = wan_dir
    out = root / "out"
    assert generate_t2i.main([f"pipeline={pipe}", f"prompts={root / 'prompts.txt'}", f"out_dir={out}"] + ARGS) == 0
    rows = [json.loads(x) for x in (out / "images.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    settings = json.loads((out / "settings.json").read_text())
    assert settings["sampling"]["media"] == "video" and settings["sampling"]["num_frames"] == F
    for r in rows:
        assert r["num_frames"] == F
        strip = np.asarray(Image.open(out / r["image"]))
        assert strip.shape == (H, F * H, 3)
        video = generate_t2i.video_from_strip(out / r["image"], F).astype(np.float64)  # (F, H, W, 3)
        # by hand: the worst frame's mean brightness, and 1 - mean |x_f - x_{f-1}| / 255
        assert r["rewards"]["video_per_frame"] == pytest.approx(video.reshape(F, -1).mean(1).min() / 255.0, abs=1e-6)
        tc = 1 - np.abs(video[1:] - video[:-1]).reshape(F - 1, -1).mean(1).mean() / 255.0
        assert r["rewards"]["temporal_consistency"] == pytest.approx(tc, abs=1e-6)
    grid = Image.open(out / "grids" / "batch_00000.png")
    assert grid.size[0] >= F * H  # one frame strip per row


def test_video_errors(wan_dir, tmp_path, capsys):
    root, pipe = wan_dir
    base = [f"pipeline={pipe}", f"prompts={root / 'prompts.txt'}", f"out_dir={tmp_path / 'x'}"]
    assert generate_t2i.main(base + ARGS + ["num_frames=6"]) != 0
    assert "1 + 4k frames" in capsys.readouterr().err
