"""Synthetic temporal-grounding benchmark, version 2: the video and the query decide the answer.

Version 1 (:mod:`mmgrpo.vlm.synthetic.tvg`) has 1-3 events of distinct colours *and* shapes lasting 1 s to 60 %
of the video, so a span that ignores the video scores about 45 mIoU (``docs/demo_models.md``).  Here:

* a video (10-16 s, 4-10 fps, 64x64 or 96x64) holds 3-5 **moving** events, each visible for only 1-2 s at a
  uniformly random time (events may overlap in time; each moves horizontally inside one of 3 lanes -- ``lanes=2``
  puts each lane on one row of 28 px visual tokens -- and two events of a lane never overlap, so shapes never
  occlude each other);
* the events of a video are drawn from a small grid of 2-3 colours x 2-3 shapes, so **every event shares its
  colour or its shape with another one** (the distractors), and with probability ``twin_prob`` one colour+shape
  appears twice, moving in opposite directions (only the motion tells them apart);
* each event gets one query naming what identifies it: "When does the blue triangle appear?" when its
  colour+shape is unique in the video, "When does the red square move left?" when it has a twin (and, with
  probability ``motion_query_prob``, also when it has none).

Optional clocks make the *time* of a frame visible in its pixels (burnt-in timestamps are common in real video,
and drawing frame numbers onto frames is how NumPro helps video LLMs ground); *which* frames hold the queried
event still has to be read from the shapes:

* ``clock="bar"``: a white progress bar in the bottom ``CLOCK_ROWS`` rows, ``k / fps * CLOCK_PX_PER_S`` pixels long;
* ``clock="light"``: the grey background brightens with time, level ``LIGHT_START + LIGHT_PER_S * k / fps``, so
  every visual token (also the one holding the queried shape) carries the time of its frames.

Ground truth as in version 1: ``span = [a / fps, (b + 1) / fps]`` for visible frames ``a..b``; ``duration =
num_frames / fps``.  ``meta["version"] = 2``.

Built-in checks (functions, tested in ``tests/data/test_synthetic_grounding.py``; ``generate`` writes them to
``info.json``):

* :func:`video_blind_baselines` -- the best constant / duration-relative span fitted on the training split,
  scored on another split: low by design (about 13 mIoU: the best blind span is a wide one,
  ``[0.1 D, 0.9 D]``);
* :func:`oracle_spans` -- reads the *rendered pixels* (palette colour, pixel count = shape, x motion) and the query
  text only, and recovers every ground-truth span exactly (100 mIoU): the labels are determined by video + query;
* :func:`query_swap_stats` -- answering a query with another query's span of the same video: how often the
  target changes (IoU < 0.5) and the mIoU against the other query's span.
"""
from __future__ import annotations

import json
import operator
import os
import re
from dataclasses import dataclass

from mmgrpo.synthetic.shapes import BACKGROUND, COLOURS, SHAPES, _shape_mask

from .tvg import FPS_CHOICES, SHAPE_SIZE, SIZES, Event

DURATION = (10.0, 16.0)  # seconds, uniform
EVENT_SECONDS = (1.0, 2.0)  # visible time of one event, uniform
N_EVENTS = (3, 5)  # inclusive
MAX_EVENTS = 9  # 3 colours x 3 shapes: the most distinct (colour, shape) kinds one video draws
N_LANES = 3  # default; lanes=2 puts each lane on one row of 28 px visual tokens (64 px frames resized to 56)
CLOCK_ROWS = 8  # height of the progress bar strip at the bottom of a frame (clock=True)
CLOCK_PX_PER_S = 3.5  # bar length per second of video time: 16 s fit in 56 px, for both frame widths
CLOCK_RGB = (255, 255, 255)  # not a palette colour
LIGHT_START, LIGHT_PER_S = 30.0, 7.0  # clock="light": grey level at 0 s and its rise per second (142 at 16 s)
CLOCKS = ("none", "bar", "light")
MIN_MOVE = 16  # pixels between the first and the last position: motion is visible in two frames
APPEAR_TEMPLATES = (
    "When does the {colour} {shape} appear?",
    "During which part of the video is the {colour} {shape} visible?",
    "When can the {colour} {shape} be seen?",
)
MOVE_TEMPLATES = (
    "When does the {colour} {shape} move {direction}?",
    "During which part of the video does the {colour} {shape} move to the {direction}?",
)
DIRECTIONS = ("left", "right")


@dataclass(frozen=True)
class MovingEvent(Event):
    """Version 1's :class:`Event` (frames, lane, motion x0 -> x1, ``span``) plus the direction a query can name."""

    direction: str  # "left" | "right"


@dataclass(frozen=True)
class GroundingSpec:
    name: str
    fps: float
    num_frames: int
    width: int
    height: int
    events: tuple
    clock: str = "none"  # "bar" | "light": show the frame's time in its pixels (module docstring)
    lanes: int = N_LANES

    @property
    def lane_height(self) -> int:
        return (self.height - (CLOCK_ROWS if self.clock == "bar" else 0)) // self.lanes

    @property
    def duration(self) -> float:
        return self.num_frames / self.fps


def _x_at(ev: MovingEvent, k: int) -> int:
    t = (k - ev.first_frame) / max(ev.last_frame - ev.first_frame, 1)
    return int(round(ev.x0 + (ev.x1 - ev.x0) * t))


def render_frame(spec: GroundingSpec, k: int):
    """uint8 (H, W, 3) frame ``k``: flat background, every event visible at ``k`` drawn in its lane."""
    import numpy as np

    img = np.empty((spec.height, spec.width, 3), np.uint8)
    img[:] = BACKGROUND if spec.clock != "light" else int(round(LIGHT_START + LIGHT_PER_S * k / spec.fps))
    lane_h = spec.lane_height
    if spec.clock == "bar":  # bar length = frame time k / fps in CLOCK_PX_PER_S pixels per second
        img[spec.height - CLOCK_ROWS:, :int(round(k / spec.fps * CLOCK_PX_PER_S))] = CLOCK_RGB
    for ev in spec.events:
        if not ev.first_frame <= k <= ev.last_frame:
            continue
        x, y = _x_at(ev, k), ev.lane * lane_h + (lane_h - SHAPE_SIZE) // 2
        img[y:y + SHAPE_SIZE, x:x + SHAPE_SIZE][_shape_mask(ev.shape, SHAPE_SIZE)] = COLOURS[ev.colour]
    return img


def _place(rng, n: int, length: int, busy: list[tuple[int, int]]) -> int | None:
    """A random first frame for a ``length``-frame event that overlaps no interval in ``busy`` and leaves a gap of
    at least one frame to each (so the pixels separate two events of one lane); None if there is no room."""
    free = [a for a in range(0, n - length + 1) if all(a + length < s or a > e + 1 for s, e in busy)]
    return int(free[int(rng.integers(len(free)))]) if free else None


def _motion(rng, width: int, direction: str) -> tuple[float, float]:
    xmax = width - SHAPE_SIZE
    start = float(rng.uniform(MIN_MOVE, xmax))
    end = float(rng.uniform(0.0, start - MIN_MOVE))
    return (start, end) if direction == "left" else (xmax - start, xmax - end)


def _has_distractors(events) -> bool:
    """Every event shares its colour or its shape with another event of the video."""
    return all(any(e is not f and (e.colour == f.colour or e.shape == f.shape) for f in events) for e in events)


def sample_spec(rng, name: str, twin_prob: float = 0.3, clock: str = "none", lanes: int = N_LANES,
                n_events: tuple[int, int] = N_EVENTS) -> GroundingSpec:
    """One random video (see the module docstring); redrawn until it has at least ``n_events[0]`` events and every
    event has a colour or shape distractor.  ``n_events`` = (min, max) events before the optional twin (default
    3-5; at least 2, so that every event has a distractor)."""
    if not 2 <= n_events[0] <= n_events[1]:
        raise ValueError(f"n_events must be (min, max) with 2 <= min <= max, got {n_events!r}")
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    while True:
        spec = _draw_spec(rng, name, twin_prob, clock, lanes, n_events)
        if len(spec.events) >= n_events[0] and _has_distractors(spec.events):
            return spec


def max_lanes(clock: str = "none") -> int:
    """The most lanes the smallest frame holds: each lane at least SHAPE_SIZE pixels high."""
    return min((h - (CLOCK_ROWS if clock == "bar" else 0)) // SHAPE_SIZE for _, h in SIZES)


def check_settings(clock: str = "none", lanes: int = N_LANES, n_events: tuple[int, int] = N_EVENTS) -> None:
    """ValueError unless every video can be drawn: 1 <= lanes <= :func:`max_lanes`, 2 <= min <= max <= MAX_EVENTS.
    :func:`sample_spec` redraws until a video fits, so a setting outside these bounds (``lanes=0``, 200 events)
    would redraw forever; inside them the rarest setting (9 events on one lane) keeps ~0.3 % of its draws.
    (The check lives here, not in ``sample_spec``, whose source is part of the shipped checkpoints' fingerprint.)"""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {CLOCKS}, got {clock!r}")
    def whole(x):
        try:
            return operator.index(x)
        except TypeError:
            return None

    lanes_i = whole(lanes)
    if lanes_i is None or not 1 <= lanes_i <= max_lanes(clock):
        raise ValueError(f"lanes must be in [1, {max_lanes(clock)}] (a lane is at least {SHAPE_SIZE} px high), got "
                         f"{lanes!r}")
    ev = tuple(n_events)
    lo, hi = (whole(ev[0]), whole(ev[1])) if len(ev) == 2 else (None, None)
    if lo is None or hi is None or not 2 <= lo <= hi <= MAX_EVENTS:
        raise ValueError(f"n_events must be (min, max) with 2 <= min <= max <= {MAX_EVENTS} (distinct colour-shape "
                         f"kinds), got {n_events!r}")


def _draw_spec(rng, name: str, twin_prob: float, clock: str, lanes: int,
               n_events: tuple[int, int] = N_EVENTS) -> GroundingSpec:
    fps = float(rng.choice(FPS_CHOICES))
    n = int(round(float(rng.uniform(*DURATION)) * fps))
    width, height = SIZES[int(rng.integers(len(SIZES)))]
    colours = [str(c) for c in rng.choice(list(COLOURS), size=int(rng.integers(2, 4)), replace=False)]
    shapes = [str(s) for s in rng.choice(list(SHAPES), size=int(rng.integers(2, 4)), replace=False)]
    grid = [(c, s) for c in colours for s in shapes]
    n_ev = min(int(rng.integers(n_events[0], n_events[1] + 1)), len(grid))
    picks = [grid[i] for i in rng.choice(len(grid), size=n_ev, replace=False)]
    kinds = [(c, s, str(rng.choice(DIRECTIONS))) for c, s in picks]
    if rng.random() < twin_prob:  # the same colour+shape again, moving the other way
        c, s, d = kinds[int(rng.integers(len(kinds)))]
        kinds.append((c, s, "left" if d == "right" else "right"))
    busy: dict[int, list] = {lane: [] for lane in range(lanes)}
    events = []
    for c, s, d in kinds:
        length = max(2, int(round(float(rng.uniform(*EVENT_SECONDS)) * fps)))
        for lane in rng.permutation(lanes):
            a = _place(rng, n, length, busy[int(lane)])
            if a is not None:
                break
        else:  # no room left in any lane: drop this event (rare; the video keeps >= 3 events)
            continue
        busy[int(lane)].append((a, a + length - 1))
        x0, x1 = _motion(rng, width, d)
        events.append(MovingEvent(c, s, a, a + length - 1, int(lane), x0, x1, direction=d))
    return GroundingSpec(name, fps, n, width, height, tuple(events), clock, lanes)


def event_query(spec: GroundingSpec, j: int, rng, motion_query_prob: float = 0.3) -> str:
    """The query for event ``j``: names its colour and shape, and its direction when needed to be unique."""
    ev = spec.events[j]
    twins = sum(1 for e in spec.events if (e.colour, e.shape) == (ev.colour, ev.shape))
    if twins > 1 or rng.random() < motion_query_prob:
        t = MOVE_TEMPLATES[int(rng.integers(len(MOVE_TEMPLATES)))]
        return t.format(colour=ev.colour, shape=ev.shape, direction=ev.direction)
    t = APPEAR_TEMPLATES[int(rng.integers(len(APPEAR_TEMPLATES)))]
    return t.format(colour=ev.colour, shape=ev.shape)


def tvg_samples(spec: GroundingSpec, video_rel: str, split: str, rng, motion_query_prob: float = 0.3) -> list[dict]:
    out = []
    for j, ev in enumerate(spec.events):
        out.append({
            "id": f"{spec.name}_e{j}", "task": "tvg", "video": video_rel, "duration": spec.duration,
            "query": event_query(spec, j, rng, motion_query_prob), "spans": [ev.span(spec.fps)],
            "meta": {"source": "synthetic_grounding", "version": 2, "split": split, "fps": spec.fps,
                     "colour": ev.colour, "shape": ev.shape, "direction": ev.direction,
                     "frames": [ev.first_frame, ev.last_frame], "num_frames": spec.num_frames,
                     "size": [spec.width, spec.height], "n_events": len(spec.events)},
        })
    return out


TAG_CLASSES = tuple(f"{c} {s}" for c in COLOURS for s in SHAPES)  # what a visual token can show


def block_tags(rows, frame_indices, temporal_patch_size: int = 2) -> list[list[float]]:
    """Which colour+shape objects each temporal block of a sampled clip shows, from the renderer's ground truth.

    ``rows``: the query rows of ONE video (:func:`tvg_samples`: every event of a video has exactly one row, whose
    ``meta`` holds its ``colour``, ``shape`` and visible frame range ``frames = [a, b]``). ``frame_indices``: the
    clip's sampled frames (absolute decoded-frame indices, ``VideoClip.frame_indices``). Block ``i`` holds sampled
    frames ``i*P .. i*P+P-1`` (``P = temporal_patch_size``, Qwen's temporal patch). Returns one 0/1 row of
    ``len(TAG_CLASSES)`` per block: 1 where an event of that colour+shape is visible in at least one of the
    block's frames. Used as the label of the vision-tower pre-training stage of the tiny grounding base.
    """
    n_blocks = len(frame_indices) // temporal_patch_size
    tags = [[0.0] * len(TAG_CLASSES) for _ in range(n_blocks)]
    for r in rows:
        m = r["meta"] if isinstance(r, dict) else r.meta  # a JSONL row or a canonical Sample
        cls = TAG_CLASSES.index(f"{m['colour']} {m['shape']}")
        a, b = m["frames"]
        for i in range(n_blocks):
            if any(a <= f <= b for f in frame_indices[i * temporal_patch_size:(i + 1) * temporal_patch_size]):
                tags[i][cls] = 1.0
    return tags


def frames_digest(spec: GroundingSpec) -> str:
    """SHA-256 of ``(fps, num_frames, width, height)`` and the rendered frames (as in version 1)."""
    import hashlib

    import numpy as np

    h = hashlib.sha256(repr((float(spec.fps), int(spec.num_frames), int(spec.width), int(spec.height))).encode())
    for k in range(spec.num_frames):
        h.update(np.ascontiguousarray(render_frame(spec, k), dtype=np.uint8).tobytes())
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------------------
# built-in checks
# ------------------------------------------------------------------------------------------------------------
def _iou(ps, pe, gs, ge):
    import numpy as np

    inter = np.clip(np.minimum(pe, ge) - np.maximum(ps, gs), 0, None)
    union = np.maximum(pe, ge) - np.minimum(ps, gs)
    return inter / np.maximum(union, 1e-9)


def _arrays(samples):
    import numpy as np

    d = [s if isinstance(s, dict) else s.to_dict() for s in samples]
    return (np.array([x["duration"] for x in d], float), np.array([x["spans"][0][0] for x in d], float),
            np.array([x["spans"][0][1] for x in d], float))


def video_blind_baselines(train, held) -> dict:
    """The constant span ``[s, e]`` s (clipped to the video; 0.25 s grid) and the duration-relative span
    ``[a D, b D]`` (0.05 grid) with the best mean IoU on ``train``, and their mIoU (percent) on ``held``.  They
    never see the video or the query: a model must beat them to claim grounding."""
    import numpy as np

    D, gs, ge = _arrays(train)
    hD, hs, he = _arrays(held)

    def const_miou(c, D, gs, ge):
        return float(np.mean(_iou(np.minimum(c[0], D), np.minimum(c[1], D), gs, ge)))

    const = max(((s / 4, e / 4) for s in range(0, 48) for e in range(s + 1, 49)),
                key=lambda c: const_miou(c, D, gs, ge))
    rel = max(((a / 20, b / 20) for a in range(0, 20) for b in range(a + 1, 21)),
              key=lambda c: float(np.mean(_iou(c[0] * D, c[1] * D, gs, ge))))
    return {"constant_span": {"span": list(const), "mIoU": 100 * const_miou(const, hD, hs, he)},
            "duration_relative_span": {"span": list(rel),
                                       "mIoU": 100 * float(np.mean(_iou(rel[0] * hD, rel[1] * hD, hs, he)))}}


_QUERY_RE = re.compile(r"the (\w+) (\w+) (?:appear|visible|be seen|move (?:to the )?(left|right))")


def parse_query(query: str) -> tuple[str, str, str | None]:
    """``(colour, shape, direction or None)`` named by a query of :data:`APPEAR_TEMPLATES` / :data:`MOVE_TEMPLATES`."""
    m = _QUERY_RE.search(query)
    if not m or m.group(1) not in COLOURS or m.group(2) not in SHAPES:
        raise ValueError(f"not a synthetic grounding query: {query!r}")
    return m.group(1), m.group(2), m.group(3)


def detect_events(spec: GroundingSpec) -> list[tuple[str, str, str, int, int]]:
    """What the pixels show: ``(colour, shape, direction, first_frame, last_frame)`` for every run of frames in
    which a lane holds one shape, read from the rendered frames only (palette colour, pixel count -> shape, the
    shape's leftmost column -> direction).  Independent of the spec's event list."""
    import numpy as np

    area = {s: int(_shape_mask(s, SHAPE_SIZE).sum()) for s in SHAPES}
    lane_h = spec.lane_height
    runs: dict[tuple, list] = {}  # (lane, colour, shape) -> [[first, last, [x per frame]], ...]
    for k in range(spec.num_frames):
        img = render_frame(spec, k)
        for lane in range(spec.lanes):
            band = img[lane * lane_h:(lane + 1) * lane_h]
            for c, rgb in COLOURS.items():
                m = np.all(band == np.asarray(rgb, np.uint8), axis=-1)
                if not m.any():
                    continue
                shape = min(SHAPES, key=lambda s: abs(area[s] - int(m.sum())))
                x = int(np.flatnonzero(m.any(0))[0])
                lst = runs.setdefault((lane, c, shape), [])
                if lst and lst[-1][1] == k - 1:
                    lst[-1][1] = k
                    lst[-1][2].append(x)
                else:
                    lst.append([k, k, [x]])
    found = []
    for (lane, c, shape), lst in runs.items():
        for a, b, xs in lst:
            found.append((c, shape, "left" if xs[-1] < xs[0] else "right", a, b))
    return found


def oracle_spans(spec: GroundingSpec, queries: list[str]) -> list[list[float]]:
    """For each query: the span of the unique detected event (:func:`detect_events`) that matches the colour,
    shape and (if named) direction parsed from the query text.  Raises if the query is ambiguous or unmatched."""
    found = detect_events(spec)
    out = []
    for q in queries:
        c, s, d = parse_query(q)
        hits = [f for f in found if f[0] == c and f[1] == s and (d is None or f[2] == d)]
        if len(hits) != 1:
            raise ValueError(f"{spec.name}: query {q!r} matches {len(hits)} events in the pixels")
        out.append([hits[0][3] / spec.fps, (hits[0][4] + 1) / spec.fps])
    return out


def query_swap_stats(samples) -> dict:
    """For every ordered pair of different queries of one video: answering query q with the ground-truth span of
    q'.  ``changed`` = share of pairs with IoU(span q, span q') < 0.5 (the query changes the target);
    ``other_mIoU`` = mean IoU (percent), i.e. what a model that ignores the query gets at most on average."""
    import numpy as np

    by_video: dict[str, list] = {}
    for s in samples:
        d = s if isinstance(s, dict) else s.to_dict()
        by_video.setdefault(d["video"], []).append(d["spans"][0])
    ious = []
    for spans in by_video.values():
        for i, a in enumerate(spans):
            for j, b in enumerate(spans):
                if i != j:
                    ious.append(float(_iou(np.array(a[0]), np.array(a[1]), np.array(b[0]), np.array(b[1]))))
    ious = np.array(ious)
    return {"pairs": int(ious.size), "changed": float(np.mean(ious < 0.5)) if ious.size else 0.0,
            "other_mIoU": 100 * float(ious.mean()) if ious.size else 0.0}


# ------------------------------------------------------------------------------------------------------------
# generation
# ------------------------------------------------------------------------------------------------------------
def generate(out_dir: str | os.PathLike, n_train: int = 64, n_eval: int = 16, seed: int = 0,
             twin_prob: float = 0.3, motion_query_prob: float = 0.3, n_val: int = 0, clock: str = "none",
             lanes: int = N_LANES, n_events: tuple[int, int] = N_EVENTS) -> dict:
    """Write the videos and ``train.jsonl`` / ``eval.jsonl`` (and ``val.jsonl`` if ``n_val``) under ``out_dir``.

    Splits use independent streams ``SeedSequence(seed, spawn_key=(stream,))`` (train 0, eval 1, val 2), so the
    held-out ("eval") split does not depend on ``n_train`` or ``n_val``.  Returns paths, sample counts, frame
    digests and the built-in checks (also written to ``info.json``)."""
    import numpy as np

    from mmgrpo.vlm.data.jsonl import write_jsonl
    from mmgrpo.vlm.data.schema import Sample
    from mmgrpo.video.writer import write_video

    check_settings(clock, lanes, tuple(n_events))  # before anything is written
    out_dir = os.fspath(out_dir)
    os.makedirs(os.path.join(out_dir, "videos"), exist_ok=True)
    result: dict = {"videos": os.path.join(out_dir, "videos"), "n_samples": {}, "frame_digests": {}}
    specs: dict[str, list] = {}
    rows: dict[str, list] = {}
    for split, n, stream in (("train", n_train, 0), ("eval", n_eval, 1), ("val", n_val, 2)):
        if split == "val" and not n:
            continue
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(stream,)))
        rows[split], specs[split] = [], []
        for k in range(n):
            spec = sample_spec(rng, f"g2_{split}_{k:05d}", twin_prob, clock, lanes, tuple(n_events))
            rel = f"videos/{spec.name}.mp4"
            write_video(os.path.join(out_dir, rel), (render_frame(spec, i) for i in range(spec.num_frames)),
                        spec.fps, crf=10)
            result["frame_digests"][rel] = frames_digest(spec)
            rows[split] += tvg_samples(spec, rel, split, rng, motion_query_prob)
            specs[split].append(spec)
        path = os.path.join(out_dir, f"{split}.jsonl")
        write_jsonl([Sample.from_dict(d) for d in rows[split]], path)
        result[split] = path
        result["n_samples"][split] = len(rows[split])
    checks = {}
    if rows["train"] and rows["eval"]:
        checks["video_blind_baselines"] = video_blind_baselines(rows["train"], rows["eval"])
    checks["query_swap"] = {s: query_swap_stats(r) for s, r in rows.items()}
    result["checks"] = checks
    with open(os.path.join(out_dir, "info.json"), "w") as fh:
        json.dump({"version": 2, "seed": seed, "n_train": n_train, "n_eval": n_eval, "n_val": n_val, "clock": clock, "lanes": lanes,
                   "n_events": list(n_events),
                   "twin_prob": twin_prob, "motion_query_prob": motion_query_prob,
                   "n_samples": result["n_samples"], "checks": checks,
                   "span_rule": "[first_frame / fps, (last_frame + 1) / fps]"}, fh, indent=1)
    return result
