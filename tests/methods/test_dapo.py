"""DAPO's data-side pieces (mmgrpo.vlm.methods.dapo) by hand: which groups dynamic sampling drops, which rows the
fixed batch size keeps, and the overlong mask."""
import types

import torch

from mmgrpo.vlm.methods.dapo import OverlongMask, drop_zero_std_groups
from mmgrpo.vlm.data.batch import keep_first_groups


def test_zero_std_groups_are_dropped_whole_and_counted():
    gid = torch.tensor([4, 4, 4, 9, 9, 9, 2, 2])
    zero = torch.tensor([True, True, False, False, False, False, True, True])  # group 4 flagged on 2 rows
    offp = torch.tensor([False, False, True, False, False, False, True, True])  # group 2: only off-policy rows
    keep, n = drop_zero_std_groups(gid, zero, offp)
    assert keep.tolist() == [3, 4, 5, 6, 7] and n == 1


def test_the_first_groups_in_row_order_are_kept():
    gid = torch.tensor([8, 8, 3, 3, 5, 5, 1])
    assert keep_first_groups(gid, 2).tolist() == [0, 1, 2, 3]
    assert keep_first_groups(gid, 9).tolist() == list(range(7))


def test_truncated_completions_leave_the_loss_mask():
    mask = torch.ones(3, 4, dtype=torch.long)
    rb = types.SimpleNamespace(truncated=torch.tensor([False, True, False]), loss_mask=mask)
    out = OverlongMask(cfg=None, run=None).on_advantages(rb)
    assert out.loss_mask.tolist() == [[1] * 4, [0] * 4, [1] * 4] and mask.sum() == 12  # the input is not modified
