#!/usr/bin/env python
"""Put evaluation runs side by side (base vs fine-tuned vs variants), with deltas, and plot training curves.

    python eval/compare.py runs/eval/charades_base runs/eval/charades_grpo runs/eval/charades_tempsamp \
        --out cmp.md [--names base,grpo,tempsamp] [--baseline base] \
        [--curves runs/grpo runs/tempsamp --curve-keys reward/iou/mean,reward/format/mean --smooth 0.6]

* The metric table has one column per run and one ``Δ <run>`` column per non-baseline run (value - baseline; for
  ``mean ± std`` entries the difference of the means).  Breakdowns present in every run (e.g. duration buckets,
  GenEval tags) get a table of the primary metric.
* **Settings that differ** lists every setting (flattened settings.json) whose value is not the same in all runs.
  When anything other than the model differs -- data file, frames, pixels, prompt, decoding -- the report warns:
  such numbers are not a like-for-like comparison (published Qwen2.5-VL-7B Charades-STA baselines range from
  29.0 to 43.6 mIoU with prompt and fps alone).
* ``--curves``: training logs (``metrics.jsonl`` written by ``mmgrpo.utils.logging.MetricLogger``, or run folders
  holding one) overlaid per key in one PNG (``<out>_curves.png``), linked from the markdown.  Default keys: the
  ``reward/.../mean`` style keys of the first log (at most 6).

Writes ``--out`` (markdown) and the same content as JSON next to it (``.json``).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval.harness import write_json  # noqa: E402
from eval.report import fmt_value, md_table, summarize  # noqa: E402

__all__ = ["compare", "render_comparison", "settings_diff", "plot_training_curves", "default_curve_keys", "read_rows",
           "main"]

# settings that identify the model (and the code revision), not the evaluation protocol; everything else that
# differs (dtype, processor, frames, pixels, prompt, decoding, sampler, library versions, ...) is protocol
MODEL_KEYS = ("model.path", "model.fingerprint", "model.adapter", "model.merge_adapter", "model.family",
              "model.pipeline", "model.lora", "code.")
# settings whose difference makes the comparison meaningless (different data)
DATA_KEYS = ("data.sha256", "data.n", "prompts.sha256", "prompts.n_prompts", "task", "kind")


def _mean(v: Any) -> Optional[float]:
    """The number a delta is taken of: the value itself, or the mean of a ``{"mean", "std"}`` entry."""
    if isinstance(v, Mapping):
        v = v.get("mean")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, int):
        return v  # counts stay integers (delta "+3", not "+3.00")
    return float(v) if math.isfinite(v) else None


def _unique_names(summaries: Sequence[dict], names: Optional[Sequence[str]]) -> list[str]:
    if names:
        if len(names) != len(summaries):
            raise ValueError(f"--names gives {len(names)} names for {len(summaries)} runs")
        out = list(names)
    else:
        out = [s["name"] for s in summaries]
    seen: dict[str, int] = {}
    for i, n in enumerate(out):
        if n in seen:
            seen[n] += 1
            out[i] = f"{n} ({seen[n]})"
        else:
            seen[n] = 1
    return out


def settings_diff(summaries: Sequence[dict]) -> dict[str, list[Any]]:
    """{dotted setting: [value per run]} for settings whose values are not all equal (missing = None)."""
    keys: list[str] = []
    for s in summaries:
        for k in s.get("settings", {}):
            if k not in keys:
                keys.append(k)
    out = {}
    for k in keys:
        vals = [s.get("settings", {}).get(k) for s in summaries]
        if any(json.dumps(v, sort_keys=True, default=str) != json.dumps(vals[0], sort_keys=True, default=str)
               for v in vals[1:]):
            out[k] = vals
    return out


def compare(run_dirs: Sequence[str | Path], names: Optional[Sequence[str]] = None,
            baseline: str | int = 0) -> dict:
    """Comparison data: runs, metric rows with deltas, common breakdowns, settings differences, warnings."""
    if not run_dirs:
        raise ValueError("no run folders given")
    sums = [summarize(d) for d in run_dirs]
    run_names = _unique_names(sums, names)
    if isinstance(baseline, str) and not baseline.isdigit():
        if baseline not in run_names:
            raise ValueError(f"--baseline {baseline!r} is not one of the runs {run_names}")
        b = run_names.index(baseline)
    else:
        b = int(baseline)
        if not 0 <= b < len(sums):
            raise ValueError(f"--baseline index {b} out of range for {len(sums)} runs")
    metrics: list[str] = []
    for s in [sums[b]] + sums:
        for k in s["metrics"]:
            if k not in metrics:
                metrics.append(k)
    rows = []
    for k in metrics:
        vals = [s["metrics"].get(k) for s in sums]
        base = _mean(vals[b])
        deltas = {}
        for i, v in enumerate(vals):
            if i == b:
                continue
            mv = _mean(v)
            deltas[run_names[i]] = None if (mv is None or base is None) else mv - base
        rows.append({"metric": k, "values": vals, "deltas": deltas})
    kinds = {s["kind"] for s in sums}
    tasks = {s["task"] for s in sums}
    warnings = []
    if len(kinds) > 1 or len(tasks) > 1:
        warnings.append(f"runs evaluate different kinds/tasks ({sorted(kinds)} / {sorted(tasks)})")
    protos = {str(s.get("protocol")) for s in sums if s.get("kind") == "vlm"}
    if len(protos) > 1:  # e.g. one run scored with a release's evaluation, another with the lenient parser
        warnings.append(f"runs report different scoring protocols ({sorted(protos)}): their headline numbers are "
                        "not comparable; each report.md's Protocols table has both")
    diff = settings_diff(sums)
    data_diff = [k for k in diff if k in DATA_KEYS or k.startswith("data.annotations") or k == "prompts.file"]
    if any(k in DATA_KEYS for k in data_diff):
        warnings.append("different evaluation data (" + ", ".join(k for k in data_diff if k in DATA_KEYS) +
                        "): the numbers are not comparable")
    protocol = [k for k in diff if not k.startswith(MODEL_KEYS) and k not in DATA_KEYS
                and not k.startswith(("data.annotations", "prompts.file", "data.media_root"))]
    if protocol:
        warnings.append("not only the model differs: " + ", ".join(protocol[:10]) +
                        (f" (+{len(protocol) - 10} more)" if len(protocol) > 10 else "") +
                        " -- re-evaluate every model with the same settings for a like-for-like comparison")
    missing_settings = [run_names[i] for i, s in enumerate(sums) if not s.get("settings")]
    if missing_settings:
        warnings.append(f"no settings.json for {missing_settings}: comparability cannot be checked")
    breakdowns = {}
    common = set(sums[0]["breakdowns"])
    for s in sums[1:]:
        common &= set(s["breakdowns"])
    for key in sorted(common):
        primary = sums[b].get("primary")
        values: list[str] = []
        for s in sums:
            for v in s["breakdowns"][key]["rows"]:
                if v not in values:
                    values.append(v)
        table = {}
        for v in values:
            table[v] = [s["breakdowns"][key]["rows"].get(v, {}).get(primary) for s in sums]
        breakdowns[key] = {"metric": primary, "rows": table}
    return {"runs": [{"name": n, "run_dir": s["run_dir"], "kind": s["kind"], "task": s["task"],
                      "fingerprint": s.get("fingerprint"), "header": s.get("header", {})}
                     for n, s in zip(run_names, sums)],
            "baseline": run_names[b], "decimals": sums[b]["decimals"], "rows": rows, "breakdowns": breakdowns,
            "settings_diff": diff, "warnings": warnings}


def _fmt_delta(d: Optional[float], decimals: int) -> str:
    if d is None:
        return "-"
    if isinstance(d, int):
        return f"{d:+d}"
    return f"{d:+.{decimals}f}"


def _short(v: Any, n: int = 48) -> str:
    s = fmt_value(v, 4) if not isinstance(v, (list, dict)) else json.dumps(v, default=str)
    return s if len(s) <= n else s[: n - 3] + "..."


def render_comparison(cmp: Mapping[str, Any], curves_png: Optional[str] = None) -> str:
    names = [r["name"] for r in cmp["runs"]]
    d = cmp["decimals"]
    others = [n for n in names if n != cmp["baseline"]]
    parts = ["# Comparison", "", f"baseline: **{cmp['baseline']}**", ""]
    for r in cmp["runs"]:
        parts.append(f"- **{r['name']}** ({r['kind']}/{r['task']}): `{r['run_dir']}`"
                     + (f" - {r['header'].get('model')}" if r["header"].get("model") else ""))
    if cmp["warnings"]:
        parts += [""] + [f"> **Warning:** {w}" for w in cmp["warnings"]]
    header = ["metric"] + names + [f"Δ {n}" for n in others]
    rows = [[r["metric"]] + [fmt_value(v, d) for v in r["values"]] + [_fmt_delta(r["deltas"][n], d) for n in others]
            for r in cmp["rows"]]
    parts += ["", md_table(header, rows)]
    for key, bd in cmp["breakdowns"].items():
        base_i = names.index(cmp["baseline"])
        rws = []
        for v, vals in bd["rows"].items():
            b = _mean(vals[base_i])
            dl = [_fmt_delta(None if (_mean(x) is None or b is None) else _mean(x) - b, d)
                  for i, x in enumerate(vals) if i != base_i]
            rws.append([v] + [fmt_value(x, d) for x in vals] + dl)
        parts += ["", f"## {bd['metric']} by {key}", "",
                  md_table([key] + names + [f"Δ {n}" for n in others], rws)]
    parts += ["", "## Settings that differ", ""]
    if cmp["settings_diff"]:
        parts.append(md_table(["setting"] + names, [[k] + [_short(v) for v in vals]
                                                    for k, vals in cmp["settings_diff"].items()]))
    else:
        parts.append("none (identical settings apart from the run folder)")
    if curves_png:
        parts += ["", "## Training curves", "", f"![training curves]({curves_png})"]
    return "\n".join(parts) + "\n"


# ------------------------------------------------------------------------------------------------ curves
def _log_path(p: str | Path) -> Path:
    p = Path(p)
    if p.is_dir():
        p = p / "metrics.jsonl"
    if not p.is_file():
        raise FileNotFoundError(f"training log not found: {p} (expected metrics.jsonl or a run folder holding it)")
    return p


def read_rows(log: str | Path) -> list[dict]:
    """Rows of a training log (``metrics.jsonl`` or a run folder holding one); torn lines are skipped and logged."""
    from mmgrpo.utils.logging import read_jsonl

    return read_jsonl(_log_path(log))


def default_curve_keys(rows: Sequence[Mapping[str, Any]], limit: int = 6) -> list[str]:
    """``reward/mean`` and ``reward/<name>/mean`` style keys (then other ``reward/*`` keys except std), in order
    of first appearance."""
    keys: list[str] = []
    for r in rows:
        for k in r:
            if k not in keys:
                keys.append(k)
    means = [k for k in keys if k.startswith("reward/") and (k.endswith("/mean") or k == "reward/mean")]
    rest = [k for k in keys if k.startswith(("reward/", "eval/")) and k not in means and "std" not in k]
    return (means + rest)[:limit]


def _ema(values: list[float], smooth: float) -> list[float]:
    """TensorBoard-style debiased EMA (same rule as mmgrpo.utils.logging.plot_curves)."""
    out, acc, w = [], 0.0, 0.0
    for v in values:
        acc = smooth * acc + (1 - smooth) * v
        w = smooth * w + (1 - smooth)
        out.append(acc / w)
    return out


def plot_training_curves(logs: Sequence[str | Path], out_png: str | Path, keys: Optional[Sequence[str]] = None,
                         names: Optional[Sequence[str]] = None, smooth: float = 0.0) -> dict:
    """One subplot per key, one line per log; returns ``{key: {name: (steps, values)}}`` (raw, unsmoothed).

    Rows without the key or with a null / non-finite value are left out of that curve."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not logs:
        raise ValueError("no training logs")
    if not 0.0 <= smooth < 1.0:
        raise ValueError(f"smooth must be in [0, 1), got {smooth}")
    paths = [_log_path(p) for p in logs]
    names = list(names) if names else [p.parent.name for p in paths]
    if len(names) != len(paths):
        raise ValueError(f"{len(names)} curve names for {len(paths)} logs")
    all_rows = [read_rows(p) for p in paths]
    keys = list(keys) if keys else default_curve_keys(all_rows[0])
    if not keys:
        raise ValueError(f"{paths[0]}: no reward/* keys to plot; pass --curve-keys")
    data: dict[str, dict[str, tuple[list, list]]] = {}
    fig = Figure(figsize=(6.5, 2.6 * len(keys)), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(keys), 1, squeeze=False)[:, 0]
    for ax, key in zip(axes, keys):
        data[key] = {}
        for ci, (name, rows) in enumerate(zip(names, all_rows)):
            pts = sorted((r["step"], float(r[key])) for r in rows
                         if "step" in r and isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)
                         and math.isfinite(r[key]))
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            data[key][name] = (xs, ys)
            if not pts:
                continue
            if smooth > 0:
                ax.plot(xs, ys, color=f"C{ci}", alpha=0.25, linewidth=1)
                ax.plot(xs, _ema(ys, smooth), color=f"C{ci}", linewidth=1.6, label=name)
            else:
                ax.plot(xs, ys, color=f"C{ci}", linewidth=1.4, label=name)
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        if any(v[0] for v in data[key].values()):
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, f"no data for {key!r}", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return data


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="eval/compare.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dirs", nargs="+", help="evaluation run folders (metrics.json + settings.json)")
    p.add_argument("--out", required=True, help="markdown file to write (a .json twin is written next to it)")
    p.add_argument("--names", default="", help="comma-separated display names (default: run names)")
    p.add_argument("--baseline", default="0", help="baseline run: name or index (default: the first)")
    p.add_argument("--curves", nargs="*", default=[], help="training logs (metrics.jsonl or run folders)")
    p.add_argument("--curve-names", default="", help="comma-separated names of the training logs")
    p.add_argument("--curve-keys", default="", help="comma-separated keys to plot (default: reward/*/mean keys)")
    p.add_argument("--smooth", type=float, default=0.0, help="EMA smoothing of the curves in [0, 1)")
    a = p.parse_args(argv)
    split = lambda s: [x.strip() for x in s.split(",") if x.strip()]  # noqa: E731
    try:
        cmp = compare(a.run_dirs, split(a.names) or None, a.baseline)
        out = Path(a.out)
        png = None
        if a.curves:
            png_path = out.with_name(out.stem + "_curves.png")
            cmp["curves"] = {k: {n: {"steps": xs, "values": ys} for n, (xs, ys) in v.items()}
                             for k, v in plot_training_curves(a.curves, png_path, split(a.curve_keys) or None,
                                                              split(a.curve_names) or None, a.smooth).items()}
            png = png_path.name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_comparison(cmp, png), encoding="utf-8")
        write_json(out.with_suffix(".json"), cmp)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {out}" + (f" and {out.with_name(png)}" if png else ""))
    for w in cmp["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
