"""TR-DPO / TRL reference sync: schedule and soft update by hand."""
import pytest
import torch
from torch import nn

from mmgrpo.vlm.methods.ref_sync import mix_models_, mix_parameters_, sync_due


def test_sync_due_like_trl_global_step():
    assert [n for n in range(0, 13) if sync_due(n, 4)] == [4, 8, 12]
    with pytest.raises(ValueError):
        sync_due(1, 0)


def test_soft_and_hard_update_by_hand():
    ref, pol = torch.tensor([1.0, 2.0]), torch.tensor([3.0, -2.0])
    mix_parameters_([ref], [pol], 0.6)
    assert ref.tolist() == pytest.approx([0.6 * 3 + 0.4 * 1, 0.6 * -2 + 0.4 * 2])
    mix_parameters_([ref], [pol], 1.0)
    assert ref.tolist() == [3.0, -2.0]
    with pytest.raises(ValueError, match="alpha"):
        mix_parameters_([ref], [pol], 0.0)


def test_bf16_rounded_once():
    ref = torch.tensor([1.0, 1.0078125], dtype=torch.bfloat16)
    pol = torch.tensor([1.0078125, 1.015625], dtype=torch.bfloat16)
    want = (pol.float() * 0.6 + ref.float() * 0.4).to(torch.bfloat16)
    mix_parameters_([ref], [pol], 0.6)
    assert torch.equal(ref, want)


def test_models_by_name_and_mismatch():
    torch.manual_seed(0)
    a, b = nn.Linear(3, 2), nn.Linear(3, 2)
    wa, wb = a.weight.detach().clone(), b.weight.detach().clone()
    assert mix_models_(a, b, 0.5) == 2
    assert torch.allclose(a.weight, 0.5 * wa + 0.5 * wb)
    assert torch.equal(b.weight, wb)  # the policy is not touched
    c, d = nn.Linear(3, 2), nn.Linear(3, 2)
    bc = c.bias.detach().clone()
    assert mix_models_(c, d, 0.5, only={"weight"}) == 1 and torch.equal(c.bias, bc)
    with pytest.raises(ValueError, match="differ"):
        mix_models_(nn.Linear(3, 2), nn.Linear(3, 2, bias=False), 0.5)
