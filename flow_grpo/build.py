"""Setup of the flow recipe, plain functions :class:`flow_grpo.train.trainer.FlowGRPOTrainer` calls in order:
accelerator and launch check, adapter, config validation, LoRA / full fine-tune, ``accelerator.prepare`` of model,
optimizer and LR schedule, EMA, the KL reference fingerprint and reference images."""
from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch

from mmgrpo.utils.logging import get_logger
from mmgrpo.utils.master_weights import make_adamw
from mmgrpo.utils.schedule import LRFactor

from .ema import EMA

if TYPE_CHECKING:
    from .models.base import FlowModelAdapter

log = get_logger("flow_grpo.trainer")


@dataclass
class TrainedModel:
    """What :func:`setup_model` returns: the weights being trained and how they are distributed, the explicit
    argument of the checkpoint and export functions (:mod:`flow_grpo.checkpoint`). No run state (epoch, counters,
    methods) lives here."""

    adapter: FlowModelAdapter  # ``adapter.model`` is the prepared module
    accelerator: Any
    model: torch.nn.Module  # the prepared transformer (DDP / FSDP / DeepSpeed wrapper): every forward goes through it
    unwrapped: torch.nn.Module  # accelerator.unwrap_model(model): its parameters feed EMA, saving and export
    optimizer: Any
    lr_scheduler: Any
    named_params: list  # [(name, parameter)] of the trainable parameters
    params: list
    ema: Optional[EMA]
    reference_info: dict  # what the KL reference is + the fingerprint of the frozen base weights
    sharded: bool  # FSDP / DeepSpeed: every process holds shards
    deepspeed: bool
    lora: bool  # model.lora.enabled


def _peft_init(v: str):
    low = str(v).lower()
    if low in ("true", "default"):
        return True
    if low == "false":
        return False
    return v


def make_accelerator(cfg):
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs

    r = cfg.run
    # broadcast_buffers=False: the transformers' buffers are constants (positional tables) identical on every
    # process; broadcasting them would turn every no-grad forward (sampling, eval) into a collective.
    ddp = DistributedDataParallelKwargs(find_unused_parameters=r.ddp_find_unused_parameters,
                                        broadcast_buffers=False)
    # run.device=auto without GPUs: accelerate's CPU backend (gloo for several processes; otherwise accelerate
    # falls back to one independent process per rank, see check_launch)
    cpu = r.device == "cpu" or (r.device == "auto" and not torch.cuda.is_available())
    # step_scheduler_with_optimizer=False: the schedule advances once per optimizer step, not once per process
    return Accelerator(cpu=cpu, mixed_precision=r.mixed_precision, step_scheduler_with_optimizer=False,
                       kwargs_handlers=[ddp])


def check_launch(accelerator) -> None:
    """Refuse to run when the launcher started N processes but accelerate trains with another number: each
    process would optimise its own unsynchronised copy (DanceGRPO#110). Happens e.g. when accelerate finds no
    GPU and falls back to a single process per rank."""
    import torch.distributed as dist

    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if dist.is_available() and dist.is_initialized():
        launched = max(launched, dist.get_world_size())
    if launched != accelerator.num_processes:
        raise RuntimeError(f"launched with {launched} processes but accelerate runs {accelerator.num_processes} "
                           f"({accelerator.distributed_type}): every process would train an independent "
                           "copy. On CPU set run.device=cpu (or use an accelerate config with use_cpu: true).")


def preflight(c, acc, world: int, sharded: bool, deepspeed: bool, loading: bool, reward_fn) -> None:
    """Before the pipeline loads (``mmgrpo.utils.preflight``): reward settings (a remote reward's URL, weight
    folders), the device, the planner's estimate against the device's memory, and the startup line. Wrong settings
    raise ``ConfigError`` (exit code 2) naming them. ``loading``: the trainer loads the pipeline."""
    from mmgrpo.engine.errors import ConfigError
    from mmgrpo.utils import preflight as pf

    from .memory_plan import counts
    from .rewards import check_reward_settings

    if c.run.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device=cuda but no CUDA device is visible here; use run.device=auto or cpu")
    problems = check_reward_settings(c.reward.weights, c.reward.kwargs, skip=list(reward_fn or {}))
    if problems:
        raise ConfigError("; ".join(problems))
    if loading and not c.model.tiny:
        if not c.model.pipeline_dir:
            raise ConfigError("set model.pipeline_dir (a diffusers folder) or model.tiny=sd3|flux")
        if not os.path.isfile(os.path.join(c.model.pipeline_dir, "model_index.json")):
            raise ConfigError(f"model.pipeline_dir={c.model.pipeline_dir}: no model_index.json there (a "
                              "diffusers pipeline folder, e.g. stable-diffusion-3.5-medium)")
        strategy = "fsdp2" if sharded and not deepspeed else "zero3" if deepspeed else "ddp"
        pf.check_memory("flow", c, acc.device, world, strategy, c.run.memory_check, "flow_grpo train", counts)
    pf.startup_line("flow_grpo train", acc, weights_dtype=c.model.dtype, lora=c.model.lora.enabled,
                    mixed_precision=c.run.mixed_precision, extra=f"method {c.method}")


def load_adapter(cfg, device):
    from .models import adapter_from_pipeline, load_adapter as load

    m = cfg.model
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[m.dtype]
    if m.tiny:
        from .models import TINY_BUILDERS

        builder = TINY_BUILDERS[m.tiny]
        return adapter_from_pipeline(builder(seed=cfg.run.seed), device=device, dtype=dtype,
                                     max_sequence_length=m.max_sequence_length)
    if not m.pipeline_dir:
        raise ValueError("set model.pipeline_dir (a diffusers folder) or model.tiny=sd3|flux")
    return load(m.pipeline_dir, kind=m.kind, device=device, dtype=dtype, max_sequence_length=m.max_sequence_length)


def validate(c, adapter, world: int, sharded: bool) -> None:
    """What only fails once the adapter and the launch are known (the rest is checked when the config is parsed and
    by the methods' ``check``)."""
    from .methods import check_config, credit_class

    check_config(c)  # the credit and the plan exist, every enabled method's options hold
    n_total = c.data.group_size * c.data.groups_per_epoch
    if c.data.group_size < 2:
        raise ValueError("data.group_size must be >= 2 (advantages are group-relative)")
    if n_total % world:
        raise ValueError(f"group_size*groups_per_epoch={n_total} must be divisible by the {world} processes")
    if not adapter.supports_cfg and c.sample.cfg:
        raise ValueError("FLUX uses embedded guidance: set sample.cfg=false")
    from mmgrpo.utils.config import check_choices

    check_choices(c)  # Literal fields (reward.mode, optim.kl_type, ...) of a config edited after it was built
    if c.optim.kl_coef > 0 and not c.model.lora.enabled:
        raise ValueError("KL with full fine-tuning needs a frozen reference copy; use LoRA (reference = adapter off)")
    if c.optim.max_consecutive_skips < 1:
        raise ValueError("optim.max_consecutive_skips must be >= 1")
    step_credit = credit_class(c).has_step_rewards  # scores ODE completions
    if c.reward.mode != "weighted_sum" and step_credit:
        raise ValueError(f"reward.mode={c.reward.mode} needs sample.credit=outcome (step credits score ODE "
                         "completions with the weighted-sum reward)")
    if c.reward.async_workers < 0:
        raise ValueError("reward.async_workers must be >= 0")
    if sharded and step_credit:
        raise ValueError(f"sample.credit={c.sample.credit} is not supported with FSDP/DeepSpeed: its ODE "
                         "completions make a process-dependent number of (collective) sharded forwards")


def bind_reference_images(adapter, d, train: tuple, evals: tuple, is_main: bool) -> None:
    """Reference-image models (FLUX-Kontext, Wan2.1 I2V, Qwen-Image-Edit): a JSONL prompt line's ``image`` field
    is its reference image (path relative to the prompt file); without any, Kontext runs text-to-image (the
    other two then refuse to encode prompts, naming the missing field). ``train`` / ``evals``: (prompts,
    metadata) of the train and eval prompt files."""
    bind = getattr(adapter, "bind_reference_images", None)
    if bind is None:
        return
    found = False
    for (prompts, meta), path in ((train, d.train_path), (evals, d.eval_path)):
        if any("image" in m for m in meta):
            bind(prompts, meta, source=path)
            found = True
    if not found and is_main:
        log.warning("%s: no prompt has an 'image' field (JSONL): sampling is text-to-image, without a reference",
                    adapter.kind)


def reference_settings(adapter, cfg) -> dict:
    """What the KL reference is, plus a fingerprint of the frozen base weights (names, shapes, dtypes, first
    values, sums): resuming onto a different base model is refused."""
    h = hashlib.sha256()
    n = 0
    with torch.no_grad():
        for name, p in adapter.transformer.named_parameters():
            if "lora_" in name:
                continue
            flat = p.detach().reshape(-1)
            h.update(f"{name}:{tuple(p.shape)}:{p.dtype}".encode())
            h.update(flat[:16].float().cpu().numpy().tobytes())
            h.update(struct.pack("<d", float(flat.double().sum())))
            n += 1
    return {"kind": "lora_disabled" if cfg.model.lora.enabled else "none", "beta": cfg.optim.kl_coef,
            "kl_type": cfg.optim.kl_type, "base_fingerprint": h.hexdigest(), "base_tensors": n}


def setup_model(cfg, acc, adapter, sharded: bool, before_prepare=None) -> TrainedModel:
    """LoRA (or full fine-tune), then the standard accelerate way: DDP / FSDP / DeepSpeed per the launch config
    for the transformer, the optimizer and the LR schedule; every forward uses the prepared module. Returns them with
    the EMA and the reference fingerprint as a :class:`TrainedModel`. ``before_prepare(adapter)`` runs between the
    two (sequence parallelism's hooks go on the LoRA-wrapped modules, under DDP / FSDP)."""
    from accelerate.utils import DistributedType

    if cfg.model.lora.enabled:
        if not adapter.lora_enabled:
            adapter.add_lora(cfg.model.lora.rank, cfg.model.lora.alpha, cfg.model.lora.target_modules,
                             init_lora_weights=_peft_init(cfg.model.lora.init))
    else:
        adapter.enable_full_finetune()
    adapter.set_gradient_checkpointing(cfg.model.gradient_checkpointing)
    reference_info = reference_settings(adapter, cfg)
    if not any(p.requires_grad for p in adapter.transformer.parameters()):
        raise ValueError("no trainable parameters")
    if (acc.num_processes > 1 and not sharded and getattr(adapter.transformer, "partial_forward", False)
            and not cfg.run.ddp_find_unused_parameters):
        from mmgrpo.engine.errors import ConfigError

        raise ConfigError(f"model.kind={adapter.kind} trains modules a forward does not all use (e.g. the two Wan2.2 "
                          "experts, one per step): DDP over several processes needs "
                          "run.ddp_find_unused_parameters=true")
    if before_prepare is not None:
        before_prepare(adapter)
    if acc.distributed_type == DistributedType.FSDP and not acc.is_fsdp2:
        # FSDP1 replaces the parameters while wrapping and accelerate does not remap an optimizer built before
        # (it does for FSDP2 / DeepSpeed, which need both in one prepare call): wrap first, then build it
        model = acc.prepare(adapter.transformer)
        optimizer, lr_scheduler = acc.prepare(*make_optim(cfg, model, sharded))
    else:
        model, optimizer, lr_scheduler = acc.prepare(adapter.transformer,
                                                     *make_optim(cfg, adapter.transformer, sharded))
    adapter.model = model
    unwrapped = acc.unwrap_model(model)
    named_params = [(n, p) for n, p in unwrapped.named_parameters() if p.requires_grad]
    params = [p for _, p in named_params]
    ema = EMA(params, cfg.ema.decay, cfg.ema.warmup) if cfg.ema.enabled else None
    return TrainedModel(adapter=adapter, accelerator=acc, model=model, unwrapped=unwrapped, optimizer=optimizer,
                        lr_scheduler=lr_scheduler, named_params=named_params, params=params, ema=ema,
                        reference_info=reference_info, sharded=sharded,
                        deepspeed=acc.distributed_type == DistributedType.DEEPSPEED, lora=cfg.model.lora.enabled)


def make_optim(cfg, module, sharded: bool):
    """AdamW and its LR schedule over ``module``'s trainable parameters. bf16 trainable weights (full fine-tune)
    get fp32 master copies; sharded engines keep their own and remap the optimizer's parameters at prepare,
    which must then be the module's."""
    o = cfg.optim
    total_steps = max(1, cfg.run.num_epochs * o.inner_epochs * o.updates_per_epoch)
    opt = make_adamw([p for p in module.parameters() if p.requires_grad],
                     master_weights=o.fp32_master_weights and not sharded, lr=o.lr,
                     betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, LRFactor(o.lr_schedule, o.warmup_steps, total_steps))


def set_shift(adapter, shift) -> None:
    """``sample.shift`` -> the adapter's sigma schedule (None keeps the folder scheduler's shift)."""
    if shift is not None:
        adapter.set_shift(shift)


def set_vae_memory(adapter, m) -> None:
    """``model.vae_slicing`` / ``model.vae_tiling`` -> the VAE's own ``enable_slicing`` / ``enable_tiling``."""
    for flag, method in ((m.vae_slicing, "enable_slicing"), (m.vae_tiling, "enable_tiling")):
        if not flag:
            continue
        fn = getattr(adapter.vae, method, None)
        if fn is None:
            raise ValueError(f"model.{method.replace('enable', 'vae')}=true: the {type(adapter.vae).__name__} of "
                             f"model.kind={adapter.kind} has no {method}")
        fn()


TEXT_MODULES = ("text_encoder", "text_encoder_2", "text_encoder_3", "image_encoder", "connectors")


def set_text_encoder_offload(adapter, enabled: bool, host: str = "cpu") -> None:
    """``model.offload_text_encoders``: the pipeline's text encoders (and CLIP image encoder, LTX-2's text
    connectors) live on ``host``; ``adapter.encode_prompts`` moves them to the adapter's device only for a call that
    meets a prompt not in its embedding cache, and back afterwards. Embeddings are unchanged (same modules, same
    device during encoding)."""
    if not enabled:
        return
    mods = [m for m in (getattr(adapter.pipe, n, None) for n in TEXT_MODULES) if isinstance(m, torch.nn.Module)]
    if not mods:
        raise ValueError(f"model.offload_text_encoders=true: model.kind={adapter.kind} has no text encoder module")
    for m in mods:
        m.to(host)
    encode = adapter.encode_prompts

    def encode_prompts(prompts, *args, **kwargs):
        if all(p in adapter._embed_cache for p in prompts):
            return encode(prompts, *args, **kwargs)
        for m in mods:
            m.to(adapter.device)
        try:
            return encode(prompts, *args, **kwargs)
        finally:
            for m in mods:
                m.to(host)

    adapter.encode_prompts = encode_prompts


def set_num_frames(adapter, num_frames: int) -> None:
    """``sample.num_frames`` -> the video adapter (0 keeps its default); an image generator refuses frames."""
    if not num_frames:
        return
    if not hasattr(adapter, "set_num_frames"):
        raise ValueError(f"sample.num_frames={num_frames}: model kind {adapter.kind!r} generates images; leave it 0")
    adapter.set_num_frames(num_frames)
