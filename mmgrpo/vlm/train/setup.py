"""Construction of the VLM trainer: accelerator, policy, rollout backend, optimizer, run state, the global batch
(and whether groups may be split over processes) and the log-prob implementation."""
from __future__ import annotations

from pathlib import Path

import torch

from mmgrpo.engine.checkpoint import SkipHalt
from mmgrpo.vlm.methods import check_config, enabled_classes
from mmgrpo.vlm.models.adapters import LoraSpec, Policy, load_policy
from mmgrpo.vlm.models.rollout import HFRolloutBackend, RolloutBackend
from mmgrpo.vlm.train.stream import PromptStream
from mmgrpo.vlm.train.task import TaskAdapter
from mmgrpo.utils.budget import TimeBudget
from mmgrpo.utils.checkpoint import CheckpointManager
from mmgrpo.utils.config import save_config
from mmgrpo.utils.logging import MetricLogger, get_logger
from mmgrpo.utils.master_weights import make_adamw
from mmgrpo.utils.schedule import LRFactor
from mmgrpo.utils.signals import StopOnSignal

log = get_logger("mmgrpo.train")

__all__ = ["SetupMixin"]


class SetupMixin:
    """``GRPOTrainer._setup_*`` (called in this order by ``__init__``), ``_setup_global_batch``,
    ``_choose_logprob_impl``."""

    def _setup_accelerator(self) -> None:
        """The accelerator, this process's rank / device, and how gradients are exchanged (``run.grad_sync``)."""
        from accelerate import Accelerator
        from accelerate.utils import DistributedType

        cfg = self.cfg
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

    def _preflight(self, loading: bool) -> None:
        """Before any data or model loads (``mmgrpo.utils.preflight``): settings that would only fail after loading
        raise ``ConfigError`` (exit code 2) naming them; the planner's estimate against the device's memory; the
        startup line. ``loading``: the trainer loads the model itself (not an injected policy)."""
        from mmgrpo.engine.errors import ConfigError
        from mmgrpo.utils import preflight

        cfg = self.cfg
        if cfg.run.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("run.device=cuda but no CUDA device is visible here; use run.device=auto or cpu")
        if loading:
            if not cfg.model.path:
                raise ConfigError("model.path is required (a local checkpoint folder)")
            if not (Path(cfg.model.path) / "config.json").is_file():
                raise ConfigError(f"model.path={cfg.model.path}: no config.json there (a local Hugging Face "
                                  "checkpoint folder, e.g. Qwen2.5-VL-7B-Instruct)")
            preflight.check_attn_implementation(cfg.model.attn_implementation, "model.attn_implementation",
                                                self.device.type)
            strategy = {"FSDP": "fsdp2", "DEEPSPEED": "zero3"}.get(self.dist_kind, "ddp")
            preflight.check_memory("vlm", cfg, self.device, self.world, strategy, cfg.run.memory_check,
                                   "mmgrpo train")
        preflight.startup_line("mmgrpo train", self.accelerator, weights_dtype=cfg.model.dtype,
                               attn=cfg.model.attn_implementation, lora=cfg.model.lora.enabled,
                               mixed_precision=cfg.run.mixed_precision,
                               extra=f"grad sync {self.grad_sync}")

    def _setup_policy(self, policy: Policy | None) -> None:
        """Load the policy (unless injected) and the tokenizer / task glue built on it."""
        cfg = self.cfg
        if policy is None:
            if not cfg.model.path:
                raise ValueError("model.path is required (a local checkpoint folder)")
            lora = None
            if cfg.model.lora.enabled:
                lc = cfg.model.lora
                lora = LoraSpec(r=lc.rank, alpha=lc.alpha, dropout=lc.dropout, target_modules=list(lc.target_modules),
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

    def _default_backend(self) -> RolloutBackend:
        """``rollout.backend``: HF generate on the trained module, or vLLM."""
        cfg, policy = self.cfg, self.policy
        if cfg.rollout.backend == "vllm":
            from mmgrpo.vlm.models.vllm_backend import backend_from_config

            return backend_from_config(cfg, policy)
        from mmgrpo.utils.preflight import RolloutWatch

        backend = HFRolloutBackend(self.model, policy.processor, policy.suppress_token_ids,
                                   cfg.rollout.generation_batch_size, device=self.device,
                                   shared_prefix=cfg.rollout.shared_prefix)
        # progress every 30 s inside a long rollout; SIGTERM / SIGINT end it early (the step is then discarded)
        backend.step_hook = RolloutWatch(lambda: self._signals, enabled=self.accelerator.is_main_process)
        return backend

    def _setup_optimizer(self) -> None:
        """AdamW (+ fp32 master weights for bf16), the LR schedule, and ``accelerator.prepare`` when engines
        exchange gradients."""
        cfg, policy = self.cfg, self.policy
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

    def _setup_run_state(self) -> None:
        """Step, budget, counters, logger and checkpoint manager of a new run (a resume overwrites them)."""
        cfg = self.cfg
        self.step = 0
        self.budget = TimeBudget(cfg.run.max_train_seconds, cfg.run.budget_clock)
        self.budget_stopped = False
        self.counters = {"skipped_missing_media": 0, "skipped_bad_samples": 0, "filtered_groups": 0,
                         "generated_tokens": 0,
                         # faults (see mmgrpo.vlm.train.faults): rows dropped for NaN/inf or failed rewards, reward
                         # calls that failed for good, groups left with < 2 valid members, skipped optimizer steps
                         "reward_nonfinite_rows": 0, "reward_failed_rows": 0, "reward_failed_calls": 0,
                         "reward_retries": 0, "reward_timeouts": 0, "degenerate_groups": 0, "skipped_steps": 0,
                         # steps whose every advantage was 0 (no reward signal; skipped unless a KL / entropy term)
                         "zero_advantage_steps": 0}
        self.skips = SkipHalt(cfg.run.max_consecutive_skips)  # non-finite skip-and-halt state (checkpointed)
        self._stop_reason: str | None = None
        self._signals: StopOnSignal | None = None  # active during train(): SIGTERM / SIGINT stop at a step boundary
        self._step_snapshot: dict | None = None
        self.stream: PromptStream | None = None
        main = self.accelerator.is_main_process
        self.logger = MetricLogger(self.run_dir, use_tensorboard=cfg.run.tensorboard, is_main_process=main)
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
        from mmgrpo.vlm.models.prefix_group import VERIFIED_FAMILIES, supports_grouping

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
        G = cfg.rollout.group_size
        P = cfg.run.prompts_per_step or cfg.run.prompts_per_device * W
        if (P * G) % W:
            raise ValueError(f"run.prompts_per_step={P} x rollout.group_size={G} rows cannot be split evenly "
                             f"over {W} processes")
        self.prompts_per_step = P
        self.split_groups = P % W != 0
        check_config(cfg)  # every registered method's options, before the model loads
        if self.split_groups:
            # these need every row of a group on one process (group-level rewards, shuffled / injected members,
            # intra-group token statistics, refill decisions)
            bad = [m.name for m in enabled_classes(cfg) if m.needs_whole_groups]
            bad += ["reward 'length'"] if "length" in cfg.reward.weights else []
            if bad:
                raise ValueError(f"run.prompts_per_step={P} is not a multiple of the {W} processes, so groups are "
                                 f"split across processes, which {bad} do not support; use a multiple of {W}")
