"""Images and videos through one code path: layouts, frame flattening, frame strips and grids.

Layouts (what ``adapter.decode`` returns, what rewards and grids take):

* image batch: uint8 (B, H, W, 3)
* video batch: uint8 (B, F, H, W, 3)  (frames in time order; Wan decodes ``F = 4 (F' - 1) + 1`` frames)

Latents are whatever the adapter's model space is ((B, C, h, w), packed (B, L, D), or video (B, C, F', h, w)); the
SDE kernel (:mod:`flow_grpo.sde`) is elementwise with a per-sample mean over all non-batch dimensions, so it needs
no layout information. A video is shown as a *frame strip*: its frames side by side in time order, left to right.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import torch

ImageBatch = Union["torch.Tensor", np.ndarray, Sequence[Any]]


# ----------------------------------------------------------------------------------------------------------
# image batches
# ----------------------------------------------------------------------------------------------------------
_FLOAT_TOL = 1e-3  # decoders overshoot [0, 1] by rounding error; anything beyond this is a range bug


def to_uint8_nhwc(images: ImageBatch) -> np.ndarray:
    """Convert a batch of images to a contiguous ``numpy.uint8`` array of shape (N, H, W, 3).

    Accepted: uint8 NHWC (torch/numpy), float NCHW in [0, 1] (torch/numpy; float16/bfloat16/float32/float64),
    a list of PIL images of equal size.  Float -> uint8 is ``round(clip(x, 0, 1) * 255)``.
    The result never aliases the input (safe to hand to a background thread).
    """
    if isinstance(images, (list, tuple)):
        return _pil_list_to_uint8(images)
    arr: np.ndarray
    if hasattr(images, "detach") and hasattr(images, "dtype"):  # torch.Tensor without importing torch
        t = images.detach()
        if t.is_floating_point():
            t = t.float()
        arr = t.cpu().numpy()
    elif isinstance(images, np.ndarray):
        arr = images
    else:
        raise TypeError(f"images: expected torch.Tensor, numpy.ndarray or list of PIL images, got {type(images)!r}")
    if arr.ndim != 4:
        raise ValueError(f"images: expected a 4-d batch (N,H,W,C) uint8 or (N,C,H,W) float, got shape {arr.shape}")
    if arr.dtype == np.uint8:
        if arr.shape[-1] not in (1, 3):
            raise ValueError(
                f"images: uint8 images must be NHWC with C in (1, 3), got shape {arr.shape}"
                + (" (looks like NCHW: uint8 must be NHWC)" if arr.shape[1] in (1, 3) else ""))
        if arr.shape[-1] == 1:
            arr = np.repeat(arr, 3, axis=-1)
        return np.ascontiguousarray(arr).copy()
    if np.issubdtype(arr.dtype, np.floating):
        if arr.shape[1] not in (1, 3):
            raise ValueError(f"images: float images must be NCHW with C in (1, 3) and values in [0, 1], "
                             f"got shape {arr.shape}")
        arr = arr.astype(np.float32, copy=False)
        finite = np.isfinite(arr)
        if not finite.all():
            bad = np.nonzero(~finite.reshape(arr.shape[0], -1).all(axis=1))[0].tolist()
            raise ValueError(f"images: non-finite pixel values in samples {bad}")
        lo, hi = float(arr.min()), float(arr.max())
        if lo < -_FLOAT_TOL or hi > 1 + _FLOAT_TOL:
            raise ValueError(f"images: float images must be in [0, 1], got range [{lo:.4g}, {hi:.4g}] "
                             "(a [-1, 1] VAE output needs (x + 1) / 2 first)")
        out = np.rint(np.clip(arr, 0.0, 1.0) * 255.0).astype(np.uint8)
        out = np.transpose(out, (0, 2, 3, 1))
        if out.shape[-1] == 1:
            out = np.repeat(out, 3, axis=-1)
        return np.ascontiguousarray(out)
    raise TypeError(f"images: unsupported dtype {arr.dtype} (use uint8 NHWC or float NCHW in [0, 1])")


def _pil_list_to_uint8(images: Sequence[Any]) -> np.ndarray:
    if len(images) == 0:
        raise ValueError("images: empty list")
    arrs = []
    for i, im in enumerate(images):
        if not hasattr(im, "convert") or not hasattr(im, "size"):
            raise TypeError(f"images[{i}]: a list must hold PIL images, got {type(im)!r}")
        a = np.asarray(im.convert("RGB"), dtype=np.uint8)
        if arrs and a.shape != arrs[0].shape:
            raise ValueError(f"images[{i}]: size {a.shape[1]}x{a.shape[0]} differs from images[0] "
                             f"{arrs[0].shape[1]}x{arrs[0].shape[0]}; resize before scoring")
        arrs.append(a)
    return np.ascontiguousarray(np.stack(arrs, axis=0))


def _numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def media_kind(batch: Any) -> str:
    """``"image"`` for a (B, H, W, C) batch, ``"video"`` for a (B, F, H, W, C) batch; anything else raises."""
    nd = len(batch.shape)
    if nd == 4:
        return "image"
    if nd == 5:
        return "video"
    raise ValueError(f"expected images (B, H, W, C) or videos (B, F, H, W, C), got shape {tuple(batch.shape)}")


def check_video(videos: Any, name: str = "videos") -> np.ndarray:
    """``videos`` as a uint8 numpy array (B, F, H, W, 3) (C=1 broadcast to 3); clear errors otherwise."""
    arr = _numpy(videos)
    if arr.ndim != 5:
        raise ValueError(f"{name}: expected a uint8 video batch (B, F, H, W, 3), got shape {arr.shape}"
                         + (" (an image batch: use an image reward)" if arr.ndim == 4 else ""))
    if arr.dtype != np.uint8:
        raise ValueError(f"{name}: expected uint8 frames (adapter.decode's output), got {arr.dtype}")
    if arr.shape[-1] not in (1, 3):
        raise ValueError(f"{name}: frames must be HWC with C in (1, 3), got shape {arr.shape}"
                         + (" (looks like (B, C, F, H, W): permute to (B, F, H, W, C))" if arr.shape[1] in (1, 3) else ""))
    if arr.shape[1] < 1:
        raise ValueError(f"{name}: a video needs at least one frame, got shape {arr.shape}")
    if arr.shape[-1] == 1:
        arr = np.repeat(arr, 3, axis=-1)
    return arr


def to_uint8_videos(videos: Any, name: str = "videos") -> np.ndarray:
    """A batch of videos as uint8 (B, F, H, W, 3), never aliasing the input: uint8 (B, F, H, W, 3|1) (checked by
    :func:`check_video`), float (B, F, 3|1, H, W) in [0, 1] (numpy or torch; converted frame by frame with the
    image path's checks, :func:`to_uint8_nhwc`), or a list of B clips of one shape.
    ``name`` starts the error messages."""
    if isinstance(videos, (list, tuple)):
        arrs = [_numpy(v) for v in videos]
        if not arrs or any(a.shape != arrs[0].shape for a in arrs):
            raise ValueError(f"{name}: a list needs B >= 1 clips of one shape, got {[a.shape for a in arrs]}")
        videos = np.stack(arrs)
    if hasattr(videos, "detach"):
        videos = videos.detach().cpu()
        videos = (videos.float() if videos.is_floating_point() else videos).numpy()
    v = np.asarray(videos)
    if v.ndim != 5:
        raise ValueError(f"{name}: expected a video batch (5-d), uint8 (B, F, H, W, 3) or float (B, F, 3, H, W), got "
                         f"shape {v.shape}" + (" (an image batch: use an image reward)" if v.ndim == 4 else ""))
    if v.dtype == np.uint8:
        return np.ascontiguousarray(check_video(v, name)).copy()
    b, f = v.shape[:2]
    flat = to_uint8_nhwc(v.reshape(b * f, *v.shape[2:]))
    return flat.reshape(b, f, *flat.shape[1:])


def is_video_batch(batch: Any) -> bool:
    """A 5-d array / tensor, or a list of 4-d clips."""
    if isinstance(batch, (list, tuple)):
        return len(batch) > 0 and getattr(batch[0], "ndim", None) == 4
    return getattr(batch, "ndim", None) == 5


def to_uint8_media(batch: Any, accepts_video: bool = False, video_only: bool = False, name: str = "videos"
                   ) -> np.ndarray:
    """The one input converter of the rewards (``Reward.evaluate``, ``AsyncRewardRunner``): videos through
    :func:`to_uint8_videos` when ``video_only``, or when ``accepts_video`` and the batch is videos; anything else
    as images (uint8 (B, H, W, 3), :func:`to_uint8_nhwc`)."""
    if video_only or (accepts_video and is_video_batch(batch)):
        return to_uint8_videos(batch, name)
    return to_uint8_nhwc(batch)


def flatten_frames(videos: Any) -> tuple[np.ndarray, int]:
    """(B, F, H, W, 3) -> ((B*F, H, W, 3) frames, sample-major: frames of sample 0 first; F)."""
    arr = check_video(videos)
    b, f = arr.shape[:2]
    return np.ascontiguousarray(arr.reshape(b * f, *arr.shape[2:])), f


def strip_frame_indices(num_frames: int, max_frames: Optional[int] = None) -> list[int]:
    """Frames shown in a strip: all of them, or ``max_frames`` evenly spaced ones including the first and last."""
    if max_frames is None or max_frames >= num_frames:
        return list(range(num_frames))
    if max_frames < 1:
        raise ValueError(f"max_frames must be >= 1, got {max_frames}")
    if max_frames == 1:
        return [0]
    return sorted({round(i * (num_frames - 1) / (max_frames - 1)) for i in range(max_frames)})


def frame_strip(video: Any, max_frames: Optional[int] = None, gap: int = 2) -> np.ndarray:
    """One video (F, H, W, 3) uint8 -> a strip (H, n W + (n - 1) gap, 3): its frames left to right in time order,
    separated by ``gap`` white columns."""
    arr = check_video(_numpy(video)[None], "video")[0]
    idx = strip_frame_indices(arr.shape[0], max_frames)
    h, w = arr.shape[1:3]
    out = np.full((h, len(idx) * w + (len(idx) - 1) * gap, 3), 255, dtype=np.uint8)
    for j, f in enumerate(idx):
        out[:, j * (w + gap): j * (w + gap) + w] = arr[f]
    return out


def save_frame_strips(videos: Any, directory: str | os.PathLike, prefix: str = "sample",
                      max_frames: Optional[int] = None) -> list[Path]:
    """One PNG frame strip per sample: ``{directory}/{prefix}_{i:03d}.png``. Returns the paths."""
    from PIL import Image

    arr = check_video(videos)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(arr.shape[0]):
        p = d / f"{prefix}_{i:03d}.png"
        Image.fromarray(frame_strip(arr[i], max_frames)).save(p)
        paths.append(p)
    return paths


def save_media_grid(media: Any, path: str | os.PathLike, nrow: int = 4, captions: Optional[Sequence[str]] = None,
                    max_frames: Optional[int] = 8, **grid_kwargs: Any) -> Path:
    """A PNG grid of a batch of images (``nrow`` per row) or videos (one frame strip per row, at most
    ``max_frames`` frames each), captions under each tile; ``grid_kwargs`` (e.g. ``min_tile``) go to
    :func:`mmgrpo.utils.logging.save_image_grid`."""
    from mmgrpo.utils.logging import save_image_grid

    if media_kind(media) == "image":
        return save_image_grid(media, path, nrow=nrow, captions=captions, **grid_kwargs)
    arr = check_video(media)
    strips = [frame_strip(v, max_frames) for v in arr]
    return save_image_grid(strips, path, nrow=1, captions=captions, **grid_kwargs)
