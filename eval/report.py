#!/usr/bin/env python
"""Per-run evaluation report: a markdown table + a JSON summary from a run folder's metrics.json / settings.json.

    python eval/report.py RUN_DIR [RUN_DIR ...]     # writes RUN_DIR/report.md and RUN_DIR/report.json

A run folder is what ``eval/generate_vlm.py`` or ``eval/generate_t2i.py`` writes (``metrics.json`` is required,
``settings.json`` is optional; hand-made files work too).  ``summarize(run_dir)`` is the normalised view that
``eval/compare.py`` puts side by side:

    {"name", "run_dir", "kind": "vlm" | "t2i", "task", "decimals",
     "metrics":   {name: number | {"mean", "std"}}     # headline, in display order
     "details":   {name: number}                       # counts and diagnostics
     "breakdowns": {key: {"columns": [...], "rows": {value: {column: number}}}},
     "settings":  {dotted.key: value}                  # flattened settings.json (bookkeeping dropped)
     "header":    {label: text}, "fingerprint"}

VLM metrics are percentages (eval/score.py); T2I rewards are in each reward's own units (mean ± population std),
Mini-GenEval accuracy is a fraction in [0, 1] as GenEval reports it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval.harness import ResumeError, flatten, write_json  # noqa: E402

__all__ = ["summarize", "render_markdown", "write_report", "fmt_value", "HEADLINE", "run_generation_cli", "main"]

HEADLINE: dict[str, list[str]] = {
    "tvg": ["R1@0.3", "R1@0.5", "R1@0.7", "mIoU", "parse_failure_rate", "n"],
    "mcq": ["accuracy", "soft_accuracy", "mra", "parse_failure_rate", "n"],
    "gqa": ["accuracy", "Acc@GQA", "mIoU", "mIoP", "IoU@0.3", "IoU@0.5", "IoP@0.3", "IoP@0.5", "mIoU_union",
            "parse_failure_rate", "span_parse_failure_rate", "n"],
    "rec": ["Acc@0.5", "mIoU", "parse_failure_rate", "n"],
}
# metrics named by a threshold (custom thresholds produce other names); kept in the headline too
_THRESHOLD_PREFIXES = ("R1@", "Acc@", "IoU@", "IoP@")
DETAILS = ("n_missing", "n_scored", "n_parse_failed", "n_fallback", "n_reversed", "n_clamped", "n_outside_video",
           "n_unmatched_predictions", "n_numeric", "n_span_parse_failed", "n_other_task_skipped")
# per-protocol columns of the "Protocols" table (eval/score.py computes both protocols for every run)
_PROTOCOL_COUNTS = ("n_parse_failed", "parse_failure_rate", "n_missing")
PRIMARY = {"tvg": "mIoU", "mcq": "accuracy", "gqa": "accuracy", "rec": "Acc@0.5"}
# long or bookkeeping settings left out of the flattened view
_DROP_SETTINGS = ("run.", "fingerprint")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON ({e.msg} at line {e.lineno})") from None


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def flat_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Flattened settings without bookkeeping (run.*), per-file hash tables and long prompt texts (hashed)."""
    import hashlib

    out = {}
    for k, v in flatten(settings).items():
        if k.startswith(_DROP_SETTINGS) or ".files." in k or k.endswith(".files"):
            continue
        if isinstance(v, str) and len(v) > 100:  # prompt texts: compared by hash (full text in settings.json)
            v = "sha256:" + hashlib.sha256(v.encode()).hexdigest()[:16]
        out[k] = v
    return out


def _vlm_summary(m: Mapping[str, Any]) -> dict:
    task = (m.get("config") or {}).get("task") or m.get("task") or "tvg"
    order = list(HEADLINE.get(task, []))
    extra = sorted(k for k in m if k.startswith(_THRESHOLD_PREFIXES) and k not in order)
    metrics = {}
    for k in order[:-1] + extra + order[-1:]:  # "n" last
        if k in m and (m[k] is None or _is_num(m[k])):
            metrics[k] = m[k]
    details = {k: m[k] for k in DETAILS if k in m}
    for k, v in (m.get("generation") or {}).items():
        if v is None or _is_num(v):
            details[f"generation.{k}"] = v
    breakdowns = {}
    cols = [k for k in metrics if k != "n"]
    for key, groups in (m.get("by") or {}).items():
        rows = {}
        for val, agg in groups.items():
            rows[str(val)] = {"n": agg.get("n"), **{c: agg.get(c) for c in cols}}
        breakdowns[key] = {"columns": ["n"] + cols, "rows": rows}
    protocols = {}
    for name, pm in (m.get("protocols") or {}).items():
        vals = {k: pm[k] for k in list(metrics) + [k for k in pm if k.startswith(_THRESHOLD_PREFIXES)]
                if k in pm and k != "n" and (pm[k] is None or _is_num(pm[k]))}
        vals.update({k: pm.get(k) for k in _PROTOCOL_COUNTS})
        protocols[name] = {"reference": pm.get("reference"), "parse_mode": pm.get("parse_mode"), "metrics": vals}
    return {"kind": "vlm", "task": task, "decimals": 2, "metrics": metrics, "details": details,
            "breakdowns": breakdowns, "primary": PRIMARY.get(task), "protocols": protocols,
            "protocol": (m.get("protocol") or {}).get("name")}


def _t2i_summary(m: Mapping[str, Any]) -> dict:
    metrics: dict[str, Any] = {}
    for k, st in (m.get("rewards") or {}).items():
        metrics[k] = {"mean": st.get("mean"), "std": st.get("std")}
    mg = m.get("mini_geneval")
    if mg:
        metrics["mini_geneval accuracy"] = mg.get("accuracy")
        metrics["mini_geneval overall"] = mg.get("overall")
    metrics["n_images"] = m.get("n_images")
    details = {k: m[k] for k in ("n_prompts", "images_per_prompt") if k in m}
    breakdowns = {}
    by_tag = m.get("by_tag") or {}
    if by_tag:
        keys = list(m.get("rewards") or {})
        rows = {}
        for tag, agg in by_tag.items():
            row = {"n": agg.get("n")}
            for k in keys:
                row[k] = (agg.get("rewards") or {}).get(k)
            if mg and tag in (mg.get("by_tag") or {}):
                row["mini_geneval accuracy"] = mg["by_tag"][tag]
            rows[str(tag)] = row
        cols = ["n"] + keys + (["mini_geneval accuracy"] if mg else [])
        breakdowns["tag"] = {"columns": cols, "rows": rows}
    first = next(iter(m.get("rewards") or {}), None)
    primary = "mini_geneval accuracy" if mg else first
    return {"kind": "t2i", "task": "t2i", "decimals": 4, "metrics": metrics, "details": details,
            "breakdowns": breakdowns, "primary": primary}


def _header(kind: str, s: Mapping[str, Any]) -> dict[str, str]:
    """A few human-readable lines of the settings that matter most (from the flattened settings)."""
    def g(k, short=False):
        v = s.get(k)
        if v is None:
            return None
        v = str(v)
        return v[:12] if short else v

    h: dict[str, str] = {}
    if kind == "vlm":
        if g("model.path"):
            h["model"] = g("model.path") + (f" (digest {g('model.fingerprint.digest', True)})"
                                            if g("model.fingerprint.digest") else "")
            if g("model.adapter"):
                h["model"] += f" + adapter {g('model.adapter')}"
            h["model"] += f", {g('model.family')}, {g('model.dtype')}"
        if g("prompt.mode"):
            h["prompt"] = f"{g('prompt.mode')}, answer format {g('prompt.answer_format')}"
        if g("video.fps"):
            h["video"] = (f"fps {g('video.fps')}, frames {g('video.min_frames')}-{g('video.max_frames')}, pixels/frame "
                          f"{g('video.min_pixels')}-{g('video.max_pixels')}, total {g('video.total_pixels')}")
        if g("decoding.max_new_tokens"):
            dec = "greedy" if s.get("decoding.greedy") else (
                f"sampling T={g('decoding.temperature')} top_p={g('decoding.top_p')} seed={g('decoding.seed')}")
            h["decoding"] = f"{dec}, max_new_tokens {g('decoding.max_new_tokens')}, batch {g('decoding.batch_size')}"
        if g("data.annotations"):
            h["data"] = f"{g('data.annotations')} (sha256 {g('data.sha256', True)}, n={g('data.n')})"
    else:
        if g("model.pipeline"):
            h["model"] = g("model.pipeline") + (f" (digest {g('model.fingerprint.digest', True)})"
                                                if g("model.fingerprint.digest") else "")
            if g("model.lora"):
                h["model"] += f" + LoRA {g('model.lora')}"
        if g("sampling.num_steps"):
            h["sampling"] = (f"ODE {g('sampling.num_steps')} steps, guidance {g('sampling.guidance_scale')} "
                             f"(cfg {g('sampling.cfg')}), {g('sampling.height')}x{g('sampling.width')}, seed "
                             f"{g('sampling.seed')}")
        if g("prompts.file"):
            h["prompts"] = (f"{g('prompts.file')} (sha256 {g('prompts.sha256', True)}, {g('prompts.n_prompts')} "
                            f"prompts x {g('prompts.images_per_prompt')} images)")
    return h


def summarize(run_dir: str | Path, name: Optional[str] = None) -> dict:
    """Normalised summary of one run folder (see the module docstring)."""
    rd = Path(run_dir)
    mp = rd / "metrics.json"
    if not mp.is_file():
        raise FileNotFoundError(f"{mp} not found (run eval/generate_vlm.py or eval/generate_t2i.py to the end first)")
    m = _read_json(mp)
    if not isinstance(m, dict):
        raise ValueError(f"{mp}: expected a JSON object")
    sp = rd / "settings.json"
    settings = _read_json(sp) if sp.is_file() else {}
    kind = m.get("kind") or ("t2i" if "rewards" in m else "vlm")
    out = _t2i_summary(m) if kind == "t2i" else _vlm_summary(m)
    flat = flat_settings(settings) if isinstance(settings, dict) else {}
    run_name = name or (settings.get("run") or {}).get("name") or rd.resolve().name
    out.update(name=run_name, run_dir=str(rd), settings=flat, header=_header(kind, flat),
               fingerprint=settings.get("fingerprint") if isinstance(settings, dict) else None)
    return out


# ------------------------------------------------------------------------------------------------ markdown
def fmt_value(v: Any, decimals: int = 2) -> str:
    """Table cell: ints as is, floats with ``decimals``, ``{"mean", "std"}`` as ``mean ± std``, None as ``-``."""
    if v is None:
        return "-"
    if isinstance(v, Mapping):
        if v.get("mean") is None:
            return "-"
        return f"{fmt_value(v.get('mean'), decimals)} ± {fmt_value(v.get('std'), decimals)}"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return f"{v:.{decimals}f}" if math.isfinite(v) else str(v)
    return str(v)


def md_table(header: Sequence[str], rows: Sequence[Sequence[str]], align_first_left: bool = True) -> str:
    esc = [[str(c).replace("|", "\\|") for c in r] for r in [list(header)] + [list(r) for r in rows]]
    lines = ["| " + " | ".join(esc[0]) + " |",
             "|" + "|".join([":---" if (i == 0 and align_first_left) else "---:" for i in range(len(header))]) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in esc[1:]]
    return "\n".join(lines)


def render_markdown(summary: Mapping[str, Any]) -> str:
    d = summary["decimals"]
    parts = [f"# Evaluation: {summary['name']}", ""]
    parts.append(f"- kind: {summary['kind']}, task: {summary['task']}")
    for k, v in summary.get("header", {}).items():
        parts.append(f"- {k}: {v}")
    if summary.get("fingerprint"):
        parts.append(f"- settings fingerprint: {summary['fingerprint'][:16]}")
    if summary.get("protocol"):
        parts.append(f"- protocol of the table below: {summary['protocol']} (both protocols: see Protocols)")
    parts += ["", md_table(["metric", "value"], [[k, fmt_value(v, d)] for k, v in summary["metrics"].items()])]
    if summary.get("protocols"):
        cols: list[str] = []
        for pr in summary["protocols"].values():
            cols += [k for k in pr["metrics"] if k not in cols]
        rows = [[name, str(pr.get("reference"))] + [fmt_value(pr["metrics"].get(c), d) for c in cols]
                for name, pr in summary["protocols"].items()]
        parts += ["", "## Protocols", "", md_table(["protocol", "reproduces"] + cols, rows)]
    if summary.get("details"):
        parts += ["", "<details><summary>counts and diagnostics</summary>", "",
                  md_table(["detail", "value"], [[k, fmt_value(v, d)] for k, v in summary["details"].items()]),
                  "", "</details>"]
    for key, bd in summary.get("breakdowns", {}).items():
        cols = bd["columns"]
        rows = [[val] + [fmt_value(r.get(c), d) for c in cols] for val, r in bd["rows"].items()]
        parts += ["", f"## By {key}", "", md_table([key] + cols, rows)]
    return "\n".join(parts) + "\n"


def write_report(run_dir: str | Path, name: Optional[str] = None) -> dict:
    """Write ``report.md`` and ``report.json`` into ``run_dir``; returns the summary."""
    s = summarize(run_dir, name)
    rd = Path(run_dir)
    (rd / "report.md").write_text(render_markdown(s), encoding="utf-8")
    write_json(rd / "report.json", s)
    return s


def run_generation_cli(config_cls: type, run_fn, argv: Sequence[str] | None, prog: str, description: str) -> int:
    """Shared ``main`` of the generation scripts: parse ``--config``/``key=value``, run, print the metrics.

    Input problems (bad paths, values, a refused resume) print one ``error:`` line and exit 1 (set
    ``MMGRPO_TRACEBACK=1`` for the traceback); an interrupted run (``max_batches``) prints its progress and exits 0.
    """
    from mmgrpo.utils.config import parse_config_cli
    from mmgrpo.utils.profiles import expand_profile

    argv = list(sys.argv[1:] if argv is None else argv)
    kind = "eval_t2i" if "t2i" in prog else "eval_vlm"  # --profile NAME: mmgrpo/utils/profiles.py
    cfg = parse_config_cli(config_cls, expand_profile(argv, kind, prog), prog=prog,
                           description=description + " --profile cpu: a CPU rehearsal's budgets (2 samples).")
    try:
        res = run_fn(cfg)
    except (ValueError, FileNotFoundError, ResumeError) as e:
        if os.environ.get("MMGRPO_TRACEBACK"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
    if res["metrics"] is None:
        print(json.dumps({"interrupted": True, **res["stats"]}))
        return 0
    print(json.dumps(summarize(res["out_dir"])["metrics"], indent=1))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="eval/report.py", description="Write report.md + report.json for run folders.")
    p.add_argument("run_dirs", nargs="+", help="run folders holding metrics.json (and settings.json)")
    p.add_argument("--print", action="store_true", help="also print the markdown")
    a = p.parse_args(argv)
    for rd in a.run_dirs:
        try:
            s = write_report(rd)
        except (FileNotFoundError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        if a.print:
            print(render_markdown(s))
        else:
            print(f"wrote {Path(rd) / 'report.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
