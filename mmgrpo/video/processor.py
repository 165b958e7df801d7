"""``build_video_inputs``: clip(s) + prompt text -> model-ready processor outputs with the right time axis.

Why this exists: the processor must be told the *effective* sampling rate of the frames it gets.

* Qwen2.5-VL: the MRoPE temporal position of grid slice k is ``floor(k * second_per_grid_ts * tokens_per_second)``
  with ``second_per_grid_ts = temporal_patch_size / sample_fps``.  transformers 5.x derives it from
  ``video_metadata.sampled_fps``; a raw frame array without metadata gets fps 24 (2/24 = 0.083 s per slice).
* Qwen3-VL: the processor writes ``<t seconds>`` before each temporal slice, t = the mean of the slice's frame times
  ``frames_indices / fps``; its video processor *re-samples frames by default* (``do_sample_frames=True``).
* Qwen2-VL: the temporal position advances by 1 per slice; there is no absolute time axis (nothing to pass).

So every call passes ``video_metadata=[clip.video_metadata()]``, ``do_sample_frames=False`` (the clip is already
sampled) and ``do_resize=False`` (the clip is already resized by ``load_video``'s pixel rules, which therefore
decide the token count -- not the processor's own min/max pixels).  Afterwards :func:`check_time_axis` verifies
``grid_T * temporal_patch_size / sample_fps`` against the clip's covered duration (within one frame period), and for
Qwen2.5-VL that the emitted ``second_per_grid_ts`` equals ``temporal_patch_size / sample_fps``.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from .clip import VideoClip

# The time contracts (what the processor needs to place frames in time; see above), the processor classes that
# follow each (by class-name prefix), and the families this module knows by name.  A caller that has a model
# family's adapter (mmgrpo.vlm.models.adapters: ``ModelAdapter.video_time``) passes its contract as ``video_time=``,
# so a family registered there needs no line here.
TIME_CONTRACTS = ("none", "second_per_grid_ts", "timestamps")
PROCESSOR_TIME = {"Qwen2VL": "none", "Qwen2_5_VL": "second_per_grid_ts", "Qwen3VL": "timestamps"}
FAMILY_TIME = {"qwen2_vl": "none", "qwen2_5_vl": "second_per_grid_ts", "qwen3_vl": "timestamps"}
MODEL_FAMILIES = tuple(FAMILY_TIME)


class TimeAxisError(AssertionError):
    """The processor outputs disagree with the clip's time axis (wrong fps, resampled or padded frames)."""


def check_time_axis(grid_t: int, temporal_patch_size: int, sample_fps: float, covered_duration: float,
                    video_fps: float, second_per_grid_ts: float | None = None) -> float:
    """Assert ``|grid_t * temporal_patch_size / sample_fps - covered_duration| <= 1 / video_fps``.

    With ``second_per_grid_ts`` (what the processor emitted) also assert it equals ``temporal_patch_size /
    sample_fps`` (relative 1e-6) and that ``grid_t * second_per_grid_ts`` matches the covered duration.
    Returns the modelled duration ``grid_t * temporal_patch_size / sample_fps`` in seconds.
    """
    if sample_fps <= 0 or video_fps <= 0:
        raise TimeAxisError(f"fps must be positive (sample_fps={sample_fps}, video_fps={video_fps})")
    period = 1.0 / video_fps
    modelled = grid_t * temporal_patch_size / sample_fps
    if abs(modelled - covered_duration) > period + 1e-9:
        raise TimeAxisError(
            f"time axis mismatch: grid_T={grid_t} x temporal_patch_size={temporal_patch_size} / sample_fps="
            f"{sample_fps:.6g} = {modelled:.4f}s, but the clip covers {covered_duration:.4f}s "
            f"(tolerance one frame period {period:.4f}s); were frames resampled or padded by the processor?")
    if second_per_grid_ts is not None:
        expected = temporal_patch_size / sample_fps
        if not math.isclose(float(second_per_grid_ts), expected, rel_tol=1e-6, abs_tol=1e-9):
            raise TimeAxisError(
                f"second_per_grid_ts={float(second_per_grid_ts):.6g} but temporal_patch_size / sample_fps = "
                f"{expected:.6g} (sample_fps={sample_fps:.6g}); the processor did not get the sampling rate "
                f"(transformers 5.x assumes fps=24 for raw frames without video_metadata)")
        if abs(grid_t * float(second_per_grid_ts) - covered_duration) > period + 1e-9:
            raise TimeAxisError(f"grid_T * second_per_grid_ts = {grid_t * float(second_per_grid_ts):.4f}s "
                                f"!= covered duration {covered_duration:.4f}s")
    return modelled


def _transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


def build_video_inputs(
    processor: Any,
    clip: VideoClip | Sequence[VideoClip],
    text: str | Sequence[str] | list[dict],
    model_family: str = "qwen2_5_vl",
    return_tensors: str = "pt",
    padding: bool = True,
    video_time: str | None = None,
    **processor_kwargs: Any,
):
    """Run ``processor`` on sampled clip(s) and prompt text(s) with the correct time axis; verify it.

    Args:
        processor: a Qwen2-VL / Qwen2.5-VL / Qwen3-VL processor (transformers 5.x; 4.57 via ``fps=``).
        clip: one :class:`VideoClip` or a list (one per text).
        text: prompt string(s) already rendered with the chat template, each with exactly one video placeholder
            (``<|vision_start|><|video_pad|><|vision_end|>``); or one chat-message list (rendered here with
            ``add_generation_prompt=True``).
        model_family: "qwen2_5_vl" | "qwen2_vl" | "qwen3_vl" (decides the time contract); with ``video_time``
            any name (it only appears in errors).
        video_time: the time contract, "second_per_grid_ts" | "timestamps" | "none" (a VLM family adapter's
            ``video_time``); ``None`` = ``model_family``'s.
        processor_kwargs: passed through (e.g. ``padding_side``).

    Returns:
        The processor's ``BatchFeature`` (a dict): ``input_ids``, ``attention_mask``, ``mm_token_type_ids``,
        ``pixel_values_videos`` (sum_i T_i*H_i*W_i/196, C*2*14*14), ``video_grid_thw`` (B, 3) and for Qwen2.5-VL
        ``second_per_grid_ts`` (B,) = temporal_patch_size / sample_fps.  Model-ready: ``model(**inputs)``.

    Raises:
        ValueError: unknown family or contract, a processor of another contract, clip resized with the wrong
            ``image_factor``, odd frame count, text/clip count mismatch.
        TimeAxisError: the processor's grid / second_per_grid_ts disagree with the clip's time axis.
    """
    if video_time is None:
        if model_family not in FAMILY_TIME:
            raise ValueError(f"model_family must be one of {MODEL_FAMILIES} (or pass its video_time=), got "
                             f"{model_family!r}")
        video_time = FAMILY_TIME[model_family]
    elif video_time not in TIME_CONTRACTS:
        raise ValueError(f"video_time must be one of {TIME_CONTRACTS}, got {video_time!r}")
    pname = type(processor).__name__
    if pname.startswith("Qwen") and not any(pname.startswith(p) for p, t in PROCESSOR_TIME.items() if t == video_time):
        raise ValueError(f"model_family={model_family!r} (video time contract {video_time!r}) but the processor is "
                         f"a {pname}")
    clips = [clip] if isinstance(clip, VideoClip) else list(clip)
    if isinstance(text, str):
        texts = [text]
    elif text and isinstance(text, list) and isinstance(text[0], dict):
        texts = [processor.apply_chat_template(text, tokenize=False, add_generation_prompt=True)]
    else:
        texts = list(text)
    if len(texts) != len(clips):
        raise ValueError(f"{len(texts)} text(s) for {len(clips)} clip(s): pass one prompt per video")

    vp = processor.video_processor
    tps = int(vp.temporal_patch_size)
    factor = int(vp.patch_size) * int(vp.merge_size)
    video_token = getattr(processor, "video_token", "<|video_pad|>")
    for i, (c, t) in enumerate(zip(clips, texts)):
        if c.image_factor != factor or c.height % factor or c.width % factor:
            raise ValueError(
                f"clip {i} ({c.path or 'frames'}) was resized with image_factor={c.image_factor} to "
                f"{c.height}x{c.width}, but this processor needs multiples of patch_size*merge_size={factor}; "
                f"call load_video(..., image_factor={factor})")
        if c.num_frames % tps:
            raise ValueError(f"clip {i} has {c.num_frames} frames, not a multiple of temporal_patch_size={tps}: "
                             f"the processor would pad it and shift the time axis")
        if t.count(video_token) != 1:
            raise ValueError(f"text {i} must contain exactly one {video_token} placeholder, "
                             f"found {t.count(video_token)}")

    kwargs: dict[str, Any] = dict(do_sample_frames=False, do_resize=False, input_data_format="channels_last")
    if hasattr(vp, "cap_pixels_per_frame"):
        # transformers >= 5.x: qwen-vl-utils' per-frame pixel cap lives inside the processor's resize, which we
        # skip (load_video already sized the frames), so False changes nothing and silences its warning
        kwargs["cap_pixels_per_frame"] = False
    if _transformers_major() >= 5 or video_time == "timestamps":
        kwargs["video_metadata"] = [c.video_metadata() for c in clips]
    if _transformers_major() < 5 and video_time != "timestamps":
        kwargs["fps"] = [c.sample_fps for c in clips]  # 4.x reads second_per_grid_ts from fps
    kwargs.update(processor_kwargs)
    out = processor(text=texts, videos=[c.frames for c in clips], return_tensors=return_tensors,
                    padding=padding, **kwargs)
    out.pop("video_metadata", None)

    grid = out["video_grid_thw"]
    spg = out.get("second_per_grid_ts")
    for i, c in enumerate(clips):
        gt = int(grid[i][0])
        if gt * tps != c.num_frames:
            raise TimeAxisError(f"clip {i}: processor produced grid_T={gt} for {c.num_frames} frames "
                                f"(expected {c.num_frames // tps}); frames were resampled or padded")
        check_time_axis(gt, tps, c.sample_fps, c.covered_duration, c.video_fps,
                        None if spg is None or video_time != "second_per_grid_ts" else float(spg[i]))
    if video_time == "second_per_grid_ts" and spg is None:
        raise TimeAxisError("Qwen2.5-VL processor returned no second_per_grid_ts")
    return out
