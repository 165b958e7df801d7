"""Run reward calls in background threads so they overlap the next sampling batch.

    runner = AsyncRewardRunner(reward, max_workers=2)
    fut = runner.submit(images, prompts, metadata)   # returns at once; images are copied to uint8 NHWC first
                                                     # (videos: uint8 (B, F, H, W, 3), if the reward accepts them)
    ...sample the next batch...
    scores = fut.result()                            # dict[str, (N,) float32], errors re-raised here

Threads (not processes) are enough: torch/onnxruntime kernels and HTTP waits release the GIL.  For a reward
whose dependencies conflict with the trainer, wrap a :class:`~flow_grpo.rewards.remote.RemoteReward` instead.
With ``max_workers > 1`` the same reward object is called from several threads at once: keep ``max_workers=1``
for a reward that is not thread-safe (one call still overlaps the caller's sampling).
"""
from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..media import to_uint8_media
from ..media import ImageBatch
from .base import Metadata, RewardFn, normalize_metadata

__all__ = ["AsyncRewardRunner"]


class AsyncRewardRunner:
    """Submit reward calls to a thread pool; ``submit`` returns a ``concurrent.futures.Future``.

    Inputs are snapshotted at submit time (images converted to a fresh uint8 array, prompts and metadata
    copied), so the caller may reuse or overwrite its buffers while the reward runs.
    """

    def __init__(self, reward: RewardFn, max_workers: int = 1):
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.reward = reward
        self.max_workers = max_workers
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="reward")

    def submit(self, images: ImageBatch, prompts: Sequence[str], metadata: Metadata = None,
               **kwargs: Any) -> Future:
        # a reward that accepts videos gets them as uint8 (B, F, H, W, 3), copied (Reward.evaluate's converter)
        imgs = to_uint8_media(images, getattr(self.reward, "accepts_video", False),
                              getattr(self.reward, "video_only", False))
        prompts = list(prompts)
        md = [dict(m) for m in normalize_metadata(metadata, imgs.shape[0], getattr(self.reward, "name", "?"))]
        return self._pool.submit(self.reward, imgs, prompts, md, **kwargs)

    def shutdown(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait)

    def __enter__(self) -> "AsyncRewardRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown(wait=True)
