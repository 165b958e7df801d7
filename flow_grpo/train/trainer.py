"""The flow-matching GRPO recipe: :class:`FlowGRPOTrainer` sets a run up, :meth:`FlowGRPOTrainer.train` is the
loop, top to bottom; methods differ only by config (see :mod:`flow_grpo.config`).

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

Where the pieces live: the recipe is this package (``flow_grpo/train/``): the loop and the run state here
(:class:`RunState`, its checkpoint entries :meth:`FlowGRPOTrainer.run_entries`), the epoch's stages in
:mod:`flow_grpo.train.steps`. The
methods (credits, sampling plans, train masks, their hooks) are :mod:`flow_grpo.methods` (a registry looked up by
config value: the recipe names no method). The library it calls with explicit arguments: sampling in
:mod:`flow_grpo.sampler`, reward calls in :mod:`flow_grpo.scoring`, setup in :mod:`flow_grpo.build`, checkpoints
and export of the trained model in :mod:`flow_grpo.checkpoint`, eval and grids in :mod:`flow_grpo.evaluation`,
epoch metrics in :mod:`flow_grpo.epoch_metrics`, prompt files and the sample layout in :mod:`flow_grpo.data`;
signals, skipped steps and the budget in the :class:`~mmgrpo.engine.guard.RunGuard` shared with the VLM recipe.

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

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from mmgrpo.engine.checkpoint import restore_rng
from mmgrpo.engine.guard import RunGuard
from mmgrpo.utils.export import clean_stale_exports
from mmgrpo.utils.logging import get_logger
from mmgrpo.utils.runlock import acquire_run_lock

from flow_grpo import build, checkpoint, evaluation, seq_parallel
from flow_grpo.config import TrainConfig
from flow_grpo.data import eval_prompts, prompts_sha256, train_prompts
from flow_grpo.epoch_metrics import epoch_metrics
from flow_grpo.methods import build_methods, credit_method
from flow_grpo.sampler import Trajectories
from flow_grpo.scoring import RewardStack
from flow_grpo.train import steps

if TYPE_CHECKING:
    from flow_grpo.build import TrainedModel
    from flow_grpo.ema import EMA
    from flow_grpo.methods.base import FlowMethod
    from flow_grpo.models.base import FlowModelAdapter

# get_logger gives the "flow_grpo" logger a stderr handler at INFO (unless the root logger is configured): with a
# bare logging.getLogger, info lines such as "resumed from ..." were never printed
log = get_logger("flow_grpo.trainer")

__all__ = ["FlowGRPOTrainer", "RunState", "train_from_config"]


def _new_counters() -> dict[str, int]:
    return {"applied_steps": 0, "skipped_steps": 0, "empty_updates": 0, "reward_invalid": 0,
            "reward_failed_calls": 0, "reward_dropped": 0, "groups_empty": 0, "groups_singleton": 0,
            "zero_advantage_epochs": 0}


@dataclass
class RunState:
    """What changes during a flow run. ``epoch``, ``global_step``, ``counters`` and ``best_eval`` are checkpointed
    (with the guard's skip / budget state and every method's ``state_dict``); the rest is this process's memory."""

    epoch: int = 0  # epochs done (one rollout + its updates each); also the data position
    global_step: int = 0  # attempted optimizer steps (applied + skipped); drives the EMA updates and logging
    counters: dict[str, int] = field(default_factory=_new_counters)  # run totals
    best_eval: Optional[float] = None  # the best eval reward so far (keep_best)
    last_traj: Optional[Trajectories] = None  # the last epoch's rollouts
    last_zero_advantage: Optional[str] = None  # why the last epoch without a reward signal had none (the message)
    started: bool = False  # train() resumed / started the run (a second call continues it)


class FlowGRPOTrainer:
    """Build with a config (and optionally a ready adapter / reward components / accelerator, e.g. in tests),
    then :meth:`train`. Everything set here stays fixed for the run; what changes is ``self.state``.

    ``reward_fn``: optional ``{name: reward callable}`` used instead of building ``reward.weights`` from the
    registry (each still wrapped with the fault handling of ``reward.*``).
    ``accelerator``: optional ready ``accelerate.Accelerator`` (tests force FSDP on CPU this way)."""

    adapter: FlowModelAdapter  # the model (flow_grpo.models): prompt encoding, velocity, latents <-> pixels
    trained: TrainedModel  # the trained weights, optimizer, schedule, EMA: what checkpoints and exports take
    ema: Optional[EMA]  # an exponential moving average of the trained weights (ema.enabled)
    methods: list[FlowMethod]  # the enabled methods (flow_grpo.methods), in registry (= hook) order
    credit: FlowMethod  # the one credit method among them: advantages, sampling plan, step rewards

    def __init__(self, cfg: TrainConfig, adapter=None, reward_fn: Optional[Mapping[str, Callable]] = None,
                 accelerator=None):
        from accelerate.utils import DistributedType

        from mmgrpo.utils.checkpoint import CheckpointManager
        from mmgrpo.utils.seeding import seed_everything

        self.cfg = cfg
        self.accelerator = acc = accelerator if accelerator is not None else build.make_accelerator(cfg)
        self.rank, self.world = acc.process_index, acc.num_processes
        build.check_launch(acc)
        self.is_main, self.device = acc.is_main_process, acc.device
        self.sharded = acc.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)
        self.deepspeed = acc.distributed_type == DistributedType.DEEPSPEED
        build.preflight(cfg, acc, self.world, self.sharded, self.deepspeed, loading=adapter is None,
                        reward_fn=reward_fn)  # settings that fail only after loading: exit 2 now
        self.out = Path(cfg.run.output_dir)
        # one run per output folder (main process), before the model is loaded: a second run refuses at once
        self.run_lock = acquire_run_lock(self.out, self.is_main, owner=self)
        if self.is_main:  # folders of an export killed half-way (two copies of the weights): this run owns the folder
            clean_stale_exports(self.out)
        seed_everything(cfg.run.seed)  # identical LoRA init on every process (DDP also broadcasts rank 0's)
        self.adapter = adapter if adapter is not None else build.load_adapter(cfg, acc.device)
        build.set_num_frames(self.adapter, cfg.sample.num_frames)
        build.set_shift(self.adapter, cfg.sample.shift)
        build.set_vae_memory(self.adapter, cfg.model)
        build.set_text_encoder_offload(self.adapter, cfg.model.offload_text_encoders)
        # run.sequence_parallel > 1: rank / world index the data-parallel groups (flow_grpo.seq_parallel)
        self.sp = seq_parallel.setup(cfg, acc, self.adapter)
        if self.sp is not None:
            self.rank, self.world = self.sp.dp_rank, self.sp.dp_world
        build.validate(cfg, self.adapter, self.world, self.sharded)
        # the trained model: what checkpoints, exports and evaluation take (no run state in it)
        self.trained = m = build.setup_model(cfg, acc, self.adapter, self.sharded,
                                             before_prepare=self.sp.enable if self.sp is not None else None)
        self.model, self.optimizer, self.lr_scheduler = m.model, m.optimizer, m.lr_scheduler
        self.unwrapped, self.named_params, self.params, self.ema = m.unwrapped, m.named_params, m.params, m.ema
        self.reference_info = m.reference_info
        self.state = RunState()
        self.methods = build_methods(cfg, self)  # flow_grpo.methods: their hooks, in registry order
        self.credit = credit_method(cfg, methods=self.methods)  # the one credit: advantages, plan, step rewards
        self.credit.check_sampling(cfg.sample)  # before any sampling
        self.estimator = self.credit.advantage_estimator()
        # the policy loss of one micro-batch: the PPO column loss unless a method brings its own (DiffusionNFT)
        self.loss = next((fn for mt in self.methods if (fn := mt.loss()) is not None),
                         partial(steps.column_loss, self))
        self.rewards = RewardStack(cfg.reward, reward_fn)
        if self.sp is not None:  # one reward call per sequence-parallel group, its result sent to the others
            self.rewards.pointwise = self.sp.shared(self.rewards.pointwise)
        self.reward_fn = self.rewards.pointwise
        self.runner = None
        if cfg.reward.async_workers > 0:
            from flow_grpo.rewards import AsyncRewardRunner

            self.runner = AsyncRewardRunner(self.rewards.pointwise, max_workers=cfg.reward.async_workers)
        self.prompts, self.metadata = train_prompts(cfg.data)
        self.eval_prompts, self.eval_metadata = eval_prompts(cfg.data)
        build.bind_reference_images(self.adapter, cfg.data, (self.prompts, self.metadata),
                                    (self.eval_prompts, self.eval_metadata), self.is_main)
        if cfg.run.eval_every and not self.eval_prompts:
            raise ValueError("run.eval_every > 0 needs eval prompts: set data.eval_path or data.eval_prompts")
        self.guard = RunGuard(cfg.optim.max_consecutive_skips, cfg.run.max_train_seconds, cfg.run.budget_clock,
                              device=self.device)
        self.logger = None
        if self.is_main:
            from mmgrpo.utils.logging import MetricLogger

            self.logger = MetricLogger(self.out, use_tensorboard=cfg.run.tensorboard, is_main_process=True)
        # checkpoints/ folders hold epochs: epoch-XXXXXXXX; halted/ folders hold the optimizer step at which the run
        # stopped: step-XXXXXXXX
        self.ckpt = CheckpointManager(self.out / "checkpoints", keep_last=cfg.run.keep_last,
                                      keep_best=cfg.run.keep_best, best_mode="max", prefix="epoch")
        self.halt_ckpt = CheckpointManager(self.out / "halted", keep_last=None, keep_best=False)
        # every early end (signal, reward failure, skipped steps) checkpoints through the guard: one path (engine)
        self.guard.attach(save=self.save, position=lambda: self.state.epoch, unit="epoch",
                          flush=self.logger.flush if self.logger is not None else lambda: None)
        if self.deepspeed and self.is_main:
            log.warning("DeepSpeed: the optimizer step runs inside the last backward (engine.step), so a non-finite "
                        "loss/gradient is counted but cannot be skipped by the trainer (this path is untested)")

    # ------------------------------------------------------------------------------------------- the loop
    def train(self, num_epochs: Optional[int] = None) -> list[dict]:
        """Train to ``run.num_epochs`` (or ``num_epochs`` more); once ``run.num_epochs`` are done (or the time budget
        is spent) the run ends: nothing-trained check, export, reward curves. SIGTERM / SIGINT stop it at the next
        epoch boundary (or abandon the epoch if its samples are still being drawn) after a checkpoint:
        :class:`TrainingInterrupted`.

        The first call resumes (``run.resume_from``) or begins the run; a later call on the same object continues
        from its state in memory, which is ahead of any checkpoint (re-reading one would undo epochs), and a call
        after the run ended does nothing. The VLM recipe's ``train`` behaves the same."""
        from tqdm.auto import tqdm

        from mmgrpo.utils.config import save_config

        c, st, guard = self.cfg, self.state, self.guard
        with guard.watching_signals():
            if self.is_main:
                self.out.mkdir(parents=True, exist_ok=True)
                save_config(c, self.out / "config.yaml")
            resumed = self.resume() if not st.started else None  # once per trainer object
            if resumed is not None and self.is_main:
                log.info("resumed from %s at epoch %d (step %d)", resumed, st.epoch, st.global_step)
            if not st.started:
                for mt in self.methods:
                    mt.on_train_start(resumed is not None)
            st.started = True
            end = c.run.num_epochs if num_epochs is None else min(c.run.num_epochs, st.epoch + num_epochs)
            if guard.out_of_budget(f"epoch {st.epoch}"):  # a resumed run whose budget is already spent
                end = st.epoch
            history = []
            bar = tqdm(total=end, initial=st.epoch, desc="flow GRPO", unit="epoch", dynamic_ncols=True,
                       disable=not (c.run.progress_bar and self.is_main))
            while st.epoch < end:
                # -- stop point: SIGTERM / SIGINT (every process stops at the same epoch)
                if guard.signalled():
                    guard.interrupt()
                guard.budget.start()  # only epochs count (not evals / checkpoint writes)
                # -- rollout -> rewards (a failed reward call or a signal abandons the epoch here: RNG rolled back)
                t0 = time.perf_counter()
                traj, reward_counts = steps.rollout(self, st.epoch)
                t_sample = time.perf_counter() - t0
                for mt in self.methods:  # reward shaping (ensembles, PAR, log-tamed aggregation)
                    mt.on_rewards(traj)
                # -- advantages (the credit), then the methods' train masks
                adv, stats = steps.advantages(self, traj)
                skip_cause = steps.skip_cause(self, traj, adv, stats)  # None, or why no step can be applied
                traj.train_mask, traj.advantages = traj.train_mask & traj.rewards["valid"].unsqueeze(1), adv
                for mt in self.methods:
                    traj = mt.on_advantages(traj)
                # -- loss and optimizer steps (updates_per_epoch x inner_epochs), then the methods' end of epoch
                t1 = time.perf_counter()
                upd = steps.run_updates(self, traj, adv, skip_cause)
                extra: dict = {}
                for mt in self.methods:
                    mt.end_of_step(traj, extra)
                t_train = time.perf_counter() - t1
                # -- the epoch's metrics over the whole gathered batch
                rsum = steps.count_epoch(self, stats, reward_counts)
                metrics = {"epoch": st.epoch, **epoch_metrics(
                    traj, stats, rsum, upd, t_sample, t_train, reward_names=list(self.rewards.weights),
                    win_rate=self.rewards.pairwise is not None, kl_coef=c.optim.kl_coef, device=self.device),
                    "lr": float(self.lr_scheduler.get_last_lr()[0]),
                    "steps/skipped_total": float(st.counters["skipped_steps"]),
                    "steps/consecutive_skips": float(guard.consecutive_skips), **extra}
                st.last_traj = traj
                metrics["time/train_budget_s"] = guard.budget.lap()
                st.epoch += 1
                bar.update(1)
                bar.set_postfix(reward=f"{metrics.get('reward/total/mean', float('nan')):.3f}", refresh=False)
                if guard.out_of_budget(f"epoch {st.epoch}"):  # the time budget is spent: the run's last epoch
                    end = st.epoch
                # -- eval (if due), log, sample grid; checkpoint if due or the eval is the best so far
                final = st.epoch == c.run.num_epochs or guard.budget_stopped  # the run's last epoch (not the call's)
                ev = None
                if self.eval_prompts and (final or (c.run.eval_every and st.epoch % c.run.eval_every == 0)):
                    ev = self.evaluate()
                metrics.update(ev or {})
                if self.logger is not None:
                    self.logger.log(metrics, st.global_step)
                    if c.run.image_grid_every and st.epoch % c.run.image_grid_every == 0:
                        evaluation.save_train_grid(traj, self.out / "samples" / f"epoch_{st.epoch:05d}.png",
                                                   c.data.group_size)
                metric = ev["eval/reward/total/mean"] if ev is not None else None
                metric = metric if metric is not None and math.isfinite(metric) else None
                new_best = metric is not None and (st.best_eval is None or metric > st.best_eval)
                st.best_eval = metric if new_best else st.best_eval
                if bool(c.run.save_every and st.epoch % c.run.save_every == 0) or final or (new_best and
                                                                                          c.run.keep_best):
                    self.save(metric)
                history.append(metrics)
            bar.close()
            if st.epoch >= c.run.num_epochs or guard.budget_stopped:  # the run is over: check, export, plot
                self._finish(history)
        return history

    # ------------------------------------------------------------------------------------------- run pieces
    def credit_inputs(self, traj: Trajectories):
        """The explicit tensors a credit or train-mask function reads (for the methods: :func:`steps.credit_inputs`)."""
        return steps.credit_inputs(self, traj)

    def evaluate(self) -> dict:
        """Collective. The eval prompts' rewards under the current (EMA, if on) weights; the main process writes the
        grid ``samples/eval_epoch_XXXXX.png`` (:func:`flow_grpo.evaluation.evaluate`)."""
        c, st = self.cfg, self.state
        return evaluation.evaluate(
            self.adapter, self.rewards, self.eval_prompts, self.eval_metadata, c.sample, c.run.seed, ema=self.ema,
            rank=self.rank, world=self.world, device=self.device,
            grid=self.out / "samples" / f"eval_epoch_{st.epoch:05d}.png" if self.is_main else None,
            logger=self.logger if c.run.tensorboard else None, step=st.global_step)

    # ------------------------------------------------------------------------------------------- checkpoints
    def save(self, metric: Optional[float] = None, halted: bool = False) -> Optional[Path]:
        """Collective: every process calls it. Writes the trained model and :meth:`run_entries` to
        ``checkpoints/epoch-XXXXXXXX`` (``halted/step-XXXXXXXX`` for a halted run); returns the folder on the main
        process."""
        st = self.state
        path = checkpoint.save(self.halt_ckpt if halted else self.ckpt, st.global_step if halted else st.epoch,
                                  self.trained, self.run_entries, metric=metric)
        if not halted:
            self.guard.saved(st.epoch, path)  # a stop right after this save does not write it again
        return path

    def run_entries(self) -> dict:
        """The run's checkpoint entries (beside the trained model's): ``trainer`` (the :class:`RunState`, the guard's
        skip / budget state, the fp16 scaler, the data position), ``methods`` (every method's own state: DiffusionNFT's
        old adapter, B²-DiffuRL's history, Adv-GRPO's reward model), ``config``, ``reference``."""
        from mmgrpo.utils.config import config_to_dict

        st, d = self.state, self.cfg.data
        scaler = getattr(self.accelerator, "scaler", None)  # fp16 mixed precision only
        trainer = {"epoch": st.epoch, "global_step": st.global_step, "world": self.world,
                   "counters": dict(st.counters), **self.guard.state_dict(), "best_eval": st.best_eval,
                   "scaler": scaler.state_dict() if scaler is not None else None,
                   "data": {"epoch": st.epoch, "num_prompts": len(self.prompts),
                            "prompts_sha256": prompts_sha256(self.prompts), "group_size": d.group_size,
                            "groups_per_epoch": d.groups_per_epoch}}
        return {"trainer": trainer, "methods": {m.name: sd for m in self.methods if (sd := m.state_dict()) is not None},
                "config": config_to_dict(self.cfg), "reference": dict(self.reference_info)}

    def load_state_dict(self, st: dict, path: Optional[Path] = None) -> None:
        """A loaded checkpoint ``st`` (folder ``path``): the trained model (:func:`flow_grpo.checkpoint.load`),
        then the run state, the methods' state and this process's RNG."""
        ref = st.get("reference")
        if ref and ref.get("base_fingerprint") != self.reference_info["base_fingerprint"]:
            raise ValueError("checkpoint was trained on different base weights (fingerprint mismatch): refusing to "
                             "resume onto another model")
        tr = st["trainer"]
        data = tr.get("data", {})
        if data and data.get("prompts_sha256") != prompts_sha256(self.prompts):
            log.warning("resume: the prompt list differs from the checkpoint's; the data order will not reproduce")
        checkpoint.load(self.trained, st, path)
        saved = st.get("methods") or {}
        for m in self.methods:
            if m.state_dict() is None:
                continue
            if m.name not in saved:
                raise ValueError(f"checkpoint has no state of the method {m.name} (sample.credit="
                                 f"{self.cfg.sample.credit}; written by another method?): refusing to resume "
                                 "without it")
            m.load_state_dict(saved[m.name])
        rs = self.state
        rs.epoch = int(tr["epoch"])
        rs.global_step = int(tr["global_step"])
        rs.counters.update(tr.get("counters", {}))
        self.guard.load_state_dict(tr)
        rs.best_eval = tr.get("best_eval")
        scaler = getattr(self.accelerator, "scaler", None)
        if tr.get("scaler") is not None and scaler is not None:
            scaler.load_state_dict(tr["scaler"])
        restore_rng(st.get("rng"), self.accelerator.process_index, self.accelerator.num_processes)

    def resume(self) -> Optional[Path]:
        """Collective. ``run.resume_from``: auto (latest valid checkpoint, if any) | none | a path; returns the
        checkpoint resumed from, or None."""
        path = checkpoint.find_checkpoint(self.ckpt, self.cfg.run.resume_from, self.is_main)
        if path is None:
            return None
        self.load_state_dict(self.ckpt.load(path), path)
        self.guard.saved(self.state.epoch, path)  # an interrupt before the next epoch need not rewrite it
        return path

    def _finish(self, history: list[dict]) -> None:
        """Refuse a run that trained nothing, export the weights, plot the reward curves."""
        self._check_trained()  # raises (no export) if no optimizer step of the run was applied
        # a resumed run with no epochs left still repairs a missing / damaged / outdated export
        st, every = self.state, self.cfg.ema.update_every
        if history or (st.epoch > 0 and checkpoint.export_outdated(self.trained, self.out, st.epoch, st.global_step,
                                                                      every)):
            checkpoint.check_replicas_in_sync(self.trained)
            checkpoint.export_final(self.trained, self.out, st.epoch, st.global_step, st.counters["applied_steps"],
                                       every)
        if history and self.is_main and self.cfg.run.reward_curves:
            evaluation.reward_curves(self.out, list(self.rewards.weights))
        if self.logger is not None:
            self.logger.flush()

    def _check_trained(self) -> None:
        """A run none of whose optimizer steps was applied, or none of whose epochs had a reward signal (every
        advantage 0), fails instead of exporting "trained" weights (:meth:`RunGuard.check_trained`)."""
        st, n = self.state, self.state.counters
        zero = n["zero_advantage_epochs"]

        def nothing_applied() -> str:
            cause = self.guard.skips.last_cause or (
                "every update was empty: no trajectory had a non-zero advantage (all groups' rewards tied; "
                "optim.drop_zero_adv=true)" + (f"; {st.last_zero_advantage}" if st.last_zero_advantage else ""))
            return (f"flow_grpo: nothing was trained in {st.epoch} epoch(s): no optimizer step was applied "
                    f"({n['skipped_steps']} skipped, {n['empty_updates']} empty, {zero} epoch(s) without a reward "
                    f"signal; last cause: {cause}; {n['reward_invalid']} samples had an invalid reward, "
                    f"{n['reward_failed_calls']} reward calls failed). No final weights were exported. Check the "
                    "reward (server reachable? reward.weights / reward.kwargs) and the learning rate.")

        self.guard.check_trained(
            st.epoch, n["applied_steps"], zero, self.cfg.run.allow_no_reward_signal,
            lambda: (  # steps were taken on the KL / method loss terms alone
                f"flow_grpo: nothing was trained: none of the run's {st.epoch} epoch(s) had a reward signal (last: "
                f"{st.last_zero_advantage or 'every advantage 0'}); only the KL / method loss terms were applied. No "
                "final weights were exported. Check the reward (reward.weights / reward.kwargs: does it tell the "
                "group's images apart?); run.allow_no_reward_signal=true accepts such a run (rehearsals)"),
            nothing_applied)

    def close(self) -> None:
        from mmgrpo.utils.runlock import release_run_lock

        if self.is_main:
            release_run_lock(self.out)
        if self.runner is not None:
            self.runner.shutdown(wait=False)
            self.runner = None
        if self.logger is not None:
            self.logger.close()
        if self.sp is not None:
            self.sp.close()


def train_from_config(cfg: TrainConfig) -> list[dict]:
    tr = FlowGRPOTrainer(cfg)
    try:
        return tr.train()
    finally:
        tr.close()
