"""The trainer on each 2026 generator's tiny pipeline (``model.tiny=<kind>``): two epochs of LoRA GRPO, only LoRA
weights move, the first update of each epoch is on-policy (ratio exactly 1), rewards are finite.

Each row: (kind, height/width, sample.cfg, guidance scale, extra overrides). The generator-specific behaviour
(pipeline equality, schedules, round trips) is tested in ``test_models_<kind>.py``.  The default suite trains one
generator per model family; a second member of a family whose trainer path another default test already runs
(SD3.5-large: SD3's, everywhere; FLUX.2-klein: FLUX.2's; Wan2.2 TI2V-5B: Wan2.2's; Qwen-Image 2.1: Qwen-Image's in
``test_trainer_video.py``) is in the ``extended`` tier (``bash scripts/test.sh --full``)."""
import numpy as np
import pytest
import torch

from flow_grpo.config import load_train_config
from flow_grpo.train.trainer import FlowGRPOTrainer

from .conftest import train_overrides

VIDEO = {"reward.weights": "{video_per_frame: 1.0}", "reward.kwargs": "{video_per_frame: {reward: brightness}}"}
EXTENDED = pytest.mark.extended
CASES = [
    pytest.param("sd3_5_large", 64, "true", 4.5, {}, marks=EXTENDED),
    ("flux2", 32, "false", 4.0, {}),
    pytest.param("flux2_klein", 32, "true", 4.0, {}, marks=EXTENDED),
    ("z_image", 32, "true", 5.0, {"model.max_sequence_length": 48}),
    pytest.param("qwen_image21", 64, "false", 1.0, {"model.max_sequence_length": 64}, marks=EXTENDED),
    ("sana", 128, "true", 4.5, {"model.max_sequence_length": 32}),
    ("wan22", 32, "true", 5.0, {"sample.num_frames": 5, **VIDEO}),  # A14B: both experts trained, every step (flow: all)
    # the two costliest rows (measured with two groups per epoch: ~5 and ~15 CPU-s; HunyuanVideo's pipeline fixes
    # 1,000 text tokens): one group of 2 per epoch, which still trains two epochs with a non-zero advantage
    ("ltx2", 32, "true", 3.0, {"sample.num_frames": 5, "data.groups_per_epoch": 1, **VIDEO}),
    ("hunyuan_video15", 64, "false", 6.0, {"sample.num_frames": 5, "model.max_sequence_length": 1000,
                                           "data.groups_per_epoch": 1, **VIDEO}),
    pytest.param("wan22_ti2v", 64, "true", 5.0, {"sample.num_frames": 5, **VIDEO}, marks=EXTENDED),
]

KIND_OF_TINY = {"sd3_5_large": "sd3", "wan22_ti2v": "wan22"}  # a tiny variant of a registered adapter kind


@pytest.mark.parametrize("kind,size,cfg,gs,extra", CASES,
                         ids=[c.values[0] if hasattr(c, "values") else c[0] for c in CASES])
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


@pytest.mark.parametrize("expert,window", [("low", "[1,3]"), ("high", "[0,1]")])
def test_wan22_trains_only_one_expert(expert, window, tmp_path):
    """model.kind=wan22_low / wan22_high: LoRA on one expert only, trained on its steps (the 4-step grid's step 0 is
    the high-noise expert's, steps 1-3 the low-noise one's: a fixed window inside them); the other does not move."""
    from flow_grpo.models import TINY_BUILDERS
    from flow_grpo.models.wan22 import Wan22HighAdapter, Wan22LowAdapter

    lo, hi = (int(v) for v in window.strip("[]").split(","))
    ov = {"sample.height": 32, "sample.width": 32, "sample.cfg": "true", "sample.guidance_scale": 5.0,
          "sample.num_frames": 5, "model.max_sequence_length": 16, **VIDEO,
          "data.eval_prompts": "[]", "run.num_epochs": 2, "optim.kl_coef": 0.01, "sample.step_mode": "window",
          "sample.window_policy": "fixed", "sample.window_size": hi - lo, "sample.window_range": window}
    cls = {"low": Wan22LowAdapter, "high": Wan22HighAdapter}[expert]
    ad = cls(TINY_BUILDERS["wan22"](seed=42), num_frames=5, max_sequence_length=16)
    assert ad.expert_steps(4, 32, 32) == {"high": [0], "low": [1, 2, 3]}
    other = "high" if expert == "low" else "low"
    other_before = {n: p.detach().clone() for n, p in ad.experts[other].named_parameters()}
    tr = FlowGRPOTrainer(load_train_config(None, train_overrides("sd3", "flow", tmp_path, **ov)), adapter=ad)
    before = {n: p.detach().clone() for n, p in tr.named_params}
    hist = tr.train()
    assert len(hist) == 2 and all(m["train/ratio_mean"] == 1.0 for m in hist)
    changed = [n for n, p in tr.named_params if not torch.equal(p.detach(), before[n])]
    assert changed and all("lora_" in n for n in changed)
    assert all(torch.equal(p, other_before[n]) for n, p in ad.experts[other].named_parameters())


def test_wan22_i2v_trains_from_a_jsonl_prompt_file_with_reference_images(tmp_path):
    """Wan2.2 A14B I2V: the trainer binds each JSONL line's ``image`` and trains both experts' LoRA two epochs."""
    import numpy as np
    from PIL import Image

    for name, seed in (("a.png", 1), ("b.png", 2)):
        Image.fromarray(np.random.default_rng(seed).integers(0, 256, (32, 48, 3), dtype=np.uint8)).save(tmp_path / name)
    src = tmp_path / "clips.jsonl"
    src.write_text('{"prompt": "it moves", "image": "a.png"}\n{"prompt": "it jumps", "image": "b.png"}\n')
    ov = {"model.tiny": "wan22_i2v", "sample.height": 32, "sample.width": 32, "sample.cfg": "true",
          "sample.guidance_scale": 5.0, "sample.num_frames": 5, "model.max_sequence_length": 16, **VIDEO,
          "data.train_path": str(src), "data.eval_prompts": "[]", "run.num_epochs": 2}
    tr = FlowGRPOTrainer(load_train_config(None, train_overrides("sd3", "flow", tmp_path / "run", **ov)))
    assert tr.adapter.kind == "wan22_i2v" and set(tr.adapter.reference_images) == {"it moves", "it jumps"}
    before = {n: p.detach().clone() for n, p in tr.named_params}
    hist = tr.train()
    assert len(hist) == 2 and all(m["train/ratio_mean"] == 1.0 for m in hist)
    changed = [n for n, p in tr.named_params if not torch.equal(p.detach(), before[n])]
    assert any(n.startswith("high.") for n in changed) and any(n.startswith("low.") for n in changed)
