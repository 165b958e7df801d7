"""Every shipped accelerate config parses with accelerate's own loader and names a known distributed type."""
from pathlib import Path

import pytest

CONFIG_DIR = Path(__file__).resolve().parents[1] / "scripts" / "accelerate_configs"


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_accelerate_config_loads(path):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    cfg = load_config_from_file(str(path))
    assert isinstance(cfg, ClusterConfig)
    assert str(cfg.distributed_type).split(".")[-1] in {"NO", "MULTI_GPU", "MULTI_CPU", "FSDP", "DEEPSPEED"}
    assert cfg.num_processes >= 1


def test_expected_configs_present():
    names = {p.stem for p in CONFIG_DIR.glob("*.yaml")}
    assert {"single_gpu", "multi_gpu", "fsdp", "deepspeed_zero2", "deepspeed_zero3", "multi_node"} <= names
