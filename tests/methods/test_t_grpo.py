"""T-GRPO temporal bonus (mmgrpo.vlm.methods.t_grpo), by hand."""
import pytest
import torch

from mmgrpo.vlm.methods.t_grpo import temporal_bonus


def test_temporal_bonus_is_per_group_by_hand():
    # group 10: ordered acc mean 0.5, shuffled 0.25 -> bonus to rows with acc > 0.1
    # group 20: ordered mean 0.25, shuffled 0.75 -> none;  group 30 (image): no shuffled rows -> none
    acc = torch.tensor([1.0, 0.0, 0.05, 0.95, 0.5, 0.0, 0.0, 0.5, 1.0])
    gid = torch.tensor([10, 10, 10, 10, 20, 20, 20, 20, 30])
    acc_s = torch.tensor([0.5, 0.0, 1.0, 0.5])
    gid_s = torch.tensor([10, 10, 20, 20])
    bonus, granted = temporal_bonus(acc, gid, acc_s, gid_s, alpha=0.3, mu=1.0, min_accuracy=0.1)
    assert bonus.tolist() == pytest.approx([0.3, 0.0, 0.0, 0.3, 0, 0, 0, 0, 0])
    assert granted.tolist() == [True, False, False]
    # the batch-mean version (Video-R1 #96) would pool: mean ordered 0.5 (groups 10+20), shuffled 0.5 -> grant both
    # mu scales the comparison: with mu = 0.3, group 20 (0.25 >= 0.225) is granted too
    bonus2, _ = temporal_bonus(acc, gid, acc_s, gid_s, alpha=0.3, mu=0.3)
    assert bonus2[4] == pytest.approx(0.3) and bonus2[5] == 0.0
