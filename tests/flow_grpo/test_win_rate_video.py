"""reward.mode=win_rate with a video generator: the pairwise reward compares whole videos (B, F, H, W, 3) through
the config's pointwise video reward (ScoreComparator over the MultiReward); an image-only pairwise scorer is
refused with a clear error. Win rates computed by hand."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from flow_grpo.config import load_train_config
from flow_grpo.rewards import PairwisePreferenceReward
from flow_grpo.rewards.base import RewardError
from flow_grpo.scoring import RewardStack, apply_win_rates


class _Traj(SimpleNamespace):
    def __len__(self):
        return self.group_ids.shape[0]


def _video(step: int) -> np.ndarray:
    """3 frames of 4x4 px, frame k = k * step everywhere: temporal_consistency = 1 - step / 255."""
    return np.stack([np.full((4, 4, 3), k * step, dtype=np.uint8) for k in range(3)])


def test_win_rate_mode_scores_videos_by_hand():
    rc = load_train_config(None, ["reward.mode=win_rate", "reward.weights={temporal_consistency: 1.0}"]).reward
    stack = RewardStack(rc)
    # consistencies 0.8, 1.0, 0.6 | 0.6, 0.6, 1.0
    vids = torch.from_numpy(np.stack([_video(s) for s in (51, 0, 102, 102, 102, 0)]))
    traj = _Traj(images=vids, group_ids=torch.tensor([0, 0, 0, 1, 1, 1]),
                 rewards={"total": torch.zeros(6), "valid": torch.ones(6, dtype=torch.bool)})
    apply_win_rates(traj, stack.pairwise, ["p"] * 6, [{}] * 6, 0, 1, "cpu")
    # group 0: 1.0 beats both, 0.8 beats 0.6; group 1: the two 0.6 tie (0.5 each) and lose to 1.0
    expected = torch.tensor([0.5, 1.0, 0.0, 0.25, 0.25, 1.0])
    torch.testing.assert_close(traj.rewards["win_rate"], expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(traj.rewards["total"], expected, atol=1e-6, rtol=0)
    assert bool(traj.rewards["valid"].all()) and stack.pairwise.counters["failed_calls"] == 0


def test_image_only_pairwise_scorer_refuses_videos():
    class ImageJudge:
        accepts_video = False

        def __call__(self, a, b, prompts, metadata):  # pragma: no cover - must not be reached
            raise AssertionError("called with videos")

    vids = np.stack([_video(0), _video(51)])
    with pytest.raises(RewardError, match="compares images, got videos"):
        PairwisePreferenceReward(ImageJudge())(vids, ["p", "p"], group_ids=[0, 0])


def test_trainer_win_rate_mode_on_tiny_wan(tmp_path):
    """End to end: the trainer's win rates on its own videos equal the in-group ranks of their pointwise totals."""
    from flow_grpo.train.trainer import FlowGRPOTrainer

    from .conftest import train_overrides

    ov = {"model.tiny": "wan", "sample.num_frames": 5, "sample.height": 32, "sample.width": 32,
          "model.max_sequence_length": 16, "reward.weights": "{temporal_consistency: 1.0}",
          "reward.mode": "win_rate", "data.eval_prompts": "[]"}
    tr = FlowGRPOTrainer(load_train_config(None, train_overrides("wan", "flow", tmp_path, **ov)))
    tr.train()
    t = tr.state.last_traj
    assert t.images.ndim == 5 and bool(t.rewards["valid"].all())
    pw, gid = t.rewards["pointwise_total"].double(), t.group_ids
    expected = torch.zeros(len(t), dtype=torch.float64)
    for i in range(len(t)):
        others = [j for j in range(len(t)) if j != i and gid[j] == gid[i]]
        expected[i] = sum(float(pw[i] > pw[j]) + 0.5 * float(pw[i] == pw[j]) for j in others) / len(others)
    torch.testing.assert_close(t.rewards["win_rate"].double(), expected, atol=1e-6, rtol=0)
