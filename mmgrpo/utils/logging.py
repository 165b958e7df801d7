"""Metric logging (tensorboard + ``metrics.jsonl`` + optional wandb), image grids and curve plots.

Heavy/optional dependencies (torch.utils.tensorboard, wandb, matplotlib, PIL) are imported on use; a missing
optional backend is warned about once and skipped, never fatal.
"""
from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from mmgrpo.utils.write_errors import naming_write_errors

__all__ = ["MetricLogger", "save_image_grid", "plot_curves", "get_logger", "read_jsonl", "to_jsonable"]

_log = logging.getLogger("mmgrpo.logging")
_WARNED: set[str] = set()


def _warn_once(key: str, msg: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        _log.warning(msg)


_FORMAT = "%(asctime)s %(levelname).1s %(name)s: %(message)s"
_CONFIGURED: set[str] = set()


def get_logger(name: str = "mmgrpo", level: int = logging.INFO) -> logging.Logger:
    """``logging.getLogger(name)``; on first use gives the top-level package logger (``mmgrpo`` for
    ``mmgrpo.vlm.train``) one concise stderr handler, unless the root logger is already configured (then records
    simply propagate there, so nothing is printed twice)."""
    top = name.split(".", 1)[0]
    if top not in _CONFIGURED:
        _CONFIGURED.add(top)
        top_logger = logging.getLogger(top)
        if not logging.getLogger().handlers and not top_logger.handlers:
            h = logging.StreamHandler(sys.stderr)
            h.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
            top_logger.addHandler(h)
        if top_logger.level == logging.NOTSET:
            top_logger.setLevel(level)
    return logging.getLogger(name)


def to_jsonable(v: Any) -> Any:
    """JSON-safe value: tensors/numpy -> python, NaN/inf -> None, Paths -> str, recursive for containers."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, Mapping):
        return {str(k): to_jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [to_jsonable(x) for x in v]
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    # numpy scalars/arrays and torch tensors, without importing either
    if hasattr(v, "detach") and hasattr(v, "cpu"):
        v = v.detach().cpu()
        return to_jsonable(v.item() if v.numel() == 1 else v.tolist())
    if hasattr(v, "tolist") and hasattr(v, "dtype"):
        return to_jsonable(v.tolist())
    if hasattr(v, "item"):
        try:
            return to_jsonable(v.item())
        except Exception:
            pass
    return str(v)


def _scalar(v: Any) -> float | None:
    """A loggable scalar from python/numpy/torch numbers (None if it is not a single number)."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if hasattr(v, "numel") and hasattr(v, "item"):
        return float(v.detach().cpu().item()) if v.numel() == 1 else None
    if hasattr(v, "dtype") and hasattr(v, "item") and getattr(v, "size", 2) == 1:
        try:
            return float(v.item())
        except (TypeError, ValueError):
            return None
    return None


class MetricLogger:
    """Log scalar dicts to tensorboard, ``run_dir/metrics.jsonl`` (one line per call) and optionally wandb.

    Only the main process writes; on other processes every method is a no-op. JSONL rows are
    ``{"step": step, "time": unix_time, **metrics}`` with NaN/inf written as ``null``.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        use_tensorboard: bool = True,
        use_wandb: bool = False,
        is_main_process: bool = True,
        project: str | None = None,
        config: Any = None,
        run_name: str | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.is_main_process = is_main_process
        self._tb = None
        self._wandb = None
        self._jsonl = None
        self._extra: dict[str, Any] = {}
        if not is_main_process:
            return
        with naming_write_errors("metrics", self.run_dir / "metrics.jsonl"):
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._jsonl = open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8")
        if use_tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(log_dir=str(self.run_dir / "tb"))
            except Exception as exc:  # ImportError, or tensorboard's own version errors
                _warn_once("tensorboard", f"tensorboard unavailable ({type(exc).__name__}: {exc}); logging to JSONL only")
        if use_wandb:
            try:
                import wandb

                cfg = config
                if cfg is not None and not isinstance(cfg, Mapping):
                    from mmgrpo.utils.config import config_to_dict

                    cfg = config_to_dict(cfg)
                self._wandb = wandb.init(project=project, config=cfg, dir=str(self.run_dir), name=run_name)
            except Exception as exc:
                _warn_once("wandb", f"wandb unavailable ({type(exc).__name__}: {exc}); not logging to wandb")

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Log one dict of metrics at ``step``. Non-numeric values go to JSONL only."""
        if not self.is_main_process:
            return
        step = int(step)
        row = {"step": step, "time": time.time()}
        for k, v in metrics.items():
            row[str(k)] = to_jsonable(v)
        with naming_write_errors("metrics", self.run_dir / "metrics.jsonl"):
            self._jsonl.write(json.dumps(row, allow_nan=False) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for k, v in metrics.items():
                s = _scalar(v)
                if s is not None:
                    self._tb.add_scalar(str(k), s, global_step=step)
        if self._wandb is not None:
            try:
                self._wandb.log({k: (_scalar(v) if _scalar(v) is not None else v) for k, v in metrics.items()},
                                step=step)
            except Exception as exc:  # network/service failure must not kill training
                _warn_once("wandb.log", f"wandb.log failed ({type(exc).__name__}: {exc}); continuing")

    def log_jsonl(self, name: str, rows: Iterable[Mapping[str, Any]]) -> Path | None:
        """Append ``rows`` (dicts) to ``run_dir/name``, one JSON object per line (e.g. sampled completions)."""
        if not self.is_main_process:
            return None
        rel = Path(name)
        if rel.is_absolute() or ".." in rel.parts:
            raise ValueError(f"log_jsonl name must be a relative path inside run_dir, got {name!r}")
        path = self.run_dir / rel
        with naming_write_errors(name, path):
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as fh:
                for r in rows:
                    fh.write(json.dumps(to_jsonable(dict(r)), allow_nan=False, ensure_ascii=False) + "\n")
        return path

    def log_image(self, tag: str, image_hwc_uint8: Any, step: int) -> None:
        """One HWC uint8 image to tensorboard (no-op without tensorboard)."""
        if self.is_main_process and self._tb is not None:
            import numpy as np

            self._tb.add_image(tag, np.asarray(_to_numpy(image_hwc_uint8)), global_step=int(step), dataformats="HWC")

    def flush(self) -> None:
        if self._jsonl is not None:
            self._jsonl.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            try:
                self._wandb.finish()
            except Exception:
                pass
            self._wandb = None

    def __enter__(self) -> "MetricLogger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Rows of a JSONL file; malformed lines (e.g. a torn last line after a crash) are counted and logged."""
    rows, bad = [], 0
    with open(path, encoding="utf-8") as fh:
        for i, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                _log.warning("%s:%d: malformed JSON line skipped", path, i)
                continue
            if isinstance(r, dict):
                rows.append(r)
            else:
                bad += 1
                _log.warning("%s:%d: not a JSON object, skipped", path, i)
    return rows


# --------------------------------------------------------------------------------------------------- images
def _to_numpy(x: Any):
    import numpy as np

    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _as_uint8_hwc(img: Any, idx: int):
    """One image (PIL / HWC / HW array, uint8 or float in [0,1]) -> uint8 HWC RGB numpy array."""
    import numpy as np

    if hasattr(img, "convert") and hasattr(img, "size") and not hasattr(img, "dtype"):  # PIL image
        return np.asarray(img.convert("RGB"))
    a = _to_numpy(img)
    if a.ndim == 2:
        a = a[:, :, None]
    if a.ndim != 3:
        raise ValueError(f"image {idx}: expected HWC or HW, got shape {a.shape}")
    if a.shape[2] not in (1, 3, 4):
        raise ValueError(f"image {idx}: expected 1, 3 or 4 channels last (NHWC), got shape {a.shape}")
    if a.dtype == np.uint8:
        pass
    elif np.issubdtype(a.dtype, np.floating):
        if not np.isfinite(a).all() or a.min() < 0 or a.max() > 1:
            raise ValueError(f"image {idx}: float images must lie in [0, 1] (got range [{a.min()}, {a.max()}])")
        a = np.round(a * 255).astype(np.uint8)
    else:
        raise ValueError(f"image {idx}: expected uint8 (or float in [0,1]), got dtype {a.dtype}")
    if a.shape[2] == 1:
        a = np.repeat(a, 3, axis=2)
    elif a.shape[2] == 4:
        a = a[:, :, :3]
    return a


def _wrap_caption(draw: Any, text: str, font: Any, max_w: int, max_lines: int) -> list[str]:
    """Greedy word wrap to ``max_w`` pixels that never breaks inside a word (a word wider than ``max_w`` gets a
    line of its own; the caller sizes cells for the widest word). Past ``max_lines``, whole trailing words are
    dropped for an ellipsis, so a caption reads "a photo of ..." rather than "a squar e"."""
    lines: list[str] = []
    for para in str(text).splitlines() or [""]:
        cur = ""
        for w in para.split():
            cand = w if not cur else cur + " " + w
            if not cur or draw.textlength(cand, font=font) <= max_w:
                cur = cand
            else:
                lines.append(cur)
                cur = w
        lines.append(cur)
    if len(lines) > max_lines:
        words = " ".join(lines[max_lines - 1 :]).split()
        last = "..."
        for k in range(len(words), 0, -1):
            cand = " ".join(words[:k]) + " ..."
            if draw.textlength(cand, font=font) <= max_w:
                last = cand
                break
        lines = lines[: max_lines - 1] + [last]
    return lines


def _nearest_upscale(tile: Any, factor: int) -> Any:
    """Integer nearest-neighbour upscale: every pixel becomes a ``factor`` x ``factor`` block (no new colours)."""
    import numpy as np

    return tile if factor == 1 else np.repeat(np.repeat(tile, factor, axis=0), factor, axis=1)


def save_image_grid(
    images: Any,
    path: str | os.PathLike,
    nrow: int = 4,
    captions: Sequence[str] | None = None,
    padding: int = 2,
    max_caption_lines: int = 4,
    min_tile: int = 0,
) -> Path:
    """Tile ``images`` into a PNG grid with ``nrow`` images per row; ``captions[i]`` is drawn under tile ``i``.

    ``images``: uint8 NHWC numpy array or torch tensor, or a list of PIL images / HWC arrays (float arrays in
    [0, 1] are accepted too). Tiles of different sizes are placed top-left in cells of the largest size.
    ``min_tile``: upscale every tile by the smallest integer factor that makes the largest tile side at least this
    many pixels, nearest-neighbour (exact pixel blocks: what the model drew, only bigger), so 32 px samples and
    their captions are readable; 0 = original size. Captions wrap on word boundaries only; a cell is widened to
    hold the caption's widest word.
    """
    import numpy as np
    from PIL import Image, ImageDraw, ImageFont

    if nrow < 1:
        raise ValueError(f"nrow must be >= 1, got {nrow}")
    if min_tile < 0:
        raise ValueError(f"min_tile must be >= 0, got {min_tile}")
    if hasattr(images, "shape") or hasattr(images, "dtype"):
        arr = _to_numpy(images)
        if arr.ndim == 3:  # NHW grayscale
            arr = arr[..., None]
        if arr.ndim != 4:
            raise ValueError(f"images: expected NHWC, got shape {arr.shape}")
        tiles = [_as_uint8_hwc(arr[i], i) for i in range(arr.shape[0])]
    else:
        tiles = [_as_uint8_hwc(im, i) for i, im in enumerate(images)]
    n = len(tiles)
    if n == 0:
        raise ValueError("save_image_grid: no images")
    if captions is not None and len(captions) != n:
        raise ValueError(f"save_image_grid: {len(captions)} captions for {n} images")
    side = max(max(t.shape[0], t.shape[1]) for t in tiles)
    factor = max(1, math.ceil(min_tile / side)) if min_tile else 1
    tiles = [_nearest_upscale(t, factor) for t in tiles]
    th = max(t.shape[0] for t in tiles)
    tw = max(t.shape[1] for t in tiles)
    ncol = min(nrow, n)
    nrows = math.ceil(n / ncol)

    font = ImageFont.load_default()
    cap_lines: list[list[str]] = [[] for _ in range(n)]
    line_h = 0
    cell_w = tw
    if captions is not None:
        probe = ImageDraw.Draw(Image.new("RGB", (1, 1)))
        bbox = probe.textbbox((0, 0), "Ag", font=font)
        line_h = bbox[3] - bbox[1] + 3
        widest = max((probe.textlength(w, font=font) for c in captions for w in str(c).split()), default=0)
        cell_w = max(tw, math.ceil(widest) + 2)
        cap_lines = [_wrap_caption(probe, c, font, max(cell_w - 2, 8), max(1, max_caption_lines)) for c in captions]
    cap_h = line_h * max((len(c) for c in cap_lines), default=0) + (4 if captions is not None else 0)
    cell_h = th + cap_h
    grid = Image.new(
        "RGB", (ncol * cell_w + (ncol + 1) * padding, nrows * cell_h + (nrows + 1) * padding), (255, 255, 255)
    )
    draw = ImageDraw.Draw(grid)
    for i, t in enumerate(tiles):
        r, c = divmod(i, ncol)
        x = padding + c * (cell_w + padding)
        y = padding + r * (cell_h + padding)
        grid.paste(Image.fromarray(t), (x, y))
        for j, line in enumerate(cap_lines[i]):
            draw.text((x + 1, y + th + 2 + j * line_h), line, fill=(0, 0, 0), font=font)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    grid.save(path, format="PNG")
    return path


# --------------------------------------------------------------------------------------------------- curves
def _ema(values: list[float], smooth: float) -> list[float]:
    """TensorBoard-style debiased EMA: s_t = smooth*s_{t-1} + (1-smooth)*x_t, divided by (1 - smooth^t)."""
    out, acc, w = [], 0.0, 0.0
    for v in values:
        acc = smooth * acc + (1 - smooth) * v
        w = smooth * w + (1 - smooth)
        out.append(acc / w)
    return out


def plot_curves(
    metrics_jsonl: str | os.PathLike,
    keys: Sequence[str],
    out_png: str | os.PathLike,
    smooth: float = 0.0,
    title: str | None = None,
) -> Path:
    """Plot ``keys`` from a ``metrics.jsonl`` against ``step`` (one subplot per key) into ``out_png``.

    ``smooth`` in [0, 1): EMA weight (0 = raw; otherwise raw is drawn faint and the EMA on top). Rows without a
    key, or with null (NaN) values, are left out of that key's curve; a key with no data at all is reported in
    its subplot and logged.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if isinstance(keys, str):
        keys = [keys]
    if not keys:
        raise ValueError("plot_curves: no keys")
    if not (0.0 <= float(smooth) < 1.0):
        raise ValueError(f"plot_curves: smooth must be in [0, 1), got {smooth}")
    rows = read_jsonl(metrics_jsonl)
    fig = Figure(figsize=(6, 2.6 * len(keys)), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(keys), 1, squeeze=False)[:, 0]
    for ax, key in zip(axes, keys):
        pts = []
        for r in rows:
            v = r.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and "step" in r:
                pts.append((r["step"], float(v)))
        pts.sort(key=lambda p: p[0])
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        if not pts:
            _log.warning("plot_curves: no numeric values for %r in %s", key, metrics_jsonl)
            ax.text(0.5, 0.5, f"no data for {key!r}", ha="center", va="center", transform=ax.transAxes)
            continue
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        if smooth > 0:
            ax.plot(xs, ys, color="C0", alpha=0.3, linewidth=1, label="raw")
            ax.plot(xs, _ema(ys, float(smooth)), color="C0", linewidth=1.6, label=f"EMA {smooth}")
            ax.legend(fontsize=8)
        else:
            ax.plot(xs, ys, color="C0", linewidth=1.4, marker="." if len(xs) < 50 else None)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out
