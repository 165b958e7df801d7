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


def train_overrides(kind: str, method: str, out, **extra) -> list[str]:
    """Tiny-run overrides (64 px, 4 steps, 2x2 samples, LoRA r=4) shared by the trainer tests."""
    ov = {
        "method": method, "sample.num_steps": 4, "sample.height": H, "sample.width": W, "sample.batch_size": 4,
        "sample.window_size": 2, "sample.window_range": "[0,3]", "sample.single_steps": "[0,1,2]",
        "sample.cfg": "true" if kind == "sd3" else "false", "sample.guidance_scale": 4.5 if kind == "sd3" else 3.5,
        "data.group_size": 2, "data.groups_per_epoch": 2, "data.prompts": "[a cat, a dog, a bird]",
        "model.lora.rank": 4, "model.lora.alpha": 8, "optim.lr": 1e-2, "optim.clip_range": 0.2,
        "run.num_epochs": 1, "run.output_dir": str(out), "run.save_every": 0, "run.image_grid_every": 0,
        "run.tensorboard": "false", "run.reward_curves": "false", "ema.update_every": 1, "ema.decay": 0.5, "reward.retry_backoff": 0.0,
    }
    ov.update(extra)
    return [f"{k}={v}" for k, v in ov.items()]


def make_trainer(kind: str, method: str, out, rewards=None, **extra):
    """A FlowGRPOTrainer on a tiny pipeline with injected reward components (default: ``block``)."""
    from flow_grpo.config import load_train_config
    from flow_grpo.trainer import FlowGRPOTrainer

    cfg = load_train_config(None, train_overrides(kind, method, out, **extra))
    return FlowGRPOTrainer(cfg, adapter=make_adapter(kind, lora=False), reward_fn=rewards or {"block": block_reward})
