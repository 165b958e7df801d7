"""One video converter for every reward (flow_grpo.media.to_uint8_videos / to_uint8_media): the layouts, by hand,
and the video-only rewards (temporal consistency, motion verifier, VLM video judge) all go through
``Reward.evaluate`` instead of their own copies."""
import numpy as np
import pytest
import torch

from flow_grpo.media import to_uint8_media, to_uint8_videos
from flow_grpo.rewards import build_reward
from flow_grpo.rewards.async_runner import AsyncRewardRunner
from flow_grpo.rewards.base import Reward
from flow_grpo.rewards.motion import MotionVerifierReward
from flow_grpo.rewards.video import PerFrameReward, TemporalConsistency
from flow_grpo.rewards.vlm_judge_video import VLMVideoJudgeReward


def _u8(b=2, f=3, h=4, w=5, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (b, f, h, w, 3), dtype=np.uint8)


def test_to_uint8_videos_layouts_by_hand():
    v = _u8()
    out = to_uint8_videos(v)
    assert np.array_equal(out, v) and not np.shares_memory(out, v)  # copied
    x = np.random.default_rng(1).random((2, 3, 3, 4, 5)).astype(np.float32)  # (B, F, 3, H, W) in [0, 1]
    by_hand = np.rint(x * 255).astype(np.uint8).transpose(0, 1, 3, 4, 2)
    assert np.array_equal(to_uint8_videos(x), by_hand)
    assert np.array_equal(to_uint8_videos(torch.from_numpy(x)), by_hand)
    assert np.array_equal(to_uint8_videos(list(v)), v)
    assert np.array_equal(to_uint8_videos(v[..., :1]), np.repeat(v[..., :1], 3, axis=-1))  # grey frames
    with pytest.raises(ValueError, match="video batch \\(5-d\\).*an image batch"):
        to_uint8_videos(v[0])
    with pytest.raises(ValueError, match="\\[0, 1\\]"):
        to_uint8_videos(x * 2)
    with pytest.raises(ValueError, match="one shape"):
        to_uint8_videos([v[0], v[1, :2]])
    # to_uint8_media: images stay images, videos only where accepted
    assert to_uint8_media(v[:, 0]).shape == (2, 4, 5, 3)
    assert to_uint8_media(x, accepts_video=True).shape == (2, 3, 4, 5, 3)
    with pytest.raises(ValueError):
        to_uint8_media(v)  # an image reward given videos
    with pytest.raises(ValueError, match="video batch"):
        to_uint8_media(v[:, 0], video_only=True)


@pytest.mark.parametrize("cls", [TemporalConsistency, PerFrameReward, MotionVerifierReward, VLMVideoJudgeReward])
def test_video_rewards_use_the_base_converter(cls):
    assert cls.video_only and cls.evaluate is Reward.evaluate


def test_video_rewards_take_every_layout():
    v = _u8(seed=2)
    x = v.transpose(0, 1, 4, 2, 3).astype(np.float32) / 255.0
    tc = TemporalConsistency()
    ref = tc.evaluate(v, ["a", "b"])["temporal_consistency"]
    d = np.abs(np.diff(v.astype(np.float64), axis=1)).mean(axis=(2, 3, 4)) / 255.0
    np.testing.assert_allclose(ref, 1 - d.mean(axis=1), rtol=1e-6)
    for layout in (x, torch.from_numpy(x), list(v)):
        np.testing.assert_array_equal(tc.evaluate(layout, ["a", "b"])["temporal_consistency"], ref)
    with pytest.raises(ValueError, match="reward 'temporal_consistency': videos: expected a video batch"):
        tc.evaluate(v[:, 0], ["a", "b"])
    with AsyncRewardRunner(build_reward("temporal_consistency")) as runner:
        out = runner.submit(x, ["a", "b"]).result()
    np.testing.assert_allclose(np.asarray(out["temporal_consistency"]), ref, rtol=1e-6)
