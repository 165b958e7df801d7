"""Tiny Qwen-VL checkpoints + synthetic samples for trainer tests (CPU, one thread: the machine is shared)."""
import types

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    from mmgrpo.vlm.models.tiny import save_tiny_model

    root = tmp_path_factory.mktemp("tiny_vl_trainer")
    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = save_tiny_model(root / family, family)
        return cache[family]

    return get


def video_samples(n, frames=4, size=56):
    from mmgrpo.vlm.models.tiny import synthetic_frames

    return [{"id": f"v{i}", "task": "tvg", "query": "a square moves", "video": synthetic_frames(i, frames, size, size),
             "meta": {"video_fps": 2.0}, "duration": frames / 2.0, "spans": [[0.5, 1.5]]} for i in range(n)]


def image_samples(n, size=56):
    from mmgrpo.vlm.models.tiny import synthetic_image

    return [{"id": f"i{i}", "task": "mcq", "query": "which colour?", "image": synthetic_image(i, size, size),
             "options": ["red", "green", "blue"], "answer": "B"} for i in range(n)]


def text_reward(texts, samples):
    """Deterministic reward that varies within a group: (sum of code points mod 7) / 6."""
    acc = torch.tensor([float(sum(map(ord, t)) % 7) / 6.0 for t in texts])
    return {"acc": acc, "total": acc.clone(), "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}


def make_cfg(tmp_path, model_dir, *overrides):
    """A small, fast trainer config (tiny model, 2 prompts x G=4, 6 new tokens, no checkpoints) + overrides."""
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.utils.config import load_config

    base = [f"model.path={model_dir}", "model.dtype=float32", "data.task=tvg", "data.prompt_mode=no_think",
            "data.video_min_pixels=3136", "data.video_max_pixels=3136", "data.image_min_pixels=3136",
            "data.image_max_pixels=3136", "rollout.group_size=4", "rollout.max_new_tokens=6",
            "run.max_steps=2", "run.prompts_per_device=2", "run.micro_batch_size=8", "optim.lr=0.01",
            "optim.weight_decay=0", "optim.max_grad_norm=0", f"run.output_dir={tmp_path / 'run'}",
            "run.tensorboard=false", "run.save_every=0", "run.resume_from=none"]
    return load_config(TrainConfig, None, base + list(overrides))


def trainable(tr):
    return {n: p.detach().clone() for n, p in tr.model.named_parameters() if p.requires_grad}


@pytest.fixture(scope="session")
def th():
    """Helpers: synthetic samples, a text-dependent reward, the base test config and a weight snapshot."""
    return types.SimpleNamespace(video_samples=video_samples, image_samples=image_samples, text_reward=text_reward,
                                 make_cfg=make_cfg, trainable=trainable)
