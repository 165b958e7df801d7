"""scripts/rlg_vs_kl.py: the curve matching (by hand) and the reward / drift of an evaluation folder."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))


def test_interp_finds_the_first_crossing_and_none_outside():
    import rlg_vs_kl as r

    ws, ys = [0.0, 1.0, 2.0, 3.0], [0.50, 0.60, 0.70, 0.65]
    assert r.interp(ws, ys, 0.55) == pytest.approx(0.5)
    assert r.interp(ws, ys, 0.68) == pytest.approx(1.8)  # first crossing (1.8), not the one on the way down (2.4)
    assert r.interp(ws, ys, 0.80) is None
    assert r.interp_y([0.0, 1.0, 2.0], [0.0, 3.0, 9.0], 1.5) == pytest.approx(6.0)


def test_point_reads_reward_accuracy_and_pixel_drift(tmp_path):
    import rlg_vs_kl as r
    from PIL import Image

    (tmp_path / "images").mkdir()
    rows = []
    for i, (v, partial) in enumerate([(10, 1.0), (40, 0.5)]):
        Image.fromarray(np.full((4, 4, 3), v, np.uint8)).save(tmp_path / "images" / f"{i}.png")
        rows.append({"index": i, "image": f"images/{i}.png", "rewards": {"mini_geneval/partial": partial}})
    (tmp_path / "images.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    (tmp_path / "metrics.json").write_text(json.dumps({"rewards": {"mini_geneval/partial": {"mean": 0.75}},
                                                       "mini_geneval": {"accuracy": 0.5, "overall": 0.25}}))
    base = np.stack([np.full((4, 4, 3), 20.0), np.full((4, 4, 3), 20.0)])
    q = r.point(tmp_path, base)
    assert q["drift"] == pytest.approx((10 + 20) / 2)  # |10-20| and |40-20|, averaged over all pixels
    assert (q["partial"], q["acc"], q["overall"], q["n_images"]) == (0.75, 50.0, 25.0, 2)
    assert q["partial_se"] == pytest.approx(np.std([1.0, 0.5], ddof=1) / np.sqrt(2))
    assert q["per_image"] == [1.0, 0.5]
    assert r.paired_se([1.0, 0.5, 0.0], [0.5, 0.5, 0.5]) == pytest.approx(np.std([0.5, 0.0, -0.5], ddof=1) / np.sqrt(3))
