#!/usr/bin/env python
"""The look-again CPU demo (issue #37 item 4): GRPO with the crop tool vs without it, at equal CPU budget.

    python scripts/demo_tools.py --out runs/demo_tools                  # 3 seeds (~220 CPU s: ~4 min on a quiet core)
    python scripts/demo_tools.py --out /tmp/dt --smoke                  # wiring check (a minute or two)

Stages (all in this process, one torch thread; the GRPO runs are the project's trainer, ``GRPOTrainer``, with the
multi-turn tool rollouts of ``mmgrpo.vlm.tools``):

1. **base**: the shipped tiny Qwen2.5-VL that can call the tool (``--base``, built by
   ``scripts/build_look_again_base.py``: SFT on tool traces and plain answers) or ``--rebuild``;
2. **data**: the look-again benchmark (``mmgrpo.synthetic.look_again``) regenerated from the base's seed and sizes
   (train / val / heldout), with its with-tools and plain variants (``mmgrpo.vlm.synthetic.look_again``);
3. **probe**: the premise on the held-out split -- the first view is identical for all six answers (a pixel-level
   classifier of the views is at chance), a crop of the object's cell is not (``look_again.probe``);
4. **before**: the base, greedy, on the held-out split: with tools (multi-turn engine), plain prompt, no image;
5. **GRPO**: for each seed, ``tools`` (``tools.enabled=true``, the tools variant) and ``plain`` (no tools, the plain
   variant), each until ``--budget`` CPU seconds of training (``run.max_train_seconds``, ``run.budget_clock=cpu``);
6. **after**: each run's final weights evaluated like the base; the probe of the gain: accuracy on the samples
   where the tool was called vs not, the plain-prompt and no-image baselines;
7. **report**: ``<out>/metrics.json``, ``<out>/report.md``, ``<out>/trajectories.png`` (held-out samples: the view
   with the box the model asked for, the crop it got back, its answer).

Settings (``GRPO`` below, ``--budget``) were fixed before any held-out run and not tuned (docs/results.md, "Look-again
demo"); ``--eval-split val`` is there for choosing them, never the held-out split. ``--merge`` writes one report from
several output folders (e.g. one seed per process, run side by side on a loaded machine).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

BASE = REPO / "data" / "checkpoints" / "look_again_base"
# the trainer's settings of both conditions (``mmgrpo train`` key=value); the condition adds its data file and tools
GRPO = {
    "model.dtype": "float32", "model.lora.enabled": "false", "data.task": "mcq", "data.prompt_mode": "no_think",
    "reward.weights": "{mcq: 1.0}", "run.device": "cpu", "rollout.group_size": "8", "run.prompts_per_device": "8",
    "rollout.max_new_tokens": "48", "rollout.temperature": "1.0", "optim.lr": "1e-3", "run.max_steps": "100000",
    "run.budget_clock": "cpu", "run.save_every": "0", "run.tensorboard": "false", "run.resume_from": "none",
    "validation.every": "0",
    # a group whose rollouts all score the same gives no signal and its step is skipped; a base that already answers
    # every training prompt right skips every step. Never stop for that: both conditions spend the whole budget
    "run.max_consecutive_skips": "0",
}
# as mmgrpo.vlm.synthetic.look_again.tools_options (the evaluation's); the query of the tools variant offers the tool,
# so the rollout appends no instruction of its own
TOOLS = {"tools.enabled": "true", "tools.names": "[crop_source]", "tools.modules": "[mmgrpo.vlm.synthetic.look_again]",
         "tools.max_turns": "2", "tools.max_tool_calls": "1",
         "tools.max_total_tokens": "200", "tools.instruction": "none"}
CONDITIONS = ("tools", "plain")


def log(msg: str) -> None:
    print(f"[demo_tools {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def overrides(condition: str, data_dir: Path, base: Path, out_dir: Path, seed: int, budget: float,
              extra: dict | None = None) -> list[str]:
    """The trainer's ``key=value`` settings of one run."""
    kv = dict(GRPO, **(TOOLS if condition == "tools" else {"tools.enabled": "false"}))
    kv.update({"model.path": str(base), "data.train_file": str(data_dir / f"train_{condition}.jsonl"),
               "run.output_dir": str(out_dir), "run.seed": str(seed), "run.max_train_seconds": str(budget)})
    kv.update(extra or {})
    return [f"{k}={v}" for k, v in kv.items()]


def load_base(path: Path):
    import torch
    from transformers import AutoProcessor

    from mmgrpo.vlm.models.tiny import model_class

    proc = AutoProcessor.from_pretrained(path)
    model = model_class("qwen2_5_vl").from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    return model.eval(), proc


def layout_of(rep: dict):
    """The benchmark layout the base was built on (its report's ``layout``; the default for older reports)."""
    from mmgrpo.synthetic import look_again as bench

    return bench.Layout(**rep["layout"]) if "layout" in rep else bench.Layout()


def data_for(base: Path, out: Path, smoke: bool) -> tuple[Path, dict]:
    """The benchmark the base was built on, regenerated from its report (seed, sizes)."""
    from mmgrpo.synthetic import look_again as bench
    from mmgrpo.vlm.synthetic import look_again as la

    rep = json.loads((base / "base_report.json").read_text())
    a = rep["args"]
    sizes = (a["n_train"], a["n_val"], a["n_heldout"]) if not smoke else (8, 4, 4)
    d = out / "data"
    if not (d / "heldout_plain.jsonl").exists():
        bench.generate(str(d), *sizes, seed=a["seed"], layout=layout_of(rep))
        la.write_variants(str(d))
    return d, rep


def train_one(condition: str, data_dir: Path, base: Path, run_dir: Path, seed: int, budget: float,
              extra: dict | None = None):
    """One GRPO run in this process; returns (trainer, summary)."""
    from mmgrpo.utils.config import load_config
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    over = overrides(condition, data_dir, base, run_dir, seed, budget, extra)
    (run_dir).mkdir(parents=True, exist_ok=True)
    (run_dir / "command.txt").write_text("mmgrpo train " + " ".join(over) + "\n")
    from mmgrpo.engine.errors import NothingTrained

    tr = GRPOTrainer(load_config(TrainConfig, None, over))
    c0 = time.process_time()
    try:
        hist = tr.train()
    except NothingTrained as e:  # every step without reward signal (the smoke base): evaluated as it stands
        log(f"{condition}: {e}")
        hist = []
    cpu = time.process_time() - c0
    keys = ("reward/total/mean", "reward/tools/tool_calls/mean", "reward/tools/tool_failures/mean")
    curve = [{k: h.get(k) for k in ("step",) + keys if k in h} for h in hist]
    return tr, {"steps": tr.state.step, "cpu_seconds_train_call": cpu, "curve": curve}


def summary(ev: dict) -> dict:
    return {k: (round(v, 1) if isinstance(v, float) else v) for k, v in ev.items() if k != "trajectories"}


def draw_trajectories(path: Path, rows: list[dict], trajs: list[dict], title: str, n: int = 6) -> None:
    """For the first ``n`` held-out samples: the view with the requested box, the crop it returned, the answer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    from PIL import Image

    from mmgrpo.vlm.synthetic import look_again as la

    n = min(n, len(rows))
    fig, axes = plt.subplots(2, n, figsize=(2.2 * n, 4.8), squeeze=False)
    for j, (s, t) in enumerate(zip(rows[:n], trajs[:n])):
        view = Image.open(s["image"]).convert("RGB")
        ax = axes[0][j]
        ax.imshow(view, interpolation="nearest")
        cb = s["meta"]["cell_box_view"]
        ax.add_patch(Rectangle((cb[0] - .5, cb[1] - .5), cb[2] - cb[0], cb[3] - cb[1], fill=False, ec="white",
                               ls=":", lw=1))
        box, st = la.parse_tool_call(t["turn_texts"][0] if t["turn_texts"] else "")
        letter = la.parse_letter("\n".join(t["turn_texts"]))
        ok = letter == s["answer"]
        if st == "ok":
            ax.add_patch(Rectangle((box[0] - .5, box[1] - .5), box[2] - box[0], box[3] - box[1], fill=False,
                                   ec="yellow", lw=1.5))
        ax.set_title(f"{s['id']}\nbox {box if st == 'ok' else st}", fontsize=7)
        ax = axes[1][j]
        res = la.run_crop(s, box) if st == "ok" else None
        if res is not None and res.ok:
            ax.imshow(res.images[0], interpolation="nearest")
        else:
            ax.text(0.5, 0.5, "no crop", ha="center", va="center")
        gt = s["options"][la.bench.LETTERS.index(s["answer"])]
        ax.set_title(f"answer {letter} ({'right' if ok else 'wrong'})\ntruth {s['answer']} = {gt}", fontsize=7,
                     color="green" if ok else "red")
        for a in (axes[0][j], axes[1][j]):
            a.set_xticks([])
            a.set_yticks([])
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(out: Path, m: dict) -> None:
    lines = ["# Look-again demo: GRPO with the crop tool vs without (issue #37 item 4)", "",
             f"Command: `{m['command']}`  ", f"Machine load (uptime) at start / end: {m['load_start']} / "
             f"{m['load_end']}; wall {m['wall_s']:.0f} s.", "",
             "## Premise probe (held-out split)", "",
             "| view identical for all answers | pixel classifier on views | on cell crops | crop oracle | chance |",
             "|---|---|---|---|---|"]
    p = m["probe"]
    lines.append(f"| {p['view_answer_free']:.0f} % | {p['view_centroid_acc']:.1f} | {p['crop_centroid_acc']:.1f} | "
                 f"{p['crop_oracle_acc']:.1f} | {p['chance']:.1f} |")
    b = m["before"]
    lines += ["", "## Held-out accuracy (%, greedy)", "",
              f"Base: with tools {b['tools']:.1f} (tool called on {b['call_rate']:.0f} %, box on the object "
              f"{b['cell_hit_rate']:.0f} %), plain prompt {b['plain']:.1f}, no image {b['no_image']:.1f}.", "",
              "| seed | GRPO steps tools / plain (CPU s each) | with tools | without tools | gap | tool called | box on "
              "object | acc. called / not called | tools model: plain prompt / no image |",
              "|---|---|---|---|---|---|---|---|---|"]
    for seed, r in m["runs"].items():
        t, pl = r["tools"]["after"], r["plain"]["after"]
        lines.append(
            f"| {seed} | {r['tools']['train']['steps']} / {r['plain']['train']['steps']} ({m['budget']:.0f}) | "
            f"{t['tools']:.1f} | {pl['plain']:.1f} | {t['tools'] - pl['plain']:+.1f} | {t['call_rate']:.0f} % | "
            f"{t['cell_hit_rate']:.0f} % | {t['acc_called']:.1f} / {t['acc_not_called']:.1f} | "
            f"{t['plain']:.1f} / {t['no_image']:.1f} |")
    if len(m["runs"]) > 1:
        mean = lambda f: sum(f(r) for r in m["runs"].values()) / len(m["runs"])  # noqa: E731
        lines.append(f"| mean | | {mean(lambda r: r['tools']['after']['tools']):.1f} | "
                     f"{mean(lambda r: r['plain']['after']['plain']):.1f} | "
                     f"{mean(lambda r: r['tools']['after']['tools'] - r['plain']['after']['plain']):+.1f} | | | | |")
    lines += ["", f"Target (with tools >= without + 10 on every seed): **{'met' if m['target_met'] else 'missed'}**.",
              "", "## Trajectories (first held-out samples, not picked)", "",
              "Top: the 112 x 112 view, the object's cell dotted, the box the model asked for in yellow. Bottom: the "
              "crop the tool returned (112 x 112 of the 448 x 448 source) and the answer.", ""]
    for seed in m["runs"]:
        lines.append(f"![seed {seed}](trajectories_seed{seed}.png)")
    (out / "report.md").write_text("\n".join(lines) + "\n")


def merge(out: Path, parts: list[str]) -> dict:
    """One report from runs of the same base and split in several processes (e.g. one seed each, run side by side
    on a loaded machine): the runs' union, the first part's probe and base evaluation (identical in every part)."""
    import shutil

    ms = [json.loads((Path(d) / "metrics.json").read_text()) for d in parts]
    for k in ("eval_split", "budget", "extra", "probe", "before"):
        if any(x[k] != ms[0][k] for x in ms[1:]):
            raise SystemExit(f"[demo_tools] --merge: the parts differ in {k!r}; merge runs of one setting only")
    m = dict(ms[0], runs={s: r for x in ms for s, r in x["runs"].items()},
             command=" ; ".join(x["command"] for x in ms),
             load_start=[x["load_start"] for x in ms], load_end=[x["load_end"] for x in ms],
             wall_s=max(x["wall_s"] for x in ms), cpu_s=sum(x["cpu_s"] for x in ms))
    m["target_met"] = all(r["tools"]["after"]["tools"] >= r["plain"]["after"]["plain"] + 10 for r in m["runs"].values())
    out.mkdir(parents=True, exist_ok=True)
    for d in parts:
        for png in Path(d).glob("trajectories_seed*.png"):
            shutil.copyfile(png, out / png.name)
    (out / "metrics.json").write_text(json.dumps(m, indent=1))
    write_report(out, m)
    return m


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--base", default=str(BASE), help="base checkpoint (scripts/build_look_again_base.py)")
    p.add_argument("--rebuild", action="store_true", help="build the base into <out>/base first")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--budget", type=float, default=20.0, help="CPU seconds of GRPO per run (both conditions)")
    p.add_argument("--eval-split", default="heldout", choices=["heldout", "val"],
                   help="val: for choosing settings; the demo's numbers are on heldout")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra trainer settings (both runs)")
    p.add_argument("--smoke", action="store_true", help="tiny data, 2 steps per run, one seed: wiring only")
    p.add_argument("--merge", nargs="+", default=[], metavar="DIR",
                   help="only write one report into --out from these finished demo folders (e.g. one per seed)")
    a = p.parse_args(argv)
    if a.merge:
        m = merge(Path(a.out), a.merge)
        log(f"merged {len(m['runs'])} seeds; target {'met' if m['target_met'] else 'missed'}; {a.out}/report.md")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1") or 1))
    from mmgrpo.synthetic import look_again as bench
    from mmgrpo.vlm.synthetic import look_again as la

    t0 = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    base = Path(a.base)
    if a.rebuild:
        import subprocess

        base = out / "base"
        cmd = [sys.executable, "scripts/build_look_again_base.py", "--out", str(base)] + (["--smoke"] if a.smoke else [])
        log(" ".join(cmd))
        subprocess.run(cmd, cwd=REPO, check=True)
    if not (base / "base_report.json").exists():
        raise SystemExit(f"[demo_tools] no base at {base} (base_report.json missing): build one with "
                         "scripts/build_look_again_base.py --out DIR and pass --base DIR, or run with --rebuild")
    extra = dict(kv.split("=", 1) for kv in a.set)
    if a.smoke:
        a.seeds = a.seeds[:1]
        extra.setdefault("run.max_steps", "2")
        extra.setdefault("rollout.group_size", "2")
        extra.setdefault("run.prompts_per_device", "2")
    data_dir, rep = data_for(base, out, a.smoke)
    rows = la.load_split(str(data_dir / f"{a.eval_split}.jsonl"))
    log(f"data {data_dir}: {len(rows)} {a.eval_split} samples")
    probe = bench.probe(rep["args"]["seed"], n_train=24 if a.smoke else 300, n_test=len(rows),
                        test_split=a.eval_split, layout=layout_of(rep))
    log(f"probe {probe}")
    model, proc = load_base(base)
    before = la.evaluate(model, proc, rows)
    log(f"base: {summary(before)}")
    runs: dict = {}
    for seed in a.seeds:
        runs[seed] = {}
        for cond in CONDITIONS:
            tr, info = train_one(cond, data_dir, base, out / f"seed{seed}" / cond, seed, a.budget, extra)
            ev = la.evaluate(tr.policy.model.eval(), proc, rows)
            runs[seed][cond] = {"train": info, "after": summary(ev)}
            (out / f"seed{seed}" / cond / "trajectories.json").write_text(json.dumps(ev["trajectories"], indent=1))
            log(f"seed {seed} {cond}: {info['steps']} steps; {summary(ev)}")
            if cond == "tools":
                draw_trajectories(out / f"trajectories_seed{seed}.png", rows, ev["trajectories"],
                                  f"seed {seed}, after GRPO with tools")
            del tr
    met = all(r["tools"]["after"]["tools"] >= r["plain"]["after"]["plain"] + 10 for r in runs.values())
    m = {"command": " ".join(["python", "scripts/demo_tools.py"] + (argv if argv is not None else sys.argv[1:])),
         "eval_split": a.eval_split, "budget": a.budget, "grpo": GRPO, "tools": TOOLS, "extra": extra,
         "probe": probe, "before": summary(before), "runs": runs, "target_met": met,
         "load_start": [round(x, 2) for x in load_start], "load_end": [round(x, 2) for x in os.getloadavg()],
         "wall_s": time.time() - t0, "cpu_s": time.process_time()}
    (out / "metrics.json").write_text(json.dumps(m, indent=1))
    write_report(out, m)
    log(f"done in {m['wall_s']:.0f} s wall, {m['cpu_s']:.0f} CPU s; target {'met' if met else 'missed'}; "
        f"{out / 'report.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
