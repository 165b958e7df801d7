"""Benchmark ``tp_batched_speedup``: TP-GRPO's ODE completions for all k at once vs one k at a time.

For every trajectory i and every SDE step j of its window, TP-GRPO needs R_j = reward(decode(ODE-complete the
state before the j-th SDE step)) (R_0 from the window start, i.e. from the trajectory's own x_T through the shared
ODE prefix; R_n is the final reward and needs no completion).

A = our sampler's batched path (:func:`flow_grpo.methods.tp_grpo.tp_grpo_step_rewards`, exactly what
    ``sample_trajectories`` runs for ``credit="tp_grpo"``; the trajectories are sampled with that credit, so A starts each completion from
    the rollout's stored Euler step ``ode_next_latents`` at sigma_{k+1}): all n*N completions end-aligned in chunks
    of ``completion_batch_size``, one model call per round with a per-item sigma, one batched VAE decode per chunk,
    ONE reward call.
B = the released TP-GRPO way (YunzeTong/TurningPoint-GRPO): for k = one window step at a time, ODE-complete the N latents
    x_k over sigma_k..0 (the first step recomputes the rollout's velocity), decode, score; n model-call sequences,
    n decodes, n reward calls.

Both produce R (N, n); they must agree (asserted within ``--tol``; the max difference is printed), since batching
and the reused first step change only the matmul batch composition (fp32 CPU: ~1e-7).

Prints time(B)/time(A) LAST as ``tp_batched_speedup=X.XX`` (target >= 2).

    python eval/perf/tp_completions.py [--quick | --smoke] [--model mid|tiny] [--kind flux|sd3] [--json out.json]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flow_rollout import (  # noqa: E402  (shared flow-benchmark helpers)
    PROMPTS, add_common_args, build_adapter, finish, machine_info, profile_calls, ratio_stats, resolve_args,
    set_threads, timed_interleaved,
)

NAME = "tp_batched_speedup"


def make_reward(height: int, width: int):
    """A cheap deterministic reward sensitive to image content: <image/255, w> with a fixed random pattern w."""
    import torch

    w = torch.rand(height, width, 3, generator=torch.Generator().manual_seed(11))

    def reward(images, prompts, metadata):
        x = torch.as_tensor(images).float() / 255.0
        return {"pattern": (x * w).mean(dim=(1, 2, 3))}

    return reward


@contextlib.contextmanager
def count_model_calls(module):
    """Count forward calls of ``module`` and the items (batch rows) they processed."""
    work = {"calls": 0, "items": 0}

    def hook(_mod, args, kwargs):
        x = kwargs.get("hidden_states", args[0] if args else None)
        work["calls"] += 1
        work["items"] += int(x.shape[0]) if x is not None else 0

    h = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield work
    finally:
        h.remove()


def sequential_completions(ad, traj, embeds, sig, reward_fn, batch: int):
    """B: one window step at a time over the batch (the released TP-GRPO loop): plain Euler ODE with the
    adapter, then decode, then score. Returns (R (N, n), model calls, item evaluations)."""
    import torch

    from flow_grpo.scoring import score_rewards
    from flow_grpo.sde import sde_step

    s = traj.sampling
    N = len(traj)
    pos = torch.stack([torch.nonzero(traj.train_mask[i]).flatten() for i in range(N)])  # (N, n) columns
    n = pos.shape[1]
    R = torch.zeros(N, n)
    calls = items = 0
    for j in range(n):
        for c0 in range(0, N, batch):
            c1 = min(N, c0 + batch)
            ks = {int(traj.step_indices[int(pos[i, j])]) for i in range(c0, c1)}
            if len(ks) != 1:
                raise ValueError("the sequential baseline needs one window start per batch (use a fixed window)")
            k = ks.pop()
            x = torch.stack([traj.latents[i, int(pos[i, j])] for i in range(c0, c1)])
            emb = embeds.index(slice(c0, c1))
            for kk in range(k, len(sig) - 1):
                v = ad.predict_velocity(x, sig[kk].item(), emb, s.guidance_scale, s.cfg)
                x = sde_step(v, x, sig[kk].item(), sig[kk + 1].item(), kind="ode").prev_sample
                calls += 1
                items += c1 - c0
            imgs = ad.decode(x, s.height, s.width).cpu()
            total, _ = score_rewards(reward_fn, imgs, traj.prompts[c0:c1], traj.metadata[c0:c1])
            R[c0:c1, j] = total
    return R, calls, items


def main(argv: Optional[list[str]] = None) -> float:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--n-traj", type=int, default=None, help="trajectories N = one sampling batch (default 8)")
    p.add_argument("--steps", type=int, default=None, help="K (default: 6 FLUX / 10 SD3, TP-GRPO's settings)")
    p.add_argument("--window", type=int, default=None, help="SDE window n (default K-1: 5 FLUX / 9 SD3)")
    p.add_argument("--size", type=int, default=None, help="image side in pixels (default 64: 8x8 latents)")
    p.add_argument("--completion-batch", type=int, default=None,
                   help="A's completion_batch_size (default: the SamplingConfig default, 32)")
    p.add_argument("--tol", type=float, default=1e-4, help="max |R_A - R_B| allowed")
    args = p.parse_args(argv)
    # no warm-up in quick mode: the sampling run (credit=tp_grpo runs A once) and the counted runs of A and B
    # below already warm both paths up
    resolve_args(args, reps=(2, 3, 9), warmup=(0, 0, 1))
    set_threads(args.threads)
    import torch

    from flow_grpo.config import SamplingConfig
    from flow_grpo.methods.tp_grpo import tp_grpo_step_rewards as _tp_grpo_rewards
    from flow_grpo.sampler import sample_trajectories

    sd3 = args.kind == "sd3"
    N = args.n_traj or (2 if args.smoke else 8)
    K = args.steps or (4 if args.smoke else (10 if sd3 else 6))
    n = args.window or (K - 1)
    size = args.size or (32 if args.smoke else 64)
    ad, model_info = build_adapter(args.model, args.kind)
    kw = {} if args.completion_batch is None else {"completion_batch_size": args.completion_batch}
    cfg = SamplingConfig(num_steps=K, height=size, width=size, guidance_scale=4.5 if sd3 else 3.5, cfg=sd3,
                         sde_kind="cps", noise_level=0.8 if not sd3 else 0.7, step_mode="window", window_size=n,
                         window_range=[0, K - 1], window_policy="fixed", credit="tp_grpo", batch_size=N, **kw)
    prompts = [PROMPTS[i // 2 % len(PROMPTS)] for i in range(N)]
    gids = [i // 2 for i in range(N)]
    reward_fn = make_reward(size, size)
    traj = sample_trajectories(ad, prompts, cfg, list(range(N)), [100 + i for i in range(N)], [5] * N, gids,
                               reward_fn=reward_fn)
    if traj.ode_next_latents is None:  # A must time the committed reuse path, not the fallback
        raise AssertionError("sample_trajectories(credit='tp_grpo') did not store ode_next_latents")
    embeds = ad.encode_prompts(prompts)
    sig = ad.sigmas(K, size, size)
    r_final = traj.rewards["total"]

    def run_batched():
        with torch.no_grad():
            return _tp_grpo_rewards(ad, traj, embeds, sig, reward_fn, None, r_final)

    def run_sequential():
        with torch.no_grad():
            return sequential_completions(ad, traj, embeds, sig, reward_fn, N)

    with count_model_calls(ad.transformer) as work_a:
        res_a = run_batched()  # (R, nfe[, valid]): the private helper's tuple has grown before, read by position
    R_a, nfe_a = res_a[0], res_a[1]
    with count_model_calls(ad.transformer) as work_b:
        R_b, _, _ = run_sequential()
    R_a = R_a[:, :-1]  # drop R_n (the final reward, not a completion)
    max_diff = float((R_a - R_b).abs().max())
    print(f"rewards: batched vs sequential max |diff| = {max_diff:.3e} over {R_a.numel()} completions "
          f"(R range {float(R_b.min()):.4f}..{float(R_b.max()):.4f})")
    if not max_diff <= args.tol:
        raise AssertionError(f"batched and sequential completions disagree: max |R_A - R_B| = {max_diff} > {args.tol}")
    calls_a, items_a = work_a["calls"], work_a["items"]
    calls_b, items_b = work_b["calls"], work_b["items"]
    cb = cfg.completion_batch_size

    profiles = profile_calls({"A_batched": run_batched, "B_sequential": run_sequential}) if args.profile else None
    t, tc = timed_interleaved({"A": run_batched, "B": run_sequential}, reps=args.reps, warmup=args.warmup)
    st = ratio_stats(t["B"], t["A"], ("sequential", "batched"))  # speedup = time(sequential) / time(batched)
    stc = ratio_stats(tc["B"], tc["A"], ("sequential", "batched"))
    value = st["ratio_median"]
    details = {
        "description": "ODE completions R_0..R_{n-1} for TP-GRPO: time(one k at a time, released) / time(all k "
                       "batched, flow_grpo.methods.tp_grpo.tp_grpo_step_rewards); both include VAE decode and "
                       "reward calls",
        "mode": args.mode, "machine": machine_info(), "model": model_info,
        "config": {"N": N, "steps": K, "window": n, "height": size, "width": size, "cfg": cfg.cfg,
                   "completion_batch_size": cb, "reps": args.reps, "warmup": args.warmup, "threads": args.threads},
        "work": {"completions": N * n, "model_calls_batched": calls_a, "item_evals_batched": items_a,
                 "model_calls_sequential": calls_b, "item_evals_sequential": items_b,
                 "completion_nfe_per_trajectory_batched": nfe_a,
                 # the hook counts transformer rows: with CFG one guided evaluation is 2 rows
                 "completion_nfe_per_trajectory_sequential": items_b / N / (2 if cfg.cfg else 1),
                 "batched_starts_from": "rollout ode_next_latents (sigma_{k+1})",
                 # derived, not measured: the speedup if a model call cost the same at any batch size
                 # (a latency-bound accelerator); on this CPU the cost is ~linear in the batch (see docs)
                 "call_bound_speedup_estimate": calls_b / max(calls_a, 1)},
        "rewards_max_abs_diff": max_diff, "timings": st, "timings_cpu": stc,
    }
    if profiles:
        details["profiles"] = profiles
    print(f"sequential median {st['sequential_median_s'] * 1e3:8.1f} ms ({calls_b} calls, {items_b} items)   batched median "
          f"{st['batched_median_s'] * 1e3:8.1f} ms ({calls_a} calls, {items_a} items)   speedup of medians {st['ratio_of_medians']:.3f}   "
          f"paired {value:.3f}   cpu-time paired {stc['ratio_median']:.3f}")
    finish(NAME, value, ">= 2.0", value >= 2.0, details, args.json)
    return value


if __name__ == "__main__":
    main()
