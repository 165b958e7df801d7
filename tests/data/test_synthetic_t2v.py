"""Mini-T2V benchmark: grammar, splits, reference clips, CLI (the verifier's tests are in
tests/flow_grpo/rewards/test_rewards_motion.py)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mmgrpo.synthetic import t2v as T

ROOT = Path(__file__).resolve().parents[2]


def test_splits_are_disjoint_in_content_and_fixed():
    combos = {s: {(m["tag"], m["combo"]) for m in T.all_prompts(s)} for s in T.SPLITS}
    assert not combos["train"] & combos["heldout"] and not combos["train"] & combos["val"]
    assert not combos["val"] & combos["heldout"]
    for tag in T.TAGS:  # every tag is in every split
        assert all(any(t == tag for t, _ in combos[s]) for s in T.SPLITS)
    n = {s: len(combos[s]) for s in T.SPLITS}
    assert n == {"train": 778, "val": 113, "heldout": 225}  # 4 colours x 3 shapes x 4 directions grammar
    assert T.make_prompts(5, seed=3, split="val") == T.make_prompts(5, seed=3, split="val")
    assert T.make_prompts(5, seed=3, split="val") != T.make_prompts(5, seed=4, split="val")


def test_prompt_text_and_spec_agree():
    m = T.parse_prompt("a red circle moves from left to right")
    assert m["objects"] == [{"color": "red", "shape": "circle", "count": 1, "direction": "right", "order": 0}]
    m = T.parse_prompt("two yellow circles move up")
    assert m["objects"][0]["count"] == 2 and m["objects"][0]["direction"] == "up" and m["tag"] == "count_motion"
    m = T.parse_prompt("a blue square appears, then a green triangle")
    assert [(e["color"], e["shape"], e["order"]) for e in m["objects"]] == [("blue", "square", 0),
                                                                            ("green", "triangle", 1)]
    assert T.parse_prompt("a purple cow") is None


def test_reference_clip_layout_and_determinism():
    spec = T.parse_prompt("a blue square appears, then a green triangle")
    clip = T.render_clip(spec, seed=7)
    assert clip.dtype == np.uint8 and clip.shape == (T.DEFAULT_FRAMES, 48, 48, 3)
    np.testing.assert_array_equal(clip, T.render_clip(spec, seed=7))
    green = np.all(clip == T.COLORS["green"], axis=-1).reshape(len(clip), -1).any(axis=1)
    blue = np.all(clip == T.COLORS["blue"], axis=-1).reshape(len(clip), -1).any(axis=1)
    assert blue.all() and not green[0] and green[-1]  # blue from the start, green appears later and stays
    first = int(np.argmax(green))
    assert T.DEFAULT_FRAMES / 3 - 0.5 <= first <= T.DEFAULT_FRAMES / 2 + 0.5 and green[first:].all()


def test_bad_spec_names_the_field():
    with pytest.raises(ValueError, match=r"row 3\.objects\[1\]\.color"):
        T.validate_spec({"objects": [{"color": "red", "shape": "circle"}, {"color": "red", "shape": "square"}]},
                        where="row 3")
    with pytest.raises(ValueError, match=r"objects\[0\]\.direction"):
        T.validate_spec({"objects": [{"color": "red", "shape": "circle", "direction": "sideways"}]})


def test_cli_writes_jsonl_and_clips(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "data" / "synthetic_t2v.py"), str(tmp_path), "--n", "3",
                        "--splits", "val", "heldout", "--size", "32", "--frames", "8", "--mp4"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    for split in ("val", "heldout"):
        rows = [json.loads(x) for x in (tmp_path / f"{split}.jsonl").read_text().splitlines()]
        assert len(rows) == 3 and all(row["split"] == split for row in rows)
        clip = np.load(tmp_path / rows[0]["clip"])
        assert clip.shape == (8, 32, 32, 3) and clip.dtype == np.uint8
        np.testing.assert_array_equal(clip, T.render_clip(rows[0], 32, 8, seed=rows[0]["seed"]))
        assert (tmp_path / rows[0]["video"]).stat().st_size > 0
