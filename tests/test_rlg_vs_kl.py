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
    assert q["per_image_drift"] == pytest.approx([10.0, 20.0])


def _pt(rewards, drifts):
    return {"per_image": list(rewards), "per_image_drift": list(drifts)}


def test_matched_w_interpolates_the_per_image_means_by_hand():
    import rlg_vs_kl as r

    ws = [0.0, 1.0, 2.0]
    curve = [_pt([0.4, 0.6], [0.0, 0.0]), _pt([0.6, 0.8], [2.0, 4.0]), _pt([0.8, 0.8], [4.0, 8.0])]
    # curve means: reward 0.5, 0.7, 0.8; drift 0, 3, 6. Model: reward 0.6 -> w 0.5; drift 4.5 -> w 1.5, where the
    # curve's reward is 0.75: the model has 0.15 less reward than RLG at its drift
    got = r.matched_w(curve, ws, _pt([0.5, 0.7], [3.0, 6.0]))
    assert (got["w_reward"], got["w_drift"], got["reward_gap"]) == pytest.approx((0.5, 1.5, -0.15))
    # only image 1: curve reward 0.6, 0.8, 0.8 and drift 0, 4, 8; the model's 0.7 -> 0.5, its 6 -> 1.5 (reward 0.8)
    got = r.matched_w(curve, ws, _pt([0.5, 0.7], [3.0, 6.0]), idx=[1, 1])
    assert (got["w_reward"], got["w_drift"], got["reward_gap"]) == pytest.approx((0.5, 1.5, -0.1))
    got = r.matched_w(curve, ws, _pt([0.9, 0.9], [1.0, 1.0]))  # above the curve: no w by reward
    assert got["w_reward"] is None and got["reward_gap"] == pytest.approx(0.9 - (0.5 + 0.2 / 3))
    assert r.matched_w(curve, ws, _pt([0.5, 0.5], [9.0, 9.0]))["reward_gap"] is None  # beyond the curve's drift


def test_bootstrap_resamples_curve_and_model_together():
    """Curve w=0: a_i, w=1: a_i + 1; model a_i + 0.5 + e_i -> w = 0.5 + mean(e) exactly, so the bootstrap s.e. of
    w is that of a mean, std(e) / sqrt(n). The a_i vary 10x more than e: resampling the curve's images apart from
    the model's would give a far larger s.e."""
    import rlg_vs_kl as r

    rng = np.random.default_rng(1)
    n = 400
    a, e = rng.normal(0, 1.0, n), rng.normal(0, 0.1, n)
    curve = [_pt(a, np.zeros(n)), _pt(a + 1, np.full(n, 2.0))]
    q = _pt(a + 0.5 + e, np.full(n, 1.0))
    got = r.matched_w(curve, [0.0, 1.0], q)
    assert got["w_reward"] == pytest.approx(0.5 + e.mean()) and got["w_drift"] == pytest.approx(0.5)
    assert got["reward_gap"] == pytest.approx(e.mean())  # reward a + 0.5 + e against the curve's a + 0.5 at w 0.5
    b = r.bootstrap_w(curve, [0.0, 1.0], q, n_boot=2000, seed=0)
    assert b["w_reward_boot_se"] == pytest.approx(e.std() / np.sqrt(n), rel=0.1)
    assert b["reward_gap_boot_se"] == pytest.approx(e.std() / np.sqrt(n), rel=0.1)
    assert b["w_drift_boot_se"] == pytest.approx(0.0, abs=1e-12) and b["w_reward_missing"] == 0.0


def test_mean_se_and_the_summary_over_seeds_by_hand():
    import rlg_vs_kl as r

    assert r.mean_se([0.3, None, 0.5]) == pytest.approx((0.4, 0.1, 2))  # stdev 0.1414 / sqrt 2
    assert r.mean_se([None]) == (None, None, 0)
    m = lambda wr, wd, d: {"w_reward": wr, "w_drift": wd, "reward_gap": d, "partial_minus_w1": d}  # noqa: E731
    res = {"seeds": {
        "0": {"match": {"0": {"0.4": m(0.3, 0.4, -0.05)}, "0.1": {"0.4": {**m(0.2, 0.3, 0), "w_predicted": 0.25}}}},
        "1": {"match": {"0": {"0.4": m(0.5, 0.6, -0.03)}, "0.1": {"0.4": {**m(0.4, None, 0), "w_predicted": 0.25}}}}}}
    s = r.summary(res, ["0", "0.4"])
    assert s["0"]["0.4"]["w_reward"]["per_seed"] == [0.3, 0.5]
    assert (s["0"]["0.4"]["w_reward"]["mean"], s["0"]["0.4"]["w_reward"]["se"]) == pytest.approx((0.4, 0.1))
    assert (s["0"]["0.4"]["w_reward_times_beta"]["mean"], s["0"]["0.4"]["w_reward_times_beta"]["se"]) == \
        pytest.approx((0.16, 0.04))
    assert s["0"]["0.4"]["partial_minus_w1"]["mean"] == pytest.approx(-0.04)
    assert (s["0"]["0.4"]["reward_gap"]["mean"], s["0"]["0.4"]["reward_gap"]["se"]) == pytest.approx((-0.04, 0.01))
    assert s["0.1"]["0.4"]["w_drift"] == {"per_seed": [0.3, None], "mean": 0.3, "se": None, "n": 1}
    assert s["0.1"]["0.4"]["w_predicted"] == 0.25 and "w_reward_times_beta" not in s["0.1"]["0.4"]


def _fake_eval(d, level: float, reward: float, n: int = 6):
    """An evaluation folder: n 4x4 images of one grey level, every image's partial reward = ``reward``."""
    from PIL import Image

    (d / "images").mkdir(parents=True)
    rows = []
    for i in range(n):
        Image.fromarray(np.full((4, 4, 3), level, np.uint8)).save(d / "images" / f"{i}.png")
        rows.append({"index": i, "image": f"images/{i}.png", "rewards": {"mini_geneval/partial": reward + 0.01 * i}})
    (d / "images.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    (d / "metrics.json").write_text(json.dumps({"rewards": {"mini_geneval/partial": {"mean": reward + 0.025}},
                                                "mini_geneval": {"accuracy": reward, "overall": reward}}))


def test_main_on_finished_runs_matches_every_kl_model_and_writes_the_report(tmp_path):
    """Every LoRA and evaluation already exists (nothing is run): the analysis, table and figure. The RLG curve of
    the kl 0 LoRA is linear in w (reward 0.5 + 0.2 w, drift 10 w); the beta LoRAs sit on it at w = 0.2 / beta."""
    import rlg_vs_kl as r

    (tmp_path / "prompts").mkdir()
    for split in ("train", "heldout"):
        (tmp_path / "prompts" / f"{split}.jsonl").write_text("{}\n")
    for s in (0, 1):
        for kl in ("0", "0.4", "1"):
            (tmp_path / f"train_kl{kl}_s{s}" / "lora_final").mkdir(parents=True)
            (tmp_path / f"train_kl{kl}_s{s}" / "lora_final" / "pytorch_lora_weights.safetensors").write_text("")
        for w in (0.0, 0.5, 1.0):
            _fake_eval(tmp_path / "eval" / f"s{s}_kl0_w{w:g}", 100 + 10 * w, 0.5 + 0.2 * w)
        for kl, w in (("0.4", 0.5), ("1", 0.2)):
            _fake_eval(tmp_path / "eval" / f"s{s}_kl{kl}", 100 + 10 * w, 0.5 + 0.2 * w)
        # the RLG curve of the beta = 0.4 LoRA, at w = 0.25: the beta = 1 LoRA's images (predicted w = 0.4)
        _fake_eval(tmp_path / "eval" / f"s{s}_kl0.4_w0.25", 100 + 10 * 0.2, 0.5 + 0.2 * 0.2)
    assert r.main(["--out", str(tmp_path), "--kl", "0,0.4,1", "--seeds", "0,1", "--weights", "0,0.5,1",
                   "--sweep-kl", "0.4", "--sweep-weights", "0.25", "--bootstrap", "50"]) == 0
    res = json.loads((tmp_path / "rlg_vs_kl.json").read_text())
    summ = res["summary"]
    assert summ["0"]["0.4"]["w_reward"]["mean"] == pytest.approx(0.5)
    assert summ["0"]["1"]["w_drift"]["mean"] == pytest.approx(0.2) and summ["0"]["1"]["w_drift"]["se"] == 0.0
    assert summ["0"]["1"]["w_reward_times_beta"]["mean"] == pytest.approx(0.2)
    assert summ["0.4"]["1"]["w_predicted"] == pytest.approx(0.4) and summ["0.4"]["1"]["w_reward"]["mean"] == \
        pytest.approx(0.25)
    assert "0.4" not in summ["0.4"]  # a LoRA is not matched on its own curve
    assert summ["0"]["0.4"]["reward_gap"]["mean"] == pytest.approx(0.0, abs=1e-9)  # on the curve
    m = res["seeds"]["0"]["match"]["0"]["0.4"]
    assert m["w_reward_boot_se"] == pytest.approx(0.0, abs=1e-9)  # each image's offset is the same on all models
    md = (tmp_path / "rlg_vs_kl.md").read_text()
    assert "Across training seeds (0, 1)" in md and "| kl 0 LoRA | beta = 1 | 0.20 / 0.20 |" in md
    assert (tmp_path / "rlg_vs_kl.png").stat().st_size > 0
