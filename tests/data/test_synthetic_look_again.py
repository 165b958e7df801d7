"""The look-again benchmark: the first view carries no information on the answer, a crop of the source does."""
import json

import numpy as np
import pytest

from mmgrpo.synthetic import look_again as la


def test_object_blocks_average_to_mid_grey_by_hand():
    lay = la.Layout()
    content = {"colour": "red", "cell": [0, 0], "object_box_source": [24, 32, 40, 48]}
    src = la.render_source(content, lay)
    # stripes of 2 px: red, cyan, red, ...; red = (220, 40, 40), cyan = 260 - red = (40, 220, 220)
    assert tuple(src[32, 24]) == (220, 40, 40) and tuple(src[32, 26]) == (40, 220, 220)
    # the object's cell (0, 0) is tinted 16 * (0 + 1, 0 + 1, 0); the others keep the background
    assert tuple(src[47, 37]) == (220, 40, 40) and tuple(src[0, 0]) == (56, 56, 70)
    assert tuple(src[447, 120]) == la.BACKGROUND == (40, 40, 70)
    view = la.downsample(src, 4)
    # each 4x4 object block: 8 px red + 8 px cyan -> (130, 130, 130) per channel
    assert view.shape == (112, 112, 3)
    assert (view[8:12, 6:10] == 130).all() and (view[:8, :28] == (56, 56, 70)).all()
    assert (view[8:12, 10] == (56, 56, 70)).all() and (view[:, 28:] == (40, 40, 70)).all()


def test_view_is_the_same_for_every_answer_and_the_crop_is_not():
    lay = la.Layout()
    pairs = la.make_samples(12, "val", seed=3, layout=lay)
    for content, s in pairs:
        assert la.view_is_answer_free(content, lay)
        src = la.render_source(content, lay)
        c = la.crop(src, s["meta"]["cell_box_source"], lay.view)
        assert la.crop_oracle(c) == content["colour"] == s["meta"]["colour"]
        assert s["options"][la.LETTERS.index(s["answer"])] == content["colour"]
    # a crop of another cell sees no object
    content, s = pairs[0]
    col, row = s["meta"]["cell"]
    other = lay.cell_box((col + 1) % lay.grid, row)
    assert la.crop_oracle(la.crop(la.render_source(content, lay), other, lay.view)) == ""


def test_splits_are_deterministic_balanced_and_distinct():
    a = la.make_samples(30, "train", 0)
    assert [s for _, s in a] == [s for _, s in la.make_samples(30, "train", 0)]
    assert [s["meta"]["object_box_source"] for _, s in a] != \
        [s["meta"]["object_box_source"] for _, s in la.make_samples(30, "heldout", 0)]
    counts = np.bincount([la.OPTIONS.index(c["colour"]) for c, _ in a], minlength=6)
    assert (counts == 5).all()


def test_bad_layout_and_split_are_named():
    with pytest.raises(ValueError, match="factor 6 not a multiple of 2\\*stripe"):
        la.Layout(source=336, factor=6, stripe=4, object=12)
    with pytest.raises(ValueError, match="split must be one of"):
        la.make_samples(1, "test", 0)


def test_write_split_and_small_probe(tmp_path):
    from PIL import Image

    from mmgrpo.vlm.data.schema import Sample

    info = la.generate(str(tmp_path), n_train=6, n_val=0, n_heldout=6, seed=1)
    assert info["files"] == {"train": "train.jsonl", "heldout": "heldout.jsonl"}
    rows = [json.loads(x) for x in (tmp_path / "heldout.jsonl").read_text().splitlines()]
    Sample.from_dict(rows[0]).validate()
    view = np.asarray(Image.open(tmp_path / rows[0]["image"]))
    src = np.asarray(Image.open(tmp_path / "images" / rows[0]["meta"]["source"]))
    assert view.shape == (112, 112, 3) and src.shape == (448, 448, 3)
    assert np.array_equal(view, la.downsample(src, 4))
    r = la.probe(seed=0, n_train=12, n_test=6)
    assert r["view_answer_free"] == 100.0 and r["crop_oracle_acc"] == 100.0


def test_image_marker_paints_the_whole_background_with_the_place_code_and_the_view_stays_answer_free():
    lay = la.Layout(marker="image", tint=40)
    content = {"colour": "blue", "cell": [2, 1], "object_box_source": [272, 160, 288, 176]}
    src = la.render_source(content, lay)
    # BACKGROUND + 40 * (2 + 1, 1 + 1, 0) = (160, 120, 70), everywhere but the object
    assert tuple(src[0, 0]) == tuple(src[447, 447]) == (160, 120, 70)
    assert tuple(src[160, 272]) == (40, 40, 220) and tuple(src[160, 274]) == (220, 220, 40)
    assert la.view_is_answer_free(content, lay)
    other = dict(content, cell=[0, 3], object_box_source=[48, 384, 64, 400])
    assert tuple(la.render_source(other, lay)[0, 0]) == (40 + 40, 40 + 160, 70)
    with pytest.raises(ValueError, match="marker must be 'cell' or 'image'"):
        la.Layout(marker="corner")
    with pytest.raises(ValueError, match="tint 60 x grid 4 leaves the 0..255 range"):
        la.Layout(tint=60)
