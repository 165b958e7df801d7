"""Synthetic samples and a text-dependent reward for trainer tests."""
import torch


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
