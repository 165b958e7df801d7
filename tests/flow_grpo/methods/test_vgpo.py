"""VGPO temporal credit and dual advantages, checked by hand."""
import math

import pytest
import torch

from flow_grpo.methods import vgpo


def test_temporal_credit_by_hand():
    V = torch.tensor([[0.0, 0.5, 0.4, 1.0]])
    assert vgpo.instant_rewards(V).tolist()[0] == pytest.approx([0.5, -0.1, 0.6])
    # gamma = 1 telescopes to R - V_{k-1}
    assert vgpo.temporal_credit(V, 1.0).tolist()[0] == pytest.approx([1.0, 0.5, 0.6])
    # gamma = 0.5: G3 = 0.6, G2 = -0.1 + 0.3 = 0.2, G1 = 0.5 + 0.1 = 0.6
    assert vgpo.temporal_credit(V, 0.5).tolist()[0] == pytest.approx([0.6, 0.2, 0.6])
    assert vgpo.temporal_credit(V, 0.0).tolist()[0] == pytest.approx([0.5, -0.1, 0.6])
    with pytest.raises(ValueError):
        vgpo.temporal_credit(torch.tensor([[1.0]]))
    with pytest.raises(ValueError):
        vgpo.temporal_credit(V, 1.5)


def test_dual_advantage_mix_by_hand():
    G = torch.tensor([[0.3], [0.1]])
    out = vgpo.dual_advantages(G, torch.tensor([0, 0]), tau=0.1)
    rel = 0.1 / (0.1 + 1e-4)  # population std 0.1
    w = math.exp(-1.0)
    assert out.weight.flatten().tolist() == pytest.approx([w, w])
    assert out.advantages.flatten().tolist() == pytest.approx([(1 - w) * rel + w * 3.0, -(1 - w) * rel + w * 1.0])


def test_identical_group_keeps_a_signal_grpo_does_not():
    G = torch.tensor([[0.2], [0.2], [-0.1], [-0.1]])
    out = vgpo.dual_advantages(G, torch.tensor([0, 0, 1, 1]), tau=0.1)
    assert out.weight.flatten().tolist() == [1.0] * 4
    assert out.advantages.flatten().tolist() == pytest.approx([2.0, 2.0, -1.0, -1.0])
    assert out.relative.abs().max() == 0  # what plain group normalisation would give


def test_anchor_batch_fixed_and_clamp():
    G = torch.tensor([[0.2], [0.2], [0.6], [0.6]])
    out = vgpo.dual_advantages(G, torch.tensor([0, 0, 1, 1]), tau=0.1, anchor="batch")
    assert out.advantages.flatten().tolist() == pytest.approx([-2.0, -2.0, 2.0, 2.0])  # batch mean 0.4
    out = vgpo.dual_advantages(G, torch.tensor([0, 0, 1, 1]), tau=0.1, anchor=0.5)
    assert out.advantages.flatten().tolist() == pytest.approx([-3.0, -3.0, 1.0, 1.0])
    out = vgpo.dual_advantages(G, torch.tensor([0, 0, 1, 1]), tau=0.01)
    assert out.advantages.flatten().tolist() == pytest.approx([5.0] * 4)  # 20 and 60, clamped
    with pytest.raises(ValueError, match="anchor"):
        vgpo.dual_advantages(G, torch.tensor([0, 0, 1, 1]), anchor="group")


def test_vgpo_steps_are_independent_columns_and_invalid_rows_get_zero():
    V = torch.tensor([[0.0, 0.5, 1.0], [0.0, 0.1, 0.0], [0.2, 0.2, 0.2]])
    out = vgpo.vgpo_advantages(V, torch.tensor([0, 0, 0]), tau=1e-3, valid=torch.tensor([True, True, False]))
    # G = [[1.0, 0.5], [0.0, -0.1]] for the valid pair; tau -> 0: the group z-score per column (+-1 up to eps)
    assert out.advantages[0].tolist() == pytest.approx([1.0, 1.0], rel=1e-3)
    assert out.advantages[1].tolist() == pytest.approx([-1.0, -1.0], rel=1e-3)
    assert out.advantages[2].tolist() == [0.0, 0.0]
