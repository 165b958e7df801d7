#!/usr/bin/env python
"""Is RL guidance with weight w the same as training with another KL strength? (RLG's claim; issue #20 item 3)

    python scripts/rlg_vs_kl.py --out runs/rlg_vs_kl --kl 0,0.04,0.1,0.4,1 --seeds 0,1,2 --epochs 60 \
        --weights 0,0.25,0.5,0.75,1,1.5,2,3 --sweep-kl 0.1 --sweep-weights 0.1,0.25,0.5

On mini-GenEval with the demo's tiny flow base (``data/checkpoints/tiny_flow``):

1. one LoRA per (seed, ``optim.kl_coef``) from ``flow_grpo train`` with the demo's T2I settings (``method=fast``,
   LoRA r 32, lr 1e-3, 4 groups x 8 images per epoch, the Flow-GRPO KL on the mean, ``optim.kl_type=mean``) for a
   FIXED number of epochs (``--epochs``): every run makes the same number of updates; a KL run costs one more
   forward per trained step (the reference velocity; the training wall seconds are in rlg_vs_kl.json);
2. the held-out evaluation of the demo (12 prompts x ``--images-per-prompt``, Euler, 10 steps), paired: every model
   starts from the same x_T; the kl=0 LoRA at every RLG weight w (``rlg_weight=w``: w = 0 is the base, 1 the
   LoRA), each KL LoRA as trained (w = 1), and the ``--sweep-kl`` LoRAs also at ``--sweep-weights``;
3. two axes per model: the reward (partial mini-GenEval reward, the training reward, and image-level strict
   accuracy) and the drift from the base (mean |pixel - pixel of the base| over all images, 0-255, same x_T);
   each KL model is placed on an RLG curve twice: the w with its reward and the w with its drift. If the claim
   holds, the two agree. Noise: a paired bootstrap over the images (the same images resampled for the curve and
   the model) gives each matched w's evaluation noise; across training seeds, the mean and standard error of the
   per-seed matched w's (each seed's KL model on its own seed's curve).

RLG's argument: the KL-regularised optimum is p_ref exp(r / beta) / Z, so the geometric mix
p_ref^(1-w) p_beta^w is the optimum for beta / w. A kl=0 run is not at such an optimum (its "beta" is set by
how long it trained), so the first test is the practical form: do the KL-trained models lie on the RLG curve of
the unregularised LoRA in the (drift, reward) plane? (If a kl=0 run behaved as an optimum at some beta_0, the
matched w would be beta_0 / beta: w x beta constant across beta.) The second is the claim's own form: RLG of a
``--sweep-kl`` LoRA at weight w in (0, 1) against the LoRA trained at beta / w. Outputs in ``--out``:
``rlg_vs_kl.json``, ``rlg_vs_kl.md`` and ``rlg_vs_kl.png``. Everything already trained or evaluated in ``--out`` is
reused (re-running resumes).
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
        run([PY, "-m", "flow_grpo.cli", "train", f"model.pipeline_dir={BASE}", "run.device=cpu",
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
    """Reward and drift of one evaluation folder (means, and per image in index order for the paired statistics)."""
    import numpy as np

    m = json.loads((d / "metrics.json").read_text())
    rows = [json.loads(x) for x in (d / "images.jsonl").read_text().splitlines() if x.strip()]
    partial = [r["rewards"]["mini_geneval/partial"] if "rewards" in r else r["mini_geneval/partial"] for r in rows]
    drift = np.abs(images(d) - base_imgs).reshape(len(rows), -1).mean(1)  # images() is in index order
    return {"partial": m["rewards"]["mini_geneval/partial"]["mean"],
            "partial_se": statistics.stdev(partial) / len(partial) ** 0.5,
            "acc": 100 * m["mini_geneval"]["accuracy"], "overall": 100 * m["mini_geneval"]["overall"],
            "drift": float(drift.mean()), "n_images": len(rows),
            "per_image": [partial[i] for i in np.argsort([r["index"] for r in rows])],
            "per_image_drift": drift.tolist()}


def paired_se(a: list[float], b: list[float]) -> float:
    """Standard error of mean(a - b) over paired images (same x_T): the evaluation noise of a difference."""
    return statistics.stdev([x - y for x, y in zip(a, b, strict=True)]) / len(a) ** 0.5


def interp(xs: list[float], ys: list[float], y: float) -> float | None:
    """x where the piecewise-linear curve (xs, ys), xs increasing, first reaches y (None if never)."""
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if min(y0, y1) <= y <= max(y0, y1) and y1 != y0:
            return x0 + (y - y0) * (x1 - x0) / (y1 - y0)
    return None


def interp_y(xs: list[float], ys: list[float], x: float) -> float:
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            return y0 + (x - x0) * (y1 - y0) / (x1 - x0)
    raise ValueError(f"{x} outside [{xs[0]}, {xs[-1]}]")


def matched_w(curve: list[dict], ws: list[float], q: dict, idx=None) -> dict:
    """Where the model ``q`` sits on the RLG curve ``curve`` (one point per w in ``ws``), from the per-image values
    over the images ``idx`` (all if None; a bootstrap resample otherwise): the w whose reward equals q's, the w whose
    drift equals q's (None where the curve never reaches it), and ``reward_gap``: q's reward minus the curve's
    reward at q's drift (0 if q lies on the curve; > 0: more reward than RLG at the same distance from the base)."""
    import numpy as np

    def mean(pt, key):
        v = np.asarray(pt[key])
        return float(v.mean() if idx is None else v[idx].mean())

    rewards = [mean(c, "per_image") for c in curve]
    w_r = interp(ws, rewards, mean(q, "per_image"))
    w_d = interp(ws, [mean(c, "per_image_drift") for c in curve], mean(q, "per_image_drift"))
    gap = None if w_d is None else mean(q, "per_image") - interp_y(ws, rewards, w_d)
    return {"w_reward": w_r, "w_drift": w_d, "reward_gap": gap}


def bootstrap_w(curve: list[dict], ws: list[float], q: dict, n_boot: int = 1000, seed: int = 0) -> dict:
    """Evaluation noise of :func:`matched_w`: resample the images with replacement, the SAME images for the curve
    and the model (they share x_T), and re-match. Standard deviation over the resamples where the value exists, and
    the fraction where it does not (the curve not reached)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = len(q["per_image"])
    got = [matched_w(curve, ws, q, rng.integers(0, n, n)) for _ in range(n_boot)]
    out = {}
    for key in ("w_reward", "w_drift", "reward_gap"):
        vals = [g[key] for g in got if g[key] is not None]
        out[f"{key}_boot_se"] = statistics.stdev(vals) if len(vals) > 1 else None
        out[f"{key}_missing"] = 1.0 - len(vals) / n_boot
    return out


def mean_se(xs: list[float | None]) -> tuple[float | None, float | None, int]:
    """(mean, standard error = stdev / sqrt(n), n) over the values that exist (one per training seed)."""
    v = [x for x in xs if x is not None]
    if not v:
        return None, None, 0
    return statistics.mean(v), (statistics.stdev(v) / len(v) ** 0.5 if len(v) > 1 else None), len(v)


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
    p.add_argument("--sweep-kl", default="", help="comma list of --kl values whose LoRAs also get an RLG sweep "
                   "(the claim's own form: RLG(beta LoRA, w) should match the LoRA trained at beta / w, for every "
                   "larger beta in --kl)")
    p.add_argument("--sweep-weights", default="0.1,0.25,0.5", help="RLG weights in (0, 1) of the --sweep-kl LoRAs "
                   "(w = 0 and 1 are the base and the LoRA itself, already evaluated)")
    p.add_argument("--images-per-prompt", type=int, default=16, help="held-out images per prompt (12 prompts)")
    p.add_argument("--bootstrap", type=int, default=1000, help="image resamples for the matched w's standard error")
    args = p.parse_args(argv)
    out = Path(args.out) if Path(args.out).is_absolute() else REPO / args.out
    kls = [k.strip() for k in args.kl.split(",") if k.strip()]
    if float(kls[0]) != 0:
        p.error("--kl must start with 0 (the LoRA of the RLG sweep)")
    ws = sorted(float(w) for w in args.weights.split(","))
    if ws[0] != 0:
        p.error("--weights must include 0 (the base: the drift reference)")
    sweep_kls = [k.strip() for k in args.sweep_kl.split(",") if k.strip()]
    if any(k not in kls[1:] for k in sweep_kls):
        p.error(f"--sweep-kl {sweep_kls}: every value must be a non-zero --kl value ({kls[1:]})")
    sws = sorted(float(w) for w in args.sweep_weights.split(",") if w.strip())
    if any(not 0 < w < 1 for w in sws):
        p.error("--sweep-weights must lie in (0, 1)")
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    train_p, eval_p = prompts(out)
    res = {"args": vars(args), "seeds": {}}
    for s in seeds:
        loras = {k: train(out, s, k, args.epochs, train_p, eval_p) for k in kls}
        ev = {f"w{w:g}": evaluate(out, f"s{s}_kl0_w{w:g}", loras[kls[0]], eval_p, args.images_per_prompt, w)
              for w in ws}
        ev.update({f"kl{k}": evaluate(out, f"s{s}_kl{k}", loras[k], eval_p, args.images_per_prompt, None)
                   for k in kls[1:]})
        ev.update({f"kl{k}_w{w:g}": evaluate(out, f"s{s}_kl{k}_w{w:g}", loras[k], eval_p, args.images_per_prompt, w)
                   for k in sweep_kls for w in sws})
        base = images(ev["w0"])
        pts = {name: point(d, base) for name, d in ev.items()}
        # the RLG curves: the kl=0 LoRA's over ws; each swept LoRA's over 0 (the base), sws and 1 (itself)
        curves = {"0": (ws, [pts[f"w{w:g}"] for w in ws])}
        for k in sweep_kls:
            curves[k] = ([0.0, *sws, 1.0], [pts["w0"], *(pts[f"kl{k}_w{w:g}"] for w in sws), pts[f"kl{k}"]])
        match = {}
        for c, (cws, curve) in curves.items():
            for k in kls[1:]:
                if c != "0" and float(k) <= float(c):
                    continue  # RLG with w in [0, 1] of a beta LoRA can only reach larger betas
                q = pts[f"kl{k}"]
                m = {**matched_w(curve, cws, q), **bootstrap_w(curve, cws, q, args.bootstrap, seed=s)}
                if c == "0":
                    m.update(partial_minus_w1=q["partial"] - pts["w1"]["partial"],
                             paired_se_vs_w1=paired_se(q["per_image"], pts["w1"]["per_image"]))
                else:
                    m["w_predicted"] = float(c) / float(k)  # RLG(beta_c, w) = optimum at beta_c / w
                match.setdefault(c, {})[k] = m
        res["seeds"][str(s)] = {"points": pts, "match": match,
                                "train_wall_s": {k: train_seconds(out, s, k) for k in kls}}
    res["summary"] = summary(res, kls)
    for r in res["seeds"].values():  # per-image values are in each eval folder's images.jsonl
        for q in r["points"].values():
            q.pop("per_image")
            q.pop("per_image_drift")
    (out / "rlg_vs_kl.json").write_text(json.dumps(res, indent=1) + "\n")
    table = report(res, kls, ws)
    (out / "rlg_vs_kl.md").write_text(table)
    print(table)
    plot(out / "rlg_vs_kl.png", res, kls, ws)
    return 0


def summary(res: dict, kls: list[str]) -> dict:
    """Across training seeds, for each (RLG curve, KL model): the matched w's mean and standard error over seeds
    (each seed's KL model is matched against its own seed's curve: a paired comparison)."""
    out = {}
    curves = sorted({c for r in res["seeds"].values() for c in r["match"]}, key=float)
    for c in curves:
        for k in kls[1:]:
            rows = [r["match"][c][k] for r in res["seeds"].values() if k in r["match"].get(c, {})]
            if not rows:
                continue
            e = {}
            for key in ("w_reward", "w_drift", "reward_gap"):
                m, se, n = mean_se([x[key] for x in rows])
                e[key] = {"per_seed": [x[key] for x in rows], "mean": m, "se": se, "n": n}
            if c == "0":
                m, se, n = mean_se([None if x["w_reward"] is None else x["w_reward"] * float(k) for x in rows])
                e["w_reward_times_beta"] = {"mean": m, "se": se, "n": n}
                m, se, n = mean_se([x["partial_minus_w1"] for x in rows])
                e["partial_minus_w1"] = {"mean": m, "se": se, "n": n}
            else:
                e["w_predicted"] = rows[0]["w_predicted"]
            out.setdefault(c, {})[k] = e
    return out


def _f(x, fmt="{:.3f}"):
    return "–" if x is None else fmt.format(x)


def _pm(m, se, fmt="{:.2f}"):
    return "–" if m is None else fmt.format(m) + ("" if se is None else " ± " + fmt.replace("+", "").format(se))


def report(res: dict, kls: list[str], ws: list[float]) -> str:
    lines = []
    for s, r in res["seeds"].items():
        pts = r["points"]
        lines += [f"Training seed {s}:", "",
                  "| model | partial reward (± s.e.) | strict acc. image-level (%) | drift from base (mean abs px) "
                  "| RLG w with the same reward (boot. s.e.) | RLG w with the same drift (boot. s.e.) "
                  "| reward - RLG reward at the same drift (boot. s.e.) | reward - w=1 (paired s.e.) |",
                  "|---|---|---|---|---|---|---|---|"]
        for w in ws:
            q = pts[f"w{w:g}"]
            lines.append(f"| RLG w = {w:g} (kl 0 LoRA) | {q['partial']:.3f} ± {q['partial_se']:.3f} | "
                         f"{q['acc']:.1f} | {q['drift']:.2f} | | | | |")
        for k in kls[1:]:
            q, m = pts[f"kl{k}"], r["match"]["0"][k]
            lines.append(f"| KL beta = {k} (w = 1) | {q['partial']:.3f} ± {q['partial_se']:.3f} | {q['acc']:.1f} | "
                         f"{q['drift']:.2f} | {_pm(m['w_reward'], m['w_reward_boot_se'])} | "
                         f"{_pm(m['w_drift'], m['w_drift_boot_se'])} | "
                         f"{_pm(m['reward_gap'], m['reward_gap_boot_se'], '{:+.3f}')} | "
                         f"{m['partial_minus_w1']:+.3f} ({m['paired_se_vs_w1']:.3f}) |")
        for c, ms in r["match"].items():
            if c == "0":
                continue
            for k, m in ms.items():
                lines.append(f"| KL beta = {k} on the RLG curve of the beta = {c} LoRA (predicted w = "
                             f"{m['w_predicted']:.2f}) | | | | {_pm(m['w_reward'], m['w_reward_boot_se'])} | "
                             f"{_pm(m['w_drift'], m['w_drift_boot_se'])} | "
                             f"{_pm(m['reward_gap'], m['reward_gap_boot_se'], '{:+.3f}')} | |")
        lines.append("")
    summ = res.get("summary", {})
    if summ:
        seeds = ", ".join(res["seeds"])
        lines += [f"Across training seeds ({seeds}): mean ± standard error over seeds (each KL model matched on its "
                  "own seed's RLG curve)", "",
                  "| RLG curve of | KL model | w by reward, per seed | w by reward | w by drift, per seed | w by drift "
                  "| predicted w | w x beta (reward) | reward - RLG at the same drift, per seed | the same, mean "
                  "| reward - w=1 |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for c, ks in summ.items():
            for k, e in ks.items():
                per = lambda key, fmt="{:.2f}": " / ".join(_f(x, fmt) for x in e[key]["per_seed"])  # noqa: E731
                wb = e.get("w_reward_times_beta")
                dm = e.get("partial_minus_w1")
                lines.append(f"| {'kl 0 LoRA' if c == '0' else f'beta = {c} LoRA'} | beta = {k} | {per('w_reward')} | "
                             f"{_pm(e['w_reward']['mean'], e['w_reward']['se'])} | {per('w_drift')} | "
                             f"{_pm(e['w_drift']['mean'], e['w_drift']['se'])} | "
                             f"{_f(e.get('w_predicted'), '{:.2f}')} | "
                             f"{'' if wb is None else _pm(wb['mean'], wb['se'], '{:.3f}')} | "
                             f"{per('reward_gap', '{:+.3f}')} | "
                             f"{_pm(e['reward_gap']['mean'], e['reward_gap']['se'], '{:+.3f}')} | "
                             f"{'' if dm is None else _pm(dm['mean'], dm['se'], '{:+.3f}')} |")
        lines.append("")
    return "\n".join(lines)


def plot(path: Path, res: dict, kls: list[str], ws: list[float]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    markers = "sD^vPX*"
    own = {c: v for c, v in res.get("summary", {}).items() if c != "0"}  # the claim's own form, if swept
    fig, axes = plt.subplots(2, 2, figsize=(12, 9)) if own else plt.subplots(1, 3, figsize=(15, 4.4))
    axes = axes.ravel()
    for j, (s, r) in enumerate(res["seeds"].items()):
        pts = r["points"]
        for ax, key, label in ((axes[0], "partial", "partial reward (training reward)"),
                               (axes[1], "acc", "strict accuracy, image-level (%)")):
            xs = [pts[f"w{w:g}"]["drift"] for w in ws]
            ys = [pts[f"w{w:g}"][key] for w in ws]
            ax.plot(xs, ys, "o-", color=f"C{j}", ms=3, lw=1, label=f"RLG(w) of the kl 0 LoRA, seed {s}")
            if j == 0:
                for w, x, y in zip(ws, xs, ys):
                    ax.annotate(f"w={w:g}", (x, y), fontsize=7, xytext=(3, -9), textcoords="offset points")
            for i, k in enumerate(kls[1:]):
                q = pts[f"kl{k}"]
                ax.plot(q["drift"], q[key], markers[i % len(markers)], color=f"C{j}", mec="k", ms=7,
                        label=f"KL beta={k}" if j == 0 else None)
            ax.set_xlabel("drift from the base (mean |pixel difference|, 0-255)")
            ax.set_ylabel(label)
    axes[0].legend(fontsize=6)
    # matched w against beta on the kl 0 LoRA's curve: per seed, and the mean over seeds of the drift match (it
    # exists on every seed; the reward match does not where a KL model's reward is above the whole curve)
    ax = axes[2]
    summ = res.get("summary", {}).get("0", {})
    for j, (s, r) in enumerate(res["seeds"].items()):
        for key, mk, how in (("w_reward", "o", "reward"), ("w_drift", "x", "drift")):
            bw = [(float(k), r["match"]["0"][k][key]) for k in kls[1:] if r["match"]["0"][k][key] is not None]
            ax.plot([b for b, _ in bw], [w for _, w in bw], mk, color=f"C{j}", ms=5, alpha=0.7,
                    label=f"seed {s}, by {how}")
    bw = [(float(k), summ[k]["w_drift"]) for k in kls[1:] if k in summ and summ[k]["w_drift"]["mean"] is not None]
    if bw:
        ax.errorbar([b for b, _ in bw], [e["mean"] for _, e in bw], yerr=[e["se"] or 0.0 for _, e in bw], fmt="k^-",
                    ms=5, lw=1, capsize=3, label="mean ± s.e. over seeds, by drift")
        ref = dict(bw).get(0.4)
        if ref:  # what an optimum at some beta_0 (w = beta_0 / beta: w x beta constant) would give through 0.4
            b = [x for x, _ in bw]
            ax.plot(b, [ref["mean"] * 0.4 / x for x in b], ":", color="grey", label="w = beta_0 / beta (through 0.4)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(0.08, 1.6)
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("KL strength beta of the trained LoRA (log)")
    ax.set_ylabel("RLG weight w of the kl 0 LoRA that matches it")
    ax.legend(fontsize=6)
    if own:  # RLG(beta_c LoRA, w) against the LoRA trained at beta: measured w against the predicted beta_c / beta
        ax = axes[3]
        for c, ks in own.items():
            for k, e in ks.items():
                for key, mk, dx in (("w_reward", "o", -0.004), ("w_drift", "^", 0.004)):
                    if e[key]["mean"] is not None:
                        ax.errorbar(e["w_predicted"] + dx, e[key]["mean"], yerr=e[key]["se"] or 0.0, fmt=mk,
                                    color="C3" if key == "w_reward" else "k", capsize=3, ms=5)
                ax.annotate(f"beta={k} on the beta={c} LoRA", (e["w_predicted"], e["w_drift"]["mean"] or 0),
                            fontsize=7, xytext=(6, 0), textcoords="offset points")
        ax.plot([0, 1], [0, 1], ":", color="grey", label="measured = predicted (w = beta_c / beta)")
        ax.plot([], [], "o", color="C3", label="by reward, mean ± s.e. over seeds")
        ax.plot([], [], "^", color="k", label="by drift, mean ± s.e. over seeds")
        ax.set_xlim(0, 0.6)
        ax.set_ylim(0, 1.0)
        ax.set_xlabel("predicted RLG weight beta_c / beta")
        ax.set_ylabel("measured RLG weight on the beta_c LoRA's curve")
        ax.legend(fontsize=6)
    fig.suptitle("RL guidance of the unregularised LoRA vs training with a KL (mini-GenEval, paired x_T; "
                 f"training seeds {', '.join(res['seeds'])})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
