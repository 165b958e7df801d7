"""Tiny Qwen-VL checkpoints + synthetic samples for trainer tests (CPU, one thread: the machine is shared)."""
import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    from mmgrpo.models.tiny import save_tiny_model

    root = tmp_path_factory.mktemp("tiny_vl_trainer")
    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = save_tiny_model(root / family, family)
        return cache[family]

    return get
