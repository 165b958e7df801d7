#!/usr/bin/env python
"""The VLM front-end trains the judge, the flow front-end uses it (issue #40 item 4), on CPU.

    python scripts/judge_loop.py --out runs/judge_loop --stage judge     # pairs, tower, judges, GRPO, accuracies
    python scripts/judge_loop.py --out runs/judge_loop --stage judge --ship data/checkpoints/pair_judge
    python scripts/judge_loop.py --out runs/judge_loop --stage flow      # 3 rewards x 3 seeds, 60 CPU-s each
    python scripts/judge_loop.py --out runs/judge_loop --stage report
    python scripts/judge_loop.py --out /tmp/jl --smoke                    # wiring only, tiny sizes

The defaults are the settings of ``docs/results.md`` ("Trained-judge loop").

1. **Data** (:mod:`mmgrpo.synthetic.judge_pairs`): pairs of 32 px Mini-GenEval images (tags single_object, colors,
   counting), one drawn by the renderer for the caption, one for a perturbed caption, shown to the judge as one
   composite (each image upscaled to 112 px, Image 2 under a grey veil); the answer ("1" / "2") is the renderer's.
   ``train`` pairs use the benchmark's train captions, ``heldout`` pairs its held-out captions.
2. **Tower**: a randomly initialised tiny Qwen2.5-VL (its own BPE tokenizer on the judge chats) whose vision tower
   is pre-trained to count the shapes and colours of each image (:mod:`mmgrpo.vlm.vision_pretrain`; the stand-in
   for a real VLM's pre-training); saved in ``judge_tower`` and reused by later invocations.
3. **Judges**: the *untrained* judge is ``--format-steps`` of SFT on the verdict format with random labels (a judge
   at chance that writes the format); the *SFT* judge is ``--sft-steps`` on labelled train pairs, the answer in
   UnifiedReward-Think's format, reasoning first (``--think``: what each image shows in the caption's words, each
   word checked against the caption, then ``<answer>Image k is better</answer>``).
4. **GRPO** (``mmgrpo.vlm.train.trainer.GRPOTrainer``, the trainer of ``mmgrpo train``) from the SFT judge on the
   train pairs with the verifiable reward :class:`flow_grpo.rewards.trained_judge.PairVerdictReward`,
   ``--judge-budget`` CPU seconds (``--grpo-from-format``: also from the untrained judge).
5. **Accuracy** of every judge on the held-out pairs (greedy, through the flow reward's own scorer
   :class:`~flow_grpo.rewards.trained_judge.TrainedPairJudge`), in both orders of each pair.
6. **Flow GRPO** (tiny SD3 base, Flow-GRPO-Fast) with three rewards at equal CPU budget: the Mini-GenEval verifier
   (partial score), the untrained judge and the trained judge (``--trained-judge``; both as Pref-GRPO win rates
   over the group, judged in both orders); the held-out verifier score of each, and how often the trained judge
   agrees with the verifier on each run's own held-out images.
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
        "judge_untrained": ("untrained judge (format only), win rate", "judge_untrained"),
        "judge_trained": ("trained judge, win rate", "judge_sft")}  # folder: --trained-judge


def log(msg: str) -> None:
    print(f"[judge_loop {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("runs/judge_loop"))
    p.add_argument("--stage", choices=["all", "judge", "flow", "report"], default="all")
    p.add_argument("--seed", type=int, default=0, help="data and judge seed")
    p.add_argument("--n-train", type=int, default=3000)
    p.add_argument("--n-heldout", type=int, default=300)
    p.add_argument("--vision-steps", type=int, default=1500, help="vision-tower pre-training steps (0 = none)")
    p.add_argument("--vision-lr", type=float, default=2e-3)
    p.add_argument("--sft-pairs", type=int, default=3000, help="train pairs the SFT sees")
    p.add_argument("--sft-steps", type=int, default=1500, help="SFT steps on labelled pairs")
    p.add_argument("--format-steps", type=int, default=40, help="SFT steps of the untrained judge (random labels)")
    p.add_argument("--sft-lr", type=float, default=3e-3)
    p.add_argument("--think", choices=["none", "describe", "describe_mark", "describe_check"],
                   default="describe_check",
                   help="describe: the labelled SFT answers first say what each image shows, in the caption's words "
                        "(<think>Image 1: ... Image 2: ...</think>), then the verdict; describe_mark: each "
                        "description followed by (match) or (no match); describe_check: every word marked + / - "
                        "(in the caption or not), then the mark (mmgrpo.synthetic.judge_pairs.think_text)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="the judge's generation cap")
    p.add_argument("--query-position", choices=["before", "after"], default="before",
                   help="the caption before the image (its visual tokens attend to it) or after")
    p.add_argument("--sft-freeze-vision", action="store_true", help="SFT leaves the pre-trained tower as it is")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vision-hidden", type=int, default=64)
    p.add_argument("--vision-depth", type=int, default=2)
    p.add_argument("--grpo-from-format", action="store_true", help="also GRPO the untrained judge (no SFT labels)")
    p.add_argument("--judge-budget", type=float, default=150.0, help="GRPO CPU seconds of the judge")
    p.add_argument("--judge-lr", type=float, default=1e-3)
    p.add_argument("--judge-group", type=int, default=8)
    p.add_argument("--judge-prompts", type=int, default=8, help="pairs per GRPO step")
    p.add_argument("--trained-judge", default="judge_sft",
                   help="the trained-judge flow arm's judge: a folder name under --out (judge_sft, judge_grpo) or a "
                        "path (the shipped data/checkpoints/pair_judge); judge_sft is the better one on held-out "
                        "pairs (GRPO at lr 1e-3 collapsed it to one position)")
    p.add_argument("--ship", type=Path, default=None,
                   help="after --stage judge: copy the SFT judge and its report there (data/checkpoints/pair_judge)")
    p.add_argument("--seeds", default="0,1,2", help="flow seeds")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--budget", type=float, default=60.0, help="flow: process CPU seconds of training per run")
    p.add_argument("--lr", type=float, default=1e-3, help="flow lr (3e-3, the hacking demo's, collapses the "
                   "verifier's own training reward after about 50 epochs)")
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
        a.vision_steps, a.format_steps = 2, 2
        a.hidden, a.vision_hidden, a.judge_group, a.judge_prompts = 32, 32, 2, 2
    return a


# ------------------------------------------------------------------------------------------------------------
# judge
# ------------------------------------------------------------------------------------------------------------
def task_adapter(proc, query_position: str):
    from mmgrpo.vlm.config import DataConfig
    from mmgrpo.vlm.data.task import TaskAdapter
    from mmgrpo.vlm.models.adapters import get_adapter

    return TaskAdapter(proc, get_adapter("qwen2_5_vl"), DataConfig(task="mcq", prompt_mode="no_think",
                                                                   query_position=query_position))


def save_judge(model, proc, dst: Path, a) -> None:
    """Model, processor and the chat convention (``judge_config.json``, read by ``TrainedPairJudge``)."""
    from flow_grpo.rewards.trained_judge import JUDGE_CONFIG

    dst.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dst)
    proc.save_pretrained(dst)
    (dst / JUDGE_CONFIG).write_text(json.dumps({"query_position": a.query_position,
                                                "max_new_tokens": a.max_new_tokens}) + "\n")


def load_rows(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()]


def build_tower(a, data: Path) -> tuple:
    """Tokenizer, processor and a random tiny Qwen2.5-VL whose vision tower is pre-trained (``--vision-steps``)
    to count the shapes and colours of each image of a pair (:mod:`mmgrpo.vlm.vision_pretrain`, targets
    :func:`mmgrpo.synthetic.judge_pairs.image_tags`): the stand-in for a real VLM's pre-training. Only the pair
    images are seen, never a caption or an answer. Returns (tokenizer, processor, model, report)."""
    import numpy as np
    import torch
    from PIL import Image

    from mmgrpo.synthetic import judge_pairs as jp
    from mmgrpo.vlm.models.tiny import build_tiny_tokenizer
    from mmgrpo.vlm.vision_pretrain import grid_columns, pretrain_region_counts
    from scripts.build_tiny_vlm import build_model, build_processor, build_tokenizer, count_params

    tower_dir = a.out / "judge_tower"
    if (tower_dir / "tower_report.json").exists():  # built before: the same tower for every stage after it
        from transformers import AutoProcessor

        from mmgrpo.vlm.models.tiny import model_class

        proc = AutoProcessor.from_pretrained(tower_dir)
        tower = model_class("qwen2_5_vl").from_pretrained(tower_dir, torch_dtype=torch.float32)
        model = build_model(proc.tokenizer, seed=a.seed, hidden=a.hidden, layers=a.layers, heads=4, kv_heads=2,
                            intermediate=3 * a.hidden, vision_hidden=a.vision_hidden, vision_depth=a.vision_depth)
        model.generation_config.max_new_tokens = a.max_new_tokens
        model.model.visual.load_state_dict(tower.model.visual.state_dict())  # the LM is new (--hidden/--layers)
        log(f"tower: loaded the vision tower of {tower_dir}")
        rep = json.loads((tower_dir / "tower_report.json").read_text())
        return proc.tokenizer, proc, model, dict(rep, params=count_params(model))
    torch.manual_seed(a.seed)
    train = load_rows(data / "train.jsonl")
    tmp = build_tiny_tokenizer()
    corpus = [tmp.apply_chat_template(task_adapter_messages(r, a.query_position), tokenize=False,
                                      add_generation_prompt=True)
              + jp.answer_text(int(r["answer"]), jp.think_text(r["meta"]["caption"], r["meta"]["tags"]))
              for r in train[:400]]
    tok = build_tokenizer(corpus)
    h, w = jp.COMPOSITE_HW
    proc = build_processor(tok, h * w, h * w)  # the composite passes unresized: 4 x 9 merged tokens
    model = build_model(tok, seed=a.seed, hidden=a.hidden, layers=a.layers, heads=4, kv_heads=2,
                        intermediate=3 * a.hidden, vision_hidden=a.vision_hidden, vision_depth=a.vision_depth)
    model.generation_config.max_new_tokens = a.max_new_tokens
    rep = {"params": count_params(model), "vocab": len(tok), "vision_steps": a.vision_steps}
    if a.vision_steps:
        def items(rows):
            out = []
            for r in rows:
                x = proc.image_processor(images=[Image.open(r["image"]).convert("RGB")], return_tensors="pt")
                out.append((dict(x), np.asarray(r["meta"]["tags"])))
            return out

        tr = items(train)
        grid = tr[0][0]["image_grid_thw"][0].tolist()
        merge = model.config.vision_config.spatial_merge_size
        cell_cols = jp.CELL // (14 * merge)
        regions = [grid_columns(grid, merge, range(cell_cols)),
                   grid_columns(grid, merge, range(cell_cols + 1, 2 * cell_cols + 1))]
        c0 = time.process_time()
        res = pretrain_region_counts(model, tr, regions, len(jp.TAG_HEADS), jp.TAG_LEVELS, steps=a.vision_steps,
                                     batch_size=16, lr=a.vision_lr, seed=a.seed,
                                     log=lambda h_: log(f"vision step {h_['step']} loss {h_['loss']:.3f} "
                                                        f"acc {h_['acc']:.3f}"))
        cpu = time.process_time() - c0
        held = items(load_rows(data / "heldout.jsonl"))
        pred = np.stack([res["predict"](x) for x, _ in held])  # (N, 2, heads)
        true = np.stack([t for _, t in held])
        probe = {"exact": float((pred == true).mean()),
                 "present_recall": float(((pred > 0) & (true > 0)).sum() / max(1, (true > 0).sum())),
                 "absent_false_pos": float(((pred > 0) & (true == 0)).sum() / max(1, (true == 0).sum())),
                 "by_head": {h_: float((pred[..., k] == true[..., k]).mean()) for k, h_ in enumerate(jp.TAG_HEADS)}}
        log(f"vision probe (held-out pairs): {probe}")
        rep.update(vision_cpu_s=cpu, vision_regions=regions, vision_heldout=probe,
                   vision_curve=[(x["step"], round(x["loss"], 4), round(x["acc"], 3)) for x in res["history"][::25]])
    tower_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tower_dir)
    proc.save_pretrained(tower_dir)
    (tower_dir / "tower_report.json").write_text(json.dumps(rep, indent=1))
    return tok, proc, model, rep


def sft_judge(a, data: Path, tok, proc, model, labels: str, dst: Path, tower_rep: dict) -> dict:
    """SFT of ``model`` (changed in place) on ``--sft-pairs`` train pairs, the verdict in UnifiedReward-Think's
    answer format; ``labels="random"`` draws the verdict at random (format only: a judge at chance that writes
    the format). Saved with the processor to ``dst``."""
    import torch

    from mmgrpo.synthetic.judge_pairs import answer_text, think_text
    from mmgrpo.vlm import sft
    from mmgrpo.vlm.data.schema import Sample

    train = load_rows(data / "train.jsonl")
    ta0 = task_adapter(proc, a.query_position)
    rng = random.Random(a.seed)
    exs = []
    for r in train[:a.sft_pairs]:
        pp = ta0.prepare(Sample.from_dict(r))
        w = int(r["answer"]) if labels == "true" else rng.choice([1, 2])
        think = think_text(r["meta"]["caption"], r["meta"]["tags"], a.think) \
            if a.think != "none" and labels == "true" else None
        t = answer_text(w, think)
        ids = tok(t, add_special_tokens=False)["input_ids"] + [int(tok.convert_tokens_to_ids("<|im_end|>"))]
        exs.append(sft.SFTExample(sample=r, prompt=pp.item, answer_ids=torch.tensor(ids), prompt_text=pp.text,
                                  answer_text=t))
    steps = a.sft_steps if labels == "true" else a.format_steps
    log(f"sft ({labels} labels): params {tower_rep['params']}, vocab {len(tok)}, prompt "
        f"{exs[0].prompt['input_ids'].shape[-1]} tokens, answer {len(exs[0].answer_ids)} tokens: "
        f"{exs[0].answer_text!r}, {steps} steps")
    cfg = sft.SFTConfig(steps=steps, batch_size=16, lr=a.sft_lr, warmup_steps=min(10, steps), seed=a.seed,
                        log_every=25, train_vision=not a.sft_freeze_vision)
    c0 = time.process_time()
    res = sft.train_sft(model, exs, cfg, tok.pad_token_id,
                        log=lambda h: log(f"sft step {h['step']} loss {h['loss']:.3f}"))
    cpu = time.process_time() - c0
    save_judge(model, proc, dst, a)
    rep = dict(tower_rep, sft_cpu_s=cpu, sft_steps=res["steps_done"], sft_labels=labels, sft_pairs=a.sft_pairs,
               loss_curve=[(h["step"], round(h["loss"], 4)) for h in res["history"][::10]])
    (dst / "build_report.json").write_text(json.dumps(rep, indent=1))
    return rep


def task_adapter_messages(row: dict, query_position: str) -> list[dict]:
    from mmgrpo.vlm.data.prompts import build_messages

    return build_messages(row, mode="no_think", query_position=query_position)


def judge_accuracy(path: Path, rows: list[dict], batch_size: int = 64) -> dict:
    """Greedy verdicts of the judge at ``path`` on ``rows`` through :class:`TrainedPairJudge` (the flow reward's
    scorer): each pair in its file order and swapped. Accuracy counts a failed verdict as wrong."""
    import numpy as np
    from PIL import Image

    from flow_grpo.rewards.trained_judge import TrainedPairJudge
    from mmgrpo.synthetic.judge_pairs import unstrip

    judge = TrainedPairJudge(str(path), batch_size=batch_size)
    a, b, caps, want = [], [], [], []
    for r in rows:
        first, second = unstrip(np.asarray(Image.open(r["meta"]["pair"]).convert("RGB")))
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
    # the reasoning: does the <think> block say what each image shows (judge_pairs.think_text, in this order)?
    from mmgrpo.synthetic.judge_pairs import think_text

    said = [t.split("</think>")[0].split("<think>")[-1].strip() if "<think>" in t else None for t in judge.last_texts]
    think_style = ("describe_check" if any(x and "+" in x for x in said) else
                   "describe_mark" if any(x and "match)" in x for x in said) else "describe")
    truth = []
    for r in rows:
        t1, t2 = r["meta"]["tags"]
        truth += [think_text(r["meta"]["caption"], [t1, t2], think_style),
                  think_text(r["meta"]["caption"], [t2, t1], think_style)]
    thinks = [x for x in said if x is not None]
    think_exact = float(np.mean([x == y for x, y in zip(said, truth)])) if thinks else None
    return {"n_pairs": len(rows), "accuracy": float(ok.mean()), "both_orders_right": float(both.mean()),
            "failed": float(failed.mean()), "picks_image_1": float(np.mean(pref[~failed] == 1.0)) if (~failed).any()
            else None, "by_error": {k: float(np.mean(v)) for k, v in sorted(by_err.items())},
            "think_written": len(thinks) / len(said), "think_exact": think_exact,
            "cpu_s": time.process_time() - c0, "example": judge.last_texts[:2]}


def grpo_judge(a, data: Path, base: Path, dst: Path) -> dict:
    from mmgrpo.engine.errors import NothingTrained, TrainingStopped
    from mmgrpo.utils.config import load_config
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    kv = {"model.path": str(base), "model.dtype": "float32", "model.lora.enabled": "false", "data.task": "mcq",
          "data.prompt_mode": "no_think", "data.query_position": a.query_position, "data.train_file": str(data / "train.jsonl"),
          "reward.weights": "{" + JUDGE_REWARD + ": 1.0}", "run.device": "cpu",
          "rollout.group_size": str(a.judge_group), "run.prompts_per_device": str(a.judge_prompts),
          "rollout.max_new_tokens": str(a.max_new_tokens), "rollout.temperature": "1.0", "optim.lr": str(a.judge_lr),
          "run.max_steps": "100000", "run.budget_clock": "cpu", "run.max_train_seconds": str(a.judge_budget),
          "run.save_every": "0", "run.tensorboard": "false",
          # a judge near the top leaves many steps unanimous (every sample right): skipped, not a failure
          "run.max_consecutive_skips": "1000", "run.resume_from": "none", "validation.every": "0",
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
    save_judge(tr.policy.model, tr.policy.processor, dst, a)
    keys = ("reward/total/mean", f"reward/{JUDGE_REWARD}/failed/mean", f"reward/{JUDGE_REWARD}/picks_1/mean")
    curve = [{k: h.get(k) for k in ("step",) + keys if k in h} for h in hist]
    rep = {"steps": tr.state.step, "cpu_s_train_call": cpu, "curve": curve, "command": "mmgrpo train " + " ".join(over)}
    (dst / "grpo_report.json").write_text(json.dumps(rep, indent=1))
    return rep


#: judge stages: result key -> (folder under --out, label)
JUDGES = {"untrained": ("judge_untrained", "untrained (tower pre-trained, format-only SFT)"),
          "sft": ("judge_sft", "SFT on labelled pairs"),
          "grpo": ("judge_grpo", "SFT + GRPO (trained judge)"),
          "grpo_format": ("judge_grpo_format", "format-only + GRPO (no labelled SFT)")}


def stage_judge(a) -> dict:
    import copy

    import torch

    from mmgrpo.synthetic.judge_pairs import write_split

    torch.set_num_threads(a.threads)
    out = a.out
    data = out / "data"
    if not (data / "heldout.jsonl").exists():
        write_split(str(data), "train", a.n_train, seed=a.seed)
        write_split(str(data), "heldout", a.n_heldout, seed=a.seed)
    res_path = out / "judge.json"
    res = json.loads(res_path.read_text()) if res_path.exists() else {}
    held = load_rows(data / "heldout.jsonl")

    def save(key, rep):
        res[key] = rep
        res[key]["heldout"] = judge_accuracy(out / JUDGES[key][0], held)
        log(f"{key} judge held-out: {res[key]['heldout']}")
        res_path.write_text(json.dumps(res, indent=1))

    if "untrained" not in res or "sft" not in res:
        tok, proc, model, tower = build_tower(a, data)
        if "untrained" not in res:
            save("untrained", {"build": sft_judge(a, data, tok, proc, copy.deepcopy(model), "random",
                                                  out / "judge_untrained", tower)})
        if "sft" not in res:
            save("sft", {"build": sft_judge(a, data, tok, proc, model, "true", out / "judge_sft", tower)})
    if "grpo" not in res and a.judge_budget > 0:
        save("grpo", {"train": grpo_judge(a, data, out / "judge_sft", out / "judge_grpo")})
    if "grpo_format" not in res and a.grpo_from_format:
        save("grpo_format", {"train": grpo_judge(a, data, out / "judge_untrained", out / "judge_grpo_format")})
    return res


# ------------------------------------------------------------------------------------------------------------
# flow
# ------------------------------------------------------------------------------------------------------------
def judge_dir(a, name: str | None) -> Path | None:
    """A judge folder: ``name`` under ``--out`` if it is there, else ``name`` as a path."""
    if name is None:
        return None
    return a.out / name if (a.out / name).exists() else Path(name)


def ship(a) -> None:
    """Copy the SFT judge (the trained judge of the flow rows) to ``--ship`` with ``judge_report.json``: the
    settings (``args``), the tower's and the SFT's build report and the held-out accuracy of every judge stage."""
    import shutil

    res = json.loads((a.out / "judge.json").read_text())
    dst = a.ship
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(a.out / "judge_sft", dst, ignore=shutil.ignore_patterns("build_report.json"))
    args = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items() if k not in ("ship", "out")}
    rep = {"args": args, "build": res["sft"]["build"],
           "heldout": {k: {x: v for x, v in r["heldout"].items() if x != "example"} for k, r in res.items()},
           "example": res["sft"]["heldout"]["example"],
           # the first held-out pairs as generated (a test regenerates them: the judge was built on today's data)
           "heldout_head": [{k: r[k] for k in ("id", "answer")} | {"caption": r["meta"]["caption"],
                                                                   "tags": r["meta"]["tags"]}
                            for r in sorted(load_rows(a.out / "data" / "heldout.jsonl"), key=lambda r: r["id"])[:8]]}
    (dst / "judge_report.json").write_text(json.dumps(rep, indent=1) + "\n")
    log(f"shipped the SFT judge to {dst}")


def flow_cmd(arm: str, seed: int, train: Path, heldout: Path, d: Path, a) -> list[str]:
    judge = judge_dir(a, a.trained_judge if arm == "judge_trained" else ARMS[arm][1])
    if judge is None:
        reward = ["reward.weights={mini_geneval: 1.0}", "reward.kwargs={mini_geneval: {mode: partial}}"]
    else:
        reward = ["reward.mode=win_rate", f"reward.pairwise_scorer={SCORER}", "reward.pairwise_symmetric=true",
                  "reward.weights={mini_geneval: 0.0}",
                  "reward.kwargs={mini_geneval: {mode: partial}, win_rate: {path: " + str(judge) + "}}"]
    return [PY, "-m", "flow_grpo.cli", "train", f"model.pipeline_dir={BASE}", f"data.train_path={train}",
            f"data.eval_path={heldout}", "method=fast", "run.device=cpu", "sample.num_steps=10",
            "sample.height=32", "sample.width=32", "sample.cfg=false", "sample.guidance_scale=1.0",
            "model.max_sequence_length=1", "run.save_every=0", "ema.enabled=false", "run.image_grid_every=0",
            "optim.adv_scale=group", "optim.adv_std_ddof=1", f"data.groups_per_epoch={a.groups}",
            f"data.group_size={a.group_size}", f"optim.lr={a.lr}", f"run.eval_every={a.eval_every}",
            "sample.eval_num_steps=10", f"run.max_train_seconds={a.budget}", "run.budget_clock=cpu",
            "run.num_epochs=100000", f"run.output_dir={d}", f"run.seed={seed}", "run.progress_bar=false",
            "data.eval_num_prompts=0", *reward, *a.set]




def run_flow(cmd: list[str], log_path: Path, d: Path) -> bool:
    """Run a flow training command; True if it trained. A run whose reward never gave a signal (every group
    tied: a judge that names one position in both orders) ends with ``exit_codes.NOTHING_TRAINED``; it is recorded in
    ``d/nothing_trained.txt`` and its policy is the base."""
    import subprocess

    from mmgrpo.utils import exit_codes

    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(log_path, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
                             env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    log(f"{log_path.stem}: rc={rc} ({time.time() - t0:.0f} s wall)")
    text = log_path.read_text(errors="replace")
    if rc == exit_codes.NOTHING_TRAINED and "nothing was trained" in text:
        (d / "nothing_trained.txt").write_text(text.splitlines()[-1] + "\n")
        return False
    if rc != 0:
        raise SystemExit(f"failed: {' '.join(cmd)} (see {log_path})")
    return True


def stage_flow(a) -> None:
    import shutil

    flow = a.out / "flow"
    train, heldout = prompts(flow)
    if not (flow / "base_eval" / "images.jsonl").exists():
        run(eval_cmd(heldout, flow / "base_eval", a), flow / "logs" / "base_eval.log")
    for seed in [int(s) for s in a.seeds.split(",")]:
        for arm in [x for x in a.arms.split(",") if x]:
            d = flow / arm / f"seed{seed}"
            if (d / "final_eval" / "images.jsonl").exists() or not claim(d):
                continue
            if run_flow(flow_cmd(arm, seed, train, heldout, d, a), flow / "logs" / f"{arm}_s{seed}.log", d):
                run(eval_cmd(heldout, d / "final_eval", a, d / "lora_final"),
                    flow / "logs" / f"{arm}_s{seed}_eval.log")
            else:  # the policy is the base: its held-out images are the base's (same prompts, same noise)
                shutil.copytree(flow / "base_eval", d / "final_eval")


def judge_agreement(judge: Path, eval_dir: Path, batch_size: int = 64) -> dict:
    """How often the judge at ``judge`` agrees with the verifier on a flow policy's own held-out images
    (``eval_dir/images.jsonl`` of ``eval/generate_t2i.py``): every pair of images of one prompt whose verifier
    partial scores differ, judged in both orders; the judge's symmetric preference ``(p(a>b) + 1 - p(b>a)) / 2``
    agrees if it is on the verifier's side of 0.5, ties (0.5: both orders name one position, or failures) are
    counted apart."""
    import itertools

    import numpy as np
    from PIL import Image

    from flow_grpo.rewards.trained_judge import TrainedPairJudge

    rows = [json.loads(l) for l in (eval_dir / "images.jsonl").read_text().splitlines() if l.strip()]
    by_prompt: dict[str, list[dict]] = {}
    for r in rows:
        by_prompt.setdefault(r["prompt"], []).append(r)
    a_img, b_img, caps, sign = [], [], [], []
    for prompt, rs in by_prompt.items():
        for x, y in itertools.combinations(rs, 2):
            dv = float(x["rewards"]["mini_geneval/partial"]) - float(y["rewards"]["mini_geneval/partial"])
            if abs(dv) < 1e-9:
                continue
            ix, iy = (np.asarray(Image.open(eval_dir / z["image"]).convert("RGB")) for z in (x, y))
            a_img += [ix, iy]
            b_img += [iy, ix]
            caps += [prompt, prompt]
            sign.append(1.0 if dv > 0 else -1.0)
    if not sign:
        return {"pairs": 0}
    out = TrainedPairJudge(str(judge), batch_size=batch_size)(np.stack(a_img), np.stack(b_img), caps)
    pref = np.asarray(out["pref"], dtype=float)
    sym = (pref[0::2] + 1.0 - pref[1::2]) / 2.0
    sign = np.asarray(sign)
    tie = np.isclose(sym, 0.5)
    agree = ((sym - 0.5) * sign > 0)
    return {"pairs": int(len(sign)), "agree": float(agree.mean()), "tie": float(tie.mean()),
            "disagree": float(1.0 - agree.mean() - tie.mean()),
            "agree_of_decided": float(agree.sum() / max(1, (~tie).sum()))}


def two_se(x: list[float], y: list[float]) -> str:
    """``mean(x) - mean(y)`` against two standard errors of the difference (unpaired, ddof 1)."""
    import numpy as np

    if len(x) < 2 or len(y) < 2:
        return "–"
    d = float(np.mean(x) - np.mean(y))
    se = float(np.sqrt(np.var(x, ddof=1) / len(x) + np.var(y, ddof=1) / len(y)))
    return f"{d:+.3f} (2 SE {2 * se:.3f}: {'exceeds' if abs(d) > 2 * se else 'within'})"


def agreement(a) -> dict:
    """:func:`judge_agreement` of the trained judge on each flow run's held-out images and the base's (cached in
    ``flow/agreement.json``)."""
    flow = a.out / "flow"
    path = flow / "agreement.json"
    got = json.loads(path.read_text()) if path.exists() else {}
    judge = judge_dir(a, a.trained_judge)
    if not (judge / "config.json").exists():
        return got
    todo = [("base", flow / "base_eval")] + [
        (f"{arm}/seed{s}", flow / arm / f"seed{s}" / "final_eval") for arm in ARMS for s in a.seeds.split(",")]
    for key, d in todo:
        if key not in got and (d / "metrics.json").exists():  # a finished evaluation only
            got[key] = judge_agreement(judge, d)
            path.write_text(json.dumps(got, indent=1))
    return got


def report(a) -> str:
    import numpy as np

    def ms(v, scale=1.0, fmt=".3f"):
        v = [scale * x for x in v if x is not None]
        return f"{np.mean(v):{fmt}} ± {np.std(v):{fmt}}" if len(v) > 1 else (f"{v[0]:{fmt}}" if v else "–")

    lines = []
    res = json.loads((a.out / "judge.json").read_text()) if (a.out / "judge.json").exists() else {}
    if res:
        lines += ["| judge | held-out pairwise acc. % (both orders) | both orders right % | failed % | "
                  "picks Image 1 % | reasoning exact % | by error kind (acc. %) |", "|---|---|---|---|---|---|---|"]
        for k, (_, lab) in JUDGES.items():
            if k in res and "heldout" in res[k]:
                h = res[k]["heldout"]
                by = ", ".join(f"{e} {100 * v:.0f}" for e, v in h["by_error"].items())
                p1 = "–" if h["picks_image_1"] is None else f"{100 * h['picks_image_1']:.1f}"
                th = "–" if h.get("think_exact") is None else f"{100 * h['think_exact']:.1f}"
                lines.append(f"| {lab} | {100 * h['accuracy']:.1f} | {100 * h['both_orders_right']:.1f} | "
                             f"{100 * h['failed']:.1f} | {p1} | {th} | {by} |")
        lines.append("")
    flow = a.out / "flow"
    base = eval_means(flow / "base_eval") if (flow / "base_eval" / "images.jsonl").exists() else None
    agree = agreement(a) if base else {}
    rows = ["| reward | verifier partial | strict acc. % | partial vs base (paired) | epochs | train CPU-s | "
            "trained judge agrees with the verifier % (ties %) |", "|---|---|---|---|---|---|---|"]

    def ag(keys):
        v = [agree[k] for k in keys if k in agree and agree[k].get("pairs")]
        return "–" if not v else (ms([x["agree"] for x in v], 100, ".1f") + " (" +
                                  ms([x["tie"] for x in v], 100, ".1f") + ")")

    if base:
        rows.append(f"| base (before training) | {base['mini_geneval/partial']:.3f} | "
                    f"{100 * base['mini_geneval/strict']:.1f} | – | 0 | 0 | {ag(['base'])} |")
    partial = {}
    for arm, (lab, _) in ARMS.items():
        cols = {k: [] for k in ("v", "s", "dv", "ep", "cpu")}
        keys, untrained = [], 0
        for seed in [int(s) for s in a.seeds.split(",")]:
            d = flow / arm / f"seed{seed}"
            if not (d / "final_eval" / "images.jsonl").exists():
                continue
            h, e = read(d), eval_means(d / "final_eval")
            untrained += (d / "nothing_trained.txt").exists()
            keys.append(f"{arm}/seed{seed}")
            cols["v"].append(e["mini_geneval/partial"])
            cols["s"].append(e["mini_geneval/strict"])
            cols["dv"].append(e["mini_geneval/partial"] - base["mini_geneval/partial"] if base else None)
            cols["ep"].append(len(h))
            cols["cpu"].append(h[-1].get("time/train_budget_s") if h else None)
        partial[arm] = cols["v"]
        if cols["v"]:
            note = f"; {untrained} run(s) without any reward signal: the base" if untrained else ""
            rows.append(f"| {lab} (n={len(cols['v'])}{note}) | {ms(cols['v'])} | {ms(cols['s'], 100, '.1f')} | "
                        f"{ms(cols['dv'])} | {ms(cols['ep'], fmt='.0f')} | {ms(cols['cpu'], fmt='.0f')} | "
                        f"{ag(keys)} |")
    rows += ["", "Differences of the held-out verifier partial score (mean over seeds):", ""]
    for x, y in (("judge_trained", "judge_untrained"), ("judge_trained", "verifier"), ("verifier", "judge_untrained")):
        if partial.get(x) and partial.get(y):
            rows.append(f"* {ARMS[x][0]} − {ARMS[y][0]}: {two_se(partial[x], partial[y])}")
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
        if a.ship:
            ship(a)
    if a.stage in ("all", "flow"):
        stage_flow(a)
    print(report(a))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
