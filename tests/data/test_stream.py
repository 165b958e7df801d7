"""The prompt stream (mmgrpo.vlm.data.stream)."""
import pytest

from mmgrpo.vlm.data.stream import PromptStream


def test_prompt_stream_deterministic_resumable_and_unique():
    a = PromptStream(5, seed=1)
    first = a.take(12)
    assert [p for p, _ in first] == list(range(12))
    assert sorted(i for _, i in first[:5]) == list(range(5))  # each epoch is a permutation
    b = PromptStream(5, seed=1)
    b.take(7)
    c = PromptStream(5, seed=1)
    c.load_state_dict(b.state_dict())
    assert c.take(5) == first[7:12]
    with pytest.raises(ValueError, match="samples"):
        PromptStream(4, seed=1).load_state_dict(b.state_dict())
