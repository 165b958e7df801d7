"""The VLM GRPO recipe: :class:`GRPOTrainer` sets a run up, :meth:`GRPOTrainer.train` is the loop, top to bottom.

One step (:meth:`GRPOTrainer.train`, inside the ``while`` loop):

1. **rollout, rewards, advantages** (:func:`~mmgrpo.vlm.train.steps.collect`): draw this process's prompts from the
   deterministic, resumable stream, prepare them (videos through ``mmgrpo.video``'s fps contract), sample each
   group's members (seeds from (seed, step, stream position, g)), score them, compute group advantages (explicit
   integer group ids = stream positions; statistics over the batch gathered from every process); the methods'
   hooks run at each of these stages (``before_rollout``, ``after_rollout``, ``on_rewards``, ``on_advantages``),
   and a method that drops groups may ask for more sampling rounds (DAPO dynamic sampling);
2. **old / reference log-probs** (:func:`~mmgrpo.vlm.train.steps.precompute`) on fixed micro-batches of whole
   groups, with the same function and padding as the loss, so on-policy ratios are exactly 1 (the output head runs
   ``algo.logprob_chunk_size`` tokens at a time: no full-vocabulary logits exist); on a process's first step the
   trainer's log-probs must also equal the rollout backend's (``rollout.onpolicy_check``,
   :mod:`mmgrpo.vlm.monitor.onpolicy`: otherwise the run stops before any update, naming the likely cause);
3. **loss and optimizer step(s)** (:func:`~mmgrpo.vlm.train.steps.optimize`): ``algo.num_iterations`` AdamW updates
   over the micro-batches with the policy loss (:func:`mmgrpo.vlm.methods.base.grpo_loss` unless a method provides
   another), normalised by *global* token / sequence counts, gradients summed across processes: the update does not
   depend on the number of processes or micro-batches;
4. **log** (every reward, zero-std fraction, clip fractions, KL, lengths, parse failures, tokens/s; sampled
   completions to ``completions.jsonl``; validation points, :mod:`mmgrpo.vlm.monitor.validation`) and **maybe
   checkpoint** (the last ``run.keep_last`` plus the best by ``run.best_metric``; :mod:`mmgrpo.vlm.checkpoint`);
   the format guard (:mod:`mmgrpo.vlm.monitor.format_guard`) watches the share of well-formed completions and of
   those at the token cap.

The recipe is this file and :mod:`.steps` (with :mod:`.setup`, which builds the run); everything they call is
library code taking explicit arguments: data (:mod:`mmgrpo.vlm.data`: stream, prompt feed, rollout batch), rewards
(:mod:`mmgrpo.vlm.rewards.scoring`), models (:mod:`mmgrpo.vlm.models.logprobs`), monitoring
(:mod:`mmgrpo.vlm.monitor`), checkpoints (:mod:`mmgrpo.vlm.checkpoint`) and the shared engine.

What changes during a run is in :class:`RunState` (checkpointed with the methods' state and the guard's); what
can end it early is the :class:`~mmgrpo.engine.guard.RunGuard` shared with the flow recipe: a reward call that
keeps failing or a non-finite reward (``reward.on_failure`` / ``on_nonfinite``), ``run.max_consecutive_skips``
skipped optimizer steps in a row (exit code 3), SIGTERM / SIGINT (polled after the rollout -- the step is then
discarded, stream and RNG roll back -- and before each step; all processes stop at the same step; exit code 6), the
time budget, a format collapse (``format_guard.action=stop``). Every stop writes a checkpoint first; a run that
applied no optimizer step, or none of whose steps had a reward signal (every advantage 0), ends with
:class:`~mmgrpo.engine.errors.NothingTrained` (exit code 4) and no final checkpoint.

Several processes: each draws its share of the global batch (``run.prompts_per_step``; a group may be split, its
advantages are computed on the gathered batch). Gradients are summed by hand for replicated weights
(``run.grad_sync=manual``, the default without FSDP / DeepSpeed) or go through ``accelerator.prepare`` (FSDP2 /
DeepSpeed). Verified on CPU only (gloo, two processes): the manual path and FSDP2 (plugin set by hand, as accelerate
refuses FSDP without GPUs), including a sharded checkpoint resume; DeepSpeed is wired the same way but untested.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

from mmgrpo.engine.guard import RunGuard
from mmgrpo.engine.parallel import generation_context
from mmgrpo.utils.checkpoint import CheckpointManager, capture_rng_state, restore_rng_state
from mmgrpo.utils.config import save_config
from mmgrpo.utils.logging import MetricLogger, get_logger
from mmgrpo.utils.runlock import acquire_run_lock
from mmgrpo.utils.seeding import seed_everything
from mmgrpo.vlm import checkpoint
from mmgrpo.vlm.config import TrainConfig
from mmgrpo.vlm.data.batch import RolloutBatch, micro_batches
from mmgrpo.vlm.data.feed import PromptFeed
from mmgrpo.vlm.data.media import MediaScreen
from mmgrpo.vlm.data.stream import PromptStream
from mmgrpo.vlm.data.task import TaskAdapter, load_samples
from mmgrpo.vlm.methods import build_methods
from mmgrpo.vlm.models.adapters import Policy
from mmgrpo.vlm.models.logprobs import TokenLogprobs
from mmgrpo.vlm.models.rollout import RolloutBackend, SamplingParams
from mmgrpo.vlm.monitor.format_guard import FormatGuard, progress_fields
from mmgrpo.vlm.monitor.metrics import completion_rows
from mmgrpo.vlm.monitor.onpolicy import OnPolicyCheck
from mmgrpo.vlm.monitor.validation import Validator
from mmgrpo.vlm.rewards.registry import accuracy_key, build_rewards
from mmgrpo.vlm.rewards.scoring import RewardScorer
from mmgrpo.vlm.train import setup
from mmgrpo.vlm.train.steps import (advantage_estimator, collect, mb_plan, optimize, policy_loss, precompute,
                                    score_samples, step_metrics)

log = get_logger("mmgrpo.train")

__all__ = ["GRPOTrainer", "RunState", "train_from_config"]


def _new_counters() -> dict[str, int]:
    return {"skipped_missing_media": 0, "skipped_bad_samples": 0, "filtered_groups": 0, "generated_tokens": 0,
            # faults: rows dropped for NaN/inf or failed rewards, reward calls that failed for good, retries and
            # timeouts, groups left with < 2 valid members, skipped optimizer steps
            "reward_nonfinite_rows": 0, "reward_failed_rows": 0, "reward_failed_calls": 0, "reward_retries": 0,
            "reward_timeouts": 0, "degenerate_groups": 0, "skipped_steps": 0,
            # steps whose every advantage was 0 (no reward signal; skipped unless a KL / entropy term)
            "zero_advantage_steps": 0}


@dataclass
class RunState:
    """What changes during a VLM run. ``step``, ``stream``, ``counters`` and ``selected`` are checkpointed (with the
    guard's skip / budget state and every method's ``state_dict``); the rest is this process's working memory."""

    step: int = 0  # optimizer steps taken (one per rollout batch)
    stream: PromptStream | None = None  # which samples the next steps draw
    counters: dict[str, int] = field(default_factory=_new_counters)  # run totals (data/*, faults/*)
    selected: list[int] | None = None  # data selection: the indices of the trainer's samples that are trained on
    started: bool = False  # train() resumed / started the run (a second call continues it)
    metrics: dict[str, float] = field(default_factory=dict)  # the last step's (what run.best_metric reads)
    batch: RolloutBatch | None = None  # the last step's rollout batch
    pad_rows: tuple | None = None  # (batch, rows) repeated with weight 0 to equalise micro-batch counts
    last_zero_advantage: str | None = None  # why the last step without a reward signal had none (the end's message)


class GRPOTrainer:
    """GRPO for Qwen-VL policies. ``samples`` / ``policy`` / ``reward_fn`` / ``backend`` may be injected (tests,
    scripts). Everything set here stays fixed for the run; what changes is ``self.state``."""

    def __init__(self, cfg: TrainConfig, samples: Sequence[Any] | None = None, policy: Policy | None = None,
                 reward_fn: Callable | None = None, accuracy_fn: Callable | None = None,
                 backend: RolloutBackend | None = None):
        self.cfg = cfg
        self.parallel = dist = setup.make_accelerator(cfg)
        self.accelerator, self.rank, self.world, self.device = dist.accelerator, dist.rank, dist.world, dist.device
        self.sharded, self.dist_kind, self.grad_sync = dist.sharded, dist.dist_kind, dist.grad_sync
        self.prompts_per_step, self.split_groups = setup.global_batch(cfg, self.world)
        self.run_dir = Path(cfg.run.output_dir)
        # one run per output folder (main process), before anything else: a second run refuses at once, naming the
        # holder, whatever else is wrong with its settings
        self.run_lock = acquire_run_lock(self.run_dir, self.accelerator.is_main_process, owner=self)
        setup.preflight(cfg, dist, loading=policy is None)  # settings that fail only after loading: exit 2 now
        # same seed on every process: LoRA / head initialisation must be identical across ranks (sampling itself
        # uses explicit per-row seeds)
        seed_everything(cfg.run.seed)
        # data first: a bad file fails before a (large) model is loaded
        self.media_report = None  # the media check of the loaded data (mmgrpo.vlm.data.media)
        if samples is not None:
            self.all_samples = list(samples)
        else:
            self.all_samples, self.media_report = load_samples(
                cfg.data.train_file, cfg.data.max_samples, cfg.data.media_root,
                check_media=cfg.data.on_missing_media == "error", screen=MediaScreen.from_config(cfg.data),
                with_report=True)
        self.samples = self.all_samples  # the trained ones (data selection narrows them; see use_samples)
        # the validation curve (validation.every): validation.file read now, a bad file fails before the model loads
        main = self.accelerator.is_main_process
        self.validator = Validator(cfg, self.run_dir, main) if cfg.validation.every else None
        self.policy = policy if policy is not None else setup.load_run_policy(cfg, self.device)
        self.tok = self.policy.tokenizer
        self.pad_id, self.eos_id = self.tok.pad_token_id, setup.eos_id_of(self.tok)
        self.task = TaskAdapter(self.policy.processor, self.policy.adapter, cfg.data)
        self.feed = PromptFeed(self.task, cfg.data, self.prompts_per_step, cfg.rollout.group_size, self.rank,
                               self.world, self.split_groups)  # this process's prompts of each step
        if reward_fn is None:
            reward_fn, accuracy_fn = build_rewards(cfg.reward, cfg.data.task, self.policy.family, self.tok,
                                                   cfg.data.prompt_mode, cfg.data.answer_format)
        self.acc_key = accuracy_key(cfg.reward, cfg.data.task)
        from mmgrpo.vlm.check import start_of_run_check  # what the model sees, checked before anything trains

        start_of_run_check(self.task, self.samples, reward_fn, cfg.data.check_samples,
                           log if self.accelerator.is_main_process else None)
        self.state = RunState(counters=_new_counters())
        self.methods = build_methods(cfg, self)  # mmgrpo.vlm.methods: their hooks, in registry order
        self.estimator = advantage_estimator(self.methods)  # the parts of the advantage methods replace
        self.loss = policy_loss(self.methods)  # the policy loss (and its micro-batch share)
        self.backend = backend if backend is not None else setup.make_backend(
            cfg, self.policy, self.device, signals=lambda: self.guard.signals, main=self.accelerator.is_main_process)
        self.sampling = SamplingParams(cfg.rollout.max_new_tokens, cfg.rollout.temperature, cfg.rollout.top_p,
                                       cfg.rollout.top_k)
        opt = setup.make_optimizer(cfg, self.policy, dist)
        self.model, self.unwrapped, self.params = opt.model, opt.unwrapped, opt.params
        self.optimizer, self.scheduler = opt.optimizer, opt.scheduler
        # what a checkpoint writes and restores of them (mmgrpo.vlm.checkpoint)
        self.trained = checkpoint.TrainedModel(self.policy, self.model, self.unwrapped, self.optimizer, self.scheduler)
        self.logprob_impl = setup.choose_logprob_impl(cfg, self.policy, self.model, self.grad_sync, self.dist_kind)
        # old, reference and current log-probs all go through this one function (on-policy ratios exactly 1)
        self.logprobs = TokenLogprobs(self.logprob_impl, self.pad_id, cfg.rollout.temperature,
                                      self.policy.suppress_token_ids, self.device, cfg.algo.logprob_chunk_size,
                                      self.accelerator.autocast)
        self.guard = RunGuard(cfg.run.max_consecutive_skips, cfg.run.max_train_seconds, cfg.run.budget_clock)
        # the reward functions and their calls (retries, timeouts, reward.on_failure / on_nonfinite), counted in
        # the run's counters
        self.scorer = RewardScorer(reward_fn, accuracy_fn, self.acc_key, cfg.reward, self.state.counters, self.guard)
        self.format_guard = FormatGuard(cfg.format_guard, cfg.rollout.max_new_tokens)  # format collapse: warn / stop
        self.onpolicy = OnPolicyCheck(cfg)  # the step-0 on-policy check (rollout.onpolicy_check)
        self.logger = MetricLogger(self.run_dir, use_tensorboard=cfg.run.tensorboard, is_main_process=main)
        # retention: the last run.keep_last checkpoints plus the best by run.best_metric (a logged metric)
        self.ckpt = CheckpointManager(self.run_dir / "checkpoints", keep_last=cfg.run.keep_last,
                                      keep_best=bool(cfg.run.best_metric), best_mode=cfg.run.best_mode)
        # every early end (signal, fault policy, skipped steps) checkpoints through the guard: one path (engine)
        self.guard.attach(save=self.save, position=lambda: self.state.step, unit="step", flush=self.logger.flush)
        if main:
            save_config(cfg, self.run_dir / "config.yaml")

    # ------------------------------------------------------------------------------------------- the loop
    def train(self, steps: int | None = None) -> list[dict[str, float]]:
        """Train to ``run.max_steps`` (or ``steps`` more; the run ends -- final checkpoint, nothing-trained check --
        only once ``run.max_steps`` is reached). SIGTERM / SIGINT stop it at the next step boundary, or discard the
        step if its rollouts are still being collected, after writing a checkpoint (:class:`TrainingInterrupted`).

        The first call resumes (``run.resume_from``) or begins the run; a later call on the same object continues
        from its state in memory, which is ahead of any checkpoint (re-reading one would undo steps), and a call
        after the run ended does nothing. The flow recipe's ``train`` behaves the same."""
        from tqdm.auto import tqdm

        cfg, st, guard = self.cfg, self.state, self.guard
        history: list[dict[str, float]] = []
        bar = None
        with guard.watching_signals():
            try:
                # resume or begin (once per trainer object): the methods' on_train_start, step-0 validation
                self._start()
                end = cfg.run.max_steps if steps is None else min(cfg.run.max_steps, st.step + steps)  # after resuming
                bar = tqdm(total=cfg.run.max_steps, initial=st.step, desc="GRPO", unit="step", dynamic_ncols=True,
                           disable=not (cfg.run.progress_bar and self.rank == 0))
                while st.step < end:
                    # -- stop points: SIGTERM / SIGINT (every process stops at this step), the time budget
                    if guard.signalled():
                        guard.interrupt()
                    if guard.out_of_budget(f"step {st.step}"):
                        break
                    t0 = time.time()
                    guard.budget.start()  # only the step counts (not checkpoint writes between steps)
                    # what a stop inside the rollout rolls back to, so its checkpoint resumes exactly at this step
                    # (and the buffers of the methods with per-process state, which the rollout's hooks fill)
                    undo = {"stream": st.stream.state_dict(), "rng": capture_rng_state(), "selected": st.selected,
                            "counters": dict(st.counters),
                            "methods": {m.name: m.state_dict() for m in self.methods if m.state_per_process}}
                    # -- rollout -> rewards -> advantages (more rounds while methods drop groups: DAPO)
                    rb = collect(self, st.step)
                    # -- a fault policy or a signal during the rollout: the step did not happen; save and stop
                    guard.stop_if_asked(lambda signalled: self._undo(undo, signalled), "its rollouts were discarded")
                    # -- old / reference log-probs and the methods' per-token tensors, on whole-group micro-batches
                    mbs = micro_batches(rb.group_ids, cfg.run.micro_batch_size) if rb.n else []
                    precompute(self, rb, mbs)
                    if self.onpolicy.pending:  # first step of this trainer: ratio 1 before any update
                        self.onpolicy.check(self.model, rb, mb_plan(self, rb, mbs), self.logprobs.rows, self.backend)
                    # -- loss and optimizer step(s)
                    upd = optimize(self, rb, mbs)
                    self.backend.sync_weights(self.model)  # no-op for the HF backend (it samples from the model)
                    st.step += 1
                    # -- log: the step's metrics (the methods' from end_of_step), validation points, completions
                    m = step_metrics(self, rb, upd, t0)
                    collapse = self.format_guard.update(st.step, m, rb.texts, cfg.data)  # format collapse
                    st.metrics, st.batch = m, rb
                    log_now = st.step % cfg.run.log_every == 0 or st.step == cfg.run.max_steps
                    if self.validator is not None and self.validator.due(st.step):  # a val/* point (validation.every)
                        self._validate(m, logged=log_now)
                    if log_now:
                        self.logger.log(m, st.step)
                        if rb.n:
                            self.logger.log_jsonl("completions.jsonl",
                                                  completion_rows(rb, st.step, cfg.run.num_completions_to_log))
                    # -- format collapse (format_guard.action=stop) or too many skipped optimizer steps in a row:
                    #    save and stop (exit code 3)
                    if collapse:
                        if not log_now:
                            self.logger.log(m, st.step)
                        guard.stop(collapse + " (format_guard.action=stop)")
                    if guard.skips.halt_due:
                        self.logger.log(m, st.step)
                        guard.halt("run.max_consecutive_skips", self._applied_updates() > 0,
                                   "check the data and media, the rewards, the learning rate and mixed precision "
                                   "before resuming")
                    history.append(m)
                    bar.update(1)
                    bar.set_postfix(progress_fields(m), refresh=False)
                    # -- maybe checkpoint
                    if cfg.run.save_every and st.step % cfg.run.save_every == 0 and st.step < cfg.run.max_steps:
                        self.save()
                if st.step >= cfg.run.max_steps or guard.budget_stopped:  # the run is over
                    self.feed.close()
                    self._check_trained()  # a run that trained nothing writes no final checkpoint
                    if st.step > 0 and (history or not guard.saved_here()):
                        self.save()  # unless this state is saved already (resumed at the end, a later call)
            except BaseException:
                self.feed.close()
                raise
            finally:
                if bar is not None:
                    bar.close()
                self.logger.flush()
        return history

    # ------------------------------------------------------------------------------------------- run pieces
    def _start(self) -> bool:
        """Resume from ``run.resume_from`` or begin a fresh run, once; True when resumed."""
        st = self.state
        if st.started:
            return False
        st.started = True
        path = checkpoint.resume(self.ckpt, self.cfg, self.methods, self.trained, self.parallel,
                                 self._restore_run_state)
        resumed = path is not None
        if resumed:
            log.info("resumed from %s at step %d", path, st.step)
            self.guard.saved(st.step, path)  # an interrupt before the next step need not rewrite it
        for m in self.methods:
            m.on_train_start(resumed)  # data selection picks the trained samples here
        if not resumed:
            st.stream = self.new_stream()
        if self.validator is not None and not resumed and self.cfg.validation.at_start and st.step == 0:
            self._validate({}, logged=False)  # the step-0 point of a fresh run (the starting weights)
        return resumed

    def new_stream(self) -> PromptStream:
        """A fresh stream over the run's (selected) samples. When an epoch begins, the methods' ``on_epoch`` hooks
        run (data selection may re-select: the new epoch then permutes the new set)."""
        def epoch_start(epoch: int) -> int:
            for m in self.methods:
                m.on_epoch(epoch)
            return len(self.samples)

        return PromptStream(len(self.samples), self.cfg.run.seed, self.cfg.data.shuffle, on_epoch=epoch_start)

    def _restore_run_state(self, entry: dict) -> None:
        """The recipe's part of a checkpoint (what :meth:`save` hands over as ``run_state``), at resume."""
        st = self.state
        if entry.get("selected") is not None:
            self.use_samples(entry["selected"])
        st.stream = self.new_stream()
        st.stream.load_state_dict(entry["stream"])
        st.step = int(entry["step"])
        st.counters.update(entry["counters"])
        self.guard.load_state_dict(entry)

    def _validate(self, metrics: dict[str, float], logged: bool) -> None:
        """A validation point after step ``state.step`` (0: the starting weights): its ``val/*`` values join
        ``metrics`` (the step's row, and what ``run.best_metric`` reads) and are logged here when the step's row is
        not; with ``validation.select_best`` the weights of every validation step are kept as a checkpoint."""
        step, c = self.state.step, self.cfg
        m = self.validator.run(step, self.task, self.policy, self.backend, self.scorer,
                               partial(generation_context, self.accelerator, self.model, self.sharded, self.dist_kind))
        metrics.update(m)
        if not logged:
            self.logger.log(m, step)
        loop_saves = (c.run.save_every and step % c.run.save_every == 0) or step >= c.run.max_steps
        if step > 0 and c.validation.select_best and not loop_saves:  # (the loop saves the others)
            self.save()

    # ------------------------------------------------------------------------------------------- for the methods
    def use_samples(self, keep: list[int]) -> None:
        """Train on ``all_samples[i] for i in keep`` from now on (data selection; checkpointed)."""
        if not keep:
            raise ValueError("data selection kept no samples; relax methods.selection criterion / thresholds")
        self.state.selected = list(keep)
        self.samples = [self.all_samples[i] for i in keep]

    def score_samples(self, samples: Sequence[Any], K: int, key: str = "total", round: int = 0,
                      greedy: bool = False):
        """(S, K) rewards ``key`` of K completions per sample with the current policy (data selection)."""
        return score_samples(self, samples, K, key, round=round, greedy=greedy)

    def accuracy(self, texts: list[str], samples: list[Any], scored: dict | None = None):
        """The task's accuracy of each completion (T-GRPO, augmentation hints)."""
        return self.scorer.accuracy(texts, samples, scored)

    def generation_context(self):
        """The context extra sampling by a method runs in (the model's generation mode, unsharded weights)."""
        return generation_context(self.accelerator, self.model, self.sharded, self.dist_kind)

    def save(self) -> Path | None:
        """Collective: every process calls it. Returns the checkpoint folder on the main process."""
        st = self.state
        run_state = {"step": st.step, "stream": st.stream.state_dict(), "counters": dict(st.counters),
                     **self.guard.state_dict(), "selected": st.selected}
        path = checkpoint.save(self.ckpt, self.cfg, st.step, run_state, self.methods, self.trained,
                               self.parallel, st.metrics)
        self.guard.saved(st.step, path)  # a stop right after this save does not write it again
        return path

    def _undo(self, undo: dict, signalled: bool) -> None:
        """A step abandoned after its rollout (a stop request or a signal): stream, RNG (and a data re-selection
        inside it) roll back, so a resume redraws its prompts, and so do the per-process method buffers its hooks
        filled; after a signal its counts go too (the resumed run counts them)."""
        st = self.state
        if undo["selected"] is not None:  # a data re-selection inside this step is redone too
            self.use_samples(undo["selected"])
            st.stream.n = len(self.samples)
        st.stream.load_state_dict(undo["stream"])
        restore_rng_state(undo["rng"])
        for m in self.methods:  # the buffers as they were before this step's groups entered them
            if undo["methods"].get(m.name) is not None:
                m.load_state_dict(undo["methods"][m.name])
        if signalled:  # nothing of this step is kept, not even its counts (the resumed run counts them)
            st.counters.update(undo["counters"])

    def _applied_updates(self) -> int:
        """Optimizer updates applied so far (every step attempts algo.num_iterations; skips are counted)."""
        return self.state.step * self.cfg.algo.num_iterations - int(self.state.counters["skipped_steps"])

    def _check_trained(self) -> None:
        """A run none of whose optimizer steps was applied, or none of whose steps had a reward signal (all advantages
        0), fails instead of saving "trained" weights (:meth:`RunGuard.check_trained`)."""
        st, c = self.state, self.state.counters
        zero = int(c["zero_advantage_steps"])
        self.guard.check_trained(
            st.step, self._applied_updates(), zero, self.cfg.run.allow_no_reward_signal,
            lambda: (  # steps were taken on the KL / entropy terms alone
                f"nothing was trained: none of the run's {st.step} step(s) had a reward signal (last: "
                f"{st.last_zero_advantage or 'all advantages 0'}); only the KL / entropy terms were applied; no "
                "final checkpoint written. Check completions.jsonl: the answer format the reward parses "
                "(reward.parse_mode, data.prompt_mode), the reward weights, and whether the task is too hard or too "
                "easy for the base model (run.allow_no_reward_signal=true accepts such a run: pipeline rehearsals)"),
            lambda: (
                f"nothing was trained: all {c['skipped_steps']} optimizer step(s) of the run's {st.step} step(s) were "
                f"skipped (last cause: {self.guard.last_skip_cause}; data/skipped_missing_media="
                f"{c['skipped_missing_media']}, faults/reward_failed_calls={c['reward_failed_calls']}, "
                f"faults/reward_nonfinite_rows={c['reward_nonfinite_rows']}, zero-advantage steps={zero}); no final "
                "checkpoint written. Check data.media_root / data.train_file, the reward function or server and the "
                "answer format it parses (completions.jsonl), and the learning rate"))


def train_from_config(cfg: TrainConfig) -> list[dict[str, float]]:
    """``mmgrpo train``: build the run and train it."""
    return GRPOTrainer(cfg).train()
