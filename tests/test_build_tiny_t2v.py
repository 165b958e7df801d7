"""scripts/build_tiny_t2v.py: the identity Wan VAE reconstructs, the direction-noise rule is the documented one
(counted by hand), and a seconds-budget build saves a folder that loads through the Wan adapter."""
import importlib.util
import json
import random
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

ROOT = Path(__file__).resolve().parents[1]


def _builder():
    spec = importlib.util.spec_from_file_location("build_tiny_t2v", ROOT / "scripts" / "build_tiny_t2v.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_identity_vae_reconstructs_a_clip():
    from mmgrpo.synthetic.t2v import all_prompts, render_clip

    b = _builder()
    clip = render_clip(all_prompts("train", tags=["two_motion"])[0], 32, 5, seed=0)
    assert b.vae_roundtrip_error(b.identity_wan_vae(), clip) < 0.5  # uint8 levels
    # latents shortcut == the VAE's own encoder (normalised by latents_mean / std)
    pipe_like = type("P", (), {"vae": b.identity_wan_vae()})()
    x = torch.from_numpy(clip).permute(3, 0, 1, 2)[None].float() / 127.5 - 1.0
    with torch.no_grad():
        z = pipe_like.vae.encode(x).latent_dist.mode()
    assert torch.allclose(b.clip_latents(pipe_like, clip[None]), (z - 0.0) / 0.5, atol=1e-3)


def test_direction_noise_rule_by_hand():
    b = _builder()
    mover = {"prompt": "a red circle moves up", "objects": [
        {"color": "red", "shape": "circle", "count": 1, "direction": "up", "order": 0}]}
    still = {"prompt": "a blue square appears, then a green triangle", "objects": [
        {"color": "blue", "shape": "square", "count": 1, "direction": "none", "order": 0},
        {"color": "green", "shape": "triangle", "count": 1, "direction": "none", "order": 1}]}
    # p = 1: a mover always changes, to rng.choice of the other three in DIRECTIONS order (left, right, down)
    rng, ref = random.Random(5), random.Random(5)
    out, noised = b.noisy_spec(mover, rng, 1.0)
    ref.random()
    assert noised and out["objects"][0]["direction"] == ref.choice(["left", "right", "down"])
    assert mover["objects"][0]["direction"] == "up"  # input untouched
    # a spec without mover draws nothing from the rng and is unchanged
    rng = random.Random(7)
    state = rng.getstate()
    assert b.noisy_spec(still, rng, 1.0) == (still, False) and rng.getstate() == state
    # p = 0.3 on 8 movers, seed 0: the hand count of draws below 0.3
    rng, flags = random.Random(0), []
    r2 = random.Random(0)
    hand = 0
    for _ in range(8):
        u = r2.random()
        if u < 0.3:
            hand += 1
            r2.choice([0, 1, 2])  # the replacement draw consumes the rng too
        flags.append(b.noisy_spec(mover, rng, 0.3)[1])
    assert sum(flags) == hand


def test_build_tiny_budget_loads_through_adapter(tmp_path):
    b = _builder()
    out = tmp_path / "t2v"
    rc = b.main(["--out", str(out), "--seconds", "1", "--steps", "2", "--batch-size", "2", "--frames", "5",
                 "--width", "16", "--heads", "2", "--layers", "1", "--direction-noise", "0.5"])
    assert rc == 0
    info = json.loads((out / "build_info.json").read_text())
    assert 1 <= info["train_steps"] <= 2 and info["clips_drawn"] == 2 * info["train_steps"]
    assert info["vae_reconstruction"]["identity_vae_max_err_uint8"] < 0.5
    from flow_grpo.models import load_adapter

    ad = load_adapter(str(out), max_sequence_length=b.DEMO_MAX_SEQUENCE_LENGTH, num_frames=5)
    assert ad.kind == "wan" and ad.noise_shape(32, 32) == (3, 5, 32, 32)
    vid = b.generate(ad, ["a red circle moves up"], [0], steps=2, size=32)
    assert vid.shape == (1, 5, 32, 32, 3) and vid.dtype == np.uint8
