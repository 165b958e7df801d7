"""Temporal-grounding timeline pictures: what the model saw, the ground-truth span, and the predicted spans.

One panel per query: the query text, a strip of the frames the model receives (decoded and sampled by
:func:`mmgrpo.video.clip.load_video` with the run's video settings, so the same frames and timestamps as in
training and evaluation; each labelled with its time, with a tick at that time on the axis), a time axis over the
whole video, and one bar per span -- ground truth first, then each prediction (e.g. before / after GRPO). A
prediction that could not be parsed is written as "no span". Geometry is exact and documented so a test can check
it: on an axis starting at ``left`` and ``width`` pixels wide, time ``t`` of a video of ``D`` seconds is column
``left + round(t / D * width)`` and a bar ``[s, e]`` covers columns ``x(s) .. x(e) - 1`` (at least one column).
The axis is as wide as the frame strip (at least ``AXIS_WIDTH``), so a span sits under the frames it covers.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

# bar colours: ground truth green, then one colour per prediction row (colour-blind-safe Okabe-Ito hues)
GT_COLOUR = (0, 158, 115)
PRED_COLOURS = [(86, 180, 233), (230, 159, 0), (204, 121, 167), (0, 114, 178)]
LEFT = 110  # pixels left of the axis (row labels)
AXIS_WIDTH = 480
BAR_H = 12
ROW_H = 20
THUMB_H = 48


@dataclass
class PanelLayout:
    """Where a panel's pieces are (pixels, in the panel's own coordinates): bar row ``i`` spans rows
    ``bar_top[i] .. bar_top[i] + BAR_H - 1``; the axis starts at column ``left`` and is ``width`` wide; the frame
    strip's top-left corner is ``(left, strip_top)``."""

    left: int
    width: int
    bar_top: list[int]
    height: int
    strip_top: int


def x_of(t: float, duration: float, left: int = LEFT, width: int = AXIS_WIDTH) -> int:
    """Column of time ``t`` (clamped to the video)."""
    t = min(max(float(t), 0.0), float(duration))
    return left + int(round(t / float(duration) * width))


def _font():
    from PIL import ImageFont

    return ImageFont.load_default()


def draw_panel(frames: Sequence[Any], timestamps: Sequence[float], duration: float, query: str,
               gt: tuple[float, float] | None, preds: Mapping[str, tuple[float, float] | None]):
    """One query's panel as a PIL image plus its :class:`PanelLayout`. ``frames``: HWC uint8 arrays."""
    import numpy as np
    from PIL import Image, ImageDraw

    if duration <= 0:
        raise ValueError(f"duration must be > 0, got {duration}")
    font = _font()
    # thumbnails: nearest-neighbour to THUMB_H rows (the model's pixels, not smoothed), side by side
    thumbs = []
    for f in frames:
        a = np.asarray(f, dtype=np.uint8)
        k = max(1, THUMB_H // a.shape[0])
        thumbs.append(np.repeat(np.repeat(a, k, 0), k, 1))
    strip_w = sum(t.shape[1] + 2 for t in thumbs)
    axis_w = max(AXIS_WIDTH, strip_w - 2)  # frame k (time ~ k D / n) starts near x_of(t_k): bars sit under frames
    width = LEFT + axis_w + 20
    th = max((t.shape[0] for t in thumbs), default=0)
    y = 4
    title_h = 14
    strip_top = y + title_h + 2
    axis_y = strip_top + th + 16
    rows = [("ground truth", gt, GT_COLOUR)] + [
        (name, span, PRED_COLOURS[i % len(PRED_COLOURS)]) for i, (name, span) in enumerate(preds.items())]
    bar_top = [axis_y + 18 + i * ROW_H for i in range(len(rows))]
    height = bar_top[-1] + ROW_H + 4
    img = Image.new("RGB", (width, height), (255, 255, 255))
    d = ImageDraw.Draw(img)
    d.text((4, y), query, fill=(0, 0, 0), font=font)
    x = LEFT
    for t, ts in zip(thumbs, timestamps):
        img.paste(Image.fromarray(t), (x, strip_top))
        d.text((x, strip_top + th + 1), f"{ts:.1f}", fill=(90, 90, 90), font=font)
        x += t.shape[1] + 2
    # time axis with 1 s ticks (labelled every whole second that fits) and the frame times as short marks
    d.line([(LEFT, axis_y), (LEFT + axis_w, axis_y)], fill=(0, 0, 0))
    step = 1 if duration <= 20 else 5
    for s in range(0, int(duration) + 1, step):
        xs = x_of(s, duration, width=axis_w)
        d.line([(xs, axis_y - 3), (xs, axis_y + 3)], fill=(0, 0, 0))
        d.text((xs - 3, axis_y + 4), str(s), fill=(0, 0, 0), font=font)
    for ts in timestamps:
        xs = x_of(ts, duration, width=axis_w)
        d.line([(xs, axis_y - 6), (xs, axis_y - 1)], fill=(120, 120, 120))
    d.text((4, axis_y - 6), "time (s)", fill=(0, 0, 0), font=font)
    for (name, span, colour), top in zip(rows, bar_top):
        d.text((4, top), name, fill=(0, 0, 0), font=font)
        if span is None:
            d.text((LEFT + 2, top), "no span", fill=(150, 0, 0), font=font)
            continue
        x0, x1 = x_of(span[0], duration, width=axis_w), x_of(span[1], duration, width=axis_w)
        x1 = max(x1, x0 + 1)
        d.rectangle([x0, top, x1 - 1, top + BAR_H - 1], fill=colour)
    return img, PanelLayout(LEFT, axis_w, bar_top, height, strip_top)


def _span(text: str | None, sample: Mapping[str, Any]) -> tuple[float, float] | None:
    """The predicted span in video seconds with the training reward's parser (None if it does not parse)."""
    from mmgrpo.vlm.rewards.tasks import ParseConfig, prepare_temporal

    if not text:
        return None
    tp = prepare_temporal(text, sample, ParseConfig())
    if tp.pred is None:
        return None
    return float(tp.pred[0]) + float(tp.lo), float(tp.pred[1]) + float(tp.lo)


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def tvg_timelines(annotations: str | os.PathLike, predictions: Mapping[str, str | os.PathLike],
                  out_png: str | os.PathLike, video: Mapping[str, Any], n: int = 4,
                  media_root: str | os.PathLike | None = None) -> Path | None:
    """Panels for the first ``n`` queries (one per video) found in every ``predictions`` file, stacked in one PNG.

    ``predictions``: label -> ``predictions.jsonl`` of ``eval/generate_vlm.py`` (``{"id", "output"}`` rows), e.g.
    ``{"before GRPO": ..., "after GRPO": ...}``. ``video``: :func:`mmgrpo.video.clip.load_video` keyword arguments
    as the model got them (``fps``, ``max_frames``, ``min_pixels``, ``max_pixels``, ...). Returns the PNG path, or
    None when no query has predictions."""
    import numpy as np
    from PIL import Image

    from mmgrpo.video.clip import load_video

    anns = _read_jsonl(Path(annotations))
    preds = {label: {str(r.get("id")): r.get("output") for r in _read_jsonl(Path(p))} if Path(p).exists() else {}
             for label, p in predictions.items()}
    root = Path(media_root) if media_root else Path(annotations).parent
    panels, seen = [], set()
    for a in anns:
        sid = str(a.get("id"))
        if a.get("video") in seen or not all(sid in p for p in preds.values()):
            continue
        seen.add(a.get("video"))
        path = Path(a["video"]) if Path(a["video"]).is_absolute() else root / a["video"]
        clip = load_video(str(path), **dict(video))
        frames = [np.asarray(f) for f in clip.frames.numpy()] if hasattr(clip.frames, "numpy") else list(clip.frames)
        duration = float(a.get("duration") or clip.duration)
        gt = tuple(a["spans"][0]) if a.get("spans") else None
        img, _ = draw_panel(frames, clip.timestamps, duration, str(a.get("query", "")), gt,
                            {label: _span(p[sid], a) for label, p in preds.items()})
        panels.append(img)
        if len(panels) >= n:
            break
    if not panels:
        return None
    W = max(p.width for p in panels)
    H = sum(p.height + 6 for p in panels)
    out = Image.new("RGB", (W, H), (255, 255, 255))
    y = 0
    for p in panels:
        out.paste(p, (0, y))
        y += p.height + 6
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    out.save(out_png, format="PNG")
    return out_png


__all__ = ["draw_panel", "tvg_timelines", "x_of", "PanelLayout"]
