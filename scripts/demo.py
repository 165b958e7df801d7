#!/usr/bin/env python
"""The CPU demo: GRPO measurably improving a video-grounding VLM and an image generator, no downloads.

    python scripts/demo.py --out runs/demo            # full demo (<= 15 min on 2 cores)
    python scripts/demo.py --out runs/demo --smoke    # short wiring check (~2 min, run in CI)

Every stage is a command a user could run by hand (they are printed, and written to ``<out>/commands.sh``):

* **tvg** - temporal grounding on the built-in synthetic grounding benchmark (``data/synthetic_tvg.py --version
  2``): base = a tiny Qwen2.5-VL that grounds, fine-tuned on answers 1 s late (``scripts/build_grounding_base.py``);
  eval before -> ``mmgrpo train`` (plain GRPO, IoU reward; greedy validation curve on a separate draw of the
  generator) -> eval after, with ``eval/generate_vlm.py``; probes: video-blind span, query swap, event landing and
  boundary offsets (``mmgrpo.vlm.sft.event_probe``);
* **t2i** - mini-GenEval (``data/synthetic_t2i.py``): base = a tiny SD3 pipeline pre-trained on rendered
  images (``scripts/build_tiny_flow.py``); eval before -> ``flow_grpo train`` (Flow-GRPO-Fast: CPS + SDE window,
  verifier reward) -> eval after, with ``eval/generate_t2i.py``;
* **report** - ``<out>/metrics.json`` (held-out metrics before/after, percent; the validation curve),
  ``<out>/report.md`` (table, reward and validation curves, TVG timelines of held-out videos before/after,
  readable before/after image grids, prediction samples).

Settings: ``configs/demo/tvg.yaml`` and ``configs/demo/t2i.yaml`` (base checkpoint, benchmark generator and its
arguments, the trainers' and evaluators' ``key=value`` settings, full / smoke budgets); ``--tvg-recipe`` /
``--t2i-recipe`` pick other files and ``tvg.KEY=VALUE`` / ``t2i.KEY=VALUE`` arguments override single keys, e.g.
``tvg.benchmark_args=[--version,2]`` or ``tvg.full.grpo.run.max_steps=60``.

Targets (issues #6, #16): TVG mIoU and R1@0.5 +8 points, after >= video-blind + 15, own - other query >= 10 and
above before; mini-GenEval accuracy +15 points; every seed. The report says
whether they were met; evaluation settings are never tuned to pass.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def _h(text: str) -> dict:
    return {"help": text}


def _dict() -> Any:
    return field(default_factory=dict, metadata=_h("settings of the profile, added after the shared ones"))


@dataclass
class TVGProfile:
    build_args: list[str] = field(default_factory=list, metadata=_h("arguments of build_script (--rebuild)"))
    n_train: Optional[int] = field(default=None, metadata=_h(
        "training videos to generate (none = the base's own sizes from its sft_report.json, else --tvg-train)"))
    n_eval: Optional[int] = field(default=None, metadata=_h("held-out videos (none = as n_train, --tvg-eval)"))
    validation_videos: int = field(default=0, metadata=_h(
        "videos of the validation set evaluated during GRPO (validation.* settings under grpo; 0 = none): a fresh "
        "draw of the generator with seed + validation_seed_offset, never the held-out split"))
    grpo: dict[str, Any] = _dict()
    eval: dict[str, Any] = _dict()


@dataclass
class TVGRecipe:
    """Temporal grounding: base, benchmark, GRPO and evaluation settings (``configs/demo/tvg.yaml``)."""

    base: str = field(default="data/checkpoints/tiny_vlm", metadata=_h("shipped base checkpoint (unless --rebuild)"))
    build_script: str = field(default="scripts/build_tiny_vlm.py", metadata=_h("builds the base with --rebuild"))
    benchmark_script: str = field(default="data/synthetic_tvg.py", metadata=_h(
        "benchmark generator: OUT --n-train N --n-eval N --seed S [benchmark_args]; sizes and seed are the base's"))
    benchmark_args: list[str] = field(default_factory=list, metadata=_h(
        "extra generator arguments (e.g. [--version, '2', --clock, bar]); must match what the base was built on"))
    eval_config: str = field(default="eval/configs/synthetic_tvg.yaml", metadata=_h("eval/generate_vlm.py --config"))
    validation_seed_offset: int = field(default=1000, metadata=_h(
        "generator seed of the validation videos = the benchmark's seed + this (disjoint from train and held-out)"))
    timeline_queries: int = field(default=4, metadata=_h(
        "held-out queries (one per video) drawn in tvg/timeline.png: frames, ground truth, spans before/after"))
    report_outputs: int = field(default=6, metadata=_h(
        "held-out queries whose raw outputs before / after GRPO the report shows (the first ones, not picked)"))
    eval: dict[str, Any] = field(default_factory=dict, metadata=_h("eval/generate_vlm.py key: value settings"))
    grpo: dict[str, Any] = field(default_factory=dict, metadata=_h(
        "mmgrpo train key: value settings of both profiles (the base's video/prompt settings come after them)"))
    full: TVGProfile = field(default_factory=TVGProfile, metadata=_h("the full demo's budgets"))
    smoke: TVGProfile = field(default_factory=TVGProfile, metadata=_h("--smoke budgets (wiring check)"))


@dataclass
class T2IProfile:
    build_args: list[str] = field(default_factory=list, metadata=_h("arguments of build_script (--rebuild)"))
    grpo: dict[str, Any] = _dict()
    eval_prompts: int = field(default=0, metadata=_h("held-out prompts evaluated (0 = all)"))


@dataclass
class T2IRecipe:
    """Text-to-image: base, GRPO and evaluation settings (``configs/demo/t2i.yaml``)."""

    base: str = field(default="data/checkpoints/tiny_flow", metadata=_h("shipped base pipeline (unless --rebuild)"))
    build_script: str = field(default="scripts/build_tiny_flow.py", metadata=_h("builds the base with --rebuild"))
    eval: dict[str, Any] = field(default_factory=dict, metadata=_h(
        "eval/generate_t2i.py key: value settings (size, steps, text length and images per prompt: the base's)"))
    grpo: dict[str, Any] = field(default_factory=dict, metadata=_h(
        "flow_grpo train key: value settings of both profiles (the base's sampling settings come after them)"))
    full: T2IProfile = field(default_factory=T2IProfile, metadata=_h("the full demo's budgets"))
    smoke: T2IProfile = field(default_factory=T2IProfile, metadata=_h("--smoke budgets (wiring check)"))


@dataclass
class DemoRecipes:
    tvg: TVGRecipe = field(default_factory=TVGRecipe)
    t2i: T2IRecipe = field(default_factory=T2IRecipe)


RECIPES = {"tvg": REPO / "configs" / "demo" / "tvg.yaml", "t2i": REPO / "configs" / "demo" / "t2i.yaml"}


def load_recipes(tvg: str | Path | None = None, t2i: str | Path | None = None,
                 overrides: list[str] = ()) -> DemoRecipes:
    """Both halves' recipes (YAML files, defaults ``configs/demo/{tvg,t2i}.yaml``), then ``tvg.KEY=VALUE`` /
    ``t2i.KEY=VALUE`` overrides, with the project's config loader (unknown keys and bad values are errors)."""
    from mmgrpo.utils.config import apply_overrides, load_config

    rec = DemoRecipes(tvg=load_config(TVGRecipe, tvg or RECIPES["tvg"]), t2i=load_config(T2IRecipe, t2i or RECIPES["t2i"]))
    return apply_overrides(rec, list(overrides))


def _value(v: Any) -> str:
    """A recipe value as the command line's ``key=value`` text (YAML flow syntax for lists and mappings)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return str(v)


def kv(settings: dict[str, Any]) -> list[str]:
    """``{"run.max_steps": 40}`` -> ``["run.max_steps=40"]`` (in the recipe's order)."""
    return [f"{k}={_value(v)}" for k, v in settings.items()]


class Runner:
    """Runs and records the demo's commands, with wall-clock timing per stage."""

    def __init__(self, out: Path, dry_run: bool = False) -> None:
        self.out = out
        self.dry_run = dry_run
        self.times: dict[str, float] = {}
        self.script = out / "commands.sh"
        out.mkdir(parents=True, exist_ok=True)
        self.script.write_text("#!/usr/bin/env bash\n# Commands run by scripts/demo.py, in order.\nset -e\n")

    def run(self, stage: str, cmd: list[str]) -> None:
        line = " ".join(shlex.quote(c) for c in cmd)
        with self.script.open("a") as f:
            f.write(line + "\n")
        print(f"\n[demo] {stage}: {line}", flush=True)
        if self.dry_run:
            return
        t0 = time.time()
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        # one torch thread per stage unless the user says otherwise: the tiny models' ops are too short to split,
        # and on a 2-core machine shared with anything else, 2 OpenMP threads made CPU generation up to 24x slower
        # (docs/performance.md, "VLM evaluation harness throughput")
        env.setdefault("OMP_NUM_THREADS", "1")
        proc = subprocess.run(cmd, cwd=REPO, env=env)
        self.times[stage] = round(time.time() - t0, 1)
        if proc.returncode != 0:
            raise SystemExit(f"[demo] stage {stage!r} failed with exit code {proc.returncode}: {line}")
        print(f"[demo] {stage} done in {self.times[stage]:.0f} s", flush=True)


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def shipped_or_build(runner: Runner, kind: str, shipped: Path, out: Path, build_cmd: list[str],
                     rebuild: bool = False) -> Path:
    """Use the checkpoint shipped in the repo (fast path) unless asked to rebuild it."""
    if not rebuild and ((shipped / "config.json").exists() or (shipped / "model_index.json").exists()):
        shown = shipped.relative_to(REPO) if shipped.is_relative_to(REPO) else shipped
        print(f"[demo] {kind}: using the shipped base checkpoint {shown}", flush=True)
        return shipped
    runner.run(f"{kind}_build", build_cmd + ["--out", str(out)])
    return out


def _profile(recipe, args):
    return recipe.smoke if getattr(args, "smoke", False) else recipe.full


def _repo_path(p: str) -> Path:
    return Path(p) if Path(p).is_absolute() else REPO / p


def benchmark_sizes(rep: dict) -> dict:
    """``n_train`` / ``n_eval`` / ``seed`` of the benchmark the base was supervised on: what its generator wrote
    (``sft_report.json["data"]["info"]``, present when the base was built from a ``--data-dir``, whose builder
    arguments keep their defaults), else the builder's own arguments."""
    info = (rep.get("data") or {}).get("info") or {}
    if all(k in info for k in ("n_train", "n_eval", "seed")):
        return {k: info[k] for k in ("n_train", "n_eval", "seed")}
    return rep.get("args", {})


def check_benchmark_args(rep: dict, benchmark_args: list[str]) -> None:
    """Refuse a recipe whose generator arguments would regenerate another benchmark than the base's own (its
    ``data.info``: version, clock, lanes, events): the held-out split would then not be the one the base's numbers
    and its video-blind baseline refer to."""
    info = (rep.get("data") or {}).get("info") or {}
    if not info.get("version"):
        return
    from mmgrpo.vlm.synthetic.cli import build_parser
    from mmgrpo.vlm.synthetic.grounding import N_EVENTS

    # the generator's own parser: its defaults are what an argument left out means
    a, _ = build_parser().parse_known_args(["out"] + [str(x) for x in benchmark_args])
    got_all = {"--version": [str(a.version)], "--clock": [a.clock], "--lanes": [str(a.lanes)],
               "--events": [str(x) for x in (a.events or N_EVENTS)]}
    want = {"--version": [str(info["version"])], "--clock": [str(info.get("clock", "none"))],
            "--lanes": [str(info.get("lanes", 3))]}
    if info.get("n_events"):
        want["--events"] = [str(x) for x in info["n_events"]]
    for name, value in want.items():
        got = got_all[name]
        if got != value:
            raise SystemExit(f"[demo] tvg.benchmark_args: {name} {' '.join(got)} does not match the base's own "
                             f"benchmark ({name} {' '.join(value)}, from its sft_report.json data.info); set "
                             f"tvg.benchmark_args to the arguments the base was built on")


def validation_data_cmd(recipe: TVGRecipe, base_seed: int, out: Path, n_videos: int) -> list[str]:
    """The generator command of a validation draw: the base's own benchmark (``benchmark_script`` and
    ``benchmark_args``) with the base's seed + ``validation_seed_offset``, ``n_videos`` held-out videos; disjoint
    from the training and held-out splits."""
    return [PY, recipe.benchmark_script, str(out), "--n-train", "1", "--n-eval", str(n_videos), "--seed",
            str(int(base_seed) + recipe.validation_seed_offset)] + [str(a) for a in recipe.benchmark_args]


def tvg_setup(runner: Runner, args, recipe: TVGRecipe, out: Path) -> dict:
    """Base checkpoint, regenerated benchmark and the eval / GRPO command prefixes of the TVG task (shared with
    ``scripts/compare_methods.py``, so method comparisons train and evaluate exactly like the demo)."""
    prof = _profile(recipe, args)
    base = shipped_or_build(runner, "tvg", _repo_path(recipe.base), out / "base",
                            [PY, recipe.build_script, "--seed", str(args.seed)] + prof.build_args,
                            rebuild=args.rebuild)
    rep = _read_json(base / "sft_report.json")
    # The base model's own benchmark (regenerated: the generator is deterministic in its seed), so the held-out
    # split is disjoint from everything the base was supervised on; GRPO trains on the training split.
    data_dir = out / "data"
    sizes = benchmark_sizes(rep)
    check_benchmark_args(rep, recipe.benchmark_args)
    if prof.n_train is not None:  # e.g. the smoke profile: a handful of videos is enough for a wiring check
        sizes = {**sizes, "n_train": prof.n_train}
    if prof.n_eval is not None:
        sizes = {**sizes, "n_eval": prof.n_eval}
    runner.run("tvg_data", [PY, recipe.benchmark_script, str(data_dir),
                            "--n-train", str(sizes.get("n_train", args.tvg_train)),
                            "--n-eval", str(sizes.get("n_eval", args.tvg_eval)),
                            "--seed", str(sizes.get("seed", args.seed))] + list(recipe.benchmark_args))
    val_file = []
    if prof.validation_videos:  # the fixed validation set of the training curve (and of validation.select_best)
        val_dir = out / "validation_data"
        runner.run("tvg_validation_data", validation_data_cmd(recipe, sizes.get("seed", args.seed), val_dir,
                                                              prof.validation_videos))
        val_file = [f"validation.file={val_dir / 'eval.jsonl'}"]
    video, prompt = rep.get("video", {}), rep.get("prompt", {})
    # The base model's own video/prompt settings: evaluation and GRPO must see inputs exactly as SFT did.
    common = [f"data.prompt_mode={prompt.get('mode', 'no_think')}",
              f"data.answer_format={prompt.get('answer_format', 'seconds')}",
              # a base SFT'd with the query before the video must see it there in GRPO and evaluation too
              f"data.query_position={prompt.get('query_position', 'after')}",
              f"data.video_fps={video.get('fps', 2.0)}", f"data.max_frames={video.get('max_frames', 16)}",
              f"data.video_min_pixels={video.get('min_pixels', 4 * 784)}",
              f"data.video_max_pixels={video.get('max_pixels', 6 * 784)}"]
    ev = [PY, "eval/generate_vlm.py", "--config", recipe.eval_config,
          f"data.annotations={data_dir / 'eval.jsonl'}"] + kv(recipe.eval) + common + kv(prof.eval)
    train = [PY, "-m", "mmgrpo.vlm.cli", "train", f"model.path={base}"] + kv(recipe.grpo) + \
        [f"data.train_file={data_dir / 'train.jsonl'}"] + common + kv(prof.grpo) + val_file
    return {"base": base, "data_dir": data_dir, "report": rep, "eval_cmd": ev, "train_cmd": train}


def tvg(runner: Runner, args, recipe: TVGRecipe) -> dict:
    out = runner.out / "tvg"
    s = tvg_setup(runner, args, recipe, out)
    base, data_dir, rep, ev = s["base"], s["data_dir"], s["report"], s["eval_cmd"]
    runner.run("tvg_eval_before", ev + [f"model={base}", f"out_dir={out / 'eval_before'}"])
    train_dir = out / "grpo"
    runner.run("tvg_grpo", s["train_cmd"] + [f"run.output_dir={train_dir}", f"run.seed={args.seed}"])
    # validation.select_best=true: the checkpoint chosen on the validation curve, else the last one
    best = str({**recipe.grpo, **_profile(recipe, args).grpo}.get("validation.select_best", "")).lower() == "true"
    if runner.dry_run:
        ckpt = train_dir / "checkpoints" / ("step-BEST" if best else "step-LAST")
    else:
        ckpt = (best and best_checkpoint(train_dir)) or latest_checkpoint(train_dir)
    runner.run("tvg_eval_after", ev + [f"model={base}", f"out_dir={out / 'eval_after'}", f"adapter={ckpt / 'adapter'}"])
    before = _read_json(out / "eval_before" / "metrics.json")
    after = _read_json(out / "eval_after" / "metrics.json")
    res = {"before": tvg_summary(before), "after": tvg_summary(after), "checkpoint": ckpt.name}
    if not runner.dry_run:
        res["probes"] = grounding_probes(data_dir / "eval.jsonl", out, rep, headline_parse_mode(after))
        res["samples"] = raw_outputs(out, recipe.report_outputs)
        res["validation"] = validation_curve(train_dir)
        draw_timelines(out, data_dir / "eval.jsonl", recipe.timeline_queries)
    return res


TVG_KEYS = ("mIoU", "R1@0.3", "R1@0.5", "R1@0.7", "parse_failure_rate")


def tvg_summary(m: dict) -> dict:
    """One TVG evaluation (``eval/generate_vlm.py``'s metrics.json): the headline protocol's numbers (the recipe's
    ``score.protocol``; the demo's: ``official`` = Time-R1's evaluation), its name, the other protocol's numbers, and
    the answers' shape: ``well_formed`` (% of outputs that are exactly the answer the prompt asks for) and
    ``truncated`` (% cut at the token cap)."""
    out = {k: m.get(k) for k in TVG_KEYS}
    out["protocol"] = (m.get("protocol") or {}).get("name")
    for name, pm in (m.get("protocols") or {}).items():
        out[name] = {k: pm.get(k) for k in TVG_KEYS}
    g = m.get("generation") or {}
    n = m.get("n") or 0
    out["well_formed"] = g.get("well_formed_rate")
    out["truncated"] = None if g.get("n_truncated") is None or not n else 100.0 * g["n_truncated"] / n
    out["mean_output_tokens"] = g.get("mean_output_tokens")
    return out


def headline_parse_mode(m: dict) -> str:
    """The parse mode of an evaluation's headline protocol (the probes read the outputs the same way)."""
    return ((m.get("protocol") or {}).get("parse_mode")) or "lenient"


def raw_outputs(out: Path, n: int) -> list[dict]:
    """The first ``n`` held-out queries' raw outputs before and after GRPO, as generated (for the report)."""
    rows = {}
    for ph in ("before", "after"):
        path = out / f"eval_{ph}" / "predictions.jsonl"
        if path.exists():
            for line in path.read_text().splitlines()[:n]:
                r = json.loads(line)
                rows.setdefault(r["id"], {"id": r["id"]})[ph] = r.get("output")
    return list(rows.values())


def validation_curve(train_dir: Path) -> list[dict]:
    """The GRPO run's validation points (``<run>/validation/curve.jsonl``, mmgrpo.vlm.monitor.validation)."""
    path = train_dir / "validation" / "curve.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    return [{"step": r["step"], **{k: r.get(f"val/{k}") for k in ("mIoU", "R1@0.5", "parse_rate", "well_formed")}}
            for r in rows]


def draw_timelines(out: Path, annotations: Path, n: int) -> None:
    """``tvg/timeline.png``: for the first ``n`` held-out videos, the frames the model saw (the evaluator's own
    video settings, from its settings.json), the ground-truth span and the spans predicted before / after GRPO."""
    from mmgrpo.vlm.timeline import tvg_timelines

    video = _read_json(out / "eval_after" / "settings.json").get("video", {})
    if not n or not video:
        return
    try:
        tvg_timelines(annotations, {"before GRPO": out / "eval_before" / "predictions.jsonl",
                                    "after GRPO": out / "eval_after" / "predictions.jsonl"},
                      out / "timeline.png", video, n=n)
    except Exception as e:  # a picture must never lose the run's results
        print(f"[demo] could not draw the TVG timelines: {e}", flush=True)


def read_annotations(path: Path) -> dict[str, dict]:
    """id -> record of a JSONL annotation file (the held-out queries an evaluation ran on)."""
    anns = {}
    for line in path.read_text().splitlines():
        if line.strip():
            a = json.loads(line)
            anns[a["id"]] = a
    return anns


def predicted_samples(anns: dict[str, dict], predictions: Path) -> tuple[list[str], list[dict]] | None:
    """(output texts, annotation records) of one evaluation's ``predictions.jsonl``, in file order, for the
    predictions whose id is in ``anns`` (:func:`read_annotations`); None if the file does not exist."""
    if not predictions.exists():
        return None
    recs = [json.loads(l) for l in predictions.read_text().splitlines() if l.strip()]
    recs = [r for r in recs if r.get("id") in anns]
    return [r.get("output") or "" for r in recs], [anns[r["id"]] for r in recs]


def probes_of(texts: list[str], samples: list[dict], parse_mode: str = "lenient") -> dict:
    """The query-swap and event probes (``mmgrpo.vlm.sft.query_swap_probe`` / ``event_probe``) of outputs, read with
    ``parse_mode`` (the evaluation's headline protocol: ``time_r1_eval`` for the demo)."""
    from mmgrpo.vlm.sft import event_probe, query_swap_probe

    return {"query_swap": query_swap_probe(texts, samples, parse_mode),
            "events": event_probe(texts, samples, parse_mode=parse_mode)}


def prediction_probes(anns: dict[str, dict], predictions: Path, parse_mode: str = "lenient") -> dict | None:
    """:func:`probes_of` one evaluation's ``predictions.jsonl`` on the annotated queries ``anns``; None if it does
    not exist."""
    got = predicted_samples(anns, predictions)
    return None if got is None else probes_of(*got, parse_mode=parse_mode)


def grounding_probes(annotations: Path, out: Path, base_report: dict, parse_mode: str = "lenient") -> dict:
    """What the TVG numbers mean (docs/demo_models.md): on exactly the evaluated held-out queries, the mIoU of the
    video-blind duration-relative span ``[a D, b D]`` fitted on the training split when the base was built, and the
    query-swap probe (mIoU against the query's own span vs another query's span on the same video) before and after
    GRPO. ``own ~= other`` means the model ignores the query; a gain up to the video-blind level is span calibration.
    Outputs are read with ``parse_mode``, the evaluation's headline protocol."""
    from mmgrpo.vlm.sft import score_tvg_outputs

    anns = read_annotations(annotations)
    probes: dict = {}
    for phase in ("before", "after"):
        got = predicted_samples(anns, out / f"eval_{phase}" / "predictions.jsonl")
        if got is None:
            continue
        texts, samples = got  # one read per file: the probes and the video-blind span score the same queries
        p = probes_of(texts, samples, parse_mode)
        probes.setdefault("query_swap", {})[phase] = p["query_swap"]
        probes.setdefault("events", {})[phase] = p["events"]
        if phase == "before":
            frac = (base_report.get("video_blind_baselines", {}).get("duration_relative_span", {}).get("span"))
            if frac:
                a, b = frac
                blind = [f"<answer>{a * s['duration']:.2f} to {b * s['duration']:.2f}</answer>" for s in samples]
                m = score_tvg_outputs(blind, samples, parse_mode)
                probes["video_blind"] = {"span_fraction": [a, b], "n": m["n"], "mIoU": m["mIoU"],
                                         "R1@0.5": m["R1@0.5"]}
    return probes


def latest_checkpoint(train_dir: Path) -> Path | None:
    cks = sorted((train_dir / "checkpoints").glob("step-*"))
    return cks[-1] if cks else None


def best_checkpoint(train_dir: Path) -> Path | None:
    """The checkpoint kept as best by the run's ``run.best_metric`` (``validation.select_best``: val/<metric>)."""
    from mmgrpo.utils.checkpoint import CheckpointManager

    return CheckpointManager(train_dir / "checkpoints", best_mode="max").best_checkpoint()


def t2i_setup(runner: Runner, args, recipe: T2IRecipe, out: Path) -> dict:
    """Base pipeline, prompt files and the eval / GRPO command prefixes of the T2I task (shared with
    ``scripts/compare_methods.py``). ``{"skipped": reason}`` when there is no base and no recipe."""
    prof = _profile(recipe, args)
    shipped = _repo_path(recipe.base)
    if not (shipped / "model_index.json").exists() and not _repo_path(recipe.build_script).exists():
        return {"skipped": f"no base generator: neither {recipe.base} nor {recipe.build_script} is in this checkout"}
    base = shipped_or_build(runner, "t2i", shipped, out / "base",
                            [PY, recipe.build_script, "--seed", str(args.seed)] + prof.build_args,
                            rebuild=args.rebuild)
    # The base's own generation settings and benchmark subset (written by scripts/build_tiny_flow.py): evaluation
    # and GRPO sample exactly as the base was trained and evaluated.
    info = _read_json(base / "mmgrpo_demo.json")
    size = int(info.get("height", 32))
    steps = int(info.get("num_inference_steps", 10))
    seqlen = int(info.get("max_sequence_length", 1))
    tags = list(info.get("tags") or [])
    per_prompt = int(info.get("eval_images_per_prompt", 1))
    tag_args = ["--tags", *tags] if tags else []
    prompts = out / "prompts"
    prompts.mkdir(parents=True, exist_ok=True)
    runner.run("t2i_prompts_train", [PY, "data/synthetic_t2i.py", "--all", "--split", "train", "--out",
                                     str(prompts / "train.jsonl")] + tag_args)
    runner.run("t2i_prompts_heldout", [PY, "data/synthetic_t2i.py", "--all", "--split", "heldout", "--out",
                                       str(prompts / "heldout.jsonl")] + tag_args)
    ev = [PY, "eval/generate_t2i.py", f"pipeline={base}", f"prompts={prompts / 'heldout.jsonl'}"] + \
        kv(recipe.eval) + [f"num_steps={steps}", f"height={size}", f"width={size}", f"max_sequence_length={seqlen}",
                           f"images_per_prompt={per_prompt}"]
    if prof.eval_prompts:
        ev.append(f"max_prompts={prof.eval_prompts}")
    train = [PY, "-m", "flow_grpo.cli", "train", f"model.pipeline_dir={base}",
             f"data.train_path={prompts / 'train.jsonl'}", f"data.eval_path={prompts / 'heldout.jsonl'}"] + \
        kv(recipe.grpo) + [f"sample.num_steps={steps}", f"sample.height={size}", f"sample.width={size}",
                           "sample.cfg=false", "sample.guidance_scale=1.0", f"model.max_sequence_length={seqlen}",
                           "run.save_every=0"] + kv(prof.grpo)
    return {"base": base, "prompts": prompts, "eval_cmd": ev, "train_cmd": train}


def t2i(runner: Runner, args, recipe: T2IRecipe) -> dict:
    out = runner.out / "t2i"
    s = t2i_setup(runner, args, recipe, out)
    if s.get("skipped"):
        print(f"[demo] t2i skipped: {s['skipped']}", flush=True)
        return s
    ev = s["eval_cmd"] + [f"seed={args.seed}"]
    runner.run("t2i_eval_before", ev + [f"out_dir={out / 'eval_before'}"])
    train_dir = out / "grpo"
    runner.run("t2i_grpo", s["train_cmd"] + [f"run.output_dir={train_dir}", f"run.seed={args.seed}"])
    runner.run("t2i_eval_after", ev + [f"out_dir={out / 'eval_after'}", f"lora={train_dir / 'lora_final'}"])
    before = _read_json(out / "eval_before" / "metrics.json")
    after = _read_json(out / "eval_after" / "metrics.json")
    return {"before": before, "after": after,
            "partial": {ph: m.get("rewards", {}).get("mini_geneval/partial", {}).get("mean")
                        for ph, m in (("before", before), ("after", after))},
            "probes": {ph: count_probe(out / f"eval_{ph}") for ph in ("before", "after")}}


def count_probe(eval_dir: Path) -> dict:
    """What a mini-GenEval accuracy change is made of, from an ``eval/generate_t2i.py`` output folder: the share
    of images with the prompt's number of objects (any shape/colour, the verifier's own segmentation), and the
    share of drawn objects with the prompt's shape (colour: of prompts that name one). Percent; single-entry
    prompts only (the demo's tags)."""
    import numpy as np
    from PIL import Image

    if str(REPO) not in sys.path:  # data/ is a folder of the checkout, not an installed package
        sys.path.insert(0, str(REPO))
    from mmgrpo.synthetic.t2i import segment_objects

    rows = [json.loads(x) for x in (eval_dir / "images.jsonl").read_text().splitlines() if x.strip()] \
        if (eval_dir / "images.jsonl").exists() else []
    n_img = right = 0
    shape, colour = [], []
    for r in rows:
        inc = r.get("metadata", {}).get("include") or []
        if len(inc) != 1:
            continue
        e = inc[0]
        objs, _ = segment_objects(np.asarray(Image.open(eval_dir / r["image"]).convert("RGB")))
        n_img += 1
        right += len(objs) == int(e.get("count", 1))
        shape += [o["shape"] == e["class"] for o in objs]
        if e.get("color"):
            colour += [o["color"] == e["color"] for o in objs]

    def pct(xs):
        return None if not xs else 100.0 * sum(xs) / len(xs)

    return {"n_images": n_img, "right_count": None if not n_img else 100.0 * right / n_img,
            "n_objects": len(shape), "shape_ok": pct(shape), "colour_ok": pct(colour)}


def _verdict(delta: float | None, target: float) -> str:
    """'met' / 'NOT met' for a measured gain; 'not run' when the task did not run (e.g. ``--tasks tvg``)."""
    if delta is None:
        return "not run"
    return "met" if delta >= target else "NOT met"


def _protocol_label(name: str | None) -> str:
    """How the report names an evaluation protocol of ``eval/score.py``."""
    return {"official": "strict: Time-R1's evaluation", "lenient": "lenient parser"}.get(name or "", name or "")


def _code(text: str | None) -> str:
    """A raw output as a markdown table cell (inline code; pipes escaped)."""
    return "-" if text is None else "`" + text.replace("|", "\\|").replace("`", "'").replace("\n", "\\n") + "`"


def _fmt(v) -> str:
    return "-" if v is None else (f"{v:.1f}" if isinstance(v, (int, float)) else str(v))


WELL_FORMED_TARGET = 95.0  # issue #41: % of held-out answers after GRPO that are exactly what the prompt asks for


def grounding_targets(tvg_m: dict, probes: dict) -> list[str]:
    """Issues #16 / #41's targets, checked on this run's held-out numbers in the headline protocol (report lines;
    empty if a number is missing)."""
    b, a = tvg_m.get("before", {}), tvg_m.get("after", {})
    vb = (probes.get("video_blind") or {}).get("mIoU")
    qs = probes.get("query_swap") or {}
    qb, qa = qs.get("before") or {}, qs.get("after") or {}
    vals = [b.get("mIoU"), a.get("mIoU"), b.get("R1@0.5"), a.get("R1@0.5"), vb, qb.get("own_mIoU"), qa.get("own_mIoU")]
    if any(v is None for v in vals):
        return []
    gap_b, gap_a = qb["own_mIoU"] - qb["other_mIoU"], qa["own_mIoU"] - qa["other_mIoU"]
    rows = [("mIoU gain >= +8", a["mIoU"] - b["mIoU"] >= 8, f"{a['mIoU'] - b['mIoU']:+.1f}"),
            ("R1@0.5 gain >= +8", a["R1@0.5"] - b["R1@0.5"] >= 8, f"{a['R1@0.5'] - b['R1@0.5']:+.1f}"),
            ("mIoU after >= video-blind + 15", a["mIoU"] >= vb + 15, f"{a['mIoU']:.1f} vs {vb + 15:.1f}"),
            ("own - other query after >= 10, and above before", gap_a >= 10 and gap_a > gap_b,
             f"{gap_a:.1f} (before {gap_b:.1f})")]
    if a.get("well_formed") is not None:
        rows.append((f"well-formed answers after >= {WELL_FORMED_TARGET:.0f} %", a["well_formed"] >= WELL_FORMED_TARGET,
                     f"{a['well_formed']:.1f} %"))
    proto = _protocol_label(a.get("protocol"))
    return ([f"## Temporal-grounding targets (issues #16, #41, this run{'; ' + proto if proto else ''})", "",
             "| target | value | |",
             "|---|---|---|"]
            + [f"| {name} | {val} | {'met' if ok else 'NOT met'} |" for name, ok, val in rows] + [""])


def write_report(out: Path, results: dict, times: dict, seconds: float, smoke: bool) -> None:
    """metrics.json (the issue's schema, percent) and report.md with tables, curves and grids."""
    tvg_r, t2i_r = results.get("tvg", {}), results.get("t2i", {})

    def acc(m: dict) -> float | None:
        a = (m or {}).get("mini_geneval", {}).get("accuracy")  # eval/generate_t2i.py reports a fraction
        return None if a is None else 100.0 * a

    def tvg_m(r: dict) -> dict:  # the keys (headline protocol), then the protocol, lenient and the shape
        return {"mIoU": r.get("mIoU"), "R1@0.5": r.get("R1@0.5"), "protocol": r.get("protocol"),
                "lenient": {k: (r.get("lenient") or {}).get(k) for k in ("mIoU", "R1@0.5")},
                "well_formed": r.get("well_formed"), "truncated": r.get("truncated")}

    metrics = {
        "tvg": {ph: tvg_m(tvg_r.get(ph, {})) for ph in ("before", "after")},
        "t2i": {ph: {"accuracy": acc(t2i_r.get(ph)),
                     "partial_score": None if t2i_r.get("partial", {}).get(ph) is None
                     else 100.0 * t2i_r["partial"][ph]} for ph in ("before", "after")},
        "tvg_probes": tvg_r.get("probes"),
        "t2i_probes": t2i_r.get("probes"),
        # the GRPO run's validation curve (fixed validation draw, greedy; never the held-out split)
        "tvg_validation": tvg_r.get("validation"),
        "seconds": round(seconds, 1),
        "stage_seconds": times,
        "smoke": smoke,
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")

    def delta(task, key):
        b, a = metrics[task]["before"][key], metrics[task]["after"][key]
        return None if a is None or b is None else a - b

    d_tvg, d_t2i = delta("tvg", "mIoU"), delta("t2i", "accuracy")
    d_r1 = delta("tvg", "R1@0.5")
    tb, ta = metrics["tvg"]["before"], metrics["tvg"]["after"]
    proto = _protocol_label(ta.get("protocol"))
    lab = f" ({proto})" if proto else ""
    wf_a = ta.get("well_formed")
    lines = ["# mmgrpo CPU demo", "",
             f"Total wall-clock: {seconds / 60:.1f} min{' (smoke profile: wiring check, not a result)' if smoke else ''}.",
             "", "| task | metric (held-out, %) | before | after | delta | target |", "|---|---|---|---|---|---|",
             f"| temporal grounding | mIoU{lab} | {_fmt(tb['mIoU'])} | {_fmt(ta['mIoU'])} | {_fmt(d_tvg)} | "
             f"+8 ({_verdict(d_tvg, 8)}) |",
             f"| temporal grounding | R1@0.5{lab} | {_fmt(tb['R1@0.5'])} | {_fmt(ta['R1@0.5'])} | {_fmt(d_r1)} | "
             f"+8 ({_verdict(d_r1, 8)}) |",
             f"| temporal grounding | well-formed answers | {_fmt(tb.get('well_formed'))} | {_fmt(wf_a)} | | "
             f">= {WELL_FORMED_TARGET:.0f} ({'not run' if wf_a is None else _verdict(wf_a, WELL_FORMED_TARGET)}) |"]
    if ta.get("protocol") and ta.get("protocol") != "lenient":  # the tolerant parser, second, for the record
        lb, la = tb.get("lenient") or {}, ta.get("lenient") or {}
        for k in ("mIoU", "R1@0.5"):
            d = None if lb.get(k) is None or la.get(k) is None else la[k] - lb[k]
            lines.append(f"| temporal grounding | {k} (lenient parser, not the headline) | {_fmt(lb.get(k))} | "
                         f"{_fmt(la.get(k))} | {_fmt(d)} | |")
    lines += [f"| mini-GenEval | accuracy | {_fmt(metrics['t2i']['before']['accuracy'])} | "
             f"{_fmt(metrics['t2i']['after']['accuracy'])} | {_fmt(d_t2i)} | +15 ({_verdict(d_t2i, 15)}) |",
             f"| mini-GenEval | partial score | {_fmt(metrics['t2i']['before']['partial_score'])} | "
             f"{_fmt(metrics['t2i']['after']['partial_score'])} | {_fmt(delta('t2i', 'partial_score'))} | |",
             "", "Stage times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()), ""]
    if ta.get("protocol"):
        lines += [f"Temporal grounding's headline protocol: {proto} (`eval/score.py --protocol`); the lenient rows read "
                  "a span out of any text and are shown only to make a change of answer format visible. "
                  "*Well-formed*: the whole output is exactly `<answer>A to B</answer>`, what the prompt asks for "
                  "(`mmgrpo.vlm.rewards.format.well_formed`).", ""]
    for task, r in results.items():
        if r.get("skipped"):
            lines += [f"**{task} was not run:** {r['skipped']}", ""]
    for name, rel in [("TVG GRPO reward curves", "tvg/curves.png"), ("T2I GRPO reward curves", "t2i/curves.png")]:
        if (out / rel).exists():
            lines += [f"## {name}", "", f"![{name}]({rel})", ""]
    for phase in ("before", "after"):
        grids = sorted((out / "t2i" / f"eval_{phase}" / "grids").glob("*.png"))
        if grids:
            rel = grids[0].relative_to(out)
            lines += [f"## mini-GenEval held-out samples {phase} GRPO (first batch)", "", f"![{phase}]({rel})", ""]
    curve = tvg_r.get("validation") or []
    if curve:
        lines += ["## TVG validation curve during GRPO", "",
                  "Greedy decoding of a fixed validation set (a separate draw of the generator, never the held-out "
                  "split), scored with the training reward's parser; " +
                  (f"the held-out evaluation used checkpoint `{tvg_r['checkpoint']}`." if tvg_r.get("checkpoint")
                   else ""), "", "| step | val mIoU | val R1@0.5 | parsed % | well-formed % |", "|---|---|---|---|---|"]
        lines += [f"| {r['step']} | {_fmt(r.get('mIoU'))} | {_fmt(r.get('R1@0.5'))} | {_fmt(r.get('parse_rate'))} | "
                  f"{_fmt(r.get('well_formed'))} |" for r in curve] + [""]
        if (out / "tvg" / "grpo" / "validation" / "curve.png").exists():
            lines += ["![TVG validation curve](tvg/grpo/validation/curve.png)", ""]
    if (out / "tvg" / "timeline.png").exists():
        lines += ["## Temporal grounding on held-out videos", "",
                  "Frames as the model sees them (with their times), the ground-truth span (green) and the spans "
                  "predicted before (blue) and after (orange) GRPO.", "", "![TVG timelines](tvg/timeline.png)", ""]
    samples = tvg_r.get("samples") or []
    if samples or ta.get("well_formed") is not None:
        lines += ["## Temporal-grounding answers (held-out)", "",
                  f"Well-formed answers: {_fmt(tb.get('well_formed'))} % before, {_fmt(ta.get('well_formed'))} % "
                  f"after GRPO; cut at the token cap: {_fmt(tb.get('truncated'))} % before, "
                  f"{_fmt(ta.get('truncated'))} % after. Raw outputs of the first held-out queries (not picked; "
                  "`tvg/eval_*/predictions.jsonl` has them all):", ""]
        if samples:
            lines += ["| query | before GRPO | after GRPO |", "|---|---|---|"]
            lines += [f"| {r['id']} | {_code(r.get('before'))} | {_code(r.get('after'))} |" for r in samples]
        lines += [""]
    probes = tvg_r.get("probes") or {}
    if probes:
        lines += ["## What the temporal-grounding numbers mean", ""]
        vb = probes.get("video_blind")
        if vb:
            lines += [f"* Video-blind baseline on the same {vb['n']} queries (span [{vb['span_fraction'][0]:.2f} D, "
                      f"{vb['span_fraction'][1]:.2f} D], fitted on the training split, never looks at the video): "
                      f"mIoU {vb['mIoU']:.1f}, R1@0.5 {vb['R1@0.5']:.1f}. A gain up to this level is span-length "
                      "calibration, not grounding."]
        for ph, q in (probes.get("query_swap") or {}).items():
            if q.get("n"):
                lines += [f"* Query swap {ph}: mIoU against the query's own span {q['own_mIoU']:.1f} vs another "
                          f"query's span on the same video {q['other_mIoU']:.1f} (n = {q['n']}); equal means the "
                          "model ignores the query."]
        for ph, e in (probes.get("events") or {}).items():
            off = ("-" if e.get("start_offset") is None else
                   f"{e['start_offset']:+.2f} s / {e['end_offset']:+.2f} s")
            lines += [f"* Events {ph}: the prediction lands on the queried event in {e['hit']:.1f} % of the queries "
                      f"(on some event {e['landed']:.1f} %, on the video's earliest {e['first']:.1f} %; an event "
                      f"picked at random: {e['chance']:.1f} %); on those hits mIoU {_fmt(e.get('hit_mIoU'))} and "
                      f"boundary offset start / end {off} (prediction - truth); mean predicted length "
                      f"{_fmt(e.get('width'))} s. A gain with an unchanged hit rate is boundary precision on events "
                      "the model already chose; a higher hit rate is choosing the queried event more often."]
        lines += [""]
        lines += grounding_targets(metrics["tvg"], probes)
    t2i_probes = t2i_r.get("probes") or {}
    if all((t2i_probes.get(ph) or {}).get("n_images") for ph in ("before", "after")):
        b, a = t2i_probes["before"], t2i_probes["after"]
        lines += ["## What the mini-GenEval numbers mean", "",
                  f"* Images with the prompt's number of objects: {_fmt(b['right_count'])} % -> "
                  f"{_fmt(a['right_count'])} % (of {a['n_images']}).",
                  f"* Drawn objects with the prompt's shape: {_fmt(b['shape_ok'])} % -> {_fmt(a['shape_ok'])} %; "
                  f"colour: {_fmt(b['colour_ok'])} % -> {_fmt(a['colour_ok'])} %.",
                  "* The shipped base was pre-trained on noisy captions (30 % of its training images show another "
                  "count than the caption): a gain in the first line with a flat second line is GRPO teaching it "
                  "to follow the prompt's count, not to draw better (docs/demo_models.md).", ""]
    lines += ["Commands: `commands.sh`. Full metrics: `tvg/eval_*/metrics.json`, `t2i/eval_*/metrics.json`."]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:10]), flush=True)


def plot_training_curves(out: Path) -> None:
    from mmgrpo.utils.logging import plot_curves

    # TVG: the task and format rewards, then the answers' shape (issue #41: the format guard's share of well-formed
    # completions and their mean length, which show a format collapse that the rewards hide)
    for task, sub, keys in [("tvg", "grpo", ["reward/iou/mean", "reward/format/mean", "completions/well_formed",
                                             "completions/mean_length"]),
                            ("t2i", "grpo", ["reward/total/mean", "reward/mini_geneval/mean"])]:
        mj = out / task / sub / "metrics.jsonl"
        if mj.exists():
            rows = [json.loads(l) for l in mj.read_text().splitlines() if l.strip()]
            # the per-step values, raw (faint) and smoothed (EMA 0.9): one step's 8 prompts are too few to show a trend
            present = [k for k in keys if any(k in r for r in rows)]
            if present:
                try:
                    plot_curves(mj, present[:4], out / task / "curves.png", smooth=0.9)
                except Exception as e:  # a plot must never lose the run's results
                    print(f"[demo] could not plot {mj}: {e}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/demo", help="output folder (report.md, metrics.json, per-task runs)")
    p.add_argument("--seed", type=int, default=0, help="seed for data, GRPO sampling and evaluation")
    p.add_argument("--smoke", action="store_true", help="short wiring check (~2 min; run in CI); numbers mean nothing")
    p.add_argument("--tasks", default="tvg,t2i", help="comma list of tasks to run: tvg, t2i")
    p.add_argument("--rebuild", action="store_true", help="rebuild the base checkpoints instead of the shipped ones")
    p.add_argument("--tvg-train", type=int, default=120, help="synthetic training videos for GRPO")
    p.add_argument("--tvg-eval", type=int, default=60, help="synthetic held-out videos")
    p.add_argument("--dry-run", action="store_true", help="print the commands without running them")
    p.add_argument("--tvg-recipe", default=str(RECIPES["tvg"].relative_to(REPO)),
                   help="YAML settings of the temporal-grounding half (keys below, under tvg.)")
    p.add_argument("--t2i-recipe", default=str(RECIPES["t2i"].relative_to(REPO)),
                   help="YAML settings of the text-to-image half (keys below, under t2i.)")
    p.add_argument("overrides", nargs="*", metavar="tvg.KEY=VALUE",
                   help="override one recipe key, e.g. tvg.benchmark_args=[--version,2] tvg.full.grpo.optim.lr=1e-4")
    from mmgrpo.utils.config import fields_help

    p.epilog = "Recipe keys (configs/demo/*.yaml):\n" + fields_help(DemoRecipes)
    args = p.parse_args(argv)
    try:
        recipes = load_recipes(_repo_path(args.tvg_recipe), _repo_path(args.t2i_recipe), args.overrides)
    except (ValueError, FileNotFoundError) as e:
        p.error(str(e))
    if args.smoke:
        args.tvg_train, args.tvg_eval = min(args.tvg_train, 4), min(args.tvg_eval, 3)
    out = (REPO / args.out) if not Path(args.out).is_absolute() else Path(args.out)
    runner = Runner(out, dry_run=args.dry_run)
    t0 = time.time()
    results = {}
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if "tvg" in tasks:
        results["tvg"] = tvg(runner, args, recipes.tvg)
    if "t2i" in tasks:
        results["t2i"] = t2i(runner, args, recipes.t2i)
    if not args.dry_run:
        plot_training_curves(out)
        write_report(out, results, runner.times, time.time() - t0, args.smoke)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
