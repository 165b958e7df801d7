"""The video contract: decode -> sample frames -> resize -> processor inputs with the correct MRoPE time axis.

Public API (stable; the trainer, rollout and evaluation all go through these two functions)::

    from mmgrpo.video import load_video, build_video_inputs, VideoClip, VideoError

    clip = load_video(path_or_frames, fps=2.0, min_frames=4, max_frames=768,
                      min_pixels=None, max_pixels=None, total_pixels=None,
                      video_start=None, video_end=None, backend="auto",   # "auto" | "decord" | "pyav"
                      image_factor=28,                                   # 32 for Qwen3-VL (patch 16)
                      nframes=None, video_fps=None)                      # fixed frame count; fps of a frame list
    clip.frames          # torch.uint8 (T, H, W, 3); T even; H, W multiples of image_factor
    clip.frame_indices   # T absolute indices into the decoded video
    clip.timestamps      # T absolute seconds = frame_indices / video_fps
    clip.sample_fps      # T / N * video_fps, N = decoded frames in the clip range
    clip.video_fps, clip.total_frames, clip.duration (whole video, s), clip.clip_start, clip.clip_end (s)
    clip.covered_duration == clip.clip_end - clip.clip_start == T / sample_fps
    clip.second_per_grid_ts(2) == 2 / sample_fps;  clip.video_metadata() -> transformers VideoMetadata

    inputs = build_video_inputs(processor, clip, text, model_family="qwen2_5_vl")  # | "qwen2_vl" | "qwen3_vl"
    model(**inputs)      # input_ids, attention_mask, mm_token_type_ids, pixel_values_videos, video_grid_thw,
                         # second_per_grid_ts (Qwen2.5-VL)

Rules (bit-identical to qwen-vl-utils 0.0.14 ``fetch_video`` on the decord path; tested against it):

* clip range: ``start = ceil(video_start * f_v)``, ``end = min(floor(video_end * f_v), total - 1)``; N = end-start+1.
* frames: ``n = floor2(min(max(N / f_v * fps, ceil2(min_frames)), floor2(max_frames), N))``;
  indices ``round(linspace(start, end, n))``; ``sample_fps = n / N * f_v``.
* pixels per frame: ``max_px = max(min(768 F^2, total_pixels / n * 2), 1.05 min_pixels)`` (capped by max_pixels);
  smart_resize to multiples of F, bicubic + antialias.
* a list of frames (PIL / HxWx3 arrays) or a (T, H, W, 3) array is a decoded video at ``video_fps`` (default: fps)
  and goes through the same rules (unlike qwen-vl-utils, which pads a frame list and resizes it twice).
* Qwen2.5-VL time axis: temporal position of grid slice k = ``floor(k * 2 / sample_fps * tokens_per_second)``,
  counted from the *clip start*; Qwen3-VL ``<t seconds>`` text uses absolute ``frames_indices / video_fps``;
  Qwen2-VL has no time axis (one position per slice).  Predictions relative to a clip must add ``clip_start``.
* ``build_video_inputs`` passes ``video_metadata``, ``do_sample_frames=False`` and ``do_resize=False`` and raises
  :class:`TimeAxisError` unless ``grid_T * 2 / sample_fps`` matches the covered duration within one frame period.

Errors: a missing / empty / corrupt / truncated file, a file without a video stream, zero frames or an empty clip
raise :class:`VideoError` whose message starts with the path.
Frames larger than ``max_frame_pixels`` (default :data:`MAX_FRAME_PIXELS`, 8K UHD) raise :class:`VideoTooLarge` from
the container header, before decoding.
Helpers: :func:`probe_video` (frame count, fps, size), :func:`probe_header` (the header alone, no decoding), :func:`write_video` (PyAV mp4 writer),
:mod:`mmgrpo.video.sampling` (the pure rules), :mod:`mmgrpo.video.testing` (index-coded test videos).
"""
from .clip import VideoClip, load_video
from .decode import MAX_FRAME_PIXELS, VideoError, VideoHeader, VideoInfo, VideoTooLarge, probe_header, probe_video
from .processor import MODEL_FAMILIES, TimeAxisError, build_video_inputs, check_time_axis
from .sampling import clip_frame_range, sample_frame_indices, smart_nframes, smart_resize, video_max_pixels
from .writer import write_video

__all__ = [
    "VideoClip", "load_video", "VideoError", "VideoInfo", "probe_video", "MAX_FRAME_PIXELS", "VideoHeader",
    "VideoTooLarge", "probe_header", "MODEL_FAMILIES", "TimeAxisError",
    "build_video_inputs", "check_time_axis", "clip_frame_range", "sample_frame_indices", "smart_nframes",
    "smart_resize", "video_max_pixels", "write_video",
]
