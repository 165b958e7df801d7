"""Time-R1 Gaussian difficulty selection (issue #23 item 5), against the release (src/utils/process_data.py,
task gaussian_03): candidates are the items with IoU > 0; P(pick) ∝ exp(-(d - 0.3)^2 / (2 * 0.2^2))."""
import math
from collections import Counter

import pytest
import torch

from mmgrpo.train.selection import select_indices

# one base-model IoU per item (K = 1, as the release: difficulty = 100 * IoU of one greedy answer)
MEANS = [0.3, 0.0, 0.5, 0.1, 0.0, 0.9]
REWARDS = torch.tensor(MEANS).unsqueeze(1)


def test_iou_zero_items_are_never_candidates():
    # deterministic: with num_keep >= candidates every IoU > 0 item is kept and no IoU-0 item
    assert select_indices(REWARDS, "gaussian", num_keep=0) == [0, 2, 3, 5]
    assert select_indices(REWARDS, "gaussian", num_keep=10) == [0, 2, 3, 5]
    # over many seeded draws an IoU-0 item is never picked (the old code picked one in ~28 % of these draws)
    picked = Counter(i for s in range(2000) for i in select_indices(REWARDS, "gaussian", num_keep=2, seed=s))
    assert picked[1] == 0 and picked[4] == 0
    # the previous behaviour, one switch away
    assert select_indices(REWARDS, "gaussian", num_keep=0, keep_zero=True) == list(range(6))


def test_single_draw_probabilities_match_hand_computed_gaussian_weights():
    # hand: w(0.3) = 1, w(0.5) = w(0.1) = e^-0.5, w(0.9) = e^-4.5 (sigma 0.2: 2 sigma^2 = 0.08)
    w = {0: 1.0, 2: math.exp(-0.5), 3: math.exp(-0.5), 5: math.exp(-4.5)}
    total = sum(w.values())
    n = 4000
    counts = Counter(select_indices(REWARDS, "gaussian", num_keep=1, seed=s)[0] for s in range(n))
    assert set(counts) <= set(w)
    for i, wi in w.items():
        p = wi / total  # 0.4496, 0.2727, 0.2727, 0.0050
        assert counts[i] / n == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / n) + 1e-3), (i, counts[i])
