"""DAPO soft overlong punishment against the paper's piecewise formula evaluated by hand."""
import pytest
import torch
from hypothesis import given, strategies as st

from mmgrpo.vlm.methods.dapo_overlong import completion_lengths, overlong_penalty


def test_piecewise_by_hand():
    # L_max = 20, L_cache = 8: free up to 12, linear to -1 at 20, -1 beyond
    L = torch.tensor([0, 12, 13, 16, 20, 21, 100])
    got = overlong_penalty(L, max_len=20, cache_len=8)
    want = torch.tensor([0.0, 0.0, -1 / 8, -4 / 8, -1.0, -1.0, -1.0])
    assert torch.allclose(got, want)
    assert torch.allclose(overlong_penalty(L, 20, 8, factor=0.5), want * 0.5)
    # DAPO's recipe: 20480 / 4096
    assert overlong_penalty(torch.tensor([16384, 18432]), 20480, 4096).tolist() == [0.0, -0.5]


def test_lengths_from_mask_count_eos():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    assert completion_lengths(mask).tolist() == [3, 4, 0]


@given(st.integers(1, 200), st.integers(1, 200), st.integers(0, 400))
def test_monotone_and_bounded(max_len, cache, n):
    cache = min(cache, max_len)
    a = overlong_penalty(torch.tensor([n]), max_len, cache).item()
    b = overlong_penalty(torch.tensor([n + 1]), max_len, cache).item()
    assert -1.0 <= b <= a <= 0.0


def test_bad_args():
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(torch.tensor([1]), 10, 11)
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(torch.tensor([1]), 10, 0)
    with pytest.raises(ValueError, match="factor"):
        overlong_penalty(torch.tensor([1]), 10, 5, factor=-1)
