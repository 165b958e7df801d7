"""The trainer on each 2026 generator's tiny pipeline (``model.tiny=<kind>``): two epochs of LoRA GRPO, only LoRA
weights move, the first update of each epoch is on-policy (ratio exactly 1), rewards are finite.

Each row: (kind, height/width, sample.cfg, guidance scale, extra overrides). The generator-specific behaviour
(pipeline equality, schedules, round trips) is tested in ``test_models_<kind>.py``."""
import numpy as np
import pytest
import torch

from flow_grpo.config import load_train_config
from flow_grpo.trainer import FlowGRPOTrainer

from .conftest import train_overrides

CASES = [
    ("sd3_5_large", 64, "true", 4.5, {}),
    ("flux2", 32, "false", 4.0, {}),
    ("flux2_klein", 32, "true", 4.0, {}),
    ("z_image", 32, "true", 5.0, {"model.max_sequence_length": 48}),
    ("qwen_image21", 64, "false", 1.0, {"model.max_sequence_length": 64}),
]

KIND_OF_TINY = {"sd3_5_large": "sd3"}  # a tiny variant of a registered adapter kind


@pytest.mark.parametrize("kind,size,cfg,gs,extra", CASES, ids=[c[0] for c in CASES])
def test_generator_trains_lora_two_epochs(kind, size, cfg, gs, extra, tmp_path):
    ov = {"model.tiny": kind, "sample.height": size, "sample.width": size, "sample.cfg": cfg,
          "sample.guidance_scale": gs, "model.max_sequence_length": 16, "reward.weights": "{brightness: 1.0}",
          "data.eval_prompts": "[]", "run.num_epochs": 2, "optim.kl_coef": 0.01}
    ov.update(extra)
    tr = FlowGRPOTrainer(load_train_config(None, train_overrides("sd3", "flow", tmp_path, **ov)))
    assert tr.adapter.kind == KIND_OF_TINY.get(kind, kind)
    before = {n: p.detach().clone() for n, p in tr.named_params}
    hist = tr.train()
    assert len(hist) == 2
    changed = [n for n, p in tr.named_params if not torch.equal(p.detach(), before[n])]
    assert changed and all("lora_" in n for n in changed)
    for m in hist:
        assert m["train/ratio_mean"] == 1.0 and np.isfinite(m["reward/total/mean"]) and np.isfinite(m["train/kl"])
