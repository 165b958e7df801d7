"""Look-again: a synthetic image benchmark where the first view cannot answer and a crop of the source can.

A **source** image (:class:`Layout`; default 448 x 448 px) holds one small striped object (default 16 px square,
centred in its cell unless ``jitter``) in one cell of a 4 x 4 grid (cells of 112 px) on a dark background; the
object's cell has a dark tint that encodes its grid position (:func:`cell_background`). The object is made of vertical stripes
(default 2 px wide) alternating between a colour and its
*complement around mid-grey* (``c' = 2 * MID - c``): red / cyan, green / magenta, blue / yellow. The question asks
for the colour of the object's leftmost stripe (6 options, one per colour; chance 1/6).

The model's first view is the source **area-downsampled by** ``Layout.factor`` (default 4: 112 x 112 px, one
Qwen2.5-VL visual token of 28 x 28 px per cell): every view pixel is the exact mean of a 4 x 4 block of the source. The object is aligned to that block grid and every block of it
holds whole stripe pairs, so each of its blocks averages to ``MID`` exactly, whatever the colours and their order:
**the view is the same image for all six answers** (:func:`view_is_answer_free` checks this by rendering all six).
The view still shows *where* the object is (a 4 x 4 px mid-grey square on the dark tinted background), so a model can ask
for a crop there. A crop of the source at the object's cell at the view's token budget (112 x 112 px: full
resolution) shows the stripes (:func:`crop_oracle` reads the answer back from such a crop: 100 %).

The defaults above are the benchmark's original layout. The look-again demo (``scripts/build_look_again_base.py``,
``scripts/demo_tools.py``) uses ``Layout(marker="image", tint=40, object=56)``: the whole background's colour encodes
the object's cell (a location marker a tiny model reads from the mean of its visual tokens) and the object is 56 px
(4 of the crop's 16 visual tokens show the stripes); the view is still the same image for all six answers.

Samples are canonical ``mcq`` samples of the VLM front-end (``mmgrpo.vlm.data.schema``): ``image`` = the view,
``options`` = the six colour names, ``answer`` = the letter; ``meta`` holds the tool's ground: ``source`` (the
full-resolution image, a file name beside ``image``), ``scale`` (source px per view px), the
object's ``cell`` ``[column, row]``, ``cell_box_view`` / ``cell_box_source`` ([x1, y1, x2, y2] of the cell) and
``object_box_source``.

Splits ``train`` / ``val`` / ``heldout`` are independent draws from ``numpy.random.default_rng([seed, split])``
(balanced answers: every colour ``n / 6`` times, up to rounding; uniform cells and offsets). Every sample is a
deterministic function of (seed, split, index).

Probes (:func:`probe`): the view-invariance check, a pixel-level nearest-centroid oracle on the views (fitted on
train, scored on another split: at chance) and on crops (100 %), and the majority-answer baseline.

Pure numpy; PIL only to write PNGs (:func:`write_split`).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ._cli import write_splits

__all__ = ["Layout", "COLOURS", "COMPLEMENT", "OPTIONS", "BACKGROUND", "MID", "SPLITS", "QUESTION", "draw",
           "render_source", "downsample", "crop", "view_is_answer_free", "crop_oracle", "make_samples",
           "write_split", "generate", "probe", "main"]

MID = 130  # the grey every object block averages to
BACKGROUND = (40, 40, 70)  # every cell but the object's
CELL_TINT = 16  # the object's cell (c, r): BACKGROUND + CELL_TINT * (c + 1, r + 1, 0)
_BASE = {"red": (220, 40, 40), "green": (40, 220, 40), "blue": (40, 40, 220)}
COLOURS: dict[str, tuple[int, int, int]] = {}
COMPLEMENT: dict[str, str] = {}
for _n, _c, _m in (("red", "red", "cyan"), ("green", "green", "magenta"), ("blue", "blue", "yellow")):
    COLOURS[_c] = _BASE[_n]
    COLOURS[_m] = tuple(2 * MID - v for v in _BASE[_n])
    COMPLEMENT[_c], COMPLEMENT[_m] = _m, _c
OPTIONS = ("red", "green", "blue", "cyan", "magenta", "yellow")
LETTERS = "ABCDEF"
SPLITS = {"train": 0, "val": 1, "heldout": 2}
QUESTION = "What colour is the leftmost stripe of the small striped object?"


@dataclass(frozen=True)
class Layout:
    """Geometry (pixels). ``source`` = ``factor`` x the view; ``object`` a multiple of ``factor`` and of
    ``2 * stripe``; ``factor`` a multiple of ``2 * stripe`` (so every view pixel of the object averages a whole
    number of stripe pairs)."""

    source: int = 448
    factor: int = 4
    grid: int = 4
    object: int = 16
    stripe: int = 2
    margin_blocks: int = 3  # the object stays this many view pixels inside its cell
    jitter: int = 0  # the object's offset from the cell centre: uniform in [-jitter, jitter] view pixels per axis
    tint: int = 16  # the location marker's step: the marker colour of cell (c, r) is BACKGROUND + tint*(c+1, r+1, 0)
    marker: str = "cell"  # where the marker colour is painted: "cell" (the object's cell) or "image" (the whole
    # background: the place is then in the mean of every visual token, which a tiny model reads first)

    def __post_init__(self) -> None:
        f, s = self.factor, self.stripe
        problems = []
        if self.source % (self.factor * self.grid):
            problems.append(f"source {self.source} not a multiple of factor*grid = {self.factor * self.grid}")
        if f % (2 * s):
            problems.append(f"factor {f} not a multiple of 2*stripe = {2 * s} (view pixels would carry the order)")
        if self.object % f:
            problems.append(f"object {self.object} not a multiple of factor {f}")
        if self.cell_blocks - 2 * self.margin_blocks < self.object // f + 2 * self.jitter:
            problems.append(f"cell of {self.cell_blocks} view px too small for the object, margin "
                            f"{self.margin_blocks} and jitter {self.jitter}")
        if self.marker not in ("cell", "image"):
            problems.append(f"marker must be 'cell' or 'image', got {self.marker!r}")
        if not 0 <= BACKGROUND[0] + self.tint * self.grid <= 255:
            problems.append(f"tint {self.tint} x grid {self.grid} leaves the 0..255 range")
        if problems:
            raise ValueError("look_again.Layout: " + "; ".join(problems))

    @property
    def view(self) -> int:
        return self.source // self.factor

    @property
    def cell(self) -> int:
        return self.source // self.grid

    @property
    def cell_blocks(self) -> int:
        return self.cell // self.factor

    def cell_box(self, col: int, row: int, scale: int = 1) -> list[int]:
        """[x1, y1, x2, y2] of a cell in source px (``scale=1``) or view px (``scale=factor``)."""
        c = self.cell // scale
        return [col * c, row * c, (col + 1) * c, (row + 1) * c]


def draw(rng: np.random.Generator, layout: Layout, colour: str | None = None) -> dict:
    """One sample's content: the leftmost stripe's colour (uniform unless given), the cell and the object's
    top-left corner in source px (block aligned; centred in the cell up to ``jitter`` view px)."""
    lay = layout
    if colour is None:
        colour = OPTIONS[int(rng.integers(len(OPTIONS)))]
    col, row = (int(v) for v in rng.integers(lay.grid, size=2))
    centre = (lay.cell_blocks - lay.object // lay.factor) // 2
    ox, oy = (centre + int(v) for v in rng.integers(-lay.jitter, lay.jitter + 1, size=2))
    x0, y0 = col * lay.cell + ox * lay.factor, row * lay.cell + oy * lay.factor
    return {"colour": colour, "cell": [col, row], "object_box_source": [x0, y0, x0 + lay.object, y0 + lay.object]}


def cell_background(col: int, row: int, tint: int = CELL_TINT) -> tuple[int, int, int]:
    """The location marker's colour when the object is in cell (col, row): a tint that makes the cell's place
    readable in the pixels (as the grounding benchmark's clock makes time readable). ``Layout.marker="cell"`` paints
    it on the object's cell only (the other cells stay ``BACKGROUND``), ``"image"`` on the whole background. It
    depends on the place only, never on the answer, so the view stays the same under all six answers."""
    return (BACKGROUND[0] + tint * (col + 1), BACKGROUND[1] + tint * (row + 1), BACKGROUND[2])


def render_source(content: dict, layout: Layout) -> np.ndarray:
    """(source, source, 3) uint8: the background with the location marker + the striped object (leftmost stripe =
    ``content['colour']``)."""
    lay = layout
    img = np.empty((lay.source, lay.source, 3), np.uint8)
    img[:] = BACKGROUND
    c, r = content["cell"]
    if lay.marker == "image":
        img[:] = cell_background(c, r, lay.tint)
    else:
        img[r * lay.cell:(r + 1) * lay.cell, c * lay.cell:(c + 1) * lay.cell] = cell_background(c, r, lay.tint)
    x0, y0, x1, y1 = content["object_box_source"]
    a, b = np.array(COLOURS[content["colour"]], np.uint8), np.array(COLOURS[COMPLEMENT[content["colour"]]], np.uint8)
    for k, x in enumerate(range(x0, x1, lay.stripe)):
        img[y0:y1, x:x + lay.stripe] = a if k % 2 == 0 else b
    return img


def downsample(img: np.ndarray, factor: int) -> np.ndarray:
    """Area downsampling: each output pixel is the mean of a ``factor`` x ``factor`` block (rounded; exact for
    the object's blocks, whose mean is an integer)."""
    h, w, c = img.shape
    if h % factor or w % factor:
        raise ValueError(f"downsample: image {w}x{h} not divisible by factor {factor}")
    m = img.reshape(h // factor, factor, w // factor, factor, c).astype(np.float64).mean(axis=(1, 3))
    return np.rint(m).astype(np.uint8)


def crop(img: np.ndarray, box: Sequence[int], size: int) -> np.ndarray:
    """The source region ``box`` ([x1, y1, x2, y2], source px) area-resized to ``size`` x ``size`` (integer
    factors only: this is the probe's crop, not the tool's)."""
    x1, y1, x2, y2 = (int(v) for v in box)
    region = img[y1:y2, x1:x2]
    if region.shape[0] % size or region.shape[1] % size or region.shape[0] != region.shape[1]:
        raise ValueError(f"crop: box {list(box)} is not a square multiple of {size}")
    return downsample(region, region.shape[0] // size)


def view_is_answer_free(content: dict, layout: Layout) -> bool:
    """True when the view of ``content`` is byte-identical for every one of the six answers (same position)."""
    views = [downsample(render_source(dict(content, colour=c), layout), layout.factor) for c in OPTIONS]
    return all(np.array_equal(views[0], v) for v in views[1:])


def crop_oracle(crop_img: np.ndarray) -> str:
    """The answer read from a crop's pixels: the colour of the leftmost column whose pixels are farthest from the
    background, matched to the nearest palette colour. Used on the cell crop (:func:`make_samples`' probe)."""
    x = crop_img.astype(np.float64)
    dist = np.abs(x - x[0, 0]).sum(-1)  # (H, W): distance to the crop's background (its corner pixel)
    cols = np.nonzero(dist.max(0) > 60)[0]
    if len(cols) == 0:
        return ""
    column = x[:, cols[0]]
    px = column[dist[:, cols[0]].argmax()]
    names = list(OPTIONS)
    return names[int(np.argmin([np.abs(px - np.array(COLOURS[n])).sum() for n in names]))]


def _balanced_colours(rng: np.random.Generator, n: int) -> list[str]:
    reps = -(-n // len(OPTIONS))
    order = list(OPTIONS) * reps
    perm = rng.permutation(len(order))
    return [order[i] for i in perm[:n]]


def make_samples(n: int, split: str, seed: int, layout: Layout | None = None) -> list[tuple[dict, dict]]:
    """``n`` (content, sample-without-paths) pairs of ``split``: deterministic in (seed, split, index)."""
    if split not in SPLITS:
        raise ValueError(f"look_again: split must be one of {list(SPLITS)}, got {split!r}")
    lay = layout or Layout()
    rng = np.random.default_rng([int(seed), SPLITS[split]])
    out = []
    for i, colour in enumerate(_balanced_colours(rng, n)):
        content = draw(rng, lay, colour)
        col, row = content["cell"]
        sample = {
            "id": f"{split}_{i:05d}", "task": "mcq", "query": QUESTION, "options": list(OPTIONS),
            "answer": LETTERS[OPTIONS.index(colour)], "image_size": [lay.view, lay.view],
            "meta": {"benchmark": "look_again", "split": split, "seed": int(seed), "scale": lay.factor,
                     "source_size": [lay.source, lay.source], "cell": [col, row],
                     "cell_box_view": lay.cell_box(col, row, lay.factor), "cell_box_source": lay.cell_box(col, row),
                     "object_box_source": content["object_box_source"], "colour": colour},
        }
        out.append((content, sample))
    return out


def write_split(out_dir: str, split: str, n: int, seed: int, layout: Layout | None = None) -> str:
    """Render ``split`` into ``out_dir``: ``images/{id}_view.png``, ``images/{id}_source.png`` and
    ``{split}.jsonl`` (``image`` relative to ``out_dir``, ``meta.source`` relative to the image's folder: a loader
    that resolves ``image`` finds the source beside it); returns the JSONL path."""
    from PIL import Image

    lay = layout or Layout()
    os.makedirs(os.path.join(out_dir, "images"), exist_ok=True)
    path = os.path.join(out_dir, f"{split}.jsonl")
    with open(path, "w") as f:
        for content, s in make_samples(n, split, seed, lay):
            src = render_source(content, lay)
            view_rel, src_rel = f"images/{s['id']}_view.png", f"images/{s['id']}_source.png"
            Image.fromarray(downsample(src, lay.factor)).save(os.path.join(out_dir, view_rel))
            Image.fromarray(src).save(os.path.join(out_dir, src_rel))
            s = dict(s, image=view_rel, meta=dict(s["meta"], source=os.path.basename(src_rel)))
            f.write(json.dumps(s) + "\n")
    return path


def _features(pairs: list[tuple[dict, dict]], lay: Layout, kind: str) -> np.ndarray:
    rows = []
    for content, s in pairs:
        src = render_source(content, lay)
        img = downsample(src, lay.factor) if kind == "view" else crop(src, s["meta"]["cell_box_source"], lay.view)
        rows.append(img.astype(np.float32).reshape(-1) / 255.0)
    return np.stack(rows)


def _nearest_centroid(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray) -> np.ndarray:
    """Predict the class whose mean training vector is nearest (the Bayes rule for isotropic noise)."""
    classes = np.unique(train_y)
    cents = np.stack([train_x[train_y == c].mean(0) for c in classes])
    d = ((test_x[:, None, :] - cents[None]) ** 2).sum(-1)
    return classes[d.argmin(1)]


def probe(seed: int = 0, n_train: int = 600, n_test: int = 300, test_split: str = "heldout",
          layout: Layout | None = None) -> dict:
    """The premise, measured (percent): is the answer in the first view's pixels, or in the crop's?

    * ``view_answer_free``: share of test samples whose view is identical under all six answers (100 = the view
      carries no information on the answer: every classifier of the view is at chance in expectation);
    * ``view_centroid_acc`` / ``crop_centroid_acc``: a pixel-level nearest-centroid classifier fitted on the train
      split's views / cell crops, scored on the test split;
    * ``crop_oracle_acc``: :func:`crop_oracle` on the test split's cell crops;
    * ``chance`` and ``majority_acc`` (the most frequent training answer, on the test split).
    """
    lay = layout or Layout()
    tr, te = make_samples(n_train, "train", seed, lay), make_samples(n_test, test_split, seed, lay)
    ytr = np.array([OPTIONS.index(c["colour"]) for c, _ in tr])
    yte = np.array([OPTIONS.index(c["colour"]) for c, _ in te])
    res: dict[str, Any] = {"seed": seed, "n_train": n_train, "n_test": n_test, "test_split": test_split,
                           "chance": 100.0 / len(OPTIONS)}
    res["view_answer_free"] = 100.0 * float(np.mean([view_is_answer_free(c, lay) for c, _ in te]))
    for kind in ("view", "crop"):
        pred = _nearest_centroid(_features(tr, lay, kind), ytr, _features(te, lay, kind))
        res[f"{kind}_centroid_acc"] = 100.0 * float(np.mean(pred == yte))
    res["crop_oracle_acc"] = 100.0 * float(np.mean(
        [crop_oracle(crop(render_source(c, lay), s["meta"]["cell_box_source"], lay.view)) == c["colour"]
         for c, s in te]))
    res["majority_acc"] = 100.0 * float(np.mean(yte == np.bincount(ytr, minlength=len(OPTIONS)).argmax()))
    return res


def generate(out_dir: str, n_train: int = 600, n_val: int = 60, n_heldout: int = 120, seed: int = 0,
             layout: Layout | None = None) -> dict:
    """Write the three splits and ``info.json`` (sizes, layout, the probe on val); returns the info."""
    lay = layout or Layout()
    return write_splits(out_dir, lambda sp, n: write_split(out_dir, sp, n, seed, lay),
                        {"train": n_train, "val": n_val, "heldout": n_heldout},
                        {"benchmark": "look_again", "seed": seed},
                        {"layout": lay.__dict__, "options": list(OPTIONS), "question": QUESTION})


def main(argv=None) -> int:
    from ._cli import split_benchmark_main

    return split_benchmark_main(argv, __doc__, generate, probe, "premise probe")


if __name__ == "__main__":
    raise SystemExit(main())
