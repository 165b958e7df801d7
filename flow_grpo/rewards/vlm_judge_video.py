"""``vlm_judge_video``: the Qwen-VL judge of :mod:`flow_grpo.rewards.vlm_judge` over generated videos.

Each video (F, H, W, 3) uint8 is a decoded clip at ``fps`` frames per second (per sample: ``metadata[i]["fps"]``
when present, e.g. the Mini-T2V specs; else the ``fps=`` argument).  It goes through the VLM front-end's video
contract exactly as a video file does in the VLM trainer:

    clip = mmgrpo.video.load_video(frames, video_fps=fps, fps=sample_fps or fps, min_frames, max_frames,
                                   min_pixels, max_pixels, total_pixels, image_factor=patch * merge)
    inputs = mmgrpo.video.build_video_inputs(processor, clip, messages, family)

so the frames are sampled and resized by qwen-vl-utils' rules, the processor gets ``video_metadata`` (the sampled
frames' fps and indices) with ``do_sample_frames=False``, and ``check_time_axis`` verifies the result: Qwen2.5-VL's
``second_per_grid_ts = temporal_patch_size / sample_fps`` (2 / 8 = 0.25 s for an 8 fps clip judged at every frame),
Qwen3-VL's ``<t seconds>`` stamps are the frames' times.  ``sample_fps=None`` (default) judges every frame (rounded
down to an even count; the temporal patch is 2 frames).

Prompt (``mode="yes_no"``; ``"scale"`` asks for a rating 1..K as the image judge does)::

    <|im_start|>user\\n<|vision_start|><|video_pad|><|vision_end|>Prompt: {prompt}\\n{question}<|im_end|>
    <|im_start|>assistant\\n
    question = "Does this video match the prompt (the objects, their colours, how they move and in which order
                they appear) and is it of high quality? Answer Yes or No."
    r = p(Yes) / (p(Yes) + p(No))

Outputs ``{name: r, name + "/answer_mass": p(Yes) + p(No)}`` (see :mod:`flow_grpo.rewards.vlm_judge`).
Videos: uint8 (B, F, H, W, 3), float (B, F, 3, H, W) in [0, 1], or a list of (F, H, W, 3) arrays
(:func:`flow_grpo.media.to_uint8_videos`).

Pixels: ``min_pixels`` / ``max_pixels`` / ``total_pixels`` default to qwen-vl-utils' video budget (128 / 768
28x28 patches per frame), which upscales a 48x48 clip to about 316x316; pass e.g. ``min_pixels=56*56`` to judge
tiny clips at 56x56 (4 visual tokens per 2 frames).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .base import NanPolicy
from .vlm_judge import TEMPLATE_POINT, VLMJudgeReward

__all__ = ["VLMVideoJudgeReward", "QUESTION_VIDEO_YES_NO", "QUESTION_VIDEO_SCALE"]

QUESTION_VIDEO_YES_NO = ("Does this video match the prompt (the objects, their colours, how they move and in which "
                         "order they appear) and is it of high quality? Answer Yes or No.")
QUESTION_VIDEO_SCALE = ("Rate how well this video matches the prompt (the objects, their colours, how they move and "
                        "in which order they appear) and its overall quality on a scale from 1 to {k}. "
                        "Answer with a single digit.")


class VLMVideoJudgeReward(VLMJudgeReward):
    """Pointwise VLM judge over videos (module docstring).

    Args (besides :class:`~flow_grpo.rewards.vlm_judge.VLMJudgeReward`'s path / model / processor / mode /
    question / template / answers / scale_max / family / dtype / device / batch_size / name / nan_policy):
        fps: frame rate of the given videos (a sample's ``metadata["fps"]`` overrides it).
        sample_fps: rate the judge samples frames at (None: every frame).
        min_frames, max_frames, min_pixels, max_pixels, total_pixels: :func:`mmgrpo.video.load_video`'s rules.
    """

    accepts_video = True  # MultiReward passes it the (B, F, H, W, 3) videos (flow_grpo.rewards.base)
    video_only = True  # Reward.evaluate converts with flow_grpo.media.to_uint8_videos

    name = "vlm_judge_video"

    def __init__(self, path: str | None = None, *, fps: float = 8.0, sample_fps: float | None = None,
                 min_frames: int = 2, max_frames: int = 768, min_pixels: int | None = None,
                 max_pixels: int | None = None, total_pixels: float | None = None, mode: str = "yes_no",
                 question: str | None = None, template: str = TEMPLATE_POINT, name: str | None = None,
                 nan_policy: NanPolicy = "raise", **judge_kwargs: Any):
        if fps <= 0 or (sample_fps is not None and sample_fps <= 0):
            raise ValueError(f"fps and sample_fps must be > 0, got fps={fps}, sample_fps={sample_fps}")
        if question is None:
            question = QUESTION_VIDEO_YES_NO if mode == "yes_no" else QUESTION_VIDEO_SCALE.format(
                k=int(judge_kwargs.get("scale_max", 5)))
        super().__init__(path, mode=mode, question=question, template=template, name=name, nan_policy=nan_policy,
                         **judge_kwargs)
        self.fps, self.sample_fps = float(fps), sample_fps
        self.video_kw = dict(min_frames=min_frames, max_frames=max_frames, min_pixels=min_pixels,
                             max_pixels=max_pixels, total_pixels=total_pixels)

    def messages(self, prompt: str) -> list[dict]:
        """The chat for one video (the video item first, then the text)."""
        text = self.template.format(prompt=prompt, question=self.question)
        return [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}]

    def clip(self, frames: np.ndarray, fps: float):
        """The :class:`mmgrpo.video.VideoClip` the judge sees for one (F, H, W, 3) video at ``fps``."""
        from mmgrpo.video import load_video

        vp = self.judge.processor.video_processor
        return load_video(frames, fps=float(self.sample_fps or fps), video_fps=float(fps),
                          image_factor=int(vp.patch_size) * int(vp.merge_size), **self.video_kw)

    def score(self, images, prompts, metadata, **kwargs: Any):
        import torch

        from mmgrpo.vlm.models.rollout import batch_to, collate_prompts
        from mmgrpo.video import build_video_inputs

        judge = self.judge
        family = judge.adapter.family
        items = []
        for i, (frames, prompt) in enumerate(zip(images, prompts)):
            fps = float(metadata[i].get("fps", self.fps))
            out = build_video_inputs(judge.processor, self.clip(frames, fps), self.messages(prompt), family)
            items.append({k: v for k, v in out.items() if hasattr(v, "shape")})
        pad = judge.processor.tokenizer.pad_token_id
        probs = []
        with torch.no_grad():
            for s in range(0, len(items), judge.batch_size):
                batch = batch_to(collate_prompts(items[s:s + judge.batch_size], pad), judge.device)
                logits = judge.model(**batch, use_cache=False, logits_to_keep=1).logits[:, -1].float()
                probs.append(torch.softmax(logits, dim=-1)[:, list(self.answer_ids)].cpu())
        return self.scores_from_probs(torch.cat(probs))
