"""Synthetic temporal-grounding benchmark: coloured shapes appear, move and disappear on a flat background.

Each video (4-12 s, 4-10 fps, 64x64 or 96x64, H.264 mp4 written with PyAV) holds 1-3 events.  An event is one
shape of a colour and a kind that no other event in the video has; it is visible on frames ``a..b`` (inclusive)
and moves horizontally inside its own lane, so shapes never occlude each other.  Ground truth:

    span = [a / fps, (b + 1) / fps]   seconds (the display interval of the visible frames)
    duration = num_frames / fps

Tasks written (canonical JSONL, paths relative to the JSONL's folder):

* ``{split}.jsonl``      -- tvg: "When does the red circle appear?" -> span.
* ``{split}_mcq.jsonl``  -- (``mcq=True``) mcq: "What colour is the circle that appears in the video?" with 4
  colour options.

``generate(out_dir, n_train, n_eval, seed)`` is deterministic given the seed; train and held-out ("eval") videos
come from independent random streams and are different files; no (video, query) pair is shared.  "Same video" means
same *content*: :func:`frames_digest` hashes the rendered frames, which is what ``generate`` reports per video
(``frame_digests``).  The mp4 bytes are an encoder artefact and are not part of that contract.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

from mmgrpo.synthetic.shapes import BACKGROUND, COLOURS, SHAPES, _shape_mask

SIZES = ((64, 64), (96, 64))  # (width, height)
FPS_CHOICES = (4.0, 5.0, 6.0, 8.0, 10.0)
SHAPE_SIZE = 14  # pixels; large enough to survive 4:2:0 chroma subsampling
QUERY_TEMPLATES = (
    "When does the {colour} {shape} appear?",
    "During which part of the video is the {colour} {shape} visible?",
    "When can the {colour} {shape} be seen?",
)


@dataclass(frozen=True)
class Event:
    colour: str
    shape: str
    first_frame: int  # a: first visible frame
    last_frame: int  # b: last visible frame (inclusive)
    lane: int
    x0: float
    x1: float

    def span(self, fps: float) -> list[float]:
        return [self.first_frame / fps, (self.last_frame + 1) / fps]


@dataclass(frozen=True)
class VideoSpec:
    name: str
    fps: float
    num_frames: int
    width: int
    height: int
    events: tuple

    @property
    def duration(self) -> float:
        return self.num_frames / self.fps


def render_frame(spec: VideoSpec, k: int):
    """uint8 (H, W, 3) frame ``k`` of ``spec``."""
    import numpy as np

    img = np.empty((spec.height, spec.width, 3), np.uint8)
    img[:] = BACKGROUND
    lane_h = spec.height // 3
    for ev in spec.events:
        if not ev.first_frame <= k <= ev.last_frame:
            continue
        span = max(ev.last_frame - ev.first_frame, 1)
        t = (k - ev.first_frame) / span
        x = int(round(ev.x0 + (ev.x1 - ev.x0) * t))
        y = ev.lane * lane_h + (lane_h - SHAPE_SIZE) // 2
        m = _shape_mask(ev.shape, SHAPE_SIZE)
        region = img[y:y + SHAPE_SIZE, x:x + SHAPE_SIZE]
        region[m[: region.shape[0], : region.shape[1]]] = COLOURS[ev.colour]
    return img


def sample_spec(rng, name: str) -> VideoSpec:
    """One random video: duration 4-12 s, fps from FPS_CHOICES, 1-3 events with distinct colours and shapes."""
    fps = float(rng.choice(FPS_CHOICES))
    duration = float(rng.uniform(4.0, 12.0))
    n = int(round(duration * fps))
    width, height = SIZES[int(rng.integers(len(SIZES)))]
    n_events = int(rng.integers(1, 4))
    colours = rng.choice(list(COLOURS), size=n_events, replace=False)
    shapes = rng.choice(list(SHAPES), size=n_events, replace=False)
    lanes = rng.permutation(3)[:n_events]
    min_len = max(2, int(round(1.0 * fps)))  # at least 1 s visible
    events = []
    for c, s, lane in zip(colours, shapes, lanes):
        length = int(rng.integers(min_len, max(min_len + 1, int(0.6 * n)) + 1))
        length = min(length, n)
        a = int(rng.integers(0, n - length + 1))
        b = a + length - 1
        xmax = width - SHAPE_SIZE
        x0, x1 = float(rng.uniform(0, xmax)), float(rng.uniform(0, xmax))
        events.append(Event(str(c), str(s), a, b, int(lane), x0, x1))
    return VideoSpec(name, fps, n, width, height, tuple(events))


def write_spec_video(spec: VideoSpec, path: str) -> str:
    from mmgrpo.video.writer import write_video

    return write_video(path, (render_frame(spec, k) for k in range(spec.num_frames)), spec.fps, crf=10)


def frames_digest(spec: VideoSpec) -> str:
    """Content digest of one video: SHA-256 (hex) of ``repr((fps, num_frames, width, height))`` followed by the raw
    uint8 bytes of ``render_frame(spec, k)`` for k = 0 .. num_frames - 1 (each frame H x W x 3, C order).

    Two specs have the same digest iff they render the same pixels at the same frame rate; ``spec.name`` is not
    part of it.  Use this, not the mp4 file's bytes, to check that generation is reproducible and that splits do
    not share videos: the encoded bytes also depend on the H.264 encoder's decisions, not only on the content.
    """
    import hashlib

    import numpy as np

    h = hashlib.sha256(repr((float(spec.fps), int(spec.num_frames), int(spec.width), int(spec.height))).encode())
    for k in range(spec.num_frames):
        h.update(np.ascontiguousarray(render_frame(spec, k), dtype=np.uint8).tobytes())
    return h.hexdigest()


def tvg_samples(spec: VideoSpec, video_rel: str, split: str, rng) -> list[dict]:
    out = []
    for j, ev in enumerate(spec.events):
        q = QUERY_TEMPLATES[int(rng.integers(len(QUERY_TEMPLATES)))].format(colour=ev.colour, shape=ev.shape)
        out.append({
            "id": f"{spec.name}_e{j}", "task": "tvg", "video": video_rel, "duration": spec.duration, "query": q,
            "spans": [ev.span(spec.fps)],
            "meta": {"source": "synthetic_tvg", "split": split, "fps": spec.fps, "colour": ev.colour,
                     "shape": ev.shape, "frames": [ev.first_frame, ev.last_frame],
                     "num_frames": spec.num_frames, "size": [spec.width, spec.height]},
        })
    return out


def mcq_samples(spec: VideoSpec, video_rel: str, split: str, rng) -> list[dict]:
    out = []
    for j, ev in enumerate(spec.events):
        others = [c for c in COLOURS if c != ev.colour]
        distract = [str(c) for c in rng.choice(others, size=3, replace=False)]
        options = distract + [ev.colour]
        order = rng.permutation(len(options))
        options = [options[i] for i in order]
        out.append({
            "id": f"{spec.name}_mcq{j}", "task": "mcq", "video": video_rel, "duration": spec.duration,
            "query": f"What colour is the {ev.shape} that appears in the video?",
            "options": options, "answer": "ABCD"[options.index(ev.colour)],
            "meta": {"source": "synthetic_tvg", "split": split, "fps": spec.fps, "colour": ev.colour,
                     "shape": ev.shape, "span": ev.span(spec.fps)},
        })
    return out


def generate(out_dir: str | os.PathLike, n_train: int = 64, n_eval: int = 16, seed: int = 0,
             mcq: bool = False) -> dict:
    """Write ``n_train`` + ``n_eval`` videos and their JSONL files under ``out_dir``; returns
    ``{"train": path, "eval": path, ("train_mcq", "eval_mcq"), "videos": dir, "n_samples": {...},
    "frame_digests": {video path as written in the JSONL ("videos/<name>.mp4"): frames_digest(spec)}}``."""
    import numpy as np

    from mmgrpo.vlm.data.jsonl import write_jsonl
    from mmgrpo.vlm.data.schema import Sample

    out_dir = os.fspath(out_dir)
    vdir = os.path.join(out_dir, "videos")
    os.makedirs(vdir, exist_ok=True)
    result: dict = {"videos": vdir, "n_samples": {}, "frame_digests": {}}
    for split, n, stream in (("train", n_train, 0), ("eval", n_eval, 1)):
        # independent, reproducible streams per split: SeedSequence(seed, spawn_key=(stream,))
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream,)))
        tvg, mc = [], []
        for k in range(n):
            spec = sample_spec(rng, f"syn_{split}_{k:05d}")
            rel = f"videos/{spec.name}.mp4"
            write_spec_video(spec, os.path.join(out_dir, rel))
            result["frame_digests"][rel] = frames_digest(spec)
            tvg += tvg_samples(spec, rel, split, rng)
            if mcq:
                mc += mcq_samples(spec, rel, split, rng)
        path = os.path.join(out_dir, f"{split}.jsonl")
        write_jsonl([Sample.from_dict(d) for d in tvg], path)
        result[split] = path
        result["n_samples"][split] = len(tvg)
        if mcq:
            mpath = os.path.join(out_dir, f"{split}_mcq.jsonl")
            write_jsonl([Sample.from_dict(d) for d in mc], mpath)
            result[f"{split}_mcq"] = mpath
            result["n_samples"][f"{split}_mcq"] = len(mc)
    with open(os.path.join(out_dir, "info.json"), "w") as fh:
        json.dump({"seed": seed, "n_train": n_train, "n_eval": n_eval, "mcq": mcq,
                   "n_samples": result["n_samples"], "colours": COLOURS, "shapes": SHAPES,
                   "span_rule": "[first_frame / fps, (last_frame + 1) / fps]"}, fh, indent=1)
    return result
