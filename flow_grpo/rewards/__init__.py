"""Image rewards for the diffusion front-end (typed interface; see :mod:`flow_grpo.rewards.base`).

Light to import: reward implementations (open_clip, transformers, rapidocr) load only when built.

    from flow_grpo.rewards import build_reward, available_rewards, MultiReward
    r = build_reward("jpeg_compressibility")
    out = r(images_uint8_nhwc, prompts, metadata)   # {"jpeg_compressibility": (N,) float32}
"""
from .base import (
    FunctionReward,
    MultiReward,
    PairwisePreferenceReward,
    PairwiseScorer,
    Reward,
    RewardError,
    RewardFn,
    ScoreComparator,
    available_rewards,
    build_reward,
    check_finite,
    normalize_metadata,
    register_reward,
    to_uint8_nhwc,
    win_rate,
)

__all__ = [
    "FunctionReward",
    "MultiReward",
    "PairwisePreferenceReward",
    "PairwiseScorer",
    "Reward",
    "RewardError",
    "RewardFn",
    "ScoreComparator",
    "available_rewards",
    "build_reward",
    "check_finite",
    "normalize_metadata",
    "register_reward",
    "to_uint8_nhwc",
    "win_rate",
    "AsyncRewardRunner",
]


def __getattr__(name: str):  # lazy: the runner pulls in concurrent.futures only when used
    if name == "AsyncRewardRunner":
        from .async_runner import AsyncRewardRunner

        return AsyncRewardRunner
    raise AttributeError(name)
