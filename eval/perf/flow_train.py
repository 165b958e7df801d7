"""Benchmark ``flow_train_overhead``: time per trained denoising step, our training path vs a bare transformer step.

A = the trainer's per-column step: :func:`flow_grpo.train.steps.column_loss` (recompute the Gaussian
    of a recorded transition with the current model via :func:`flow_grpo.sampler.score_column`, exact fp32
    log-prob, PPO-clip loss, :func:`flow_grpo.train.steps.column_loss`) + ``backward()`` through the adapter.
    If that path breaks (the private step's signature or the attributes it reads change), the benchmark fails
    (non-zero exit, the error in ``run.py``'s JSON) instead of timing something else; ``--path direct`` times the
    same calls composed here, for diagnosis only.
B = ``transformer(...)`` forward on the same latents/timestep/conditioning + MSE against a velocity target +
    ``backward()``: the floor any flow-matching trainer pays.

Same transformer (same LoRA, rank 32 / alpha 64 = the trainer's default, or ``--lora-rank 0`` for a full
fine-tune), same batch (one rollout chunk), train mode, gradients reset before every call in both.

Prints median(A/B) LAST as ``flow_train_overhead=X.XX`` (target <= 1.25).

    python eval/perf/flow_train.py [--quick | --smoke] [--model mid|tiny] [--json out.json] [--profile]
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flow_rollout import (  # noqa: E402  (shared flow-benchmark helpers)
    PROMPTS, add_common_args, build_adapter, finish, machine_info, profile_calls, ratio_stats, resolve_args,
    set_threads, timed_interleaved,
)

NAME = "flow_train_overhead"


def _trainer_step_fn(ad, traj, chunk, col, adv, n_global, clip_range: float):
    """The recipe's own column loss (:func:`flow_grpo.train.steps.column_loss`) on a minimal stand-in of the run (cfg,
    adapter, accelerator): the code that runs in training, without building a full trainer (logger, checkpoints,
    prompts)."""
    from types import SimpleNamespace

    from accelerate import Accelerator

    from flow_grpo.config import TrainConfig
    from flow_grpo.methods import credit_method
    from flow_grpo.train.steps import column_loss

    tc = TrainConfig()
    tc.sample = traj.sampling
    tc.optim.clip_low = clip_range
    tc.optim.kl_coef = 0.0
    # a credit with its own loss (DiffusionNFT) would need a real trainer and is not what A measures
    credit = credit_method(tc)
    if credit.loss() is not None:
        raise RuntimeError(f"credit {credit.name!r} has its own loss; A times the default GRPO column loss")
    stub = SimpleNamespace(cfg=tc, adapter=ad, accelerator=Accelerator(cpu=True), methods=[])  # no method hooks

    def step():
        loss, _m, _kl, _cnt = column_loss(stub, traj, chunk, col, adv, n_global)
        loss.backward()
        return loss

    return step


def _direct_step_fn(ad, traj, chunk, col, adv, n_global, clip_range: float):
    """The same computation composed from the public pieces (``--path direct``: diagnosis only)."""
    import torch

    from flow_grpo.sampler import score_column
    from mmgrpo.core.losses import aggregate_loss, clipped_surrogate, log_ratio

    c0, c1 = chunk

    def step():
        out = score_column(ad, traj, chunk, col)
        mask = traj.train_mask[c0:c1, col].unsqueeze(1)
        lr = log_ratio(out.log_prob.float().unsqueeze(1), traj.log_probs[c0:c1, col].unsqueeze(1), mask)
        pg, _ = clipped_surrogate(lr, adv[c0:c1, col].unsqueeze(1), mask, clip_range)
        loss = aggregate_loss(torch.where(mask, pg, torch.zeros_like(pg)), mask, "token_mean", num_tokens=n_global)
        loss.backward()
        return loss

    return step


def _bare_step_fn(ad, traj, chunk, col, embeds):
    """B: direct transformer call (no adapter), MSE on the velocity, backward."""
    import torch

    c0, c1 = chunk
    x = traj.latents[c0:c1, col].to(ad.dtype)
    b = x.shape[0]
    sigma = torch.full((b,), float(traj.sigmas[col]), dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    target = torch.randn(x.shape, generator=g)
    if ad.kind == "flux":
        hw = ad._current_hw
        kw = dict(hidden_states=x, timestep=sigma, pooled_projections=embeds.pooled,
                  encoder_hidden_states=embeds.prompt_embeds, txt_ids=embeds.text_ids, img_ids=ad.img_ids(hw),
                  guidance=(torch.full((b,), traj.sampling.guidance_scale)
                            if ad.transformer.config.guidance_embeds else None))
    else:
        kw = dict(hidden_states=x, timestep=sigma * 1000.0, encoder_hidden_states=embeds.prompt_embeds,
                  pooled_projections=embeds.pooled)
    tr = ad.transformer

    def step():
        v = tr(return_dict=False, **kw)[0]
        loss = torch.nn.functional.mse_loss(v.float(), target)
        loss.backward()
        return loss

    return step


def main(argv: Optional[list[str]] = None) -> float:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--batch", type=int, default=None, help="rollout chunk = training batch (default 4)")
    p.add_argument("--size", type=int, default=None, help="image side in pixels (default 64: 8x8 latents)")
    p.add_argument("--lora-rank", type=int, default=32, help="LoRA rank (alpha = 2 r); 0 = full fine-tune")
    p.add_argument("--path", choices=["trainer", "direct"], default="trainer",
                   help="A through the recipe's column_loss (the measured path; an error if it breaks) or "
                        "composed here (diagnosis only)")
    args = p.parse_args(argv)
    # quick: one warm-up call each (A is also run once by the untimed sanity check below)
    resolve_args(args, reps=(2, 7, 15), warmup=(0, 1, 3))
    set_threads(args.threads)
    import torch

    from flow_grpo.config import SamplingConfig
    from flow_grpo.sampler import sample_trajectories

    batch = args.batch or (2 if args.smoke else 4)
    size = args.size or (32 if args.smoke else 64)
    K = 4 if args.smoke else 6
    ad, model_info = build_adapter(args.model, args.kind)
    if args.lora_rank > 0:
        torch.manual_seed(1)
        params = ad.add_lora(rank=args.lora_rank, alpha=2.0 * args.lora_rank)
        with torch.no_grad():  # a trained-looking adapter (peft's gaussian init has B = 0)
            for n, prm in ad.transformer.named_parameters():
                if "lora_B" in n:
                    prm.normal_(0, 0.02)
    else:
        params = ad.enable_full_finetune()
    model_info["trainable_params"] = int(sum(q.numel() for q in params))
    model_info["lora_rank"] = args.lora_rank
    sd3 = ad.kind == "sd3"
    # cfg off for SD3 too: one forward per trained step in both A and B (same batch)
    cfg = SamplingConfig(num_steps=K, height=size, width=size, guidance_scale=3.5, cfg=False, sde_kind="flow",
                         noise_level=0.7, step_mode="all", batch_size=batch)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
    ad.transformer.eval()
    traj = sample_trajectories(ad, prompts, cfg, list(range(batch)), [100 + i for i in range(batch)], [7] * batch,
                               [0] * (batch // 2) + [1] * (batch - batch // 2))
    chunk = traj.chunks[0]
    col = len(traj.step_indices) // 2
    g = torch.Generator().manual_seed(3)
    adv = torch.randn(traj.train_mask.shape, generator=g).clamp(-5, 5) * traj.train_mask.float()
    n_global = float(traj.train_mask[chunk[0]:chunk[1], col].sum())
    clip_range = 1e-4
    embeds = ad.encode_prompts(prompts[chunk[0]:chunk[1]])

    path = args.path
    if path == "trainer":
        try:
            step_a = _trainer_step_fn(ad, traj, chunk, col, adv, n_global, clip_range)
            ad.transformer.train()
            step_a()  # a trial call: the private method's signature may change under us
        except Exception as exc:
            # no silent fallback: a number from another path would not be the trainer's overhead
            raise RuntimeError(f"the trainer path of {NAME} broke ({type(exc).__name__}: {exc}); update "
                               f"_trainer_step_fn in eval/perf/flow_train.py (--path direct times the composed "
                               f"path, for diagnosis only)") from exc
    else:
        step_a = _direct_step_fn(ad, traj, chunk, col, adv, n_global, clip_range)
    step_b = _bare_step_fn(ad, traj, chunk, col, embeds)

    def zero():
        for q in params:
            q.grad = None

    def run_a():
        zero()
        return step_a()

    def run_b():
        zero()
        return step_b()

    ad.transformer.train()
    # sanity (untimed): on-policy, the recomputed log-prob equals the rollout one -> ratio 1 (else A is not the path)
    from flow_grpo.sampler import score_column

    with torch.no_grad():
        lp = score_column(ad, traj, chunk, col).log_prob
    ratio_max_dev = float((lp - traj.log_probs[chunk[0]:chunk[1], col]).abs().max())
    loss_a = float(run_a().detach())
    grad_a = sum(float(q.grad.norm()) ** 2 for q in params if q.grad is not None) ** 0.5
    if not grad_a > 0:
        raise RuntimeError("A produced no gradient: the benchmark would time a no-op backward")

    profiles = profile_calls({"A_train_path": run_a, "B_bare": run_b}) if args.profile else None
    t, tc = timed_interleaved({"A": run_a, "B": run_b}, reps=args.reps, warmup=args.warmup)
    st = ratio_stats(t["A"], t["B"], ("train_path", "bare"))
    stc = ratio_stats(tc["A"], tc["B"], ("train_path", "bare"))
    value = st["ratio_median"]
    details = {
        "description": "per trained denoising step: A = score_column + exact log-prob + PPO loss + backward "
                       "(trainer path) / B = transformer forward + MSE on velocity + backward, same batch",
        "mode": args.mode, "machine": machine_info(), "model": model_info, "path": path,
        "config": {"batch": chunk[1] - chunk[0], "height": size, "width": size, "steps": K, "column": col,
                   "sigma": float(traj.sigmas[col]), "sde_kind": cfg.sde_kind, "reps": args.reps,
                   "warmup": args.warmup, "threads": args.threads},
        "timings": st, "timings_cpu": stc, "onpolicy_logprob_max_abs_diff": ratio_max_dev, "loss_a": loss_a, "grad_norm_a": grad_a,
    }
    if profiles:
        details["profiles"] = profiles
    print(f"A train path ({path}) median {st['train_path_median_s'] * 1e3:8.1f} ms   B bare fwd+bwd median "
          f"{st['bare_median_s'] * 1e3:8.1f} ms   ratio of medians {st['ratio_of_medians']:.3f}   paired {value:.3f}   "
          f"cpu-time paired {stc['ratio_median']:.3f}   (on-policy |logp - logp_old| max {ratio_max_dev:.1e})")
    finish(NAME, value, "<= 1.25", value <= 1.25, details, args.json)
    return value


if __name__ == "__main__":
    main()
