#!/usr/bin/env python
"""Is RL guidance with weight w the same as training with another KL strength? (RLG's claim; issue #20 item 3)

    python scripts/rlg_vs_kl.py --out runs/rlg_vs_kl --kl 0,0.04,0.4,4 --seeds 0 --epochs 60 \
        --weights 0,0.25,0.5,0.75,1,1.5,2,3

On mini-GenEval with the demo's tiny flow base (``data/checkpoints/tiny_flow``):

1. one LoRA per (seed, ``optim.kl_coef``) from ``flow_grpo train`` with the demo's T2I settings (``method=fast``,
   LoRA r 32, lr 1e-3, 4 groups x 8 images per epoch, the Flow-GRPO KL on the mean, ``optim.kl_type=mean``) for a
   FIXED number of epochs (``--epochs``): every run makes the same number of updates; a KL run costs one more
   forward per trained step (the reference velocity; the training wall seconds are in rlg_vs_kl.json);
2. the held-out evaluation of the demo (12 prompts x ``--images-per-prompt``, Euler, 10 steps), paired: every model
   starts from the same x_T; the kl=0 LoRA at every RLG weight w (``rlg_weight=w``: w = 0 is the base, 1 the
   LoRA), each KL LoRA as trained (w = 1);
3. two axes per model: the reward (partial mini-GenEval reward, the training reward, and image-level strict
   accuracy) and the drift from the base (mean |pixel - pixel of the base| over all images, 0-255, same x_T);
   the RLG curve is interpolated at each KL model's reward to ask whether the drift agrees too.

RLG's argument: the KL-regularised optimum is p_ref exp(r / beta) / Z, so the geometric mix
p_ref^(1-w) p_beta^w is the optimum for beta / w. A kl=0 run is not at such an optimum (its "beta" is set by
how long it trained), so the test here is the practical form: do the KL-trained models lie on the RLG curve of the
unregularised LoRA in the (drift, reward) plane? Outputs in ``--out``: ``rlg_vs_kl.json``, ``rlg_vs_kl.md`` and
``rlg_vs_kl.png``. Everything already trained or evaluated in ``--out`` is reused (re-running resumes).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / "data" / "checkpoints" / "tiny_flow"
PY = sys.executable
SAMPLING = ["sample.num_steps=10", "sample.height=32", "sample.width=32", "sample.cfg=false",
            "sample.guidance_scale=1.0", "model.max_sequence_length=1"]


def run(cmd: list[str], log: Path) -> None:
    print("[rlg_vs_kl]", " ".join(cmd), flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        if subprocess.run(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT).returncode:
            raise SystemExit(f"[rlg_vs_kl] failed, see {log}")


def prompts(out: Path) -> tuple[Path, Path]:
    tags = json.loads((BASE / "mmgrpo_demo.json").read_text())["tags"]
    files = []
    for split in ("train", "heldout"):
        f = out / "prompts" / f"{split}.jsonl"
        if not f.exists():
            f.parent.mkdir(parents=True, exist_ok=True)
            run([PY, "data/synthetic_t2i.py", "--all", "--split", split, "--out", str(f), "--tags", *tags],
                out / f"prompts_{split}.log")
        files.append(f)
    return files[0], files[1]


def train(out: Path, seed: int, kl: str, epochs: int, train_p: Path, eval_p: Path) -> Path:
    """The LoRA of (seed, kl), trained unless ``<out>/train_kl<kl>_s<seed>/lora_final`` exists."""
    d = out / f"train_kl{kl}_s{seed}"
    lora = d / "lora_final"
    if not (lora / "pytorch_lora_weights.safetensors").exists():
        run([PY, "-m", "flow_grpo.cli", "train", f"model.pipeline_dir={BASE}", "run.cpu=true",
             f"data.train_path={train_p}", f"data.eval_path={eval_p}", "reward.weights={mini_geneval: 1.0}",
             "reward.kwargs={mini_geneval: {mode: partial}}", "method=fast", "optim.adv_scale=group",
             "optim.adv_std_ddof=1", "ema.enabled=false", "run.image_grid_every=0", "run.save_every=0",
             f"run.num_epochs={epochs}", "data.groups_per_epoch=4", "data.group_size=8", "optim.lr=1e-3",
             f"optim.kl_coef={kl}", "run.tensorboard=false", "run.reward_curves=false", f"run.seed={seed}",
             *SAMPLING, f"run.output_dir={d}"], Path(f"{d}.log"))
    return lora


def evaluate(out: Path, name: str, lora: Path, eval_p: Path, ipp: int, w: float | None) -> Path:
    d = out / "eval" / name
    if not (d / "metrics.json").exists():
        run([PY, "eval/generate_t2i.py", f"pipeline={BASE}", f"prompts={eval_p}", "rewards=[mini_geneval]",
             "num_steps=10", "guidance_scale=1.0", "cfg=false", "height=32", "width=32", "max_sequence_length=1",
             "batch_size=32", f"images_per_prompt={ipp}", "grid_nrow=0", "progress=false", "seed=0", f"lora={lora}",
             *([] if w is None else [f"rlg_weight={w}"]), f"out_dir={d}"], out / "eval" / f"{name}.log")
    return d


def images(d: Path):
    import numpy as np
    from PIL import Image

    rows = sorted((json.loads(x) for x in (d / "images.jsonl").read_text().splitlines() if x.strip()),
                  key=lambda r: r["index"])
    return np.stack([np.asarray(Image.open(d / r["image"])).astype(np.float64) for r in rows])


def point(d: Path, base_imgs) -> dict:
    """Reward and drift of one evaluation folder."""
    import numpy as np

    m = json.loads((d / "metrics.json").read_text())
    rows = [json.loads(x) for x in (d / "images.jsonl").read_text().splitlines() if x.strip()]
    partial = [r["rewards"]["mini_geneval/partial"] if "rewards" in r else r["mini_geneval/partial"] for r in rows]
    return {"partial": m["rewards"]["mini_geneval/partial"]["mean"],
            "partial_se": statistics.stdev(partial) / len(partial) ** 0.5,
            "acc": 100 * m["mini_geneval"]["accuracy"], "overall": 100 * m["mini_geneval"]["overall"],
            "drift": float(np.abs(images(d) - base_imgs).mean()), "n_images": len(rows),
            "per_image": [partial[i] for i in np.argsort([r["index"] for r in rows])]}


def paired_se(a: list[float], b: list[float]) -> float:
    """Standard error of mean(a - b) over paired images (same x_T): the evaluation noise of a difference."""
    return statistics.stdev([x - y for x, y in zip(a, b, strict=True)]) / len(a) ** 0.5


def interp(xs: list[float], ys: list[float], y: float) -> float | None:
    """x where the piecewise-linear curve (xs, ys), xs increasing, first reaches y (None if never)."""
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if min(y0, y1) <= y <= max(y0, y1) and y1 != y0:
            return x0 + (y - y0) * (x1 - x0) / (y1 - y0)
    return None


def train_seconds(out: Path, seed: int, kl: str) -> float | None:
    f = out / f"train_kl{kl}_s{seed}" / "metrics.jsonl"
    rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.exists() else []
    # cumulative seconds of training on the run's budget clock (wall: these runs set no CPU budget)
    return rows[-1].get("time/train_budget_s") if rows else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/rlg_vs_kl", help="output folder (re-running resumes)")
    p.add_argument("--kl", default="0,0.04,0.4,4", help="comma list of optim.kl_coef values; 0 must be first "
                   "(its LoRA gets the RLG sweep)")
    p.add_argument("--seeds", default="0", help="comma list of training seeds")
    p.add_argument("--epochs", type=int, default=60, help="training epochs of every run (fixed: equal updates)")
    p.add_argument("--weights", default="0,0.25,0.5,0.75,1,1.5,2,3", help="RLG weights w for the kl=0 LoRA")
    p.add_argument("--images-per-prompt", type=int, default=16, help="held-out images per prompt (12 prompts)")
    args = p.parse_args(argv)
    out = Path(args.out) if Path(args.out).is_absolute() else REPO / args.out
    kls = [k.strip() for k in args.kl.split(",") if k.strip()]
    if float(kls[0]) != 0:
        p.error("--kl must start with 0 (the LoRA of the RLG sweep)")
    ws = sorted(float(w) for w in args.weights.split(","))
    if ws[0] != 0:
        p.error("--weights must include 0 (the base: the drift reference)")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    train_p, eval_p = prompts(out)
    res = {"args": vars(args), "seeds": {}}
    for s in seeds:
        loras = {k: train(out, s, k, args.epochs, train_p, eval_p) for k in kls}
        ev = {f"w{w:g}": evaluate(out, f"s{s}_kl0_w{w:g}", loras[kls[0]], eval_p, args.images_per_prompt, w)
              for w in ws}
        ev.update({f"kl{k}": evaluate(out, f"s{s}_kl{k}", loras[k], eval_p, args.images_per_prompt, None)
                   for k in kls[1:]})
        base = images(ev["w0"])
        pts = {name: point(d, base) for name, d in ev.items()}
        curve_r = [pts[f"w{w:g}"]["partial"] for w in ws]
        curve_d = [pts[f"w{w:g}"]["drift"] for w in ws]
        match = {}
        for k in kls[1:]:
            q = pts[f"kl{k}"]
            w_r = interp(ws, curve_r, q["partial"])  # the w whose reward equals the KL model's
            w_d = interp(ws, curve_d, q["drift"])    # the w whose drift equals the KL model's
            d_at = None if w_r is None else interp_y(ws, curve_d, w_r)
            match[k] = {"w_reward": w_r, "w_drift": w_d, "rlg_drift_at_w_reward": d_at,
                        "partial_minus_w1": q["partial"] - pts["w1"]["partial"],
                        "paired_se_vs_w1": paired_se(q["per_image"], pts["w1"]["per_image"])}
        res["seeds"][str(s)] = {"points": pts, "match": match,
                                "train_wall_s": {k: train_seconds(out, s, k) for k in kls}}
    for r in res["seeds"].values():  # per-image rewards are in each eval folder's images.jsonl
        for q in r["points"].values():
            q.pop("per_image")
    (out / "rlg_vs_kl.json").write_text(json.dumps(res, indent=1) + "\n")
    table = report(res, kls, ws)
    (out / "rlg_vs_kl.md").write_text(table)
    print(table)
    plot(out / "rlg_vs_kl.png", res, kls, ws)
    return 0


def interp_y(xs: list[float], ys: list[float], x: float) -> float:
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            return y0 + (x - x0) * (y1 - y0) / (x1 - x0)
    raise ValueError(f"{x} outside [{xs[0]}, {xs[-1]}]")


def _f(x, fmt="{:.3f}"):
    return "–" if x is None else fmt.format(x)


def report(res: dict, kls: list[str], ws: list[float]) -> str:
    lines = []
    for s, r in res["seeds"].items():
        pts = r["points"]
        lines += [f"Training seed {s}:", "",
                  "| model | partial reward (± s.e.) | strict acc. image-level (%) | drift from base (mean abs px) "
                  "| RLG w with the same reward | RLG w with the same drift | RLG drift at that reward "
                  "| reward - w=1 (paired s.e.) |", "|---|---|---|---|---|---|---|---|"]
        for w in ws:
            q = pts[f"w{w:g}"]
            lines.append(f"| RLG w = {w:g} (kl 0 LoRA) | {q['partial']:.3f} ± {q['partial_se']:.3f} | {q['acc']:.1f} | "
                         f"{q['drift']:.2f} | | | | |")
        for k in kls[1:]:
            q, m = pts[f"kl{k}"], r["match"][k]
            lines.append(f"| KL beta = {k} (w = 1) | {q['partial']:.3f} ± {q['partial_se']:.3f} | {q['acc']:.1f} | "
                         f"{q['drift']:.2f} | {_f(m['w_reward'], '{:.2f}')} | "
                         f"{_f(m['w_drift'], '{:.2f}')} | {_f(m['rlg_drift_at_w_reward'], '{:.2f}')} | "
                         f"{m['partial_minus_w1']:+.3f} ({m['paired_se_vs_w1']:.3f}) |")
        lines.append("")
    return "\n".join(lines)


def plot(path: Path, res: dict, kls: list[str], ws: list[float]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for s, r in res["seeds"].items():
        pts = r["points"]
        for ax, key, label in ((axes[0], "partial", "partial reward (training reward)"),
                               (axes[1], "acc", "strict accuracy, image-level (%)")):
            xs = [pts[f"w{w:g}"]["drift"] for w in ws]
            ys = [pts[f"w{w:g}"][key] for w in ws]
            ax.plot(xs, ys, "o-", color="C0", label=f"RLG(w), kl=0 LoRA, seed {s}")
            for w, x, y in zip(ws, xs, ys):
                ax.annotate(f"w={w:g}", (x, y), fontsize=7, xytext=(3, -9), textcoords="offset points")
            for i, k in enumerate(kls[1:]):
                q = pts[f"kl{k}"]
                ax.plot(q["drift"], q[key], "s", color=f"C{i + 1}", label=f"KL beta={k}, seed {s}")
            ax.set_xlabel("drift from the base (mean |pixel difference|, 0-255)")
            ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.suptitle("RL guidance of the unregularised LoRA vs training with a KL (mini-GenEval, paired x_T)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
