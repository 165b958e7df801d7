"""MetricLogger (JSONL/tensorboard), image grids, curve plots."""
from __future__ import annotations

import builtins
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import mmgrpo.utils.logging as mlog
from mmgrpo.utils.logging import MetricLogger, get_logger, plot_curves, read_jsonl, save_image_grid


def test_metric_logger_jsonl_and_nan(tmp_path: Path):
    with MetricLogger(tmp_path, use_tensorboard=False) as log:
        log.log({"reward/mean": 0.25, "loss": torch.tensor(1.5), "kl": np.float32(0.5), "bad": float("nan"),
                 "inf": float("inf"), "n": 3, "tag": "x"}, step=1)
        log.log({"reward/mean": 0.5}, step=2)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    r0 = json.loads(lines[0])  # strict JSON parse: NaN/inf would not be valid JSON
    assert r0["step"] == 1 and r0["reward/mean"] == 0.25 and r0["loss"] == 1.5 and r0["kl"] == 0.5
    assert r0["bad"] is None and r0["inf"] is None and r0["n"] == 3 and r0["tag"] == "x"
    assert "NaN" not in lines[0]
    assert json.loads(lines[1])["step"] == 2


def test_metric_logger_tensorboard_scalars(tmp_path: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricLogger(tmp_path, use_tensorboard=True)
    for step in range(3):
        log.log({"reward/mean": step * 0.5, "note": "text is jsonl-only"}, step)
    log.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert acc.Tags()["scalars"] == ["reward/mean"]
    assert [(e.step, e.value) for e in acc.Scalars("reward/mean")] == [(0, 0.0), (1, 0.5), (2, 1.0)]


def test_tensorboard_missing_warns_once_and_continues(tmp_path: Path, monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *a, **k):
        if name.startswith("torch.utils.tensorboard"):
            raise ImportError("no tensorboard here")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    monkeypatch.setattr(mlog, "_WARNED", set())
    with pytest.warns(RuntimeWarning, match="tensorboard unavailable"):
        log = MetricLogger(tmp_path / "a", use_tensorboard=True)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second logger must not warn again
        log2 = MetricLogger(tmp_path / "b", use_tensorboard=True)
    log.log({"x": 1.0}, 0)
    log2.log({"x": 2.0}, 0)
    log.close(), log2.close()
    assert read_jsonl(tmp_path / "a" / "metrics.jsonl")[0]["x"] == 1.0


def test_non_main_process_writes_nothing(tmp_path: Path):
    log = MetricLogger(tmp_path / "run", is_main_process=False)
    log.log({"x": 1.0}, 0)
    assert log.log_jsonl("c.jsonl", [{"a": 1}]) is None
    log.close()
    assert not (tmp_path / "run").exists()


def test_log_jsonl_rows(tmp_path: Path):
    log = MetricLogger(tmp_path, use_tensorboard=False)
    p = log.log_jsonl("samples/completions.jsonl", [{"prompt": "p", "reward": float("nan"), "ids": torch.tensor([1, 2])},
                                                    {"prompt": "日本", "reward": 1}])
    log.log_jsonl("samples/completions.jsonl", [{"prompt": "q"}])
    rows = [json.loads(x) for x in p.read_text(encoding="utf-8").splitlines()]
    assert rows == [{"prompt": "p", "reward": None, "ids": [1, 2]}, {"prompt": "日本", "reward": 1}, {"prompt": "q"}]
    with pytest.raises(ValueError):
        log.log_jsonl("../escape.jsonl", [])
    log.close()


def test_save_image_grid_layout_and_pixels(tmp_path: Path):
    n, h, w = 5, 8, 6
    imgs = np.zeros((n, h, w, 3), np.uint8)
    for i in range(n):
        imgs[i] = (i * 40, 255 - i * 40, 7)
    p = save_image_grid(imgs, tmp_path / "g.png", nrow=3, padding=2)
    g = np.asarray(Image.open(p))
    assert g.shape == (2 * h + 3 * 2, 3 * w + 4 * 2, 3)  # 2 rows x 3 columns plus padding
    for i in range(n):
        r, c = divmod(i, 3)
        y, x = 2 + r * (h + 2), 2 + c * (w + 2)
        assert (g[y : y + h, x : x + w] == imgs[i]).all()
    assert (g[0, :] == 255).all()  # padding is white
    # torch NHWC input and a list of PIL images give the same grid
    p2 = save_image_grid(torch.from_numpy(imgs), tmp_path / "g2.png", nrow=3)
    p3 = save_image_grid([Image.fromarray(x) for x in imgs], tmp_path / "g3.png", nrow=3)
    assert (np.asarray(Image.open(p2)) == g).all() and (np.asarray(Image.open(p3)) == g).all()


def test_save_image_grid_captions_and_errors(tmp_path: Path):
    imgs = np.full((2, 32, 48, 3), 128, np.uint8)
    plain = np.asarray(Image.open(save_image_grid(imgs, tmp_path / "a.png", nrow=2)))
    cap = np.asarray(Image.open(save_image_grid(imgs, tmp_path / "b.png", nrow=2,
                                                captions=["r=0.91 a long caption that wraps", "r=0.10"])))
    assert cap.shape[0] > plain.shape[0] and cap.shape[1] == plain.shape[1]
    below = cap[2 + 32 :, :, :]  # caption band under the tiles has dark text pixels
    assert (below.min(axis=2) < 100).any()
    with pytest.raises(ValueError, match="captions"):
        save_image_grid(imgs, tmp_path / "c.png", captions=["one"])
    with pytest.raises(ValueError, match="dtype"):
        save_image_grid(imgs.astype(np.int32), tmp_path / "d.png")
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        save_image_grid(imgs.astype(np.float32), tmp_path / "e.png")
    f = save_image_grid(np.full((1, 4, 4, 3), 0.5, np.float32), tmp_path / "f.png")
    assert (np.asarray(Image.open(f))[2:6, 2:6] == 128).all()


def _drawn_lines(monkeypatch) -> list[str]:
    """Record every text line save_image_grid draws (the captions as rendered, line by line)."""
    from PIL import ImageDraw

    drawn: list[str] = []
    orig = ImageDraw.ImageDraw.text

    def spy(self, xy, text, *a, **k):
        drawn.append(text)
        return orig(self, xy, text, *a, **k)

    monkeypatch.setattr(ImageDraw.ImageDraw, "text", spy)
    return drawn


def test_save_image_grid_captions_wrap_on_word_boundaries(tmp_path: Path, monkeypatch):
    # 32 px tiles used to hard-wrap "square" into "squar" + "e" (issue #16)
    drawn = _drawn_lines(monkeypatch)
    caps = ["a photo of a square | 0.500", "a photo of three blue triangles | 1.000",
            "supercalifragilisticexpialidocious word", "one two three four five six seven eight nine ten eleven "
            "twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty"]
    imgs = np.full((4, 32, 32, 3), 200, np.uint8)
    for min_tile in (0, 128):
        drawn.clear()
        save_image_grid(imgs, tmp_path / f"w{min_tile}.png", nrow=4, captions=caps, max_caption_lines=3,
                        min_tile=min_tile)
        words = {w for c in caps for w in c.split()}
        assert drawn
        for line in drawn:  # every drawn token is a whole word of a caption (or the truncation mark)
            assert all(tok in words or tok == "..." for tok in line.split()), line
        assert "square" in " ".join(drawn).split() and "supercalifragilisticexpialidocious" in drawn
        assert sum(line.endswith("...") for line in drawn) == 1  # only the long caption was cut, at a word
    # the cell is widened to hold the widest word rather than breaking it
    g = np.asarray(Image.open(tmp_path / "w0.png"))
    assert g.shape[1] > 4 * 32 + 5 * 2


def test_save_image_grid_nearest_upscale(tmp_path: Path):
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, size=(3, 32, 24, 3), dtype=np.uint8)
    g = np.asarray(Image.open(save_image_grid(imgs, tmp_path / "u.png", nrow=3, min_tile=128, padding=2)))
    k = 4  # smallest integer factor with 32 * k >= 128
    assert g.shape == (32 * k + 2 * 2, 3 * 24 * k + 4 * 2, 3)
    rows, cols = np.arange(32 * k), np.arange(24 * k)
    for i in range(3):
        x = 2 + i * (24 * k + 2)
        tile = g[2 : 2 + 32 * k, x : x + 24 * k]
        # pixel (r, c) of the upscaled tile is source pixel (r // k, c // k): exact k x k blocks, no new colours
        assert (tile == imgs[i][np.ix_(rows // k, cols // k)]).all()
    # a factor that is not a divisor rounds up (40 px -> x4 = 160 >= 128); min_tile below the size keeps it
    g2 = np.asarray(Image.open(save_image_grid(np.zeros((1, 40, 40, 3), np.uint8), tmp_path / "v.png",
                                               min_tile=128, padding=0)))
    assert g2.shape[:2] == (160, 160)
    g3 = np.asarray(Image.open(save_image_grid(imgs, tmp_path / "x.png", nrow=3, min_tile=16, padding=0)))
    assert g3.shape[:2] == (32, 72)
    with pytest.raises(ValueError, match="min_tile"):
        save_image_grid(imgs, tmp_path / "y.png", min_tile=-1)


def test_plot_curves(tmp_path: Path):
    jl = tmp_path / "metrics.jsonl"
    with MetricLogger(tmp_path, use_tensorboard=False) as log:
        for s in range(20):
            log.log({"reward/mean": math.sin(s / 3), "loss": float("nan") if s == 5 else 1 / (s + 1)}, s)
    with open(jl, "a") as fh:
        fh.write('{"step": 20, "reward/me')  # a torn last line (crash) is skipped
    out = plot_curves(jl, ["reward/mean", "loss", "missing"], tmp_path / "c.png", smooth=0.6)
    im = Image.open(out)
    assert im.format == "PNG" and im.size[1] > im.size[0]  # three stacked subplots
    assert len(read_jsonl(jl)) == 20
    with pytest.raises(ValueError):
        plot_curves(jl, ["loss"], tmp_path / "x.png", smooth=1.0)


def test_ema_matches_hand_computation():
    # debiased EMA with weight 0.5: s1 = x1, s2 = (0.25*x1 + 0.5*x2) / 0.75
    out = mlog._ema([1.0, 4.0], 0.5)
    assert out[0] == pytest.approx(1.0) and out[1] == pytest.approx((0.25 * 1 + 0.5 * 4) / 0.75)


def test_get_logger_configures_once():
    code = ("from mmgrpo.utils.logging import get_logger\n"
            "get_logger('mmgrpo.a'); log = get_logger('mmgrpo.trainer')\n"
            "log.info('hello %d', 3); log.debug('hidden')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr  # one handler, no duplicate lines, DEBUG filtered at INFO
    assert re.fullmatch(r"\d\d:\d\d:\d\d I mmgrpo\.trainer: hello 3", lines[0]), lines


def test_wandb_missing_warns_and_continues(tmp_path: Path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` raise ImportError
    monkeypatch.setattr(mlog, "_WARNED", set())
    with pytest.warns(RuntimeWarning, match="wandb unavailable"):
        log = MetricLogger(tmp_path, use_tensorboard=False, use_wandb=True, project="p", config={"a": 1})
    log.log({"x": 1.0}, 3)
    log.close()
    assert read_jsonl(tmp_path / "metrics.jsonl")[0] == {"step": 3, "time": pytest.approx(time.time(), abs=600),
                                                          "x": 1.0}
