"""Checks both trainers run before the model loads, and the startup line (issue 32 items 6, 7, 9).

A setting found wrong here raises :class:`~mmgrpo.engine.errors.ConfigError` naming it (``mmgrpo train`` /
``flow_grpo train`` exit with code 2, like any bad config), instead of a traceback after minutes of loading:

* :func:`check_attn_implementation`: ``flash_attention_2`` needs the flash-attn package and a CUDA device;
* :func:`check_memory`: the memory planner's estimate (:mod:`mmgrpo.utils.memory_plan`) against the device's memory
  (CUDA: the GPU's total; CPU: ``MemAvailable``), refused unless ``run.memory_check=warn`` (or ``off``);
* :func:`startup_line`: one line saying the device, the distributed mode (FSDP / DeepSpeed active or not), the
  dtypes and the attention backend, and what an accelerate config the device cannot honour falls back to (an FSDP
  config on CPU, fp16 autocast on CPU).

:class:`RolloutWatch` is the VLM rollout's per-token hook: a progress line every ``every_s`` seconds (tokens
generated) and an early stop of the rollout when SIGTERM / SIGINT arrives (the trainer then discards the step and
checkpoints, as on any signal).
"""
from __future__ import annotations

import importlib.util
import os
import time
from typing import Any, Callable, Optional

from mmgrpo.engine.errors import ConfigError
from mmgrpo.utils.logging import get_logger

log = get_logger("mmgrpo.preflight")

__all__ = ["check_attn_implementation", "check_memory", "device_memory", "startup_line", "RolloutWatch"]

ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")


def check_attn_implementation(value: str, key: str, device_type: str) -> None:
    """``key`` (e.g. ``model.attn_implementation``) can run here, or :class:`ConfigError`."""
    if value not in ATTN_IMPLEMENTATIONS:
        raise ConfigError(f"{key}={value!r} is not an attention implementation transformers knows; use one of "
                          f"{', '.join(ATTN_IMPLEMENTATIONS)} (sdpa works everywhere)")
    if value.startswith("flash_attention"):
        pkg = "flash_attn" if value == "flash_attention_2" else "flash_attn_interface"
        if importlib.util.find_spec(pkg) is None:
            raise ConfigError(f"{key}={value} needs the {pkg.replace('_', '-')} package, which is not installed "
                              f"here (pip install flash-attn on a CUDA machine); or set {key}=sdpa")
        if device_type != "cuda":
            raise ConfigError(f"{key}={value} runs on CUDA GPUs only and this run is on {device_type}; set {key}=sdpa")


def device_memory(device) -> tuple[int, str]:
    """(bytes, what) the run can use on ``device``: a GPU's total memory, or the host's ``MemAvailable``."""
    import torch

    if getattr(device, "type", str(device)) == "cuda" and torch.cuda.is_available():
        idx = device.index if getattr(device, "index", None) is not None else torch.cuda.current_device()
        return int(torch.cuda.get_device_properties(idx).total_memory), f"GPU {idx} total memory"
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available host memory (MemAvailable)"
    except OSError:
        pass
    return 0, "unknown"


def check_memory(kind: str, cfg: Any, device, world: int, strategy: str, mode: str, prog: str,
                 counts: Callable[..., dict]) -> Optional[dict]:
    """The planner's per-device estimate for this run against ``device``'s memory (``mode``: ``run.memory_check``).

    Runs only when the checkpoint's widths are those of a released model the planner knows (a depth-truncated
    folder counts: its layers are read from its config.json); a tiny or width-reduced model is skipped (logged at
    debug level). Over the limit: ``error`` raises :class:`ConfigError`, ``warn`` logs. Returns the plan or None.
    ``counts``: the front-end's parameter counts (``mmgrpo.vlm.memory_plan.counts`` / ``flow_grpo.memory_plan``'s)."""
    if mode == "off":
        return None
    from mmgrpo.utils import memory_plan as mp

    try:
        res = mp.plan_for_config(kind, cfg, counts, world=world, strategy=strategy,
                                 gpu=getattr(device, "type", "") == "cuda")
    except (OSError, ValueError, KeyError) as e:
        log.debug("memory check skipped: %s", e)
        return None
    if res is None:
        log.debug("memory check skipped: the checkpoint's widths are not a released model's")
        return None
    name, layers, p = res
    have, what = device_memory(device)
    if not have:
        return p
    need = p["total"]
    depth = f" at {layers} layers" if layers else ""
    msg = (f"the memory planner predicts {need / mp.GiB:.1f} GiB per process for this run ({name}{depth}, "
           f"{strategy} x {world}, {'LoRA' if 'lora_weights' in p else 'full fine-tune'}), more than the "
           f"{have / mp.GiB:.1f} GiB of {what}. Largest parts: "
           + ", ".join(f"{k} {v / mp.GiB:.1f} GiB" for k, v in sorted(
               ((k, v) for k, v in p.items() if k not in ("total", "fits")), key=lambda kv: -kv[1])[:3])
           + ". Use LoRA (model.lora.enabled=true), more processes with FSDP, fewer rollouts per micro-batch "
             "(run.micro_batch_size) or shorter completions; the planner's GPU figures are +-20 % "
             "(docs/real_scale.md)")
    if need <= have:
        log.info("memory plan: %.1f GiB per process predicted, %.1f GiB of %s", need / mp.GiB, have / mp.GiB, what)
        return p
    if mode == "warn":
        log.warning("%s: %s (run.memory_check=warn: starting anyway)", prog, msg)
        return p
    raise ConfigError(msg + "; to start anyway: run.memory_check=warn")


def startup_line(prog: str, accelerator, *, weights_dtype: str, attn: str = "", lora: Optional[bool] = None,
                 mixed_precision: str = "no", extra: str = "") -> str:
    """One line (logged on the main process and returned): device, processes and distributed mode, dtypes,
    attention; plus what an accelerate config this device cannot honour falls back to."""
    dt = str(accelerator.distributed_type).rsplit(".", 1)[-1]
    n = accelerator.num_processes
    dev = accelerator.device
    sharded = dt in ("FSDP", "DEEPSPEED")
    dist = {"NO": "no distribution", "MULTI_CPU": "DDP-style replicas (gloo)", "MULTI_GPU": "DDP-style replicas",
            "FSDP": "FSDP2 (sharded)", "DEEPSPEED": "DeepSpeed (sharded)"}.get(dt, dt)
    notes = []
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" and dt != "FSDP":
        notes.append(f"the accelerate config asks for FSDP, but on {dev.type} this run uses {dist}: every process "
                     "holds the whole model (no sharding)")
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true" and dt != "DEEPSPEED":
        notes.append(f"the accelerate config asks for DeepSpeed but this run uses {dt}")
    env_mp = os.environ.get("ACCELERATE_MIXED_PRECISION", "")
    if env_mp and env_mp != mixed_precision:
        notes.append(f"the accelerate config's mixed_precision={env_mp} is replaced by run.mixed_precision="
                     f"{mixed_precision}")
    amp = mixed_precision
    if mixed_precision == "fp16" and dev.type == "cpu":
        amp = "none"
        notes.append("run.mixed_precision=fp16 has no effect on CPU (no fp16 autocast there): compute runs in the "
                     "weights' dtype")
    if weights_dtype == "float16" and dev.type == "cpu":
        notes.append("float16 weights on CPU: supported but slow and without loss scaling; bfloat16 or float32 are "
                     "the tested CPU dtypes")
    parts = [f"device {dev}", f"{n} process{'es' if n > 1 else ''}", dist + ("" if sharded else ", FSDP off"),
             f"weights {weights_dtype}", f"autocast {amp}"]
    if attn:
        parts.append(f"attention {attn}")
    if lora is not None:
        parts.append("LoRA" if lora else "full fine-tune")
    line = f"{prog}: " + ", ".join(parts) + (f"; {extra}" if extra else "")
    if notes:
        line += " | " + "; ".join(notes)
    if accelerator.is_main_process:
        log.info("%s", line)
    return line


class RolloutWatch:
    """Per-token hook of a rollout (``HFRolloutBackend.step_hook``): logs the tokens generated every ``every_s``
    seconds and returns True (stop decoding) once a SIGTERM / SIGINT was received (``signals()`` returns the
    active :class:`~mmgrpo.utils.signals.StopOnSignal` or None)."""

    def __init__(self, signals: Callable[[], Any], every_s: float = 30.0, enabled: bool = True):
        self.signals = signals
        self.every_s = float(every_s)
        self.enabled = enabled
        self._t_last = time.monotonic()
        self._tokens = 0

    def __call__(self, new_tokens: int, rows_left: int) -> bool:
        self._tokens += int(new_tokens)
        now = time.monotonic()
        if self.enabled and self.every_s > 0 and now - self._t_last >= self.every_s:
            log.info("rollout: %d tokens generated in the last %.0f s (%.1f tokens/s), %d rows still decoding",
                     self._tokens, now - self._t_last, self._tokens / (now - self._t_last), rows_left)
            self._t_last, self._tokens = now, 0
        sig = self.signals()
        if sig is not None and sig.requested:
            log.warning("%s received during a rollout: decoding stops now (the step's rollouts are discarded)",
                        sig.name)
            return True
        return False
