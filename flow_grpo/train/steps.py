"""The stages of one flow GRPO epoch, plain functions of the run (:class:`~flow_grpo.train.trainer.FlowGRPOTrainer`),
in the order the loop calls them:

* :func:`rollout`: the epoch's samples of this process, trajectories (SDE on the plan's steps, exact log-probs;
  the credit method's ``rollout_context`` around it, its plan and step rewards inside it), rewards (each chunk
  scored in a background thread while the next one is sampled); Pref-GRPO win rates;
* :func:`advantages`: the credit method's advantage estimator on the whole gathered batch (group statistics with
  explicit group ids; invalid samples leave their groups); :func:`skip_cause`: whether the epoch's steps can be
  applied at all (the skip rules in one place);
* :func:`run_updates`: ``optim.inner_epochs`` x ``optim.updates_per_epoch`` optimizer steps (:func:`update`), each
  over whole rollout chunks: per micro-batch (chunk x trained column) :func:`column_loss` (PPO-clip on the exact
  log-prob ratio + beta KL, or the credit method's own ``loss``), gradients summed over processes, the step skipped
  when anything is non-finite (counted in the run guard), EMA;
* :func:`count_epoch`: the run totals of dropped samples, failed reward calls and degenerate groups.
"""
from __future__ import annotations

import contextlib
import math
import time
from typing import Optional

import torch

from mmgrpo.engine.dist import all_reduce, gather_rows
from mmgrpo.engine.errors import RewardCallFailed
from mmgrpo.engine.groups import no_reward_signal
from mmgrpo.utils.checkpoint import capture_rng_state, restore_rng_state
from mmgrpo.utils.logging import get_logger

from flow_grpo.data import epoch_samples, process_slice, prompt_keys
from flow_grpo.epoch_metrics import REWARD_COUNTERS
from flow_grpo.methods.base import AdvOptions, ColumnContext, CreditInputs, advantage_stats, group_stats
from flow_grpo.sampler import SamplingInterrupted, Trajectories, sample_trajectories, score_column
from flow_grpo.scoring import apply_win_rates

log = get_logger("flow_grpo.trainer")

__all__ = ["rollout", "sampling_progress", "credit_inputs", "advantages", "skip_cause", "column_loss", "update",
           "run_updates", "count_epoch"]


# ------------------------------------------------------------------ rollout
def rollout(run, epoch: int) -> tuple[Trajectories, dict]:
    """Sample and score this process's trajectories of the epoch (rewards in a background thread per chunk; Pref-GRPO
    win rates over the gathered batch); returns them and the reward call counters. A failed reward call
    (``on_failure=stop``) or a signal abandons the epoch: its RNG is rolled back so that it is redrawn on resume."""
    c = run.cfg
    rng_at_start = capture_rng_state()
    own = process_slice(c.data, run.rank, run.world)
    prompts, meta, gids, xs, ns, ps = epoch_samples(c, run.prompts, run.metadata, epoch, own.start, own.stop)
    run.model.eval()
    traj = None
    try:
        with contextlib.ExitStack() as stack:
            for m in run.methods:  # e.g. DiffusionNFT samples with its old adapter
                stack.enter_context(m.rollout_context())
            traj = sample_trajectories(run.adapter, prompts, c.sample, xs, ns, ps, gids, meta, run.reward_fn,
                                       None, iteration=epoch, reward_runner=run.runner,
                                       members=[s % c.data.group_size for s in own], method=run.credit,
                                       on_chunk=sampling_progress(run),
                                       keep_means=any(m.keeps_means for m in run.methods))
    except RewardCallFailed as exc:  # reward.on_failure=stop: the epoch is discarded below, the run stops (exit 3)
        run.guard.request_stop(f"a reward call failed: {exc}; fix the reward, then resume", cause=exc)
    except SamplingInterrupted:  # a signal during sampling: the epoch is discarded below (every process)
        pass
    # a stop request or a signal: the epoch is discarded before any update (RNG rolled back, redrawn on resume;
    # nothing of it was counted yet, so the checkpoint before the epoch is reused if written)
    run.guard.stop_if_asked(lambda signalled: restore_rng_state(rng_at_start),
                            "its samples were discarded before any update", reuse=True)
    rc = run.rewards.take_counters()
    if run.rewards.pairwise is not None:  # reward.mode=win_rate: the totals become win rates of the gathered batch
        prompts_all, meta_all = traj.prompts, traj.metadata
        if run.world > 1:  # the prompts of the gathered batch: every process's samples, in process order
            prompts_all, meta_all = epoch_samples(c, run.prompts, run.metadata, epoch, 0, len(traj) * run.world)[:2]
        apply_win_rates(traj, run.rewards.pairwise, prompts_all, meta_all, run.rank, run.world, run.device,
                        win_rate_weight=c.reward.win_rate_weight, pointwise_weight=c.reward.pointwise_weight)
        rc2 = run.rewards.take_counters()
        rc = {k: rc[k] + rc2[k] for k in rc}
    return traj, rc


def sampling_progress(run):
    """``on_chunk`` of the epoch's sampling: a progress line every 30 s (main process) and, on replicated runs,
    the end of sampling when SIGTERM / SIGINT arrived (sharded and sequence-parallel runs finish the epoch's
    sampling: their forwards are collectives every process must run)."""
    t0 = last = time.monotonic()

    def hook(done: int, total: int) -> bool:
        nonlocal last
        now = time.monotonic()
        if run.is_main and now - last >= 30.0:
            log.info("epoch %d: sampled %d of %d chunks in %.0f s", run.state.epoch, done, total, now - t0)
            last = now
        sig = run.guard.signals
        if sig is not None and sig.requested and not (run.sharded or getattr(run, "sp", None)):
            log.warning("%s received while sampling: the epoch's samples are discarded", sig.name)
            return True
        return False

    return hook


# ------------------------------------------------------------------ advantages
def credit_inputs(run, traj: Trajectories) -> CreditInputs:
    """The explicit tensors a credit function reads (this process's rows; ``gather`` reaches all processes)."""
    valid = traj.rewards.get("valid")
    valid = torch.ones(len(traj), dtype=torch.bool) if valid is None else valid.bool()
    return CreditInputs(rewards=traj.rewards, group_ids=traj.group_ids, valid=valid, train_mask=traj.train_mask,
                        step_indices=traj.step_indices, sigmas=traj.sigmas, weights=run.rewards.weights,
                        opts=AdvOptions.from_optim(run.cfg.optim), step_rewards=traj.step_rewards, device=run.device,
                        gather=lambda ts: gather_rows(ts, run.device), sampling=traj.sampling,
                        members=traj.members, prompt_keys=prompt_keys(traj.prompts))


def advantages(run, traj: Trajectories) -> tuple[torch.Tensor, dict]:
    """(N, T) advantages of the trained columns (0 where not trained or invalid) from the credit method's estimator
    and statistics of the whole gathered batch (all processes)."""
    inp = credit_inputs(run, traj)
    stats = group_stats(inp)
    out = run.estimator(inp)
    stats.update(out.stats)
    mask = inp.train_mask & inp.valid.unsqueeze(1)
    adv = out.advantages * mask.float()
    stats.update(advantage_stats(adv, mask, inp.gather))
    return adv, stats


def skip_cause(run, traj: Trajectories, adv: torch.Tensor, stats: dict) -> Optional[str]:
    """Collective. Why no optimizer step of this epoch can be applied (the same on every process), or None; the
    epoch's steps are then counted as skipped (they feed ``optim.max_consecutive_skips``). The rules, in order:

    * no group kept >= 2 valid samples (every reward call failed / non-finite; the statistics are global);
    * non-finite advantages;
    * no reward signal (every advantage of every process is 0: all groups' rewards are equal; counted in
      ``zero_advantage_epochs``), and the gradient would be exactly 0: no KL term (``optim.kl_coef=0``) and no method
      with a loss of its own (DiffusionNFT); a step on a zero gradient would only apply AdamW's momentum and weight
      decay. Not a skip: with a method that drops zero-advantage trajectories (``optim.drop_zero_adv``, the default)
      the updates are already empty (no trajectory left: not an optimizer step); with a KL term the steps are taken
      (a run none of whose epochs had a reward signal still fails at its end); ``run.allow_no_reward_signal``
      takes the zero-gradient steps."""
    st, c = run.state, run.cfg
    adv_ok = all_reduce([0.0 if bool(torch.isfinite(adv).all()) else 1.0], "max", run.device)[0] == 0
    if stats["adv/groups_empty"] + stats["adv/groups_singleton"] >= c.data.groups_per_epoch:
        return "no valid reward (no group kept two valid samples: failed or non-finite reward calls)"
    if not adv_ok:
        return "non-finite advantages"
    valid = traj.rewards["valid"].bool()
    signal = no_reward_signal(adv[valid], traj.rewards["total"][valid], run.device)
    if signal is None:
        return None
    n, mean, std = signal
    st.counters["zero_advantage_epochs"] += 1
    why = (f"no reward signal: every advantage is 0, every group's rewards are equal ({n} valid samples, "
           f"reward mean {mean:.4g}, std {std:.3g} over the epoch)")
    st.last_zero_advantage = why
    if c.run.allow_no_reward_signal:
        if run.is_main:
            log.warning("epoch %d: %s; its zero-gradient steps are taken (run.allow_no_reward_signal=true)",
                        st.epoch, why)
        return None
    if any(mt.drops_zero_advantages for mt in run.methods):  # every trajectory leaves the update: empty updates
        return None
    if c.optim.kl_coef > 0 or any(mt.loss() is not None for mt in run.methods):
        if run.is_main:
            log.warning("epoch %d: %s; the KL / method loss terms are still applied", st.epoch, why)
        return None
    return why


# ------------------------------------------------------------------ loss of one column
def column_loss(run, traj: Trajectories, chunk, col: int, adv: torch.Tensor, n_global: float, dummy: bool = False):
    """The default loss of one micro-batch (rollout chunk x trained column): PPO's clipped surrogate on the exact
    log-prob ratio of the recorded transition, token-mean over the global pair count, plus ``optim.kl_coef`` times
    the KL to the reference (on the mean, the velocity or the full Gaussian: ``optim.kl_type``). ``dummy``: same
    forward(s) with a zero mask (equalises micro-batch counts across processes)."""
    from mmgrpo.core.losses import aggregate_loss, clipped_surrogate, log_ratio, ratio_metrics

    from flow_grpo.sde import kl_on_mean, kl_on_velocity, sde_step

    c = run.cfg
    c0, c1 = chunk
    mask = traj.train_mask[c0:c1, col].to(run.adapter.device)
    if dummy:
        mask = torch.zeros_like(mask)
    with run.accelerator.autocast():
        out, v = score_column(run.adapter, traj, chunk, col, return_velocity=True)
    logp = out.log_prob.float().unsqueeze(1)
    old = traj.log_probs[c0:c1, col].to(logp.device).unsqueeze(1)
    a = adv[c0:c1, col].to(logp.device).unsqueeze(1)
    m2 = mask.unsqueeze(1).bool()
    lr = log_ratio(logp, old, m2)
    ctx = ColumnContext(run, traj, chunk, col, out, v, mask.bool(), n_global)
    for m in run.methods:  # e.g. GRPO-Guard's normalised ratio
        lr = m.adjust_log_ratio(ctx, lr)
    pg, metrics = clipped_surrogate(lr, a, m2, c.optim.clip_low)
    loss = aggregate_loss(torch.where(m2, pg, torch.zeros_like(pg)), m2, "token_mean", num_tokens=n_global)
    metrics.update(ratio_metrics(lr, m2))
    kl_val = 0.0
    if c.optim.kl_coef > 0:
        s = traj.sampling
        with torch.no_grad(), run.adapter.reference(), run.accelerator.autocast():
            v_ref = run.adapter.predict_velocity(traj.latents[c0:c1, col], traj.sigmas[col].item(),
                                                 run.adapter.encode_prompts(traj.prompts[c0:c1]),
                                                 s.guidance_scale, s.cfg)
        if c.optim.kl_type == "velocity":
            kl = kl_on_velocity(v, v_ref)
        else:
            ref = sde_step(v_ref, traj.latents[c0:c1, col], traj.sigmas[col].item(), traj.sigmas_next[col].item(),
                           kind=s.sde_kind, noise_level=s.noise_level, noise=torch.zeros_like(v_ref))
            std = out.noise_scale if c.optim.kl_type == "mean" else out.std
            kl = kl_on_mean(out.mean, ref.mean, std)
        m = mask.float()
        loss = loss + c.optim.kl_coef * (kl * m).sum() / n_global
        kl_val = float((kl.detach() * m).sum() / m.sum().clamp_min(1))
    for m in run.methods:  # a method's own loss term (e.g. GARDO's gated KL)
        loss = m.on_loss(ctx, loss)
    if dummy:
        # zero-weight pass: keeps every parameter in the graph (DDP/FSDP hooks fire) without contributing
        loss = loss * 0.0 + 0.0 * v.sum()
    return loss, metrics, kl_val, int(mask.sum())


# ------------------------------------------------------------------ optimizer steps
def update(run, traj: Trajectories, adv: torch.Tensor, chunk_ids, acc_metrics: dict, per_col: dict,
           kls: list) -> tuple[str, float]:
    """One optimizer step over the given rollout chunks. Returns (status, grad_norm) with status ``applied`` |
    ``skipped`` (non-finite loss or gradient norm on any process) | ``empty`` (no trained pair on any process)."""
    acc, train_mask = run.accelerator, traj.train_mask
    micro = []
    local_pairs = 0
    for i in chunk_ids:
        c0, c1 = traj.chunks[i]
        for col in range(train_mask.shape[1]):
            cnt = int(train_mask[c0:c1, col].sum())
            if cnt:
                micro.append((traj.chunks[i], col))
                local_pairs += cnt
    n_global = all_reduce([float(local_pairs)], "sum", run.device)[0]  # loss normaliser: global pair count
    m_max = int(all_reduce([float(len(micro))], "max", run.device)[0])  # every process runs this many passes
    if n_global == 0:
        return "empty", 0.0
    run.model.train()
    loss_ok = True
    for j in range(m_max):
        last = j == m_max - 1
        dummy = j >= len(micro)
        ch, col = (traj.chunks[0], 0) if dummy else micro[j]
        acc.sync_gradients = last  # DeepSpeed: gradient-accumulation boundary only on the last micro-batch
        with contextlib.nullcontext() if last else acc.no_sync(run.model):
            loss, m, kl_val, _ = run.loss(traj, ch, col, adv, n_global, dummy)
            loss_ok &= bool(torch.isfinite(loss.detach()).all())
            # the backends average gradients over processes; * processes turns that into the global sum (with
            # sequence parallelism too: a group's processes hold token shards whose gradients add up)
            acc.backward(loss * acc.num_processes)
        if not dummy:
            for k, v in m.items():
                s_, n_ = acc_metrics.get(k, (0.0, 0))
                acc_metrics[k] = (s_ + float(v), n_ + 1)
            per_col.setdefault(int(traj.step_indices[col]), []).append(float(m.get("ratio_mean", 1.0)))
            if run.cfg.optim.kl_coef > 0:
                kls.append(kl_val)
    acc.sync_gradients = True
    max_norm = run.cfg.optim.max_grad_norm if run.cfg.optim.max_grad_norm > 0 else float("inf")
    gn = acc.clip_grad_norm_(run.model.parameters(), max_norm)
    gn = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn) if gn is not None else float("nan")
    bad = all_reduce([0.0 if (loss_ok and math.isfinite(gn)) else 1.0], "max", run.device)[0] > 0
    if bad and not run.deepspeed:
        run.optimizer.zero_grad(set_to_none=True)
        return "skipped", gn
    run.optimizer.step()
    run.lr_scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return ("skipped" if bad else "applied"), gn


def run_updates(run, traj: Trajectories, adv: torch.Tensor, skip_cause: Optional[str]) -> dict:
    """The epoch's optimizer steps: the rollout chunks (whole trajectories, all their steps) split into
    ``updates_per_epoch`` groups, ``inner_epochs`` passes. ``skip_cause``: skip every step (counted) for it."""
    c = run.cfg
    n_chunks = len(traj.chunks)
    n_upd = max(1, min(c.optim.updates_per_epoch, n_chunks))
    bounds = [round(i * n_chunks / n_upd) for i in range(n_upd + 1)]
    upd = {"per_col": {}, "acc_metrics": {}, "kls": [], "grad_norms": [],
           "status": {"applied": 0, "skipped": 0, "empty": 0}}
    for _ in range(c.optim.inner_epochs):
        for u in range(n_upd):
            if skip_cause is not None:
                status, gn = "skipped", float("nan")
            else:
                status, gn = update(run, traj, adv, range(bounds[u], bounds[u + 1]), upd["acc_metrics"],
                                    upd["per_col"], upd["kls"])
            upd["status"][status] += 1
            _after_update(run, status, gn, u, skip_cause or f"non-finite loss/gradients (grad norm {gn})",
                          upd["grad_norms"])
    return upd


def _after_update(run, status: str, gn: float, u: int, what: str, grad_norms: list) -> None:
    """Counters, EMA and the halt after ``optim.max_consecutive_skips`` skipped steps in a row."""
    st, guard = run.state, run.guard
    if status == "empty":
        st.counters["empty_updates"] += 1
        return
    st.global_step += 1
    if status == "applied":
        grad_norms.append(gn)
        st.counters["applied_steps"] += 1
        guard.applied()
        if run.ema is not None and st.global_step % run.cfg.ema.update_every == 0:
            run.ema.update(st.global_step)
        for m in run.methods:
            m.after_optimizer_step()
        return
    st.counters["skipped_steps"] += 1
    halt = guard.skipped(what)
    log.warning("epoch %d update %d: %s: optimizer step skipped (%d in a row)", st.epoch, u, what,
                guard.consecutive_skips)
    if halt:  # the state goes to <output_dir>/halted (mid-epoch: resumed by its path)
        if run.logger is not None:
            run.logger.log({"halted": 1.0, "steps/skipped_total": float(st.counters["skipped_steps"])},
                           st.global_step)
        guard.halt("optim.max_consecutive_skips", st.counters["applied_steps"] > 0,
                   "the skipped steps left the weights unchanged; fix the cause first (e.g. a lower optim.lr, "
                   "optim.max_grad_norm, bf16 -> fp32, or a broken reward)", resume_by_path=True, halted=True)


def count_epoch(run, stats: dict, reward_counts: dict) -> list[float]:
    """Run totals of dropped samples, failed reward calls and degenerate groups; returns the epoch's reward call
    counters (:data:`~flow_grpo.epoch_metrics.REWARD_COUNTERS`) summed over processes."""
    n = run.state.counters
    rsum = all_reduce([reward_counts.get(k, 0) for k in REWARD_COUNTERS], "sum", run.device)
    n["reward_invalid"] += int(stats["reward/invalid"])
    n["reward_failed_calls"] += int(rsum[3])
    n["reward_dropped"] += int(rsum[4])
    n["groups_empty"] += int(stats["adv/groups_empty"])
    n["groups_singleton"] += int(stats["adv/groups_singleton"])
    if stats["reward/invalid"] or stats["adv/groups_empty"] or stats["adv/groups_singleton"]:
        log.warning("epoch %d: %d samples dropped (invalid reward: non-finite or failed call), %d groups empty, "
                    "%d groups with one member (advantage 0)", run.state.epoch, int(stats["reward/invalid"]),
                    int(stats["adv/groups_empty"]), int(stats["adv/groups_singleton"]))
    return rsum
