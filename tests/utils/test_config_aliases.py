"""Renamed config keys (``__config_aliases__``), ``Literal`` validation and ``check_choices``."""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from mmgrpo.utils.config import (Alias, DeprecatedConfigKey, check_choices, config_to_dict, fields_help,
                                 load_config)

from flow_grpo.config import GENERATOR_KINDS, TINY_KINDS


@dataclass
class Opt:
    __config_aliases__ = {"beta": "kl_coef", "policy": Alias("on_nonfinite", values={"raise": "error"}),
                          "beta1": Alias("betas", index=0), "beta2": Alias("betas", index=1)}

    kl_coef: float = 0.0
    on_nonfinite: Literal["drop", "error"] = "drop"
    betas: tuple[float, float] = (0.9, 0.999)


@dataclass
class Cfg:
    opt: Opt = field(default_factory=Opt)
    seed: int = 0


def _load(yaml_text: str | None, overrides, tmp_path: Path):
    path = None
    if yaml_text is not None:
        path = tmp_path / "c.yaml"
        path.write_text(yaml_text)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        cfg = load_config(Cfg, path, overrides)
    return cfg, [str(w.message) for w in rec if issubclass(w.category, DeprecatedConfigKey)]


@pytest.mark.parametrize("old,new,expect", [
    ("opt.beta=0.5", "opt.kl_coef=0.5", Opt(kl_coef=0.5)),
    ("opt.policy=raise", "opt.on_nonfinite=error", Opt(on_nonfinite="error")),  # old value spelled the new way
    ("opt.policy=drop", "opt.on_nonfinite=drop", Opt()),
    ("opt.beta2=0.95", "opt.betas=[0.9,0.95]", Opt(betas=(0.9, 0.95))),  # one item of a tuple field
])
def test_old_override_resolves_like_the_new_one_and_warns(tmp_path, old, new, expect):
    a, warned = _load(None, [old], tmp_path)
    b, none = _load(None, [new], tmp_path)
    assert a == b and a.opt == expect and none == []
    old_key, new_key = old.split("=")[0], new.split("=")[0]
    assert len(warned) == 1 and f"'{old_key}'" in warned[0] and new_key in warned[0]


def test_old_yaml_keys_resolve_like_the_new_ones_and_warn_naming_the_file(tmp_path):
    a, warned = _load("opt:\n  beta: 0.25\n  policy: raise\n  beta1: 0.5\n", [], tmp_path)
    b, _ = _load("opt:\n  kl_coef: 0.25\n  on_nonfinite: error\n  betas: [0.5, 0.999]\n", [], tmp_path)
    assert a == b == Cfg(opt=Opt(kl_coef=0.25, on_nonfinite="error", betas=(0.5, 0.999)))
    assert len(warned) == 3 and all("c.yaml" in w for w in warned)
    assert "'opt.beta' is deprecated, use 'opt.kl_coef'" in warned[0]
    assert "use 'opt.betas[0]'" in warned[2]
    c, _ = _load("opt.beta: 0.25\n", [], tmp_path)  # dotted YAML key
    assert c.opt.kl_coef == 0.25


def test_a_default_python_filter_shows_each_renamed_key_once(tmp_path):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("default")
        for _ in range(3):
            load_config(Cfg, None, ["opt.beta=1", "opt.beta2=0.5"])
    assert len([w for w in rec if issubclass(w.category, DeprecatedConfigKey)]) == 2


def test_saved_configs_hold_only_new_names(tmp_path):
    cfg, _ = _load(None, ["opt.beta=0.5"], tmp_path)
    assert config_to_dict(cfg) == {"opt": {"kl_coef": 0.5, "on_nonfinite": "drop", "betas": [0.9, 0.999]}, "seed": 0}


def test_unknown_keys_still_fail_clearly(tmp_path):
    with pytest.raises(ValueError, match=r"unknown config key 'opt\.bet'; did you mean: 'opt\.betas'"):
        load_config(Cfg, None, ["opt.bet=1"])
    (tmp_path / "u.yaml").write_text("opt:\n  betaa: 1\n")
    with pytest.raises(ValueError, match=r"u\.yaml: unknown config key 'opt\.betaa'"):
        load_config(Cfg, tmp_path / "u.yaml")


def test_bad_value_under_an_old_key_names_the_key_and_allowed_values():
    with pytest.raises(ValueError, match=r"'opt\.on_nonfinite'.*'stop'.*\['drop', 'error'\]"), \
            pytest.warns(DeprecatedConfigKey):
        load_config(Cfg, None, ["opt.policy=stop"])
    with pytest.raises(ValueError, match=r"'opt\.beta1'.*'x'.*float"), pytest.warns(DeprecatedConfigKey):
        load_config(Cfg, None, ["opt.beta1=x"])


def test_help_names_the_deprecated_keys():
    text = fields_help(Cfg)
    assert "(deprecated name: beta)" in text and "(deprecated name: beta1, beta2)" in text


def test_an_alias_table_that_shadows_a_field_or_points_nowhere_is_a_programming_error():
    @dataclass
    class Bad:
        __config_aliases__ = {"old": "missing"}
        x: int = 0

    @dataclass
    class Shadow:
        __config_aliases__ = {"x": "y"}
        x: int = 0
        y: int = 0

    for cls in (Bad, Shadow):
        with pytest.raises(TypeError, match="__config_aliases__"):
            load_config(cls, None, ["zz=1"])


def test_check_choices_names_key_and_allowed_values():
    check_choices(Cfg())
    bad = Cfg(opt=dataclasses.replace(Opt(), on_nonfinite="raise"))
    with pytest.raises(ValueError, match=r"config key 'opt\.on_nonfinite': invalid value 'raise', expected one of "
                                         r"\['drop', 'error'\]"):
        check_choices(bad)


# ------------------------------------------------------------------------------------ the two front-ends
def _vlm(overrides):
    from mmgrpo.vlm.config import TrainConfig

    return load_config(TrainConfig, None, overrides)


def _flow(overrides):
    from flow_grpo.config import load_train_config

    return load_train_config(None, overrides)


RENAMED = [  # (loader, old override, new override): every deprecated key of both configs
    (_vlm, "rollout.num_generations=4", "rollout.group_size=4"),
    (_vlm, "model.lora.r=4", "model.lora.rank=4"),
    (_vlm, "run.use_tensorboard=false", "run.tensorboard=false"),
    (_flow, "optim.beta=0.02", "optim.kl_coef=0.02"),
    (_flow, "optim.clip_range=0.3", "optim.clip_low=0.3"),
    (_flow, "optim.beta1=0.8", "optim.betas=[0.8,0.999]"),
    (_flow, "optim.beta2=0.95", "optim.betas=[0.9,0.95]"),
    (_flow, "reward.nan_policy=raise", "reward.on_nonfinite=error"),
]


@pytest.mark.parametrize("loader,old,new", RENAMED)
def test_front_end_old_names_resolve_like_the_new_ones(loader, old, new):
    with pytest.warns(DeprecatedConfigKey, match=rf"'{old.split('=')[0]}' is deprecated, use '{new.split('=')[0]}"):
        a = loader([old])
    b = loader([new])
    assert config_to_dict(a) == config_to_dict(b) and a == b
    assert a != loader([])  # the override did something


def test_flow_preset_with_old_keys_in_yaml(tmp_path):
    """The flow loader re-reads a YAML under a method preset: old keys there resolve (and the preset stays below)."""
    from flow_grpo.config import load_train_config

    (tmp_path / "old.yaml").write_text("method: fast\noptim:\n  beta: 0.01\n  clip_range: 2.0e-5\n")
    (tmp_path / "new.yaml").write_text("method: fast\noptim:\n  kl_coef: 0.01\n  clip_low: 2.0e-5\n")
    with pytest.warns(DeprecatedConfigKey):
        a = load_train_config(str(tmp_path / "old.yaml"))
    assert a == load_train_config(str(tmp_path / "new.yaml"))
    assert (a.optim.kl_coef, a.optim.clip_low, a.sample.sde_kind) == (0.01, 2e-5, "cps")


@pytest.mark.parametrize("key,value,allowed", [
    ("sample.sde_kind", "ode", "['flow', 'dance', 'cps']"),
    ("sample.window_policy", "slide", "['fixed', 'random', 'sliding', 'sliding_wrap']"),
    ("sample.ode_solver", "heun", "['euler', 'dpmpp2m']"),
    ("model.tiny", "sdxl", str(["", *TINY_KINDS])),
    ("model.kind", "sdxl", str(["auto", *GENERATOR_KINDS])),
    ("model.dtype", "fp16", "['float32', 'bfloat16', 'float16']"),
    ("reward.mode", "sum", "['weighted_sum', 'per_reward', 'win_rate']"),
    ("reward.on_nonfinite", "raise", "['drop', 'error']"),
    ("reward.on_failure", "error", "['drop', 'stop']"),
    ("optim.adv_scale", "global", "['group', 'batch', 'none']"),
    ("optim.adv_std_ddof", "2", "[0, 1]"),
    ("optim.kl_type", "k3", "['mean', 'mean_exact', 'velocity']"),
    ("optim.lr_schedule", "step", "['constant', 'linear', 'cosine']"),
    ("run.budget_clock", "gpu", "['wall', 'cpu']"),
    ("run.mixed_precision", "bf32", "['no', 'bf16', 'fp16']"),
    ("method", "grpo", "['', 'flow', 'dance', 'fast', 'mix', 'mix_flash', 'tp_grpo', 'g2rpo', 'vgpo', 'nft', "
               "'branch_grpo', 'b2', 'adv_grpo']"),
    ("methods.adv_grpo.schedule", "often", "['alternate', 'interleave']"),
])
def test_flow_enums_are_declared_and_named_in_errors(key, value, allowed):
    with pytest.raises(ValueError) as ei:
        _flow([f"{key}={value}"])
    msg = str(ei.value)
    assert f"config key '{key}'" in msg and repr(value) in msg and allowed in msg


def test_flow_method_choices_are_the_presets():
    import typing

    from flow_grpo.config import METHOD_PRESETS, TrainConfig

    assert set(typing.get_args(typing.get_type_hints(TrainConfig)["method"])) == {""} | set(METHOD_PRESETS)


def test_flow_config_built_in_python_is_checked_too():
    from flow_grpo.config import SamplingConfig, TrainConfig

    with pytest.raises(ValueError, match=r"config key 'sample\.sde_kind': invalid value 'ode', expected one of"):
        TrainConfig(sample=SamplingConfig(sde_kind="ode"))
