"""The VLM GRPO trainer: one readable loop; methods plug in through the hooks of ``mmgrpo.methods``.

The loop names no method: the methods the config enables (``mmgrpo.methods.REGISTRY``) are built once and their
hooks called at fixed points, in registry order (``mmgrpo.methods.base`` lists the points). Per step
(``GRPOTrainer.train``):

1. **collect**: draw prompts (deterministic, resumable stream; each process takes its slice), build processor inputs
   (videos through ``mmgrpo.video``'s fps contract), sample the group's members (seeds from (seed, step,
   stream position, g); methods may add members, e.g. TempSamp-R1's ground truth), score rewards (methods may add
   terms, e.g. T-GRPO's bonus), compute group advantages (explicit integer group ids = stream position; methods
   may shape the reward or replace the estimator), let methods filter the batch and refill it in extra rounds
   (DAPO dynamic sampling);
2. **precompute** on fixed micro-batches of whole groups: old log-probs (num_iterations > 1, or a method needs
   them), reference log-probs (kl_coef > 0), the methods' token weights -- all with ``compute_token_logprobs``, the same function and the
   same padding the loss uses, so on-policy ratios are exactly 1 (the output head runs ``algo.logprob_chunk_size``
   tokens at a time, ``mmgrpo.models.chunked``: no full-vocabulary logits are materialised);
3. **optimise**: ``num_iterations`` AdamW updates over the micro-batches with ``mmgrpo.core.policy_loss`` (PPO-clip
   or Reg-GRPO, chosen aggregation, KL); losses are normalised by *global* token / sequence counts and gradients are
   summed across processes, so the update does not depend on the number of processes or micro-batches;
4. log (every reward, zero-std fraction, clip fractions, KL, lengths, parse failures, tokens/s; sampled
   completions to ``completions.jsonl``) and checkpoint (all state through ``CheckpointManager``; the last
   ``run.keep_last`` plus the best by ``run.best_metric``).

Faults (``mmgrpo.train.faults``): a reward call that raises or times out is retried with back-off, then its rows
are dropped (counted) or the run stops; NaN/inf rewards drop their rows from the group (``valid``) or stop the run;
groups left with < 2 members get advantage 0 (counted); NaN/inf advantages, loss or gradients skip the optimizer
step (counted); ``run.max_consecutive_skips`` skips in a row stop the run.  A stop always writes a checkpoint
first and raises ``TrainingStopped`` (``mmgrpo train`` exits with code 3).

Preemption (``mmgrpo.utils.signals``): SIGTERM / SIGINT set a flag that every process polls through a max-reduction
after collect (the step is then discarded: stream and RNG roll back) and before each step (the step in progress was
finished); all processes stop at the same step, a checkpoint is written and ``TrainingInterrupted`` raised
(``mmgrpo train`` exits with code 6). A second signal >= 1 s later kills the process at once; atomic checkpoint
writes keep the last complete checkpoint intact.

Several processes: each draws its share of the global batch (``run.prompts_per_step``; a group may be split, its
advantages are computed on the gathered batch).  Gradients are summed by hand for replicated weights
(``run.grad_sync=manual``, the default without FSDP / DeepSpeed) or go through ``accelerator.prepare`` (FSDP2 /
DeepSpeed, see ``optimize``).  Verified on CPU only (gloo, two processes): the manual path and FSDP2 (plugin
set by hand, as accelerate refuses FSDP without GPUs), including a sharded checkpoint resume; DeepSpeed is wired
the same way but untested (not installable here); no GPU / NCCL run has been made.
"""
from __future__ import annotations

import contextlib
import copy
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from mmgrpo.config import TrainConfig
from mmgrpo.core import AdvantageOutput, gather_groups, global_sum, group_advantages, policy_loss
from mmgrpo.methods import build_methods, enabled_classes
from mmgrpo.models.adapters import LoraSpec, Policy, load_policy
from mmgrpo.models.rollout import (HFRolloutBackend, RolloutBackend, SamplingParams, batch_to, collate_prompts,
                                   compute_token_logprobs, make_seeds)
from mmgrpo.engine.errors import NothingTrained, RewardCallFailed, TrainingInterrupted, TrainingStopped
from mmgrpo.train.compat import MethodAliases
from mmgrpo.train.faults import CallStats, call_with_retries, nonfinite_rows
from mmgrpo.train.task import (BadSampleError, MissingMediaError, PreparedPrompt, TaskAdapter, accuracy_key,
                               build_rewards, load_samples, sample_id)
from mmgrpo.utils.budget import TimeBudget
from mmgrpo.utils.checkpoint import CheckpointManager, capture_rng_state, refuse_unsafe_pickles, restore_rng_state
from mmgrpo.utils.schedule import LRFactor
from mmgrpo.utils.config import config_to_dict, save_config
from mmgrpo.utils.signals import StopOnSignal
from mmgrpo.utils.logging import MetricLogger, get_logger
from mmgrpo.utils.master_weights import make_adamw
from mmgrpo.utils.runlock import acquire_run_lock
from mmgrpo.utils.seeding import sample_seed, seed_everything

log = get_logger("mmgrpo.train")


# --------------------------------------------------------------------------------------------------- sampler
class PromptStream:
    """Endless, seeded, resumable stream of sample indices; epoch e uses permutation(seed, e).

    ``take(k)`` returns (stream position, sample index) pairs; the stream position is unique over the run and is
    the group id and the seed coordinate of a prompt, independent of the number of processes.

    ``on_epoch(e)`` (optional) runs when epoch e > 0 begins and may return a new number of samples: per-epoch data
    re-selection (Time-R1 multi-round); epoch e then permutes the new set.
    """

    def __init__(self, num_samples: int, seed: int, shuffle: bool = True,
                 on_epoch: Callable[[int], int | None] | None = None):
        if num_samples < 1:
            raise ValueError("the training set is empty")
        self.n, self.seed, self.shuffle = num_samples, seed, shuffle
        self.position = 0
        self._epoch, self.offset = 0, 0  # current epoch and how many of its samples were taken
        self.on_epoch = on_epoch
        self._perm_epoch, self._perm = -1, None

    def _order(self, epoch: int) -> list[int]:
        if self._perm_epoch != epoch:
            if self.shuffle:
                g = torch.Generator().manual_seed(sample_seed(self.seed, 7919, epoch))
                self._perm = torch.randperm(self.n, generator=g).tolist()
            else:
                self._perm = list(range(self.n))
            self._perm_epoch = epoch
        return self._perm

    def take(self, k: int) -> list[tuple[int, int]]:
        out = []
        for _ in range(k):
            if self.offset >= self.n:  # next epoch (for a constant n: epoch = position // n, as always)
                self._epoch, self.offset = self._epoch + 1, 0
                if self.on_epoch is not None:
                    n = self.on_epoch(self._epoch)
                    if n is not None:
                        if n < 1:
                            raise ValueError(f"epoch {self._epoch}: data re-selection kept no samples")
                        self.n, self._perm_epoch = int(n), -1
            out.append((self.position, self._order(self._epoch)[self.offset]))
            self.position += 1
            self.offset += 1
        return out

    @property
    def epoch(self) -> int:
        return self._epoch + self.offset // self.n

    def state_dict(self) -> dict:
        return {"position": self.position, "num_samples": self.n, "seed": self.seed, "shuffle": self.shuffle,
                "epoch": self._epoch, "offset": self.offset}

    def load_state_dict(self, sd: dict) -> None:
        if sd["num_samples"] != self.n:
            raise ValueError(f"resume: the checkpoint's data stream had {sd['num_samples']} samples, the current "
                             f"training set has {self.n}; same data (and selection) is required for an exact resume")
        self.position = int(sd["position"])
        if "epoch" in sd:
            self._epoch, self.offset = int(sd["epoch"]), int(sd["offset"])
        else:  # older checkpoints: a constant n
            self._epoch, self.offset = divmod(self.position, self.n)
        self._perm_epoch = -1


# --------------------------------------------------------------------------------------------------- batch
@dataclass
class RolloutBatch:
    """All rows of one step on this process.  Rows of a group are contiguous; group id = stream position."""

    items: list[dict]  # per row: processor output of its prompt (shared objects across the group)
    samples: list[Any]
    texts: list[str]
    completion_ids: torch.Tensor  # (N, T)
    completion_mask: torch.Tensor  # (N, T) real tokens
    group_ids: torch.Tensor  # (N,) int64
    is_offpolicy: torch.Tensor  # (N,) bool (TempSamp ground-truth rows)
    truncated: torch.Tensor  # (N,) bool
    parse_failed: torch.Tensor  # (N,) bool
    rewards: dict[str, torch.Tensor]  # name -> (N,), includes "total"
    rollout_logp: torch.Tensor  # (N, T) sampling log-probs (0 on off-policy rows)
    advantages: torch.Tensor | None = None
    reward_used: torch.Tensor | None = None  # rewards entering the advantage (after shaping / bonus)
    zero_std: torch.Tensor | None = None  # (N,) bool
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    token_weights: torch.Tensor | None = None
    info: dict[str, float] = field(default_factory=dict)
    valid: torch.Tensor | None = None  # (N,) bool: False = reward failed / non-finite (dropped after advantages)

    @property
    def n(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def loss_mask(self) -> torch.Tensor:
        return self.completion_mask

    def select(self, rows: torch.Tensor) -> "RolloutBatch":
        idx = rows.tolist()
        pick = (lambda t: None if t is None else t[rows])
        return RolloutBatch(
            items=[self.items[i] for i in idx], samples=[self.samples[i] for i in idx],
            texts=[self.texts[i] for i in idx], completion_ids=self.completion_ids[rows],
            completion_mask=self.completion_mask[rows], group_ids=self.group_ids[rows],
            is_offpolicy=self.is_offpolicy[rows], truncated=self.truncated[rows], parse_failed=self.parse_failed[rows],
            rewards={k: v[rows] for k, v in self.rewards.items()}, rollout_logp=self.rollout_logp[rows],
            advantages=pick(self.advantages), reward_used=pick(self.reward_used), zero_std=pick(self.zero_std),
            old_logp=pick(self.old_logp), ref_logp=pick(self.ref_logp), token_weights=pick(self.token_weights),
            info=dict(self.info), valid=pick(self.valid))


def _global_max(x: float) -> float:
    """Max of a scalar over processes (identity without torch.distributed)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return float(x)
    t = torch.tensor([float(x)], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _pad_cols(t: torch.Tensor, T: int, value=0) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, T - t.shape[1]), value=value) if t.shape[1] < T else t[:, :T]


def cat_batches(bs: Sequence[RolloutBatch], pad_id: int) -> RolloutBatch:
    bs = [b for b in bs if b.n > 0]
    if len(bs) == 1:
        return bs[0]
    T = max(b.completion_ids.shape[1] for b in bs)

    def cat(get, value=0):
        vals = [get(b) for b in bs]
        if any(v is None for v in vals):
            return None
        if vals[0].dim() == 2:
            vals = [_pad_cols(v, T, value) for v in vals]
        return torch.cat(vals)

    info: dict[str, float] = {}
    for b in bs:
        for k, v in b.info.items():
            info[k] = info.get(k, 0.0) + v
    return RolloutBatch(
        items=sum((b.items for b in bs), []), samples=sum((b.samples for b in bs), []),
        texts=sum((b.texts for b in bs), []), completion_ids=cat(lambda b: b.completion_ids, pad_id),
        completion_mask=cat(lambda b: b.completion_mask), group_ids=cat(lambda b: b.group_ids),
        is_offpolicy=cat(lambda b: b.is_offpolicy), truncated=cat(lambda b: b.truncated),
        parse_failed=cat(lambda b: b.parse_failed),
        rewards={k: torch.cat([b.rewards[k] for b in bs]) for k in bs[0].rewards},
        rollout_logp=cat(lambda b: b.rollout_logp), advantages=cat(lambda b: b.advantages),
        reward_used=cat(lambda b: b.reward_used), zero_std=cat(lambda b: b.zero_std),
        old_logp=cat(lambda b: b.old_logp), ref_logp=cat(lambda b: b.ref_logp),
        token_weights=cat(lambda b: b.token_weights, 1.0), info=info, valid=cat(lambda b: b.valid))


def micro_batches(group_ids: torch.Tensor, max_rows: int) -> list[torch.Tensor]:
    """Row indices of micro-batches made of whole groups (<= max_rows rows unless one group is larger)."""
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids.tolist()):
        groups.setdefault(g, []).append(i)
    out, cur = [], []
    for rows in groups.values():
        if cur and len(cur) + len(rows) > max_rows:
            out.append(torch.tensor(cur))
            cur = []
        cur.extend(rows)
    if cur:
        out.append(torch.tensor(cur))
    return out


# --------------------------------------------------------------------------------------------------- trainer
class GRPOTrainer(MethodAliases):
    """GRPO for Qwen-VL policies.  ``samples`` / ``policy`` / ``reward_fn`` may be injected (tests, scripts)."""

    def __init__(self, cfg: TrainConfig, samples: Sequence[Any] | None = None, policy: Policy | None = None,
                 reward_fn: Callable | None = None, accuracy_fn: Callable | None = None,
                 backend: RolloutBackend | None = None):
        from accelerate import Accelerator
        from accelerate.utils import DistributedType

        self.cfg = cfg
        cpu = cfg.run.device == "cpu" or (cfg.run.device == "auto" and not torch.cuda.is_available())
        # the LR schedule counts optimizer updates: accelerate must not step it once per process
        self.accelerator = Accelerator(cpu=cpu, mixed_precision=cfg.run.mixed_precision,
                                       step_scheduler_with_optimizer=False)
        self.rank, self.world = self.accelerator.process_index, self.accelerator.num_processes
        self.device = self.accelerator.device
        dt = self.accelerator.distributed_type
        self.sharded = dt in (DistributedType.FSDP, DistributedType.DEEPSPEED)
        self.dist_kind = str(dt).rsplit(".", 1)[-1]
        self.grad_sync = cfg.run.grad_sync
        if self.grad_sync == "auto":
            self.grad_sync = "accelerate" if self.sharded else "manual"
        if self.sharded and self.grad_sync == "manual":
            raise ValueError(f"{self.dist_kind} shards the parameters: run.grad_sync=manual cannot sum gradients "
                             "by hand; use run.grad_sync=auto")
        if self.dist_kind == "FSDP":
            plugin = self.accelerator.state.fsdp_plugin
            if getattr(plugin, "fsdp_version", 1) != 2:
                raise ValueError("mmgrpo runs FSDP as FSDP2 (fully_shard): set fsdp_version: 2 in the accelerate "
                                 "config (fsdp_config); FSDP1 is not supported by this trainer")
        self._setup_global_batch()
        self._pad_rows = None  # (batch, rows) repeated with weight 0 to pad micro-batch counts (prepared model)
        # same seed on every process: LoRA / head initialisation must be identical across ranks (sampling itself
        # uses explicit per-row seeds, see make_seeds)
        seed_everything(cfg.run.seed)
        self.run_dir = Path(cfg.run.output_dir)
        # one run per output folder (main process), before anything is loaded: a second run refuses at once
        self._run_lock = acquire_run_lock(self.run_dir, self.accelerator.is_main_process, owner=self)

        # data first: a bad file fails before a (large) model is loaded
        self.samples = list(samples) if samples is not None else load_samples(
            cfg.data.train_file, cfg.data.max_samples, cfg.data.media_root,
            check_media=cfg.data.on_missing_media == "error")
        self.all_samples = self.samples
        if policy is None:
            if not cfg.model.path:
                raise ValueError("model.path is required (a local checkpoint folder)")
            lora = None
            if cfg.model.lora.enabled:
                lc = cfg.model.lora
                lora = LoraSpec(r=lc.r, alpha=lc.alpha, dropout=lc.dropout, target_modules=list(lc.target_modules),
                                include_vision=lc.include_vision)
            policy = load_policy(cfg.model.path, cfg.model.family, lora=lora, freeze_vision=cfg.model.freeze_vision,
                                 gradient_checkpointing=cfg.model.gradient_checkpointing, dtype=cfg.model.dtype,
                                 need_reference=cfg.algo.kl_coef > 0, lora_path=cfg.model.lora_path or None,
                                 attn_implementation=cfg.model.attn_implementation, device=self.device)
        self.policy = policy
        self.model = policy.model
        self.tok = policy.tokenizer
        self.pad_id = self.tok.pad_token_id
        self.eos_id = self.tok.convert_tokens_to_ids("<|im_end|>")
        if self.eos_id is None or self.eos_id == self.tok.unk_token_id:
            self.eos_id = self.tok.eos_token_id
        self.task = TaskAdapter(policy.processor, policy.adapter, cfg.data)
        if reward_fn is None:
            reward_fn, accuracy_fn = build_rewards(cfg.reward, cfg.data.task, policy.family, self.tok,
                                                      cfg.data.prompt_mode)
        self.reward_fn, self.accuracy_fn = reward_fn, accuracy_fn
        self.acc_key = accuracy_key(cfg.reward, cfg.data.task)
        self.methods = build_methods(cfg, self)  # mmgrpo.methods: their hooks, in registry order
        if backend is None:
            if cfg.rollout.backend == "vllm":
                from mmgrpo.models.vllm_backend import backend_from_config

                backend = backend_from_config(cfg, policy)
            else:
                backend = HFRolloutBackend(self.model, policy.processor, policy.suppress_token_ids,
                                           cfg.rollout.generation_batch_size, device=self.device,
                                           shared_prefix=cfg.rollout.shared_prefix)
        self.backend = backend
        self.sampling = SamplingParams(cfg.rollout.max_new_tokens, cfg.rollout.temperature, cfg.rollout.top_p,
                                       cfg.rollout.top_k)

        params = policy.trainable_parameters()
        if not params:
            raise ValueError("no trainable parameters (everything frozen?)")
        o = cfg.optim
        # bf16 weights get fp32 master copies (mmgrpo.utils.master_weights); sharded engines keep their own and
        # remap the optimizer's parameters at prepare, which must then be the model's
        self.optimizer = make_adamw(params, master_weights=o.fp32_master_weights and not self.sharded, lr=o.lr,
                                    weight_decay=o.weight_decay, betas=tuple(o.betas))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, LRFactor(o.lr_schedule, o.warmup_steps, cfg.run.max_steps * cfg.algo.num_iterations))
        self.params = params
        self.unwrapped = self.model  # the module itself: saving, reference, rollout (policy.model is this one)
        if self.grad_sync == "accelerate":
            # the standard route (FSDP / DeepSpeed / DDP): every forward goes through the prepared module,
            # accelerator.backward + no_sync for the micro-batches of one update, accelerator.clip_grad_norm_
            self.model, self.optimizer, self.scheduler = self.accelerator.prepare(self.model, self.optimizer,
                                                                                  self.scheduler)
            self.params = [p for p in self.model.parameters() if p.requires_grad]
            self.unwrapped = self.accelerator.unwrap_model(self.model)
        else:
            self._broadcast_params()
        self.logprob_impl = self._choose_logprob_impl()
        self.step = 0
        self.budget = TimeBudget(cfg.run.max_train_seconds, cfg.run.budget_clock)
        self.budget_stopped = False
        self.counters = {"skipped_missing_media": 0, "skipped_bad_samples": 0, "filtered_groups": 0,
                         "generated_tokens": 0,
                         # faults (see mmgrpo.train.faults): rows dropped for NaN/inf or failed rewards, reward
                         # calls that failed for good, groups left with < 2 valid members, skipped optimizer steps
                         "reward_nonfinite_rows": 0, "reward_failed_rows": 0, "reward_failed_calls": 0,
                         "reward_retries": 0, "reward_timeouts": 0, "degenerate_groups": 0, "skipped_steps": 0}
        self.consecutive_skips = 0
        self._stop_reason: str | None = None
        self._signals: StopOnSignal | None = None  # active during train(): SIGTERM / SIGINT stop at a step boundary
        self._step_snapshot: dict | None = None
        self.stream: PromptStream | None = None
        main = self.accelerator.is_main_process
        self.logger = MetricLogger(self.run_dir, use_tensorboard=cfg.run.use_tensorboard, is_main_process=main)
        # retention: the last run.keep_last checkpoints plus the best by run.best_metric (a logged metric)
        self.ckpt = CheckpointManager(self.run_dir / "checkpoints", keep_last=cfg.run.keep_last,
                                      keep_best=bool(cfg.run.best_metric), best_mode=cfg.run.best_mode)
        self._last_metrics: dict[str, float] = {}
        if main:
            save_config(cfg, self.run_dir / "config.yaml")

    def _choose_logprob_impl(self) -> str:
        """``run.logprob_impl`` (default prefix_group) or the naive path where the shared-prefix forward is not
        exact / not supported -- logged, and visible as ``perf/prefix_group`` in the metrics.

        Every trained row of a group shares its prompt item (TempSamp's ground-truth row included; T-GRPO's
        shuffled-frame rows are only scored, never trained), so the prompt is an exact prefix of each row."""
        impl = self.cfg.run.logprob_impl
        if impl != "prefix_group":
            return impl
        from mmgrpo.models.prefix_group import VERIFIED_FAMILIES, supports_grouping

        reason = None
        if self.grad_sync == "accelerate":
            # a prepared module must see the same number of calls on every process (collectives per forward);
            # the shared-prefix path calls it once or twice depending on the completion length
            reason = f"not used with run.grad_sync=accelerate ({self.dist_kind})"
        elif self.policy.family not in VERIFIED_FAMILIES:
            reason = f"model family {self.policy.family!r} is not verified against the naive path"
        elif not supports_grouping(self.model):
            reason = f"{type(self.model).__name__} has no MRoPE get_rope_index"
        elif any(getattr(getattr(m, "_gradient_checkpointing_func", None), "keywords", {}).get("use_reentrant")
                 for m in self.model.modules() if getattr(m, "gradient_checkpointing", False)):
            reason = "reentrant gradient checkpointing would cut the gradient to the shared prefix"
        if reason:
            log.warning("run.logprob_impl=prefix_group -> naive log-prob path: %s", reason)
            return "naive"
        log.info("log-probs: shared-prefix group forward (each prompt encoded once per group)")
        return impl

    def _setup_global_batch(self) -> None:
        """Global prompts per step and whether a group's rows may sit on several processes."""
        cfg, W = self.cfg, self.world
        G = cfg.rollout.num_generations
        P = cfg.run.prompts_per_step or cfg.run.prompts_per_device * W
        if (P * G) % W:
            raise ValueError(f"run.prompts_per_step={P} x rollout.num_generations={G} rows cannot be split evenly "
                             f"over {W} processes")
        self.prompts_per_step = P
        self.split_groups = P % W != 0
        for m in enabled_classes(cfg):
            m.check_config(cfg)
        if self.split_groups:
            # these need every row of a group on one process (group-level rewards, shuffled / injected members,
            # intra-group token statistics, refill decisions)
            bad = [m.name for m in enabled_classes(cfg) if m.needs_whole_groups]
            bad += ["reward 'length'"] if "length" in cfg.reward.weights else []
            if bad:
                raise ValueError(f"run.prompts_per_step={P} is not a multiple of the {W} processes, so groups are "
                                 f"split across processes, which {bad} do not support; use a multiple of {W}")

    # ----------------------------------------------------------------------------------------- prompts
    def _prepare(self, drawn: Sequence[tuple]) -> list[tuple[int, PreparedPrompt, list[int] | None]]:
        """(stream position, prepared prompt, generation indices this process samples or None = all)."""
        out = []
        t0 = time.perf_counter()
        for pos, idx, gens in drawn:
            s = self.samples[idx]
            try:
                out.append((pos, self._prepare_sample(pos, idx, s), gens))
            except MissingMediaError as e:
                if self.cfg.data.on_missing_media == "error":
                    raise
                self.counters["skipped_missing_media"] += 1
                log.warning("skipping sample %s (index %d): %s", sample_id(s), idx, e)
            except BadSampleError as e:
                if self.cfg.data.on_bad_sample == "error":
                    raise
                self.counters["skipped_bad_samples"] += 1
                log.warning("skipping sample (index %d): %s (data.on_bad_sample=skip)", idx, e)
        self._data_wait = getattr(self, "_data_wait", 0.0) + time.perf_counter() - t0
        return out

    # data.prefetch: the next steps' samples are prepared in a background thread (mmgrpo.data.prefetch); the
    # stream itself only advances in _draw, so checkpoints keep the position of the batch being trained
    def _prepare_sample(self, pos: int, idx: int, s):
        pf = self._get_prefetcher()
        # keyed by the sample object too: a data re-selection may map the same index to another sample
        return self.task.prepare(s) if pf is None else pf.get((pos, idx, id(s)), s, inline=self.task.prepare)

    def _get_prefetcher(self):
        if self.cfg.data.prefetch <= 0:
            return None
        if getattr(self, "_prefetcher", None) is None:
            from mmgrpo.data.prefetch import Prefetcher

            task = copy.copy(self.task)
            task.processor = copy.deepcopy(self.task.processor)  # its own tokenizer: HF's are not thread-safe
            self._prefetcher = Prefetcher(task.prepare)
        return self._prefetcher

    def _prefetch_ahead(self) -> None:
        """Hint the samples of the next ``data.prefetch`` draws (on a copy of the stream), stopping before an epoch
        boundary that runs a data re-selection (it may change the data)."""
        pf = self._get_prefetcher()
        if pf is None:
            return
        st = copy.copy(self.stream)
        hook, st.on_epoch = st.on_epoch, None
        upcoming = []
        for _ in range(self.cfg.data.prefetch):
            if hook is not None and st.offset + self.prompts_per_step > st.n:
                break
            upcoming += [((pos, idx, id(self.samples[idx])), self.samples[idx]) for pos, idx, _ in self._draw(st)]
        pf.schedule(upcoming)

    def _close_prefetch(self) -> None:
        pf = getattr(self, "_prefetcher", None)
        if pf is not None:
            pf.close()
            self._prefetcher = None

    def _draw(self, stream=None) -> list[tuple[int, int, list[int] | None]]:
        """This process's share of the next global prompt batch (all processes advance the stream equally).

        Global row r = k * G + g (prompt k of the step, generation g); process i owns rows [i R/W, (i+1) R/W).
        When the prompts divide evenly, that is whole groups (``gens`` None); otherwise a group may be split and
        ``gens`` lists the generation indices sampled here (their seeds do not depend on the split)."""
        P, W = self.prompts_per_step, self.world
        drawn = (self.stream if stream is None else stream).take(P)
        if not self.split_groups:
            k = P // W
            return [(pos, idx, None) for pos, idx in drawn[self.rank * k:(self.rank + 1) * k]]
        G = self.cfg.rollout.num_generations
        lo, hi = self.rank * P * G // W, (self.rank + 1) * P * G // W
        out = []
        for k, (pos, idx) in enumerate(drawn):
            gens = [g for g in range(G) if lo <= k * G + g < hi]
            if gens:
                out.append((pos, idx, gens))
        return out

    # ----------------------------------------------------------------------------------------- rollout
    def _call_reward(self, fn: Callable, texts: list[str], samples: list, what: str) -> dict | None:
        """``fn(texts, samples)`` with retries / timeout (``reward.*``); None if it failed for good.

        A failed call never raises here: its rows are dropped (``reward.on_failure=drop``), or the failure is
        recorded and, once every process has finished the same collectives, the step stops the run
        (``on_failure=stop``: checkpoint first, see ``_check_stop``)."""
        rc = self.cfg.reward
        st = CallStats()
        try:
            return call_with_retries(fn, (texts, samples), rc.retries, rc.retry_backoff, rc.timeout, st, what)
        except RewardCallFailed as e:
            self.counters["reward_failed_calls"] += 1
            if rc.on_failure == "stop":
                self._request_stop(f"{e} (reward.on_failure=stop)")
            else:
                log.warning("%s; dropping its %d row(s) (reward.on_failure=drop)", e, len(texts))
            return None
        finally:
            self.counters["reward_retries"] += st.retries
            self.counters["reward_timeouts"] += st.timeouts

    def _score(self, texts: list[str], samples: list[dict]) -> dict[str, torch.Tensor]:
        """Rewards of the rows; ``out["_failed"]`` (bool) marks rows whose reward call failed (rewards NaN)."""
        n = len(texts)
        out = self._call_reward(self.reward_fn, texts, samples, "reward function")
        if out is None:
            return {"total": torch.full((n,), float("nan")), "parse_failed": torch.zeros(n, dtype=torch.bool),
                    "_failed": torch.ones(n, dtype=torch.bool)}
        out = {k: torch.as_tensor(v) for k, v in out.items()}
        if "total" not in out:
            out["total"] = sum(self.cfg.reward.weights[k] * out[k].float() for k in self.cfg.reward.weights)
        if "parse_failed" not in out:
            out["parse_failed"] = torch.zeros(n, dtype=torch.bool)
        for k, v in out.items():
            if v.shape[:1] != (n,):
                raise ValueError(f"reward function returned {k!r} with shape {tuple(v.shape)} for {n} completions")
        out["_failed"] = torch.zeros(n, dtype=torch.bool)
        return out

    def _accuracy(self, texts: list[str], samples: list[Any], scored: dict | None = None) -> torch.Tensor:
        """Accuracy per row (T-GRPO); NaN where the reward failed."""
        if scored is not None and self.acc_key in scored:
            return scored[self.acc_key].float()
        fn = self.accuracy_fn or self.reward_fn
        res = self._call_reward(fn, texts, samples, "accuracy reward")
        if res is None:
            return torch.full((len(texts),), float("nan"))
        return torch.as_tensor(res[self.acc_key] if self.acc_key in res else res["total"]).float()

    def _request_stop(self, reason: str) -> None:
        if self._stop_reason is None:
            self._stop_reason = reason
        log.error("stop requested: %s", reason)

    def rollout(self, step: int, preps: list[tuple[int, PreparedPrompt, list[int] | None]]) -> RolloutBatch:
        """Sample (plus the methods' extra group members), score, then the methods' reward hooks."""
        rows, info = self._sample_rows(step, preps)
        rb = self._score_rows(rows, info)
        ctx = {"step": step, "preps": preps, "reward_samples": [r["pp"].reward_sample for r in rows]}
        for m in self.methods:
            m.on_rewards(rb, ctx)
        return rb

    def _sample_rows(self, step: int, preps: list) -> tuple[list[dict], dict[str, float]]:
        """One dict per completion row (ids, mask, text, lp, offpolicy, truncated, pp, group); a group's rows are
        contiguous: its sampled members, then the methods' ``extra_rows``."""
        cfg = self.cfg
        G_on = cfg.rollout.num_generations
        for m in self.methods:
            G_on = m.generations_per_group(G_on)
        # one generate() row per owned (prompt, generation index); seed = f(seed, step, position, g), so a row's
        # sample does not depend on which process draws it
        gen_rows = [(pos, pp, g) for pos, pp, gens in preps for g in (range(G_on) if gens is None else gens)]
        seeds = [sample_seed(cfg.run.seed, step, pos, g) for pos, _, g in gen_rows]
        t0 = time.time()
        with self._generation_context():
            out = self.backend.generate(
                [pp.item for _, pp, _ in gen_rows], 1, self.sampling, seeds=seeds,
                raw_prompts=[{"text": pp.text, "images": pp.images, "clip": pp.clip,
                              "video": None if pp.clip is None else pp.clip.frames} for _, pp, _ in gen_rows])
        gen_time = time.time() - t0
        n_tok = int(out.completion_mask.sum())
        self.counters["generated_tokens"] += n_tok
        rows: list[dict] = []
        T = out.completion_ids.shape[1]
        by_pos: dict[int, list[int]] = {}
        for r, (pos, _, _) in enumerate(gen_rows):
            by_pos.setdefault(pos, []).append(r)
        for pos, pp, _ in preps:
            for r in by_pos[pos]:
                rows.append(dict(ids=out.completion_ids[r], mask=out.completion_mask[r], text=out.texts[r],
                                 lp=out.logprobs[r] if out.logprobs is not None else torch.zeros(T),
                                 offpolicy=False, truncated=bool(out.truncated[r]), pp=pp, group=pos))
            for m in self.methods:
                rows += [dict(x, pp=pp, group=pos) for x in m.extra_rows(pp)]
        return rows, {"gen_time": gen_time, "gen_tokens": float(n_tok)}

    def _score_rows(self, rows: list[dict], info: dict[str, float]) -> RolloutBatch:
        """Pad the rows into a batch and score them; ``valid`` marks rows whose rewards exist and are finite."""
        Tm = max(len(r["ids"]) for r in rows)
        pad1 = lambda x, v: torch.nn.functional.pad(x, (0, Tm - x.shape[0]), value=v)  # noqa: E731
        texts = [r["text"] for r in rows]
        scored = self._score(texts, [r["pp"].reward_sample for r in rows])
        parse_failed = scored.pop("parse_failed").bool()
        failed = scored.pop("_failed").bool()
        rewards = {k: v.float() for k, v in scored.items()}
        return RolloutBatch(items=[r["pp"].item for r in rows], samples=[r["pp"].sample for r in rows], texts=texts,
                            completion_ids=torch.stack([pad1(r["ids"], self.pad_id) for r in rows]),
                            completion_mask=torch.stack([pad1(r["mask"].long(), 0) for r in rows]),
                            group_ids=torch.tensor([r["group"] for r in rows], dtype=torch.long),
                            is_offpolicy=torch.tensor([r["offpolicy"] for r in rows]),
                            truncated=torch.tensor([r["truncated"] for r in rows]), parse_failed=parse_failed,
                            rewards=rewards, rollout_logp=torch.stack([pad1(r["lp"].float(), 0.0) for r in rows]),
                            info=dict(info), valid=self._valid_rows(rewards, failed, rows))

    def _valid_rows(self, rewards: dict[str, torch.Tensor], failed: torch.Tensor, rows: list[dict]) -> torch.Tensor:
        """A row takes part only if its reward call succeeded and its (weighted) rewards are finite."""
        cfg = self.cfg
        keys = ["total"] + [k for k in cfg.reward.weights if k in rewards]
        nonfinite = nonfinite_rows(rewards, len(rows), keys) & ~failed
        self.counters["reward_failed_rows"] += int(failed.sum())
        if nonfinite.any():
            self.counters["reward_nonfinite_rows"] += int(nonfinite.sum())
            bad = nonfinite.nonzero().flatten().tolist()
            which = sorted({k for k in keys if not torch.isfinite(rewards[k][nonfinite]).all()})
            ids = [sample_id(rows[i]["pp"].sample) for i in bad[:10]]
            msg = f"non-finite reward(s) {which} for {len(bad)} row(s) of sample(s) {ids}"
            if cfg.reward.on_nonfinite == "error":
                self._request_stop(msg + " (reward.on_nonfinite=error)")
            else:
                log.warning("%s: dropped from their groups (reward.on_nonfinite=drop)", msg)
        return ~failed & ~nonfinite

    def advantages(self, rb: RolloutBatch) -> None:
        """Group advantages of the reward the methods shape; sets rb.advantages, reward_used, zero_std.

        A method may compute them on this process's whole groups (``local_advantages``); otherwise statistics
        run over the GLOBAL batch (a group may be split across processes; "batch" scale is the std of every
        process's rewards): gather, compute, keep this process's rows -- the numbers of a 1-process run.
        Collective: every process calls advantages() once per sampling round."""
        a = self.cfg.algo
        used = rb.rewards["total"]
        for m in self.methods:
            used = m.shape_rewards(rb, used)
        valid = rb.valid if rb.valid is not None else torch.ones(rb.n, dtype=torch.bool)
        kw = dict(scale=a.adv_scale, eps=a.adv_eps, valid=valid)
        res = next((out for m in self.methods if (out := m.local_advantages(rb, used, kw)) is not None), None)
        gather = res is None and self.world > 1
        if res is not None:
            gid_all, valid_all, sl = rb.group_ids, valid, slice(0, rb.n)
        else:
            if gather:
                (used_all, gid_all, valid_all), sl = gather_groups([used.float(), rb.group_ids, valid])
            else:
                used_all, gid_all, valid_all, sl = used, rb.group_ids, valid, slice(0, rb.n)
            kw["valid"] = valid_all
            adv_fn = next((f for m in self.methods if (f := m.advantage_fn()) is not None), group_advantages)
            if gid_all.numel():
                res = adv_fn(used_all, gid_all, **kw)
            else:
                res = AdvantageOutput(torch.zeros(0), torch.zeros(0, dtype=torch.bool), 0.0, torch.zeros(0),
                                      torch.zeros(0), 0)
        adv_all = self._zero_degenerate(rb, res.advantages, gid_all, valid_all, count=not gather or self.rank == 0)
        rb.advantages, rb.reward_used, rb.zero_std = adv_all[sl], used, res.zero_std_mask[sl]
        rb.info["zero_std_frac"] = res.zero_std_fraction
        for m in self.methods:
            m.after_advantages(rb, valid)

    def _zero_degenerate(self, rb: RolloutBatch, adv: torch.Tensor, gid_all: torch.Tensor, valid_all: torch.Tensor,
                         count: bool) -> torch.Tensor:
        """Groups left with fewer than 2 valid members (rewards dropped) have no baseline: advantage exactly 0 (the
        core already gives 0 to 1-member groups; made explicit here), counted once (``count``: on the main process
        when statistics are global)."""
        gids, inv = torch.unique(gid_all, return_inverse=True)
        n_valid = torch.zeros(len(gids), dtype=torch.long).scatter_add_(0, inv, valid_all.long())
        degenerate = n_valid < 2
        adv_all = torch.where(degenerate[inv] | ~valid_all, torch.zeros_like(adv.float()), adv.float())
        n_deg = int(degenerate.sum()) if count else 0
        self.counters["degenerate_groups"] += n_deg
        # groups with a baseline (>= 2 valid members): a step with none anywhere trains nothing (see optimize)
        rb.info["valid_groups"] = float(int((~degenerate).sum()) if count else 0)
        rb.info["degenerate_groups"] = rb.info.get("degenerate_groups", 0.0) + float(n_deg)
        return adv_all

    def collect(self, step: int) -> RolloutBatch:
        """Rollouts for one step: a sampling round, then up to ``extra_rounds`` more while the methods' filters
        (``filter_batch``) leave fewer than the step's groups; ``finish_batch`` trims the result."""
        want = self.prompts_per_step // self.world  # whole groups per process (refills never split groups)
        batches, n_groups, zero_frac_first = [], 0, None
        valid_groups = 0.0  # summed over rounds, also from empty batches (statistics may be global)
        extra = sum(m.extra_rounds() for m in self.methods)
        for rnd in range(1 + extra):
            preps = self._prepare(self._draw())
            for m in self.methods:
                preps = m.prepare_prompts(step, preps)
            self._prefetch_ahead()  # the next draws' media decode while this step generates and trains
            # a group is counted by the process holding its generation 0 (split groups are counted once)
            first_here = torch.tensor([pos for pos, _, gens in preps if gens is None or 0 in gens], dtype=torch.long)
            rb = self.rollout(step, preps) if preps else self._empty_batch()
            self.advantages(rb)  # on every process, even without prompts: it may gather across processes
            valid_groups += rb.info.get("valid_groups", 0.0)
            if preps:
                if zero_frac_first is None:
                    zero_frac_first = rb.info["zero_std_frac"]
                if not bool(rb.valid.all()):  # failed / non-finite rewards leave the batch (not the loss)
                    rb = rb.select(rb.valid.nonzero().flatten())
                for m in self.methods:
                    rb = m.filter_batch(rb)
                batches.append(rb)
                n_groups += int(torch.isin(torch.unique(rb.group_ids), first_here).sum())
            # every process runs the same number of rounds (the stream stays in sync): decide on global counts
            done = global_sum(float(n_groups >= want)) >= self.world
            if not extra or done:
                break
        pool = [b for b in batches if b.n > 0]
        rb = cat_batches(pool, self.pad_id) if pool else self._empty_batch()
        for m in self.methods:
            rb, n_groups = m.finish_batch(rb, n_groups, want)
        rb.info["zero_std_frac"] = zero_frac_first if zero_frac_first is not None else 0.0
        rb.info["degenerate_groups"] = sum(b.info.get("degenerate_groups", 0.0) for b in batches)
        rb.info["groups"] = float(n_groups)
        rb.info["valid_groups"] = valid_groups
        rb.info["rounds"] = float(rnd + 1)
        return rb

    def _empty_batch(self) -> RolloutBatch:
        z = torch.zeros(0, 1)
        no = torch.zeros(0, dtype=torch.bool)
        return RolloutBatch(items=[], samples=[], texts=[], completion_ids=z.long(), completion_mask=z.long(),
                            group_ids=torch.zeros(0, dtype=torch.long), is_offpolicy=no, truncated=no.clone(),
                            parse_failed=no.clone(), rewards={"total": torch.zeros(0)}, rollout_logp=z,
                            advantages=torch.zeros(0), reward_used=torch.zeros(0), zero_std=no.clone(),
                            valid=no.clone())

    # ----------------------------------------------------------------------------------------- log-probs
    def _mb_inputs(self, rb: RolloutBatch, idx: torch.Tensor):
        T = max(1, int(rb.completion_mask[idx].sum(1).max()))
        batch = batch_to(collate_prompts([rb.items[i] for i in idx.tolist()], self.pad_id), self.device)
        ids = rb.completion_ids[idx, :T].to(self.device)
        mask = rb.completion_mask[idx, :T].to(self.device)
        return batch, ids, mask, T

    def _logp(self, model, rb, idx, return_logits=False):
        """Log-probs of the micro-batch ``idx``; old, reference and current policy all go through here."""
        if self.logprob_impl == "prefix_group":
            from mmgrpo.models.prefix_group import grouped_rows_token_logprobs

            T = max(1, int(rb.completion_mask[idx].sum(1).max()))
            with self.accelerator.autocast():
                return grouped_rows_token_logprobs(
                    model, [rb.items[i] for i in idx.tolist()], rb.completion_ids[idx, :T],
                    rb.completion_mask[idx, :T], self.pad_id, self.sampling.temperature,
                    self.policy.suppress_token_ids, return_logits=return_logits, device=self.device,
                    chunk_size=self.cfg.algo.logprob_chunk_size)
        batch, ids, mask, T = self._mb_inputs(rb, idx)
        with self.accelerator.autocast():
            return compute_token_logprobs(model, batch, ids, mask, self.sampling.temperature,
                                          self.policy.suppress_token_ids, return_logits=return_logits,
                                          chunk_size=self.cfg.algo.logprob_chunk_size)

    def _mb_plan(self, rb: RolloutBatch, mbs: list[torch.Tensor]) -> list[tuple[RolloutBatch, torch.Tensor, float]]:
        """(batch, rows, weight) per forward.  With a prepared model every process must run the same number of
        forwards (DDP buffer broadcasts, FSDP all-gathers) and backwards (one synchronising backward per update):
        processes with fewer micro-batches repeat one with weight 0 (its loss is multiplied by 0)."""
        plan = [(rb, idx, 1.0) for idx in mbs]
        if self.grad_sync != "accelerate" or self.world == 1:
            return plan
        n_max = int(_global_max(len(plan)))
        if len(plan) < n_max:
            if plan:
                pad = plan[-1][:2]
            elif self._pad_rows is not None:
                pad = self._pad_rows
            else:
                raise RuntimeError(f"process {self.rank} has no rows this step (skipped media / failed rewards) and "
                                   "no earlier row to keep the collectives of the prepared model in step; "
                                   "use data.on_missing_media=error or more prompts per process")
            plan += [(pad[0], pad[1], 0.0)] * (n_max - len(plan))
        if rb.n:
            self._pad_rows = (rb, mbs[0][:1])
        return plan

    @torch.no_grad()
    def precompute(self, rb: RolloutBatch, mbs: list[torch.Tensor]) -> None:
        """Old log-probs (several iterations, or a method needs them), reference log-probs (KL) and the methods'
        per-token tensors, on the training micro-batches."""
        cfg = self.cfg
        N, T = rb.completion_ids.shape
        need_old = cfg.algo.num_iterations > 1 or any(m.needs_old_logp for m in self.methods)
        logits_to = [m for m in self.methods if m.needs_logits]
        if need_old:
            rb.old_logp = torch.zeros(N, T)
        for m in self.methods:
            m.before_precompute(rb)
        if cfg.algo.kl_coef > 0:
            rb.ref_logp = torch.zeros(N, T)
        if need_old or cfg.algo.kl_coef > 0:
            was = self.model.training
            self.model.eval()
            try:
                for b, idx, w in self._mb_plan(rb, mbs):
                    self._precompute_mb(rb, b, idx, w, need_old, logits_to)
            finally:
                self.model.train(was)
        for m in self.methods:
            m.after_precompute(rb)

    def _precompute_mb(self, rb: RolloutBatch, b: RolloutBatch, idx: torch.Tensor, w: float, need_old: bool,
                       logits_to: list) -> None:
        """One forward of the plan; weight 0 = a padding forward (collectives only), its result unused."""
        if need_old:
            res = self._logp(self.model, b, idx, return_logits=bool(logits_to))
            lp, logits = res if logits_to else (res, None)
            if w:
                rb.old_logp[idx, :lp.shape[1]] = lp.float().cpu()
                for m in logits_to:  # full logits, or hidden states + head (algo.logprob_chunk_size)
                    m.on_logits(rb, idx, logits, lp)
            del logits
        if self.cfg.algo.kl_coef > 0:
            with self.policy.reference(self.model) as ref:
                lp = self._logp(ref, b, idx)
            if w:
                rb.ref_logp[idx, :lp.shape[1]] = lp.float().cpu()

    # ----------------------------------------------------------------------------------------- update
    def optimize(self, rb: RolloutBatch, mbs: list[torch.Tensor]) -> dict[str, float]:
        """``num_iterations`` updates.  Losses use GLOBAL token / sequence / row counts and gradients are SUMMED
        over processes, so an update does not depend on the number of processes or micro-batches.

        Gradient exchange (``run.grad_sync``):

        * ``manual`` (default without FSDP / DeepSpeed): plain module, one ``all_reduce(SUM)`` per parameter
          after the micro-batches.  Kept for DDP-style replicated training (LoRA, small full fine-tunes) because
          the shared-prefix log-prob forward calls the module twice per backward and micro-batch counts differ
          across processes after dynamic filtering / dropped rows -- both break DDP's one-forward-one-backward
          reducer, while a hand-made sum has neither constraint and costs the same communication;
        * ``accelerate`` (FSDP / DeepSpeed; optional for DDP): ``accelerator.prepare``d module, forwards through
          it, ``no_sync`` for every micro-batch but the last, ``accelerator.backward``,
          ``accelerator.clip_grad_norm_``.  Those engines AVERAGE gradients, so the loss is scaled by the number
          of processes to keep the sum semantics; micro-batch counts are padded (``_mb_plan``).
        """
        cfg, a = self.cfg, self.cfg.algo
        prepared = self.grad_sync == "accelerate"
        loss_mask = rb.completion_mask.clone()
        for meth in self.methods:
            loss_mask = meth.loss_mask(rb, loss_mask)
        n_tok = global_sum(float(loss_mask.sum()))
        n_seq = global_sum(float((loss_mask.sum(1) > 0).sum()))
        n_rows = global_sum(float(rb.n))
        n_mb = global_sum(float(len(mbs)))
        totals = {"tokens": n_tok, "sequences": n_seq, "rows": n_rows, "micro_batches": n_mb}
        loss_kw = dict(clip_low=a.clip_low, clip_high=a.clip_high, dual_clip=a.dual_clip, ratio_level=a.ratio_level,
                       loss_type=a.loss_type, agg=a.agg, kl_coef=a.kl_coef, kl_estimator=a.kl_estimator,
                       max_len=cfg.rollout.max_new_tokens, num_tokens=n_tok, num_sequences=n_seq, reg_eps=a.adv_eps)
        for meth in self.methods:
            loss_kw = meth.loss_kwargs(loss_kw)
        acc: dict[str, float] = {}
        wsum = 0.0
        grad_norm = 0.0
        skipped = 0
        # no group with a baseline on any process (every sample's media missing, every reward call failed or
        # non-finite): nothing to learn from -> a skipped step, like a non-finite one (feeds max_consecutive_skips)
        if global_sum(rb.info.get("valid_groups", 0.0)) == 0:
            self._record_skip("no valid group (missing media / failed or non-finite rewards)", a.num_iterations)
            return {"grad_norm": float("nan"), "lr": self.scheduler.get_last_lr()[0],
                    "skipped_steps": float(a.num_iterations)}
        # a NaN/inf advantage would poison every update of this step: skip them all (decided on every process)
        adv_bad = rb.advantages is not None and rb.n > 0 and not bool(torch.isfinite(rb.advantages).all())
        if global_sum(float(adv_bad)) > 0:
            self._record_skip("non-finite advantages", a.num_iterations)
            return {"grad_norm": float("nan"), "lr": self.scheduler.get_last_lr()[0],
                    "skipped_steps": float(a.num_iterations)}
        plan = self._mb_plan(rb, mbs)
        max_norm = cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else float("inf")
        self.model.train()
        for it in range(a.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            loss_bad = False
            for j, (b, idx, wgt) in enumerate(plan):
                last = j == len(plan) - 1
                with self._sync_context(last):
                    lp = self._logp(self.model, b, idx).float()
                    Tm = lp.shape[1]
                    lmask = loss_mask if b is rb else b.completion_mask
                    m = lmask[idx, :Tm].to(lp.device)
                    old = lp.detach() if b.old_logp is None or not wgt else b.old_logp[idx, :Tm].to(lp.device)
                    pick = (lambda t: None if (t is None or not wgt) else t[idx, :Tm].to(lp.device))
                    out = policy_loss(
                        lp, old, b.advantages[idx].to(lp.device), m, token_weights=pick(b.token_weights),
                        ref_logp=pick(b.ref_logp), group_ids=b.group_ids[idx].to(lp.device), **loss_kw)
                    loss = self._loss_share(out.loss, len(idx), totals)
                    lval = float(loss.detach()) * wgt
                    loss_bad |= not math.isfinite(lval)
                    # backward even for a non-finite loss: every process must run the same collectives; the
                    # update is skipped below on the (global) non-finite flag
                    if prepared:
                        self.accelerator.backward(loss * (self.world * wgt))  # engines average: x world = sum
                    else:
                        loss.backward()
                if not wgt:
                    continue
                w = float(m.sum())
                wsum += w
                for k, v in out.metrics.items():
                    if isinstance(v, float) and math.isfinite(v):
                        acc[k] = acc.get(k, 0.0) + v * w
                if math.isfinite(lval):
                    acc["loss"] = acc.get("loss", 0.0) + lval * (1.0 / a.num_iterations)
            if prepared:
                grad_norm = self._prepared_grad_norm(max_norm)
            else:
                self._allreduce_grads()
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
            # the norm is the same on every process (gradients were summed); the loss flag is local -> reduce it
            if global_sum(float(loss_bad or not math.isfinite(grad_norm))) > 0:
                self.optimizer.zero_grad(set_to_none=True)
                self._record_skip("non-finite loss" if loss_bad else "non-finite gradients")
                skipped += 1
                continue
            self.consecutive_skips = 0
            self.optimizer.step()
            self.scheduler.step()
            for m in self.methods:
                m.after_update()
        metrics = {k: (v if k == "loss" else v / max(wsum, 1.0)) for k, v in acc.items() if k != "num_tokens"}
        metrics["grad_norm"] = grad_norm
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        metrics["skipped_steps"] = float(skipped)
        return metrics

    def _loss_share(self, loss: torch.Tensor, rows: int, totals: dict) -> torch.Tensor:
        """One micro-batch's loss as its share of the step's: a method's ``loss_share``, else (bnpo: a local
        mean per micro-batch) an average over all micro-batches; token / sequence means use global counts
        already."""
        share = next((f for meth in self.methods if (f := meth.loss_share(rows, totals)) is not None), None)
        if share is not None:
            return loss * share
        if self.cfg.algo.agg == "bnpo":
            return loss / max(totals["micro_batches"], 1.0)
        return loss

    def _sync_context(self, last: bool):
        """Gradient synchronisation only on the last micro-batch of an update (prepared model)."""
        if self.grad_sync != "accelerate":
            return contextlib.nullcontext()
        if self.dist_kind == "DEEPSPEED":  # the engine reads accelerate's flag in accelerator.backward
            self.accelerator.gradient_state._set_sync_gradients(last)
            return contextlib.nullcontext()
        return contextlib.nullcontext() if last else self.accelerator.no_sync(self.model)

    def _prepared_grad_norm(self, max_norm: float) -> float:
        gn = self.accelerator.clip_grad_norm_(self.model.parameters(), max_norm)
        if gn is None:  # DeepSpeed clips inside its engine (its config's gradient_clipping) and reports the norm
            eng = getattr(self.accelerator, "deepspeed_engine_wrapped", None)
            gn = eng.get_global_grad_norm() if eng is not None else float("nan")
            return float("nan") if gn is None else float(gn)
        if hasattr(gn, "full_tensor"):  # FSDP2: a replicated DTensor
            gn = gn.full_tensor()
        return float(gn)

    def _record_skip(self, why: str, n: int = 1) -> None:
        self.counters["skipped_steps"] += n
        self.consecutive_skips += n
        self._last_skip_cause = why
        log.warning("step %d: %s -> optimizer step skipped (%d skipped in a row, %d in total)",
                    self.step + 1, why, self.consecutive_skips, self.counters["skipped_steps"])

    def _applied_updates(self) -> int:
        """Optimizer updates applied so far in the run (every step attempts num_iterations; skips are counted)."""
        return self.step * self.cfg.algo.num_iterations - int(self.counters["skipped_steps"])

    def _check_trained(self) -> None:
        """A run none of whose optimizer steps was applied fails instead of saving "trained" weights."""
        if self.step == 0 or self._applied_updates() > 0:
            return
        self.logger.flush()
        raise NothingTrained(
            f"nothing was trained: all {self.counters['skipped_steps']} optimizer step(s) of the run's {self.step} "
            f"step(s) were skipped (last cause: {getattr(self, '_last_skip_cause', 'unknown')}; "
            f"data/skipped_missing_media={self.counters['skipped_missing_media']}, "
            f"faults/reward_failed_calls={self.counters['reward_failed_calls']}, "
            f"faults/reward_nonfinite_rows={self.counters['reward_nonfinite_rows']}); no final checkpoint written. "
            "Check data.media_root / data.train_file, the reward function or server, and the learning rate")

    def _broadcast_params(self) -> None:
        """Start every process from rank 0's trainable weights (belt and braces on top of the shared seed)."""
        if self.world == 1:
            return
        import torch.distributed as dist

        with torch.no_grad():
            for p in self.params:
                dist.broadcast(p.data, src=0)

    def _allreduce_grads(self) -> None:
        """Sum gradients over processes (losses are normalised by global counts, see ``optimize``)."""
        if self.world == 1:
            return
        import torch.distributed as dist

        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)

    @contextlib.contextmanager
    def _generation_context(self):
        """Sampling runs the plain module token by token; with sharded parameters it must not issue collectives
        per token (processes generate different lengths).  FSDP2: every FSDP unit is all-gathered once and kept
        unsharded until sampling ends.  DeepSpeed ZeRO-3: parameters gathered (``GatheredParameters``).  No-op
        for replicated weights."""
        if not self.sharded:
            yield
            return
        if self.dist_kind == "FSDP":
            from torch.distributed.fsdp import FSDPModule

            mods = [m for m in self.model.modules() if isinstance(m, FSDPModule)]
            # generate() may run the vision tower before the root module's forward; FSDP2 decides which unit is
            # the root on the first forward it sees, so settle that here (no public API for it)
            root = mods[0]._get_fsdp_state() if mods else None
            if root is not None and getattr(root, "_is_root", True) is None:
                root._lazy_init()
            for m in mods:
                m.set_reshard_after_forward(False, recurse=False)
            for m in mods:
                m.unshard()
            try:
                yield
            finally:
                for m in mods:
                    m.reshard()
                    m.set_reshard_after_forward(True, recurse=False)
            return
        stage = getattr(getattr(self.accelerator.state, "deepspeed_plugin", None), "zero_stage", 0)
        if stage == 3:  # pragma: no cover - needs deepspeed + GPUs
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(self.model.parameters())):
                yield
        else:
            yield

    # ----------------------------------------------------------------------------------------- logging
    def step_metrics(self, rb: RolloutBatch) -> dict[str, float]:
        onp = ~rb.is_offpolicy
        m: dict[str, float] = {}
        for k, v in rb.rewards.items():
            v = v[onp].float()
            v = v[torch.isfinite(v)]  # an unweighted diagnostic reward may be NaN on a kept row
            if v.numel():
                m[f"reward/{k}/mean"] = float(v.mean())
                m[f"reward/{k}/std"] = float(v.std()) if v.numel() > 1 else 0.0
        lens = rb.completion_mask[onp].sum(1).float()
        if lens.numel():
            m["completions/mean_length"] = float(lens.mean())
            m["completions/max_length"] = float(lens.max())
            m["completions/clipped_ratio"] = float(rb.truncated[onp].float().mean())
            m["completions/parse_failures"] = float(rb.parse_failed[onp].sum())
            m["completions/parse_failure_rate"] = float(rb.parse_failed[onp].float().mean())
        if rb.advantages is not None and rb.n:
            m["advantages/abs_mean"] = float(rb.advantages[onp].abs().mean()) if onp.any() else 0.0
        m["frac_reward_zero_std"] = rb.info.get("zero_std_frac", 0.0)
        gt = rb.info.get("gen_time", 0.0)
        m["perf/tokens_per_s"] = rb.info.get("gen_tokens", 0.0) / gt if gt > 0 else 0.0
        m["data/groups"] = rb.info.get("groups", 0.0)
        m["data/valid_groups"] = rb.info.get("valid_groups", 0.0)  # groups with >= 2 valid rows (a baseline)
        m["data/sampling_rounds"] = rb.info.get("rounds", 1.0)
        m["data/skipped_missing_media"] = float(self.counters["skipped_missing_media"])
        m["data/skipped_bad_samples"] = float(self.counters["skipped_bad_samples"])
        m["data/filtered_groups"] = float(self.counters["filtered_groups"])
        for k in ("reward_nonfinite_rows", "reward_failed_rows", "reward_failed_calls", "reward_retries",
                  "reward_timeouts", "degenerate_groups"):
            m[f"faults/{k}"] = float(self.counters[k])
        m["faults/degenerate_groups_step"] = rb.info.get("degenerate_groups", 0.0)
        m["data/epoch"] = float(self.stream.epoch)
        m["perf/generated_tokens"] = float(self.counters["generated_tokens"])  # cumulative, this process
        m["perf/prefix_group"] = float(self.logprob_impl == "prefix_group")
        if rb.old_logp is not None and onp.any():  # engine vs trainer log-probs (vLLM parity diagnostic)
            mk = rb.completion_mask[onp].bool()
            Tm = min(rb.old_logp.shape[1], rb.rollout_logp.shape[1])
            d = (rb.old_logp[onp][:, :Tm] - rb.rollout_logp[onp][:, :Tm]).abs()[mk[:, :Tm]]
            m["rollout/logprob_max_abs_diff"] = float(d.max()) if d.numel() else 0.0
        for meth in self.methods:
            meth.metrics(rb, m)
        return m

    def _reduce_metrics(self, m: dict[str, float]) -> dict[str, float]:
        """Average metrics over processes (max for ``*max*`` keys, sum for counters of this step).

        Cumulative counters (``data/skipped_missing_media``, ``data/filtered_groups``) are per process and summed;
        per-process means are averaged with equal weight (processes hold equally many prompts)."""
        if self.world == 1:
            return m
        from accelerate.utils import gather_object

        allm = gather_object([m])
        out: dict[str, float] = {}
        for k in sorted({k for d in allm for k in d}):
            vals = [d[k] for d in allm if k in d]
            if "max" in k:
                out[k] = max(vals)
            elif "min" in k:
                out[k] = min(vals)
            elif k in ("faults/skipped_steps", "faults/consecutive_skips", "train/skipped_steps"):
                out[k] = vals[0]  # decided globally: the same on every process
            elif k in ("data/skipped_missing_media", "data/skipped_bad_samples", "data/filtered_groups", "data/groups",
                       "data/valid_groups",
                       "completions/parse_failures") or k.startswith(("perf/tokens", "faults/")):
                out[k] = float(sum(vals))
            else:
                out[k] = sum(vals) / len(vals)
        return out

    def _log_completions(self, rb: RolloutBatch, step: int) -> None:
        rows = []
        for i in range(min(rb.n, self.cfg.run.num_completions_to_log)):
            rows.append({"step": step, "sample_id": sample_id(rb.samples[i]), "group": int(rb.group_ids[i]),
                         "completion": rb.texts[i], "offpolicy": bool(rb.is_offpolicy[i]),
                         "truncated": bool(rb.truncated[i]), "parse_failed": bool(rb.parse_failed[i]),
                         "advantage": float(rb.advantages[i]) if rb.advantages is not None else None,
                         **{f"reward/{k}": float(v[i]) for k, v in rb.rewards.items()}})
        self.logger.log_jsonl("completions.jsonl", rows)

    # ----------------------------------------------------------------------------------------- state
    def state(self, full_state_dict: dict | None = None) -> dict:
        if self.grad_sync == "accelerate":  # optimizer / scheduler / sharded weights live in "accelerate/"
            names = {n for n, p in self.unwrapped.named_parameters() if p.requires_grad}
            pol = ({k: v.detach().cpu() for k, v in full_state_dict.items() if k in names}
                   if full_state_dict is not None else self.policy.trainable_state_dict())
            opt = sch = {}
        else:
            pol, opt, sch = (self.policy.trainable_state_dict(), self.optimizer.state_dict(),
                             self.scheduler.state_dict())
        return {
            "policy": pol,
            "optimizer": opt,
            "scheduler": sch,
            "trainer": {
                "step": self.step, "stream": self.stream.state_dict(), "counters": dict(self.counters),
                "consecutive_skips": self.consecutive_skips,
                "rng": capture_rng_state(), "config": config_to_dict(self.cfg), "world_size": self.world,
                "reference": {"kind": "lora_disabled" if self.policy.lora else
                              ("frozen_initial_copy" if self.policy.ref_model is not None else "none"),
                              "model_path": self.cfg.model.path, "kl_coef": self.cfg.algo.kl_coef},
                "selection": getattr(self, "selected_indices", None),
                "budget": self.budget.state_dict(),
                "methods": {m.name: sd for m in self.methods if (sd := m.state_dict()) is not None},
            },
        }

    def save(self) -> Path | None:
        path = None
        staging = None
        full_sd = None
        if self.grad_sync == "accelerate":
            # model / optimizer / scheduler / RNG of every process (sharded under FSDP / DeepSpeed) through
            # accelerate, written by all processes into a staging dir that becomes part of the checkpoint
            staging = self.ckpt.root / f".staging-step-{self.step:08d}"
            if self.accelerator.is_main_process:
                shutil.rmtree(staging, ignore_errors=True)
                self.ckpt.root.mkdir(parents=True, exist_ok=True)
            self.accelerator.wait_for_everyone()
            self.accelerator.save_state(str(staging))
            if self.sharded:  # a portable copy of the trained weights (collective: gathers the shards)
                full_sd = self.accelerator.get_state_dict(self.model)
            self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            extra = {}
            if staging is not None:
                extra["accelerate"] = lambda p: os.rename(staging, p)
            if self.policy.lora and not self.sharded:
                extra["adapter"] = lambda p: self.unwrapped.save_pretrained(str(p))
            metric = None
            if self.cfg.run.best_metric:
                metric = self._last_metrics.get(self.cfg.run.best_metric)
                if metric is None:
                    log.warning("run.best_metric=%r is not among this step's metrics (e.g. %s); checkpoint %d "
                                "has no metric", self.cfg.run.best_metric, sorted(self._last_metrics)[:5], self.step)
            path = self.ckpt.save(self.step, self.state(full_sd), metric=metric, extra_files=extra)
            log.info("saved checkpoint %s", path)
        self.accelerator.wait_for_everyone()
        self._last_save = (self.step, path)  # a stop right after this save does not write it again
        return path

    def resume(self) -> bool:
        path = self.ckpt.resolve(self.cfg.run.resume_from)
        if path is None:
            return False
        st = self.ckpt.load(path)
        tr = st["trainer"]
        ref = tr["reference"]
        if ref["kind"] == "frozen_initial_copy" and ref["model_path"] != self.cfg.model.path:
            raise ValueError(f"resume: the reference was {ref['model_path']!r}, now model.path={self.cfg.model.path!r}")
        if self.grad_sync == "accelerate":
            if not (path / "accelerate").is_dir():
                raise ValueError(f"resume: {path} was written with run.grad_sync=manual; it has no accelerate state "
                                 "for the prepared model (resume with run.grad_sync=manual, or start anew)")
            refuse_unsafe_pickles(path / "accelerate")  # torch.distributed.checkpoint unpickles .metadata as is
            self.accelerator.load_state(str(path / "accelerate"))
        else:
            if not st["optimizer"]:
                raise ValueError(f"resume: {path} was written with run.grad_sync=accelerate; resume with it")
            self.policy.load_trainable_state_dict(st["policy"])
            self.optimizer.load_state_dict(st["optimizer"])
            self.scheduler.load_state_dict(st["scheduler"])
        if tr.get("selection") is not None:
            self.use_samples(tr["selection"])
        self._make_stream()
        self.stream.load_state_dict(tr["stream"])
        self.step = int(tr["step"])
        self.budget.load_state_dict(tr.get("budget"))
        self.counters.update(tr["counters"])
        self.consecutive_skips = int(tr.get("consecutive_skips", 0))
        for m in self.methods:
            if m.name in tr.get("methods", {}):
                m.load_state_dict(tr["methods"][m.name])
        if tr.get("world_size", 1) == self.world:
            restore_rng_state(tr["rng"])
        log.info("resumed from %s at step %d", path, self.step)
        self._last_save = (self.step, str(path))  # an interrupt before the next step need not rewrite it
        return True

    def _make_stream(self) -> None:
        hooks = [m.on_epoch for m in self.methods if m.uses_epoch_hook]
        self.stream = PromptStream(len(self.samples), self.cfg.run.seed, self.cfg.data.shuffle,
                                   on_epoch=_chain_epoch_hooks(hooks) if hooks else None)

    # ----------------------------------------------------------------------------------------- selection
    @torch.no_grad()
    def score_samples(self, samples: Sequence[Any], K: int, key: str = "total", round: int = 0) -> torch.Tensor:
        """(S, K) rewards of K sampled completions per sample (this process's share, gathered); missing media
        gives a row of NaN."""
        from dataclasses import replace

        from accelerate.utils import gather_object

        idx = list(range(self.rank, len(samples), self.world))
        res = []
        for start in range(0, len(idx), self.cfg.run.prompts_per_device):
            chunk = [(i, samples[i]) for i in idx[start:start + self.cfg.run.prompts_per_device]]
            preps, ok = [], []
            for i, s in chunk:
                try:
                    preps.append((i, self.task.prepare(s)))
                except (MissingMediaError, BadSampleError) as e:
                    policy = (self.cfg.data.on_missing_media if isinstance(e, MissingMediaError)
                              else self.cfg.data.on_bad_sample)
                    if policy == "error":
                        raise
                    log.warning("selection: skipping %s: %s", sample_id(s), e)
                    res.append((i, [float("nan")] * K))
            if not preps:
                continue
            with self._generation_context():
                sampling = replace(self.sampling, greedy=True) if self.cfg.selection.greedy else self.sampling
                out = self.backend.generate([pp.item for _, pp in preps], K, sampling,
                                            seeds=make_seeds(self.cfg.run.seed, -1 - round, [i for i, _ in preps], K),
                                            raw_prompts=[{"text": pp.text, "images": pp.images, "clip": pp.clip}
                                                         for _, pp in preps])
            rs = [pp.reward_sample for _, pp in preps for _ in range(K)]
            sc = self._score(out.texts, rs)
            r = sc[key] if key in sc else self._accuracy(out.texts, rs)
            r = r.float().view(len(preps), K)
            res.extend((i, r[j].tolist()) for j, (i, _) in enumerate(preps))
        allres = gather_object(res) if self.world > 1 else res
        mat = torch.full((len(samples), K), float("nan"))
        for i, row in allres:
            mat[i] = torch.tensor(row)
        return mat

    def use_samples(self, keep: list[int]) -> None:
        """Train on ``all_samples[i] for i in keep`` from now on (data selection; checkpointed)."""
        if not keep:
            raise ValueError("data selection kept no samples; relax selection.criterion / thresholds")
        self.selected_indices = list(keep)
        self.samples = [self.all_samples[i] for i in keep]

    # ----------------------------------------------------------------------------------------- loop
    def train_step(self) -> dict[str, float]:
        t0 = time.time()
        self.budget.start()  # only the step counts (not checkpoint writes between steps)
        step = self.step
        # what a stop inside this step rolls back to, so its checkpoint resumes exactly at this step
        self._step_snapshot = {"stream": self.stream.state_dict(), "rng": capture_rng_state(),
                               "selection": getattr(self, "selected_indices", None), "counters": dict(self.counters)}
        rb = self.collect(step)
        self._check_stop()
        mbs = micro_batches(rb.group_ids, self.cfg.run.micro_batch_size) if rb.n else []
        self.precompute(rb, mbs)
        opt_metrics = self.optimize(rb, mbs)
        self.backend.sync_weights(self.model)  # no-op for the HF backend (it samples from the trained module)
        self.step += 1
        m = self.step_metrics(rb)
        m.update({f"train/{k}": v for k, v in opt_metrics.items()})
        m["faults/skipped_steps"] = float(self.counters["skipped_steps"])
        m["faults/consecutive_skips"] = float(self.consecutive_skips)
        m["perf/step_time"] = time.time() - t0
        m["perf/data_wait"], self._data_wait = getattr(self, "_data_wait", 0.0), 0.0  # s in _prepare this step
        m["perf/train_seconds"] = self.budget.lap()  # budget clock, summed over resumes
        m = self._reduce_metrics(m)
        self._last_metrics = m
        if self.step % self.cfg.run.log_every == 0 or self.step == self.cfg.run.max_steps:
            self.logger.log(m, self.step)
            if rb.n:
                self._log_completions(rb, self.step)
        self.last_batch = rb
        K = self.cfg.run.max_consecutive_skips
        if K and self.consecutive_skips >= K:
            self.logger.log(m, self.step)
            never = " (no optimizer step of this run was applied)" if self._applied_updates() <= 0 else ""
            self._stop(f"{self.consecutive_skips} consecutive optimizer steps were skipped{never} (last cause: "
                       f"{getattr(self, '_last_skip_cause', 'unknown')}; run.max_consecutive_skips={K}); check the "
                       f"data and media, the rewards, the learning rate and mixed precision before resuming")
        return m

    def _check_stop(self) -> None:
        """After collect (the same collectives ran everywhere): stop on every process if any process asked to, or
        a SIGTERM / SIGINT reached one (the step is abandoned: a resume redraws its prompts)."""
        stop = global_sum(float(self._stop_reason is not None)) > 0
        signalled = not stop and self._signals is not None and self._signals.agreed(_global_max)
        if not (stop or signalled):
            return
        reason = self._stop_reason or "another process requested a stop (see its log)"
        snap = self._step_snapshot  # the step did not happen: its prompts are drawn again after a resume
        if snap["selection"] is not None:  # a re-selection inside this step is redone too
            self.use_samples(snap["selection"])
            self.stream.n = len(self.samples)
        self.stream.load_state_dict(snap["stream"])
        restore_rng_state(snap["rng"])
        if signalled:  # nothing of this step is kept, not even its counts (the resumed run counts them)
            self.counters.update(snap["counters"])
            self._interrupt(f"step {self.step} (its rollouts were discarded)")
        self._stop(reason)

    def _interrupt(self, where: str) -> None:
        """SIGTERM / SIGINT: checkpoint the current state (unless this step's is already written) and raise
        :class:`TrainingInterrupted` (``mmgrpo train`` exits with code 6)."""
        last = getattr(self, "_last_save", None)
        path = last[1] if last is not None and last[0] == self.step else self.save()
        self.logger.flush()
        if path is not None:
            log.info("interrupted by %s: checkpoint %s", self._signals.name, path)
        raise TrainingInterrupted(self._signals.name, where, str(path) if path else None)

    def _stop(self, reason: str) -> None:
        """Write a checkpoint of the current state and raise :class:`TrainingStopped` (the run is not lost)."""
        path = self.save()
        self.logger.flush()
        raise TrainingStopped(f"training stopped at step {self.step}: {reason}", str(path) if path else None)

    def train(self) -> list[dict[str, float]]:
        """Train to ``run.max_steps``. SIGTERM / SIGINT (from here on, resume and data selection included) stop it at
        the next step boundary, or discard the step if its rollouts are still being collected, after writing a
        checkpoint: :class:`TrainingInterrupted` (``mmgrpo train`` exits with code 6)."""
        with StopOnSignal() as self._signals:
            try:
                return self._train()
            finally:
                self._signals = None

    def _train(self) -> list[dict[str, float]]:
        resumed = self.resume()
        for m in self.methods:
            m.on_train_start(resumed)
        if not resumed:
            self._make_stream()
        history = []
        save_every = self.cfg.run.save_every
        from tqdm.auto import tqdm

        bar = tqdm(total=self.cfg.run.max_steps, initial=self.step, desc="GRPO", unit="step", dynamic_ncols=True,
                   disable=not (self.cfg.run.progress_bar and self.rank == 0))
        try:
            while self.step < self.cfg.run.max_steps:
                if self._signals.agreed(_global_max):  # SIGTERM / SIGINT: every process stops at this step
                    self._interrupt(f"step {self.step}")
                # every process stops at the same step (the collective runs on all of them)
                if self.budget.enabled and global_sum(float(self.budget.exhausted)) > 0:
                    log.info("run.max_train_seconds=%g reached after step %d (%.1f s, %s clock)",
                             self.budget.max_seconds, self.step, self.budget.spent, self.cfg.run.budget_clock)
                    self.budget_stopped = True
                    break
                history.append(self.train_step())
                bar.update(1)
                r = history[-1].get("reward/total/mean")
                if r is not None:
                    bar.set_postfix(reward=f"{r:.3f}", refresh=False)
                if save_every and self.step % save_every == 0 and self.step < self.cfg.run.max_steps:
                    self.save()
            self._check_trained()  # a run that trained nothing writes no final checkpoint
            if self.step > 0 and (not resumed or history):
                self.save()
        finally:
            bar.close()
            self._close_prefetch()
            self.logger.flush()
        return history


def _chain_epoch_hooks(hooks: list[Callable[[int], int | None]]) -> Callable[[int], int | None]:
    """One ``PromptStream.on_epoch`` calling every method's hook in order; the last new sample count wins."""
    def on_epoch(epoch: int) -> int | None:
        n = None
        for h in hooks:
            r = h(epoch)
            n = n if r is None else r
        return n
    return on_epoch


__all__ = ["GRPOTrainer", "PromptStream", "RolloutBatch", "micro_batches", "cat_batches"]
