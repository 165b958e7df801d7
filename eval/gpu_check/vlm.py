"""VLM sections: Qwen2.5-VL at the released widths (random weights), bf16, SDPA, the real Qwen tokenizer and chat
template, one video prompt, G rollouts; one GRPO step through the project's trainer (``GRPOTrainer`` built from
the same ``key=value`` config ``mmgrpo train`` parses, loading the checkpoint folder with ``load_policy``), LoRA and
full fine-tuning; then TRL's ``GRPOTrainer`` side by side on the same model, prompt and G.

Per step (step 0 warms up and runs the step-0 on-policy check; step 1 is the steady state reported): seconds per
phase (generation, the step-0 on-policy check, old / reference log-probs, forward+backward, optimizer, the rest:
rewards, advantages, batching), generated tokens/s, MFU of the forward+backward phase (:mod:`.common` gives the
formula), peak memory against the planner's prediction for the same setting (``mmgrpo.utils.memory_plan.plan``,
what ``mmgrpo plan`` prints).
"""
from __future__ import annotations

import gc
import time

from .common import (GiB, Ctx, PhaseTimer, peak_memory, planner_comparison, reset_peak_memory, synthetic_video_sample,
                     text_reward, timed, vlm_folder, vlm_step_flops)


def vlm_build(ctx: Ctx) -> None:
    """Build the checkpoint folder the other VLM sections load (their own call builds it if this one failed)."""
    import json

    folder = vlm_folder(ctx)
    ctx.put(**json.loads((folder / "built.json").read_text()))


def _overrides(ctx: Ctx, mode: str, dtype: str, extra=()) -> list[str]:
    v = ctx.p["vlm"]
    px = v["height"] * v["width"]
    return [f"model.path={vlm_folder(ctx)}", "model.family=qwen2_5_vl", f"model.dtype={dtype}",
            "model.attn_implementation=sdpa", "model.gradient_checkpointing=true",
            f"model.lora.enabled={'true' if mode == 'lora' else 'false'}", "model.lora.rank=16", "model.lora.alpha=32",
            "data.task=tvg", "data.prompt_mode=think", f"data.video_min_pixels={px}", f"data.video_max_pixels={px}",
            "data.video_total_pixels=1e12", f"data.max_frames={v['frames']}", f"data.min_frames={v['frames']}",
            f"rollout.group_size={v['G']}", f"rollout.max_new_tokens={v['T']}",
            f"rollout.generation_batch_size={v['G']}", "run.prompts_per_device=1", f"run.micro_batch_size={v['G']}",
            "algo.kl_coef=0.04", "optim.lr=1e-6", "optim.max_grad_norm=1.0",
            f"run.output_dir={ctx.work_dir / f'run_{ctx.name}'}", "run.tensorboard=false", "run.save_every=0",
            "run.resume_from=none", "run.progress_bar=false", f"run.device={ctx.device}", "run.max_steps=1000",
            "data.prefetch=0", *extra]


def _model_shape(model) -> dict:
    """Parameter counts the FLOP formula needs (base weights only: LoRA adapters excluded)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    tc = base.config.text_config
    layers = base.model.language_model.layers
    n_layers = sum(p.numel() for n, p in layers.named_parameters() if "lora_" not in n)
    n_vis = sum(p.numel() for n, p in base.model.visual.named_parameters() if "lora_" not in n)
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    return {"n_layer_params": n_layers, "n_vis_params": n_vis, "hidden": tc.hidden_size, "vocab": tc.vocab_size,
            "layers": tc.num_hidden_layers, "attn_dim": tc.num_attention_heads * head_dim}


def _grpo_steps(ctx: Ctx, mode: str) -> None:
    import torch

    import mmgrpo.vlm.train.steps as stages
    import mmgrpo.vlm.train.trainer as recipe
    from mmgrpo.utils.config import load_config
    from mmgrpo.utils.memory_plan import get_spec, plan
    from mmgrpo.vlm.memory_plan import counts
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    v = ctx.p["vlm"]
    on_gpu = ctx.device == "cuda"
    extra = []
    if mode == "full":
        # fp32 master weights (the default) for a full fine-tune of this size on one device: ask the planner first
        total = torch.cuda.mem_get_info()[1] if on_gpu else 139 * GiB
        est_p = (v["frames"] // 2) * (v["height"] // 28) * (v["width"] // 28) + 140
        pm = plan(v["spec"], n=counts(get_spec(v["spec"]), v["layers"], 16), full=True, rows=v["G"], prompt_tokens=est_p,
                  completion_len=v["T"], fp32_master_weights=True, reference=True, gpu=on_gpu)
        fits = pm["total"] <= total
        ctx.put(full_ft_with_fp32_masters={"planner_gib": pm["total"] / GiB, "device_gib": total / GiB, "fits": fits})
        if not fits:
            extra.append("optim.fp32_master_weights=false")
            ctx.log(f"full fine-tune with fp32 masters: planner {pm['total'] / GiB:.1f} GiB > {total / GiB:.1f} GiB "
                    "-> optim.fp32_master_weights=false")
    cfg = load_config(TrainConfig, None, _overrides(ctx, mode, v["dtype"], extra))
    t0 = time.perf_counter()
    tr = GRPOTrainer(cfg, samples=[synthetic_video_sample(v["frames"], v["height"], v["width"])],
                     reward_fn=text_reward)
    ctx.put(mode=mode, load_seconds=time.perf_counter() - t0, logprob_impl=tr.logprob_impl,
            trainable_params=sum(p.numel() for p in tr.params), fp32_master_weights=cfg.optim.fp32_master_weights)
    timer = PhaseTimer()
    tr.backend.generate = timer.wrap("generation", tr.backend.generate)
    # the recipe's stage functions, timed where the loop looks them up (restored below)
    real = {(recipe, "precompute"): recipe.precompute, (stages, "_micro_step"): stages._micro_step,
            (stages, "_apply_update"): stages._apply_update, (tr.onpolicy, "check"): tr.onpolicy.check}
    for (mod, name), fn in real.items():
        label = {"precompute": "old_ref_logprobs", "_micro_step": "forward_backward", "_apply_update": "optimizer",
                 "check": "onpolicy_check"}[name]
        setattr(mod, name, timer.wrap(label, fn))
    try:
        shape = _model_shape(tr.model)
        steps = []
        for step in range(v["steps"]):
            if step and ctx.time_left() < 1.2 * steps[0]["step_seconds"]:
                ctx.log("no time left for the steady-state step: reporting step 0 only")
                break
            reset_peak_memory(on_gpu)
            wall: dict = {}
            with timed(wall, "step"):
                m = tr.train(steps=1)[-1]
            ph = timer.take()
            ph["other"] = wall["step"] - sum(ph.values())
            rb = tr.state.batch
            P = int(rb.items[0]["input_ids"].shape[-1])
            T = int(rb.completion_mask.shape[1])
            vid = rb.items[0].get("pixel_values_videos")
            fl = vlm_step_flops(prompt_tokens=P, rows=rb.n, completion_len=T,
                                vision_patches=int(vid.shape[0]) if vid is not None else 0,
                                shared_prefix=tr.logprob_impl == "prefix_group", **shape)
            t_fb = ph.get("forward_backward", float("nan"))
            gen_tok = float(rb.completion_mask.sum())
            rec = {"step": step, "step_seconds": wall["step"], "phases_seconds": ph, "prompt_tokens": P,
                   "video_tokens": int((rb.items[0]["input_ids"] == tr.tok.convert_tokens_to_ids("<|video_pad|>")).sum()),
                   "rows": rb.n, "completion_len": T, "generated_tokens": gen_tok,
                   "generated_tokens_per_s": gen_tok / ph["generation"] if ph.get("generation") else None,
                   "loss": m.get("train/loss"), "grad_norm": m.get("train/grad_norm"), "flops": fl,
                   "achieved_tflops": fl["model_flops"] / t_fb / 1e12,
                   "mfu": fl["model_flops"] / (t_fb * ctx.peak_tflops * 1e12) if on_gpu else None,
                   "mfu_lora_work": (fl["lora_work_flops"] / (t_fb * ctx.peak_tflops * 1e12)
                                     if on_gpu and mode == "lora" else None),
                   "memory": peak_memory(on_gpu)}
            pred = plan(v["spec"], n=counts(get_spec(v["spec"]), v["layers"], 16), full=mode == "full", rows=v["G"], prompt_tokens=P,
                        completion_len=T, fp32_master_weights=cfg.optim.fp32_master_weights,
                        logprob_chunk=cfg.algo.logprob_chunk_size, reference=mode == "full" and cfg.algo.kl_coef > 0,
                        gpu=on_gpu)
            rec["planner"] = planner_comparison(pred, rec["memory"], on_gpu)
            steps.append(rec)
            ctx.put(steps=steps, onpolicy=tr.onpolicy.stats, model_shape=shape)
            ctx.log(f"step {step}: {wall['step']:.1f} s " + ", ".join(f"{k} {s:.2f}" for k, s in ph.items())
                    + (f"; MFU {rec['mfu']:.3f}" if rec["mfu"] is not None else ""))
        last = steps[-1]
        ctx.put(headline={"step_seconds": last["step_seconds"], "generated_tokens_per_s": last["generated_tokens_per_s"],
                          "mfu": last["mfu"], "planner_error": last["planner"]["planner_error"],
                          "measured_gib": last["memory"]["measured_bytes"] / GiB,
                          "predicted_gib": last["planner"]["predicted_bytes"] / GiB})
    finally:
        for (mod, name), fn in real.items():
            setattr(mod, name, fn)
        del tr
        gc.collect()


def vlm_lora(ctx: Ctx) -> None:
    _grpo_steps(ctx, "lora")


def vlm_full(ctx: Ctx) -> None:
    _grpo_steps(ctx, "full")


# ------------------------------------------------------------------------------------------------ TRL side by side
def _image_sample(size: int) -> dict:
    from mmgrpo.vlm.models.tiny import synthetic_image

    return {"id": "gpu_check_image", "task": "mcq", "query": "which colour is the largest object in the picture?",
            "image": synthetic_image(0, size, size), "options": ["red", "green", "blue", "yellow"], "answer": "B"}


def _ours_image_steps(ctx: Ctx, dtype: str) -> dict:
    """Our trainer on the image prompt TRL can take (TRL's GRPOTrainer has no video input): LoRA, EOS suppressed in
    sampling so both trainers generate exactly T tokens per row."""
    from mmgrpo.utils.config import load_config
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.vlm.models.rollout import HFRolloutBackend
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    v = ctx.p["vlm"]
    px = v["image_size"] ** 2
    extra = ["data.task=mcq", "data.prompt_mode=no_think", f"data.image_min_pixels={px}", f"data.image_max_pixels={px}",
             "rollout.onpolicy_check=false"]  # EOS is suppressed below in sampling only: not the trained policy
    cfg = load_config(TrainConfig, None, _overrides(ctx, "lora", dtype, extra))
    tr = GRPOTrainer(cfg, samples=[_image_sample(v["image_size"])], reward_fn=text_reward)
    eos = [tr.tok.convert_tokens_to_ids("<|im_end|>"), tr.tok.convert_tokens_to_ids("<|endoftext|>")]
    tr.backend = HFRolloutBackend(tr.model, tr.policy.processor, list(tr.policy.suppress_token_ids) + eos,
                                  max_batch_size=v["G"], device=tr.device, shared_prefix=True)
    out = {"prompt_tokens": int(tr.task.prepare(tr.samples[0]).item["input_ids"].shape[-1]), "steps": []}
    for step in range(v["steps"]):
        wall: dict = {}
        with timed(wall, "step"):
            tr.train(steps=1)
        out["steps"].append({"step_seconds": wall["step"],
                             "completion_len": int(tr.state.batch.completion_mask.sum(1).max())})
    del tr
    gc.collect()
    return out


def _trl_steps(ctx: Ctx, dtype: str) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mmgrpo.vlm.models.adapters import get_adapter, vision_token_ids
    from mmgrpo.vlm.data.task import TaskAdapter

    from .common import sync

    v = ctx.p["vlm"]
    on_gpu = ctx.device == "cuda"
    folder = vlm_folder(ctx)
    processor = AutoProcessor.from_pretrained(folder)
    processor.tokenizer.padding_side = "left"
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=getattr(torch, dtype),
                                                               attn_implementation="sdpa").to(ctx.device)
    adapter = get_adapter("qwen2_5_vl")
    for n, p in model.named_parameters():  # as ours: the vision tower frozen
        if adapter.is_vision_param(n):
            p.requires_grad_(False)

    class DataCfg:  # what TaskAdapter.messages reads: our prompt, so both trainers see the same tokens
        task, prompt_mode, answer_format, query_position = "mcq", "no_think", "seconds", "after"

    s = _image_sample(v["image_size"])
    msgs = []
    for m in TaskAdapter(processor, adapter, DataCfg).messages(s):
        content = [{"type": "text", "text": m["content"]}] if isinstance(m["content"], str) else m["content"]
        msgs.append({"role": m["role"], "content": [{"type": "image"} if c.get("type") == "image" else c
                                                     for c in content]})
    ds = Dataset.from_list([{"prompt": msgs, "image": s["image"]}] * 8)
    eos = [processor.tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
    args = GRPOConfig(
        output_dir=str(ctx.work_dir / "trl_out"), use_cpu=not on_gpu, bf16=on_gpu, fp16=False,
        gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False}, report_to="none",
        save_strategy="no", per_device_train_batch_size=v["G"], gradient_accumulation_steps=1,
        num_generations=v["G"], max_completion_length=v["T"], max_steps=v["steps"], learning_rate=1e-6, weight_decay=0.0,
        max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0, optim="adamw_torch", temperature=1.0,
        top_p=1.0, top_k=0, beta=0.04, num_iterations=1, loss_type="dapo", logging_steps=1, disable_tqdm=True,
        seed=0, dataloader_num_workers=0,
        generation_kwargs={"suppress_tokens": vision_token_ids(processor.tokenizer) + eos})
    lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, bias="none",
                      target_modules=adapter.lora_target_regex(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                "up_proj", "down_proj"]))
    steps: list[dict] = []
    t_begin = [0.0]

    class Timer(TrainerCallback):
        def on_step_begin(self, a, st, control, **kw):
            sync()
            t_begin[0] = time.perf_counter()

        def on_step_end(self, a, st, control, **kw):
            sync()
            steps.append({"step_seconds": time.perf_counter() - t_begin[0]})

    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [float(sum(map(ord, str(c))) % 7) / 6
                                                                             for c in completions],
                          args=args, train_dataset=ds, processing_class=processor, peft_config=lora,
                          callbacks=[Timer()])
    trainer.train()
    from trl.data_utils import prepare_multimodal_messages

    text = processor.apply_chat_template(prepare_multimodal_messages(msgs, images=[s["image"]]),
                                         add_generation_prompt=True, tokenize=False)
    P = int(processor(text=[text], images=[s["image"]], return_tensors="pt")["input_ids"].shape[1])
    import trl

    out = {"prompt_tokens": P, "steps": steps, "trl_version": trl.__version__,
           "trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)}
    del trainer, model
    gc.collect()
    return out


def trl_side_by_side(ctx: Ctx) -> None:
    """Our LoRA step and TRL's on the same checkpoint, image prompt, G and T; ratio = TRL step time / ours (steady
    state: the second step of each)."""
    try:
        import trl  # noqa: F401
        from datasets import Dataset  # noqa: F401
    except ImportError as e:
        ctx.put(skipped=f"TRL unavailable here ({type(e).__name__}: {e}); carry its wheels (scripts/gpu_wheels.txt)")
        return
    import torch

    dtype = ctx.p["vlm"]["dtype"]
    ours = _ours_image_steps(ctx, dtype)
    ctx.put(ours=ours)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    theirs = _trl_steps(ctx, dtype)
    ctx.put(trl=theirs)
    if theirs["prompt_tokens"] != ours["prompt_tokens"]:
        ctx.put(warning=f"prompt tokens differ: ours {ours['prompt_tokens']}, TRL {theirs['prompt_tokens']}")
    ratio = theirs["steps"][-1]["step_seconds"] / ours["steps"][-1]["step_seconds"]
    ctx.put(headline={"trl_step_seconds": theirs["steps"][-1]["step_seconds"],
                      "ours_step_seconds": ours["steps"][-1]["step_seconds"], "trl_over_ours": ratio,
                      "prompt_tokens": ours["prompt_tokens"]})
    ctx.log(f"TRL {theirs['steps'][-1]['step_seconds']:.2f} s/step, ours {ours['steps'][-1]['step_seconds']:.2f}: "
            f"{ratio:.2f}x")
