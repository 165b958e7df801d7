"""Setting up a VLM run, one plain function per piece: the accelerator, the global batch, the policy, the rollout
backend, the optimizer and the log-prob implementation. :class:`mmgrpo.vlm.train.trainer.GRPOTrainer` calls them in
this order; each returns what it built."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import torch

from mmgrpo.engine.parallel import Parallel
from mmgrpo.utils.logging import get_logger
from mmgrpo.utils.master_weights import make_adamw
from mmgrpo.utils.schedule import LRFactor
from mmgrpo.vlm.methods import check_config, enabled_classes
from mmgrpo.vlm.models.adapters import LoraSpec, Policy, load_policy
from mmgrpo.vlm.models.rollout import HFRolloutBackend, RolloutBackend

log = get_logger("mmgrpo.train")

__all__ = ["make_accelerator", "global_batch", "load_run_policy", "make_backend", "make_optimizer",
           "choose_logprob_impl"]


def make_accelerator(cfg) -> Parallel:
    """The accelerator and how gradients meet across processes (``run.grad_sync``): ``accelerator``, ``rank``,
    ``world``, ``device``, ``sharded`` (FSDP / DeepSpeed), ``dist_kind``, ``grad_sync``."""
    from accelerate import Accelerator
    from accelerate.utils import DistributedType

    cpu = cfg.run.device == "cpu" or (cfg.run.device == "auto" and not torch.cuda.is_available())
    # the LR schedule counts optimizer updates: accelerate must not step it once per process
    acc = Accelerator(cpu=cpu, mixed_precision=cfg.run.mixed_precision, step_scheduler_with_optimizer=False)
    dt = acc.distributed_type
    sharded = dt in (DistributedType.FSDP, DistributedType.DEEPSPEED)
    kind = str(dt).rsplit(".", 1)[-1]
    grad_sync = cfg.run.grad_sync
    if grad_sync == "auto":
        grad_sync = "accelerate" if sharded else "manual"
    if sharded and grad_sync == "manual":
        raise ValueError(f"{kind} shards the parameters: run.grad_sync=manual cannot sum gradients by hand; use "
                         "run.grad_sync=auto")
    if kind == "FSDP" and getattr(acc.state.fsdp_plugin, "fsdp_version", 1) != 2:
        raise ValueError("mmgrpo runs FSDP as FSDP2 (fully_shard): set fsdp_version: 2 in the accelerate config "
                         "(fsdp_config); FSDP1 is not supported by this trainer")
    return Parallel(accelerator=acc, rank=acc.process_index, world=acc.num_processes, device=acc.device,
                    sharded=sharded, dist_kind=kind, grad_sync=grad_sync)


def global_batch(cfg, world: int) -> tuple[int, bool]:
    """(global prompts per step, whether a group's rows may sit on several processes); checks every registered
    method's options before the model loads."""
    G = cfg.rollout.group_size
    P = cfg.run.prompts_per_step or cfg.run.prompts_per_device * world
    if (P * G) % world:
        raise ValueError(f"run.prompts_per_step={P} x rollout.group_size={G} rows cannot be split evenly over "
                         f"{world} processes")
    split = P % world != 0
    check_config(cfg)
    if split:
        # these need every row of a group on one process (group-level rewards, shuffled / injected members,
        # intra-group token statistics, refill decisions)
        bad = [m.name for m in enabled_classes(cfg) if m.needs_whole_groups]
        bad += ["reward 'length'"] if "length" in cfg.reward.weights else []
        if bad:
            raise ValueError(f"run.prompts_per_step={P} is not a multiple of the {world} processes, so groups are "
                             f"split across processes, which {bad} do not support; use a multiple of {world}")
    return P, split


def load_run_policy(cfg, device) -> Policy:
    """``model.path`` loaded with the run's LoRA / freezing / dtype settings (a reference copy if ``kl_coef > 0``)."""
    if not cfg.model.path:
        raise ValueError("model.path is required (a local checkpoint folder)")
    lora = None
    if cfg.model.lora.enabled:
        lc = cfg.model.lora
        lora = LoraSpec(r=lc.rank, alpha=lc.alpha, dropout=lc.dropout, target_modules=list(lc.target_modules),
                        include_vision=lc.include_vision)
    return load_policy(cfg.model.path, cfg.model.family, lora=lora, freeze_vision=cfg.model.freeze_vision,
                       gradient_checkpointing=cfg.model.gradient_checkpointing, dtype=cfg.model.dtype,
                       need_reference=cfg.algo.kl_coef > 0, lora_path=cfg.model.lora_path or None,
                       attn_implementation=cfg.model.attn_implementation, device=device)


def eos_id_of(tok) -> int:
    """The end-of-turn id (Qwen's ``<|im_end|>``), else the tokenizer's eos."""
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    return tok.eos_token_id if eos is None or eos == tok.unk_token_id else eos


def preflight(cfg, dist: Parallel, loading: bool) -> None:
    """Before any data or model loads (``mmgrpo.utils.preflight``): settings that would only fail after loading
    raise ``ConfigError`` (exit code 2) naming them; the planner's estimate against the device's memory; the
    startup line. ``loading``: the trainer loads the model itself (not an injected policy)."""
    from mmgrpo.engine.errors import ConfigError
    from mmgrpo.utils import preflight as pf
    from mmgrpo.vlm.memory_plan import counts

    if cfg.run.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device=cuda but no CUDA device is visible here; use run.device=auto or cpu")
    if loading:
        if not cfg.model.path:
            raise ConfigError("model.path is required (a local checkpoint folder)")
        if not (Path(cfg.model.path) / "config.json").is_file():
            raise ConfigError(f"model.path={cfg.model.path}: no config.json there (a local Hugging Face "
                              "checkpoint folder, e.g. Qwen2.5-VL-7B-Instruct)")
        pf.check_attn_implementation(cfg.model.attn_implementation, "model.attn_implementation", dist.device.type)
        strategy = {"FSDP": "fsdp2", "DEEPSPEED": "zero3"}.get(dist.dist_kind, "ddp")
        pf.check_memory("vlm", cfg, dist.device, dist.world, strategy, cfg.run.memory_check, "mmgrpo train", counts)
    pf.startup_line("mmgrpo train", dist.accelerator, weights_dtype=cfg.model.dtype,
                    attn=cfg.model.attn_implementation, lora=cfg.model.lora.enabled,
                    mixed_precision=cfg.run.mixed_precision, extra=f"grad sync {dist.grad_sync}")


def make_backend(cfg, policy: Policy, device, signals: Callable[[], Any] = lambda: None,
                 main: bool = True) -> RolloutBackend:
    """``rollout.backend``: HF generate on the trained module, or vLLM. ``signals()``: the run's active
    :class:`~mmgrpo.utils.signals.StopOnSignal` (or None): SIGTERM / SIGINT end a long HF rollout early (the step is
    then discarded); ``main``: this process logs the rollout's progress (every 30 s)."""
    if cfg.rollout.backend == "vllm":
        from mmgrpo.vlm.models.vllm_backend import backend_from_config

        return with_tools(cfg, policy, backend_from_config(cfg, policy))
    from mmgrpo.utils.preflight import RolloutWatch

    backend = HFRolloutBackend(policy.model, policy.processor, policy.suppress_token_ids,
                               cfg.rollout.generation_batch_size, device=device,
                               shared_prefix=cfg.rollout.shared_prefix)
    backend.step_hook = RolloutWatch(signals, enabled=main)
    return with_tools(cfg, policy, backend)


def with_tools(cfg, policy: Policy, backend: RolloutBackend, image_kwargs: dict | None = None) -> RolloutBackend:
    """``tools.enabled``: the backend wrapped in the multi-turn tool rollout (:mod:`mmgrpo.vlm.tools.rollout`)."""
    if not cfg.tools.enabled:
        return backend
    from mmgrpo.vlm.data.task import TaskAdapter
    from mmgrpo.vlm.tools.rollout import MultiTurnBackend

    if image_kwargs is None:
        image_kwargs = TaskAdapter(policy.processor, policy.adapter, cfg.data).image_size_kwargs()
    return MultiTurnBackend(backend, policy.processor, cfg.tools, policy.family, image_kwargs)


def make_optimizer(cfg, policy: Policy, dist: Parallel) -> SimpleNamespace:
    """AdamW (fp32 master weights for bf16), the LR schedule, and ``accelerator.prepare`` when engines exchange
    gradients: ``model`` (the module every forward goes through), ``unwrapped`` (the module itself: saving, the
    reference, rollouts), ``optimizer``, ``scheduler``, ``params`` (the trained ones)."""
    params = policy.trainable_parameters()
    if not params:
        raise ValueError("no trainable parameters (everything frozen?)")
    o = cfg.optim
    # bf16 weights get fp32 master copies (mmgrpo.utils.master_weights); sharded engines keep their own and remap
    # the optimizer's parameters at prepare, which must then be the model's
    opt = make_adamw(params, master_weights=o.fp32_master_weights and not dist.sharded, lr=o.lr,
                     weight_decay=o.weight_decay, betas=tuple(o.betas))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, LRFactor(o.lr_schedule, o.warmup_steps, cfg.run.max_steps * cfg.algo.num_iterations))
    model = unwrapped = policy.model
    if dist.grad_sync == "accelerate":
        # the standard route (FSDP / DeepSpeed / DDP): every forward goes through the prepared module,
        # accelerator.backward + no_sync for the micro-batches of one update, accelerator.clip_grad_norm_
        model, opt, sched = dist.accelerator.prepare(model, opt, sched)
        params = [p for p in model.parameters() if p.requires_grad]
        unwrapped = dist.accelerator.unwrap_model(model)
    elif dist.world > 1:  # start every process from rank 0's weights (belt and braces on top of the shared seed)
        import torch.distributed as tdist

        with torch.no_grad():
            for p in params:
                tdist.broadcast(p.data, src=0)
    return SimpleNamespace(model=model, unwrapped=unwrapped, optimizer=opt, scheduler=sched, params=params)


def choose_logprob_impl(cfg, policy: Policy, model, grad_sync: str, dist_kind: str) -> str:
    """``run.logprob_impl`` (default prefix_group), or the naive path where the shared-prefix forward is not exact /
    not supported -- logged, and visible as ``perf/prefix_group`` in the metrics.

    Every trained row of a group shares its prompt item (TempSamp's ground-truth row included; T-GRPO's
    shuffled-frame rows are only scored, never trained), so the prompt is an exact prefix of each row."""
    impl = cfg.run.logprob_impl
    if impl != "prefix_group":
        return impl
    from mmgrpo.vlm.models.prefix_group import VERIFIED_FAMILIES, supports_grouping

    reason = None
    if cfg.tools.enabled:
        # a multi-turn row has its own item (its tool media) and vision tokens inside the completion
        reason = "multi-turn tool rollouts (tools.enabled): rows of a group no longer share one prompt item"
    elif grad_sync == "accelerate":
        # a prepared module must see the same number of calls on every process (collectives per forward); the
        # shared-prefix path calls it once or twice depending on the completion length
        reason = f"not used with run.grad_sync=accelerate ({dist_kind})"
    elif policy.family not in VERIFIED_FAMILIES:
        reason = f"model family {policy.family!r} is not verified against the naive path"
    elif not supports_grouping(model):
        reason = f"{type(model).__name__} has no MRoPE get_rope_index"
    elif any(getattr(getattr(m, "_gradient_checkpointing_func", None), "keywords", {}).get("use_reentrant")
             for m in model.modules() if getattr(m, "gradient_checkpointing", False)):
        reason = "reentrant gradient checkpointing would cut the gradient to the shared prefix"
    if reason:
        log.warning("run.logprob_impl=prefix_group -> naive log-prob path: %s", reason)
        return "naive"
    log.info("log-probs: shared-prefix group forward (each prompt encoded once per group)")
    return impl
