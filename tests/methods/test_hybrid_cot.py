"""TempSamp-R1 hybrid CoT schedule: think probability by hand, exact deterministic mode assignment, mode formats."""
import pytest

from mmgrpo.vlm.methods.hybrid_cot import assign_modes, mode_format_reward, think_probability


def test_think_probability_stages_and_ramp():
    assert think_probability(4, stage1_steps=5, think_fraction=0.5) == 0.0
    assert think_probability(5, stage1_steps=5, think_fraction=0.5) == 0.5
    assert think_probability(5, 5, 0.5, ramp_steps=4) == pytest.approx(0.125)
    assert think_probability(8, 5, 0.5, ramp_steps=4) == pytest.approx(0.5)
    assert think_probability(100, 5, 0.5, ramp_steps=4) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        think_probability(0, think_fraction=1.5)


def test_assign_modes_exact_and_deterministic():
    keys = list(range(10))
    m = assign_modes(3, keys, 0.3, seed=7)
    assert m.count("think") == 3 and m == assign_modes(3, keys, 0.3, seed=7)
    assert m != assign_modes(4, keys, 0.3, seed=7) or m != assign_modes(5, keys, 0.3, seed=7)
    assert assign_modes(3, keys, 0.0) == ["no_think"] * 10 and assign_modes(3, keys, 1.0) == ["think"] * 10
    free = [assign_modes(s, keys, 0.5, exact=False).count("think") for s in range(50)]
    assert 200 < sum(free) < 300  # independent draws average p


def test_mode_format_reward():
    think = "<think>because</think><answer>1.00 to 2.00</answer>"
    direct = "<answer>1.00 to 2.00</answer>"
    assert mode_format_reward(think, "think") == 1.0 and mode_format_reward(direct, "think") == 0.0
    assert mode_format_reward(direct, "no_think") == 1.0 and mode_format_reward(think, "no_think") == 0.0
    assert mode_format_reward("1.00 to 2.00", "no_think") == 0.0
