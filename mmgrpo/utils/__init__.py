"""Shared infrastructure for both trainers: config, checkpoint, logging, seeding, time budget, LR schedule.

Names are exported lazily so that ``import mmgrpo.utils`` (and ``mmgrpo.utils.config``) never imports torch.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    # config (no heavy imports)
    "load_config": "config",
    "apply_overrides": "config",
    "config_to_dict": "config",
    "config_from_dict": "config",
    "config_to_yaml": "config",
    "save_config": "config",
    "config_argparser": "config",
    "parse_config_cli": "config",
    # checkpoint (torch imported on use)
    "CheckpointManager": "checkpoint",
    "CheckpointError": "checkpoint",
    "capture_rng_state": "checkpoint",
    "restore_rng_state": "checkpoint",
    "atomic_write_text": "checkpoint",
    "atomic_torch_save": "checkpoint",
    # logging
    "MetricLogger": "logging",
    "save_image_grid": "logging",
    "plot_curves": "logging",
    "get_logger": "logging",
    # seeding
    "sample_seed": "seeding",
    "seed_everything": "seeding",
    "torch_generator": "seeding",
    # training-time budget and LR schedule (pure Python)
    "TimeBudget": "budget",
    "LRFactor": "schedule",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'mmgrpo.utils' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"mmgrpo.utils.{mod}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
