"""GDPO component selection and reward-decoupled advantages, computed by hand."""
import math

import pytest
import torch

from mmgrpo.vlm.methods.gdpo import gdpo_advantages, gdpo_components


def test_decoupled_differs_from_summed_by_hand():
    # group 0: (iou, format) = (1, 0), (0, 1) -> sum constant (GRPO: no signal) but GDPO: the components cancel too
    # group 1: (1, 1), (0, 1) -> format constant, iou +-1/sqrt(2)
    rewards = {"iou": torch.tensor([1.0, 0.0, 1.0, 0.0]), "format": torch.tensor([0.0, 1.0, 1.0, 1.0])}
    gid = torch.tensor([0, 0, 1, 1])
    out = gdpo_advantages(rewards, {"iou": 1.0, "format": 1.0}, gid, eps=0.0)
    s = 1 / math.sqrt(2)
    summed = torch.tensor([0.0, 0.0, s, -s], dtype=torch.float64)
    sd = summed.std()  # unbiased over the batch = sqrt(1/3)
    assert sd.item() == pytest.approx(math.sqrt(1 / 3))
    assert torch.allclose(out.advantages.double(), (summed / sd), atol=1e-6)
    assert out.zero_std_mask.tolist() == [False] * 4
    raw = gdpo_advantages(rewards, {"iou": 1.0, "format": 1.0}, gid, eps=0.0, renormalize=False)
    assert torch.allclose(raw.advantages.double(), summed, atol=1e-6)
    # weights scale the component before the sum: format weight 3 in group 0 -> 3*(+-s) - (+-s)
    w = gdpo_advantages(rewards, {"iou": 1.0, "format": 3.0}, gid, eps=0.0, renormalize=False)
    assert torch.allclose(w.advantages.double(), torch.tensor([-2 * s, 2 * s, s, -s], dtype=torch.float64), atol=1e-6)


def test_extra_terms_and_missing_reward():
    rewards = {"iou": torch.tensor([1.0, 0.0]), "temporal": torch.tensor([0.3, 0.0]), "total": torch.tensor([1.3, 0.0])}
    comps, w = gdpo_components(rewards, {"iou": 1.0}, extra={"temporal": 1.0, "overlong": 1.0})
    assert sorted(comps) == ["iou", "temporal"] and w == {"iou": 1.0, "temporal": 1.0}
    with pytest.raises(KeyError, match="format"):
        gdpo_components(rewards, {"iou": 1.0, "format": 0.5})


def test_invalid_rows_leave_the_statistics():
    rewards = {"iou": torch.tensor([1.0, 0.0, float("nan")]), "format": torch.tensor([1.0, 1.0, float("nan")])}
    gid = torch.tensor([0, 0, 0])
    valid = torch.tensor([True, True, False])
    out = gdpo_advantages(rewards, {"iou": 1.0, "format": 1.0}, gid, valid=valid, eps=0.0, renormalize=False)
    s = 1 / math.sqrt(2)
    assert torch.allclose(out.advantages.double(), torch.tensor([s, -s, 0.0], dtype=torch.float64), atol=1e-6)
