"""MCQ, numeric, format and length rewards (hand values)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmgrpo.vlm.rewards.choice import mcq_exact, mcq_soft
from mmgrpo.vlm.rewards.format import format_reward
from mmgrpo.vlm.rewards.length import length_bonus
from mmgrpo.vlm.rewards.numeric import mean_relative_accuracy, numeric_reward, relative_error


def test_mcq_exact_and_soft():
    assert mcq_exact(("C",), ("C",)) == 1.0
    assert mcq_exact(("C", "A"), ("A", "C")) == 1.0
    assert mcq_exact(("A",), ("A", "C")) == 0.0
    assert mcq_exact(None, ("A",)) == 0.0
    # TW-GRPO: |P|/|G| if P ⊆ G else 0
    assert mcq_soft(("A",), ("A", "C")) == 0.5
    assert mcq_soft(("A", "B", "C"), ("A", "B", "C", "D")) == 0.75
    assert mcq_soft(("A", "B"), ("A", "C")) == 0.0  # one wrong letter voids it
    assert mcq_soft((), ("A",)) == 0.0 and mcq_soft(None, ("A",)) == 0.0
    assert mcq_soft("a", "A") == 1.0
    with pytest.raises(ValueError):
        mcq_exact(("A",), ())
    with pytest.raises(ValueError):
        mcq_soft(("AB",), ("A",))


letters = st.sets(st.sampled_from("ABCDEF"))


@settings(max_examples=60, deadline=None)
@given(p=letters, g=letters.filter(bool))
def test_mcq_soft_properties(p, g):
    v = mcq_soft(p, g)
    assert 0.0 <= v <= 1.0
    assert (v == 1.0) == (p == g) == (mcq_exact(p, g) == 1.0)
    assert v <= 1.0 and (v > 0) == (bool(p) and p <= g)


def test_numeric():
    assert relative_error(12, 10) == pytest.approx(0.2)
    assert relative_error(0.5, 0) == 0.5  # y = 0: absolute error
    assert numeric_reward(3.5, 3.5) == 1.0
    assert numeric_reward(12, 10) == 0.0
    assert numeric_reward(12, 10, rel_tol=0.2) == 1.0
    assert numeric_reward(12, 10, mode="continuous") == pytest.approx(0.8)
    assert numeric_reward(40, 10, mode="continuous") == 0.0
    assert numeric_reward(None, 10) == 0.0
    # MRA: 1[0.2 < 1 − θ] for θ ∈ {0.50, …, 0.95} holds for θ ∈ {0.50, …, 0.75}: 6/10
    assert mean_relative_accuracy(12, 10) == pytest.approx(0.6)
    assert mean_relative_accuracy(10, 10) == 1.0
    assert mean_relative_accuracy(20, 10) == 0.0
    with pytest.raises(ValueError):
        numeric_reward(float("nan"), 1.0)
    with pytest.raises(ValueError):
        numeric_reward(1.0, 1.0, mode="fuzzy")


def test_format_reward():
    good = "<think>x</think> <answer>1 to 2</answer>"
    assert format_reward(good) == 1.0
    assert format_reward(good + " extra") == 0.0
    assert format_reward(good + " extra", strict=False) == 1.0
    assert format_reward("<answer>1 to 2") == 0.0
    assert format_reward("<answer>1 to 2", strict=False) == 0.0
    assert format_reward(None) == 0.0 and format_reward(None, strict=False) == 0.0


def test_length_bonus():
    assert length_bonus(400, True) == 0.2
    assert length_bonus(320, True) == 0.2 and length_bonus(512, True) == 0.2
    assert length_bonus(319, True) == 0.0 and length_bonus(513, True) == 0.0
    assert length_bonus(400, False) == 0.0
    assert length_bonus(5, True, lo=1, hi=10, bonus=1.0) == 1.0
    with pytest.raises(ValueError):
        length_bonus(5, True, lo=10, hi=1)
