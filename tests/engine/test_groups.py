"""mmgrpo.engine.groups.valid_member_counts and no_reward_signal against values written out by hand."""
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


def test_no_reward_signal_is_none_with_any_nonzero_advantage_else_the_reward_statistics():
    from mmgrpo.engine.groups import no_reward_signal

    assert no_reward_signal(torch.tensor([[0.0, 0.0], [0.0, 1e-9]]), torch.tensor([1.0, 1.0])) is None
    # every advantage 0: two groups of equal rewards 1, 1 and 3, 3 -> n 4, mean 2, population std 1 (by hand)
    assert no_reward_signal(torch.zeros(4), torch.tensor([1.0, 1.0, 3.0, 3.0])) == (4, 2.0, 1.0)
    assert no_reward_signal(None, None) == (0, 0.0, 0.0)  # no rows on this process (and no other process)
