#!/usr/bin/env python
"""The VLM front-end trains the judge, the flow front-end uses it (issue #40 item 4), on CPU.

    python scripts/judge_loop.py --out runs/judge_loop --stage judge          # data, base (SFT), GRPO, accuracies
    python scripts/judge_loop.py --out runs/judge_loop --stage flow --seeds 0,1,2 --budget 30
    python scripts/judge_loop.py --out runs/judge_loop --stage report
    python scripts/judge_loop.py --out /tmp/jl --smoke                         # wiring only, tiny sizes

1. **Data** (:mod:`mmgrpo.synthetic.judge_pairs`): pairs of 32 px Mini-GenEval images (tags single_object, colors,
   counting), one drawn by the renderer for the caption, one for a perturbed caption; the answer ("1" / "2") is
   the renderer's. ``train`` pairs use the benchmark's train captions, ``heldout`` pairs its held-out captions.
2. **Base judge**: a randomly initialised tiny Qwen2.5-VL (its own BPE tokenizer on the judge chats), SFT for
   ``--sft-steps`` steps on ``--sft-pairs`` train pairs, the verdict in UnifiedReward-Think's answer format
   (``<answer>Image k is better</answer>``). ``--sft-labels random`` teaches the format only (labels drawn at
   random: a judge at chance that writes the format).
3. **GRPO** (``mmgrpo.vlm.train.trainer.GRPOTrainer``, the trainer of ``mmgrpo train``) on the train pairs with
   the verifiable reward :class:`flow_grpo.rewards.trained_judge.PairVerdictReward`, ``--judge-budget`` CPU
   seconds.
4. **Accuracy** of both judges on the held-out pairs (greedy, through the flow reward's own scorer
   :class:`~flow_grpo.rewards.trained_judge.TrainedPairJudge`), in both orders of each pair.
5. **Flow GRPO** (tiny SD3 base, the hacking demo's settings) with three rewards at equal CPU budget: the
   Mini-GenEval verifier (partial score), the untrained judge (the SFT base) and the trained judge (both as
   Pref-GRPO win rates over the group, judged in both orders); the held-out verifier score of each.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scripts.hacking_demo import BASE, PY, claim, eval_cmd, eval_means, prompts, read, run  # noqa: E402

JUDGE_REWARD = "flow_grpo.rewards.trained_judge:PairVerdictReward"
SCORER = "flow_grpo.rewards.trained_judge:TrainedPairJudge"
#: flow arm -> (label, the judge folder under --out or None for the verifier)
ARMS = {"verifier": ("Mini-GenEval verifier (partial)", None),
        "judge_untrained": ("untrained judge (SFT base), win rate", "judge_base"),
        "judge_trained": ("GRPO-trained judge, win rate", "judge_grpo")}


def log(msg: str) -> None:
    print(f"[judge_loop {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/judge_loop"))
    p.add_argument("--stage", choices=["all", "judge", "flow", "report"], default="all")
    p.add_argument("--seed", type=int, default=0, help="data and judge seed")
    p.add_argument("--n-train", type=int, default=1500)
    p.add_argument("--n-heldout", type=int, default=300)
    p.add_argument("--sft-pairs", type=int, default=200, help="train pairs the SFT sees")
    p.add_argument("--sft-steps", type=int, default=60)
    p.add_argument("--sft-labels", choices=["true", "random"], default="true")
    p.add_argument("--sft-lr", type=float, default=2e-3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vision-hidden", type=int, default=64)
    p.add_argument("--judge-budget", type=float, default=300.0, help="GRPO CPU seconds of the judge")
    p.add_argument("--judge-lr", type=float, default=1e-3)
    p.add_argument("--judge-group", type=int, default=8)
    p.add_argument("--judge-prompts", type=int, default=8, help="pairs per GRPO step")
    p.add_argument("--seeds", default="0,1,2", help="flow seeds")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--budget", type=float, default=30.0, help="flow: process CPU seconds of training per run")
    p.add_argument("--lr", type=float, default=3e-3, help="flow lr")
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--eval-images", type=int, default=4)
    p.add_argument("--set", nargs="*", default=[], help="extra flow trainer overrides")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="tiny sizes: wiring only")
    a = p.parse_args(argv)
    if a.smoke:
        a.n_train, a.n_heldout, a.sft_pairs, a.sft_steps, a.judge_budget = 16, 8, 8, 2, 3.0
        a.hidden, a.vision_hidden, a.judge_group, a.judge_prompts = 32, 32, 2, 2
    return a


# ------------------------------------------------------------------------------------------------------------
# judge
# ------------------------------------------------------------------------------------------------------------
def task_adapter(proc):
    from mmgrpo.vlm.config import DataConfig
    from mmgrpo.vlm.data.task import TaskAdapter
    from mmgrpo.vlm.models.adapters import get_adapter

    return TaskAdapter(proc, get_adapter("qwen2_5_vl"), DataConfig(task="mcq", prompt_mode="no_think"))


def load_rows(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def build_base(a, data: Path, dst: Path) -> dict:
    """Tokenizer + processor + random tiny Qwen2.5-VL, SFT on the verdict format; saved to ``dst``."""
    import torch

    from mmgrpo.synthetic.judge_pairs import answer_text
    from mmgrpo.vlm import sft
    from mmgrpo.vlm.data.schema import Sample
    from mmgrpo.vlm.models.tiny import build_tiny_tokenizer
    from scripts.build_tiny_vlm import build_model, build_processor, build_tokenizer, count_params

    torch.manual_seed(a.seed)
    train = load_rows(data / "train.jsonl")
    tmp = build_tiny_tokenizer()
    ta0 = None
    corpus = []
    for r in train[:400]:
        msgs = task_adapter_messages(r)
        corpus.append(tmp.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
                      + answer_text(int(r["answer"])))
    tok = build_tokenizer(corpus)
    proc = build_processor(tok, 112 * 112, 2 * 112 * 112)
    model = build_model(tok, seed=a.seed, hidden=a.hidden, layers=a.layers, heads=4, kv_heads=2,
                        intermediate=3 * a.hidden, vision_hidden=a.vision_hidden, vision_depth=2)
    model.generation_config.max_new_tokens = 24
    ta0 = task_adapter(proc)
    rng = random.Random(a.seed)
    exs = []
    for r in train[:a.sft_pairs]:
        pp = ta0.prepare(Sample.from_dict(r))
        w = int(r["answer"]) if a.sft_labels == "true" else rng.choice([1, 2])
        t = answer_text(w)
        ids = tok(t, add_special_tokens=False)["input_ids"] + [int(tok.convert_tokens_to_ids("<|im_end|>"))]
        exs.append(sft.SFTExample(sample=r, prompt=pp.item, answer_ids=torch.tensor(ids), prompt_text=pp.text,
                                  answer_text=t))
    log(f"base: params {count_params(model)}, vocab {len(tok)}, prompt {exs[0].prompt['input_ids'].shape[-1]} "
        f"tokens, answer {len(exs[0].answer_ids)} tokens: {exs[0].answer_text!r}")
    cfg = sft.SFTConfig(steps=a.sft_steps, batch_size=16, lr=a.sft_lr, warmup_steps=min(10, a.sft_steps),
                        seed=a.seed, log_every=10)
    c0 = time.process_time()
    res = sft.train_sft(model, exs, cfg, tok.pad_token_id,
                        log=lambda h: log(f"sft step {h['step']} loss {h['loss']:.3f}"))
    cpu = time.process_time() - c0
    dst.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dst)
    proc.save_pretrained(dst)
    rep = {"params": count_params(model), "vocab": len(tok), "sft_cpu_s": cpu, "sft_steps": res["steps_done"],
           "sft_labels": a.sft_labels, "sft_pairs": a.sft_pairs,
           "loss_curve": [(h["step"], round(h["loss"], 4)) for h in res["history"]]}
    (dst / "build_report.json").write_text(json.dumps(rep, indent=1))
    return rep


def task_adapter_messages(row: dict) -> list[dict]:
    from mmgrpo.vlm.data.prompts import build_messages

    return build_messages(row, mode="no_think")


def judge_accuracy(path: Path, rows: list[dict], batch_size: int = 64) -> dict:
    """Greedy verdicts of the judge at ``path`` on ``rows`` through :class:`TrainedPairJudge` (the flow reward's
    scorer): each pair in its file order and swapped. Accuracy counts a failed verdict as wrong."""
    import numpy as np
    from PIL import Image

    from flow_grpo.rewards.trained_judge import TrainedPairJudge
    from mmgrpo.synthetic.judge_pairs import GAP

    judge = TrainedPairJudge(str(path), batch_size=batch_size)
    a, b, caps, want = [], [], [], []
    for r in rows:
        im = np.asarray(Image.open(r["image"]).convert("RGB"))
        w = (im.shape[1] - GAP) // 2
        first, second = im[:, :w], im[:, w + GAP:]
        a += [first, second]
        b += [second, first]
        caps += [r["meta"]["caption"]] * 2
        win = int(r["answer"])
        want += [1.0 if win == 1 else 0.0, 0.0 if win == 1 else 1.0]  # P(a > b) that is right
    c0 = time.process_time()
    out = judge(np.stack(a), np.stack(b), caps)
    pref, failed, want = np.asarray(out["pref"]), np.asarray(out["failed"]), np.asarray(want)
    ok = (pref == want) & ~failed
    by_err: dict[str, list] = {}
    for k, r in enumerate(rows):
        by_err.setdefault(r["meta"]["error"], []).extend([ok[2 * k], ok[2 * k + 1]])
    both = ok[0::2] & ok[1::2]
    return {"n_pairs": len(rows), "accuracy": float(ok.mean()), "both_orders_right": float(both.mean()),
            "failed": float(failed.mean()), "picks_image_1": float(np.mean(pref[~failed] == 1.0)) if (~failed).any()
            else None, "by_error": {k: float(np.mean(v)) for k, v in sorted(by_err.items())},
            "cpu_s": time.process_time() - c0, "example": judge.last_texts[:2]}


def grpo_judge(a, data: Path, base: Path, dst: Path) -> dict:
    from mmgrpo.engine.errors import NothingTrained, TrainingStopped
    from mmgrpo.utils.config import load_config
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    kv = {"model.path": str(base), "model.dtype": "float32", "model.lora.enabled": "false", "data.task": "mcq",
          "data.prompt_mode": "no_think", "data.train_file": str(data / "train.jsonl"),
          "reward.weights": "{" + JUDGE_REWARD + ": 1.0}", "run.device": "cpu",
          "rollout.group_size": str(a.judge_group), "run.prompts_per_device": str(a.judge_prompts),
          "rollout.max_new_tokens": "24", "rollout.temperature": "1.0", "optim.lr": str(a.judge_lr),
          "run.max_steps": "100000", "run.budget_clock": "cpu", "run.max_train_seconds": str(a.judge_budget),
          "run.save_every": "0", "run.tensorboard": "false", "run.resume_from": "none", "validation.every": "0",
          "data.check_samples": "0",  # its ground-truth check writes the project's "<answer>1</answer>", not a verdict
          "run.output_dir": str(dst / "run"), "run.seed": str(a.seed)}
    over = [f"{k}={v}" for k, v in kv.items()]
    (dst).mkdir(parents=True, exist_ok=True)
    (dst / "command.txt").write_text("mmgrpo train " + " ".join(over) + "\n")
    tr = GRPOTrainer(load_config(TrainConfig, None, over))
    c0 = time.process_time()
    try:
        hist = tr.train()
    except (NothingTrained, TrainingStopped) as e:  # no reward signal at all (the smoke base): saved as it stands
        log(f"grpo: {type(e).__name__}: {e}")
        hist = list(getattr(tr, "history", []) or [])
    cpu = time.process_time() - c0
    tr.policy.model.save_pretrained(dst)
    tr.policy.processor.save_pretrained(dst)
    keys = ("reward/total/mean", f"reward/{JUDGE_REWARD}/failed/mean", f"reward/{JUDGE_REWARD}/picks_1/mean")
    curve = [{k: h.get(k) for k in ("step",) + keys if k in h} for h in hist]
    rep = {"steps": tr.state.step, "cpu_s_train_call": cpu, "curve": curve, "command": "mmgrpo train " + " ".join(over)}
    (dst / "grpo_report.json").write_text(json.dumps(rep, indent=1))
    return rep


def stage_judge(a) -> dict:
    from mmgrpo.synthetic.judge_pairs import write_split

    import torch

    torch.set_num_threads(a.threads)
    out = a.out
    data = out / "data"
    if not (data / "heldout.jsonl").exists():
        write_split(str(data), "train", a.n_train, seed=a.seed)
        write_split(str(data), "heldout", a.n_heldout, seed=a.seed)
    res_path = out / "judge.json"
    res = json.loads(res_path.read_text()) if res_path.exists() else {}
    held = load_rows(data / "heldout.jsonl")
    if "base" not in res:
        res["base"] = {"build": build_base(a, data, out / "judge_base")}
        res["base"]["heldout"] = judge_accuracy(out / "judge_base", held)
        log(f"base judge held-out: {res['base']['heldout']}")
        res_path.write_text(json.dumps(res, indent=1))
    if "grpo" not in res:
        res["grpo"] = {"train": grpo_judge(a, data, out / "judge_base", out / "judge_grpo")}
        res["grpo"]["heldout"] = judge_accuracy(out / "judge_grpo", held)
        log(f"GRPO judge held-out: {res['grpo']['heldout']}")
        res_path.write_text(json.dumps(res, indent=1))
    return res


# ------------------------------------------------------------------------------------------------------------
# flow
# ------------------------------------------------------------------------------------------------------------
def flow_cmd(arm: str, seed: int, train: Path, heldout: Path, d: Path, a) -> list[str]:
    judge = ARMS[arm][1]
    if judge is None:
        reward = ["reward.weights={mini_geneval: 1.0}", "reward.kwargs={mini_geneval: {mode: partial}}"]
    else:
        reward = ["reward.mode=win_rate", f"reward.pairwise_scorer={SCORER}", "reward.pairwise_symmetric=true",
                  "reward.weights={mini_geneval: 0.0}",
                  "reward.kwargs={mini_geneval: {mode: partial}, win_rate: {path: " + str(a.out / judge) + "}}"]
    return [PY, "-m", "flow_grpo.cli", "train", f"model.pipeline_dir={BASE}", f"data.train_path={train}",
            f"data.eval_path={heldout}", "method=fast", "run.device=cpu", "sample.num_steps=10",
            "sample.height=32", "sample.width=32", "sample.cfg=false", "sample.guidance_scale=1.0",
            "model.max_sequence_length=1", "run.save_every=0", "ema.enabled=false", "run.image_grid_every=0",
            "optim.adv_scale=group", "optim.adv_std_ddof=1", f"data.groups_per_epoch={a.groups}",
            f"data.group_size={a.group_size}", f"optim.lr={a.lr}", f"run.eval_every={a.eval_every}",
            "sample.eval_num_steps=10", f"run.max_train_seconds={a.budget}", "run.budget_clock=cpu",
            "run.num_epochs=100000", f"run.output_dir={d}", f"run.seed={seed}", "run.progress_bar=false",
            "data.eval_num_prompts=0", *reward, *a.set]


def stage_flow(a) -> None:
    flow = a.out / "flow"
    train, heldout = prompts(flow)
    if not (flow / "base_eval" / "images.jsonl").exists():
        run(eval_cmd(heldout, flow / "base_eval", a), flow / "logs" / "base_eval.log")
    for seed in [int(s) for s in a.seeds.split(",")]:
        for arm in [x for x in a.arms.split(",") if x]:
            d = flow / arm / f"seed{seed}"
            if (d / "final_eval" / "images.jsonl").exists() or not claim(d):
                continue
            run(flow_cmd(arm, seed, train, heldout, d, a), flow / "logs" / f"{arm}_s{seed}.log")
            run(eval_cmd(heldout, d / "final_eval", a, d / "lora_final"), flow / "logs" / f"{arm}_s{seed}_eval.log")


def report(a) -> str:
    import numpy as np

    def ms(v, scale=1.0, fmt=".3f"):
        v = [scale * x for x in v if x is not None]
        return f"{np.mean(v):{fmt}} ± {np.std(v):{fmt}}" if len(v) > 1 else (f"{v[0]:{fmt}}" if v else "–")

    lines = []
    res = json.loads((a.out / "judge.json").read_text()) if (a.out / "judge.json").exists() else {}
    if res:
        lines += ["| judge | held-out pairwise acc. % (both orders) | both orders right % | failed % | "
                  "picks Image 1 % | by error kind (acc. %) |", "|---|---|---|---|---|---|"]
        for k, lab in (("base", "SFT base (untrained)"), ("grpo", "GRPO-trained")):
            if k in res and "heldout" in res[k]:
                h = res[k]["heldout"]
                by = ", ".join(f"{e} {100 * v:.0f}" for e, v in h["by_error"].items())
                p1 = "–" if h["picks_image_1"] is None else f"{100 * h['picks_image_1']:.1f}"
                lines.append(f"| {lab} | {100 * h['accuracy']:.1f} | {100 * h['both_orders_right']:.1f} | "
                             f"{100 * h['failed']:.1f} | {p1} | {by} |")
        lines.append("")
    flow = a.out / "flow"
    base = eval_means(flow / "base_eval") if (flow / "base_eval" / "images.jsonl").exists() else None
    rows = ["| reward | verifier partial | strict acc. % | partial vs base (paired) | epochs | train CPU-s |",
            "|---|---|---|---|---|---|"]
    if base:
        rows.append(f"| base (before training) | {base['mini_geneval/partial']:.3f} | "
                    f"{100 * base['mini_geneval/strict']:.1f} | – | 0 | 0 |")
    for arm, (lab, _) in ARMS.items():
        cols = {k: [] for k in ("v", "s", "dv", "ep", "cpu")}
        for seed in [int(s) for s in a.seeds.split(",")]:
            d = flow / arm / f"seed{seed}"
            if not (d / "final_eval" / "images.jsonl").exists():
                continue
            h, e = read(d), eval_means(d / "final_eval")
            cols["v"].append(e["mini_geneval/partial"])
            cols["s"].append(e["mini_geneval/strict"])
            cols["dv"].append(e["mini_geneval/partial"] - base["mini_geneval/partial"] if base else None)
            cols["ep"].append(len(h))
            cols["cpu"].append(h[-1].get("time/train_budget_s") if h else None)
        if cols["v"]:
            rows.append(f"| {lab} (n={len(cols['v'])}) | {ms(cols['v'])} | {ms(cols['s'], 100, '.1f')} | "
                        f"{ms(cols['dv'])} | {ms(cols['ep'], fmt='.0f')} | {ms(cols['cpu'], fmt='.0f')} |")
    text = "\n".join(lines + rows) + "\n"
    (a.out / "results.md").write_text(text)
    return text


def main(argv=None) -> int:
    a = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    a.out.mkdir(parents=True, exist_ok=True)
    if a.stage in ("all", "judge"):
        stage_judge(a)
    if a.stage in ("all", "flow"):
        stage_flow(a)
    print(report(a))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
