#!/usr/bin/env python
"""Every GRPO method of a front-end at an equal training-time budget, several seeds, on the built-in synthetic
benchmarks; held-out metrics from the ``eval/`` harness, reward curves and a table.

    python scripts/compare_methods.py vlm  --out runs/compare_vlm  --seeds 0,1,2 --budget 120
    python scripts/compare_methods.py flow --out runs/compare_flow --seeds 0,1,2 --budget 120

(``scripts/compare_vlm_methods.sh`` / ``scripts/compare_flow_methods.sh`` call these with their defaults.)

* **Same start, same data, same evaluation as the CPU demo** (``scripts/demo.py``): the shipped tiny bases, the
  demo's GRPO settings (LoRA, learning rate, group size, prompts per step) and eval commands; only the method
  switches differ: one trainer config per method in ``configs/compare/<frontend>/<method>.yaml`` (passed as
  ``--config``; the demo's overrides of the keys any recipe sets are removed so that the recipe decides them). A
  new method to compare is a new YAML file there.
* **Equal budget**: every run trains for ``--budget`` seconds of *process CPU time* (``run.max_train_seconds``,
  ``run.budget_clock=cpu``; one torch thread), which other jobs on a shared machine barely disturb. The tokens
  (VLM) or denoiser evaluations (flow) each method spent are reported next to its result, so the equal-time
  comparison can be read as an equal-compute one too.
* **Seed noise**: for each method, mean and sample std over seeds of its gain over the start (paired by seed); its
  difference from the first method (the reference: plain GRPO / Flow-GRPO) is called *larger than seed noise* when it exceeds
  twice its standard error ``sqrt(s1^2/n1 + s2^2/n2)``. With 2-3 seeds this is a coarse screen, not a test.

Outputs in ``--out``: ``results.json`` (every run), ``results.md`` (the table), ``curves.png`` (training reward vs
budget seconds, mean over seeds), one folder per ``<method>/seed<k>`` with its run and eval.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO))

import demo  # noqa: E402  (the demo's command builders: one definition of "how the demo trains and evaluates")

PY = sys.executable
RECIPES = Path("configs") / "compare"  # relative to the repository (the commands run there)
REFERENCE = {"vlm": "grpo", "flow": "flow_grpo_sde"}  # first row of the table; the others are compared with it


def method_recipes(frontend: str, folder: str | Path | None = None) -> dict[str, Path]:
    """method -> its recipe (``configs/compare/<frontend>/<method>.yaml``, or ``<folder>/<method>.yaml``): the
    reference first, then by name."""
    folder = Path(folder) if folder else RECIPES / frontend
    files = sorted((REPO / folder).glob("*.yaml"))
    if not files:
        raise SystemExit(f"[compare] no recipes (*.yaml) in {REPO / folder}")
    names = sorted((f.stem for f in files), key=lambda n: (n != REFERENCE[frontend], n))
    return {n: folder / f"{n}.yaml" for n in names}


def all_recipes(frontend: str, folder: str | Path | None) -> list[Path]:
    """The recipes whose keys leave the demo's command: the default folder's (so the demo's own method switch,
    TempSamp-R1, never leaks into a run of another folder) and those of ``folder`` if given."""
    return list(method_recipes(frontend).values()) + (list(method_recipes(frontend, folder).values()) if folder else [])


@functools.lru_cache(maxsize=None)
def recipe_keys(recipe: Path) -> frozenset[str]:
    """The dotted config keys a recipe sets (``{algo: {clip_high: 0.28}}`` -> ``algo.clip_high``)."""
    import yaml

    def flat(d: dict, prefix: str = "") -> list[str]:
        return [k for key, v in d.items()
                for k in (flat(v, f"{prefix}{key}.") if isinstance(v, dict) and v else [f"{prefix}{key}"])]

    return frozenset(flat(yaml.safe_load((REPO / recipe).read_text()) or {}))


def with_recipe(cmd: list[str], recipe: Path) -> list[str]:
    """``... train --config <recipe> <cmd's overrides>`` (a recipe is a trainer config: below the overrides)."""
    i = cmd.index("train") + 1
    return cmd[:i] + ["--config", str(recipe)] + cmd[i:]


def without_recipe_keys(cmd: list[str], recipes) -> list[str]:
    """``cmd`` without the overrides of keys that a recipe sets, or of a section holding one (``reward.weights``
    when a recipe sets ``reward.weights.iou``): the recipe must decide them, not the demo."""
    keys = {k for r in recipes for k in recipe_keys(r)}
    keys |= {k.rsplit(".", i)[0] for k in keys for i in range(1, k.count(".") + 1)}
    return without_keys(cmd, keys)


# ---------------------------------------------------------------------------------------------------- statistics
def summarize(values: list[float]) -> dict:
    """Mean, sample std (0 for one value) and n of a list of floats (None entries dropped)."""
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not v:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0, "n": len(v)}


def beyond_noise(a: dict, b: dict, k: float = 2.0) -> bool | None:
    """Is mean(a) - mean(b) larger than k standard errors ``sqrt(s_a^2/n_a + s_b^2/n_b)``? None if undefined
    (fewer than 2 seeds on either side)."""
    if not a.get("n") or not b.get("n") or a["n"] < 2 or b["n"] < 2:
        return None
    se = math.sqrt(a["std"] ** 2 / a["n"] + b["std"] ** 2 / b["n"])
    diff = a["mean"] - b["mean"]
    return abs(diff) > k * se if se > 0 else diff != 0


def read_metrics(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []


def vlm_steps(hist: list[dict]) -> int:
    """Optimizer steps of a VLM run: its last logged step. Not the number of rows: the demo's TVG settings validate
    at step 0, a row with no training step, so counting rows overstated every run by one."""
    return max((int(h.get("step", 0)) for h in hist), default=0)


# ---------------------------------------------------------------------------------------------------- front-ends
def run_vlm(runner: demo.Runner, args, methods: dict[str, Path]) -> list[dict]:
    recipe = demo.load_recipes().tvg
    s = demo.tvg_setup(runner, args, recipe, runner.out / "shared")
    base, ev = s["base"], s["eval_cmd"]
    # the demo's own method switch (TempSamp-R1) must not leak into the other methods' runs
    s["train_cmd"] = without_recipe_keys(s["train_cmd"], all_recipes("vlm", args.recipes))
    annotations = s["data_dir"] / "eval.jsonl"
    if args.eval_split == "validation":
        # a fresh draw of the same generator (the base's benchmark, another seed): for choosing settings without
        # touching held-out data
        annotations = runner.out / "shared" / "validation" / "eval.jsonl"
        runner.run("validation_data", validation_data_cmd(recipe, s["report"], annotations.parent,
                                                          args.tvg_eval if args.smoke else 100))
        ev = ev + [f"data.annotations={annotations}"]
    runner.run("base_eval", ev + [f"model={base}", f"out_dir={runner.out / 'base_eval'}"])  # greedy: seed-free
    base_m = demo._read_json(runner.out / "base_eval" / "metrics.json")
    anns = {} if runner.dry_run else demo.read_annotations(annotations)
    mode = demo.headline_parse_mode(base_m)  # the probes read the outputs as the headline protocol does
    args.base_probes = demo.prediction_probes(anns, runner.out / "base_eval" / "predictions.jsonl", mode)
    args.base_shape = demo.tvg_summary(base_m) if base_m else None
    rows = []
    for name, recipe in methods.items():
        for seed in args.seed_list:
            d = runner.out / name / f"seed{seed}"
            if not finished(d) and not attempt(runner, f"{name}_s{seed}_train", with_recipe(s["train_cmd"], recipe) +
                                               budget_overrides(args, "run.max_steps") +
                                               [f"run.output_dir={d / 'run'}", f"run.seed={seed}"]):
                rows.append({"method": name, "seed": seed, "error": "training failed (see the log)"})
                continue
            ckpt = demo.latest_checkpoint(d / "run") if not runner.dry_run else d / "run" / "checkpoints" / "x"
            if not finished(d) and (ckpt is None or not attempt(
                    runner, f"{name}_s{seed}_eval", ev + [f"out_dir={d / 'eval'}"] + trained_model(
                        runner, base, ckpt, d / "model", recipe))):
                rows.append({"method": name, "seed": seed, "error": "evaluation failed (see the log)"})
                continue
            hist = read_metrics(d / "run" / "metrics.jsonl")
            m = demo._read_json(d / "eval" / "metrics.json")
            sm = demo.tvg_summary(m)
            rows.append({"method": name, "seed": seed, "metric": m.get("mIoU"), "R1@0.5": m.get("R1@0.5"),
                         "base_R1@0.5": base_m.get("R1@0.5"),
                         "base_metric": base_m.get("mIoU"), "steps": vlm_steps(hist),
                         # the protocol of "metric", the lenient parser's mIoU, the answers' shape
                         "protocol": sm["protocol"], "lenient_mIoU": (sm.get("lenient") or {}).get("mIoU"),
                         "well_formed": sm["well_formed"], "truncated": sm["truncated"],
                         "probes": demo.prediction_probes(anns, d / "eval" / "predictions.jsonl", mode),
                         "train_seconds": hist[-1].get("perf/train_seconds") if hist else None,
                         "compute": hist[-1].get("perf/generated_tokens") if hist else None,
                         # the task reward of on-policy rows (IoU), not the method-shaped total (T-GRPO bonus)
                         "curve": [(h.get("perf/train_seconds"), h.get("reward/iou/mean")) for h in hist]})
    return rows


def validation_data_cmd(recipe, report: dict, out: Path, n_videos: int) -> list[str]:
    """The generator command of the validation draw (``--eval-split validation``): the base's own benchmark (the
    demo's ``benchmark_script`` and ``benchmark_args``) with its seed + ``validation_seed_offset``, ``n_videos``
    held-out videos; disjoint from the training and held-out splits."""
    return demo.validation_data_cmd(recipe, demo.benchmark_sizes(report).get("seed", 0), out, n_videos)


def trained_model(runner: demo.Runner, base: Path, ckpt: Path, export: Path, recipe: Path) -> list[str]:
    """The evaluator's model arguments for a trained VLM run: the base + the checkpoint's LoRA ``adapter/``, or, for
    a full fine-tune (``model.lora.enabled: false`` in the recipe; its checkpoint has no model folder), the base
    with the checkpoint's trained weights written once as a model folder ``export`` (:func:`export_full_model`)."""
    import yaml

    lora = ((yaml.safe_load((REPO / recipe).read_text()) or {}).get("model", {}).get("lora", {}) or {}).get(
        "enabled", True)
    if lora:
        return [f"model={base}", f"adapter={ckpt / 'adapter'}"]
    if not runner.dry_run and not (export / "config.json").exists():
        export_full_model(base, ckpt, export)
    return [f"model={export}"]


def export_full_model(base: Path, ckpt: Path, out: Path) -> None:
    """A full fine-tune's checkpoint as a model folder: ``base`` with the checkpoint's trained weights
    (``policy.pt``, loaded tensors-only) saved with ``save_pretrained``."""
    from mmgrpo.vlm.models.adapters import load_policy
    from mmgrpo.utils.checkpoint import CheckpointManager

    policy = load_policy(str(base), dtype="float32")  # the trainer's defaults: vision frozen, float32
    policy.load_trainable_state_dict(CheckpointManager(ckpt.parent).load(ckpt)["policy"])
    policy.save_pretrained(out)


def flow_setup(runner: demo.Runner, args) -> dict:
    """The demo's T2I setup; :func:`method_cmd` removes from the demo's GRPO command the keys that the compared
    method's own preset and recipe set (they decide them; other methods keep the demo's values: a global strip
    let the nft preset's ``sample.cfg`` turn CFG on for every method)."""
    from flow_grpo.config import preset_names, preset_values

    s = demo.t2i_setup(runner, args, demo.load_recipes().t2i, runner.out / "shared")
    if s.get("skipped"):
        raise SystemExit(f"[compare] {s['skipped']}")
    s["train_cmd"] = without_keys(s["train_cmd"], {"method"})
    s["preset_keys"] = {name: set(preset_values(name)) for name in preset_names()}
    return s


def method_cmd(s: dict, recipe: Path) -> list[str]:
    """The demo's GRPO command with the recipe, minus the keys the recipe sets and those of its preset
    (``method:``). Only this method's command loses them: a recipe that sets ``reward.weights`` (Adv-GRPO adds its
    reward model) must not take the demo's reward away from the other methods."""
    import yaml

    method = (yaml.safe_load((REPO / recipe).read_text()) or {}).get("method", "")
    cmd = without_recipe_keys(without_keys(s["train_cmd"], s["preset_keys"].get(method, set())), [recipe])
    return with_recipe(cmd, recipe)


def run_flow(runner: demo.Runner, args, methods: dict[str, Path]) -> list[dict]:
    s = flow_setup(runner, args)
    ev = s["eval_cmd"]
    rows = []
    for seed in args.seed_list:  # base eval per seed: evaluation noise seeds follow the run seed
        runner.run(f"base_eval_s{seed}", ev + [f"seed={seed}", f"out_dir={runner.out / 'base_eval' / f'seed{seed}'}"])
    for name, recipe in methods.items():
        for seed in args.seed_list:
            d = runner.out / name / f"seed{seed}"
            if not finished(d) and not (
                    attempt(runner, f"{name}_s{seed}_train", method_cmd(s, recipe) +
                            budget_overrides(args, "run.num_epochs") + [f"run.output_dir={d / 'run'}",
                                                                         f"run.seed={seed}"])
                    and attempt(runner, f"{name}_s{seed}_eval", ev + [f"seed={seed}", f"out_dir={d / 'eval'}",
                                                                      f"lora={d / 'run' / 'lora_final'}"])):
                rows.append({"method": name, "seed": seed, "error": "training or evaluation failed (see the log)"})
                continue
            hist = read_metrics(d / "run" / "metrics.jsonl")
            m = demo._read_json(d / "eval" / "metrics.json").get("mini_geneval", {})
            b = demo._read_json(runner.out / "base_eval" / f"seed{seed}" / "metrics.json").get("mini_geneval", {})
            per_epoch = [h.get("nfe_per_trajectory", 0.0) * h.get("actual_batch_size", 0.0) for h in hist]
            t = 0.0
            curve = []
            for h in hist:
                t = h.get("time/train_budget_s", t)
                # reward/<name>/mean as both trainers log it; reward/<name>: flow runs logged before the keys met
                curve.append((t, h.get("reward/mini_geneval/mean", h.get("reward/mini_geneval"))))
            rows.append({"method": name, "seed": seed,
                         "metric": None if m.get("accuracy") is None else 100.0 * m["accuracy"],
                         "base_metric": None if b.get("accuracy") is None else 100.0 * b["accuracy"],
                         "steps": len(hist), "train_seconds": curve[-1][0] if curve else None,
                         "compute": sum(per_epoch), "curve": curve})
    return rows


def without_keys(cmd: list[str], keys: set[str]) -> list[str]:
    """``cmd`` without its ``key=value`` overrides whose key is in ``keys``."""
    return [o for o in cmd if o.split("=", 1)[0] not in keys]


def finished(run_dir: Path) -> bool:
    """A run whose evaluation already wrote its metrics is not repeated (re-running the script resumes)."""
    return (run_dir / "eval" / "metrics.json").exists()


def attempt(runner: demo.Runner, stage: str, cmd: list[str]) -> bool:
    """Run a stage; a failing method is recorded and the comparison goes on."""
    try:
        runner.run(stage, cmd)
        return True
    except SystemExit as e:
        print(f"[compare] {e}", flush=True)
        return False


def budget_overrides(args, steps_key: str) -> list[str]:
    """Equal CPU-time budget, or (``--steps``) an equal number of steps/epochs; then the ``--set`` overrides."""
    if args.steps:
        return [f"{steps_key}={args.steps}"] + args.set
    return [f"run.max_train_seconds={args.budget}", "run.budget_clock=cpu", f"{steps_key}=100000"] + args.set


# ---------------------------------------------------------------------------------------------------- report
def write_results(out: Path, frontend: str, rows: list[dict], args) -> str:
    metric = {"vlm": "held-out mIoU", "flow": "held-out mini-GenEval accuracy"}[frontend]
    if getattr(args, "eval_split", "heldout") == "validation":
        metric = metric.replace("held-out", "validation")
    compute = {"vlm": "generated tokens", "flow": "NFEs (trajectories x steps, incl. completions)"}[frontend]
    failed = [r for r in rows if r.get("error")]
    rows = [r for r in rows if not r.get("error")]
    protos = {r.get("protocol") for r in rows if r.get("protocol")}
    if protos:  # VLM: which evaluation protocol the metric is (the demo's: Time-R1's, strict)
        metric += f" ({demo._protocol_label(protos.pop()) if len(protos) == 1 else 'MIXED protocols'})"
    methods = list(dict.fromkeys(r["method"] for r in rows))
    # the screen uses each run's gain over its own seed's start (paired: the flow eval's noise seeds follow the
    # run seed, so the start differs per seed)
    stats = {m: summarize([None if r["metric"] is None or r["base_metric"] is None else r["metric"] - r["base_metric"]
                           for r in rows if r["method"] == m]) for m in methods}
    level = {m: summarize([r["metric"] for r in rows if r["method"] == m]) for m in methods}
    ref = methods[0] if methods else None
    base = summarize([r["base_metric"] for r in rows if r["method"] == ref])
    budget = (f"{args.steps} steps per run" if args.steps else
              f"Budget: {args.budget:g} s of process CPU time per run (1 torch thread)")
    split = " (validation draw)" if getattr(args, "eval_split", "heldout") == "validation" else ""
    lines = [f"{budget}, seeds {args.seeds}{' ' + ' '.join(args.set) if args.set else ''}. "
             f"Start: {_f(base['mean'])} {metric}{split}.", "",
             f"| method | {metric} (mean ± std over seeds) | gain over start (paired) | vs {ref} | > seed noise? | "
             f"steps | {compute} |", "|---|---|---|---|---|---|---|"]
    for m in methods:
        st, rs = stats[m], [r for r in rows if r["method"] == m]
        d = None if st["mean"] is None or stats[ref]["mean"] is None else st["mean"] - stats[ref]["mean"]
        bn = beyond_noise(st, stats[ref]) if m != ref else None
        lv = level[m]
        lines.append(f"| {m} | {_f(lv['mean'])} ± {_f(lv['std'])} (n={lv['n']}) | {_f(st['mean'], sign=True)} ± "
                     f"{_f(st['std'])} | {'–' if m == ref else _f(d, sign=True)} | {'–' if bn is None else ('yes' if bn else 'no')} | "
                     f"{_f(statistics.fmean([r['steps'] for r in rs]))} | "
                     f"{_f(statistics.fmean([r['compute'] or 0 for r in rs]), digits=0)} |")
    lines += [f"* FAILED: {r['method']} seed {r['seed']}: {r['error']}" for r in failed]
    probes = probe_table(rows, methods, getattr(args, "base_probes", None),
                         getattr(args, "base_shape", None)) if frontend == "vlm" else []
    table = "\n".join(lines + probes) + "\n"
    (out / "results.md").write_text(table)
    (out / "results.json").write_text(json.dumps({"frontend": frontend, "budget_s": args.budget, "seeds": args.seeds,
                                                  "summary": level, "gain_summary": stats,
                                                  "base_probes": getattr(args, "base_probes", None), "runs": rows},
                                                 indent=1) + "\n")
    plot(out / "curves.png", rows, metric_name={"vlm": "training IoU reward", "flow": "training verifier reward"}[
        frontend])
    return table


PROBES = {  # column -> (probe, key) of demo.prediction_probes
    "own query mIoU": ("query_swap", "own_mIoU"), "other query mIoU": ("query_swap", "other_mIoU"),
    "lands on the queried event %": ("events", "hit"), "start offset on hits (s)": ("events", "start_offset"),
    "end offset on hits (s)": ("events", "end_offset"),
    "earliest-event queries: on it %": ("events", "hit_earliest"), "later-event queries: on it %": ("events", "hit_later"),
    "later-event queries: on the earliest %": ("events", "later_on_earliest")}


def probe_table(rows: list[dict], methods: list[str], base: dict | None, base_shape: dict | None = None) -> list[str]:
    """VLM: R1@0.5, the answers' shape (% well formed: exactly the answer the prompt asks for; the lenient parser's
    mIoU, which reads a span out of any text) and the grounding probes of each method's evaluations (mean over
    seeds), the start first: the query-swap probe (own > other: the model reads the query) and where the predictions
    land (the queried event, and the signed boundary offsets on those hits: a lag shows as both > 0; split by the
    queried event's place, a bias toward the video's earliest event shows as later-event queries landing on it)."""
    def get(p, key):
        v = ((p or {}).get(key[0]) or {}).get(key[1])
        return None if v is None else float(v)

    def mean(vals):
        vals = [v for v in vals if v is not None]
        return statistics.fmean(vals) if vals else None

    if base is None and not any(r.get("probes") for r in rows):
        return []
    lines = ["", "| method | R1@0.5 | well-formed % | lenient mIoU | " + " | ".join(PROBES) + " |",
             "|---|---|---|---|" + "---|" * len(PROBES)]
    fmt = lambda col, v: _f(v, sign=True, digits=2) if "offset" in col else _f(v)  # noqa: E731
    if base is not None:
        r1 = mean([r.get("base_R1@0.5") for r in rows])
        bs = base_shape or {}
        lines.append("| start | " + _f(r1) + f" | {_f(bs.get('well_formed'))} | "
                     f"{_f((bs.get('lenient') or {}).get('mIoU'))} | "
                     + " | ".join(fmt(c, get(base, k)) for c, k in PROBES.items()) + " |")
    for m in methods:
        rs = [r for r in rows if r["method"] == m]
        lines.append(f"| {m} | {_f(mean([r.get('R1@0.5') for r in rs]))} | "
                     f"{_f(mean([r.get('well_formed') for r in rs]))} | {_f(mean([r.get('lenient_mIoU') for r in rs]))} | "
                     + " | ".join(fmt(c, mean([get(r.get("probes"), k) for r in rs])) for c, k in PROBES.items()) + " |")
    return lines


def _f(x, sign: bool = False, digits: int = 1) -> str:
    if x is None:
        return "-"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def smooth(curve: list[tuple[float, float]], window: int = 5) -> list[tuple[float, float]]:
    """Trailing running mean of the values (the x of each point kept): per-step rewards of 32 rollouts are noisy."""
    out = []
    for i, (t, _) in enumerate(curve):
        vals = [v for _, v in curve[max(0, i - window + 1): i + 1]]
        out.append((t, sum(vals) / len(vals)))
    return out


def plot(path: Path, rows: list[dict], metric_name: str) -> None:
    """Training reward vs budget seconds per method: each seed's curve binned on a shared grid, then averaged."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are a convenience, never a reason to lose results
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for m in dict.fromkeys(r["method"] for r in rows):
        curves = [[(t, v) for t, v in r["curve"] if t is not None and v is not None] for r in rows
                  if r["method"] == m]
        curves = [smooth(c) for c in curves if c]
        if not curves:
            continue
        tmax = min(c[-1][0] for c in curves)
        grid = [tmax * (i + 1) / 20 for i in range(20)]
        mean = []
        for g in grid:  # last value at or before g, averaged over seeds
            vals = [next((v for t, v in reversed(c) if t <= g), c[0][1]) for c in curves]
            mean.append(statistics.fmean(vals))
        ax.plot(grid, mean, label=m)
    ax.set_xlabel("training seconds (process CPU)")
    ax.set_ylabel(metric_name)
    ax.set_title("running mean of 5 steps per run, then mean over seeds", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("frontend", choices=["vlm", "flow"], help="vlm = temporal grounding; flow = mini-GenEval")
    p.add_argument("--out", default=None, help="output folder (default runs/compare_<frontend>)")
    p.add_argument("--seeds", default="0,1,2", help="comma list of seeds (GRPO sampling, data order)")
    p.add_argument("--budget", type=float, default=120.0, help="training CPU-seconds per run (equal for all)")
    p.add_argument("--methods", default="", help="comma subset of the methods: names of the recipes in "
                   "configs/compare/<frontend>/ (default: all of them)")
    p.add_argument("--recipes", default="", metavar="DIR",
                   help="recipe folder instead of configs/compare/<frontend>/ (relative to the repository), e.g. "
                   "configs/compare/vlm_full (full fine-tuning, for methods that need it: TR-DPO reference sync); the "
                   "demo's overrides of keys these recipes set are removed for these runs only")
    p.add_argument("--steps", type=int, default=0, help="train a fixed number of steps (VLM) / epochs (flow) "
                   "instead of the time budget")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra trainer override for every run (repeatable), e.g. --set optim.lr=2e-4")
    p.add_argument("--eval-split", choices=["heldout", "validation"], default="heldout",
                   help="vlm: evaluate on the held-out split, or on a fresh validation draw of the generator (for "
                   "choosing settings without looking at held-out data)")
    p.add_argument("--smoke", action="store_true", help="the demo's smoke profile (wiring check; numbers mean nothing)")
    p.add_argument("--dry-run", action="store_true", help="print the commands without running them")
    args = p.parse_args(argv)
    args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()]
    args.seed, args.rebuild = args.seed_list[0], False
    args.tvg_train, args.tvg_eval = (4, 3) if args.smoke else (120, 60)
    table_of = method_recipes(args.frontend, args.recipes)
    chosen = [m.strip() for m in args.methods.split(",") if m.strip()] or list(table_of)
    unknown = [m for m in chosen if m not in table_of]
    if unknown:
        p.error(f"unknown methods {unknown}; {args.frontend} has {list(table_of)}")
    out = Path(args.out or f"runs/compare_{args.frontend}")
    out = out if out.is_absolute() else REPO / out
    runner = demo.Runner(out, dry_run=args.dry_run)
    methods = {m: table_of[m] for m in chosen}
    rows = (run_vlm if args.frontend == "vlm" else run_flow)(runner, args, methods)
    if not args.dry_run:
        print(write_results(out, args.frontend, rows, args), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
