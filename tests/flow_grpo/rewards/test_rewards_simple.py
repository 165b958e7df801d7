"""JPEG (in)compressibility and toy rewards against independently computed values."""
import io
import math

import numpy as np
import pytest
import torch
from PIL import Image

from flow_grpo.rewards import build_reward


def _jpeg_kb(a, q):
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "JPEG", quality=q)
    return len(buf.getvalue()) / 1000.0


def test_jpeg_compressibility_matches_file_size_and_orders_flat_vs_noise():
    rng = np.random.default_rng(0)
    flat = np.full((48, 48, 3), 120, np.uint8)
    noise = rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)
    imgs = np.stack([flat, noise])
    comp = build_reward("jpeg_compressibility")(imgs, ["", ""])["jpeg_compressibility"]
    inc = build_reward("jpeg_incompressibility", scale=2.0)(imgs, ["", ""])["jpeg_incompressibility"]
    exp = np.array([_jpeg_kb(flat, 95), _jpeg_kb(noise, 95)])
    np.testing.assert_allclose(comp.numpy(), -exp, rtol=1e-6)
    np.testing.assert_allclose(inc.numpy(), exp / 2.0, rtol=1e-6)
    assert comp[0] > comp[1]  # a flat image compresses better than noise
    assert exp[1] > 3 * exp[0]  # JPEG headers alone are ~0.6 kB
    q50 = build_reward("jpeg_compressibility", quality=50)(imgs, ["", ""])["jpeg_compressibility"]
    assert float(q50[1]) == pytest.approx(-_jpeg_kb(noise, 50), rel=1e-6)
    with pytest.raises(ValueError, match="quality"):
        build_reward("jpeg_compressibility", quality=0)


def test_float_input_gives_same_score_as_uint8():
    a = np.random.default_rng(1).integers(0, 256, (2, 16, 16, 3), dtype=np.uint8)
    f = torch.from_numpy(a).permute(0, 3, 1, 2).double() / 255
    r = build_reward("jpeg_compressibility")
    assert torch.equal(r(a, ["", ""])["jpeg_compressibility"], r(f, ["", ""])["jpeg_compressibility"])


def test_brightness_and_color_target_by_hand():
    imgs = np.zeros((2, 2, 2, 3), np.uint8)
    imgs[1] = 255
    imgs[0, 0, 0] = (255, 0, 0)  # one red pixel out of four
    b = build_reward("brightness")(imgs, ["", ""])["brightness"]
    assert b.tolist() == pytest.approx([255 / 12 / 255, 1.0])
    c = build_reward("color_target", color=(255, 0, 0))(imgs, ["", ""])["color_target"]
    # sample 0: distances 0, 255, 255, 255 -> mean 191.25; sample 1: each pixel is sqrt(2)*255 away
    norm = 255 * math.sqrt(3)
    assert c.tolist() == pytest.approx([1 - 191.25 / norm, 1 - math.sqrt(2) * 255 / norm], rel=1e-6)
