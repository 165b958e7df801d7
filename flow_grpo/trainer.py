"""The flow-matching GRPO trainer: one loop, methods differ only by config (see :mod:`flow_grpo.config`).

Per epoch::

    groups g = epoch*groups_per_epoch + [0, groups_per_epoch)   (global ids; samples split over processes)
    sample trajectories (SDE on the plan's steps, exact log-probs)     -> flow_grpo.sampler
        each chunk's images are scored in a background thread while the next chunk is sampled
    rewards: MultiReward over the configured components, each wrapped in ResilientReward (timeout, retries,
             drop-or-stop); non-finite scores -> valid=False (nan_policy=drop)
    advantages (N, T) from mmgrpo.core with explicit group ids on the gathered batch; invalid samples leave their
             groups (valid=); groups left empty / with one member get advantage 0 and are counted
    for each update (``optim.updates_per_epoch`` per epoch, each over whole trajectories):
        for each micro-batch (rollout chunk x trained column):   # same chunks as the rollout -> ratio == 1
            logp = log N(x_{k+1}; mu_theta(x_k), s_k^2)       # fp32, forward through the *prepared* module
            loss = PPO-clip(logp - logp_old, A[:, k]) (+ beta * KL)      / #trained (sample, step) pairs (global)
            accelerator.backward(world * loss)   under accelerator.no_sync except the last micro-batch
        accelerator.clip_grad_norm_; non-finite advantages/loss/grad-norm -> skip the step (counted)
        AdamW step, LR schedule step, EMA update
    eval (periodic and at the end), log, PNG grids, checkpoint (last N + best eval)

Where the pieces live: credit functions, sampling plans and train masks in :mod:`flow_grpo.methods` (a table looked
up by config value: this file names no method); reward calls in :mod:`flow_grpo.scoring`; setup in
:mod:`flow_grpo.build`; checkpoints and export in :mod:`flow_grpo.checkpointing`; eval and grids in
:mod:`flow_grpo.evaluation`; halts, signals and the budget in :mod:`flow_grpo.run_control`; collectives in
:mod:`flow_grpo.distributed`; prompt files and the sample layout in :mod:`flow_grpo.data`; epoch metrics in
:mod:`flow_grpo.epoch_metrics`.

SIGTERM / SIGINT (:mod:`mmgrpo.utils.signals`): polled by every process through a max-reduction after the epoch's
sampling (no update yet: the epoch is discarded, RNG rolled back) and before each epoch (the epoch in progress,
updates and eval, was finished); all processes stop at the same epoch, write a checkpoint and raise
``TrainingInterrupted`` (``flow_grpo train`` exits with code 6); a second signal >= 1 s later aborts at once.

Multi-process (verified on CPU only: gloo, 2 processes, DDP; FSDP2 forced on CPU in the tests; FSDP1 and DeepSpeed
are wired the standard accelerate way but were not run here - no GPU, no deepspeed install):

* The transformer, the optimizer and the LR schedule go through ``accelerator.prepare`` (DDP / FSDP / DeepSpeed per
  the accelerate config); every forward goes through the prepared module (``adapter.model``).
* Processes may hold different numbers of micro-batches in an update (per-sample step plans, dropped samples).
  Every process therefore runs the *global maximum* number of micro-batches: missing ones are zero-weight passes
  over real data. All but the last run under ``accelerator.no_sync`` (gradients accumulate locally); the last one
  synchronises (DDP all-reduce / FSDP reduce-scatter / DeepSpeed boundary). Sharded backends need the equal count
  because their forwards and backwards are collectives; for DDP it costs nothing in wall time (the synchronising
  step waits for the slowest process anyway).
* DDP/FSDP/DeepSpeed *average* gradients over processes; the loss is normalised by the global number of trained
  (sample, step) pairs and multiplied by the world size, so the result is the global sum = the single-process
  gradient of the same global batch.
* ``unwrap_model`` gives the module whose parameters feed EMA, the LoRA reference (adapter disabled) and saving.
  Replicated backends (single, DDP) are checked to hold identical trainable weights at every checkpoint.
"""
from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Callable, Optional

import torch

# TrainingHalted: the old name of TrainingStopped, re-exported with the other errors for old imports
from mmgrpo.engine.errors import (NothingTrained, RewardCallFailed, RewardTimeout, TrainingHalted,  # noqa: F401
                                  TrainingInterrupted, TrainingStopped)
from mmgrpo.engine.checkpoint import SkipHalt
from mmgrpo.utils.budget import TimeBudget
from mmgrpo.utils.export import clean_stale_exports
from mmgrpo.utils.logging import get_logger
from mmgrpo.utils.runlock import acquire_run_lock
from mmgrpo.utils.signals import StopOnSignal

from .build import SetupMixin, _peft_init, set_num_frames, set_shift  # noqa: F401 - _peft_init: old import path
from .checkpointing import CheckpointMixin
from .config import TrainConfig
from .data import epoch_samples, eval_prompts, load_prompts, train_prompts  # noqa: F401 - load_prompts: old path
from .distributed import (_all_gather_object, _barrier, _broadcast_object, _dist, _gather_rows,  # noqa: F401
                          _reduce, sync_failure)
from .ema import EMA  # noqa: F401 - old import path
from .epoch_metrics import REWARD_COUNTERS, epoch_metrics
from .evaluation import EvalMixin
from .methods import (AdvOptions, CreditInputs, advantage_stats, apply_train_masks, credit_name, get_credit,
                      group_stats)
from .run_control import RunControlMixin
from .sampler import SamplingInterrupted, Trajectories, sample_trajectories, score_column
# the reward classes moved to flow_grpo.scoring; re-exported for old imports
from .scoring import ResilientReward, RewardStack, _call_with_timeout, apply_win_rates  # noqa: F401

# get_logger gives the "flow_grpo" logger a stderr handler at INFO (unless the root logger is configured): with a
# bare logging.getLogger, info lines such as "resumed from ..." were never printed
log = get_logger("flow_grpo.trainer")


def _prompt_keys(prompts) -> torch.Tensor:
    """(N,) int64: a stable (process- and run-independent) hash of each prompt text."""
    import hashlib

    return torch.tensor([int.from_bytes(hashlib.sha256(p.encode()).digest()[:8], "little", signed=True)
                         for p in prompts], dtype=torch.int64)


class FlowGRPOTrainer(SetupMixin, CheckpointMixin, EvalMixin, RunControlMixin):
    """Build with a config (and optionally a ready adapter / reward components / accelerator, e.g. in tests),
    then :meth:`train`.

    ``reward_fn``: optional ``{name: reward callable}`` used instead of building ``reward.weights`` from the
    registry (each still wrapped with the fault handling of ``reward.*``).
    ``accelerator``: optional ready ``accelerate.Accelerator`` (tests force FSDP on CPU this way)."""

    def __init__(self, cfg: TrainConfig, adapter=None, reward_fn: Optional[Mapping[str, Callable]] = None,
                 accelerator=None):
        from accelerate.utils import DistributedType

        from mmgrpo.utils.seeding import seed_everything

        self.cfg = cfg
        self.accelerator = acc = accelerator if accelerator is not None else self._build_accelerator()
        self.rank, self.world = acc.process_index, acc.num_processes
        self._check_launch()
        self.is_main, self.device = acc.is_main_process, acc.device
        self.sharded = acc.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)
        self.deepspeed = acc.distributed_type == DistributedType.DEEPSPEED
        self._preflight(loading=adapter is None, reward_fn=reward_fn)  # exit 2 before loading (build.py)
        self.out = Path(cfg.run.output_dir)
        # one run per output folder (main process), before the model is loaded: a second run refuses at once
        self._run_lock = acquire_run_lock(self.out, self.is_main, owner=self)
        if self.is_main:  # folders of an export killed half-way (two copies of the weights): this run owns the folder
            clean_stale_exports(self.out)
        seed_everything(cfg.run.seed)  # identical LoRA init on every process (DDP also broadcasts rank 0's)
        self.adapter = adapter if adapter is not None else self._build_adapter()
        set_num_frames(self.adapter, cfg.sample.num_frames)
        set_shift(self.adapter, cfg.sample.shift)
        self._validate()
        self._setup_model()
        self.credit = get_credit(credit_name(cfg.sample.credit, cfg.reward.mode))  # flow_grpo.methods table
        # a method's own state and hooks (rollout weights, loss, per-epoch update; see flow_grpo.methods.base.Credit)
        self.method_runtime = self.credit.runtime(self) if self.credit.runtime is not None else None
        self.rewards = RewardStack(cfg.reward, reward_fn)
        self.reward_fn = self.rewards.pointwise
        self.runner = None
        if cfg.reward.async_workers > 0:
            from flow_grpo.rewards import AsyncRewardRunner

            self.runner = AsyncRewardRunner(self.rewards.pointwise, max_workers=cfg.reward.async_workers)
        self.prompts, self.metadata = train_prompts(cfg.data)
        self.eval_prompts, self.eval_metadata = eval_prompts(cfg.data)
        self._bind_reference_images()
        if cfg.run.eval_every and not self.eval_prompts:
            raise ValueError("run.eval_every > 0 needs eval prompts: set data.eval_path or data.eval_prompts")
        self._setup_run_state()

    def _setup_run_state(self) -> None:
        """Counters, budget, logger and the checkpoint folders."""
        from mmgrpo.utils.checkpoint import CheckpointManager

        cfg = self.cfg
        self.epoch = 0
        self.global_step = 0      # attempted optimizer steps (applied + skipped); drives the EMA updates and logging
        self.budget = TimeBudget(cfg.run.max_train_seconds, cfg.run.budget_clock)
        self.budget_stopped = False
        self._signals: Optional[StopOnSignal] = None  # active during train(): SIGTERM / SIGINT stop at an epoch edge
        self.skips = SkipHalt(cfg.optim.max_consecutive_skips)  # non-finite skip-and-halt state (checkpointed)
        self.counters = {"applied_steps": 0, "skipped_steps": 0, "empty_updates": 0,
                         "reward_invalid": 0, "reward_failed_calls": 0, "reward_dropped": 0, "groups_empty": 0,
                         "groups_singleton": 0, "zero_advantage_epochs": 0}
        self.best_eval: Optional[float] = None
        self.logger = None
        if self.is_main:
            from mmgrpo.utils.logging import MetricLogger

            self.logger = MetricLogger(self.out, use_tensorboard=cfg.run.tensorboard, is_main_process=True)
        # checkpoints/ folders hold epochs: epoch-XXXXXXXX (runs before issue 15 wrote step-XXXXXXXX: still resumed
        # from and pruned); halted/ folders hold the optimizer step at which the run stopped: step-XXXXXXXX
        self.ckpt = CheckpointManager(self.out / "checkpoints", keep_last=cfg.run.keep_last,
                                      keep_best=cfg.run.keep_best, best_mode="max", prefix="epoch")
        self.halt_ckpt = CheckpointManager(self.out / "halted", keep_last=None, keep_best=False)
        if self.deepspeed and self.is_main:
            log.warning("DeepSpeed: the optimizer step runs inside the last backward (engine.step), so a non-finite "
                        "loss/gradient is counted but cannot be skipped by the trainer (this path is untested)")

    # ------------------------------------------------------------------ samples and rewards
    def _epoch_samples(self, epoch: int, lo: Optional[int] = None, hi: Optional[int] = None):
        """Samples ``[lo, hi)`` of the epoch (default: this process's slice): :func:`flow_grpo.data.epoch_samples`."""
        if lo is None:
            per = self.cfg.data.group_size * self.cfg.data.groups_per_epoch // self.world
            lo, hi = self.rank * per, (self.rank + 1) * per
        return epoch_samples(self.cfg, self.prompts, self.metadata, epoch, lo, hi)

    def _epoch_members(self) -> list[int]:
        """Index of each of this process's samples in its group (the layout of :meth:`_epoch_samples`)."""
        G = self.cfg.data.group_size
        per = G * self.cfg.data.groups_per_epoch // self.world
        return [s % G for s in range(self.rank * per, (self.rank + 1) * per)]

    def _rollout(self, epoch: int) -> tuple[Trajectories, dict]:
        """Sample and score the epoch's trajectories (rewards in a background thread per chunk); returns them and
        the reward call counters. A failed reward call (``on_failure=stop``) or a signal abandons the epoch: its RNG
        is rolled back so that it is redrawn on resume."""
        from mmgrpo.utils.checkpoint import capture_rng_state, restore_rng_state

        rng_at_start = capture_rng_state()
        prompts, meta, gids, xs, ns, ps = self._epoch_samples(epoch)
        self.model.eval()
        traj, err = None, None
        rt = self.method_runtime
        try:
            with rt.rollout() if rt is not None and hasattr(rt, "rollout") else contextlib.nullcontext():
                traj = sample_trajectories(self.adapter, prompts, self.cfg.sample, xs, ns, ps, gids, meta,
                                           self.reward_fn, None, iteration=epoch, reward_runner=self.runner,
                                           members=self._epoch_members(), on_chunk=self._sampling_progress())
        except RewardCallFailed as exc:
            err = exc
        except SamplingInterrupted:  # a signal during sampling: the epoch is discarded below (every process)
            pass
        try:
            sync_failure(err)
        except RewardCallFailed as exc:  # reward.on_failure=stop: checkpoint before the epoch, then stop (exit 3)
            restore_rng_state(rng_at_start)
            self._stop_on_reward_failure(exc, epoch)
        if self._signals is not None and self._signals.agreed(self._reduce_max):  # before any update of the epoch
            restore_rng_state(rng_at_start)
            self._interrupt(f"epoch {epoch} (its samples were discarded before any update)")
        rc = self.rewards.take_counters()
        if self.rewards.pairwise is not None:  # reward.mode=win_rate: the totals become win rates
            self._apply_win_rates(traj)
            rc2 = self.rewards.take_counters()
            rc = {k: rc[k] + rc2[k] for k in rc}
        return traj, rc

    def _apply_win_rates(self, traj: Trajectories) -> None:
        """Pref-GRPO win rates of the gathered batch (:func:`flow_grpo.scoring.apply_win_rates`)."""
        n_all = len(traj) * self.world
        prompts, meta, *_ = self._epoch_samples(self.epoch, 0, n_all) if self.world > 1 else (traj.prompts,
                                                                                             traj.metadata)
        rc = self.cfg.reward
        apply_win_rates(traj, self.rewards.pairwise, prompts, meta, self.rank, self.world, self.device,
                        win_rate_weight=rc.win_rate_weight, pointwise_weight=rc.pointwise_weight)

    # ------------------------------------------------------------------ advantages (the credit table)
    def credit_inputs(self, traj: Trajectories) -> CreditInputs:
        """The explicit tensors a credit function reads (this process's rows; ``gather`` reaches all processes)."""
        o = self.cfg.optim
        valid = traj.rewards.get("valid")
        valid = torch.ones(len(traj), dtype=torch.bool) if valid is None else valid.bool()
        return CreditInputs(rewards=traj.rewards, group_ids=traj.group_ids, valid=valid, train_mask=traj.train_mask,
                            step_indices=traj.step_indices, sigmas=traj.sigmas, weights=self.rewards.weights,
                            opts=AdvOptions.from_optim(o), step_rewards=traj.step_rewards, device=self.device,
                            gather=lambda ts: _gather_rows(ts, self.device), sampling=traj.sampling,
                            members=traj.members, prompt_keys=_prompt_keys(traj.prompts),
                            runtime=self.method_runtime)

    def compute_advantages(self, traj: Trajectories) -> tuple[torch.Tensor, dict]:
        """(N, T) advantages of the trained columns (0 where not trained or invalid) from the credit table
        (:mod:`flow_grpo.methods`) and statistics of the whole gathered batch (all processes)."""
        inp = self.credit_inputs(traj)
        stats = group_stats(inp)
        out = self.credit.advantages(inp)
        stats.update(out.stats)
        mask = inp.train_mask & inp.valid.unsqueeze(1)
        adv = out.advantages * mask.float()
        stats.update(advantage_stats(adv, mask, inp.gather))
        return adv, stats

    # ------------------------------------------------------------------ loss of one column
    def _column_loss(self, traj: Trajectories, chunk, col: int, adv: torch.Tensor, n_global: float,
                     dummy: bool = False):
        """Loss of one micro-batch (rollout chunk x trained column), normalised by the global pair count.
        ``dummy``: same forward(s) with a zero mask (equalises micro-batch counts across processes)."""
        from mmgrpo.core import policy_loss

        from .sde import kl_on_mean, kl_on_velocity, sde_step

        rt = self.method_runtime
        if rt is not None and hasattr(rt, "loss"):  # a method with its own loss (DiffusionNFT)
            return rt.loss(traj, chunk, col, adv, n_global, dummy)
        c = self.cfg
        c0, c1 = chunk
        mask = traj.train_mask[c0:c1, col].to(self.adapter.device)
        if dummy:
            mask = torch.zeros_like(mask)
        with self.accelerator.autocast():
            out, v = score_column(self.adapter, traj, chunk, col, return_velocity=True)
        logp = out.log_prob.float()
        old = traj.log_probs[c0:c1, col].to(logp.device)
        a = adv[c0:c1, col].to(logp.device)
        res = policy_loss(logp.unsqueeze(1), old.unsqueeze(1), a.unsqueeze(1), mask.unsqueeze(1),
                          clip_low=c.optim.clip_low, agg="token_mean", num_tokens=n_global)
        loss = res.loss
        kl_val = 0.0
        if c.optim.kl_coef > 0:
            s = traj.sampling
            with torch.no_grad(), self.adapter.reference(), self.accelerator.autocast():
                v_ref = self.adapter.predict_velocity(traj.latents[c0:c1, col], traj.sigmas[col].item(),
                                                      self.adapter.encode_prompts(traj.prompts[c0:c1]),
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
        if dummy:
            # zero-weight pass: keeps every parameter in the graph (DDP/FSDP hooks fire) without contributing
            loss = loss * 0.0 + 0.0 * v.sum()
        return loss, res.metrics, kl_val, int(mask.sum())

    # ------------------------------------------------------------------ one optimizer step
    def _update(self, traj: Trajectories, adv: torch.Tensor, chunk_ids, train_mask: torch.Tensor,
                acc_metrics: dict, per_col: dict, kls: list) -> tuple[str, float]:
        """One optimizer step over the given rollout chunks. Returns (status, grad_norm) with status
        ``applied`` | ``skipped`` (non-finite loss or gradient norm on any process) | ``empty`` (no trained pair
        on any process)."""
        acc = self.accelerator
        micro = []
        local_pairs = 0
        for i in chunk_ids:
            c0, c1 = traj.chunks[i]
            for col in range(train_mask.shape[1]):
                cnt = int(train_mask[c0:c1, col].sum())
                if cnt:
                    micro.append((traj.chunks[i], col))
                    local_pairs += cnt
        n_global = _reduce([float(local_pairs)], "sum", self.device)[0]  # loss normaliser: global pair count
        m_max = int(_reduce([float(len(micro))], "max", self.device)[0])  # every process runs this many passes
        if n_global == 0:
            return "empty", 0.0
        self.model.train()
        loss_ok = True
        for j in range(m_max):
            last = j == m_max - 1
            dummy = j >= len(micro)
            ch, col = (traj.chunks[0], 0) if dummy else micro[j]
            acc.sync_gradients = last  # DeepSpeed: gradient-accumulation boundary only on the last micro-batch
            with contextlib.nullcontext() if last else acc.no_sync(self.model):
                loss, m, kl_val, _ = self._column_loss(traj, ch, col, adv, n_global, dummy=dummy)
                loss_ok &= bool(torch.isfinite(loss.detach()).all())
                # the backends average gradients over processes; * world turns that into the global sum
                acc.backward(loss * self.world)
            if not dummy:
                for k, v in m.items():
                    s_, n_ = acc_metrics.get(k, (0.0, 0))
                    acc_metrics[k] = (s_ + float(v), n_ + 1)
                per_col.setdefault(int(traj.step_indices[col]), []).append(float(m.get("ratio_mean", 1.0)))
                if self.cfg.optim.kl_coef > 0:
                    kls.append(kl_val)
        acc.sync_gradients = True
        max_norm = self.cfg.optim.max_grad_norm if self.cfg.optim.max_grad_norm > 0 else float("inf")
        gn = acc.clip_grad_norm_(self.model.parameters(), max_norm)
        gn = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn) if gn is not None else float("nan")
        bad = _reduce([0.0 if (loss_ok and math.isfinite(gn)) else 1.0], "max", self.device)[0] > 0
        if bad and not self.deepspeed:
            self.optimizer.zero_grad(set_to_none=True)
            return "skipped", gn
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return ("skipped" if bad else "applied"), gn

    # ------------------------------------------------------------------ one epoch
    def train_epoch(self) -> dict:
        """Rollout -> credit (advantages, train mask) -> ``optim.inner_epochs`` x ``updates_per_epoch`` optimizer
        steps -> metrics of the whole gathered batch."""
        c = self.cfg
        t0 = time.perf_counter()
        traj, reward_counts = self._rollout(self.epoch)
        t_sample = time.perf_counter() - t0
        adv, stats = self.compute_advantages(traj)
        valid = traj.rewards["valid"]
        adv_ok = _reduce([0.0 if bool(torch.isfinite(adv).all()) else 1.0], "max", self.device)[0] == 0
        # no group kept >= 2 valid samples (every reward call failed / non-finite, on every process: the statistics
        # are global): nothing to learn from -> the updates count as skipped steps (feed max_consecutive_skips)
        no_group = stats["adv/groups_empty"] + stats["adv/groups_singleton"] >= c.data.groups_per_epoch
        skip_cause = ("no valid reward (no group kept two valid samples: failed or non-finite reward calls)"
                      if no_group else None if adv_ok else "non-finite advantages")
        if skip_cause is None:  # every advantage 0: a zero gradient (run_control.py)
            skip_cause = self._zero_advantage_cause(traj, adv)
        traj.train_mask = apply_train_masks(c, adv, traj.train_mask & valid.unsqueeze(1), self.credit_inputs(traj))
        t1 = time.perf_counter()
        upd = self._run_updates(traj, adv, skip_cause)
        rt = self.method_runtime
        out_rt = (rt.end_epoch(traj) or {}) if rt is not None and hasattr(rt, "end_epoch") else {}
        t_train = time.perf_counter() - t1
        rsum = self._count_epoch(stats, reward_counts)
        out = epoch_metrics(self, traj, stats, rsum, upd, t_sample, t_train)
        out.update(out_rt)
        self._last_traj = traj
        return out

    def _run_updates(self, traj: Trajectories, adv: torch.Tensor, skip_cause: Optional[str]) -> dict:
        """The epoch's optimizer steps: the rollout chunks (whole trajectories, all their steps) split into
        ``updates_per_epoch`` groups, ``inner_epochs`` passes. ``skip_cause``: skip every step (counted) for it."""
        c = self.cfg
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
                    status, gn = self._update(traj, adv, range(bounds[u], bounds[u + 1]), traj.train_mask,
                                              upd["acc_metrics"], upd["per_col"], upd["kls"])
                upd["status"][status] += 1
                self._after_update(status, gn, u, skip_cause or f"non-finite loss/gradients (grad norm {gn})",
                                   upd["grad_norms"])
        return upd

    def _after_update(self, status: str, gn: float, u: int, what: str, grad_norms: list) -> None:
        """Counters, EMA and the halt after ``optim.max_consecutive_skips`` skipped steps in a row."""
        c = self.cfg
        if status == "empty":
            self.counters["empty_updates"] += 1
            return
        self.global_step += 1
        if status == "applied":
            grad_norms.append(gn)
            self.counters["applied_steps"] += 1
            self.skips.applied()
            if self.ema is not None and self.global_step % c.ema.update_every == 0:
                self.ema.update(self.global_step)
            return
        self.counters["skipped_steps"] += 1
        halt = self.skips.skipped(what)
        log.warning("epoch %d update %d: %s: optimizer step skipped (%d in a row)",
                    self.epoch, u, what, self.skips.consecutive)
        if halt:
            self._halt(what)

    def _count_epoch(self, stats: dict, reward_counts: dict) -> list[float]:
        """Run totals of dropped samples, failed reward calls and degenerate groups; returns the epoch's reward call
        counters (:data:`~flow_grpo.epoch_metrics.REWARD_COUNTERS`) summed over processes."""
        rsum = _reduce([reward_counts.get(k, 0) for k in REWARD_COUNTERS], "sum", self.device)
        self.counters["reward_invalid"] += int(stats["reward/invalid"])
        self.counters["reward_failed_calls"] += int(rsum[3])
        self.counters["reward_dropped"] += int(rsum[4])
        self.counters["groups_empty"] += int(stats["adv/groups_empty"])
        self.counters["groups_singleton"] += int(stats["adv/groups_singleton"])
        if stats["reward/invalid"] or stats["adv/groups_empty"] or stats["adv/groups_singleton"]:
            log.warning("epoch %d: %d samples dropped (invalid reward: non-finite or failed call), %d groups empty, "
                        "%d groups with one member (advantage 0)", self.epoch, int(stats["reward/invalid"]),
                        int(stats["adv/groups_empty"]), int(stats["adv/groups_singleton"]))
        return rsum

    # ------------------------------------------------------------------ main loop
    def train(self, num_epochs: Optional[int] = None) -> list[dict]:
        """Train to ``run.num_epochs`` (or ``num_epochs`` more). SIGTERM / SIGINT stop it at the next epoch boundary
        (or abandon the epoch if its samples are still being drawn) after a checkpoint: :class:`TrainingInterrupted`."""
        with StopOnSignal() as self._signals:
            try:
                return self._train(num_epochs)
            finally:
                self._signals = None

    def _train(self, num_epochs: Optional[int] = None) -> list[dict]:
        from tqdm.auto import tqdm

        from mmgrpo.utils.config import save_config

        c = self.cfg
        if self.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            save_config(c, self.out / "config.yaml")
        resumed = self.maybe_resume()
        if resumed is not None and self.is_main:
            log.info("resumed from %s at epoch %d (step %d)", resumed, self.epoch, self.global_step)
        end = c.run.num_epochs if num_epochs is None else self.epoch + num_epochs
        if self._budget_exhausted():  # a resumed run whose budget is already spent
            end = self.epoch
        history = []
        bar = tqdm(total=end, initial=self.epoch, desc="flow GRPO", unit="epoch", dynamic_ncols=True,
                   disable=not (c.run.progress_bar and self.is_main))
        while self.epoch < end:
            if self._signals is not None and self._signals.agreed(self._reduce_max):  # every process, same epoch
                self._interrupt(f"epoch {self.epoch}")
            self.budget.start()  # only epochs count (not evals / checkpoint writes)
            metrics = self.train_epoch()
            metrics["time/train_budget_s"] = self.budget.lap()
            self.epoch += 1
            bar.update(1)
            bar.set_postfix(reward=f"{metrics.get('reward/total/mean', float('nan')):.3f}", refresh=False)
            if self._budget_exhausted():  # this epoch is the last one: final eval, checkpoint and export follow
                end = self.epoch
            history.append(self._end_of_epoch(metrics, final=self.epoch == end))
        bar.close()
        self._finish(history)
        return history

    def _end_of_epoch(self, metrics: dict, final: bool) -> dict:
        """Eval (if due), log, grid, and a checkpoint if due or the eval is the best so far."""
        c = self.cfg
        ev = self.evaluate() if self._eval_due(final=final) else None
        if ev is not None:
            metrics.update(ev)
        if self.logger is not None:
            self.logger.log(metrics, self.global_step)
            self._save_train_grid()
        metric = ev["eval/reward/total/mean"] if ev is not None else None
        if metric is not None and not math.isfinite(metric):
            metric = None
        new_best = metric is not None and (self.best_eval is None or metric > self.best_eval)
        if new_best:
            self.best_eval = metric
        due = bool(c.run.save_every and self.epoch % c.run.save_every == 0) or final
        if due or (new_best and c.run.keep_best):
            self.save_checkpoint(metric=metric)
        return metrics

    def _finish(self, history: list[dict]) -> None:
        """Refuse a run that trained nothing, export the weights, plot the reward curves."""
        self._check_trained()  # raises (no export) if no optimizer step of the run was applied
        # a resumed run with no epochs left still repairs a missing / damaged / outdated export
        if history or (self.epoch > 0 and self._export_outdated()):
            self._check_replicas_in_sync()
            self.export_final()
        if history and self.is_main and self.cfg.run.reward_curves:
            self._plot_curves()
        if self.logger is not None:
            self.logger.flush()

    def close(self) -> None:
        from mmgrpo.utils.runlock import release_run_lock

        if self.is_main:
            release_run_lock(self.out)
        if self.runner is not None:
            self.runner.shutdown(wait=False)
            self.runner = None
        if self.logger is not None:
            self.logger.close()


def train_from_config(cfg: TrainConfig) -> list[dict]:
    tr = FlowGRPOTrainer(cfg)
    try:
        return tr.train()
    finally:
        tr.close()
