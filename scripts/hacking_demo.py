#!/usr/bin/env python
"""Reward-hacking benchmark on CPU: Flow-GRPO trained on a hackable proxy of Mini-GenEval, with and without each
guardrail of ``flow_grpo.methods`` (GRPO-Guard, GARDO, reward ensembles WCO / UWO, PAR, PaCo log-tamed).

    python scripts/hacking_demo.py --out runs/hacking --seeds 0,1,2 --budget 40
    bash scripts/hacking_demo.sh            # the same with the defaults of docs/results.md

* Generator: the shipped tiny SD3 base (``data/checkpoints/tiny_flow``), its 32 px / 10-step sampling, LoRA,
  Flow-GRPO-Fast (``method=fast``: a 3-step SDE window), groups of 8.
* Training reward: ``brightness`` (:mod:`flow_grpo.rewards.toy`: mean pixel / 255), the *proxy*: on the base's
  images it correlates positively with the verifier (the base's usual error is drawing too much: extra objects),
  and a blank canvas maximises it. ``mini_geneval`` (the programmatic verifier) is scored with weight 0: logged, never trained on; it is
  the truth. ``blob_count`` (a second, differently hackable proxy) is scored with weight 0 too: the second member
  of the ensembles / the log-tamed sum and GARDO's auxiliary reward.
* Step 0: the base's images of the *train* prompts, scored by proxy and verifier, give the correlation that makes
  the proxy a plausible reward (``step0.json``).
* Every run: equal budget of process CPU seconds (``run.max_train_seconds``, ``run.budget_clock=cpu``), evaluation
  on the *held-out* prompts every ``--eval-every`` epochs (deterministic ODE images; proxy and verifier);
  ``curves.png`` plots proxy vs verifier over training; ``results.md`` the table (mean ± std over seeds).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
BASE = REPO / "data" / "checkpoints" / "tiny_flow"
TAGS = ["single_object", "colors", "counting"]

PROXY_ONLY = "{brightness: 1.0, blob_count: 0.0, mini_geneval: 0.0}"
TWO_PROXIES = "{brightness: 1.0, blob_count: 1.0, mini_geneval: 0.0}"
#: name -> (label, overrides); the first row is the reference
METHODS: dict[str, tuple[str, list[str]]] = {
    "flow_grpo": ("Flow-GRPO (proxy only)", [f"reward.weights={PROXY_ONLY}"]),
    "grpo_guard": ("GRPO-Guard", [f"reward.weights={PROXY_ONLY}", "methods.grpo_guard.enabled=true"]),
    "gardo": ("GARDO (aux: blob_count)", [f"reward.weights={PROXY_ONLY}", "methods.gardo.enabled=true",
                                          "methods.gardo.aux_rewards=[blob_count]"]),
    "par": ("PAR (tau 0.05)", [f"reward.weights={PROXY_ONLY}", "methods.par.enabled=true", "methods.par.tau=0.05"]),
    "sum2": ("two proxies, plain sum", [f"reward.weights={TWO_PROXIES}"]),
    "log_tamed": ("two proxies, PaCo log-tamed", [f"reward.weights={TWO_PROXIES}", "methods.log_tamed.enabled=true"]),
    "wco": ("ensemble worst case (WCO)", [f"reward.weights={TWO_PROXIES}",
                                          "methods.reward_ensemble.members=[brightness,blob_count]",
                                          "methods.reward_ensemble.normalize=true"]),
    "uwo": ("ensemble uncertainty-weighted (UWO, lam 1)", [
        f"reward.weights={TWO_PROXIES}", "methods.reward_ensemble.members=[brightness,blob_count]",
        "methods.reward_ensemble.mode=uncertainty", "methods.reward_ensemble.normalize=true"]),
}


def run(cmd: list[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
                             env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    print(f"[hacking] {log.parent.name}/{log.stem}: rc={rc} ({time.time() - t0:.0f} s wall)", flush=True)
    if rc != 0:
        raise SystemExit(f"failed: {' '.join(cmd)} (see {log})")


def prompts(out: Path) -> tuple[Path, Path]:
    p = out / "prompts"
    p.mkdir(parents=True, exist_ok=True)
    for split in ("train", "heldout"):
        if not (p / f"{split}.jsonl").exists():
            run([PY, "data/synthetic_t2i.py", "--all", "--split", split, "--tags", *TAGS, "--out",
                 str(p / f"{split}.jsonl")], out / "logs" / f"prompts_{split}.log")
    return p / "train.jsonl", p / "heldout.jsonl"


def pearson(a: list[float], b: list[float]) -> float:
    import numpy as np

    return float(np.corrcoef(np.asarray(a), np.asarray(b))[0, 1])


def step0(out: Path, train: Path, args) -> dict:
    """Proxy vs verifier on the base's images of the train prompts."""
    d = out / "step0"
    if not (d / "metrics.json").exists():
        run([PY, "eval/generate_t2i.py", f"pipeline={BASE}", f"prompts={train}", f"out_dir={d}",
             "rewards=mini_geneval,brightness,blob_count", "reward_kwargs={mini_geneval: {mode: partial}}", "num_steps=10", "height=32", "width=32",
             "guidance_scale=1.0", "cfg=false", "max_sequence_length=1", f"images_per_prompt={args.step0_images}",
             "batch_size=32", "seed=0"], out / "logs" / "step0.log")
    rows = [json.loads(l) for l in (d / "images.jsonl").read_text().splitlines() if l.strip()]
    r = {k: [float(x["rewards"][k]) for x in rows] for k in ("brightness", "blob_count", "mini_geneval",
                                                              "mini_geneval/strict", "mini_geneval/partial")}
    res = {"images": len(rows),
           "pearson_proxy_verifier_partial": pearson(r["brightness"], r["mini_geneval/partial"]),
           "pearson_proxy_verifier_strict": pearson(r["brightness"], r["mini_geneval/strict"]),
           "pearson_blob_count_verifier_partial": pearson(r["blob_count"], r["mini_geneval/partial"]),
           "means": {k: sum(v) / len(v) for k, v in r.items()}}
    (out / "step0.json").write_text(json.dumps(res, indent=2))
    return res


def eval_cmd(heldout: Path, d: Path, args, lora: Path | None = None) -> list[str]:
    """Held-out evaluation (generate_t2i): the same noise seeds for the base and every run (paired)."""
    return [PY, "eval/generate_t2i.py", f"pipeline={BASE}", f"prompts={heldout}", f"out_dir={d}",
            "rewards=mini_geneval,brightness,blob_count", "reward_kwargs={mini_geneval: {mode: partial}}",
            "num_steps=10", "height=32", "width=32", "guidance_scale=1.0", "cfg=false", "max_sequence_length=1",
            f"images_per_prompt={args.eval_images}", "batch_size=32", "seed=0"] + ([f"lora={lora}"] if lora else [])


def eval_means(d: Path) -> dict:
    rows = [json.loads(l) for l in (d / "images.jsonl").read_text().splitlines() if l.strip()]
    keys = ("brightness", "blob_count", "mini_geneval/partial", "mini_geneval/strict")
    return {k: sum(float(x["rewards"][k]) for x in rows) / len(rows) for k in keys}


def train_cmd(name: str, seed: int, train: Path, heldout: Path, d: Path, args) -> list[str]:
    return [PY, "-m", "flow_grpo.cli", "train", f"model.pipeline_dir={BASE}", f"data.train_path={train}",
            f"data.eval_path={heldout}", "method=fast", "run.device=cpu", "sample.num_steps=10",
            "sample.height=32", "sample.width=32", "sample.cfg=false", "sample.guidance_scale=1.0",
            "model.max_sequence_length=1", "run.save_every=0", "ema.enabled=false", "run.image_grid_every=0",
            "optim.adv_scale=group", "optim.adv_std_ddof=1", f"data.groups_per_epoch={args.groups}",
            f"data.group_size={args.group_size}", f"optim.lr={args.lr}", f"run.eval_every={args.eval_every}",
            "sample.eval_num_steps=10", f"run.max_train_seconds={args.budget}", "run.budget_clock=cpu",
            "run.num_epochs=100000", f"run.output_dir={d}", f"run.seed={seed}", "run.progress_bar=false",
            "reward.kwargs={mini_geneval: {mode: partial}}", "data.eval_num_prompts=0", *METHODS[name][1],
            *args.set]


def claim(d: Path) -> bool:
    """Take run folder ``d`` for this process (several ``--stage runs`` workers may share ``--out``); a re-run of
    the script after an interruption removes the stale claim of an unfinished run first (``--reclaim``)."""
    d.mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(d / "CLAIMED", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def read(d: Path) -> list[dict]:
    p = d / "metrics.jsonl"
    return [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []


def summarize(out: Path, names: list[str], seeds: list[int], s0: dict) -> str:
    import numpy as np

    def ms(v, scale=1.0, fmt=".3f"):
        v = [scale * x for x in v if x is not None]
        return f"{np.mean(v):{fmt}} ± {np.std(v):{fmt}}" if len(v) > 1 else (f"{v[0]:{fmt}}" if v else "–")

    base = eval_means(out / "base_eval") if (out / "base_eval" / "images.jsonl").exists() else None
    lines = ["| method | proxy (brightness) | verifier partial | verifier strict acc. % | verifier partial vs "
             "base (paired) | epochs | train CPU-s |", "|---|---|---|---|---|---|---|"]
    if base:
        lines.append(f"| base (before training) | {base['brightness']:.3f} | {base['mini_geneval/partial']:.3f} | "
                     f"{100 * base['mini_geneval/strict']:.1f} | – | 0 | 0 |")
    curves = {}
    for name in names:
        cols = {k: [] for k in ("p", "v", "s", "dv", "ep", "cpu")}
        curves[name] = []
        for seed in seeds:
            d = out / name / f"seed{seed}"
            if not (d / "final_eval" / "images.jsonl").exists():
                continue
            h, e = read(d), eval_means(d / "final_eval")
            cols["p"].append(e["brightness"])
            cols["v"].append(e["mini_geneval/partial"])
            cols["s"].append(e["mini_geneval/strict"])
            cols["dv"].append(e["mini_geneval/partial"] - base["mini_geneval/partial"] if base else None)
            cols["ep"].append(len(h))
            cols["cpu"].append(h[-1].get("time/train_budget_s") if h else None)
            start = [(0, base["brightness"], base["mini_geneval/partial"])] if base else []
            curves[name].append(start + [(x["epoch"] + 1, x["eval/reward/brightness/mean"],
                                          x["eval/reward/mini_geneval/mean"]) for x in h
                                         if "eval/reward/mini_geneval/mean" in x])
        lines.append(f"| {METHODS[name][0]} | {ms(cols['p'])} | {ms(cols['v'])} | {ms(cols['s'], 100, '.1f')} | "
                     f"{ms(cols['dv'])} | {ms(cols['ep'], fmt='.0f')} | {ms(cols['cpu'], fmt='.0f')} |")
    (out / "curves.json").write_text(json.dumps(curves))
    plot(out / "curves.png", curves)
    text = (f"Step 0 (base, {s0['images']} images of the train prompts): Pearson(proxy, verifier partial) = "
            f"{s0['pearson_proxy_verifier_partial']:.3f}, Pearson(proxy, verifier strict) = "
            f"{s0['pearson_proxy_verifier_strict']:.3f}, Pearson(blob_count, verifier partial) = "
            f"{s0['pearson_blob_count_verifier_partial']:.3f}\n\n" + "\n".join(lines) + "\n")
    (out / "results.md").write_text(text)
    return text


def plot(path: Path, curves: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (name, runs) in enumerate(curves.items()):
        c = f"C{i}"
        for j, r in enumerate(runs):
            ep = [x[0] for x in r]
            axes[0].plot(ep, [x[1] for x in r], color=c, alpha=0.8, label=METHODS[name][0] if j == 0 else None)
            axes[1].plot(ep, [x[2] for x in r], color=c, alpha=0.8, label=METHODS[name][0] if j == 0 else None)
    axes[0].set_title("held-out proxy (brightness)")
    axes[1].set_title("held-out verifier (mini_geneval partial)")
    for a in axes:
        a.set_xlabel("epoch")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/hacking"))
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma list of {', '.join(METHODS)}")
    p.add_argument("--budget", type=float, default=40.0, help="process CPU seconds of training per run")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--groups", type=int, default=2, help="groups (prompts) per epoch")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--step0-images", type=int, default=4, help="base images per train prompt (step-0 correlation)")
    p.add_argument("--eval-images", type=int, default=4, help="images per held-out prompt of the final evals")
    p.add_argument("--set", nargs="*", default=[], help="extra key=value trainer overrides for every run")
    p.add_argument("--reclaim", action="store_true", help="drop the claims of unfinished runs (after a crash)")
    p.add_argument("--stage", choices=["all", "setup", "runs", "report"], default="all",
                   help="setup = prompts, step-0 correlation, base eval; runs = the training runs (seeds may run "
                        "in parallel processes after setup); report = results.md and curves.png from what exists")
    args = p.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    train, heldout = prompts(out)
    s0 = step0(out, train, args)
    print(f"[hacking] step 0: {s0}", flush=True)
    names = [n.strip() for n in args.methods.split(",") if n.strip()]
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise SystemExit(f"--methods: unknown {unknown}; choose from {list(METHODS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    if not (out / "base_eval" / "images.jsonl").exists():
        run(eval_cmd(heldout, out / "base_eval", args), out / "logs" / "base_eval.log")
    if args.stage == "setup":
        return 0
    if args.reclaim:  # an interrupted earlier run: its unfinished claims are stale
        for c in out.glob("*/seed*/CLAIMED"):
            if not (c.parent / "final_eval" / "images.jsonl").exists():
                c.unlink()
    for seed in seeds if args.stage != "report" else []:  # seed-major: a partial run still has every method's first seed
        for name in names:
            d = out / name / f"seed{seed}"
            if (d / "final_eval" / "images.jsonl").exists() or not claim(d):
                continue  # done, or another worker process (--stage runs) has it
            run(train_cmd(name, seed, train, heldout, d, args), out / "logs" / f"{name}_s{seed}.log")
            run(eval_cmd(heldout, d / "final_eval", args, d / "lora_final"), out / "logs" / f"{name}_s{seed}_eval.log")
            if args.stage == "all":
                summarize(out, names, seeds, s0)
    if args.stage in ("all", "report"):
        print(summarize(out, names, seeds, s0))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
