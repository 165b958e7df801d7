import math

import pytest

from mmgrpo.utils.schedule import LRFactor


def test_lr_factor_by_hand():
    cos = LRFactor("cosine", warmup=4, total=14)
    assert [cos(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert cos(9) == pytest.approx(0.5)           # half way through the 10 decay steps: (1 + cos(pi/2)) / 2
    assert cos(14) == pytest.approx(0.0) and cos(100) == pytest.approx(0.0)
    floor = LRFactor("cosine", warmup=0, total=10, min_ratio=0.1)
    assert floor(0) == pytest.approx(1.0) and floor(10) == pytest.approx(0.1)
    assert floor(5) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    lin = LRFactor("linear", warmup=0, total=10, min_ratio=0.2)
    assert lin(5) == pytest.approx(0.2 + 0.8 * 0.5)
    assert LRFactor("constant", warmup=2, total=10)(7) == 1.0
    with pytest.raises(ValueError, match="lr_schedule"):
        LRFactor("step", 0, 10)
    with pytest.raises(ValueError, match="warmup"):
        LRFactor("cosine", -1, 10)
