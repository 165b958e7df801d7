"""VLM methods as modules: one file per method, a hook API (``base.VLMMethod``) and this registry.

``REGISTRY`` lists every method in the order the loop calls their hooks (the order is part of the behaviour:
TW-GRPO's token weights exist before the vLLM importance weights multiply them; data selection runs before
anything is sampled). Each entry says which config switch enables the method -- the existing config keys, so
old configs keep working -- and where its class lives (imported only when enabled: the registry itself does not
import torch).

Adding a method: write ``mmgrpo/methods/<name>.py`` with a :class:`~mmgrpo.methods.base.VLMMethod` subclass,
add one ``MethodSpec`` here, and a test (see CONTRIBUTING.md).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field, make_dataclass
from typing import Any, Callable, Optional

from mmgrpo.methods.base import VLMMethod

__all__ = ["MethodSpec", "MethodsConfig", "REGISTRY", "VLMMethod", "build_methods", "enabled_classes",
           "enabled_names"]


def _h(text: str) -> dict:
    return {"help": text}


# Options of methods added after the registry existed: one dataclass each, a section ``methods.<name>`` of the
# config (``methods.ngrpo.enabled=true``), declared here so that ``mmgrpo train --help`` lists them without
# importing torch. The methods that predate the registry keep their own config sections (tempsamp, tgrpo, ...).
@dataclass
class NGRPOOptions:
    enabled: bool = field(default=False, metadata=_h(
        "NGRPO: group statistics include virtual maximum-reward samples (all-wrong groups keep a negative "
        "advantage) + asymmetric clipping; mmgrpo.methods.ngrpo"))
    max_reward: float = field(default=1.0, metadata=_h(
        "reward of the virtual samples: the largest (weighted) total the task can give (the release: 1.0)"))
    num_virtual: int = field(default=1, metadata=_h("virtual samples per group (the release: 1)"))
    clip_low: Optional[float] = field(default=0.16, metadata=_h(
        "PPO clip epsilon below 1 (binds for A < 0; the release: 0.16); none = algo.clip_low"))
    clip_high: Optional[float] = field(default=0.24, metadata=_h(
        "PPO clip epsilon above 1 (binds for A > 0; the release: 0.24); none = algo.clip_high"))

    def __post_init__(self):
        if self.num_virtual < 1:
            raise ValueError(f"methods.ngrpo.num_virtual must be >= 1, got {self.num_virtual}")


@dataclass(frozen=True)
class MethodSpec:
    name: str
    target: str  # "module:Class"
    enabled: Callable[[Any], bool]  # TrainConfig -> on / off
    help: str = ""
    options: Optional[type] = None  # a dataclass: the config section methods.<name>


REGISTRY: tuple[MethodSpec, ...] = (
    MethodSpec("selection", "mmgrpo.methods.selection:DataSelection", lambda c: c.selection.enabled,
               "Temporal-RLT / Time-R1 / DAPO offline data selection (selection.enabled)"),
    MethodSpec("tempsamp_r1", "mmgrpo.methods.tempsamp_r1:TempSampR1", lambda c: c.tempsamp.enabled,
               "TempSamp-R1 ground-truth injection + shaping / anchoring (tempsamp.enabled)"),
    MethodSpec("t_grpo", "mmgrpo.methods.t_grpo:TGRPO", lambda c: c.tgrpo.enabled,
               "T-GRPO (Video-R1) temporal bonus from shuffled-frame rollouts (tgrpo.enabled)"),
    MethodSpec("dapo_dynamic_sampling", "mmgrpo.methods.dapo:DynamicSampling", lambda c: c.algo.filter_zero_std,
               "DAPO dynamic sampling: drop zero-variance groups and refill (algo.filter_zero_std)"),
    MethodSpec("overlong_mask", "mmgrpo.methods.dapo:OverlongMask",
               lambda c: c.rollout.mask_truncated_completions,
               "DAPO overlong filtering: truncated completions leave the loss (rollout.mask_truncated_completions)"),
    MethodSpec("ngrpo", "mmgrpo.methods.ngrpo:NGRPO", lambda c: c.methods.ngrpo.enabled,
               "NGRPO virtual maximum-reward advantage calibration + asymmetric clipping (methods.ngrpo.enabled)",
               options=NGRPOOptions),
    MethodSpec("tw_grpo", "mmgrpo.methods.tw_grpo:TWGRPO", lambda c: c.twgrpo.enabled,
               "TW-GRPO token weights from intra-group divergence (twgrpo.enabled)"),
    MethodSpec("vllm_is", "mmgrpo.methods.vllm_is:VLLMImportanceSampling",
               lambda c: c.rollout.backend == "vllm" and c.rollout.vllm_is_cap > 0,
               "truncated importance sampling against the vLLM engine (rollout.vllm_is_cap, backend=vllm)"),
    MethodSpec("reg_grpo", "mmgrpo.methods.reg_grpo:RegGRPO", lambda c: c.algo.loss_type == "reg",
               "Reg-GRPO (DeepVideo-R1) loss share per micro-batch (algo.loss_type=reg)"),
)


# the ``methods`` section of TrainConfig: one field per registry entry that declares options
MethodsConfig = make_dataclass(
    "MethodsConfig", [(s.name, s.options, field(default_factory=s.options)) for s in REGISTRY if s.options],
    namespace={"__doc__": "Options of the methods registered in mmgrpo.methods (methods.<name>.<option>)."})
MethodsConfig.__module__ = __name__


def enabled_names(cfg: Any) -> list[str]:
    """Names of the methods ``cfg`` enables, in hook order."""
    return [s.name for s in REGISTRY if s.enabled(cfg)]


def _load(target: str) -> type[VLMMethod]:
    mod, cls = target.split(":")
    return getattr(importlib.import_module(mod), cls)


def enabled_classes(cfg: Any) -> list[type[VLMMethod]]:
    """The classes of the enabled methods (class attributes such as ``needs_whole_groups``), in hook order."""
    return [_load(s.target) for s in REGISTRY if s.enabled(cfg)]


def build_methods(cfg: Any, trainer: Any) -> list[VLMMethod]:
    """The enabled methods, constructed in registry (= hook) order."""
    return [_load(s.target)(cfg, trainer) for s in REGISTRY if s.enabled(cfg)]
