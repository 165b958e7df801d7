"""Reward-side guardrails (mmgrpo.core.reward_shaping) against values computed by hand."""
import math

import pytest
import torch

from mmgrpo.core.reward_shaping import (coefficient_of_variation, log_tamed, par_sigmoid, uncertainty_weighted,
                                        worst_case)


def test_worst_case_by_hand():
    r = torch.tensor([[0.2, 0.9, -1.0], [0.5, 0.1, -2.0]], dtype=torch.float64)
    assert worst_case(r).tolist() == [0.2, 0.1, -2.0]


def test_uncertainty_weighted_by_hand():
    # members 1 and 3 for sample 0: mean 2, population var ((1-2)^2 + (3-2)^2) / 2 = 1 -> 2 - 0.5 * 1 = 1.5
    # members 4 and 4 for sample 1: var 0 -> 4
    r = [torch.tensor([1.0, 4.0]), torch.tensor([3.0, 4.0])]
    assert uncertainty_weighted(r, 0.5).tolist() == [1.5, 4.0]
    # three members 0, 3, 6: mean 3, var (9 + 0 + 9) / 3 = 6 -> 3 - 2 * 6 = -9
    assert uncertainty_weighted(torch.tensor([[0.0], [3.0], [6.0]]), 2.0).tolist() == [-9.0]
    with pytest.raises(ValueError, match="lam"):
        uncertainty_weighted(r, -1.0)


def test_par_by_hand():
    # sigmoid(0) = 1/2 at the reference; sigmoid(ln 3) = 1 / (1 + 1/3) = 3/4; sigmoid(-ln 3) = 1/4
    r = torch.tensor([1.0, 1.0 + math.log(3.0), 0.0], dtype=torch.float64)
    ref = torch.tensor([1.0, 1.0, math.log(3.0)], dtype=torch.float64)
    got = par_sigmoid(r, ref)
    assert torch.allclose(got, torch.tensor([0.5, 0.75, 0.25], dtype=torch.float64))
    assert torch.allclose(par_sigmoid(torch.tensor([math.log(3.0)]), torch.tensor([0.0]), tau=0.5),
                          torch.tensor([0.9], dtype=torch.float64))  # sigmoid(2 ln 3) = 9/10
    # several references: the mean of the sigmoids (3/4 and 1/2)
    two = par_sigmoid(torch.tensor([math.log(3.0)]), torch.tensor([[0.0, math.log(3.0)]]))
    assert torch.allclose(two, torch.tensor([0.625], dtype=torch.float64))
    # bounded and flat far above the reference (the point of PAR)
    far = par_sigmoid(torch.tensor([50.0, 60.0]), torch.zeros(2))
    assert float(far[1] - far[0]) < 1e-20 and bool((far <= 1).all())


def test_log_tamed_by_hand():
    # a: [1, 3] mean 2, population std 1 -> h = 0.5; b: [10, 10] -> h = 0
    a, b = torch.tensor([1.0, 3.0]), torch.tensor([10.0, 10.0])
    assert coefficient_of_variation(a) == 0.5 and coefficient_of_variation(b) == 0.0
    # delta = mean(h) = 0.25: a is tamed, b is not. total = 2 * log(1 + a) + 0.5 * b
    total, h, tamed = log_tamed({"a": a, "b": b}, {"a": 2.0, "b": 0.5}, "mean")
    assert h == {"a": 0.5, "b": 0.0} and tamed == {"a": True, "b": False}
    assert torch.allclose(total, torch.tensor([2 * math.log(2) + 5, 2 * math.log(4) + 5], dtype=torch.float64))
    # a fixed delta above both: the plain weighted sum
    total, _, tamed = log_tamed({"a": a, "b": b}, {"a": 2.0, "b": 0.5}, 0.6)
    assert not any(tamed.values()) and total.tolist() == [7.0, 11.0]
    # the coefficients come from `stats` (the gathered batch) when given
    _, h, _ = log_tamed({"a": a[:1]}, {}, 0.2, stats={"a": a})
    assert h == {"a": 0.5}
    with pytest.raises(ValueError, match="<= -1"):
        log_tamed({"a": torch.tensor([-1.0, 2.0])}, {}, 0.0)
