"""How step cost grows (issue #18 item 5): VLM GRPO step time and peak memory against group size G and video
tokens, naive vs ours; flow-matching epoch time against sampling steps and resolution.

**VLM** (one step of ``GRPOTrainer.train``: sampling, reward, advantages, loss forward + backward, AdamW), one video
prompt per step, G completions of exactly T tokens (EOS suppressed), vision tower frozen, LLM fully trained, fp32:

* ``naive``: ``rollout.shared_prefix=false`` + ``run.logprob_impl=naive`` (the prompt repeated G times in sampling
  and in the loss: G vision-tower passes and G prefills of the prompt, as TRL does);
* ``ours``: the defaults ``rollout.shared_prefix=true`` + ``run.logprob_impl=prefix_group`` (one of each).

Video tokens: 224x224 frames give 64 merged tokens per temporal patch of 2 frames, so 8 / 32 / 128 frames give
256 / 1024 / 4096 video tokens.  The prompt's media is prepared once before timing and reused (as
``data.prefetch`` does in training, where data wait is ~0): the step times below are compute only.  Per cell the
two sides run back to back, the order alternating; cells are interleaved in rounds.  Headline per cell: the median
over rounds of the paired ratio naive / ours (wall; thread CPU time as cross-check), and each side's extra peak
RSS during its step (``common.peak_during``: RSS high-water mark minus RSS before the step, in-process with a fixed
glibc mmap threshold so freed tensors leave the process).

**Lengths** (issue #42): the same paired VLM step against the completion length T = 64 / 256 / 1,024 at the
recipes' prompt lengths (1,024 video tokens: Video-R1 and the 16-frame recipes; 3,584: Time-R1 / TempSamp-R1's
total-pixel budget) and the recipes' G = 8.  Prefix sharing saves the prompt's repeats, so its gain shrinks as the
completions (decoded and scored on both sides) grow; each cell also records the loss's token-count ratio
G(P+T) / (P + G(T-1)) for comparison.  ``--parts lengths`` runs this part alone.

**Flow** (one epoch of ``flow_grpo.train.trainer.FlowGRPOTrainer.train``: sample groups_per_epoch x group_size images with the
SDE sampler, rewards, advantages, PPO updates over the trained steps), against sampling steps K and resolution.
There is no naive twin here; cells are interleaved in rounds and each is reported as a paired ratio to the
smallest cell of the same round (plus medians of wall and CPU time).

Writes ``<out-dir>/cost_growth[_<parts>][_quick].json`` (``_<parts>`` when ``--parts`` is not all three) and the plots ``cost_growth_vlm[_quick].png`` /
``cost_growth_flow[_quick].png`` / ``cost_growth_lengths[_quick].png``; prints ``cost_growth_max_speedup=X.XX`` (the
largest naive/ours ratio of the G x tokens grid) LAST.

    python eval/perf/cost_growth.py --quick          # tiny models, reduced grid: a few minutes
    python eval/perf/cost_growth.py                  # mid models, full grid (long: see docs/performance.md)
    python eval/perf/cost_growth.py --parts lengths --model mid    # the completion-length sweep alone
    python eval/perf/cost_growth.py --smoke --out-dir /tmp/cg   # seconds: checks that it runs
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
for _p in (_HERE, _ROOT):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import common  # noqa: E402

TOKENS_PER_FRAME_PAIR = 64  # 224x224 frames with the bench processor (save_bench_vlm)
# The length sweep's prompts: the recipes' video budgets.  Video-R1 / T-GRPO, Reg-GRPO, TW-GRPO, SEED-GRPO: 16 frames
# at <= 128*28*28 pixels -> 8 temporal patches x 128 = 1,024 video tokens; Time-R1, TempSamp-R1, VideoChat-R1:
# video_total_pixels 3584*28*28 -> ~3,584 video tokens.  Completions: 64 (the old benchmarks), 256 (TempSamp-R1),
# 1,024 (Time-R1, DAPO, SEED-GRPO; Video-R1 768).
RECIPE_VIDEO_TOKENS = [1024, 3584]
RECIPE_NEW_TOKENS = [64, 256, 1024]
MODES = {
    # model, Gs, video tokens, T, rounds; flow model, steps, sizes, flow rounds; length sweep (G, prompts, Ts)
    "full": dict(model="mid", G=[2, 4, 8, 16], tokens=[256, 1024, 4096], T=32, rounds=2,
                 flow_model="mid", K=[4, 8, 16], sizes=[64, 128, 256], flow_rounds=2,
                 len_G=8, len_tokens=RECIPE_VIDEO_TOKENS, len_T=RECIPE_NEW_TOKENS),
    "quick": dict(model="tiny", G=[2, 4, 8, 16], tokens=[256, 1024, 4096], T=16, rounds=1,
                  flow_model="tiny", K=[4, 8, 16], sizes=[32, 64, 128], flow_rounds=1,
                  len_G=8, len_tokens=RECIPE_VIDEO_TOKENS, len_T=RECIPE_NEW_TOKENS),
    "smoke": dict(model="tiny", G=[2, 4], tokens=[128], T=2, rounds=1,
                  flow_model="tiny", K=[2, 3], sizes=[32], flow_rounds=1,
                  len_G=2, len_tokens=[128], len_T=[2, 4]),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny models (VLM and FLUX), 1 round: a few minutes")
    p.add_argument("--smoke", action="store_true", help="tiny models, G in {2,4}, 128 tokens, K in {2,3}: seconds")
    p.add_argument("--parts", default="vlm,flow,lengths",
                   help="comma-separated subset of vlm (G x video tokens), flow (steps x resolution), lengths "
                        "(completion length x the recipes' prompt lengths)")
    p.add_argument("--lengths", default="", help="length sweep: completion tokens, e.g. 64,256,1024")
    p.add_argument("--length-tokens", default="",
                   help="length sweep: video tokens of its prompts (default 1024,3584: the recipes' budgets)")
    p.add_argument("--length-G", type=int, default=0, help="length sweep: group size (default 8, the recipes')")
    p.add_argument("--G", default="", help="group sizes, e.g. 2,4,8,16 (default: the mode's)")
    p.add_argument("--tokens", default="", help="video tokens, multiples of 64, e.g. 256,1024,4096")
    p.add_argument("--T", type=int, default=0, help="completion tokens (exact)")
    p.add_argument("--rounds", type=int, default=0, help="timed rounds per cell (VLM and flow)")
    p.add_argument("--K", default="", help="flow sampling steps, e.g. 4,8,16")
    p.add_argument("--sizes", default="", help="flow image sides in pixels (multiples of 16), e.g. 32,64,128")
    p.add_argument("--model", choices=["tiny", "mid"], default=None, help="VLM size (default: the mode's)")
    p.add_argument("--flow-model", choices=["tiny", "mid"], default=None, help="FLUX size (default: the mode's)")
    p.add_argument("--model-dir", default="", help="reuse / save the VLM folder here (default: a temp dir)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out-dir", default=os.path.join(_ROOT, "docs", "perf"), help="JSON and PNG go here")
    p.add_argument("--json", default="", help="also write the JSON here (eval/perf/run.py convention)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNGs")
    p.add_argument("--replot", default="", help="only redraw the PNGs from this JSON (written by an earlier run)")
    a = p.parse_args(argv)
    a.mode = "smoke" if a.smoke else ("quick" if a.quick else "full")
    m = MODES[a.mode]
    ints = lambda s, d: [int(x) for x in s.split(",") if x.strip()] if s else list(d)  # noqa: E731
    a.G, a.tokens, a.K, a.sizes = ints(a.G, m["G"]), ints(a.tokens, m["tokens"]), ints(a.K, m["K"]), ints(a.sizes, m["sizes"])
    a.T = a.T or m["T"]
    a.len_T, a.len_tokens = ints(a.lengths, m["len_T"]), ints(a.length_tokens, m["len_tokens"])
    a.len_G = a.length_G or m["len_G"]
    a.vlm_rounds = a.rounds or m["rounds"]
    a.flow_rounds = a.rounds or m["flow_rounds"]
    a.model = a.model or m["model"]
    a.flow_model = a.flow_model or m["flow_model"]
    a.parts = [x.strip() for x in a.parts.split(",") if x.strip()]
    bad = [x for x in a.parts if x not in ("vlm", "flow", "lengths")] + [
        t for t in a.tokens + a.len_tokens if t % (2 * 32) or t < 128]
    if bad:
        p.error(f"bad --parts / --tokens values {bad} (tokens: multiples of 64, >= 128)")
    return a


def timed(fn):
    """(wall s, thread CPU s, extra peak RSS MiB) of one call; GC collected before, disabled inside."""
    gc.collect()
    gc.disable()
    try:
        t0, c0 = time.perf_counter(), time.thread_time()
        _, peak = common.peak_during(fn)
        return time.perf_counter() - t0, time.thread_time() - c0, peak
    finally:
        gc.enable()


# ============================================================================================== VLM
def video_sample(frames: int, i: int = 0) -> dict:
    from mmgrpo.vlm.models.tiny import synthetic_frames

    return {"id": f"v{frames}_{i}", "task": "tvg", "query": "when does the square move?",
            "video": synthetic_frames(i, frames, 224, 224), "meta": {"video_fps": 2.0}, "duration": frames / 2.0,
            "spans": [[0.5, 1.5]]}


def reward_fn(texts, samples):
    import torch

    r = torch.tensor([float(sum(map(ord, t)) % 7) / 6.0 for t in texts])
    return {"acc": r, "total": r.clone(), "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}


def build_trainer(args, policy, G: int, side: str, T: int | None = None):
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.vlm.models.rollout import HFRolloutBackend
    from mmgrpo.vlm.train.trainer import GRPOTrainer
    from mmgrpo.utils.config import load_config

    T = T or args.T
    out = tempfile.mkdtemp(prefix=f"mmgrpo_cg_{side}{G}_")
    naive = side == "naive"
    cfg = load_config(TrainConfig, None, [
        f"model.path={args.model_dir}", "model.dtype=float32", "model.attn_implementation=sdpa",
        "model.freeze_vision=true", "data.task=tvg", "data.prompt_mode=no_think", "data.prefetch=0",
        "data.video_fps=2.0", "data.max_frames=100000", "data.min_frames=2", f"data.video_min_pixels={224 * 224}",
        f"data.video_max_pixels={224 * 224}", "data.video_total_pixels=1e12", "data.shuffle=false",
        f"rollout.group_size={G}", f"rollout.max_new_tokens={T}", "rollout.temperature=1.0",
        f"rollout.generation_batch_size={G}", f"rollout.shared_prefix={'false' if naive else 'true'}",
        f"run.logprob_impl={'naive' if naive else 'prefix_group'}", "run.prompts_per_device=1",
        f"run.micro_batch_size={G}", "optim.lr=1e-5", "optim.weight_decay=0", "optim.max_grad_norm=1.0",
        "algo.kl_coef=0", "algo.num_iterations=1", f"run.output_dir={out}", "run.tensorboard=false",
        "run.save_every=0", "run.resume_from=none", "run.max_steps=1000000", "run.device=cpu",
        "run.log_every=1000000", "run.progress_bar=false",
        # sampling suppresses EOS (below) to get exactly T tokens, so it is slightly off the scored policy (by
        # log(1 - p_eos)): the step-0 on-policy check would rightly stop it
        "rollout.onpolicy_check=false"])
    eos = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    backend = HFRolloutBackend(policy.model, policy.processor, list(policy.suppress_token_ids) + [eos],
                               max_batch_size=G, shared_prefix=not naive)  # EOS suppressed: exactly T tokens
    tr = GRPOTrainer(cfg, samples=[video_sample(8)], policy=policy, reward_fn=reward_fn, backend=backend)
    tr._cg_out = out
    return tr


def _vlm_grid(args, cells: list[tuple[int, int, int]], name, tag: str) -> dict:
    """Paired naive / ours steps over ``cells`` = [(G, T, video tokens)]; ``name(G, T, n)`` keys the results.
    One trainer per (G, T, side), all on one loaded policy; one untimed warm-up step each (lazy init, optimizer
    state) on the smallest prompt; then ``args.vlm_rounds`` rounds over the cells, the two sides of a cell back to
    back in alternating order."""
    import torch

    from mmgrpo.vlm.models.adapters import load_policy

    own = None
    if not args.model_dir:
        own = tempfile.mkdtemp(prefix="mmgrpo_cg_vlm_")
        args.model_dir = os.path.join(own, args.model)
    if not os.path.exists(os.path.join(args.model_dir, "config.json")):
        common.save_bench_vlm(args.model_dir, args.model)
    policy = load_policy(args.model_dir, dtype="float32", freeze_vision=True, attn_implementation="sdpa")
    common.set_threads(args.threads)
    tokens = sorted({n for _, _, n in cells})
    samples = {n: video_sample(2 * n // TOKENS_PER_FRAME_PAIR, i) for i, n in enumerate(tokens)}
    trainers = {(G, T, side): build_trainer(args, policy, G, side, T)
                for G, T in sorted({(G, T) for G, T, _ in cells}) for side in ("naive", "ours")}
    prepared, prompt_tokens = {}, {}
    any_tr = next(iter(trainers.values()))
    for n, s in samples.items():
        pp = any_tr.task.prepare(s)
        prepared[id(s)] = pp
        ids = pp.item["input_ids"][0]
        prompt_tokens[n] = int(ids.shape[0])
        vid = int((ids == policy.model.config.video_token_id).sum())
        if vid != n:
            raise RuntimeError(f"a {n}-token video prompt has {vid} video tokens: the processor sizing changed")
    for tr in trainers.values():
        tr.task.prepare = lambda s: prepared[id(s)]  # media prepared once (as data.prefetch does)

    def step(tr, n):
        def fn():
            tr.samples = tr.all_samples = [samples[n]]
            tr.state.stream = tr.new_stream()
            return tr.train(steps=1)[-1]
        return fn

    common.release_freed_memory()
    for tr in trainers.values():
        step(tr, min(tokens))()
    res = {name(G, T, n): {"G": G, "T": T, "video_tokens": n, "prompt_tokens": prompt_tokens[n],
                           **{f"{s}_{k}": [] for s in ("naive", "ours") for k in ("wall_s", "cpu_s", "peak_mb")}}
           for G, T, n in cells}
    for r in range(args.vlm_rounds):
        for c, (G, T, n) in enumerate(cells):
            order = ("naive", "ours") if (r + c) % 2 == 0 else ("ours", "naive")
            d = res[name(G, T, n)]
            for side in order:
                w, cpu, peak = timed(step(trainers[(G, T, side)], n))
                d[f"{side}_wall_s"].append(w)
                d[f"{side}_cpu_s"].append(cpu)
                d[f"{side}_peak_mb"].append(peak)
            print(f"[{tag}] round {r + 1} G={G:2d} T={T:4d} video tokens={n:5d}: naive {d['naive_wall_s'][-1]:7.2f} s "
                  f"({d['naive_cpu_s'][-1]:6.2f} s CPU, {d['naive_peak_mb'][-1]:6.0f} MB) | ours "
                  f"{d['ours_wall_s'][-1]:6.2f} s ({d['ours_cpu_s'][-1]:6.2f} s CPU, {d['ours_peak_mb'][-1]:6.0f} MB) | "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    for d in res.values():
        d["speedup"] = statistics.median(a / b for a, b in zip(d["naive_wall_s"], d["ours_wall_s"]))
        d["speedup_cpu"] = statistics.median(a / b for a, b in zip(d["naive_cpu_s"], d["ours_cpu_s"]))
        # where prefix sharing's gain comes from, by token count: the loss forward runs G(P+T) tokens naive and
        # P + G(T-1) grouped; sampling prefills G prompts naive and 1 shared, and both decode G(T-1) tokens
        P, G, T = d["prompt_tokens"], d["G"], d["T"]
        d["loss_token_ratio"] = G * (P + T) / (P + G * (T - 1))
        d["sampling_token_ratio"] = (G * P + G * (T - 1)) / (P + G * (T - 1))
        for side in ("naive", "ours"):
            d[f"{side}_wall_median_s"] = statistics.median(d[f"{side}_wall_s"])
            d[f"{side}_cpu_median_s"] = statistics.median(d[f"{side}_cpu_s"])
            d[f"{side}_peak_max_mb"] = max(d[f"{side}_peak_mb"])
    import shutil

    for tr in trainers.values():
        shutil.rmtree(tr._cg_out, ignore_errors=True)
    size = common.vlm_size_info(args.model_dir)
    if own:
        shutil.rmtree(own, ignore_errors=True)
        args.model_dir = ""
    del trainers, policy
    gc.collect()
    torch.set_num_threads(args.threads)
    return {"model": args.model, "size": size, "rounds": args.vlm_rounds, "cells": res}


def run_vlm(args) -> dict:
    out = _vlm_grid(args, [(G, args.T, n) for n in args.tokens for G in args.G],
                    lambda G, T, n: f"G{G}_tok{n}", "vlm")
    return {**out, "T": args.T, "Gs": args.G, "tokens": args.tokens}


def run_lengths(args) -> dict:
    """The completion-length sweep (issue #42): G fixed (8), the recipes' prompt lengths, T = 64 / 256 / 1,024.
    Longer completions shift the step from the prompt (shared) to the decode and the completion tokens (the same
    work on both sides), so the naive / ours ratio falls towards 1."""
    out = _vlm_grid(args, [(args.len_G, T, n) for n in args.len_tokens for T in args.len_T],
                    lambda G, T, n: f"T{T}_tok{n}", "lengths")
    return {**out, "G": args.len_G, "Ts": args.len_T, "tokens": args.len_tokens}


# ============================================================================================== flow
def block_reward(images, prompts, metadata):
    import torch

    x = torch.as_tensor(images).float()
    return {"block": x[:, :8, :8].mean(dim=(1, 2, 3)) / 255.0}


def run_flow(args) -> dict:
    from flow_rollout import build_adapter

    from flow_grpo.config import load_train_config
    from flow_grpo.train.trainer import FlowGRPOTrainer

    ad, info = build_adapter(args.flow_model, "flux")
    common.set_threads(args.threads)
    trainers, outs = {}, []
    for K in args.K:
        for S in args.sizes:
            out = tempfile.mkdtemp(prefix=f"mmgrpo_cg_flow_{K}_{S}_")
            outs.append(out)
            ov = {"method": "flow", "sample.num_steps": K, "sample.height": S, "sample.width": S,
                  "sample.batch_size": 4, "sample.cfg": "false", "sample.guidance_scale": 3.5,
                  "data.group_size": 4, "data.groups_per_epoch": 2, "data.prompts": "[a cat, a dog, a bird]",
                  "model.lora.rank": 8, "model.lora.alpha": 16, "optim.lr": 1e-4, "run.num_epochs": 1000000,
                  "run.output_dir": out, "run.save_every": 0, "run.image_grid_every": 0, "run.tensorboard": "false",
                  "run.reward_curves": "false", "reward.retry_backoff": 0.0}
            cfg = load_train_config(None, [f"{k}={v}" for k, v in ov.items()])
            trainers[(K, S)] = FlowGRPOTrainer(cfg, adapter=ad, reward_fn={"block": block_reward})
    common.release_freed_memory()
    for tr in trainers.values():  # warm-up epoch each
        tr.train(num_epochs=1)
    cells = list(trainers)
    base = cells[0]
    res = {f"K{K}_px{S}": {"steps": K, "size": S, "wall_s": [], "cpu_s": [], "peak_mb": [], "vs_base": []}
           for K, S in cells}
    for r in range(args.flow_rounds):
        order = cells[r % len(cells):] + cells[:r % len(cells)]
        got = {}
        for K, S in order:
            got[(K, S)] = timed(lambda tr=trainers[(K, S)]: tr.train(num_epochs=1))
        for (K, S), (w, cpu, peak) in got.items():
            d = res[f"K{K}_px{S}"]
            d["wall_s"].append(w)
            d["cpu_s"].append(cpu)
            d["peak_mb"].append(peak)
            d["vs_base"].append(w / got[base][0])
        print(f"[flow] round {r + 1}: " + ", ".join(f"K={K} {S}px {got[(K, S)][0]:.2f} s" for K, S in cells)
              + f" | load {os.getloadavg()[0]:.1f}", flush=True)
    for d in res.values():
        d["wall_median_s"] = statistics.median(d["wall_s"])
        d["cpu_median_s"] = statistics.median(d["cpu_s"])
        d["vs_base_median"] = statistics.median(d["vs_base"])
        d["peak_max_mb"] = max(d["peak_mb"])
    import shutil

    for out in outs:
        shutil.rmtree(out, ignore_errors=True)
    return {"model": info, "samples_per_epoch": 8, "base_cell": f"K{base[0]}_px{base[1]}", "Ks": args.K,
            "sizes": args.sizes, "rounds": args.flow_rounds, "cells": res}


# ============================================================================================== plots
def plot_vlm(vlm: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = vlm["cells"]
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.6))
    colours = dict(zip(vlm["tokens"], ["tab:blue", "tab:orange", "tab:red", "tab:green"]))
    for n in vlm["tokens"]:
        row = [cells[f"G{G}_tok{n}"] for G in vlm["Gs"] if f"G{G}_tok{n}" in cells]
        Gs = [d["G"] for d in row]
        for side, ls, mk in (("naive", "--", "s"), ("ours", "-", "o")):
            lab = f"{side}, {n} video tokens"
            axes[0].plot(Gs, [d[f"{side}_cpu_median_s"] for d in row], ls, marker=mk, color=colours[n], label=lab)
            axes[1].plot(Gs, [d[f"{side}_wall_median_s"] for d in row], ls, marker=mk, color=colours[n], label=lab)
            axes[2].plot(Gs, [d[f"{side}_peak_max_mb"] for d in row], ls, marker=mk, color=colours[n], label=lab)
        axes[3].plot(Gs, [d["speedup_cpu"] for d in row], ":", marker="s", color=colours[n],
                     label=f"CPU time, {n} video tokens")
        axes[3].plot(Gs, [d["speedup"] for d in row], "-", marker="o", color=colours[n],
                     label=f"wall, {n} video tokens")
    for ax, yl in zip(axes, ("step CPU time (s, thread time, median)", "step wall time (s, median)",
                             "extra peak RSS during the step (MiB)", "naive / ours (median paired ratio)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(vlm["Gs"], [str(g) for g in vlm["Gs"]])
        ax.set_xlabel("group size G")
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
    for ax in axes[:3]:
        ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    axes[3].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_flow(flow: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = flow["cells"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for S in flow["sizes"]:
        row = [cells[f"K{K}_px{S}"] for K in flow["Ks"]]
        axes[0].plot(flow["Ks"], [d["cpu_median_s"] for d in row], "-o", label=f"{S}x{S} px")
        axes[1].plot(flow["Ks"], [d["wall_median_s"] for d in row], "-o", label=f"{S}x{S} px")
        axes[2].plot(flow["Ks"], [d["vs_base_median"] for d in row], "-o", label=f"{S}x{S} px")
    for ax, yl in zip(axes, ("epoch CPU time (s, thread time, median)", "epoch wall time (s, median)",
                             f"epoch wall time / {flow['base_cell']} (paired)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(flow["Ks"], [str(k) for k in flow["Ks"]])
        ax.set_xlabel("sampling steps K")
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_lengths(lens: dict, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = lens["cells"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    colours = dict(zip(lens["tokens"], ["tab:blue", "tab:red", "tab:green", "tab:orange"]))
    for n in lens["tokens"]:
        row = [cells[f"T{T}_tok{n}"] for T in lens["Ts"] if f"T{T}_tok{n}" in cells]
        Ts = [d["T"] for d in row]
        P = row[0]["prompt_tokens"] if row else n
        for side, ls, mk in (("naive", "--", "s"), ("ours", "-", "o")):
            lab = f"{side}, prompt {P} tokens ({n} video)"
            axes[0].plot(Ts, [d[f"{side}_cpu_median_s"] for d in row], ls, marker=mk, color=colours[n], label=lab)
            axes[1].plot(Ts, [d[f"{side}_peak_max_mb"] for d in row], ls, marker=mk, color=colours[n], label=lab)
        axes[2].plot(Ts, [d["speedup_cpu"] for d in row], "-", marker="o", color=colours[n],
                     label=f"CPU time, prompt {P}")
        axes[2].plot(Ts, [d["speedup"] for d in row], ":", marker="x", color=colours[n], label=f"wall, prompt {P}")
        axes[2].plot(Ts, [d["loss_token_ratio"] for d in row], "--", color=colours[n], alpha=0.4, lw=1,
                     label=f"loss tokens G(P+T) / (P+G(T-1)), prompt {P}")
    for ax, yl in zip(axes, ("step CPU time (s, thread time, median)", "extra peak RSS during the step (MiB)",
                             "naive / ours (median paired ratio)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lens["Ts"], [str(t) for t in lens["Ts"]])
        ax.set_xlabel("completion tokens T (exact: EOS suppressed)")
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
    for ax in axes[:2]:
        ax.set_yscale("log")
    axes[2].axhline(1.0, color="black", lw=0.8)
    axes[2].set_ylim(bottom=0)
    axes[0].legend(fontsize=7)
    axes[2].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ============================================================================================== main
def write_plots(out: dict, out_dir: str) -> None:
    sfx = "" if out["mode"] == "full" else f"_{out['mode']}"
    where = (f"{out['mode']} mode, load {out['load_start']} -> {out['machine_end'].get('loadavg_1m')}, "
             f"{out['machine'].get('torch_threads', 1)} thread(s)")
    if "vlm" in out:
        p = os.path.join(out_dir, f"cost_growth_vlm{sfx}.png")
        plot_vlm(out["vlm"], p, f"VLM GRPO step ({out['vlm']['model']} Qwen2.5-VL, T={out['vlm']['T']}, one video "
                                f"prompt x G): naive (repeated prompts) vs ours (shared prefix) -- {where}")
        out["vlm_plot"] = os.path.relpath(p, _ROOT)
    if "flow" in out:
        p = os.path.join(out_dir, f"cost_growth_flow{sfx}.png")
        plot_flow(out["flow"], p, f"Flow-GRPO epoch ({out['flow']['model']['model']} FLUX, 2 groups x 4 images, "
                                  f"LoRA r=8) -- {where}")
        out["flow_plot"] = os.path.relpath(p, _ROOT)
    if "lengths" in out:
        L = out["lengths"]
        sz = L.get("size", {})
        p = os.path.join(out_dir, f"cost_growth_lengths{sfx}.png")
        plot_lengths(L, p, f"VLM GRPO step vs completion length ({L['model']} Qwen2.5-VL: hidden {sz.get('hidden')}, "
                           f"{sz.get('layers')} layers, vocab {sz.get('vocab')}; fp32; one video prompt x G={L['G']}): "
                           f"naive (repeated prompts) vs ours (shared prefix) -- {where}")
        out["lengths_plot"] = os.path.relpath(p, _ROOT)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.replot:
        with open(args.replot) as f:
            out = json.load(f)
        write_plots(out, os.path.dirname(os.path.abspath(args.replot)))
        return out
    common.set_threads(args.threads)
    t0 = time.time()
    load0 = round(os.getloadavg()[0], 2)
    out = {"benchmark": "cost_growth", "mode": args.mode,
           "command": common.command_line("cost_growth.py", argv if argv is not None else sys.argv[1:]),
           "machine": common.machine_info(), "load_start": load0}
    if "vlm" in args.parts:
        out["vlm"] = run_vlm(args)
    if "flow" in args.parts:
        out["flow"] = run_flow(args)
    if "lengths" in args.parts:
        out["lengths"] = run_lengths(args)
    out["machine_end"] = common.machine_info()
    out["wall_s"] = round(time.time() - t0, 1)
    sfx = "" if args.mode == "full" else f"_{args.mode}"
    os.makedirs(args.out_dir, exist_ok=True)
    if not args.no_plot:
        write_plots(out, args.out_dir)
    cells = out.get("vlm", {}).get("cells", {})
    value = max((d["speedup"] for d in cells.values()), default=float("nan"))
    op = None
    if cells:
        out["extra_keys"] = {"cost_growth_max_speedup": value}
        # the headline is one cell of the grid: its operating point (issue #42) is printed with it
        best = max(cells.values(), key=lambda d: d["speedup"])
        size = out["vlm"].get("size", {})
        op = common.operating_point(prompt_tokens=best["prompt_tokens"], media_tokens=best["video_tokens"],
                                    media="video", new_tokens=best["T"], B=1, G=best["G"],
                                    model=f"{out['vlm']['model']} Qwen2.5-VL", hidden=size.get("hidden"),
                                    layers=size.get("layers"), vocab=size.get("vocab"), threads=args.threads,
                                    extra="naive vs ours, one training step each")
        out["operating_point"] = op
    # a run of some parts only gets its own JSON (``cost_growth_lengths_quick.json``), so it does not replace the
    # record of the other parts
    part_sfx = "" if set(args.parts) == {"vlm", "flow", "lengths"} else "_" + "_".join(args.parts)
    jpath = os.path.join(args.out_dir, f"cost_growth{part_sfx}{sfx}.json")
    with open(jpath, "w") as f:
        json.dump(out, f, indent=2, default=float)
    if args.json:
        common.emit(out, args.json)
    print(f"wrote {jpath} in {out['wall_s']} s", flush=True)
    if op:
        print(f"operating point: {op['text']}", flush=True)
    print(f"cost_growth_max_speedup={value:.2f}", flush=True)
    return out


if __name__ == "__main__":
    main()
