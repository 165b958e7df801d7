"""Prompt items: chat messages + images / pre-sampled video frames -> one processor output (batch dim 1).

This is the models-side minimal path (used in tests and as a fallback); the video contract module
``mmgrpo.video`` (``build_video_inputs``) is preferred by the trainer when it is present.
"""
from __future__ import annotations

from typing import Any, Sequence

from .adapters import ModelAdapter


def build_prompt_item(
    processor,
    adapter: ModelAdapter,
    messages: list[dict],
    images: Sequence[Any] | None = None,
    video: Any | None = None,
    sample_fps: float | None = None,
    frames_indices: Sequence[int] | None = None,
) -> dict:
    """Processor output for ONE prompt: ``input_ids`` (1, P), ``attention_mask``, ``mm_token_type_ids``, and the
    pixel tensors of its images / its video.

    ``video``: frames as an array (F, H, W, 3) uint8 or a list of PIL images, already sampled at ``sample_fps``;
    the fps reaches the processor through ``video_metadata`` so the MRoPE time axis (Qwen2.5-VL
    ``second_per_grid_ts``) / Qwen3-VL timestamps are right.
    """
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    kw: dict[str, Any] = {"text": [text], "return_tensors": "pt"}
    if images:
        kw["images"] = list(images)
    if video is not None:
        if sample_fps is None:
            raise ValueError("a video needs its sample_fps (frames per second of the given frames)")
        n = len(video)
        kw["videos"] = [video]
        kw.update(adapter.video_processor_kwargs(n, sample_fps, frames_indices))
    out = processor(**kw)
    item = {k: v for k, v in out.items() if hasattr(v, "shape")}
    n_img_tok = int((item["input_ids"] == processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")).sum())
    if images and n_img_tok == 0:
        raise ValueError("images were given but the chat messages have no {'type': 'image'} item")
    return item
