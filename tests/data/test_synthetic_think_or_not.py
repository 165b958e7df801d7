"""The think-or-not benchmark: the answer needs the table on ``partner`` and the image alone on ``direct``; splits
balanced and deterministic (the VLM side: tests/methods/test_ton.py)."""
import json

import pytest

from mmgrpo.synthetic import think_or_not as ton


def test_samples_by_hand_and_balanced():
    s = ton.make_samples(12, "train", seed=0)
    assert [x["id"] for x in s] == [f"train_{i:05d}" for i in range(12)]
    assert sum(x["meta"]["kind"] == "partner" for x in s) == 6
    assert sorted(x["meta"]["colour"] for x in s) == sorted(list(ton.OPTIONS) * 2)
    for x in s:
        table = x["meta"]["table"]
        assert sorted(table) == sorted(table.values()) == sorted(ton.OPTIONS)
        assert all(k != v for k, v in table.items())  # a derangement
        c = x["meta"]["colour"]
        want = c if x["meta"]["kind"] == "direct" else table[c]
        assert x["answer"] == "ABCDEF"[["red", "green", "blue", "yellow", "cyan", "magenta"].index(want)]
        assert x["meta"]["thought"] == (c if x["meta"]["kind"] == "direct" else f"{c}->{table[c]}")
        assert x["query"].splitlines()[1:7] == [f"{k}->{table[k]}" for k in ton.OPTIONS]
    assert s == ton.make_samples(12, "train", seed=0) != ton.make_samples(12, "val", seed=0)


def test_probe_premise():
    p = ton.probe(seed=0, n_train=600, n_test=300, test_split="val")
    assert p["image_only_direct"] == 100.0 and p["oracle"] == 100.0
    assert p["image_only_partner"] < 35.0 and p["majority"] < 25.0


def test_write_split_and_errors(tmp_path):
    path = ton.write_split(str(tmp_path), "val", 4, seed=1)
    rows = [json.loads(l) for l in open(path)]
    assert [r["image"] for r in rows] == [f"images/{r['meta']['colour']}.png" for r in rows]
    from PIL import Image
    import numpy as np

    img = np.asarray(Image.open(tmp_path / rows[0]["image"]))
    assert img.shape == (56, 56, 3) and (img == ton.COLOURS[rows[0]["meta"]["colour"]]).all()
    with pytest.raises(ValueError, match="split"):
        ton.make_samples(2, "test", 0)
    with pytest.raises(ValueError, match="kind"):
        ton.thought("other", "red", {})
