#!/usr/bin/env python
"""TON's row of the method comparison (issue #38 item 4): GRPO vs TON on the think-or-not benchmark, at equal CPU
budget, several seeds, held-out accuracy and thinking per question kind, the 2-SE screen.

    python scripts/compare_ton.py --out runs/compare_ton --seeds 0,1,2 --budget 60     # the row
    python scripts/compare_ton.py --out /tmp/ct --smoke                                # wiring check

Why this task (``mmgrpo.synthetic.think_or_not``): half the prompts (``partner``) need a computed intermediate
(the image's colour, then its partner in the prompt's table) and the other half (``direct``) are a direct read, so
a thought is needed for half the prompts and not for the other half, which is where TON should matter.

Arms (each from its base, ``scripts/build_think_or_not_base.py``; same seed, data, steps and batch order):

* ``grpo``: the usual cold start (SFT on full traces: the base always thinks), then GRPO;
* ``ton``: TON = the thought-dropout base (half the SFT thoughts replaced by the empty thought) + GRPO with TON's
  format reward (``methods.ton.format_weight=0.1``: accepts the empty thought);
* ``grpo_dropout`` (``--arms``): the thought-dropout base + GRPO without TON's format reward: what GRPO alone
  does with a base that can skip.

All arms log TON's split per step (``methods.ton.enabled=true``; ``format_weight=0`` is logging only and leaves
GRPO's reward unchanged), per question kind (``methods.ton.group_by=kind``). Every run trains ``--budget`` seconds
of process CPU time (``run.budget_clock=cpu``, one torch thread). The GRPO settings (``GRPO`` below: the
look-again demo's) were fixed before any held-out number was seen; ``--eval-split val`` is the split for choosing
settings.

Outputs in ``--out``: ``results.json`` (every run: before / after evaluations, per-step curves), ``results.md``
(the table).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for p in (REPO, REPO / "scripts"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

GRPO = {
    "model.dtype": "float32", "model.lora.enabled": "false", "data.task": "mcq", "data.prompt_mode": "hybrid",
    "reward.weights": "{mcq: 1.0}", "run.device": "cpu", "rollout.group_size": "8", "run.prompts_per_device": "8",
    "rollout.max_new_tokens": "24", "rollout.temperature": "1.0", "optim.lr": "1e-3", "run.max_steps": "100000",
    "run.budget_clock": "cpu", "run.save_every": "0", "run.tensorboard": "false", "run.resume_from": "none",
    "validation.every": "0", "methods.ton.enabled": "true", "methods.ton.group_by": "kind",
    "methods.ton.format_weight": "0",
}
ARMS = {  # arm -> (base, extra overrides)
    "grpo": ("think", {}),
    "ton": ("dropout", {"methods.ton.format_weight": "0.1"}),
    "grpo_dropout": ("dropout", {}),
}
CURVE_KEYS = ("reward/total/mean", "completions/mean_length", "ton/think_ratio", "ton/length_think",
              "ton/length_skip", "ton/direct/think_ratio", "ton/partner/think_ratio", "ton/direct/length",
              "ton/partner/length", "ton/direct/acc", "ton/partner/acc")


def log(msg: str) -> None:
    print(f"[compare_ton {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def overrides(arm: str, base: Path, data_dir: Path, run_dir: Path, seed: int, budget: float) -> list[str]:
    kv = dict(GRPO, **ARMS[arm][1])
    kv.update({"model.path": str(base), "data.train_file": str(data_dir / "train.jsonl"),
               "run.output_dir": str(run_dir), "run.seed": str(seed), "run.max_train_seconds": str(budget)})
    return [f"{k}={v}" for k, v in kv.items()]


def train_one(arm: str, base: Path, data_dir: Path, run_dir: Path, seed: int, budget: float):
    from mmgrpo.utils.config import load_config
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    over = overrides(arm, base, data_dir, run_dir, seed, budget)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "command.txt").write_text("mmgrpo train " + " ".join(over) + "\n")
    from mmgrpo.engine.errors import NothingTrained, TrainingStopped

    tr = GRPOTrainer(load_config(TrainConfig, None, over))
    c0 = time.process_time()
    try:
        hist = tr.train()
    except NothingTrained as e:  # every step without reward signal (a smoke base): evaluated as it stands
        log(f"{arm}: {e}")
        hist = []
    except TrainingStopped as e:  # the trainer's guard (e.g. 5 steps in a row without reward signal): evaluated as it
        log(f"{arm}: {e}")        # stands, its steps and curve up to the stop
        hist = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
    curve = [{k: h[k] for k in ("step",) + CURVE_KEYS if k in h} for h in hist]
    return tr, {"steps": tr.state.step, "cpu_seconds_train_call": time.process_time() - c0, "curve": curve}


def row_stats(runs: list[dict], ref: list[dict]) -> dict:
    """Mean / std / n over seeds of the after-metrics, and the 2-SE screen against the reference arm's runs."""
    from compare_methods import beyond_noise, summarize

    out = {}
    for key in ("all/acc", "direct/acc", "partner/acc", "direct/think_ratio", "partner/think_ratio",
                "direct/think_tokens", "partner/think_tokens", "all/length", "gain"):
        get = (lambda r, k=key: r["after"]["all"]["acc"] - r["before"]["all"]["acc"]) if key == "gain" else (
            lambda r, k=key: r["after"][k.split("/")[0]][k.split("/")[1]])
        s = summarize([get(r) for r in runs])
        if ref is not runs:
            s["vs_ref"] = s["mean"] - summarize([get(r) for r in ref])["mean"] if s["n"] else None
            s["beyond_noise"] = beyond_noise(s, summarize([get(r) for r in ref]))
        out[key] = s
    out["steps"] = summarize([r["steps"] for r in runs])
    return out


def fmt(s: dict, nd: int = 1) -> str:
    if not s or s.get("mean") is None:
        return "–"
    return f"{s['mean']:.{nd}f} ± {s['std']:.{nd}f}" if s["n"] > 1 else f"{s['mean']:.{nd}f}"


def write_table(out: Path, res: dict, arms: list[str]) -> str:
    ref = [r for r in res["runs"] if r["arm"] == "grpo"]
    lines = ["| arm | held-out acc | direct acc | partner acc | think ratio direct / partner | think tokens per "
             "completion, direct / partner | mean length | steps | vs GRPO (acc; direct think tokens) | > seed "
             "noise? | per seed acc |", "|" + "---|" * 11]
    stats = {}
    for arm in arms:
        runs = [r for r in res["runs"] if r["arm"] == arm]
        if not runs:
            continue
        st = stats[arm] = row_stats(runs, ref)
        vs = "–" if arm == "grpo" else (f"{st['all/acc']['vs_ref']:+.1f}; {st['direct/think_tokens']['vs_ref']:+.1f}"
                                        if st["all/acc"].get("vs_ref") is not None else "–")
        bn = "–" if arm == "grpo" else (f"{'yes' if st['all/acc']['beyond_noise'] else 'no'}; "
                                        f"{'yes' if st['direct/think_tokens']['beyond_noise'] else 'no'}"
                                        if st["all/acc"].get("beyond_noise") is not None else "n/a")
        per = " / ".join(f"{r['after']['all']['acc']:.1f}" for r in sorted(runs, key=lambda r: r["seed"]))
        lines.append(f"| {arm} | {fmt(st['all/acc'])} (n={st['all/acc']['n']}) | {fmt(st['direct/acc'])} | "
                     f"{fmt(st['partner/acc'])} | {fmt(st['direct/think_ratio'], 2)} / "
                     f"{fmt(st['partner/think_ratio'], 2)} | {fmt(st['direct/think_tokens'])} / "
                     f"{fmt(st['partner/think_tokens'])} | {fmt(st['all/length'])} | {fmt(st['steps'], 0)} | {vs} | "
                     f"{bn} | {per} |")
    starts = ["| base | held-out acc | direct (free / think / skip) | partner (free / think / skip) | think ratio "
              "direct / partner |", "|---|---|---|---|---|"]
    for name, ev in res["before"].items():
        d, p = ev["direct"], ev["partner"]
        starts.append(f"| {name} | {ev['all']['acc']:.1f} | {d['acc']:.1f} / {d['acc_forced_think']:.1f} / "
                      f"{d['acc_forced_skip']:.1f} | {p['acc']:.1f} / {p['acc_forced_think']:.1f} / "
                      f"{p['acc_forced_skip']:.1f} | {d['think_ratio']:.2f} / {p['think_ratio']:.2f} |")
    md = "\n".join(starts) + "\n\n" + "\n".join(lines) + "\n"
    (out / "results.md").write_text(md)
    res["stats"] = stats
    return md


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--bases", default="", help="folder holding think/ and dropout/ (built here if absent)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--budget", type=float, default=60.0, help="CPU seconds of training per run")
    p.add_argument("--arms", default="grpo,ton")
    p.add_argument("--eval-split", default="heldout", choices=("val", "heldout"))
    p.add_argument("--collect", default="", help="comma-separated --out folders of other runs (e.g. one seed per "
                   "process): their runs join this table")
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from demo_tools import load_base
    from mmgrpo.vlm.synthetic import think_or_not as ton
    import build_think_or_not_base as build

    torch.set_num_threads(1)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    bases = Path(a.bases) if a.bases else out / "bases"
    arms = [x for x in a.arms.split(",") if x]
    for arm in arms:
        if arm not in ARMS:
            raise SystemExit(f"[compare_ton] --arms: unknown arm {arm!r}; expected some of {list(ARMS)}")
    for name, dropout in (("think", 0.0), ("dropout", 0.5)):
        if any(ARMS[x][0] == name for x in arms) and not (bases / name / "base_report.json").exists():
            log(f"building base {name} (dropout {dropout})")
            build.main(["--out", str(bases / name), "--dropout", str(dropout)] + (["--smoke"] if a.smoke else []))
    res_path = out / "results.json"
    res = json.loads(res_path.read_text()) if res_path.exists() else {"runs": [], "before": {}}
    res.update(budget=a.budget, eval_split=a.eval_split, settings=GRPO, arms={k: ARMS[k] for k in arms})
    for name in sorted({ARMS[x][0] for x in arms}):
        cached = bases / name / f"before_{a.eval_split}.json"  # one evaluation per base, shared by every --out
        if name not in res["before"] and cached.exists():
            res["before"][name] = json.loads(cached.read_text())
        if name not in res["before"]:
            model, proc = load_base(bases / name)
            rows = ton.load_split(str(bases / name / "data" / f"{a.eval_split}.jsonl"))
            ev = ton.evaluate(model, proc, rows)
            res["before"][name] = {k: ev[k] for k in ("all",) + ton.bench.KINDS}
            cached.write_text(json.dumps(res["before"][name], indent=1))
            log(f"before {name}: {json.dumps(res['before'][name]['all'])}")
    for other in [Path(x) for x in a.collect.split(",") if x]:
        o = json.loads((other / "results.json").read_text())
        if o.get("budget") != a.budget or o.get("eval_split") != a.eval_split:
            raise SystemExit(f"[compare_ton] --collect {other}: budget / eval split differ from this run's")
        res["runs"] += [r for r in o["runs"] if not any(r["arm"] == x["arm"] and r["seed"] == x["seed"]
                                                        for x in res["runs"])]
    for seed in [int(s) for s in a.seeds.split(",")]:
        for arm in arms:
            if any(r["arm"] == arm and r["seed"] == seed for r in res["runs"]):
                continue
            base = bases / ARMS[arm][0]
            log(f"{arm} seed {seed}")
            tr, info = train_one(arm, base, base / "data", out / arm / f"seed{seed}", seed, a.budget)
            _, proc = load_base(base)
            rows = ton.load_split(str(base / "data" / f"{a.eval_split}.jsonl"))
            ev = ton.evaluate(tr.policy.model.eval(), proc, rows)
            after = {k: ev[k] for k in ("all",) + ton.bench.KINDS}
            res["runs"].append({"arm": arm, "seed": seed, "before": res["before"][ARMS[arm][0]], "after": after,
                                "examples": ev["examples"], **info})
            log(f"{arm} seed {seed}: {info['steps']} steps, after {json.dumps(after['all'])}")
            res_path.write_text(json.dumps(res, indent=1))
    md = write_table(out, res, arms)
    res_path.write_text(json.dumps(res, indent=1))
    print(md, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
