"""Tiny Qwen-VL checkpoints + synthetic samples for trainer tests (CPU, one thread: the machine is shared)."""
import types

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


def video_samples(n, frames=4, size=56):
    from mmgrpo.models.tiny import synthetic_frames

    return [{"id": f"v{i}", "task": "tvg", "query": "a square moves", "video": synthetic_frames(i, frames, size, size),
             "meta": {"video_fps": 2.0}, "duration": frames / 2.0, "spans": [[0.5, 1.5]]} for i in range(n)]


def image_samples(n, size=56):
    from mmgrpo.models.tiny import synthetic_image

    return [{"id": f"i{i}", "task": "mcq", "query": "which colour?", "image": synthetic_image(i, size, size),
             "options": ["red", "green", "blue"], "answer": "B"} for i in range(n)]


def text_reward(texts, samples):
    """Deterministic reward that varies within a group: (sum of code points mod 7) / 6."""
    acc = torch.tensor([float(sum(map(ord, t)) % 7) / 6.0 for t in texts])
    return {"acc": acc, "total": acc.clone(), "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}


@pytest.fixture(scope="session")
def th():
    """Helpers: synthetic samples and a text-dependent reward."""
    return types.SimpleNamespace(video_samples=video_samples, image_samples=image_samples, text_reward=text_reward)
