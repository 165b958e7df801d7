"""Tiny Qwen-VL checkpoints saved once per session and loaded back with from_pretrained."""
import pytest
import torch

torch.set_num_threads(1)  # the 2-core machine is shared: oversubscription makes 2 threads 5x slower


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    from mmgrpo.models.tiny import save_tiny_model

    root = tmp_path_factory.mktemp("tiny_vl")
    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = save_tiny_model(root / family, family)
        return cache[family]

    return get
