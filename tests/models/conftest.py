"""Tiny Qwen-VL checkpoints saved once per session and loaded back with from_pretrained."""
import pytest


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
