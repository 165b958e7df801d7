"""``Literal`` validation, ``check_choices`` and unknown keys of both front-ends' configs."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import pytest

from mmgrpo.utils.config import check_choices, load_config


@dataclass
class Opt:
    kl_coef: float = 0.0
    on_nonfinite: Literal["drop", "error"] = "drop"
    betas: tuple[float, float] = (0.9, 0.999)


@dataclass
class Cfg:
    opt: Opt = field(default_factory=Opt)
    seed: int = 0


def test_unknown_keys_fail_clearly(tmp_path):
    with pytest.raises(ValueError, match=r"unknown config key 'opt\.bet'; did you mean: 'opt\.betas'"):
        load_config(Cfg, None, ["opt.bet=1"])
    (tmp_path / "u.yaml").write_text("opt:\n  betaa: 1\n")
    with pytest.raises(ValueError, match=r"u\.yaml: unknown config key 'opt\.betaa'"):
        load_config(Cfg, tmp_path / "u.yaml")


def test_check_choices_names_key_and_allowed_values():
    check_choices(Cfg())
    bad = Cfg(opt=dataclasses.replace(Opt(), on_nonfinite="raise"))
    with pytest.raises(ValueError, match=r"config key 'opt\.on_nonfinite': invalid value 'raise', expected one of "
                                         r"\['drop', 'error'\]"):
        check_choices(bad)


# ------------------------------------------------------------------------------------ the two front-ends
def _flow(overrides):
    from flow_grpo.config import load_train_config

    return load_train_config(None, overrides)


@pytest.mark.parametrize("key,value,allowed", [
    ("sample.sde_kind", "ode", "['flow', 'dance', 'cps']"),
    ("sample.window_policy", "slide", "['fixed', 'random', 'sliding', 'sliding_wrap']"),
    ("sample.ode_solver", "heun", "['euler', 'dpmpp2m']"),
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

    from flow_grpo.config import TrainConfig, preset_names

    assert set(typing.get_args(typing.get_type_hints(TrainConfig)["method"])) == {""} | set(preset_names())


def test_flow_config_built_in_python_is_checked_too():
    from flow_grpo.config import SamplingConfig, TrainConfig

    with pytest.raises(ValueError, match=r"config key 'sample\.sde_kind': invalid value 'ode', expected one of"):
        TrainConfig(sample=SamplingConfig(sde_kind="ode"))
