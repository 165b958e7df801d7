"""The flow-matching GRPO trainer: one loop, methods differ only by config (see :mod:`flow_grpo.config`).

Per epoch::

    groups g = epoch*groups_per_epoch + [0, groups_per_epoch)   (global ids; samples split over processes)
    sample trajectories (SDE on the plan's steps, exact log-probs)     -> flow_grpo.sampler
        each chunk's images are scored in a background thread while the next chunk is sampled
    rewards: MultiReward over the configured components, each wrapped in ResilientReward (timeout, retries,
             drop-or-stop); non-finite scores -> valid=False (reward.on_nonfinite=drop)
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
import hashlib
import io
import json
import math
import os
import struct
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from flow_grpo.rewards import Reward
from flow_grpo.rewards.base import check_finite_numpy, check_shapes
# TrainingHalted: the old name of TrainingStopped, re-exported with the other errors for old imports
from mmgrpo.engine.errors import (NothingTrained, RewardCallFailed, RewardTimeout, TrainingHalted,  # noqa: F401
                                  TrainingInterrupted, TrainingStopped)
from mmgrpo.utils.budget import TimeBudget
from mmgrpo.utils.logging import get_logger
from mmgrpo.utils.master_weights import make_adamw
from mmgrpo.utils.runlock import acquire_run_lock
from mmgrpo.utils.schedule import LRFactor
from mmgrpo.utils.signals import StopOnSignal
from mmgrpo.utils.write_errors import names_write_errors

from .config import TrainConfig
from .ema import EMA
from .methods import AdvOptions, CreditInputs, apply_train_masks, credit_name, get_credit
from .sampler import Trajectories, finish_scores, generate_images, sample_trajectories, score_column

# get_logger gives the "flow_grpo" logger a stderr handler at INFO (unless the root logger is configured): with a
# bare logging.getLogger, info lines such as "resumed from ..." were never printed
log = get_logger("flow_grpo.trainer")


# ----------------------------------------------------------------------------------------------------- data
def load_prompts(path: str) -> tuple[list[str], list[dict]]:
    """``.txt``: one prompt per non-empty line. ``.jsonl``: one object per line with a string ``prompt`` (the rest
    is metadata, e.g. GenEval ``tag``/``include``). Errors name the file and line."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    prompts, meta = [], []
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:  # name the line: a bare UnicodeDecodeError does not say which file
        before = data[:exc.start].decode("utf-8")  # valid up to the first bad byte
        ln = before.replace("\r\n", "\n").replace("\r", "\n").count("\n") + 1
        raise ValueError(f"{path}:{ln}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                         "save the prompt file as UTF-8") from None
    with io.StringIO(text, newline=None) as f:  # universal newlines, as open() in text mode
        for ln, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if p.suffix == ".jsonl":
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{ln}: invalid JSON ({exc.msg})") from None
                if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
                    raise ValueError(f"{path}:{ln}: expected an object with a non-empty string field 'prompt'")
                prompts.append(obj["prompt"])
                meta.append({k: v for k, v in obj.items() if k != "prompt"})
            else:
                prompts.append(line.strip())
                meta.append({})
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts, meta


# ----------------------------------------------------------------------------------------------------- rewards
def _call_with_timeout(fn: Callable[[], Any], timeout: float, name: str) -> Any:
    """Run ``fn()``; with ``timeout > 0`` in a daemon thread that is abandoned (it cannot be killed) if it has not
    returned after ``timeout`` seconds."""
    if timeout <= 0:
        return fn()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["out"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["err"] = exc

    t = threading.Thread(target=run, daemon=True, name=f"reward-{name}")
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise RewardTimeout(f"reward {name!r} did not return within {timeout:g} s")
    if "err" in box:
        raise box["err"]
    return box["out"]


class ResilientReward(Reward):
    """One reward component with fault handling (issue "Reliability").

    Each call is tried ``1 + retries`` times; an attempt fails if the reward raises or exceeds ``timeout``
    seconds; attempt k+1 starts ``backoff * 2**k`` s after attempt k failed. If every attempt fails:
    ``on_failure="drop"`` returns score 0 with ``valid=False`` for every sample of the call (counted in
    ``counters["dropped"]``, logged), ``"stop"`` raises :class:`RewardCallFailed`.

    An output with the wrong number of scores (or not numeric) counts as a failed attempt, like an exception.
    Non-finite scores are not retried (they are not transient): they follow ``nan_policy`` ("drop" ->
    ``valid=False``; "raise" -> ``RewardError``). The wrapped reward's own ``nan_policy`` is bypassed (its
    ``score`` is called directly) so that this policy applies to every component alike. Output keys of a reward
    whose ``name`` differs from the config key are renamed to the config key (``R -> key``, ``R/aux -> key/aux``).
    """

    def __init__(self, fn: Callable, name: str, retries: int = 2, backoff: float = 1.0, timeout: float = 0.0,
                 on_failure: str = "drop", nan_policy: str = "drop"):
        super().__init__(name=name, nan_policy=nan_policy)
        if on_failure not in ("drop", "stop"):
            raise ValueError(f"on_failure must be 'drop' or 'stop', got {on_failure!r}")
        if retries < 0 or backoff < 0 or timeout < 0:
            raise ValueError("reward retries, retry_backoff and timeout must be >= 0")
        self.fn = fn
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.timeout = float(timeout)
        self.on_failure = on_failure
        self._lock = threading.Lock()
        self.counters = {"calls": 0, "retries": 0, "timeouts": 0, "failed_calls": 0, "dropped": 0}

    def _count(self, **kw: int) -> None:
        with self._lock:
            for k, v in kw.items():
                self.counters[k] += v

    def _raw(self, imgs, prompts, md, **kw):
        if isinstance(self.fn, Reward):
            return self.fn.score(imgs, prompts, md, **kw)
        return self.fn(imgs, prompts, md, **kw)

    def _rename(self, raw: Any) -> Any:
        if not isinstance(raw, Mapping):
            return {self.name: raw}
        own = getattr(self.fn, "name", None)
        if not own or own == self.name or self.name in raw:
            return raw
        out = {}
        for k, v in raw.items():
            if k == own:
                k = self.name
            elif k.startswith(own + "/"):
                k = self.name + k[len(own):]
            out[k] = v
        return out

    def _evaluate(self, imgs, prompts, md, **kw):
        import numpy as np

        n = imgs.shape[0]
        self._count(calls=1)
        last: Optional[BaseException] = None
        for attempt in range(self.retries + 1):
            try:
                raw = _call_with_timeout(lambda: self._raw(imgs, prompts, md, **kw), self.timeout, self.name)
                check_shapes(self._rename(raw), n, self.name)  # wrong count/shape: a failed call, not a crash
                break
            except Exception as exc:  # noqa: BLE001 - any failure of a reward call is handled alike
                last = exc
                self._count(timeouts=int(isinstance(exc, RewardTimeout)))
                log.warning("reward %r: attempt %d/%d failed: %s: %s", self.name, attempt + 1, self.retries + 1,
                            type(exc).__name__, exc)
                if attempt < self.retries:
                    self._count(retries=1)
                    time.sleep(self.backoff * 2 ** attempt)
        else:
            msg = (f"reward {self.name!r} failed {self.retries + 1} time(s) on a batch of {n}: "
                   f"{type(last).__name__}: {last}")
            self._count(failed_calls=1)
            if self.on_failure == "stop":
                raise RewardCallFailed(msg + " (reward.on_failure=stop)") from last
            self._count(dropped=n)
            log.error("%s; dropping its %d samples (reward.on_failure=drop)", msg, n)
            return {self.name: np.zeros(n, dtype=np.float32), "valid": np.zeros(n, dtype=bool)}
        return check_finite_numpy(self._rename(raw), n, self.name, self.nan_policy)


def _import_factory(spec: str) -> Callable:
    import importlib

    mod, _, attr = spec.partition(":")
    if not mod or not attr:
        raise ValueError(f"reward.pairwise_scorer must be 'package.module:factory', got {spec!r}")
    return getattr(importlib.import_module(mod), attr)


class RewardStack:
    """The trainer's rewards: ``pointwise`` (a :class:`~flow_grpo.rewards.MultiReward` over the resilient
    components; ``out["total"] = sum_k w_k r_k``) and, in ``win_rate`` mode, ``pairwise`` (a resilient
    :class:`~flow_grpo.rewards.PairwisePreferenceReward`, called with explicit ``group_ids``).

    ``components``: optional ``{name: reward callable}`` instead of ``build_reward(name, **kwargs[name])`` for
    every name of ``weights`` (weights of injected names default to 1)."""

    def __init__(self, rc, components: Optional[Mapping[str, Callable]] = None):
        from flow_grpo.rewards import MultiReward, PairwisePreferenceReward, ScoreComparator, build_reward

        if components is None:
            unknown = set(rc.kwargs) - set(rc.weights) - {"win_rate"}
            if unknown:
                raise ValueError(f"reward.kwargs for rewards without a weight: {sorted(unknown)}")
            comps = {k: build_reward(k, **dict(rc.kwargs.get(k, {}))) for k in rc.weights}
            weights = {k: float(w) for k, w in rc.weights.items()}
        else:
            if not isinstance(components, Mapping):
                raise TypeError(f"reward components must be a {{name: reward}} mapping, got {type(components).__name__}")
            comps = dict(components)
            weights = {k: float(rc.weights.get(k, 1.0)) for k in comps}
        if not comps:
            raise ValueError("no rewards: set reward.weights")
        nan_policy = {"drop": "drop", "error": "raise"}[rc.on_nonfinite]  # config word -> flow_grpo.rewards
        kw = dict(retries=rc.retries, backoff=rc.retry_backoff, timeout=rc.timeout, on_failure=rc.on_failure,
                  nan_policy=nan_policy)
        self.mode = rc.mode
        self.weights = weights
        self.wrapped = {k: ResilientReward(fn, k, **kw) for k, fn in comps.items()}
        self.pointwise = MultiReward(weights, mode="per_reward" if rc.mode == "per_reward" else "weighted_sum",
                                     rewards=self.wrapped, nan_policy=nan_policy)
        self.pairwise = None
        if rc.mode == "win_rate":
            scorer = (_import_factory(rc.pairwise_scorer)(**dict(rc.kwargs.get("win_rate", {})))
                      if rc.pairwise_scorer else ScoreComparator(self.pointwise, key="total"))
            pref = PairwisePreferenceReward(scorer, name="win_rate", symmetric=rc.pairwise_symmetric,
                                            nan_policy=nan_policy)
            self.pairwise = ResilientReward(pref, "win_rate", **kw)
        self._seen = self._totals()

    def _totals(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for w in list(self.wrapped.values()) + ([self.pairwise] if self.pairwise is not None else []):
            with w._lock:
                for k, v in w.counters.items():
                    out[k] = out.get(k, 0) + v
        return out

    def take_counters(self) -> dict[str, int]:
        """Counter increments (calls, retries, timeouts, failed_calls, dropped) since the previous call."""
        now = self._totals()
        delta = {k: now[k] - self._seen.get(k, 0) for k in now}
        self._seen = now
        return delta


# ----------------------------------------------------------------------------------------------------- collectives
def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 else None


def _std_unbiased(ddof: int) -> bool:
    """``optim.adv_std_ddof`` -> the ``unbiased`` flag of mmgrpo.core's advantages (0: np.std, 1: torch.std)."""
    return ddof == 1


def _reduce(values: list[float], op: str, device) -> list[float]:
    """All-reduce a list of floats (``op``: sum | max) in one collective; identity without a process group."""
    d = _dist()
    if d is None:
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    d.all_reduce(t, op=d.ReduceOp.SUM if op == "sum" else d.ReduceOp.MAX)
    return t.cpu().tolist()


def _all_gather_object(obj: Any) -> list:
    d = _dist()
    if d is None:
        return [obj]
    out: list = [None] * d.get_world_size()
    d.all_gather_object(out, obj)
    return out


def _broadcast_object(obj: Any) -> Any:
    d = _dist()
    if d is None:
        return obj
    box = [obj]
    d.broadcast_object_list(box, src=0)
    return box[0]


def _barrier() -> None:
    d = _dist()
    if d is not None:
        d.barrier()


def _gather_rows(tensors: list[torch.Tensor], device) -> tuple[list[torch.Tensor], slice]:
    """:func:`mmgrpo.core.gather_groups` on ``device`` (NCCL needs CUDA tensors); results back on the CPU."""
    from mmgrpo.core import gather_groups

    outs, sl = gather_groups([t.to(device) for t in tensors])
    return [o.cpu() for o in outs], sl


def _group_stats(inp: CreditInputs) -> dict:
    """Groups of the gathered batch left empty / with one valid member (advantage 0), and invalid samples."""
    (g_all, v_all), _ = inp.gather([inp.group_ids, inp.valid])
    counts = torch.bincount(torch.unique(g_all, return_inverse=True)[1], weights=v_all.double())
    return {"adv/groups_empty": float((counts == 0).sum()),      # every member dropped: no sample trains
            "adv/groups_singleton": float((counts == 1).sum()),  # one member left: no baseline -> A = 0
            "reward/invalid": float((~v_all).sum())}


def _advantage_stats(adv: torch.Tensor, mask: torch.Tensor, gather) -> dict:
    (adv_all, m_all), _ = gather([adv, mask])
    trained = adv_all[m_all]
    return {"adv/mean_abs": float(trained.abs().mean()) if trained.numel() else 0.0,
            "adv/std": float(trained.std()) if trained.numel() > 1 else 0.0,
            "adv/max": float(trained.max()) if trained.numel() else 0.0,
            "adv/min": float(trained.min()) if trained.numel() else 0.0}


# ----------------------------------------------------------------------------------------------------- trainer
class FlowGRPOTrainer:
    """Build with a config (and optionally a ready adapter / reward components / accelerator, e.g. in tests),
    then :meth:`train`.

    ``reward_fn``: optional ``{name: reward callable}`` used instead of building ``reward.weights`` from the
    registry (each still wrapped with the fault handling of ``reward.*``).
    ``accelerator``: optional ready ``accelerate.Accelerator`` (tests force FSDP on CPU this way)."""

    def __init__(self, cfg: TrainConfig, adapter=None, reward_fn: Optional[Mapping[str, Callable]] = None,
                 accelerator=None):
        from mmgrpo.utils.seeding import seed_everything

        self.cfg = cfg
        self.accelerator = accelerator if accelerator is not None else self._build_accelerator()
        acc = self.accelerator
        from accelerate.utils import DistributedType

        self.rank = acc.process_index
        self.world = acc.num_processes
        self._check_launch()
        self.is_main = acc.is_main_process
        self.device = acc.device
        self.sharded = acc.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED)
        self.deepspeed = acc.distributed_type == DistributedType.DEEPSPEED
        self.out = Path(cfg.run.output_dir)
        # one run per output folder (main process), before the model is loaded: a second run refuses at once
        self._run_lock = acquire_run_lock(self.out, self.is_main, owner=self)
        seed_everything(cfg.run.seed)  # identical LoRA init on every process (DDP also broadcasts rank 0's)
        self.adapter = adapter if adapter is not None else self._build_adapter()
        self._validate()
        if cfg.model.lora.enabled:
            if not self.adapter.lora_enabled:
                self.adapter.add_lora(cfg.model.lora.rank, cfg.model.lora.alpha, cfg.model.lora.target_modules,
                                      init_lora_weights=_peft_init(cfg.model.lora.init))
        else:
            self.adapter.enable_full_finetune()
        self.adapter.set_gradient_checkpointing(cfg.model.gradient_checkpointing)
        self.reference_info = self._reference_settings()
        if not any(p.requires_grad for p in self.adapter.transformer.parameters()):
            raise ValueError("no trainable parameters")
        o = cfg.optim
        total_steps = max(1, cfg.run.num_epochs * o.inner_epochs * o.updates_per_epoch)

        def make_optim(module):
            # bf16 trainable weights (full fine-tune) get fp32 master copies; sharded engines keep their own and
            # remap the optimizer's parameters at prepare, which must then be the module's
            opt = make_adamw([p for p in module.parameters() if p.requires_grad],
                             master_weights=o.fp32_master_weights and not self.sharded, lr=o.lr,
                             betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
            return opt, torch.optim.lr_scheduler.LambdaLR(opt, LRFactor(o.lr_schedule, o.warmup_steps, total_steps))

        # the standard accelerate way: DDP / FSDP / DeepSpeed per the launch config; forwards use the prepared module
        if acc.distributed_type == DistributedType.FSDP and not acc.is_fsdp2:
            # FSDP1 replaces the parameters while wrapping and accelerate does not remap an optimizer built before
            # (it does for FSDP2 / DeepSpeed, which need both in one prepare call): wrap first, then build it
            self.model = acc.prepare(self.adapter.transformer)
            self.optimizer, self.lr_scheduler = acc.prepare(*make_optim(self.model))
        else:
            self.model, self.optimizer, self.lr_scheduler = acc.prepare(self.adapter.transformer,
                                                                        *make_optim(self.adapter.transformer))
        self.adapter.model = self.model
        self.unwrapped = acc.unwrap_model(self.model)
        self.named_params = [(n, p) for n, p in self.unwrapped.named_parameters() if p.requires_grad]
        self.params = [p for _, p in self.named_params]
        self.ema = EMA(self.params, cfg.ema.decay, cfg.ema.warmup) if cfg.ema.enabled else None
        self.credit = get_credit(credit_name(cfg.sample.credit, cfg.reward.mode))  # flow_grpo.methods table
        self.rewards = RewardStack(cfg.reward, reward_fn)
        self.reward_fn = self.rewards.pointwise
        self.runner = None
        if cfg.reward.async_workers > 0:
            from flow_grpo.rewards import AsyncRewardRunner

            self.runner = AsyncRewardRunner(self.rewards.pointwise, max_workers=cfg.reward.async_workers)
        if cfg.data.train_path:
            self.prompts, self.metadata = load_prompts(cfg.data.train_path)
        elif cfg.data.prompts:
            self.prompts, self.metadata = list(cfg.data.prompts), [{} for _ in cfg.data.prompts]
        else:
            raise ValueError("no prompts: set data.train_path or data.prompts")
        self.eval_prompts, self.eval_metadata = self._load_eval_prompts()
        self._bind_reference_images()
        if cfg.run.eval_every and not self.eval_prompts:
            raise ValueError("run.eval_every > 0 needs eval prompts: set data.eval_path or data.eval_prompts")
        self.epoch = 0
        self.global_step = 0      # attempted optimizer steps (applied + skipped); drives the EMA updates and logging
        self.budget = TimeBudget(cfg.run.max_train_seconds, cfg.run.budget_clock)
        self.budget_stopped = False
        self._signals: Optional[StopOnSignal] = None  # active during train(): SIGTERM / SIGINT stop at an epoch edge
        self.counters = {"applied_steps": 0, "skipped_steps": 0, "consecutive_skips": 0, "empty_updates": 0,
                         "reward_invalid": 0, "reward_failed_calls": 0, "reward_dropped": 0, "groups_empty": 0,
                         "groups_singleton": 0}
        self.best_eval: Optional[float] = None
        self.logger = None
        if self.is_main:
            from mmgrpo.utils.logging import MetricLogger

            self.logger = MetricLogger(self.out, use_tensorboard=cfg.run.tensorboard, is_main_process=True)
        from mmgrpo.utils.checkpoint import CheckpointManager

        self.ckpt = CheckpointManager(self.out / "checkpoints", keep_last=cfg.run.keep_last,
                                      keep_best=cfg.run.keep_best, best_mode="max")
        self.halt_ckpt = CheckpointManager(self.out / "halted", keep_last=None, keep_best=False)
        if self.deepspeed and self.is_main:
            log.warning("DeepSpeed: the optimizer step runs inside the last backward (engine.step), so a non-finite "
                        "loss/gradient is counted but cannot be skipped by the trainer (this path is untested)")

    # ------------------------------------------------------------------ setup helpers
    def _build_accelerator(self):
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs

        r = self.cfg.run
        # broadcast_buffers=False: the transformers' buffers are constants (positional tables) identical on every
        # process; broadcasting them would turn every no-grad forward (sampling, eval) into a collective.
        ddp = DistributedDataParallelKwargs(find_unused_parameters=r.ddp_find_unused_parameters,
                                            broadcast_buffers=False)
        # a multi-process launch without GPUs must use accelerate's CPU backend (gloo); otherwise accelerate falls
        # back to one independent process per rank (see _check_launch)
        cpu = r.cpu or (int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available())
        # step_scheduler_with_optimizer=False: the schedule advances once per optimizer step, not once per process
        return Accelerator(cpu=cpu, mixed_precision=r.mixed_precision, step_scheduler_with_optimizer=False,
                           kwargs_handlers=[ddp])

    def _check_launch(self) -> None:
        """Refuse to run when the launcher started N processes but accelerate trains with another number: each
        process would optimise its own unsynchronised copy (DanceGRPO#110). Happens e.g. when accelerate finds no
        GPU and falls back to a single process per rank."""
        import torch.distributed as dist

        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if dist.is_available() and dist.is_initialized():
            launched = max(launched, dist.get_world_size())
        if launched != self.world:
            raise RuntimeError(f"launched with {launched} processes but accelerate runs {self.world} "
                               f"({self.accelerator.distributed_type}): every process would train an independent "
                               "copy. On CPU set run.cpu=true (or use an accelerate config with use_cpu: true).")

    def _build_adapter(self):
        from .models import adapter_from_pipeline, load_adapter

        m = self.cfg.model
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[m.dtype]
        device = self.accelerator.device
        if m.tiny:
            from .models import tiny

            builder = tiny.TINY_BUILDERS[m.tiny]
            return adapter_from_pipeline(builder(seed=self.cfg.run.seed), device=device, dtype=dtype,
                                         max_sequence_length=m.max_sequence_length)
        if not m.pipeline_dir:
            raise ValueError("set model.pipeline_dir (a diffusers folder) or model.tiny=sd3|flux")
        return load_adapter(m.pipeline_dir, kind=m.kind, device=device, dtype=dtype,
                            max_sequence_length=m.max_sequence_length)

    def _validate(self) -> None:
        from mmgrpo.utils.config import check_choices

        c = self.cfg
        check_choices(c)  # Literal fields (reward.mode, optim.kl_type, ...) of a config edited after it was built
        n_total = c.data.group_size * c.data.groups_per_epoch
        if c.data.group_size < 2:
            raise ValueError("data.group_size must be >= 2 (advantages are group-relative)")
        if n_total % self.world:
            raise ValueError(f"group_size*groups_per_epoch={n_total} must be divisible by the {self.world} processes")
        if not self.adapter.supports_cfg and c.sample.cfg:
            raise ValueError("FLUX uses embedded guidance: set sample.cfg=false")
        if c.optim.kl_coef > 0 and not c.model.lora.enabled:
            raise ValueError("KL with full fine-tuning needs a frozen reference copy; use LoRA (reference = adapter off)")
        if c.optim.max_consecutive_skips < 1:
            raise ValueError("optim.max_consecutive_skips must be >= 1")
        step_credit = get_credit(c.sample.credit).step_rewards is not None  # scores ODE completions
        if c.reward.mode != "weighted_sum" and step_credit:
            raise ValueError(f"reward.mode={c.reward.mode} needs sample.credit=outcome (step credits score ODE "
                             "completions with the weighted-sum reward)")
        if c.reward.async_workers < 0:
            raise ValueError("reward.async_workers must be >= 0")
        if self.sharded and step_credit:
            raise ValueError(f"sample.credit={c.sample.credit} is not supported with FSDP/DeepSpeed: its ODE "
                             "completions make a process-dependent number of (collective) sharded forwards")

    def _bind_reference_images(self) -> None:
        """Editing models (FLUX-Kontext): a JSONL prompt line's ``image`` field is its reference image (path relative
        to the prompt file); without any, the model runs text-to-image."""
        bind = getattr(self.adapter, "bind_reference_images", None)
        if bind is None:
            return
        d = self.cfg.data
        found = False
        for prompts, meta, path in ((self.prompts, self.metadata, d.train_path),
                                    (self.eval_prompts, self.eval_metadata, d.eval_path)):
            if any("image" in m for m in meta):
                bind(prompts, meta, source=path)
                found = True
        if not found and self.is_main:
            log.warning("%s: no prompt has an 'image' field (JSONL): sampling is text-to-image, without a reference",
                        self.adapter.kind)

    def _load_eval_prompts(self) -> tuple[list[str], list[dict]]:
        d = self.cfg.data
        if d.eval_path:
            prompts, meta = load_prompts(d.eval_path)
        else:
            prompts, meta = list(d.eval_prompts), [{} for _ in d.eval_prompts]
        if d.eval_num_prompts > 0:
            prompts, meta = prompts[:d.eval_num_prompts], meta[:d.eval_num_prompts]
        return prompts, meta

    def _reference_settings(self) -> dict:
        """What the KL reference is, plus a fingerprint of the frozen base weights (names, shapes, dtypes, first
        values, sums): resuming onto a different base model is refused."""
        h = hashlib.sha256()
        n = 0
        with torch.no_grad():
            for name, p in self.adapter.transformer.named_parameters():
                if "lora_" in name:
                    continue
                flat = p.detach().reshape(-1)
                h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
                h.update(flat[:16].float().cpu().numpy().tobytes())
                h.update(struct.pack("<d", float(flat.double().sum())))
                n += 1
        c = self.cfg
        return {"kind": "lora_disabled" if c.model.lora.enabled else "none", "beta": c.optim.kl_coef,
                "kl_type": c.optim.kl_type, "base_fingerprint": h.hexdigest(), "base_tensors": n}

    # ------------------------------------------------------------------ seeds / layout
    def _epoch_samples(self, epoch: int, lo: Optional[int] = None, hi: Optional[int] = None):
        """Samples ``[lo, hi)`` of the epoch (default: this process's slice): prompts, metadata, global group ids
        and the three seed lists. A pure function of (seed, epoch, prompt list): the data-sampler position is the
        epoch counter."""
        from mmgrpo.utils.seeding import sample_seed

        c = self.cfg
        G, n_groups = c.data.group_size, c.data.groups_per_epoch
        n_total = G * n_groups
        g = torch.Generator().manual_seed(sample_seed(c.run.seed, epoch, 0))
        order = torch.randperm(len(self.prompts), generator=g)
        per = n_total // self.world
        if lo is None:
            lo, hi = self.rank * per, (self.rank + 1) * per
        prompts, meta, gids, xs, ns, ps = [], [], [], [], [], []
        for s in range(lo, hi):
            local_g = s // G
            gid = epoch * n_groups + local_g
            pi = int(order[local_g % len(order)])
            prompts.append(self.prompts[pi])
            meta.append(dict(self.metadata[pi]))
            gids.append(gid)
            xs.append(sample_seed(c.run.seed, 1, gid) if c.sample.same_noise_per_group
                      else sample_seed(c.run.seed, 2, epoch, s))
            ns.append(sample_seed(c.run.seed, 3, epoch, s))
            # plan seed: shared by the group (windows, single step) unless the method draws one per sample
            ps.append(sample_seed(c.run.seed, 5, epoch, s) if c.sample.plan_per_sample
                      else sample_seed(c.run.seed, 4, gid))
        return prompts, meta, gids, xs, ns, ps

    # ------------------------------------------------------------------ rewards across processes
    def _sync_failure(self, exc: Optional[BaseException]) -> None:
        """Raise :class:`RewardCallFailed` on every process if it was raised on any (keeps collectives in step)."""
        msgs = _all_gather_object(None if exc is None else str(exc))
        bad = [(r, m) for r, m in enumerate(msgs) if m is not None]
        if bad:
            raise RewardCallFailed("; ".join(f"process {r}: {m}" for r, m in bad)) from exc

    def _apply_win_rates(self, traj: Trajectories) -> None:
        """Pref-GRPO: replace ``traj.rewards["total"]`` by the pairwise win rate of each valid sample inside its
        group. Groups may be split across processes: images are gathered, each process judges the groups
        ``sorted(gids)[rank::world]`` and the win rates are summed back (each sample is judged by one process)."""
        valid = traj.rewards["valid"]
        (imgs, gids, v), sl = _gather_rows([traj.images, traj.group_ids, valid], self.device)
        n_all = gids.shape[0]
        prompts, meta, *_ = self._epoch_samples(self.epoch, 0, n_all) if self.world > 1 else (traj.prompts,
                                                                                             traj.metadata)
        owned = set(torch.unique(gids).tolist()[self.rank::self.world])
        idx = [i for i in range(n_all) if bool(v[i]) and int(gids[i]) in owned]
        wr = torch.zeros(n_all, dtype=torch.float64)
        bad = torch.zeros(n_all, dtype=torch.float64)
        err = None
        if idx:
            try:
                out = self.rewards.pairwise(imgs[idx], [prompts[i] for i in idx], [meta[i] for i in idx],
                                            group_ids=gids[idx].tolist())
                ok = torch.as_tensor(out.get("valid", torch.ones(len(idx), dtype=torch.bool))).bool()
                wr[idx] = torch.as_tensor(out["win_rate"]).double()
                bad[idx] = (~ok).double()
            except RewardCallFailed as exc:
                err = exc
        self._sync_failure(err)
        d = _dist()
        if d is not None:
            t = torch.stack([wr, bad]).to(self.device)
            d.all_reduce(t)
            wr, bad = t.cpu()[0], t.cpu()[1]
        new_valid = valid & (bad[sl] == 0)
        traj.rewards["pointwise_total"] = traj.rewards["total"]
        traj.rewards["win_rate"] = wr[sl].float()
        traj.rewards["valid"] = new_valid
        traj.rewards["total"] = torch.where(new_valid, wr[sl].float(), torch.zeros(len(traj)))

    # ------------------------------------------------------------------ advantages
    def credit_inputs(self, traj: Trajectories) -> CreditInputs:
        """The explicit tensors a credit function reads (this process's rows; ``gather`` reaches all processes)."""
        o = self.cfg.optim
        valid = traj.rewards.get("valid")
        valid = torch.ones(len(traj), dtype=torch.bool) if valid is None else valid.bool()
        return CreditInputs(rewards=traj.rewards, group_ids=traj.group_ids, valid=valid, train_mask=traj.train_mask,
                            step_indices=traj.step_indices, sigmas=traj.sigmas, weights=self.rewards.weights,
                            opts=AdvOptions(o.adv_scale, o.adv_clip_max, o.adv_eps, _std_unbiased(o.adv_std_ddof)),
                            step_rewards=traj.step_rewards, device=self.device,
                            gather=lambda ts: _gather_rows(ts, self.device))

    def compute_advantages(self, traj: Trajectories) -> tuple[torch.Tensor, dict]:
        """(N, T) advantages of the trained columns (0 where not trained or invalid) from the credit table
        (:mod:`flow_grpo.methods`) and statistics of the whole gathered batch (all processes)."""
        inp = self.credit_inputs(traj)
        stats = _group_stats(inp)
        out = self.credit.advantages(inp)
        stats.update(out.stats)
        mask = inp.train_mask & inp.valid.unsqueeze(1)
        adv = out.advantages * mask.float()
        stats.update(_advantage_stats(adv, mask, inp.gather))
        return adv, stats

    # ------------------------------------------------------------------ loss of one column
    def _column_loss(self, traj: Trajectories, chunk, col: int, adv: torch.Tensor, n_global: float,
                     dummy: bool = False):
        """Loss of one micro-batch (rollout chunk x trained column), normalised by the global pair count.
        ``dummy``: same forward(s) with a zero mask (equalises micro-batch counts across processes)."""
        from mmgrpo.core import policy_loss

        from .sde import kl_on_mean, kl_on_velocity, sde_step

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
        from mmgrpo.utils.checkpoint import capture_rng_state, restore_rng_state

        c = self.cfg
        epoch = self.epoch
        t0 = time.perf_counter()
        rng_at_start = capture_rng_state()  # a SIGTERM during sampling abandons the epoch: it is redrawn on resume
        prompts, meta, gids, xs, ns, ps = self._epoch_samples(epoch)
        self.model.eval()
        traj, err = None, None
        try:
            traj = sample_trajectories(self.adapter, prompts, c.sample, xs, ns, ps, gids, meta, self.reward_fn,
                                       None, iteration=epoch, reward_runner=self.runner)
        except RewardCallFailed as exc:
            err = exc
        try:
            self._sync_failure(err)
        except RewardCallFailed as exc:  # reward.on_failure=stop: checkpoint before the epoch, then stop (exit 3)
            restore_rng_state(rng_at_start)
            self._stop_on_reward_failure(exc, epoch)
        if self._signals is not None and self._signals.agreed(self._reduce_max):  # before any update of the epoch
            restore_rng_state(rng_at_start)
            self._interrupt(f"epoch {epoch} (its samples were discarded before any update)")
        rc = self.rewards.take_counters()
        if c.reward.mode == "win_rate":
            self._apply_win_rates(traj)
            rc2 = self.rewards.take_counters()
            rc = {k: rc[k] + rc2[k] for k in rc}
        t_sample = time.perf_counter() - t0
        adv, stats = self.compute_advantages(traj)
        valid = traj.rewards["valid"]
        adv_ok = _reduce([0.0 if bool(torch.isfinite(adv).all()) else 1.0], "max", self.device)[0] == 0
        # no group kept >= 2 valid samples (every reward call failed / non-finite, on every process: the statistics
        # are global): nothing to learn from -> the updates count as skipped steps (feed max_consecutive_skips)
        no_group = stats["adv/groups_empty"] + stats["adv/groups_singleton"] >= c.data.groups_per_epoch
        train_mask = apply_train_masks(c, adv, traj.train_mask & valid.unsqueeze(1), self.credit_inputs(traj))
        traj.train_mask = train_mask
        # updates: split the chunks (whole trajectories, all their steps) into updates_per_epoch groups
        n_chunks = len(traj.chunks)
        n_upd = max(1, min(c.optim.updates_per_epoch, n_chunks))
        bounds = [round(i * n_chunks / n_upd) for i in range(n_upd + 1)]
        per_col: dict[int, list[float]] = {}
        acc_metrics: dict[str, tuple[float, int]] = {}
        kls: list[float] = []
        grad_norms = []
        status_count = {"applied": 0, "skipped": 0, "empty": 0}
        t1 = time.perf_counter()
        for _ in range(c.optim.inner_epochs):
            for u in range(n_upd):
                if no_group or not adv_ok:
                    status, gn = "skipped", float("nan")
                else:
                    status, gn = self._update(traj, adv, range(bounds[u], bounds[u + 1]), train_mask,
                                              acc_metrics, per_col, kls)
                status_count[status] += 1
                if status == "empty":
                    self.counters["empty_updates"] += 1
                    continue
                self.global_step += 1
                if status == "applied":
                    grad_norms.append(gn)
                    self.counters["applied_steps"] += 1
                    self.counters["consecutive_skips"] = 0
                    if self.ema is not None and self.global_step % c.ema.update_every == 0:
                        self.ema.update(self.global_step)
                else:
                    self.counters["skipped_steps"] += 1
                    self.counters["consecutive_skips"] += 1
                    what = ("no valid reward (no group kept two valid samples: failed or non-finite reward calls)"
                            if no_group else "non-finite advantages" if not adv_ok else
                            f"non-finite loss/gradients (grad norm {gn})")
                    self._last_skip_cause = what
                    log.warning("epoch %d update %d: %s: optimizer step skipped (%d in a row)",
                                epoch, u, what, self.counters["consecutive_skips"])
                    if self.counters["consecutive_skips"] >= c.optim.max_consecutive_skips:
                        self._halt(what)
        t_train = time.perf_counter() - t1
        # ------------------------------------------------------------ logging (whole gathered batch)
        names = list(self.rewards.weights)
        extra = ["win_rate", "pointwise_total"] if c.reward.mode == "win_rate" else []
        cols = torch.stack([traj.rewards["total"].float()] + [traj.rewards[k].float() for k in names + extra], 1)
        (cols_all, v_all, tm_all), _ = _gather_rows([cols, valid, train_mask.any(1)], self.device)
        vcols = cols_all[v_all]
        rsum = _reduce([rc.get(k, 0) for k in ("calls", "retries", "timeouts", "failed_calls", "dropped")],
                       "sum", self.device)
        self.counters["reward_invalid"] += int(stats["reward/invalid"])
        self.counters["reward_failed_calls"] += int(rsum[3])
        self.counters["reward_dropped"] += int(rsum[4])
        self.counters["groups_empty"] += int(stats["adv/groups_empty"])
        self.counters["groups_singleton"] += int(stats["adv/groups_singleton"])
        if stats["reward/invalid"] or stats["adv/groups_empty"] or stats["adv/groups_singleton"]:
            log.warning("epoch %d: %d samples dropped (invalid reward: non-finite or failed call), %d groups empty, "
                        "%d groups with one member (advantage 0)", epoch, int(stats["reward/invalid"]),
                        int(stats["adv/groups_empty"]), int(stats["adv/groups_singleton"]))
        n_images = float(cols_all.shape[0])
        out = {
            "epoch": epoch,
            "reward/total/mean": float(vcols[:, 0].mean()) if len(vcols) else float("nan"),
            "reward/total/std": float(vcols[:, 0].std()) if len(vcols) > 1 else 0.0,
            **{f"reward/{k}/mean": (float(vcols[:, j + 1].mean()) if len(vcols) else float("nan"))
               for j, k in enumerate(names + extra)},
            "reward/valid_fraction": float(v_all.float().mean()),
            "reward/calls": rsum[0], "reward/retries": rsum[1], "reward/timeouts": rsum[2],
            "reward/failed_calls": rsum[3], "reward/dropped_by_failure": rsum[4],
            **stats,
            "nfe_per_trajectory": traj.nfe_per_trajectory,
            "time/sample_s": t_sample, "time/train_s": t_train,
            "images_per_s": n_images / max(t_sample + t_train, 1e-9),
            "actual_batch_size": float(tm_all.sum()),
            "grad_norm": sum(grad_norms) / len(grad_norms) if grad_norms else float("nan"),
            "lr": float(self.lr_scheduler.get_last_lr()[0]),
            "steps/applied": float(status_count["applied"]), "steps/skipped": float(status_count["skipped"]),
            "steps/empty": float(status_count["empty"]),
            "steps/skipped_total": float(self.counters["skipped_steps"]),
            "steps/consecutive_skips": float(self.counters["consecutive_skips"]),
        }
        merged: dict[str, tuple[float, int]] = {}
        for part in _all_gather_object(acc_metrics):
            for k, (s_, n_) in part.items():
                a, b = merged.get(k, (0.0, 0))
                merged[k] = (a + s_, b + n_)
        for k, (s_, n_) in sorted(merged.items()):
            out[f"train/{k}"] = s_ / max(n_, 1)
        cols_ratio: dict[int, list[float]] = {}
        for part in _all_gather_object(per_col):
            for k, v in part.items():
                cols_ratio.setdefault(k, []).extend(v)
        for k, v in sorted(cols_ratio.items()):
            out[f"ratio/step_{k}"] = sum(v) / len(v)
        if c.optim.kl_coef > 0:
            allk = [x for part in _all_gather_object(kls) for x in part]
            if allk:
                out["train/kl"] = sum(allk) / len(allk)
        self._last_traj = traj
        return out

    # ------------------------------------------------------------------ faults
    def _halt(self, what: str) -> None:
        path = self.save_checkpoint(halted=True)
        path = _broadcast_object(str(path) if path is not None else None)
        k = self.cfg.optim.max_consecutive_skips
        never = " (none of the run's optimizer steps was applied)" if not self.counters["applied_steps"] else ""
        msg = (f"flow_grpo: stopping after {k} consecutive skipped optimizer steps{never} (last cause: {what}) at "
               f"epoch {self.epoch}, step {self.global_step}. Weights are unchanged by the skipped steps; the state "
               f"was written to {path} (continue with run.resume_from={path} after fixing the cause, e.g. a lower "
               "optim.lr, optim.max_grad_norm, bf16 -> fp32, or a broken reward).")
        if self.logger is not None:
            self.logger.log({"halted": 1.0, "steps/skipped_total": float(self.counters["skipped_steps"])},
                            self.global_step)
            self.logger.flush()
        log.error(msg)
        raise TrainingStopped(msg, path, resume_hint=False)  # msg names the halted folder to resume from

    # ------------------------------------------------------------------ eval
    @torch.no_grad()
    def evaluate(self) -> dict:
        """Deterministic ODE images for the eval prompts (seed of prompt i = sample_seed(seed, 5, i), fixed for the
        whole run), EMA weights swapped in if EMA is on; reward mean per component over all processes; PNG grid.
        Prompts are split evenly over processes (the last prompt repeats as padding so every process makes the same
        number of model calls, which sharded backends need)."""
        from mmgrpo.utils.seeding import sample_seed

        c = self.cfg
        n = len(self.eval_prompts)
        per = -(-n // self.world)
        idx = list(range(self.rank * per, (self.rank + 1) * per))
        real = torch.tensor([i < n for i in idx])
        idx = [min(i, n - 1) for i in idx]
        prompts = [self.eval_prompts[i] for i in idx]
        meta = [dict(self.eval_metadata[i]) for i in idx]
        seeds = [sample_seed(c.run.seed, 5, i) for i in idx]
        t0 = time.perf_counter()
        self.model.eval()
        with self.ema.swapped_in() if self.ema is not None else contextlib.nullcontext():
            imgs = generate_images(self.adapter, prompts, seeds, c.sample, num_steps=c.sample.eval_num_steps or None)
        err, scores = None, None
        try:
            scores = self.rewards.pointwise(imgs, prompts, meta)
        except RewardCallFailed as exc:
            err = exc
        self._sync_failure(err)
        self.rewards.take_counters()  # eval calls are not training statistics
        total, comps = finish_scores(scores, len(prompts))
        names = list(self.rewards.weights)
        cols = torch.stack([total] + [comps[k] for k in names], 1)
        (cols_all, v_all, r_all, imgs_all, idx_all), _ = _gather_rows(
            [cols, comps["valid"], real, imgs, torch.tensor(idx)], self.device)
        keep = v_all & r_all
        out = {"eval/reward/total/mean": float(cols_all[keep, 0].mean()) if bool(keep.any()) else float("nan"),
               "eval/invalid": float((~v_all & r_all).sum()), "eval/num_prompts": float(n),
               "time/eval_s": time.perf_counter() - t0}
        for j, k in enumerate(names):
            out[f"eval/reward/{k}/mean"] = float(cols_all[keep, j + 1].mean()) if bool(keep.any()) else float("nan")
        if self.is_main:
            from mmgrpo.utils.logging import save_image_grid

            sel = torch.nonzero(r_all).flatten()
            caps = [f"{self.eval_prompts[int(idx_all[i])]} r={float(cols_all[i, 0]):.3f}" for i in sel.tolist()]
            grid = save_image_grid(imgs_all[sel], self.out / "samples" / f"eval_epoch_{self.epoch:05d}.png",
                                   nrow=min(8, len(sel)), captions=caps, min_tile=128)
            if self.logger is not None and c.run.tensorboard:
                import numpy as np
                from PIL import Image

                self.logger.log_image("eval/samples", np.asarray(Image.open(grid).convert("RGB")), self.global_step)
        return out

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict:
        """Checkpoint entries (replicated backends; written by the main process): trainable weights, optimizer,
        LR schedule, EMA, counters and data position, reference settings, config. RNG states of every process are
        added by :meth:`save_checkpoint`."""
        from mmgrpo.utils.config import config_to_dict

        return {
            "trainable": {n: p.detach().cpu().clone() for n, p in self.named_params},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.lr_scheduler.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else {},
            "trainer": self._trainer_state(),
            "config": config_to_dict(self.cfg),
            "reference": dict(self.reference_info),
        }

    def _trainer_state(self) -> dict:
        return {"epoch": self.epoch, "global_step": self.global_step, "world": self.world,
                "counters": dict(self.counters), "best_eval": self.best_eval, "budget": self.budget.state_dict(),
                "data": {"epoch": self.epoch, "num_prompts": len(self.prompts),
                         "prompts_sha256": hashlib.sha256("\n".join(self.prompts).encode()).hexdigest(),
                         "group_size": self.cfg.data.group_size, "groups_per_epoch": self.cfg.data.groups_per_epoch}}

    def _check_replicas_in_sync(self) -> None:
        """Replicated backends: every process must hold the same trainable weights (DanceGRPO#110 guard). Compares
        per-tensor float64 sums and sums of squares computed on the device (cheap even for full fine-tunes);
        replicas that diverged in any entry would have to collide in both sums of every tensor to pass."""
        if self.sharded or self.world == 1:
            return
        with torch.no_grad():
            fp = torch.stack([torch.stack([p.detach().double().sum(), p.detach().double().pow(2).sum()])
                              for _, p in self.named_params]).cpu()
        prints = _all_gather_object(fp)
        bad = [r for r, f in enumerate(prints) if not torch.equal(f, prints[0])]
        if bad:
            raise RuntimeError(f"processes {bad} hold different trainable weights than process 0: gradients were not "
                               "synchronised")

    def save_checkpoint(self, metric: Optional[float] = None, halted: bool = False) -> Optional[Path]:
        """Collective: every process must call it. Returns the checkpoint dir on the main process."""
        from mmgrpo.utils.checkpoint import capture_rng_state

        mgr = self.halt_ckpt if halted else self.ckpt
        step = self.global_step if halted else self.epoch
        rng_all = _all_gather_object(capture_rng_state())
        if self.sharded:
            return self._save_sharded(mgr, step, metric, rng_all)
        self._check_replicas_in_sync()
        path = None
        if self.is_main:
            state = self.state_dict()
            state["rng"] = {"per_rank": rng_all, "world": self.world}
            extra = {}
            if self.cfg.model.lora.enabled:
                def write_lora(p):
                    os.makedirs(p, exist_ok=True)
                    with self.ema.swapped_in() if self.ema is not None else contextlib.nullcontext():
                        self.adapter.save_lora(str(p))
                extra["lora"] = write_lora
            path = mgr.save(step, state, metric=metric, extra_files=extra)
        _barrier()
        if not halted:
            self._last_save = (self.epoch, path)  # a stop right after this save does not write it again
        return path

    def _save_sharded(self, mgr, step: int, metric, rng_all) -> Optional[Path]:
        """FSDP / DeepSpeed: every process writes its shards (``accelerator.save_state``: model, optimizer, schedule
        and RNG in the backend's sharded format, plus ``ema_rank{r}.pt``) into a staging dir that the main process
        then moves into the atomic checkpoint. Resume needs the same number of processes."""
        stage = None
        if self.is_main:
            mgr.root.mkdir(parents=True, exist_ok=True)
            stage = mgr.root / f".tmp-shards-{step:08d}-{os.getpid()}"
            stage.mkdir(exist_ok=True)
        stage = Path(_broadcast_object(str(stage) if stage is not None else None))
        self.accelerator.save_state(str(stage / "accelerate"))
        torch.save(self.ema.state_dict() if self.ema is not None else {}, stage / f"ema_rank{self.rank}.pt")
        _barrier()
        path = None
        if self.is_main:
            from mmgrpo.utils.config import config_to_dict

            state = {"trainer": self._trainer_state(), "config": config_to_dict(self.cfg),
                     "reference": dict(self.reference_info), "rng": {"per_rank": rng_all, "world": self.world}}
            path = mgr.save(step, state, metric=metric, extra_files={"shards": lambda p: os.rename(stage, p)})
        _barrier()
        if mgr is self.ckpt:
            self._last_save = (self.epoch, path)  # a stop right after this save does not write it again
        return path

    def load_state_dict(self, st: dict, path: Optional[Path] = None) -> None:
        from mmgrpo.utils.checkpoint import restore_rng_state

        ref = st.get("reference")
        if ref and ref.get("base_fingerprint") != self.reference_info["base_fingerprint"]:
            raise ValueError("checkpoint was trained on different base weights (fingerprint mismatch): refusing to "
                             "resume onto another model")
        tr = st["trainer"]
        data = tr.get("data", {})
        sha = hashlib.sha256("\n".join(self.prompts).encode()).hexdigest()
        if data and data.get("prompts_sha256") != sha:
            log.warning("resume: the prompt list differs from the checkpoint's; the data order will not reproduce")
        if self.sharded:
            if path is None:
                raise ValueError("sharded resume needs the checkpoint path")
            if int(tr.get("world", self.world)) != self.world:
                raise ValueError(f"sharded checkpoint written by {tr.get('world')} processes; resume with the same "
                                 f"number (now {self.world})")
            from mmgrpo.utils.checkpoint import refuse_unsafe_pickles, safe_torch_load

            refuse_unsafe_pickles(Path(path) / "shards")  # torch.distributed.checkpoint unpickles .metadata as is
            self.accelerator.load_state(str(Path(path) / "shards" / "accelerate"))
            if self.ema is not None:
                self.ema.load_state_dict(safe_torch_load(Path(path) / "shards" / f"ema_rank{self.rank}.pt"))
        else:
            names = dict(self.named_params)
            missing = set(names) - set(st["trainable"])
            if missing:
                raise ValueError(f"checkpoint lacks trainable parameters {sorted(missing)[:5]}")
            with torch.no_grad():
                for n, p in names.items():
                    p.copy_(st["trainable"][n].to(p.device, p.dtype))
            self.optimizer.load_state_dict(st["optimizer"])
            if "scheduler" in st:
                self.lr_scheduler.load_state_dict(st["scheduler"])
            if self.ema is not None and st.get("ema"):
                self.ema.load_state_dict(st["ema"])
        self.epoch = int(tr["epoch"])
        self.global_step = int(tr["global_step"])
        self.counters.update(tr.get("counters", {}))
        self.best_eval = tr.get("best_eval")
        self.budget.load_state_dict(tr.get("budget"))
        rng = st.get("rng")
        if rng is not None:
            per = rng.get("per_rank") if isinstance(rng, dict) and "per_rank" in rng else [rng]
            if self.rank < len(per):
                restore_rng_state(per[self.rank])
            else:
                log.warning("resume: no RNG state saved for process %d (checkpoint had %d)", self.rank, len(per))

    def maybe_resume(self) -> Optional[Path]:
        """Collective. ``run.resume_from``: auto (latest valid checkpoint, if any) | none | a path."""
        path, err = None, None
        if self.is_main:
            try:
                path = self.ckpt.resolve(self.cfg.run.resume_from)
            except Exception as exc:  # noqa: BLE001 - re-raised on every process below
                err = f"{type(exc).__name__}: {exc}"
        path, err = _broadcast_object((str(path) if path is not None else None, err))
        if err:
            raise ValueError(f"resume_from={self.cfg.run.resume_from!r}: {err}")
        if path is None:
            return None
        self.load_state_dict(self.ckpt.load(path), Path(path))
        self._last_save = (self.epoch, path)  # an interrupt before the next epoch need not rewrite it
        return Path(path)

    # ------------------------------------------------------------------ export
    @names_write_errors("the final weights export", lambda self: self.out)  # disk full / read-only: name path and cause
    def export_final(self) -> Optional[Path]:
        """Collective. The trained weights (EMA if on) for inference: LoRA -> ``<output_dir>/lora_final``
        (``Pipeline.load_lora_weights``), full fine-tune -> ``<output_dir>/transformer_final`` (``save_pretrained``,
        gathered from all shards).

        Written atomically (temp folder + rename, ``mmgrpo.utils.export``) with an ``export.json`` naming the epoch
        and step it holds: a resumed run with no epochs left rewrites an export that is missing, damaged or older
        than its checkpoint (see :meth:`train`)."""
        from mmgrpo.utils.export import publish_dir

        target = None
        with self.ema.swapped_in() if self.ema is not None else contextlib.nullcontext():
            if self.cfg.model.lora.enabled and not self.sharded:
                if self.is_main:
                    target = publish_dir(self._export_dir(), lambda d: self.adapter.save_lora(str(d)),
                                         self._export_meta())
            else:
                sd = self.accelerator.get_state_dict(self.model)  # collective under FSDP / ZeRO-3
                if self.is_main:
                    from safetensors.torch import save_file

                    sd = {k: v.detach().cpu().contiguous().clone() for k, v in sd.items()
                          if not self.cfg.model.lora.enabled or "lora_" in k}

                    def write(d: Path) -> None:
                        # a diffusers model folder (config.json + weights): ``<ModelClass>.from_pretrained(target)``
                        save_file(sd, str(d / "diffusion_pytorch_model.safetensors"))
                        self.unwrapped.save_config(str(d))

                    target = publish_dir(self._export_dir(), write, self._export_meta())
        _barrier()
        return target

    def _export_dir(self) -> Path:
        lora = self.cfg.model.lora.enabled
        return self.out / ("lora_final" if lora and not self.sharded else "lora_final_state" if lora
                           else "transformer_final")

    def _export_meta(self) -> dict:
        return {"epoch": self.epoch, "global_step": self.global_step}

    def _export_outdated(self) -> bool:
        """Collective. True (and logged) if the final export is missing, damaged or not of the current state."""
        from mmgrpo.utils.export import export_problem

        why = export_problem(self._export_dir(), self._export_meta()) if self.is_main else None
        why = _broadcast_object(why)
        if why and self.is_main:
            log.warning("final export to be (re)written: %s", why)
        return why is not None

    def _check_trained(self) -> None:
        """A run none of whose optimizer steps was applied fails instead of exporting "trained" weights."""
        n = self.counters
        if self.epoch == 0 or n["applied_steps"] > 0:
            return
        if self.logger is not None:
            self.logger.flush()
        cause = getattr(self, "_last_skip_cause", None) or (
            "every update was empty: no trajectory had a non-zero advantage (all groups' rewards tied; "
            "optim.drop_zero_adv=true)")
        raise NothingTrained(
            f"flow_grpo: nothing was trained in {self.epoch} epoch(s): no optimizer step was applied "
            f"({n['skipped_steps']} skipped, {n['empty_updates']} empty; last cause: {cause}; "
            f"{n['reward_invalid']} samples had an invalid reward, {n['reward_failed_calls']} reward calls failed). "
            f"No final weights were exported. Check the reward (server reachable? reward.weights / reward.kwargs) "
            f"and the learning rate.")

    # ------------------------------------------------------------------ main loop
    def _eval_due(self, final: bool) -> bool:
        if not self.eval_prompts:
            return False
        every = self.cfg.run.eval_every
        return final or bool(every and self.epoch % every == 0)

    def _budget_exhausted(self) -> bool:
        """Collective when a budget is set: every process stops after the same epoch."""
        if not self.budget.enabled:
            return False
        if _reduce([float(self.budget.exhausted)], "max", self.device)[0] > 0:
            if not self.budget_stopped:
                log.info("run.max_train_seconds=%g reached after epoch %d (%.1f s, %s clock)",
                         self.budget.max_seconds, self.epoch, self.budget.spent, self.cfg.run.budget_clock)
            self.budget_stopped = True
        return self.budget_stopped

    def _reduce_max(self, x: float) -> float:
        return _reduce([x], "max", self.device)[0]

    def _stop_on_reward_failure(self, exc: RewardCallFailed, epoch: int) -> None:
        """Collective. ``reward.on_failure=stop``: write a checkpoint of the state before ``epoch`` (its samples are
        redrawn on resume, as after a signal) and raise :class:`TrainingStopped` (``flow_grpo train`` exits 3)."""
        last = getattr(self, "_last_save", None)
        path = last[1] if last is not None and last[0] == self.epoch else self.save_checkpoint()
        path = _broadcast_object(str(path) if path is not None else None)
        if self.logger is not None:
            self.logger.flush()
        msg = (f"flow_grpo: a reward call failed at epoch {epoch} and reward.on_failure=stop: {exc}. The state before "
               f"the epoch was written to {path}; fix the reward, then resume with run.resume_from=auto.")
        log.error(msg)
        raise TrainingStopped(msg, path, resume_hint=False) from exc

    def _interrupt(self, where: str) -> None:
        """Collective. SIGTERM / SIGINT: checkpoint the current state (unless this epoch's is already written) on
        every process and raise :class:`TrainingInterrupted` (``flow_grpo train`` exits with code 6)."""
        last = getattr(self, "_last_save", None)
        path = last[1] if last is not None and last[0] == self.epoch else self.save_checkpoint()
        path = _broadcast_object(str(path) if path is not None else None)
        if self.logger is not None:
            self.logger.flush()
        log.warning("interrupted by %s at %s: checkpoint %s", self._signals.name, where, path)
        raise TrainingInterrupted(self._signals.name, where, path)

    def train(self, num_epochs: Optional[int] = None) -> list[dict]:
        """Train to ``run.num_epochs`` (or ``num_epochs`` more). SIGTERM / SIGINT stop it at the next epoch boundary
        (or abandon the epoch if its samples are still being drawn) after a checkpoint: :class:`TrainingInterrupted`."""
        with StopOnSignal() as self._signals:
            try:
                return self._train(num_epochs)
            finally:
                self._signals = None

    def _train(self, num_epochs: Optional[int] = None) -> list[dict]:
        from mmgrpo.utils.config import save_config
        from mmgrpo.utils.logging import save_image_grid

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
        from tqdm.auto import tqdm

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
            bar.set_postfix(reward=f"{metrics.get('reward/mean', float('nan')):.3f}", refresh=False)
            if self._budget_exhausted():  # this epoch is the last one: final eval, checkpoint and export follow
                end = self.epoch
            ev = self.evaluate() if self._eval_due(final=self.epoch == end) else None
            if ev is not None:
                metrics.update(ev)
            history.append(metrics)
            if self.logger is not None:
                self.logger.log(metrics, self.global_step)
                every = c.run.image_grid_every
                if every and (self.epoch % every == 0):
                    t = self._last_traj
                    save_image_grid(t.images, self.out / "samples" / f"epoch_{self.epoch:05d}.png",
                                    nrow=c.data.group_size, min_tile=128,
                                    captions=[f"{p} r={r:.3f}" for p, r in zip(t.prompts, t.rewards["total"].tolist())])
            metric = ev["eval/reward/total/mean"] if ev is not None else None
            if metric is not None and not math.isfinite(metric):
                metric = None
            new_best = metric is not None and (self.best_eval is None or metric > self.best_eval)
            if new_best:
                self.best_eval = metric
            due = bool(c.run.save_every and self.epoch % c.run.save_every == 0) or self.epoch == end
            if due or (new_best and c.run.keep_best):
                self.save_checkpoint(metric=metric)
        bar.close()
        self._check_trained()  # raises (no export) if no optimizer step of the run was applied
        # a resumed run with no epochs left still repairs a missing / damaged / outdated export
        if history or (self.epoch > 0 and self._export_outdated()):
            self._check_replicas_in_sync()
            self.export_final()
        if history:
            if self.is_main and c.run.reward_curves:
                self._plot_curves()
        if self.logger is not None:
            self.logger.flush()
        return history

    def _plot_curves(self) -> None:
        from mmgrpo.utils.logging import plot_curves, read_jsonl

        path = self.out / "metrics.jsonl"
        if not path.is_file():
            return
        present = set()
        for row in read_jsonl(path):
            present |= set(row)
        comps = list(self.rewards.weights) if len(self.rewards.weights) > 1 else []  # one reward = the mean
        keys = [k for k in ["reward/total/mean", "eval/reward/total/mean"] + [f"reward/{k}/mean" for k in comps] +
                [f"eval/reward/{k}/mean" for k in comps] if k in present]
        keys = list(dict.fromkeys(keys))
        if keys:
            plot_curves(path, keys, self.out / "reward_curves.png", title="rewards")

    def close(self) -> None:
        from mmgrpo.utils.runlock import release_run_lock

        if self.is_main:
            release_run_lock(self.out)
        if self.runner is not None:
            self.runner.shutdown(wait=False)
            self.runner = None
        if self.logger is not None:
            self.logger.close()


def _peft_init(v: str):
    low = str(v).lower()
    if low in ("true", "default"):
        return True
    if low == "false":
        return False
    return v


def train_from_config(cfg: TrainConfig) -> list[dict]:
    tr = FlowGRPOTrainer(cfg)
    try:
        return tr.train()
    finally:
        tr.close()
