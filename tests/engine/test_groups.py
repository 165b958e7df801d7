"""mmgrpo.engine.groups.valid_member_counts against counts written out by hand."""
import pytest
import torch

from mmgrpo.engine.groups import valid_member_counts


def test_counts_per_sorted_group_and_inverse():
    g = torch.tensor([7, 3, 7, 3, 9, 7])
    v = torch.tensor([True, False, True, False, True, False])
    counts, inv = valid_member_counts(g, v)
    # groups sorted: 3 -> 0 valid, 7 -> 2 valid, 9 -> 1 valid
    assert counts.tolist() == [0, 2, 1] and counts.dtype == torch.int64
    assert inv.tolist() == [1, 0, 1, 0, 2, 1] and counts[inv].tolist() == [2, 0, 2, 0, 1, 2]


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="2 validity flags for 3 group ids"):
        valid_member_counts(torch.tensor([0, 0, 1]), torch.tensor([True, True]))
