"""Benchmark ``trl_speedup``: end-to-end VLM GRPO steps/s, mmgrpo vs TRL's ``GRPOTrainer`` (images; TRL has no video).

Workers (one subprocess each, so peak RSS is per trainer; they wait on stdin while another one runs):

* ``ours``       -- ``mmgrpo.vlm.train.trainer.GRPOTrainer.train(steps=1)`` with its defaults
                    ``run.logprob_impl=prefix_group`` (``mmgrpo.vlm.models.prefix_group``: each prompt encoded once
                    per group in the loss) and ``rollout.shared_prefix=true`` (each prompt prefilled once while
                    sampling);
* ``ours_naive`` -- the same trainer with ``run.logprob_impl=naive`` and ``rollout.shared_prefix=false`` (prompt
                    repeated G times in sampling and loss, as TRL does);
* ``trl``        -- ``trl.GRPOTrainer.train()``, stepped by a callback that reports and blocks between rounds.

Same for all: the model folder (random ``tiny`` or ``mid`` Qwen2.5-VL saved once; vision tower frozen, LLM fully
trained, fp32, sdpa, CPU), the processor, the prompts (our ``TaskAdapter`` messages, fed to TRL as its
conversational ``prompt`` column with the image in its ``image`` column: identical prompt tokens), B prompts x
G completions per step, exactly T completion tokens (EOS and vision tokens suppressed while sampling, in both),
temperature 1, AdamW (torch, lr 1e-5, no weight decay, constant lr, grad-norm clip 1.0), no KL / reference
(TRL default beta=0), one optimizer update per generation batch (num_iterations 1), token-mean loss (TRL "dapo"),
the same cheap text reward.  Threads: ``--threads`` in every worker.

Protocol: warm-up steps, then ``--rounds`` rounds; in each round every worker runs ``--steps`` steps, one
worker after the other, the order rotating.  samples/s = B*G*steps / wall time of the round (generation,
rewards, forward/backward, optimizer, the trainer's own logging).  Headline = median over rounds of the paired
ratio ours/trl; printed LAST as ``trl_speedup=X.XX``.  Cross-checks printed and in the JSON: the paired ratio of
process CPU time per step (``time.process_time``: not inflated by other jobs on a loaded machine; includes helper
threads such as our media prefetch), and the vision-tower patches each worker encodes per step.  Peak memory: each worker's ``ru_maxrss`` (whole process
life, includes imports) and its peak RSS growth over the training steps (VmHWM after setup).

Modes: full (default) = mid model, 8 rounds of 1 step, all three workers (about 30 minutes at load 6 on 2 cores);
``--quick`` = tiny model, 3 rounds, workers ours and trl only (about 1 minute at load 4-8); ``--smoke`` = tiny,
1 round, T=16, no warm-up, ours and trl (checks that it runs). ``--workers`` overrides the worker set.

    python eval/perf/trl_compare.py [--quick | --smoke] [--model mid|tiny] [--json out.json] [--profile]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
sys.path.insert(0, _HERE)
sys.path.insert(0, _ROOT)

import common  # noqa: E402

WORKERS = ("ours", "ours_naive", "trl")
TAG = "@@"  # result lines on a worker's stdout (libraries may print there too)


# ============================================================================================== shared setup
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny model, 3 rounds (default: mid, 8) of 1 step per worker")
    p.add_argument("--smoke", action="store_true", help="tiny model, 1 round, T=16, no warm-up")
    p.add_argument("--model", choices=["tiny", "mid"], default=None, help="default mid (tiny with --quick/--smoke)")
    p.add_argument("--B", type=int, default=2, help="prompts per step")
    p.add_argument("--G", type=int, default=8, help="completions per prompt")
    p.add_argument("--T", type=int, default=None, help="completion tokens, exact: EOS is suppressed (default 64; "
                                                       "16 with --smoke)")
    p.add_argument("--image-size", type=int, default=448, help="square images; 448 -> 256 image tokens")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--steps", type=int, default=None, help="steps per worker per round")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps per worker first (default 1; 0 with --smoke)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workers", default=None,
                   help="subset of " + ",".join(WORKERS) + " (default: all; ours,trl with --quick/--smoke: the "
                        "headline needs only those two, and a third worker's setup costs ~40%% of the quick run)")
    p.add_argument("--json", default="")
    p.add_argument("--model-dir", default="", help="reuse/save the model folder here (default: a temp dir)")
    p.add_argument("--profile", action="store_true",
                   help="after timing, each worker cProfiles one more step and prints the top functions")
    p.add_argument("--ours-set", default="", help="extra key=value trainer overrides for the ours* workers, comma-"
                                                  "separated (e.g. data.prefetch=0); recorded in the JSON")
    p.add_argument("--worker", choices=WORKERS, default=None, help=argparse.SUPPRESS)
    p.add_argument("--total-steps", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    light = a.quick or a.smoke
    a.model = a.model or ("tiny" if light else "mid")
    a.T = a.T or (16 if a.smoke else 64)
    if a.warmup is None:
        a.warmup = 0 if a.smoke else 1
    if a.rounds is None:  # many short rounds: the paired measurements are close in time on a drifting machine
        a.rounds = 1 if a.smoke else (3 if a.quick else 8)
    if a.steps is None:
        a.steps = 1
    if a.workers is None:
        a.workers = "ours,trl" if light else ",".join(WORKERS)
    return a


def samples(n: int, size: int) -> list[dict]:
    """Multiple-choice image prompts (the trainer's canonical sample dicts)."""
    from mmgrpo.vlm.models.tiny import synthetic_image

    return [{"id": f"img{i}", "task": "mcq", "query": f"which colour is the object number {i}?",
             "image": synthetic_image(i, size, size), "options": ["red", "green", "blue", "yellow"],
             "answer": "B"} for i in range(n)]


def reward_value(text: str) -> float:
    """A cheap deterministic reward that varies within a group: (sum of code points mod 7) / 6."""
    return float(sum(map(ord, text)) % 7) / 6.0


def say(obj: dict) -> None:
    sys.stdout.write(TAG + json.dumps(obj) + "\n")
    sys.stdout.flush()


def read_command() -> tuple[str, int]:
    line = sys.stdin.readline()
    if not line:
        return "quit", 0
    parts = line.split()
    return parts[0], (int(parts[1]) if len(parts) > 1 else 0)


def memory_report(rss_setup: float) -> dict:
    return {"peak_rss_mb": common.peak_rss_mb(), "rss_after_setup_mb": rss_setup,
            "step_peak_rss_mb": common.peak_hwm_mb(), "step_growth_mb": common.peak_hwm_mb() - rss_setup}


def new_profiler():
    """cProfile on this process's CPU time (``time.process_time``): on a loaded machine a wall-clock profile
    charges other jobs' time slices to whatever function was running."""
    import cProfile

    return cProfile.Profile(time.process_time)


def profile_text(pr, top: int = 40) -> str:
    import io
    import pstats

    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("cumulative").print_stats(top)
    st.sort_stats("tottime").print_stats(top)
    return s.getvalue()


def count_vision_patches(model) -> list:
    """A one-element list counting the patches the vision tower has seen (a forward pre-hook): shows how many
    times each image is encoded per step (sampling + loss)."""
    visual = model.model.visual if hasattr(model, "model") and hasattr(model.model, "visual") else model.visual
    seen = [0]

    def hook(module, args, kwargs):
        x = args[0] if args else kwargs.get("hidden_states")
        seen[0] += int(x.shape[0])

    visual.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def profile_step(step_fn, top: int = 40) -> str:
    pr = new_profiler()
    pr.enable()
    step_fn()
    pr.disable()
    return profile_text(pr, top)


# ============================================================================================== ours
def worker_ours(args, grouped: bool) -> None:
    import torch

    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.vlm.models.adapters import load_policy
    from mmgrpo.vlm.models.rollout import HFRolloutBackend
    from mmgrpo.vlm.train.trainer import GRPOTrainer
    from mmgrpo.utils.config import load_config

    common.set_threads(args.threads)
    out_dir = tempfile.mkdtemp(prefix="mmgrpo_perf_trl_ours_")
    rows = args.B * args.G
    overrides = [
        f"model.path={args.model_dir}", "model.dtype=float32", "model.attn_implementation=sdpa",
        "model.freeze_vision=true", "data.task=mcq", "data.prompt_mode=no_think",
        f"rollout.group_size={args.G}", f"rollout.max_new_tokens={args.T}", "rollout.temperature=1.0",
        f"rollout.generation_batch_size={rows}", f"run.prompts_per_device={args.B}", f"run.micro_batch_size={rows}",
        "optim.lr=1e-5", "optim.weight_decay=0", "optim.max_grad_norm=1.0", "optim.lr_schedule=constant",
        "algo.kl_coef=0", "algo.num_iterations=1", "algo.agg=token_mean", f"run.output_dir={out_dir}",
        "run.tensorboard=false", "run.save_every=0", "run.resume_from=none", "run.max_steps=1000000",
        "run.device=cpu", "run.log_every=1"]
    overrides.append(f"run.logprob_impl={'prefix_group' if grouped else 'naive'}")
    overrides.append(f"rollout.shared_prefix={'true' if grouped else 'false'}")  # ours_naive: repeated prompts
    overrides += [x.strip() for x in args.ours_set.split(",") if x.strip()]
    cfg = load_config(TrainConfig, None, overrides)
    policy = load_policy(args.model_dir, dtype="float32", freeze_vision=True, attn_implementation="sdpa")
    eos = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    shared = getattr(cfg.rollout, "shared_prefix", False)  # the trainer's own setting (default true)
    backend = HFRolloutBackend(policy.model, policy.processor, list(policy.suppress_token_ids) + [eos],
                               max_batch_size=rows, **({"shared_prefix": shared} if shared else {}))

    def reward_fn(texts, samples_):
        r = torch.tensor([reward_value(t) for t in texts])
        return {"acc": r, "total": r.clone(), "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}

    tr = GRPOTrainer(cfg, samples=samples(16, args.image_size), policy=policy, reward_fn=reward_fn, backend=backend)
    common.set_threads(args.threads)
    patches = count_vision_patches(policy.model)
    n_train = int(sum(p.numel() for p in tr.params))
    rss_setup = common.rss_mb()
    common.reset_peak_rss()
    prompt_tokens = int(tr.task.prepare(tr.samples[0]).item["input_ids"].shape[1])
    say({"event": "ready", "trainable_params": n_train, "threads": torch.get_num_threads(),
         "prompt_tokens": prompt_tokens})
    lengths, impl = [], None
    while True:
        cmd, k = read_command()
        if cmd == "run":
            t0, c0, p0 = time.perf_counter(), time.process_time(), patches[0]
            for _ in range(k):
                m = tr.train(steps=1)[-1]
                lengths.append(m.get("completions/mean_length", 0.0))
                impl = tr.logprob_impl
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            rb = tr.state.batch
            say({"event": "done", "steps": k, "seconds": dt, "cpu_seconds": cpu, "samples": k * rb.n,
                 "logprob_impl": impl, "shared_prefix": bool(getattr(backend, "shared_prefix", False)),
                 "vision_patches_per_step": (patches[0] - p0) / k,
                 "prompt_tokens": int(rb.items[0]["input_ids"].shape[1]), "completion_len": lengths[-1]})
        elif cmd == "profile":
            say({"event": "profile", "text": profile_step(lambda: tr.train(steps=1))})
        else:
            say({"event": "bye", "completion_len": lengths[-1] if lengths else None, **memory_report(rss_setup)})
            import shutil

            shutil.rmtree(out_dir, ignore_errors=True)
            return


# ============================================================================================== TRL
def worker_trl(args) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mmgrpo.vlm.models.adapters import get_adapter, vision_token_ids
    from mmgrpo.vlm.data.task import TaskAdapter

    common.set_threads(args.threads)
    processor = AutoProcessor.from_pretrained(args.model_dir)
    processor.tokenizer.padding_side = "left"
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(args.model_dir, dtype=torch.float32,
                                                               attn_implementation="sdpa")
    for n, p in model.named_parameters():  # same trainable set as ours: vision tower frozen
        if "visual" in n.split("."):
            p.requires_grad_(False)

    class DataCfg:  # what TaskAdapter.messages reads (same as our trainer's data config)
        task, prompt_mode, answer_format = "mcq", "no_think", "seconds"

    ta = TaskAdapter(processor, get_adapter("qwen2_5_vl"), DataCfg)
    rows = []
    for s in samples(16, args.image_size):
        msgs = []
        for m in ta.messages(s):  # our messages, image payload moved to TRL's `image` column
            content = m["content"]
            if isinstance(content, str):
                content = [{"type": "text", "text": content}]
            content = [{"type": "image"} if c.get("type") == "image" else c for c in content]
            msgs.append({"role": m["role"], "content": content})
        rows.append({"prompt": msgs, "image": s["image"]})
    ds = Dataset.from_list(rows)

    def reward(completions, **kw):
        return [reward_value(c[-1]["content"] if isinstance(c, list) else c) for c in completions]

    eos = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    out_dir = tempfile.mkdtemp(prefix="mmgrpo_perf_trl_trl_")
    cfg = GRPOConfig(
        output_dir=out_dir, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False, report_to="none",
        save_strategy="no", per_device_train_batch_size=args.B * args.G, gradient_accumulation_steps=1,
        num_generations=args.G, max_completion_length=args.T, max_steps=args.total_steps, learning_rate=1e-5,
        weight_decay=0.0, max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch",
        temperature=1.0, top_p=1.0, top_k=0, beta=0.0, num_iterations=1, loss_type="dapo", logging_steps=1,
        disable_tqdm=True, seed=0, dataloader_num_workers=0,
        generation_kwargs={"suppress_tokens": vision_token_ids(processor.tokenizer) + [eos]})

    state = {"target": 0, "done": 0, "t0": 0.0, "c0": 0.0, "p0": 0, "rss_setup": 0.0, "last": 0, "prof": None,
             "logs": {}}
    patches = count_vision_patches(model)
    from trl.data_utils import prepare_multimodal_messages

    first = prepare_multimodal_messages(rows[0]["prompt"], images=[rows[0]["image"]])
    text = processor.apply_chat_template(first, add_generation_prompt=True, tokenize=False)
    prompt_tokens = int(processor(text=[text], images=[rows[0]["image"]], return_tensors="pt")["input_ids"].shape[1])

    class Control(TrainerCallback):
        def _wait(self, control):
            cmd, k = read_command()
            if cmd == "run":
                state["target"] = state["done"] + k
                state["t0"], state["c0"], state["p0"] = time.perf_counter(), time.process_time(), patches[0]
            elif cmd == "profile":
                state["target"] = state["done"] + 1
                state["prof"] = new_profiler()
                state["prof"].enable()
            else:
                control.should_training_stop = True
                state["target"] = -1

        def on_train_begin(self, a, st, control, **kw):
            common.set_threads(args.threads)
            n_train = int(sum(p.numel() for p in model.parameters() if p.requires_grad))
            state["rss_setup"] = common.rss_mb()
            common.reset_peak_rss()
            say({"event": "ready", "trainable_params": n_train, "threads": torch.get_num_threads(),
                 "prompt_tokens": prompt_tokens})
            self._wait(control)

        def on_log(self, a, st, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:  # not the end-of-training summary log
                state["logs"] = dict(logs)

        def on_step_end(self, a, st, control, **kw):
            state["done"] += 1
            if state["done"] == state["target"]:
                if state["prof"] is not None:
                    state["prof"].disable()
                    text = profile_text(state["prof"])
                    state["prof"] = None
                    state["last"] = state["done"]
                    say({"event": "profile", "text": text})
                else:
                    dt, cpu = time.perf_counter() - state["t0"], time.process_time() - state["c0"]
                    k = state["done"] - state["last"]
                    state["last"] = state["done"]
                    say({"event": "done", "steps": k, "seconds": dt, "cpu_seconds": cpu, "samples": k * args.B * args.G,
                         "vision_patches_per_step": (patches[0] - state["p0"]) / k,
                         "prompt_tokens": prompt_tokens,
                         "completion_len": state["logs"].get("completions/mean_length")})
                self._wait(control)

    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=ds, processing_class=processor,
                          callbacks=[Control()])
    trainer.train()
    if state["target"] != -1:  # ran out of max_steps: still answer the final command
        read_command()
    say({"event": "bye", "completion_len": state["logs"].get("completions/mean_length"),  # logged after step_end
         **memory_report(state["rss_setup"])})
    import shutil

    shutil.rmtree(out_dir, ignore_errors=True)


# ============================================================================================== parent
class Worker:
    def __init__(self, name: str, args, total_steps: int):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", name, "--model-dir", args.model_dir,
               "--B", str(args.B), "--G", str(args.G), "--T", str(args.T), "--image-size", str(args.image_size),
               "--threads", str(args.threads), "--total-steps", str(total_steps), "--ours-set", args.ours_set]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.name = name
        self.log = open(os.path.join(tempfile.gettempdir(), f"mmgrpo_perf_trl_{name}_{os.getpid()}.log"), "w")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     cwd=_ROOT, env=env)

    def read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"worker {self.name} exited (code {self.proc.poll()}); see {self.log.name}")
            if line.startswith(TAG):
                return json.loads(line[len(TAG):])

    def send(self, cmd: str) -> None:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def run(self, k: int) -> dict:
        self.send(f"run {k}")
        return self.read()


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.worker:
        if args.worker == "trl":
            worker_trl(args)
        else:
            worker_ours(args, grouped=args.worker == "ours")
        return {}
    t_start = time.time()
    load_start = round(os.getloadavg()[0], 2)
    common.set_threads(args.threads)  # the parent only coordinates; recorded in machine_info
    names = [w.strip() for w in args.workers.split(",") if w.strip()]
    if "trl" not in names or not any(n.startswith("ours") for n in names):
        raise SystemExit("--workers must include trl and at least one of ours, ours_naive")
    own_dir = None
    if not args.model_dir:
        own_dir = tempfile.mkdtemp(prefix="mmgrpo_perf_trl_")
        args.model_dir = os.path.join(own_dir, args.model)
    if not os.path.exists(os.path.join(args.model_dir, "config.json")):
        common.save_bench_vlm(args.model_dir, args.model)
    total = args.warmup + args.rounds * args.steps + (1 if args.profile else 0)
    workers, ready = {}, {}
    for n in names:  # start together (setup is not timed); each then blocks on stdin until told to run
        workers[n] = Worker(n, args, total)
    for n in names:
        ready[n] = workers[n].read()
        print(f"{n}: ready ({ready[n]['trainable_params']/1e6:.2f}M trainable, {ready[n]['threads']} threads, "
              f"prompt {ready[n]['prompt_tokens']} tokens)", flush=True)
    if len({r["prompt_tokens"] for r in ready.values()}) != 1 or len({r["trainable_params"] for r in ready.values()}) != 1:
        raise SystemExit(f"workers disagree on prompt length / trainable parameters: {ready}")
    if args.warmup:
        for n in names:
            w = workers[n].run(args.warmup)
            if "logprob_impl" in w:
                print(f"{n}: log-prob path {w['logprob_impl']}", flush=True)
                expected = "prefix_group" if n == "ours" else "naive"
                if w["logprob_impl"] != expected:
                    raise SystemExit(f"worker {n} runs the {w['logprob_impl']} log-prob path, expected {expected} "
                                     f"(see the trainer's log in {workers[n].log.name})")
    per = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            res = workers[n].run(args.steps)
            if n.startswith("ours") and res.get("logprob_impl") != ("prefix_group" if n == "ours" else "naive"):
                raise SystemExit(f"worker {n} ran the {res.get('logprob_impl')} log-prob path")
            if n == "ours" and res.get("shared_prefix") is False:
                raise SystemExit("worker ours sampled with repeated prompts (rollout.shared_prefix off)")
            per[n].append(res)
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{n} {per[n][-1]['samples'] / per[n][-1]['seconds']:.2f} samples/s "
            f"({per[n][-1]['cpu_seconds'] / per[n][-1]['steps']:.2f} s CPU/step)" for n in names)
            + f" | load {os.getloadavg()[0]:.1f}", flush=True)
    profiles = {}
    if args.profile:  # one more step per worker under cProfile (not timed)
        for n in names:
            workers[n].send("profile")
            profiles[n] = workers[n].read()["text"]
    mem = {}
    for n in names:
        workers[n].send("quit")
        mem[n] = workers[n].read()
        workers[n].proc.wait(timeout=120)
        workers[n].log.close()
        os.unlink(workers[n].log.name)  # kept only when a worker fails (the error message names it)
    if own_dir:
        import shutil

        shutil.rmtree(own_dir, ignore_errors=True)

    sps = {n: [x["samples"] / x["seconds"] for x in per[n]] for n in names}
    res = {"benchmark": "trl_compare", "command": " ".join(["python", "eval/perf/trl_compare.py"] + (argv or sys.argv[1:])),
           "machine": common.machine_info(), "model": args.model, "B": args.B, "G": args.G, "T": args.T,
           "image_size": args.image_size, "ours_set": args.ours_set, "rounds": args.rounds, "steps_per_round": args.steps,
           "prompt_tokens": ready[names[0]]["prompt_tokens"], "trainable_params": ready[names[0]]["trainable_params"],
           "completion_len_last": {n: mem[n].get("completion_len") for n in names},
           "samples_per_s": sps, "samples_per_s_median": {n: statistics.median(v) for n, v in sps.items()},
           "cpu_s_per_step": {n: [x["cpu_seconds"] / x["steps"] for x in per[n]] for n in names},
           "vision_patches_per_step": {n: per[n][-1].get("vision_patches_per_step") for n in names},
           "shared_prefix": {n: per[n][-1].get("shared_prefix") for n in names if n.startswith("ours")},
           "load_start": load_start, "memory": mem, "profiles": profiles, "wall_s": time.time() - t_start}
    for n in names:
        m = mem[n]
        print(f"{n}: median {res['samples_per_s_median'][n]:.2f} samples/s over {args.rounds} rounds "
              f"(completion length {res['completion_len_last'][n]}) | peak RSS "
              f"{m['peak_rss_mb']:.0f} MB (after setup {m['rss_after_setup_mb']:.0f} MB, growth during steps "
              f"{m['step_growth_mb']:.0f} MB)", flush=True)
    for n, txt in profiles.items():
        print(f"--- profile {n} ---\n{txt}")
    ratios = {}
    for n in names:
        if n.startswith("ours"):
            paired = [a / b for a, b in zip(sps[n], sps["trl"])]
            ratios[n] = statistics.median(paired)
            # cross-check: process CPU time per step (what the load does not inflate; includes helper threads)
            cpu = [b / a for a, b in zip(res["cpu_s_per_step"][n], res["cpu_s_per_step"]["trl"])]
            res[f"speedup_{n}_vs_trl"] = {"median": ratios[n], "paired": paired, "cpu_median": statistics.median(cpu),
                                          "cpu_paired": cpu,
                                          "peak_rss_ratio": mem[n]["peak_rss_mb"] / mem["trl"]["peak_rss_mb"]}
            print(f"{n} vs trl: paired wall {ratios[n]:.2f}x {[round(x, 2) for x in paired]}, paired CPU time "
                  f"{statistics.median(cpu):.2f}x, vision patches/step {res['vision_patches_per_step'][n]} vs "
                  f"{res['vision_patches_per_step']['trl']}, peak RSS {res[f'speedup_{n}_vs_trl']['peak_rss_ratio']:.2f}x "
                  "TRL's", flush=True)
    head = "ours" if "ours" in ratios else next(iter(ratios))
    res["headline_worker"] = head
    res["trl_speedup"] = ratios[head]
    for n, v in ratios.items():
        if n != head:
            print(f"trl_speedup_{n}={v:.2f}")
    common.emit(res, args.json, ("trl_speedup", ratios[head]))
    return res


if __name__ == "__main__":
    main()
