"""Trainer: every method trains on tiny SD3 / FLUX, LoRA save/reload reproduces images, advantages use explicit
group ids, config presets, CLI help. (Exact resume after SIGKILL: test_trainer_resume.py.)"""
import json
import subprocess
import sys

import pytest
import torch

from flow_grpo.data import epoch_samples
from flow_grpo.train import steps
from flow_grpo.config import TrainConfig, load_train_config
from flow_grpo.sampler import generate_images, sample_trajectories
from flow_grpo.data import load_prompts
from flow_grpo.train.trainer import FlowGRPOTrainer

from .conftest import block_reward, make_adapter, make_trainer, train_overrides


def _overrides(kind, method, out, **extra):
    return train_overrides(kind, method, out, **extra)


def _trainer(kind, method, out, **extra):
    return make_trainer(kind, method, out, **extra)


# every method on one architecture and each architecture with several methods (both adapters' sampling and
# scoring paths are also checked step by step in test_sampler / test_models)
@pytest.mark.parametrize("kind,method,extra", [
    ("sd3", "flow", {"optim.kl_coef": 0.01}), ("flux", "dance", {}),
    ("flux", "fast", {"optim.kl_coef": 0.01, "optim.kl_type": "velocity"}), ("sd3", "fast", {}),
    ("sd3", "tp_grpo", {}), ("flux", "tp_grpo", {}), ("sd3", "g2rpo", {}),
])
def test_each_method_trains_lora(kind, method, extra, tmp_path):
    tr = _trainer(kind, method, tmp_path, **extra)
    before = {n: p.detach().clone() for n, p in tr.named_params}
    hist = tr.train()
    m = hist[-1]
    changed = [n for n, p in tr.named_params if not torch.equal(p.detach(), before[n])]
    assert changed and all("lora_" in n for n in changed)
    assert m["train/ratio_mean"] == 1.0  # one update per epoch: fully on-policy
    assert m["nfe_per_trajectory"] >= 4
    assert (tmp_path / "checkpoints").exists()
    if method == "tp_grpo":
        assert "tp/frac_kept" in m and m["nfe_per_trajectory"] > (8 if kind == "sd3" else 4)
    if extra.get("optim.kl_coef"):
        assert "train/kl" in m


def test_outcome_advantages_use_group_ids_not_prompts(tmp_path):
    # group std (not the flow preset's batch std) so that both statistics would pool a wrong group
    tr = _trainer("sd3", "flow", tmp_path, **{"sample.cfg": "false", "optim.adv_scale": "group",
                                              "optim.adv_std_ddof": 1})
    prompts, meta, gids, xs, ns, ps = epoch_samples(tr.cfg, tr.prompts, tr.metadata, 0)
    # same prompt text in two different groups must not be pooled: force identical prompts
    prompts = ["same"] * len(prompts)
    traj = sample_trajectories(tr.adapter, prompts, tr.cfg.sample, xs, ns, ps, gids, meta, block_reward)
    adv, _ = steps.advantages(tr, traj)
    r = traj.rewards["total"]
    for g in set(gids):
        idx = [i for i, x in enumerate(gids) if x == g]
        rg = r[idx]
        expect = (rg - rg.mean()) / (rg.std() + 1e-4)
        torch.testing.assert_close(adv[idx][traj.train_mask[idx]].view(len(idx), -1)[:, 0],
                                   expect.clamp(-5, 5), atol=1e-5, rtol=1e-5)
    assert adv.shape == traj.train_mask.shape


def test_saved_lora_reloads_into_pipeline_and_reproduces_images(tmp_path, roundtrip):
    from diffusers import StableDiffusion3Pipeline

    from flow_grpo.models import adapter_from_pipeline
    from flow_grpo.models.tiny import build_tiny_sd3_pipeline

    tr = _trainer("sd3", "flow", tmp_path, **{"run.save_every": 1})
    tr.train()
    lora_dir = tmp_path / "checkpoints" / "epoch-00000001" / "lora"
    assert (lora_dir / "pytorch_lora_weights.safetensors").is_file()
    cfg = tr.cfg.sample
    # images of the trained adapter: the trained weights are what lora/ holds (the EMA goes to lora_ema/)

    def images(ad):
        return generate_images(ad, ["a cat", "a dog"], [1, 2], cfg)

    def velocity(ad):  # one step from pure noise: float output, no uint8 rounding to hide small differences
        ad.set_resolution(cfg.height, cfg.width)
        x = ad.initial_noise([1, 2], cfg.height, cfg.width)
        with torch.no_grad():
            return ad.predict_velocity(x, 1.0, ad.encode_prompts(["a cat", "a dog"]), cfg.guidance_scale, cfg.cfg)

    def lora_weights(ad):  # diffusers names the reloaded adapter default_0
        return {n.replace(".default_0.", ".default."): p.detach().clone()
                for n, p in ad.transformer.named_parameters() if "lora_" in n}

    trained, v_trained, w_trained = images(tr.adapter), velocity(tr.adapter), lora_weights(tr.adapter)
    base_ad = adapter_from_pipeline(build_tiny_sd3_pipeline(seed=0), max_sequence_length=16)
    base, v_base = images(base_ad), velocity(base_ad)
    pipe = build_tiny_sd3_pipeline(seed=0)
    pipe.load_lora_weights(str(lora_dir))
    ad = adapter_from_pipeline(pipe, max_sequence_length=16)
    # Across save/load (conftest.RoundTrip): LoRA weights bit for bit; velocities (|v| ~ 2) to 1e-5, ~40 float32
    # ulps; images to one uint8 level. The trained LoRA moves them by ~8e-2 and ~35 levels: a LoRA lost or scaled
    # wrongly on reload fails both.
    roundtrip.same_weights(lora_weights(ad), w_trained)
    assert (v_trained - v_base).abs().max() > 1e-3 and (trained.int() - base.int()).abs().max() > 5
    roundtrip.close(velocity(ad), v_trained, atol=1e-5)
    roundtrip.images_close(images(ad), trained)
    assert isinstance(pipe, StableDiffusion3Pipeline)


def test_config_presets_and_errors(tmp_path):
    cfg = load_train_config(None, ["method=tp_grpo", "sample.window_size=4"])
    assert cfg.sample.credit == "tp_grpo" and cfg.sample.window_size == 4 and cfg.sample.sde_kind == "cps"
    y = tmp_path / "c.yaml"
    y.write_text("method: g2rpo\nsample:\n  noise_level: 0.5\nreward:\n  weights: {brightness: 2.0}\n")
    cfg = load_train_config(str(y), [])
    assert cfg.sample.step_mode == "single" and cfg.sample.noise_level == 0.5  # YAML beats the preset
    assert cfg.reward.weights == {"brightness": 2.0}
    with pytest.raises(ValueError):
        load_train_config(None, ["method=nope"])
    with pytest.raises(ValueError):
        load_train_config(None, ["sample.no_such_key=1"])
    with pytest.raises(ValueError, match="sample.cfg=false"):
        FlowGRPOTrainer(load_train_config(None, _overrides("flux", "flow", tmp_path, **{"sample.cfg": "true"})),
                        adapter=make_adapter("flux", lora=False), reward_fn={"block": block_reward})


@pytest.mark.parametrize("key,value,listed", [("sample.credit", "tp", "outcome"), ("sample.step_mode", "every", "window")])
def test_unknown_registry_names_fail_when_the_trainer_is_built(key, value, listed, tmp_path):
    """sample.credit / sample.step_mode name rows of the flow_grpo.methods tables (a method registered at run time
    needs no config edit), so they are plain strings, not Literals; an unknown name fails when the trainer is built,
    before anything is sampled, and the message lists the table's names."""
    cfg = load_train_config(None, _overrides("sd3", "flow", tmp_path, **{key: value}))
    with pytest.raises(ValueError) as ei:
        FlowGRPOTrainer(cfg, adapter=make_adapter("sd3", lora=False), reward_fn={"block": block_reward})
    assert repr(value) in str(ei.value) and listed in str(ei.value), str(ei.value)


def test_load_prompts(tmp_path):
    t = tmp_path / "p.txt"
    t.write_text("a cat\n\n a dog \n")
    assert load_prompts(str(t)) == (["a cat", "a dog"], [{}, {}])
    j = tmp_path / "p.jsonl"
    j.write_text(json.dumps({"prompt": "two cats", "tag": "counting", "include": [{"class": "cat", "count": 2}]})
                 + "\n{bad json\n")
    with pytest.raises(ValueError, match="p.jsonl:2"):
        load_prompts(str(j))
    j.write_text(json.dumps({"prompt": "two cats", "tag": "counting"}) + "\n")
    assert load_prompts(str(j)) == (["two cats"], [{"tag": "counting"}])
    j.write_text(json.dumps({"text": "x"}) + "\n")
    with pytest.raises(ValueError, match="p.jsonl:1.*prompt"):
        load_prompts(str(j))


def test_cli_help_lists_every_option():
    from mmgrpo.utils.config import iter_fields

    out = subprocess.run([sys.executable, "-m", "flow_grpo.cli", "train", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    fields = list(iter_fields(TrainConfig))
    assert len(fields) > 90
    text = " ".join(out.stdout.split())  # help text is wrapped
    for name, _tp, _default, help_text, _section in fields:
        assert help_text, f"{name} has no help text"
        assert f"{name} " in out.stdout or f"{name}:" in out.stdout, name
        assert " ".join(help_text.split())[:40] in text, name
    assert "train.lr" not in out.stdout and "optim.lr=1e-4" in out.stdout
    assert "torch" not in subprocess.run(
        [sys.executable, "-c", "import sys, flow_grpo.cli, flow_grpo.config; print(' '.join(sys.modules))"],
        capture_output=True, text=True, timeout=60).stdout.split()


def test_refuses_a_launch_that_would_train_independent_copies(tmp_path, monkeypatch):
    """A launcher started 2 processes but accelerate runs 1 per process (e.g. no GPU and run.device=cuda): each would
    optimise its own copy (DanceGRPO#110). The trainer must refuse."""
    from accelerate import Accelerator

    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = load_train_config(None, train_overrides("flux", "fast", tmp_path))
    with pytest.raises(RuntimeError, match="launched with 2 processes but accelerate runs 1"):
        FlowGRPOTrainer(cfg, adapter=make_adapter("flux", lora=False), reward_fn={"block": block_reward},
                        accelerator=Accelerator())
