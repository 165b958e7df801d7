"""Frame-count, clip-range and resolution rules of qwen-vl-utils (0.0.14), re-stated as small pure functions.

These are the numbers the Qwen-VL models were trained with; matching them exactly is what makes the MRoPE time
axis and the token count of a video identical between our trainer, our rollout and the reference preprocessing.

Notation: ``N`` = number of decoded frames in the clip range, ``f_v`` = the container's average fps,
``f`` = requested sampling fps, ``n`` = number of sampled frames.

* clip range (``video_start``/``video_end`` in seconds, clamped to [0, total/f_v]):
  ``start = ceil(video_start * f_v)``, ``end = min(floor(video_end * f_v), total - 1)``; N = end - start + 1.
* frame count: ``n = floor2(min(max(N / f_v * f, ceil2(min_frames)), floor2(max_frames), N))``
  (``nframes`` given instead: ``n = round2(nframes)``); must satisfy 2 <= n <= N.
* indices: ``round(linspace(start, end, n))`` (torch float32 linspace, round half to even, as the reference).
* effective sampling rate: ``sample_fps = n / N * f_v``; so ``n / sample_fps = N / f_v`` = the covered duration.
* per-frame pixel budget: ``max_px = max(min(768 F^2, total_pixels / n * 2), int(1.05 * min_pixels))``,
  then ``min(max_pixels, max_px)`` if a max_pixels was given; F = image_factor (28 for Qwen2/2.5-VL, 32 for
  Qwen3-VL); defaults min_pixels = 128 F^2, total_pixels = 128000 * 0.9 * F^2.
* size: :func:`smart_resize` keeps the aspect ratio with both sides multiples of F and h*w in [min_px, max_px].
"""
from __future__ import annotations

import math

FRAME_FACTOR = 2  # frames are paired by the temporal patch (temporal_patch_size = 2)
FPS = 2.0
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768
VIDEO_MIN_TOKEN_NUM = 128
VIDEO_MAX_TOKEN_NUM = 768
MODEL_SEQ_LEN = 128000
MAX_RATIO = 200


def round_by_factor(x: float, factor: int) -> int:
    return round(x / factor) * factor


def ceil_by_factor(x: float, factor: int) -> int:
    return math.ceil(x / factor) * factor


def floor_by_factor(x: float, factor: int) -> int:
    return math.floor(x / factor) * factor


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int | None = None,
                 max_pixels: int | None = None) -> tuple[int, int]:
    """(h, w), both multiples of ``factor``, aspect ratio kept, ``min_pixels <= h*w <= max_pixels``.

    Defaults (images): min_pixels = 4 F^2, max_pixels = 16384 F^2.  Raises ValueError for an aspect ratio > 200
    or max_pixels < min_pixels.
    """
    max_pixels = max_pixels if max_pixels is not None else 16384 * factor ** 2
    min_pixels = min_pixels if min_pixels is not None else 4 * factor ** 2
    if max_pixels < min_pixels:
        raise ValueError(f"max_pixels ({max_pixels}) must be >= min_pixels ({min_pixels})")
    if min(height, width) <= 0:
        raise ValueError(f"frame size must be positive, got {height}x{width}")
    if max(height, width) / min(height, width) > MAX_RATIO:
        raise ValueError(f"aspect ratio must be < {MAX_RATIO}, got {max(height, width) / min(height, width):.1f}")
    h_bar = max(factor, round_by_factor(height, factor))
    w_bar = max(factor, round_by_factor(width, factor))
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        # max(factor, .): the reference returns a 0-pixel side for very elongated frames; we keep one patch row.
        h_bar = max(factor, floor_by_factor(height / beta, factor))
        w_bar = max(factor, floor_by_factor(width / beta, factor))
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = ceil_by_factor(height * beta, factor)
        w_bar = ceil_by_factor(width * beta, factor)
    return h_bar, w_bar


def clip_frame_range(total_frames: int, video_fps: float, video_start: float | None = None,
                     video_end: float | None = None) -> tuple[int, int]:
    """Inclusive decoded-frame range ``(start, end)`` covering [video_start, video_end] seconds.

    Times are clamped to [0, total_frames / video_fps]; start rounds up, end rounds down (a frame is in the clip
    only if its timestamp ``i / video_fps`` lies inside the requested range).  Raises ValueError if empty.
    """
    if video_fps <= 0:
        raise ValueError(f"video fps must be positive, got {video_fps}")
    if total_frames <= 0:
        raise ValueError(f"video has no frames (total_frames={total_frames})")
    if video_start is None and video_end is None:
        return 0, total_frames - 1
    max_duration = total_frames / video_fps
    start = 0
    if video_start is not None:
        start = math.ceil(max(0.0, min(float(video_start), max_duration)) * video_fps)
    end = total_frames - 1
    if video_end is not None:
        end = min(math.floor(max(0.0, min(float(video_end), max_duration)) * video_fps), total_frames - 1)
    if start >= end:
        raise ValueError(
            f"empty clip: video_start={video_start}s -> frame {start}, video_end={video_end}s -> frame {end} "
            f"(video: {total_frames} frames at {video_fps:g} fps = {max_duration:.3f}s)")
    return start, end


def smart_nframes(num_frames: int, video_fps: float, fps: float = FPS, min_frames: int = FPS_MIN_FRAMES,
                  max_frames: int = FPS_MAX_FRAMES, nframes: int | None = None) -> int:
    """Number of frames to sample from a clip of ``num_frames`` decoded frames at ``video_fps`` (module doc)."""
    if nframes is not None:
        n = round_by_factor(nframes, FRAME_FACTOR)
    else:
        lo = ceil_by_factor(min_frames, FRAME_FACTOR)
        hi = floor_by_factor(max_frames, FRAME_FACTOR)
        n = num_frames / video_fps * fps
        n = min(min(max(n, lo), hi), num_frames)
        n = floor_by_factor(n, FRAME_FACTOR)
    if not (FRAME_FACTOR <= n <= num_frames):
        raise ValueError(f"cannot sample {n} frames from a clip of {num_frames} frames "
                         f"(need {FRAME_FACTOR} <= nframes <= clip frames)")
    return int(n)


def sample_frame_indices(start: int, end: int, n: int) -> list[int]:
    """``round(linspace(start, end, n))`` exactly as the reference computes it (torch float32)."""
    import torch

    return torch.linspace(start, end, n).round().long().tolist()


def video_max_pixels(nframes: int, image_factor: int = 28, min_pixels: int | None = None,
                     max_pixels: int | None = None, total_pixels: float | None = None) -> tuple[int, float]:
    """Per-frame ``(min_pixels, max_pixels)`` for a video of ``nframes`` sampled frames (module doc)."""
    f2 = image_factor * image_factor
    min_px = min_pixels if min_pixels is not None else VIDEO_MIN_TOKEN_NUM * f2
    total_px = total_pixels if total_pixels is not None else MODEL_SEQ_LEN * f2 * 0.9
    max_px = max(min(VIDEO_MAX_TOKEN_NUM * f2, total_px / nframes * FRAME_FACTOR), int(min_px * 1.05))
    if max_pixels is not None:
        max_px = min(max_pixels, max_px)
    if max_px < min_px:
        raise ValueError(f"max_pixels ({max_px}) must be >= min_pixels ({min_px})")
    return min_px, max_px
