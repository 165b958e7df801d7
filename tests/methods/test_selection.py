"""Data selection (mmgrpo.vlm.methods.selection): the criteria by hand; Time-R1 Gaussian difficulty selection (issue
#23 item 5) against the release (src/utils/process_data.py, task gaussian_03): candidates are the items with
IoU > 0; P(pick) ∝ exp(-(d - 0.3)^2 / (2 * 0.2^2))."""
import math
from collections import Counter

import pytest
import torch

from mmgrpo.vlm.methods.selection import reward_stats, select_indices

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


def test_trainer_gaussian_selection_uses_iou_and_greedy_answers(tmp_path, tiny_dirs, th):
    """Trainer path: methods.selection.key=auto reads the IoU (not the total, which the format term keeps above 0), IoU-0
    samples are dropped, and methods.selection.greedy scores argmax answers (K copies agree)."""
    import json

    from mmgrpo.vlm.train.trainer import GRPOTrainer

    iou_of = {"i0": 0.0, "i1": 0.3, "i2": 0.5}

    def by_id(texts, samples):
        iou = torch.tensor([iou_of[s["id"]] + 1e-3 * (sum(map(ord, t)) % 7) * (s["id"] != "i0")
                            for t, s in zip(texts, samples)])
        return {"iou": iou, "total": iou + 0.5, "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}

    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "methods.selection.enabled=true",
                      "methods.selection.num_inferences=2", "methods.selection.criterion=gaussian", "methods.selection.greedy=true")
    tr = GRPOTrainer(cfg, samples=th.image_samples(3), reward_fn=by_id)
    sel = next(m for m in tr.methods if m.name == "selection")
    assert sel.select(0) == [1, 2]
    rows = [json.loads(x) for x in (tmp_path / "run" / "selection.jsonl").read_text().splitlines()]
    assert rows[0]["rewards"] == [0.0, 0.0] and not rows[0]["kept"]
    assert all(r["rewards"][0] == r["rewards"][1] for r in rows)  # greedy: the two answers are the same


def test_selection_criteria_by_hand():
    r = torch.tensor([[1.0, 1.0, 1.0],  # all right
                      [0.0, 0.0, 0.0],  # all wrong
                      [1.0, 0.0, 0.0],  # mean 1/3, var 2/9
                      [1.0, 1.0, 0.0],  # mean 2/3, var 2/9
                      [0.2, 0.3, 0.4]])  # mean 0.3, var 0.00667
    st = reward_stats(r)
    assert st["var"][2].item() == pytest.approx(2 / 9)
    assert select_indices(r, "nonconstant") == [2, 3, 4]
    assert select_indices(r, "variance", min_variance=0.1) == [2, 3]
    assert select_indices(r, "variance", num_keep=1) in ([2], [3])
    # gaussian around 0.3: sample 4 (mean 0.3, weight 1) and 2 (weight exp(-(1/30)^2/0.08) ~ 0.986) dominate
    picks = [tuple(select_indices(r, "gaussian", num_keep=2, mu=0.3, sigma=0.05, seed=s)) for s in range(20)]
    assert all(0 not in p and 1 not in p for p in picks)  # weights ~ exp(-98) and exp(-18)
    assert select_indices(r, "gaussian", num_keep=2, seed=3) == select_indices(r, "gaussian", num_keep=2, seed=3)
    with pytest.raises(ValueError, match="criterion"):
        select_indices(r, "bogus")
