"""mmgrpo.vlm.vision_pretrain: the merged-token index of image regions (by hand) and the count pre-training of a
tiny Qwen2.5-VL's vision tower (it learns a colour count that only one region shows, and touches only the tower)."""
import copy

import numpy as np
import pytest
import torch

from mmgrpo.vlm.vision_pretrain import grid_columns, pretrain_region_counts


def test_grid_columns_by_hand():
    # 8 x 18 patches, merge 2 -> 4 rows x 9 columns of merged tokens, row-major
    assert grid_columns([1, 8, 18], 2, [0, 1]) == [0, 1, 9, 10, 18, 19, 27, 28]
    assert grid_columns([1, 4, 4], 2, [1]) == [1, 3]
    with pytest.raises(ValueError, match="outside"):
        grid_columns([1, 4, 4], 2, [2])
    with pytest.raises(ValueError, match="one image"):
        grid_columns([2, 4, 4], 2, [0])


def test_merged_tokens_are_row_major_over_the_merged_grid():
    """A tower whose blocks add nothing (zeroed) maps each 2 x 2 patch window to one token independently: the
    token at row r, column c of the merged grid must then change only when the pixels of that window change."""
    from PIL import Image

    from mmgrpo.vlm.models.tiny import build_tiny_model

    model, proc = build_tiny_model("qwen2_5_vl", seed=0)
    inner = model.model
    with torch.no_grad():
        for blk in inner.visual.blocks:
            for p in blk.parameters():
                p.zero_()
    img = np.full((56, 84, 3), 255, dtype=np.uint8)  # 4 x 6 patches -> 2 x 3 merged tokens
    size = {"shortest_edge": 56 * 84, "longest_edge": 56 * 84}
    x0 = proc.image_processor(images=[Image.fromarray(img)], return_tensors="pt", size=size)
    img[28:, 56:] = 0  # the window at merged row 1, column 2
    x1 = proc.image_processor(images=[Image.fromarray(img)], return_tensors="pt", size=size)
    assert x0["image_grid_thw"].tolist() == [[1, 4, 6]]
    with torch.no_grad():
        f0 = inner.get_image_features(x0["pixel_values"], x0["image_grid_thw"]).pooler_output[0]
        f1 = inner.get_image_features(x1["pixel_values"], x1["image_grid_thw"]).pooler_output[0]
    changed = [i for i in range(6) if not torch.allclose(f0[i], f1[i])]
    assert changed == grid_columns([1, 4, 6], 2, [2])[1:]  # row 1, column 2 -> index 5


def test_pretrain_region_counts_learns_and_touches_only_the_vision_tower():
    from PIL import Image

    from mmgrpo.vlm.models.tiny import build_tiny_model

    model, proc = build_tiny_model("qwen2_5_vl", seed=0)
    model = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    size = {"shortest_edge": 56 * 112, "longest_edge": 56 * 112}
    rng = np.random.default_rng(0)
    items = []
    for k in range(8):  # left half: k % 3 red squares (count head 0); right half: always empty (head 0 = 0)
        img = np.full((56, 112, 3), 255, dtype=np.uint8)
        for j in range(k % 3):
            img[4 + 24 * j: 16 + 24 * j, 8 + int(rng.integers(0, 30)):][:, :12] = (220, 40, 40)
        x = proc.image_processor(images=[Image.fromarray(img)], return_tensors="pt", size=size)
        items.append((dict(x), np.array([[k % 3], [0]])))
    grid = items[0][0]["image_grid_thw"][0].tolist()
    regions = [grid_columns(grid, 2, [0, 1]), grid_columns(grid, 2, [2, 3])]
    res = pretrain_region_counts(model, items, regions, 1, 3, steps=40, batch_size=4, lr=1e-2, seed=0)
    losses = [h["loss"] for h in res["history"]]
    assert res["steps_done"] == 40 and np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    assert res["predict"](items[2][0]).tolist() == [[2], [0]]
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".visual." in f".{n}." for n in changed)
    with pytest.raises(ValueError, match="counts must lie"):
        pretrain_region_counts(model, [(items[0][0], np.array([[3], [0]]))], regions, 1, 3, steps=1, batch_size=1)
