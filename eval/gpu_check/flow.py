"""Flow sections: FLUX.1-dev (512^2, then 1024^2 if time allows), SD3.5-medium and Wan2.1-T2V-1.3B (a short clip)
at the released widths and depths with random weights, bf16, LoRA, Flow-GRPO-Fast (``method=fast``: CPS SDE on a
random window of 3 of 10 steps, only those trained), through one epoch of ``FlowGRPOTrainer.train`` (rollout with exact
per-step log-probs, VAE decode, reward, advantages, loss, backward, AdamW).

Reported: seconds per epoch (epoch 0 warms up; epoch 1 is the steady state) split into rollout and training,
images (videos) per second, the rollout's overhead over the bare diffusers pipeline (same transformer, steps, batch,
resolution, x_T and prompt embeddings; ODE Euler there, our SDE window + log-probs + recorded latents here), and
peak memory against ``flow_grpo plan``'s prediction (FLUX, SD3.5). The dry run builds the tiny pipelines of
:mod:`flow_grpo.models.tiny` instead.

Wan2.1-T2V-1.3B's widths come from its public ``transformer/config.json`` (``Wan-AI/Wan2.1-T2V-1.3B-Diffusers``):
30 layers, 12 heads x 128, FFN 8960, text 4096, freq 256, patch (1, 2, 2); text encoder umT5-XXL (d_model 4096,
d_ff 10240, 64 heads, 24 layers, vocabulary 256,384); ``AutoencoderKLWan``'s defaults are Wan2.1's VAE; scheduler
UniPC with flow sigmas, shift 3. No package ships umT5's SentencePiece model, so the prompt is tokenised with the
repository's T5-format Unigram tokenizer (ids inside the real vocabulary; the encoder's cost does not depend on it).
"""
from __future__ import annotations

import gc
import statistics
import time

from .common import (GiB, Ctx, PhaseTimer, default_dtype, image_reward, peak_memory, planner_comparison,
                     reset_peak_memory, sync, timed)

PROMPTS = ["a photo of a cat on a red sofa", "an astronaut riding a horse on the moon",
           "a bowl of fruit on a wooden table", "a lighthouse on a cliff at sunset"]

WAN_1_3B = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
                text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
UMT5_XXL = dict(d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=24, vocab_size=256384,
                feed_forward_proj="gated-gelu", relative_attention_num_buckets=32)


def _pipeline(ctx: Ctx, kind: str):
    """(pipeline, torch dtype, T5 tokens, spec name or None): the released architecture on the GPU, tiny on CPU."""
    import torch

    if ctx.dry_run:
        from flow_grpo.models.tiny import build_tiny_flux_pipeline, build_tiny_sd3_pipeline
        from flow_grpo.models.tiny_wan import build_tiny_wan_pipeline

        build = {"flux": build_tiny_flux_pipeline, "sd3": build_tiny_sd3_pipeline, "wan": build_tiny_wan_pipeline}
        return build[kind](0), torch.float32, 32, None
    torch.manual_seed(0)
    with torch.device(ctx.device), default_dtype(torch.bfloat16):
        if kind == "wan":
            pipe = _wan_pipeline()
            return pipe, torch.bfloat16, 512, None
        from flow_grpo.memory_plan import flow_pipeline
        from mmgrpo.utils.memory_plan import MODELS

        name = {"flux": "flux.1-dev", "sd3": "sd3.5-medium"}[kind]
        pipe = flow_pipeline(MODELS[name], None)
    return pipe, torch.bfloat16, MODELS[name]["max_sequence_length"], name


def _wan_pipeline():
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from flow_grpo.models.tiny import build_t5_unigram_tokenizer

    tok = build_t5_unigram_tokenizer(model_max_length=512)
    te = UMT5EncoderModel(UMT5Config(pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                                     decoder_start_token_id=tok.pad_token_id, **UMT5_XXL))
    sched = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0,
                                    num_train_timesteps=1000)
    return WanPipeline(tokenizer=tok, text_encoder=te, transformer=WanTransformer3DModel(**WAN_1_3B),
                       vae=AutoencoderKLWan(), scheduler=sched)


def _trainer(ctx: Ctx, kind: str, res: tuple[int, int], G: int, frames: int = 0):
    import torch

    from flow_grpo.config import load_train_config
    from flow_grpo.models import adapter_from_pipeline
    from flow_grpo.train.trainer import FlowGRPOTrainer

    t0 = time.perf_counter()
    pipe, dtype, msl, spec_name = _pipeline(ctx, kind)
    if hasattr(pipe, "set_progress_bar_config"):
        pipe.set_progress_bar_config(disable=True)
    ad = adapter_from_pipeline(pipe, device=ctx.device, dtype=dtype, max_sequence_length=msl)
    build_s = time.perf_counter() - t0
    H, W = res
    ov = {"method": "fast", "model.dtype": "bfloat16" if dtype == torch.bfloat16 else "float32",
          "model.gradient_checkpointing": "true", "model.lora.enabled": "true", "sample.num_steps": 10,
          "sample.height": H, "sample.width": W, "sample.batch_size": G, "sample.cfg": "false",
          "sample.guidance_scale": 3.5 if kind == "flux" else 1.0, "data.group_size": G, "data.groups_per_epoch": 1,
          "data.prompts": "[" + ", ".join(PROMPTS[:1]) + "]", "optim.lr": 1e-5, "optim.kl_coef": 0.0,
          "run.num_epochs": 100, "run.output_dir": str(ctx.work_dir / f"run_{ctx.name}"), "run.save_every": 0,
          "run.image_grid_every": 0, "run.tensorboard": "false", "run.reward_curves": "false",
          "run.progress_bar": "false", "run.device": ctx.device,
          "ema.enabled": "false", "reward.retry_backoff": 0.0, "reward.async_workers": 0}
    if frames:
        ov["sample.num_frames"] = frames
    cfg = load_train_config(None, [f"{k}={v}" for k, v in ov.items()])
    tr = FlowGRPOTrainer(cfg, adapter=ad, reward_fn={"block": image_reward})
    return tr, ad, cfg, build_s, spec_name


def _bare_pipeline(ad, embeds, xt, cfg):
    """The plain diffusers call on the same x_T and embeddings (Euler ODE / UniPC, VAE decode)."""
    pipe = ad.pipe
    kw = dict(height=cfg.height, width=cfg.width, num_inference_steps=cfg.num_steps, latents=xt.clone(),
              output_type="pt", prompt_embeds=embeds.prompt_embeds)
    if ad.kind == "flux":
        kw.update(guidance_scale=cfg.guidance_scale, pooled_prompt_embeds=embeds.pooled,
                  max_sequence_length=ad.max_sequence_length)
    elif ad.kind == "sd3":
        kw.update(guidance_scale=1.0, pooled_prompt_embeds=embeds.pooled)
    else:  # wan
        kw.update(guidance_scale=1.0, num_frames=ad.num_frames)
    return pipe(**kw)


def _epochs(ctx: Ctx, kind: str, res: tuple[int, int], G: int, frames: int = 0, overhead: bool = False,
            planner: bool = True) -> None:
    import torch

    import flow_grpo.train.steps as stages
    from flow_grpo.memory_plan import counts
    from flow_grpo.sampler import sample_trajectories
    from mmgrpo.utils.memory_plan import MODELS, flow_tokens, plan

    on_gpu = ctx.device == "cuda"
    tr, ad, cfg, build_s, spec_name = _trainer(ctx, kind, res, G, frames)
    ctx.put(kind=kind, resolution=list(res), group=G, frames=frames or None, build_seconds=build_s,
            transformer_params=sum(p.numel() for p in ad.transformer.parameters()),
            trainable_params=sum(p.numel() for _, p in tr.named_params))
    timer = PhaseTimer()
    # the recipe's stage functions, timed where the loop looks them up (restored below)
    real = {"rollout": stages.rollout, "run_updates": stages.run_updates}
    stages.rollout = timer.wrap("rollout", real["rollout"])
    stages.run_updates = timer.wrap("train", real["run_updates"])
    epochs = []
    try:
        for e in range(ctx.p["flow"]["epochs"]):
            if e and ctx.time_left() < 1.2 * epochs[0]["epoch_seconds"]:
                ctx.log("no time left for the steady-state epoch: reporting epoch 0 only")
                break
            reset_peak_memory(on_gpu)
            wall: dict = {}
            with timed(wall, "epoch"):
                m = tr.train(num_epochs=1)[-1]
            ph = timer.take()
            rec = {"epoch": e, "epoch_seconds": wall["epoch"], "phases_seconds": ph,
                   "samples_per_s": G / wall["epoch"], "applied_steps": m.get("steps/applied"),
                   "memory": peak_memory(on_gpu)}
            if planner and spec_name is not None:
                spec = MODELS[spec_name]
                pred = plan(spec_name, full=False, n=counts(spec, None, cfg.model.lora.rank), rows=cfg.sample.batch_size,
                            flow_tokens=flow_tokens(spec, res[0], res[1]), gpu=on_gpu)
                rec["planner"] = planner_comparison(pred, rec["memory"], on_gpu)
            epochs.append(rec)
            ctx.put(epochs=epochs)
            ctx.log(f"epoch {e}: {wall['epoch']:.1f} s (rollout {ph.get('rollout', 0):.1f}, train "
                    f"{ph.get('train', 0):.1f}), {G / wall['epoch']:.2f} samples/s")
        last = epochs[-1]
        head = {"epoch_seconds": last["epoch_seconds"], "samples_per_s": last["samples_per_s"],
                "measured_gib": last["memory"]["measured_bytes"] / GiB}
        if "planner" in last:
            head.update(planner_error=last["planner"]["planner_error"],
                        predicted_gib=last["planner"]["predicted_bytes"] / GiB)
        ctx.put(headline=head)
        if overhead:
            _rollout_overhead(ctx, tr, ad, cfg, sample_trajectories, head)
    finally:
        stages.rollout, stages.run_updates = real["rollout"], real["run_updates"]
        del tr, ad
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _rollout_overhead(ctx: Ctx, tr, ad, cfg, sample_trajectories, head: dict) -> None:
    """median(ours) / median(bare pipeline) over alternating timed calls (after one untimed call of each)."""
    import torch

    s = cfg.sample
    G = s.batch_size
    prompts = [PROMPTS[0]] * G
    with torch.no_grad():
        embeds = ad.encode_prompts(prompts)
        ad.set_resolution(s.height, s.width)
        xt = ad.initial_noise(list(range(G)), s.height, s.width)
    tr.model.eval()

    def ours():
        return sample_trajectories(ad, prompts, s, list(range(G)), [1000 + i for i in range(G)], [7] * G,
                                   [0] * G, xt=xt)

    def bare():
        with torch.no_grad():
            return _bare_pipeline(ad, embeds, xt, s)

    times = {"ours": [], "pipeline": []}
    ours(), bare()  # untimed: kernels, caches
    reps = 0
    while reps < ctx.p["flow"]["reps"]:
        per_rep = sum(statistics.median(v) for v in times.values()) if reps else 0.0
        if reps and ctx.time_left() < 1.5 * per_rep:
            break
        for name, fn in (("ours", ours), ("pipeline", bare)):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
        reps += 1
    ratio = statistics.median(times["ours"]) / statistics.median(times["pipeline"])
    head["rollout_overhead"] = ratio
    ctx.put(rollout_overhead={"seconds": times, "reps": reps, "ratio_of_medians": ratio,
                              "what": "flow_grpo.sampler.sample_trajectories (fast: CPS window of 3, log-probs, "
                                      "recorded latents, VAE decode) / the pipeline's __call__ (ODE, VAE decode); same "
                                      "x_T, embeddings, steps, batch, resolution"}, headline=head)
    ctx.log(f"rollout overhead vs the bare pipeline: {ratio:.3f} ({reps} reps)")


def flux_512(ctx: Ctx) -> None:
    f = ctx.p["flow"]
    _epochs(ctx, "flux", (f["res"], f["res"]), f["G"], overhead=True)


def flux_1024(ctx: Ctx) -> None:
    f = ctx.p["flow"]
    _epochs(ctx, "flux", (f["res_hi"], f["res_hi"]), f["G"], overhead=False)


def sd3(ctx: Ctx) -> None:
    f = ctx.p["flow"]
    _epochs(ctx, "sd3", (f["res"], f["res"]), f["G_small"], overhead=False)


def wan(ctx: Ctx) -> None:
    f = ctx.p["flow"]
    _epochs(ctx, "wan", (f["wan_h"], f["wan_w"]), f["G_small"], frames=f["wan_frames"], overhead=False,
            planner=False)
