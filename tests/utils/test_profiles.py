"""``--profile cpu`` (issue 32 item 11): the CPU rehearsal's overrides reach each of the four entry points that take
it, after the recipe and before the command line's own ``key=value`` (which win); every key of every profile is a
setting its config has (a renamed setting would otherwise break the rehearsal silently at the first run)."""
from pathlib import Path

import pytest
import yaml

from mmgrpo.utils.profiles import PROFILES, expand_profile

REPO = Path(__file__).resolve().parents[2]


def _printed(main, argv, capsys) -> dict:
    try:
        rc = main(argv)
    except SystemExit as e:  # parse_config_cli exits 0 after --print-config
        rc = e.code
    out = capsys.readouterr().out
    assert rc in (0, None), out
    return yaml.safe_load(out)


def _get(cfg: dict, dotted: str):
    for k in dotted.split("."):
        cfg = cfg[k]
    return cfg


def _same(got, spelled: str) -> bool:  # a printed config value against the override's spelling
    if isinstance(got, bool):
        return str(got).lower() == spelled
    if isinstance(got, (int, float)):
        return float(got) == float(spelled)
    return str(got) == spelled


def _check_profile(cfg: dict, kind: str, user: dict) -> None:
    for ov in PROFILES["cpu"][kind]:
        key, value = ov.split("=", 1)
        if key in user:
            continue
        assert _same(_get(cfg, key), value), (kind, key, _get(cfg, key))
    for key, value in user.items():
        assert _get(cfg, key) == value, (kind, key)


def test_expand_profile_puts_the_profile_before_the_command_lines_overrides(capsys):
    argv = ["--config", "r.yaml", "run.max_steps=5", "--profile", "cpu", "model.dtype=float32"]
    got = expand_profile(argv, "vlm", "mmgrpo train")
    assert got == ["--config", "r.yaml", *PROFILES["cpu"]["vlm"], "run.max_steps=5", "model.dtype=float32"]
    assert expand_profile(["run.max_steps=5"], "vlm", "p") == ["run.max_steps=5"]  # no --profile: unchanged
    for bad in (["--profile", "gpu"], ["--profile"]):
        with pytest.raises(SystemExit) as e:
            expand_profile(bad, "vlm", "mmgrpo train")
        assert e.value.code == 2
    assert "cpu" in capsys.readouterr().err


def test_mmgrpo_train_profile_cpu(capsys):
    from mmgrpo.vlm.cli import train_main

    cfg = _printed(train_main, ["--config", str(REPO / "configs/vlm/time_r1_charades.yaml"), "--profile", "cpu",
                                "run.max_steps=3", "--print-config"], capsys)
    _check_profile(cfg, "vlm", {"run.max_steps": 3})
    assert cfg["data"]["prompt_template"] == "time_r1_v1"  # the recipe's own settings stay


def test_flow_grpo_train_profile_cpu(capsys):
    from flow_grpo.cli import main

    cfg = _printed(main, ["train", "--config", str(REPO / "configs/flow/flow_grpo_sd35_pickscore.yaml"), "--profile",
                          "cpu", "run.num_epochs=3", "--print-config"], capsys)
    _check_profile(cfg, "flow", {"run.num_epochs": 3})
    assert cfg["method"] == "flow"


@pytest.mark.parametrize("script, config, kind, user", [
    ("generate_vlm", "charades_sta.yaml", "eval_vlm", {"data.max_samples": 4}),
    ("generate_t2i", "mini_geneval.yaml", "eval_t2i", {"max_prompts": 3}),
])
def test_evaluation_scripts_profile_cpu(script, config, kind, user, capsys):
    import importlib

    mod = importlib.import_module(f"eval.{script}")
    argv = ["--config", str(REPO / "eval/configs" / config), "--profile", "cpu",
            *[f"{k}={v}" for k, v in user.items()], "--print-config"]
    _check_profile(_printed(mod.main, argv, capsys), kind, user)
