"""Shared fixtures for the flow_grpo tests: tiny pipelines (built in ms), a toy reward, 1 torch thread.

The machine has 2 cores shared by several people; torch's default intra-op threading makes the tiny models
~8x slower under contention, so the flow_grpo tests run single-threaded."""
import pytest
import torch

torch.set_num_threads(1)

H = W = 64  # tiny VAE has scale factor 8 -> 8x8 latents (FLUX: 16 packed tokens)


def brightness_reward(images, prompts, metadata):
    """Toy reward: mean brightness in [0, 1] (stands in for flow_grpo.rewards until it exists)."""
    x = torch.as_tensor(images).float()
    return {"brightness": x.mean(dim=(1, 2, 3)) / 255.0}


def block_reward(images, prompts, metadata):
    """Toy reward sensitive to the noise seed: mean of the top-left 8x8 block in [0, 1] (the tiny model's global
    brightness barely depends on x_T, so tests that must tell two x_T apart use this one)."""
    x = torch.as_tensor(images).float()
    return {"block": x[:, :8, :8].mean(dim=(1, 2, 3)) / 255.0}


@pytest.fixture
def toy_reward():
    return brightness_reward


def make_adapter(kind: str, lora: bool = True, seed: int = 0):
    from flow_grpo.models import adapter_from_pipeline
    from flow_grpo.models.tiny import build_tiny_flux_pipeline, build_tiny_sd3_pipeline

    pipe = build_tiny_sd3_pipeline(seed) if kind == "sd3" else build_tiny_flux_pipeline(seed)
    ad = adapter_from_pipeline(pipe, max_sequence_length=16)
    if lora:
        torch.manual_seed(seed + 1)
        ad.add_lora(rank=4, alpha=8)
    return ad
