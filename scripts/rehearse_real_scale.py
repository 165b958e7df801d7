#!/usr/bin/env python
"""Real-width, truncated-depth rehearsal of one GRPO step (issue 17 item 2), on CPU, in bf16.

    python scripts/rehearse_real_scale.py --model qwen2.5-vl-7b --layers 2 --json runs/rs/q7b_2.json
    python scripts/rehearse_real_scale.py --model qwen2.5-vl-7b --layers 1 --build-only runs/rs/qwen2.5-vl-7b_1

``--build-only DIR`` writes only the model folder (step 1 below) into DIR and prints it: a real-width, depth-cut
checkpoint for rehearsing a whole run on CPU (``model.path=DIR`` / ``model.pipeline_dir=DIR``; docs/experiments.md,
"CPU rehearsal"). ``mmgrpo plan`` / ``flow_grpo plan`` and the trainers' memory check read its widths and depth.
A ``NAME/K`` model (every width divided by K) is a CI-sized code path, not a released model: the planner has no
measured figures for it and says "widths match none of the released models".

For each released model in :data:`mmgrpo.utils.memory_plan.MODELS` (config figures copied from the public
config.json files, see that module): every width, head count, KV-head count, MLP size, vocabulary, MRoPE section,
window/full-attention layout, patch/merge size, ``axes_dims_rope``, ``joint_attention_dim`` and guidance embedding is
the release's; only the depth is cut to ``--layers`` (LLM layers and vision blocks; FLUX double *and* single blocks;
SD3 joint blocks; T5 / CLIP encoder layers).

1. ``build`` (fresh subprocess): random bf16 weights, ``save_pretrained(max_shard_size=...)`` as a sharded
   ``from_pretrained`` folder (VLM: + the real-vocabulary Qwen processor; flow: a diffusers pipeline folder);
2. ``step`` (fresh subprocess): imports, baseline RSS, load the folder through the trainers' real path
   (``load_policy`` / ``load_adapter``), then ONE full GRPO step of the project's own trainer
   (one step of ``GRPOTrainer.train`` on G=4 rollouts of one real-format 8-frame video prompt; one epoch of ``FlowGRPOTrainer.train``
   on G=4 512x512 images: rollout, reward, advantages, loss, backward, optimizer step), LoRA (or ``--full-finetune``),
   gradient checkpointing on.

Memory (Linux): ``baseline`` = VmRSS after the imports; ``measured_peak_bytes`` = VmHWM (peak RSS) of the step
phase minus the baseline -- VmHWM is reset (``/proc/self/clear_refs`` <- 5) after loading, right before the step;
``process_peak_bytes`` = ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` of the whole step subprocess (load included)
minus the baseline. ``predicted_peak_bytes`` is :func:`mmgrpo.utils.memory_plan.plan` for the same setting on CPU.
Rewards are a deterministic text / image statistic (random weights never answer correctly: a task reward would be
0 for every rollout and the step would train nothing).
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
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from eval.perf.common import reset_peak_rss  # noqa: E402 - after the repo is on sys.path

FRAMES, FRAME_PX = 8, 224  # 8 frames of 224x224 -> 4 temporal patches x 16x16 -> 256 LLM tokens (Qwen2/2.5-VL)
G = 4


# ------------------------------------------------------------------------------------------------ memory probes
def rss_bytes(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def touch_weights(*modules) -> None:
    """Read every parameter once: a GPU holds every weight, while on CPU a memory-mapped safetensors tensor only
    counts in RSS for the pages read (an embedding's unused rows would never count)."""
    import torch

    with torch.no_grad():
        for m in modules:
            for p in m.parameters():
                p.detach().float().sum() if p.numel() < 2 ** 26 else [c.float().sum() for c in p.detach().split(4096)]


def maxrss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


# ------------------------------------------------------------------------------------------------ build
def build_vlm(spec: dict, layers: int, out: Path, shard: str) -> dict:
    import torch

    from mmgrpo.vlm.models.real_tokenizer import build_qwen2_5_vl_processor, build_qwen_tokenizer
    from mmgrpo.vlm.models.tiny import model_class, vision_token_ids
    from mmgrpo.vlm.memory_plan import vlm_config

    cfg = vlm_config(spec, layers)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # build directly in bf16 (a 7B-width fp32 copy would double the peak)
    try:
        model = model_class(spec["family"])(cfg)
    finally:
        torch.set_default_dtype(prev)
    tok = build_qwen_tokenizer()
    proc = build_qwen2_5_vl_processor(tok) if spec["family"] != "qwen3_vl" else _qwen3_processor(tok)
    if spec["family"] == "qwen2_vl":  # same tokenizer, template and pixel settings; Qwen2-VL's processor class
        from transformers import Qwen2VLProcessor

        proc = Qwen2VLProcessor(image_processor=proc.image_processor, tokenizer=tok,
                                video_processor=proc.video_processor, chat_template=proc.chat_template)
    gc = model.generation_config
    gc.suppress_tokens = vision_token_ids(tok)
    gc.bos_token_id = gc.pad_token_id = tok.convert_tokens_to_ids("<|endoftext|>")
    gc.eos_token_id = [tok.convert_tokens_to_ids("<|im_end|>"), gc.pad_token_id]
    model.save_pretrained(out, max_shard_size=shard)
    proc.save_pretrained(out)
    return {"params": sum(p.numel() for p in model.parameters())}


def _qwen3_processor(tok):
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    from mmgrpo.vlm.models.real_tokenizer import QWEN2_5_VL_CHAT_TEMPLATE

    common = dict(size={"shortest_edge": 128 * 32 * 32, "longest_edge": 768 * 32 * 32}, patch_size=16, merge_size=2,
                  temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3)  # Qwen3-VL preprocessor
    return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(**common), tokenizer=tok,
                            video_processor=Qwen3VLVideoProcessor(**common), chat_template=QWEN2_5_VL_CHAT_TEMPLATE)


def build_flow(spec: dict, layers: int, out: Path, shard: str) -> dict:
    import torch

    from flow_grpo.memory_plan import flow_pipeline

    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        pipe = flow_pipeline(spec, layers)
    finally:
        torch.set_default_dtype(prev)
    pipe.to(torch.bfloat16)
    pipe.save_pretrained(out, max_shard_size=shard)
    return {"params": sum(p.numel() for p in pipe.transformer.parameters())}


# ------------------------------------------------------------------------------------------------ step
def _text_reward(texts, samples):
    import torch

    acc = torch.tensor([float(sum(map(ord, t)) % 7) / 6.0 for t in texts])
    return {"acc": acc, "total": acc.clone(), "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}


def _image_reward(images, prompts, metadata):
    import torch

    x = torch.as_tensor(images).float()
    return {"block": x[:, :64, :64].mean(dim=(1, 2, 3)) / 255.0}


def step_vlm(spec: dict, folder: Path, run_dir: Path, full: bool, max_new_tokens: int) -> dict:
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.vlm.models.tiny import synthetic_frames
    from mmgrpo.vlm.train.trainer import GRPOTrainer
    from mmgrpo.utils.config import load_config

    px = spec.get("frame_px", FRAME_PX)
    ov = [f"model.path={folder}", f"model.family={spec['family']}", "model.dtype=bfloat16",
          "model.gradient_checkpointing=true", f"model.lora.enabled={'false' if full else 'true'}",
          "data.task=tvg", "data.prompt_mode=no_think", f"data.video_min_pixels={px * px}",
          f"data.video_max_pixels={px * px}", f"rollout.group_size={G}",
          f"rollout.max_new_tokens={max_new_tokens}", "run.max_steps=2", "run.prompts_per_device=1",
          f"run.micro_batch_size={G}", "run.device=cpu", "optim.lr=1e-5", f"run.output_dir={run_dir}",
          "run.tensorboard=false", "run.save_every=0", "run.resume_from=none", "run.progress_bar=false"]
    cfg = load_config(TrainConfig, None, ov)
    sample = {"id": "v0", "task": "tvg", "query": "the person opens the door",
              "video": synthetic_frames(0, FRAMES, px, px), "meta": {"video_fps": 2.0},
              "duration": FRAMES / 2.0, "spans": [[1.0, 2.5]]}
    tr = GRPOTrainer(cfg, samples=[sample], reward_fn=_text_reward)
    touch_weights(tr.model)
    reset = reset_peak_rss()  # VmHWM := current RSS (eval/perf/common.py)
    t0 = time.perf_counter()
    m = tr.train(steps=1)[-1]
    sec = time.perf_counter() - t0
    rb = tr.state.batch
    prompt_tokens = int(rb.items[0]["input_ids"].shape[-1]) if rb.n else 0
    comp = int(rb.completion_mask.sum()) if rb.n else 0
    loss = m.get("train/loss", float("nan"))
    return {"loss": loss, "step_seconds": sec, "peak_reset": reset, "prompt_tokens": prompt_tokens,
            "completion_tokens": comp, "completion_len": int(rb.completion_mask.shape[1]) if rb.n else 0,
            "trainable_params": sum(p.numel() for p in tr.params),
            "updates": tr._applied_updates(), "metrics": {k: v for k, v in m.items() if k.startswith("train/")}}


def step_flow(spec: dict, folder: Path, run_dir: Path, full: bool, steps: int) -> dict:
    import torch

    from flow_grpo.config import load_train_config
    from flow_grpo.models import load_adapter
    from flow_grpo.train.trainer import FlowGRPOTrainer

    kind = spec["kind"]
    ad = load_adapter(str(folder), kind=kind, dtype=torch.bfloat16, max_sequence_length=spec["max_sequence_length"])
    ov = {"method": "flow", "model.dtype": "bfloat16", "model.gradient_checkpointing": "true",
          "model.lora.enabled": "false" if full else "true", "sample.num_steps": steps, "sample.height": 512,
          "sample.width": 512, "sample.batch_size": G, "sample.step_mode": "window", "sample.window_size": 1,
          "sample.window_range": "[0,1]", "sample.window_policy": "fixed",
          "sample.cfg": "true" if kind == "sd3" else "false",
          "sample.guidance_scale": 4.5 if kind == "sd3" else 3.5, "data.group_size": G, "data.groups_per_epoch": 1,
          "data.prompts": "[a photo of a cat on a red sofa]", "optim.lr": 1e-5, "optim.kl_coef": 0.0,
          "run.num_epochs": 1, "run.output_dir": str(run_dir), "run.save_every": 0, "run.image_grid_every": 0,
          "run.tensorboard": "false", "run.reward_curves": "false", "run.progress_bar": "false", "run.device": "cpu",
          "ema.enabled": "false", "reward.retry_backoff": 0.0, "reward.async_workers": 0}
    cfg = load_train_config(None, [f"{k}={v}" for k, v in ov.items()])
    tr = FlowGRPOTrainer(cfg, adapter=ad, reward_fn={"block": _image_reward})
    losses, real_loss = [], tr.loss

    def recording_loss(*args, **kw):  # the flow trainer logs no loss: record each micro-batch's
        out = real_loss(*args, **kw)
        losses.append(float(out[0].detach()))
        return out

    tr.loss = recording_loss
    touch_weights(*[m for m in (getattr(ad.pipe, k, None) for k in ("transformer", "vae", "text_encoder",
                    "text_encoder_2", "text_encoder_3")) if m is not None])
    reset = reset_peak_rss()  # VmHWM := current RSS (eval/perf/common.py)
    t0 = time.perf_counter()
    m = tr.train()[-1]  # the one epoch (and its LoRA export)
    sec = time.perf_counter() - t0
    loss = sum(losses) / len(losses) if losses else float("nan")
    return {"loss": loss, "step_seconds": sec, "peak_reset": reset, "updates": int(m.get("steps/applied", 0)),
            "trainable_params": sum(p.numel() for _, p in tr.named_params),
            "metrics": {k: float(v) for k, v in m.items() if isinstance(v, (int, float))}}


# ------------------------------------------------------------------------------------------------ driver
def _stage(a) -> dict:
    """Runs inside a fresh subprocess; returns the stage's JSON."""
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    from mmgrpo.utils.memory_plan import get_spec

    spec = get_spec(a.model)
    folder = Path(a.build_only) if a.build_only else Path(a.work) / "model"
    if a.stage == "build":
        t0 = time.perf_counter()
        fn = build_vlm if spec["type"] == "vlm" else build_flow
        info = fn(spec, a.layers, folder, a.max_shard_size)
        info["shards"] = sorted(p.name for p in folder.rglob("*.safetensors"))
        info["build_seconds"] = time.perf_counter() - t0
        return info
    import flow_grpo.train.trainer  # noqa: F401  (the imports count in the baseline, not in the peak)
    import mmgrpo.vlm.train.trainer  # noqa: F401
    import peft  # noqa: F401
    base = rss_bytes()
    t0 = time.perf_counter()
    if spec["type"] == "vlm":
        r = step_vlm(spec, folder, Path(a.work) / "run", a.full_finetune, a.max_new_tokens)
    else:
        r = step_flow(spec, folder, Path(a.work) / "run", a.full_finetune, a.sample_steps)
    r["load_and_step_seconds"] = time.perf_counter() - t0
    r["baseline_rss_bytes"] = base
    r["step_peak_bytes"] = rss_bytes("VmHWM") - base
    r["process_peak_bytes"] = maxrss_bytes() - base
    return r


def counts(spec: dict, layers: int | None = None) -> dict:
    """The parameter counts of ``spec`` cut to ``layers``, from its front-end's planner."""
    if spec["type"] == "vlm":
        from mmgrpo.vlm.memory_plan import counts as vlm_counts

        return vlm_counts(spec, layers)
    from flow_grpo.memory_plan import counts as flow_counts

    return flow_counts(spec, layers)


def fit(paths: list[str], fit_layers=(1, 2)) -> dict:
    """Activation constants per model from rehearsal JSONs: ``r(N) = (measured - static(N)) / tokens`` where static
    is the planner without activations; ``a_layer = r(2) - r(1)``, ``a_fixed = r(1) - a_layer`` (fitted on
    ``fit_layers`` only: the other depths are out-of-sample checks); then every run's planner error."""
    from mmgrpo.utils.memory_plan import get_spec, plan_rehearsal, rehearsal_tokens

    runs: dict[str, dict[int, dict]] = {}
    for p in paths:
        r = json.loads(Path(p).read_text())
        if r.get("step_ok"):
            runs.setdefault(r["model"] + (" full" if r.get("mode") == "full" else ""), {})[r["layers"]] = r
    out = {}
    zero = {"a_layer": 0.0, "a_fixed": 0.0}
    for key, by_n in runs.items():
        name = key.split()[0]
        spec = get_spec(name)
        res = {}
        for n, r in by_n.items():
            pr = plan_rehearsal(spec, counts(spec, n), r.get("mode") == "full", r["step"], activation=zero)
            toks = rehearsal_tokens(spec, r["step"])  # the rows x tokens `plan` multiplies the constants by
            res[n] = ((r["measured_peak_bytes"] - pr["total"]) / toks, toks, pr["total"])
        lo, hi = fit_layers
        depth = {n: counts(spec, n)["layers"] for n in res}  # planner layers (FLUX: double + single blocks)
        if lo in res and hi in res:
            a_layer = (res[hi][0] - res[lo][0]) / (depth[hi] - depth[lo])
        else:
            a_layer = 0.0
        first = min(res)
        a_fixed = res[first][0] - a_layer * depth[first]
        act = {"a_layer": round(a_layer, 1), "a_fixed": round(a_fixed, 1)}
        errs = {}
        for n, r in sorted(by_n.items()):
            pr = plan_rehearsal(spec, counts(spec, n), r.get("mode") == "full", r["step"], activation=act)
            errs[n] = {"measured": r["measured_peak_bytes"], "predicted": round(pr["total"]),
                       "error": round((pr["total"] - r["measured_peak_bytes"]) / r["measured_peak_bytes"], 4),
                       "error_without_activations": round(res[n][2] / r["measured_peak_bytes"] - 1, 4),
                       "tokens": res[n][1],
                       "in_sample": n in (lo, hi) and lo in res and hi in res}
        out[key] = {"activation": act, "runs": errs}
    return out


def refresh(paths: list[str]) -> None:
    """Recompute ``predicted_peak_bytes`` / ``planner_error`` / ``full_depth`` of result JSONs with the planner's
    current constants (after ``--fit`` figures were written into ``ACTIVATION_BYTES``)."""
    for p in paths:
        r = json.loads(Path(p).read_text())
        if "step" not in r:
            continue
        a = argparse.Namespace(model=r["model"], layers=r["layers"], full_finetune=r.get("mode") == "full")
        r.update(_predictions(a, r["step"]))
        Path(p).write_text(json.dumps(r, indent=1))


def main(argv=None) -> int:
    from mmgrpo.utils.memory_plan import MODELS, get_spec

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " (--fit RESULT.json ... : fit the "
                                "planner's activation constants from results and print every run's error)",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", required=True, help=f"released model whose widths are used: {', '.join(sorted(MODELS))}"
                   "; NAME/K divides every width by K (a CI-sized variant of the same code path)")
    p.add_argument("--layers", type=int, default=1, help="depth after truncation (every stack of the model)")
    p.add_argument("--json", default="", help="output JSON file (required unless --build-only)")
    p.add_argument("--build-only", default="", metavar="DIR",
                   help="only write the real-width, depth-cut model folder into DIR (no step, no JSON)")
    p.add_argument("--full-finetune", action="store_true", help="full fine-tuning instead of LoRA")
    p.add_argument("--work", default="", help="scratch folder (default: <json>.work); deleted unless --keep")
    p.add_argument("--keep", action="store_true", help="keep the saved checkpoint and run folder")
    p.add_argument("--max-shard-size", default="500MB", help="save_pretrained shard size")
    p.add_argument("--max-new-tokens", type=int, default=16, help="VLM: completion tokens per rollout")
    p.add_argument("--sample-steps", type=int, default=2, help="flow: denoising steps per rollout (1 trained)")
    p.add_argument("--stage", choices=["build", "step"], default=None, help=argparse.SUPPRESS)
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--fit":  # --fit RESULT.json ...: activation constants + planner errors
        print(json.dumps(fit(argv[1:]), indent=1))
        return 0
    if argv and argv[0] == "--refresh":  # --refresh RESULT.json ...: re-predict with the current constants
        refresh(argv[1:])
        return 0
    a = p.parse_args(argv)
    if a.layers < 1:
        p.error("--layers must be >= 1")
    if not a.json and not a.build_only:
        p.error("give --json OUT.json (build + one step) or --build-only DIR (the model folder only)")
    if a.build_only and not a.stage:
        return _build_only(a)
    work = Path(a.work or a.json + ".work")
    a.work = str(work)
    try:
        get_spec(a.model)
    except (KeyError, ValueError) as e:
        p.error(f"--model {a.model}: {e}")
    if a.stage:  # inner subprocess
        r = _stage(a)
        Path(a.json).write_text(json.dumps(r, indent=1))
        return 0
    import shutil

    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res: dict = {"model": a.model, "layers": a.layers, "mode": "full" if a.full_finetune else "lora",
                 "step_ok": False}
    base_cmd = [sys.executable, __file__, "--model", a.model, "--layers", str(a.layers), "--work", str(work),
                "--max-shard-size", a.max_shard_size, "--max-new-tokens", str(a.max_new_tokens),
                "--sample-steps", str(a.sample_steps)] + (["--full-finetune"] if a.full_finetune else [])
    try:
        for stage in ("build", "step"):
            out = work / f"{stage}.json"
            proc = subprocess.run(base_cmd + ["--stage", stage, "--json", str(out)], capture_output=True, text=True)
            if proc.returncode != 0:
                res["error"] = f"{stage} failed (exit {proc.returncode}): {proc.stderr[-3000:]}"
                break
            res[stage] = json.loads(out.read_text())
        else:
            st = res.pop("step")
            res.update(step_ok=bool(st.get("updates", 1)) and st["loss"] == st["loss"], loss=st["loss"],
                       measured_peak_bytes=st["step_peak_bytes"], process_peak_bytes=st["process_peak_bytes"],
                       step=st)
            try:
                res.update(_predictions(a, st))
            except Exception as e:  # keep the measurement even if the planner breaks
                res["prediction_error"] = repr(e)
    finally:
        res["seconds"] = time.perf_counter() - t0
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k not in ("step", "build", "full_depth")}))
    return 0 if res["step_ok"] else 1


def _build_only(a) -> int:
    """The build stage alone (a fresh subprocess, as in a rehearsal), into ``a.build_only``."""
    from mmgrpo.utils.memory_plan import get_spec

    try:
        spec = get_spec(a.model)
    except (KeyError, ValueError) as e:
        print(f"--model {a.model}: {e}", file=sys.stderr)
        return 2
    out = Path(a.build_only)
    if out.exists() and any(out.iterdir()):
        print(f"--build-only {out}: the folder exists and is not empty", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    info = out / ".build.json"
    cmd = [sys.executable, __file__, "--model", a.model, "--layers", str(a.layers), "--build-only", str(out),
           "--max-shard-size", a.max_shard_size, "--stage", "build", "--json", str(info)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"build failed (exit {proc.returncode}): {proc.stderr[-3000:]}", file=sys.stderr)
        return 1
    res = json.loads(info.read_text())
    info.unlink()
    key = "model.path" if spec["type"] == "vlm" else "model.pipeline_dir"
    print(json.dumps({"folder": str(out), "model": a.model, "layers": a.layers, **res}))
    width = f"1/{a.model.split('/', 1)[1]} of the real width" if "/" in a.model else "real width"
    print(f"{a.model} at {width}, {a.layers} layer(s), random bf16 weights: use {key}={out} "
          f"({'mmgrpo' if spec['type'] == 'vlm' else 'flow_grpo'} plan {key}={out} plans it)", file=sys.stderr)
    return 0


def _predictions(a, st: dict) -> dict:
    from mmgrpo.utils.memory_plan import get_spec, plan_full_depth, plan_rehearsal

    spec = get_spec(a.model)
    pr = plan_rehearsal(spec, counts(spec, a.layers), full=a.full_finetune, tokens=st)
    out = {"predicted_peak_bytes": pr["total"], "predicted_breakdown": pr,
           "planner_error": (pr["total"] - st["step_peak_bytes"]) / st["step_peak_bytes"],
           "full_depth": plan_full_depth(spec, counts(spec))}
    return out


if __name__ == "__main__":
    raise SystemExit(main())
