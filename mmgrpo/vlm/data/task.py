"""Sample -> prompt item (messages + media through the processor), ground-truth completion, shuffled-frame variant.

Built on ``mmgrpo.vlm.data`` (``build_messages``, ``format_ground_truth_answer``, ``load_jsonl``) and ``mmgrpo.video``
(``load_video`` + ``build_video_inputs``: the fps / time-axis contract). The trainer, the validation and the
evaluation harness prepare every sample through :class:`TaskAdapter`, so all three see the same inputs.  Samples are ``mmgrpo.vlm.data.Sample`` objects (or canonical dicts); in-memory frames may be
given as ``video`` (an array) with ``meta["video_fps"]`` (tests, synthetic data).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

import torch


class MissingMediaError(FileNotFoundError):
    """A sample's video / image file does not exist (or cannot be decoded)."""


class BadSampleError(ValueError):
    """A sample the model cannot take (empty query, prompt over ``data.max_prompt_tokens``, an image the processor
    rejects); the message names the sample.  The trainer skips and counts it, or raises (``data.on_bad_sample``)."""


MAX_ASPECT_RATIO = 200.0  # Qwen-VL processors (smart_resize) reject more elongated images


def to_rgb_image(im: Any, what: str = "image"):
    """A PIL RGB image from a PIL image of any mode or an array (H, W), (H, W, 1|3|4).

    Transparency (RGBA, LA, palette with a transparent colour) is composited onto white -- a plain ``convert``
    would turn transparent pixels black.  16/32-bit and float grayscale are rescaled to 0..255 from their range.
    Raises BadSampleError naming ``what`` for anything else (wrong shape, empty image)."""
    import numpy as np
    from PIL import Image

    if isinstance(im, np.ndarray):
        a = im
        if a.ndim == 3 and a.shape[-1] == 1:
            a = a[..., 0]
        if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[-1] not in (3, 4)) or 0 in a.shape:
            raise BadSampleError(f"{what}: array of shape {a.shape} is not an (H, W[, 1|3|4]) image")
        if a.dtype != np.uint8:
            lo, hi = float(a.min()), float(a.max())
            a = ((a.astype(np.float64) - lo) / (hi - lo) * 255 if hi > lo else np.zeros(a.shape)).round()
            a = a.astype(np.uint8)
        im = Image.fromarray(a)
    if not isinstance(im, Image.Image):
        raise BadSampleError(f"{what}: expected a PIL image, an array or a path, got {type(im).__name__}")
    if im.width < 1 or im.height < 1:
        raise BadSampleError(f"{what}: empty image ({im.width}x{im.height})")
    if im.mode == "RGB":
        return im
    if im.mode == "P" and "transparency" in im.info:
        im = im.convert("RGBA")
    if im.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = im.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    if im.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
        a = np.asarray(im, dtype=np.float64)
        lo, hi = float(a.min()), float(a.max())
        a = (a - lo) / (hi - lo) * 255 if hi > lo else np.zeros(a.shape)
        return Image.fromarray(a.round().astype(np.uint8)).convert("RGB")
    return im.convert("RGB")  # L, 1, P, CMYK, YCbCr, LAB, HSV


def _get(sample: Any, key: str, default: Any = None) -> Any:
    if isinstance(sample, Mapping):
        return sample.get(key, default)
    return getattr(sample, key, default)


def sample_id(sample: Any) -> str:
    return str(_get(sample, "id", "<no id>"))


def as_dict(sample: Any) -> dict:
    """Reward functions take canonical dicts; accept dataclass samples too."""
    if isinstance(sample, Mapping):
        return dict(sample)
    import dataclasses

    if dataclasses.is_dataclass(sample):
        return dataclasses.asdict(sample)
    return dict(vars(sample))


def load_samples(path: str, max_samples: int = 0, media_root: str = "", check_media: bool = False,
                 screen=None, with_report: bool = False):
    """Canonical JSONL -> samples (``mmgrpo.vlm.data.load_jsonl``: errors name file, line, id and field).

    ``check_media``: find every missing video/image before training and raise one error listing them
    (``data.on_missing_media=error``); otherwise missing media are skipped and counted at run time.
    ``screen``: a :class:`mmgrpo.vlm.data.media.MediaScreen`: check the media of the first ``max_samples``
    samples at the header level and their durations (``mmgrpo.vlm.data.media``: skipped and counted, or one error
    listing file:line id field, before the model loads). ``with_report``: return ``(samples, MediaReport or
    None)``."""
    from mmgrpo.vlm.data import load_jsonl

    out, report = load_jsonl(path, root=media_root or None, on_error="raise",
                             check_media=check_media and screen is None)
    out = out[:max_samples] if max_samples else out
    media = None
    if screen is not None:
        from mmgrpo.vlm.data.media import screen_samples

        out, media = screen_samples(out, screen, source=os.fspath(path), lines=report.lines)
    return (out, media) if with_report else out


@dataclass
class PreparedPrompt:
    """One sample, ready for generation: ``item`` is the processor output (batch dim 1)."""

    sample: Any
    item: dict
    clip: Any = None  # mmgrpo.video.VideoClip for video samples
    text: str = ""  # chat-template-rendered prompt
    images: list | None = None
    reward_sample: dict | None = None  # canonical dict for the reward, plus model-input facts (resized image size)
    mode: str | None = None  # prompt mode when a method rebuilt the prompt (None: data.prompt_mode)
    hint: str = ""  # hint a method appended to the user text (TaskAdapter.rebuild)


class TaskAdapter:
    """Builds prompt items for a sample with the policy's processor; one per trainer."""

    def __init__(self, processor, adapter, data_cfg, reward_cfg=None):
        self.processor = processor
        self.adapter = adapter
        self.cfg = data_cfg
        self.task = data_cfg.task
        self.mode = data_cfg.prompt_mode

    # -- prompts -------------------------------------------------------------------------------------------
    @property
    def template(self) -> str:
        """``data.prompt_template``: ``mmgrpo`` (the project's prompt) or a release's (mmgrpo.vlm.data.templates)."""
        return getattr(self.cfg, "prompt_template", "mmgrpo")

    def messages(self, sample: Any, mode: str | None = None, hint: str = "") -> list[dict]:
        """Chat messages of ``sample`` (``mode``: another prompt mode of the project template, e.g. hybrid CoT;
        ``hint`` appended to the user text).  Rollout, training and evaluation all render through here."""
        from mmgrpo.vlm.data.templates import render_messages, template_mode

        mode = mode or self.mode
        if self.template != "mmgrpo" and mode != template_mode(self.template, mode):
            raise ValueError(f"data.prompt_template={self.template} has one prompt mode "
                             f"({template_mode(self.template, mode)}); a method asked for {mode!r} (use "
                             f"data.prompt_template=mmgrpo for methods that switch prompt modes)")
        return render_messages(sample, self.template, mode=mode, answer_format=self.cfg.answer_format,
                               box_frame=self.adapter.family,
                               query_position=getattr(self.cfg, "query_position", "after"), hint=hint)

    def gt_completion(self, sample: Any, item: dict | None = None) -> str:
        """The ground truth as a completion in the format the prompt asks for (TempSamp-R1's off-policy member,
        ``mmgrpo check``); boxes in the model's frame (Qwen2.5-VL: the processor-resized image, from
        ``image_grid_thw``)."""
        from mmgrpo.vlm.data.templates import ground_truth

        kw: dict[str, Any] = {}
        if self.task == "rec":
            kw["box_frame"] = self.adapter.family
            if item is not None and "image_grid_thw" in item:
                _, gh, gw = (int(x) for x in item["image_grid_thw"][0])
                kw["resized_size"] = [gw * self.adapter.patch_size, gh * self.adapter.patch_size]
        return ground_truth(sample, self.template, mode=self.mode, answer_format=self.cfg.answer_format, **kw)

    def image_size_kwargs(self) -> dict:
        """Processor kwargs carrying ``data.image_min_pixels`` / ``image_max_pixels`` (0 = the processor's own
        value for that bound).  Each configured bound reaches the processor on its own: a max without a min used to
        be dropped silently (Video-R1 images then went up to the processor's 12.8 M pixels)."""
        lo, hi = int(self.cfg.image_min_pixels or 0), int(self.cfg.image_max_pixels or 0)
        if lo <= 0 and hi <= 0:
            return {}
        ip = getattr(self.processor, "image_processor", None)
        size = dict(getattr(ip, "size", None) or {})
        lo = lo if lo > 0 else int(size.get("shortest_edge", getattr(ip, "min_pixels", 0) or 0))
        hi = hi if hi > 0 else int(size.get("longest_edge", getattr(ip, "max_pixels", 0) or 0))
        if not lo or not hi:
            raise ValueError(f"data.image_min_pixels / image_max_pixels: the processor {type(ip).__name__} has no "
                             "pixel bounds to complete them (size shortest_edge / longest_edge)")
        if lo > hi:
            raise ValueError(f"image pixel bounds min {lo} > max {hi} (data.image_min_pixels="
                             f"{self.cfg.image_min_pixels}, data.image_max_pixels={self.cfg.image_max_pixels}; 0 = "
                             "the processor's own): set both")
        return {"size": {"shortest_edge": lo, "longest_edge": hi}}

    def _path(self, p: Any) -> Any:
        if isinstance(p, (str, os.PathLike)):
            p = os.fspath(p)
            if p.startswith("file://"):
                p = p[7:]
            if self.cfg.media_root and not os.path.isabs(p):
                p = os.path.join(self.cfg.media_root, p)
            if not os.path.exists(p):
                raise MissingMediaError(f"sample media not found: {p}")
        return p

    def _load_clip(self, sample: Any):
        from mmgrpo.video.clip import load_video

        v = self._path(_get(sample, "video"))
        kw = dict(fps=self.cfg.video_fps, min_frames=self.cfg.min_frames, max_frames=self.cfg.max_frames,
                  min_pixels=self.cfg.video_min_pixels, max_pixels=self.cfg.video_max_pixels,
                  total_pixels=self.cfg.video_total_pixels, image_factor=self.adapter.patch_size * 2,
                  video_start=_get(sample, "video_start"), video_end=_get(sample, "video_end"),
                  decode_threads=getattr(self.cfg, "decode_threads", 0))
        meta = _get(sample, "meta") or {}
        vfps = _get(sample, "video_fps", meta.get("video_fps"))
        if not isinstance(v, str) and vfps is not None:
            kw["video_fps"] = float(vfps)
        mfp = getattr(self.cfg, "max_video_frame_pixels", None)
        if mfp is not None:
            kw["max_frame_pixels"] = mfp
        from mmgrpo.video import VideoError

        try:
            return load_video(v, **kw)
        except FileNotFoundError as e:
            raise MissingMediaError(f"sample {sample_id(sample)}: {e}") from e
        except VideoError as e:  # decode errors of a present file, frames over the decode cap: this sample's media
            raise MissingMediaError(f"sample {sample_id(sample)}: {e}") from e

    def _load_images(self, sample: Any) -> list:
        """RGB PIL images of the sample (any mode / array converted, see ``to_rgb_image``); an aspect ratio the
        processor cannot resize raises BadSampleError naming the sample."""
        from PIL import Image

        from mmgrpo.utils.media_check import DEFAULT_MAX_IMAGE_PIXELS

        imgs = _get(sample, "image")
        imgs = imgs if isinstance(imgs, (list, tuple)) else [imgs]
        out = []
        for k, im in enumerate(imgs):
            src = im if isinstance(im, (str, os.PathLike)) else f"image {k}"
            im = self._path(im)
            if isinstance(im, str):
                cap = getattr(self.cfg, "max_image_pixels", None) or DEFAULT_MAX_IMAGE_PIXELS
                try:
                    with Image.open(im) as f:
                        if f.width * f.height > cap:  # from the header, before the pixels are decoded
                            raise MissingMediaError(f"sample {sample_id(sample)}: image {im} of {f.width}x{f.height} "
                                                    f"pixels exceeds data.max_image_pixels={cap:,}")
                        f.load()
                        im = f.copy()
                except MissingMediaError:
                    raise
                except (OSError, Image.DecompressionBombError, SyntaxError, ValueError) as e:
                    # DecompressionBombError (a 24 kB PNG claiming 196 MP) is not an OSError: it used to end the run
                    raise MissingMediaError(f"sample {sample_id(sample)}: cannot read image {im}: "
                                            f"{type(e).__name__}: {e}") from e
            im = to_rgb_image(im, f"sample {sample_id(sample)}: {src}")
            ar = max(im.width, im.height) / min(im.width, im.height)
            if ar > MAX_ASPECT_RATIO:
                raise BadSampleError(f"sample {sample_id(sample)}: {src} is {im.width}x{im.height} (aspect ratio "
                                     f"{ar:.0f} > {MAX_ASPECT_RATIO:.0f}, which Qwen-VL processors cannot resize)")
            out.append(im)
        return out

    def prepare(self, sample: Any) -> PreparedPrompt:
        """Processor inputs of one sample.  Raises MissingMediaError (media absent / undecodable) or
        BadSampleError (empty query, image the processor cannot take, prompt over ``data.max_prompt_tokens``
        tokens counting vision tokens), both naming the sample."""
        q = _get(sample, "query")
        if not isinstance(q, str) or not q.strip():
            raise BadSampleError(f"sample {sample_id(sample)}: empty query {q!r}")
        pp = self._prepare(sample)
        n_tok = int(pp.item["input_ids"].shape[-1])
        limit = getattr(self.cfg, "max_prompt_tokens", 0)
        if limit and n_tok > limit:
            raise BadSampleError(f"sample {sample_id(sample)}: prompt of {n_tok} tokens (text + vision) exceeds "
                                 f"data.max_prompt_tokens={limit}")
        rs = {k: v for k, v in as_dict(sample).items() if k not in ("video", "image")}  # no pixel copies
        if "image_grid_thw" in pp.item and pp.item["image_grid_thw"].shape[0] == 1:
            # boxes of Qwen2.5-VL live in the processor-resized image: W_r = grid_w * patch, H_r = grid_h * patch
            _, gh, gw = (int(x) for x in pp.item["image_grid_thw"][0])
            rs.setdefault("resized_image_size", [gw * self.adapter.patch_size, gh * self.adapter.patch_size])
            if rs.get("image_size") is None and pp.images:
                rs["image_size"] = list(pp.images[0].size)
        pp.reward_sample = rs
        return pp

    def _prepare(self, sample: Any) -> PreparedPrompt:
        msgs = self.messages(sample)
        text = self.processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        if _get(sample, "video") is not None:
            from mmgrpo.video.processor import build_video_inputs

            clip = self._load_clip(sample)
            item = build_video_inputs(self.processor, clip, text, self.adapter.family,
                                        video_time=self.adapter.video_time)
            return PreparedPrompt(sample, _tensors(item), clip=clip, text=text)
        if _get(sample, "image") is not None:
            imgs = self._load_images(sample)
            kw = self.image_size_kwargs()
            try:
                item = self.processor(text=[text], images=imgs, return_tensors="pt", **kw)
            except Exception as e:  # the processor's own checks (sizes, ratios) do not name the sample
                raise BadSampleError(f"sample {sample_id(sample)}: the processor rejected its image(s) "
                                     f"{[(im.width, im.height) for im in imgs]}: {type(e).__name__}: {e}") from e
            return PreparedPrompt(sample, _tensors(item), text=text, images=imgs)
        item = self.processor(text=[text], return_tensors="pt")
        return PreparedPrompt(sample, _tensors(item), text=text)

    def rebuild(self, prep: PreparedPrompt, mode: str | None = None, hint: str = "", frames: Any = None,
                images: list | None = None) -> PreparedPrompt:
        """A new PreparedPrompt of the same sample from the media already decoded in ``prep``: another prompt
        mode (system prompt), a ``hint`` appended to the user text, other video ``frames`` (same count and time
        axis) or other ``images``; mode and hint default to those of an earlier rebuild. The reward sample is
        shared (the ground truth does not change)."""
        import dataclasses

        mode = mode or prep.mode or self.mode
        hint = hint or prep.hint
        # the same rendering as prepare() (template, query_position), plus the mode / hint of the method
        msgs = self.messages(prep.sample, mode=mode, hint=hint)
        text = self.processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        if prep.clip is not None:
            from mmgrpo.video.processor import build_video_inputs

            clip = prep.clip if frames is None else dataclasses.replace(prep.clip, frames=frames)
            item = _tensors(build_video_inputs(self.processor, clip, text, self.adapter.family,
                                               video_time=self.adapter.video_time))
            return dataclasses.replace(prep, item=item, clip=clip, text=text, mode=mode, hint=hint)
        if prep.images:
            imgs = prep.images if images is None else images
            item = _tensors(self.processor(text=[text], images=imgs, return_tensors="pt", **self.image_size_kwargs()))
            return dataclasses.replace(prep, item=item, text=text, images=imgs, mode=mode, hint=hint)
        item = _tensors(self.processor(text=[text], return_tensors="pt"))
        return dataclasses.replace(prep, item=item, text=text, mode=mode, hint=hint)

    def shuffled(self, prep: PreparedPrompt, generator: torch.Generator) -> dict | None:
        """T-GRPO: the same prompt with the video's frames in a random order (time metadata unchanged).

        Frames are permuted in pairs-free fashion at the frame level, as Video-R1 does; returns None for
        non-video prompts."""
        if prep.clip is None:
            return None
        import dataclasses

        from mmgrpo.video.processor import build_video_inputs

        perm = torch.randperm(prep.clip.num_frames, generator=generator)
        frames = prep.clip.frames[perm] if isinstance(prep.clip.frames, torch.Tensor) else prep.clip.frames[perm.numpy()]
        clip = dataclasses.replace(prep.clip, frames=frames)
        return _tensors(build_video_inputs(self.processor, clip, prep.text, self.adapter.family,
                                           video_time=self.adapter.video_time))


def _tensors(batch) -> dict:
    return {k: v for k, v in dict(batch).items() if isinstance(v, torch.Tensor)}
