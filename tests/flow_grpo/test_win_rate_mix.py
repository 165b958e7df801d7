"""Pref-GRPO's CLIP term as a reward combination: total = win_rate_weight * win_rate + pointwise_weight * pointwise
(reward.win_rate_weight / reward.pointwise_weight; issue #19 leftovers). Values computed by hand."""
from types import SimpleNamespace

import pytest
import torch

from flow_grpo.config import load_train_config
from flow_grpo.scoring import apply_win_rates


class _Traj(SimpleNamespace):
    def __len__(self):
        return self.group_ids.shape[0]


def _traj():
    return _Traj(images=torch.zeros(4, 2, 2, 3, dtype=torch.uint8), group_ids=torch.tensor([0, 0, 0, 1]),
                 rewards={"total": torch.tensor([0.2, 0.8, 0.5, 0.3]), "valid": torch.tensor([True] * 4)})


def _judge(imgs, prompts, meta, group_ids):  # fixed win rates, as a pairwise reward returns them
    return {"win_rate": torch.tensor([0.0, 1.0, 0.5, 0.5][: len(group_ids)])}


@pytest.mark.parametrize("wr_w,pw_w,expected", [
    (1.0, 0.0, [0.0, 1.0, 0.5, 0.5]),                      # default: the win rate alone (unchanged behaviour)
    (0.4, 0.6, [0.12, 0.4 + 0.48, 0.2 + 0.3, 0.2 + 0.18]),  # Pref-GRPO --use_clip: 0.4 win rate + 0.6 CLIP
])
def test_total_mixes_win_rate_and_pointwise(wr_w, pw_w, expected):
    t = _traj()
    apply_win_rates(t, _judge, ["p"] * 4, [{}] * 4, 0, 1, "cpu", win_rate_weight=wr_w, pointwise_weight=pw_w)
    torch.testing.assert_close(t.rewards["total"], torch.tensor(expected), atol=1e-6, rtol=0)
    torch.testing.assert_close(t.rewards["pointwise_total"], torch.tensor([0.2, 0.8, 0.5, 0.3]))
    torch.testing.assert_close(t.rewards["win_rate"], torch.tensor([0.0, 1.0, 0.5, 0.5]))


def test_keys_load_and_are_documented():
    cfg = load_train_config(None, ["reward.mode=win_rate", "reward.win_rate_weight=0.4", "reward.pointwise_weight=0.6"])
    assert (cfg.reward.win_rate_weight, cfg.reward.pointwise_weight) == (0.4, 0.6)
