"""Qwen-VL policies: per-family adapters, hub-free tiny builders, rollout backends and token log-probs.

Import submodules directly (``mmgrpo.vlm.models.rollout`` etc.); this package imports nothing heavy.
"""
from __future__ import annotations

_LAZY = {
    "load_policy": "adapters", "LoraSpec": "adapters", "Policy": "adapters", "get_adapter": "adapters",
    "detect_family": "adapters", "ModelAdapter": "adapters",
    "build_tiny_model": "tiny", "build_tiny_processor": "tiny", "save_tiny_model": "tiny",
    "HFRolloutBackend": "rollout", "VLLMRolloutBackend": "rollout", "RolloutBackend": "rollout",
    "SamplingParams": "rollout", "RolloutOutput": "rollout", "compute_token_logprobs": "rollout",
    "collate_prompts": "rollout",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"mmgrpo.vlm.models.{_LAZY[name]}"), name)
    raise AttributeError(name)


__all__ = sorted(_LAZY)
