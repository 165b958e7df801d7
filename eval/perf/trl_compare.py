"""Benchmark ``trl_speedup``: end-to-end VLM GRPO steps/s, mmgrpo vs TRL's ``GRPOTrainer`` (images; TRL has no video).

Target (CPU): ``trl_speedup >= 2`` at 256 new tokens, the default ``--T`` (the recipes sample 256-1,024; until
issue #42 the default was 64, where prefix sharing gains most: ``--T 64`` gives that point).  Measured 2.07-2.16
(paired wall; 1.95-2.02 CPU time) in two ``--quick --rounds 8`` runs at load 13-24: at the target, without margin
(docs/performance.md, "Operating points").  Every ratio is printed
with its operating point (prompt and new tokens, B x G, model width / depth / vocabulary, dtype, threads).

Workers (one subprocess each, so peak RSS is per trainer; they wait on stdin while another one runs):

* ``ours``       -- ``mmgrpo.vlm.train.trainer.GRPOTrainer.train(steps=1)`` with its defaults
                    ``run.logprob_impl=prefix_group`` (``mmgrpo.vlm.models.prefix_group``: each prompt encoded once
                    per group in the loss) and ``rollout.shared_prefix=true`` (each prompt prefilled once while
                    sampling);
* ``ours_naive`` -- the same trainer with ``run.logprob_impl=naive`` and ``rollout.shared_prefix=false`` (prompt
                    repeated G times in sampling and loss, as TRL does);
* ``trl``        -- ``trl.GRPOTrainer.train()``, stepped by a callback that reports and blocks between rounds.

What each worker actually did is checked every round from its own counts, not from its settings
(``SamplingProbe``: forward hooks on the vision tower and the language model while sampling): ``ours`` must encode
and prefill each prompt once per step, ``ours_naive`` and ``trl`` G times; every worker must feed token for token
the same prompt (read from the ``generate`` call itself: TRL's chat template is not rebuilt here) and sample
exactly T tokens; the ``ours*`` workers must run the log-prob path they are named for.  A mismatch stops the run.
(Until issue #42 ``ours_naive`` still shared the prefix while sampling: its backend got no ``shared_prefix=False``.)

Same for all: the model folder (random ``tiny`` or ``mid`` Qwen2.5-VL saved once, vocabulary 320; vision tower
frozen, LLM fully trained, fp32, sdpa, CPU), the processor, the prompts (our ``TaskAdapter`` messages, fed to TRL
as its conversational ``prompt`` column with the image in its ``image`` column; the 16 samples differ only in their
image), B prompts x G completions per step, exactly T completion tokens (EOS and vision tokens suppressed while
sampling, in both), temperature 1, AdamW (torch, lr 1e-5, no weight decay, constant lr, grad-norm clip 1.0), no KL /
reference (TRL default beta=0), one optimizer update per generation batch (num_iterations 1), token-mean loss (TRL
"dapo"), the same cheap text reward.  Threads: ``--threads`` in every worker.

Protocol: warm-up steps, then ``--rounds`` rounds; in each round every worker runs ``--steps`` steps, one
worker after the other, the order rotating.  samples/s = B*G*steps / wall time of the round (generation,
rewards, forward/backward, optimizer, the trainer's own logging).  Headline = median over rounds of the paired
ratio ours/trl; printed LAST as ``trl_speedup=X.XX``.  Cross-checks printed and in the JSON: the paired ratio of
process CPU time per step (``time.process_time``: not inflated by other jobs on a loaded machine; includes helper
threads such as our media prefetch), and the vision-tower patches each worker encodes per step.  Peak memory: each
worker's ``ru_maxrss`` (whole process life, includes imports) and its peak RSS growth over the training steps
(VmHWM after setup).

Modes: full (default) = mid model, 8 rounds of 1 step, all three workers; ``--quick`` = tiny model, 3 rounds,
workers ours and trl only; ``--smoke`` = tiny, 1 round, T=16, no warm-up, ours and trl (checks that it runs).
``--workers`` overrides the worker set.

    python eval/perf/trl_compare.py [--quick | --smoke] [--model mid|tiny] [--T 256] [--json out.json] [--profile]
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
TARGET_SPEEDUP, TARGET_NEW_TOKENS = 2.0, 256  # issue #42: where the recipes sample (256-1,024 new tokens)
TAG = "@@"  # result lines on a worker's stdout (libraries may print there too)


# ============================================================================================== shared setup
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny model, 3 rounds (default: mid, 8) of 1 step per worker")
    p.add_argument("--smoke", action="store_true", help="tiny model, 1 round, T=16, no warm-up")
    p.add_argument("--model", choices=["tiny", "mid"], default=None, help="default mid (tiny with --quick/--smoke)")
    p.add_argument("--B", type=int, default=2, help="prompts per step")
    p.add_argument("--G", type=int, default=8, help="completions per prompt")
    p.add_argument("--T", type=int, default=None, help="completion tokens, exact: EOS is suppressed (default 256, the "
                                                       "target's operating point; 16 with --smoke; 64 until issue #42)")
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
    a.T = a.T or (16 if a.smoke else TARGET_NEW_TOKENS)
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
    """Multiple-choice image prompts (the trainer's canonical sample dicts).  Only the image differs between them:
    the two trainers draw the samples in different orders, and with the same text every prompt is the same token
    sequence (image tokens included), so the harness can check token for token that both feed the same prompt.
    (Until issue #42 the text named the sample's number, and numbers 10-15 are one token longer.)"""
    from mmgrpo.vlm.models.tiny import synthetic_image

    return [{"id": f"img{i}", "task": "mcq", "query": "which colour is the object in the picture?",
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
    visual = _visual(model)
    seen = [0]

    def hook(module, args, kwargs):
        x = args[0] if args else kwargs.get("hidden_states")
        seen[0] += int(x.shape[0])

    visual.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def _visual(model):
    return model.model.visual if hasattr(model, "model") and hasattr(model.model, "visual") else model.visual


class SamplingProbe:
    """What a worker's sampling actually computed, counted by forward pre-hooks while ``active`` (inside the
    wrapped generate call): vision-tower patches, and tokens through the language model (batch x length of every
    LLM forward: prefill rows x prompt length, then one token per row per decode step).  Also records the first
    prompt row it was fed (token ids, left padding removed) and the image patches per prompt.

    The harness reads prefix sharing from these counts (``sampling_work``), not from a config flag: a worker that
    claims to repeat its prompts but prefills each once is caught."""

    def __init__(self, model):
        self.active = False
        self.patches = 0
        self.llm_tokens = 0
        self.first_prompt: list | None = None
        self.patches_per_prompt: int | None = None
        _visual(model).register_forward_pre_hook(self._on_visual, with_kwargs=True)
        model.model.language_model.register_forward_pre_hook(self._on_llm, with_kwargs=True)

    def _on_visual(self, module, args, kwargs):
        if self.active:
            x = args[0] if args else kwargs.get("hidden_states")
            self.patches += int(x.shape[0])

    def _on_llm(self, module, args, kwargs):
        if self.active:
            x = kwargs.get("inputs_embeds")
            x = x if x is not None else (kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0])
            self.llm_tokens += int(x.shape[0]) * int(x.shape[1])

    def record_prompt(self, input_ids, attention_mask=None, pixel_rows: int | None = None, prompts: int = 1):
        if self.first_prompt is None:
            ids = input_ids[0] if attention_mask is None else input_ids[0][attention_mask[0].bool()]
            self.first_prompt = [int(t) for t in ids.tolist()]
            if pixel_rows is not None:
                self.patches_per_prompt = int(pixel_rows) // max(1, int(prompts))

    def wrap(self, fn):
        import functools

        @functools.wraps(fn)
        def inner(*a, **k):
            self.active = True
            try:
                return fn(*a, **k)
            finally:
                self.active = False
        return inner

    def counts(self) -> tuple[int, int]:
        return self.patches, self.llm_tokens


def sampling_work(rep: dict, B: int, G: int) -> dict:
    """Per step, from a worker's probe counts (``SamplingProbe``): how many times the vision tower encoded a prompt
    and how many prompt prefills went through the LLM while sampling.  Decoding exactly T tokens feeds N = B*G rows
    one token for each of T-1 steps (the last sampled token is never fed back), the rest of the LLM tokens are
    prefills of the P-token prompt: B of each when the prefix is shared, B*G when the prompt is repeated."""
    N, T, P = B * G, int(rep["completion_tokens"]), int(rep["prompt_tokens"])
    return {"prompt_encodings": rep["sampling_vision_patches"] / max(1, rep["patches_per_prompt"]),
            "prompt_prefills": (rep["sampling_llm_tokens"] - N * (T - 1)) / P}


def check_sampling(name: str, rep: dict, B: int, G: int) -> dict:
    """``ours`` must prefill and encode each prompt once (B per step), ``ours_naive`` and ``trl`` G times (B*G):
    raises SystemExit naming the worker when what it did differs from what it is called."""
    work = sampling_work(rep, B, G)
    want = B if name == "ours" else B * G
    if abs(work["prompt_encodings"] - want) > 1e-6 or abs(work["prompt_prefills"] - want) > 1e-6:
        what = "shares the prompt prefix" if name != "ours" else "repeats the prompt"
        raise SystemExit(f"worker {name} {what} while sampling: per step it encoded {work['prompt_encodings']:g} "
                         f"prompts in the vision tower and prefilled {work['prompt_prefills']:g} prompts, expected "
                         f"{want} of each (B={B}, G={G}; counts {rep})")
    return work


def profile_step(step_fn, top: int = 40) -> str:
    pr = new_profiler()
    pr.enable()
    step_fn()
    pr.disable()
    return profile_text(pr, top)


# ============================================================================================== ours
def build_ours(args, grouped: bool):
    """The ``ours`` (grouped=True) or ``ours_naive`` (False) trainer of this benchmark, with a ``SamplingProbe`` on
    its policy and its backend's ``generate`` wrapped by it.  Returns (trainer, backend, probe, out_dir)."""
    import torch

    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.vlm.models.adapters import load_policy
    from mmgrpo.vlm.models.rollout import HFRolloutBackend
    from mmgrpo.vlm.train.trainer import GRPOTrainer
    from mmgrpo.utils.config import load_config

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
    # sampling suppresses EOS (exactly T tokens, as TRL's side): slightly off the scored policy, which the step-0
    # on-policy check would rightly refuse
    overrides.append("rollout.onpolicy_check=false")
    # ours_naive: the prompt repeated G times while sampling too (ours: the trainer's default, true)
    overrides.append(f"rollout.shared_prefix={'true' if grouped else 'false'}")
    overrides += [x.strip() for x in args.ours_set.split(",") if x.strip()]
    cfg = load_config(TrainConfig, None, overrides)
    policy = load_policy(args.model_dir, dtype="float32", freeze_vision=True, attn_implementation="sdpa")
    eos = policy.tokenizer.convert_tokens_to_ids("<|im_end|>")
    # the backend gets the config's setting, whatever it is (before issue #42 a False was dropped here and the
    # backend's default, shared, ran: "naive" sampling shared the prefix); the probe below checks what ran
    backend = HFRolloutBackend(policy.model, policy.processor, list(policy.suppress_token_ids) + [eos],
                               max_batch_size=rows, shared_prefix=cfg.rollout.shared_prefix)
    probe = SamplingProbe(policy.model)

    def record(prompts, *a, **k):
        it = prompts[0]
        probe.record_prompt(it["input_ids"], it.get("attention_mask"),
                            None if it.get("pixel_values") is None else it["pixel_values"].shape[0])
        return generate(prompts, *a, **k)

    generate = backend.generate
    backend.generate = probe.wrap(record)

    def reward_fn(texts, samples_):
        r = torch.tensor([reward_value(t) for t in texts])
        return {"acc": r, "total": r.clone(), "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}

    tr = GRPOTrainer(cfg, samples=samples(16, args.image_size), policy=policy, reward_fn=reward_fn, backend=backend)
    return tr, backend, probe, out_dir


def ours_steps(tr, backend, probe, patches: list, k: int) -> dict:
    """Run k training steps of an ``ours*`` trainer; the worker's report: timings, the log-prob path that ran and
    what sampling computed (the probe's counts, checked by ``check_sampling``)."""
    t0, c0, p0, (s0, l0) = time.perf_counter(), time.process_time(), patches[0], probe.counts()
    for _ in range(k):
        m = tr.train(steps=1)[-1]
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    s1, l1 = probe.counts()
    rb = tr.state.batch
    return {"event": "done", "steps": k, "seconds": dt, "cpu_seconds": cpu, "samples": k * rb.n,
            "logprob_impl": tr.logprob_impl, "shared_prefix": bool(getattr(backend, "shared_prefix", False)),
            "vision_patches_per_step": (patches[0] - p0) / k,
            "sampling_vision_patches": (s1 - s0) / k, "sampling_llm_tokens": (l1 - l0) / k,
            "patches_per_prompt": probe.patches_per_prompt, "first_prompt": probe.first_prompt,
            "prompt_tokens": len(probe.first_prompt), "completion_tokens": int(rb.completion_ids.shape[1]),
            "completion_len": m.get("completions/mean_length", 0.0)}


def worker_ours(args, grouped: bool) -> None:
    import torch

    common.set_threads(args.threads)
    tr, backend, probe, out_dir = build_ours(args, grouped)
    common.set_threads(args.threads)
    patches = count_vision_patches(tr.policy.model)
    n_train = int(sum(p.numel() for p in tr.params))
    rss_setup = common.rss_mb()
    common.reset_peak_rss()
    say({"event": "ready", "trainable_params": n_train, "threads": torch.get_num_threads()})
    last = None
    while True:
        cmd, k = read_command()
        if cmd == "run":
            rep = ours_steps(tr, backend, probe, patches, k)
            last = rep["completion_len"]
            say(rep)
        elif cmd == "profile":
            say({"event": "profile", "text": profile_step(lambda: tr.train(steps=1))})
        else:
            say({"event": "bye", "completion_len": last, **memory_report(rss_setup)})
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
    # what TRL feeds its sampler, read from its own generate call (not rebuilt here: a rebuild can differ by a token)
    probe = SamplingProbe(model)
    generate = model.generate

    def record(*a, **k):
        ids = k.get("input_ids", a[0] if a else None)
        pv = k.get("pixel_values")
        probe.record_prompt(ids, k.get("attention_mask"), None if pv is None else pv.shape[0], ids.shape[0])
        return generate(*a, **k)

    model.generate = probe.wrap(record)

    class Control(TrainerCallback):
        def _wait(self, control):
            cmd, k = read_command()
            if cmd == "run":
                state["target"] = state["done"] + k
                state["t0"], state["c0"], state["p0"] = time.perf_counter(), time.process_time(), patches[0]
                state["probe0"] = probe.counts()
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
            say({"event": "ready", "trainable_params": n_train, "threads": torch.get_num_threads()})
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
                    (s0, l0), (s1, l1) = state["probe0"], probe.counts()
                    say({"event": "done", "steps": k, "seconds": dt, "cpu_seconds": cpu, "samples": k * args.B * args.G,
                         "vision_patches_per_step": (patches[0] - state["p0"]) / k,
                         "sampling_vision_patches": (s1 - s0) / k, "sampling_llm_tokens": (l1 - l0) / k,
                         "patches_per_prompt": probe.patches_per_prompt, "first_prompt": probe.first_prompt,
                         "prompt_tokens": len(probe.first_prompt), "completion_tokens": args.T,
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
        print(f"{n}: ready ({ready[n]['trainable_params']/1e6:.2f}M trainable, {ready[n]['threads']} threads)",
              flush=True)
    if len({r["trainable_params"] for r in ready.values()}) != 1:
        raise SystemExit(f"workers disagree on the trainable parameters: {ready}")
    per = {n: [] for n in names}
    checked: dict = {}

    def check(n: str, res: dict) -> None:
        """What the worker did, from its own counts: log-prob path, prefix sharing while sampling, the prompt it
        fed (token for token the same in every worker) and exactly T completion tokens."""
        if n.startswith("ours"):
            expected = "prefix_group" if n == "ours" else "naive"
            if res.get("logprob_impl") != expected:
                raise SystemExit(f"worker {n} ran the {res.get('logprob_impl')} log-prob path, expected {expected} "
                                 f"(see the trainer's log in {workers[n].log.name})")
        checked[n] = check_sampling(n, res, args.B, args.G)
        ref = next(iter(checked))
        first = per[ref][0]["first_prompt"] if per[ref] else res["first_prompt"]
        if res["first_prompt"] != first:
            i = next((i for i, (a, b) in enumerate(zip(first, res["first_prompt"])) if a != b), min(len(first), len(res["first_prompt"])))
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(args.model_dir)
            raise SystemExit(f"workers {ref} and {n} feed different prompts: {len(first)} vs "
                             f"{len(res['first_prompt'])} tokens, first difference at token {i}: "
                             f"{tok.decode(first[max(0, i - 8):i + 8])!r} vs "
                             f"{tok.decode(res['first_prompt'][max(0, i - 8):i + 8])!r}")
        if res.get("completion_len") is not None and abs(float(res["completion_len"]) - args.T) > 1e-6:
            raise SystemExit(f"worker {n} sampled {res['completion_len']} tokens on average, expected exactly {args.T}")

    for n in names:
        if args.warmup:
            w = workers[n].run(args.warmup)
            check(n, w)
            print(f"{n}: " + (f"log-prob path {w['logprob_impl']}, " if "logprob_impl" in w else "")
                  + f"per step while sampling {checked[n]['prompt_encodings']:g} prompt encodings and "
                  f"{checked[n]['prompt_prefills']:g} prefills of the {w['prompt_tokens']}-token prompt", flush=True)
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            res = workers[n].run(args.steps)
            check(n, res)
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
    sps = {n: [x["samples"] / x["seconds"] for x in per[n]] for n in names}
    first = per[names[0]][0]
    size = common.vlm_size_info(args.model_dir) if os.path.exists(os.path.join(args.model_dir, "config.json")) else {}
    op = common.operating_point(
        prompt_tokens=first["prompt_tokens"], media="image",
        media_tokens=sum(t == size.get("image_token_id") for t in first["first_prompt"]) if size else None,
        new_tokens=args.T, B=args.B, G=args.G, model=f"{args.model} Qwen2.5-VL", hidden=size.get("hidden"),
        layers=size.get("layers"), vocab=size.get("vocab"), dtype="float32", threads=args.threads,
        extra="vision tower frozen, LLM fully trained")
    res = {"benchmark": "trl_compare", "command": common.command_line("trl_compare.py", argv or sys.argv[1:]),
           "machine": common.machine_info(), "model": args.model, "B": args.B, "G": args.G, "T": args.T,
           "image_size": args.image_size, "ours_set": args.ours_set, "rounds": args.rounds, "steps_per_round": args.steps,
           "operating_point": op, "sampling_work": checked,
           "prompt_tokens": first["prompt_tokens"], "trainable_params": ready[names[0]]["trainable_params"],
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
                  f"TRL's | at {op['text']}", flush=True)
    head = "ours" if "ours" in ratios else next(iter(ratios))
    res["headline_worker"] = head
    res["trl_speedup"] = ratios[head]
    if own_dir:
        import shutil

        shutil.rmtree(own_dir, ignore_errors=True)
    print(f"operating point: {op['text']}", flush=True)
    print(f"target (CPU): trl_speedup >= {TARGET_SPEEDUP} at {TARGET_NEW_TOKENS} new tokens; this run: "
          f"{ratios[head]:.2f} at {args.T}", flush=True)
    for n, v in ratios.items():
        if n != head:
            print(f"trl_speedup_{n}={v:.2f}")
    common.emit(res, args.json, ("trl_speedup", ratios[head]))
    return res


if __name__ == "__main__":
    main()
