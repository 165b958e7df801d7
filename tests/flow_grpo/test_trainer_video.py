"""The trainer on the tiny Wan (text-to-video): rewards from the config (a per-frame image reward aggregated over
time plus temporal consistency), LoRA training, frame-strip sample grids, eval over videos, clear errors."""
import numpy as np
import pytest
import torch
from PIL import Image

from flow_grpo.config import load_train_config
from flow_grpo.train.trainer import FlowGRPOTrainer

from .conftest import train_overrides

FRAMES, H = 5, 32


def _cfg(out, method="flow", **extra):
    ov = {"model.tiny": "wan", "sample.num_frames": FRAMES, "sample.height": H, "sample.width": H,
          "sample.guidance_scale": 5.0, "sample.cfg": "true", "model.max_sequence_length": 16,
          "reward.weights": "{video_per_frame: 1.0, temporal_consistency: 0.5}",
          "reward.kwargs": "{video_per_frame: {reward: brightness, aggregate: min}}",
          "run.image_grid_every": 1, "data.eval_prompts": "[a red cube, a cat]"}
    ov.update(extra)
    return load_train_config(None, train_overrides("wan", method, out, **ov))


def test_tiny_wan_trains_lora_on_video_rewards(tmp_path):
    tr = FlowGRPOTrainer(_cfg(tmp_path, **{"run.num_epochs": 2, "optim.kl_coef": 0.01}))
    assert tr.adapter.kind == "wan" and tr.adapter.num_frames == FRAMES
    before = {n: p.detach().clone() for n, p in tr.named_params}
    hist = tr.train()
    changed = [n for n, p in tr.named_params if not torch.equal(p.detach(), before[n])]
    assert changed and all("lora_" in n for n in changed)
    t = tr.state.last_traj
    assert t.images.shape == (4, FRAMES, H, H, 3) and t.latents.shape[2:] == (4, 2, 4, 4)
    # the trained reward is the config's weighted sum of the video rewards, recomputed here by hand
    frames = t.images.numpy().reshape(4, FRAMES, -1).astype(np.float64)
    worst = frames.mean(2).min(1) / 255.0
    x = t.images.numpy().astype(np.float64)
    tc = 1 - np.abs(x[:, 1:] - x[:, :-1]).reshape(4, FRAMES - 1, -1).mean(2).mean(1) / 255.0
    torch.testing.assert_close(t.rewards["total"].double(), torch.from_numpy(worst + 0.5 * tc), atol=1e-6, rtol=0)
    m = hist[-1]
    assert m["train/ratio_mean"] == 1.0 and np.isfinite(m["train/kl"]) and "eval/reward/video_per_frame/mean" in m
    strip = Image.open(tmp_path / "samples" / "epoch_00002.png")
    assert strip.size[0] >= FRAMES * H  # one frame strip per row
    assert (tmp_path / "samples" / "eval_epoch_00002.png").is_file()


@pytest.mark.parametrize("method", ["dance", "mix_flash", "tp_grpo", "g2rpo"])
def test_each_sampler_family_trains_on_video_latents(method, tmp_path):
    """Fraction, sliding window + DPM-Solver++ completion, TP-GRPO and G2RPO ODE completions on (B, C, F', h, w)."""
    tr = FlowGRPOTrainer(_cfg(tmp_path, method, **{"run.image_grid_every": 0, "data.eval_prompts": "[]",
                                                   "sample.cfg": "false"}))
    before = {n: p.detach().clone() for n, p in tr.named_params}
    m = tr.train()[-1]
    assert any(not torch.equal(p.detach(), before[n]) for n, p in tr.named_params)
    assert np.isfinite(m["reward/total/mean"]) and tr.state.last_traj.images.shape == (4, FRAMES, H, H, 3)


def test_tiny_qwen_image_trains_lora(tmp_path):
    ov = {"model.tiny": "qwen_image", "model.max_sequence_length": 8, "sample.cfg": "true",
          "sample.guidance_scale": 4.0, "reward.weights": "{brightness: 1.0}", "data.eval_prompts": "[]"}
    tr = FlowGRPOTrainer(load_train_config(None, train_overrides("sd3", "flow", tmp_path, **ov)))
    before = {n: p.detach().clone() for n, p in tr.named_params}
    m = tr.train()[-1]
    assert tr.adapter.kind == "qwen_image" and m["train/ratio_mean"] == 1.0
    assert any(not torch.equal(p.detach(), before[n]) for n, p in tr.named_params)


def test_video_config_errors(tmp_path):
    with pytest.raises(ValueError, match="1 \\+ 4k frames"):
        FlowGRPOTrainer(_cfg(tmp_path / "a", **{"sample.num_frames": 6}))
    with pytest.raises(ValueError, match="generates images"):
        FlowGRPOTrainer(load_train_config(None, train_overrides("sd3", "flow", tmp_path / "b",
                                                                **{"model.tiny": "sd3", "sample.num_frames": 5})))
    tr = FlowGRPOTrainer(_cfg(tmp_path / "c", **{"reward.weights": "{brightness: 1.0}", "reward.kwargs": "{}",
                                                 "reward.on_failure": "stop"}))
    with pytest.raises(Exception, match="video_per_frame"):
        tr.train()
