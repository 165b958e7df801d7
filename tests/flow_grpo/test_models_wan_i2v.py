"""Wan2.1 I2V adapter: equality with ``WanImageToVideoPipeline.__call__`` from the same x_T (bitwise: same process,
same computation), the first-frame condition (mask by hand, causal VAE latents), errors, the sampler's exact
log-probs with reference images from the table, and the ``from_pretrained`` folder round trip.

``WanImageToVideoPipeline`` takes one image per call (its condition latents are repeated over the batch), so the
batched comparison gives both prompts the same image and hands the pipeline our text embeddings."""
import numpy as np
import pytest
import torch
from PIL import Image

from flow_grpo.models import load_adapter
from flow_grpo.models import save_tiny_pipeline

from .conftest import as_uint8, tiny_adapter, tiny_ode

H = W = 32  # latent 4x4
FRAMES = 5  # -> 2 latent frames
STEPS = 4


def _i2v(seed=0, **kw):
    ad = tiny_adapter("wan_i2v", seed, num_frames=FRAMES, **kw)
    ad.set_resolution(H, W)
    return ad


def _image(h, w, seed):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def test_wan_i2v_ode_matches_pipeline_call_bitwise():
    """From the prompt string and the image (40x56, resized by both to 32x32), CFG 5: latents and frames are the
    pipeline's bit for bit; dropping the image embeddings or the condition latents breaks the equality."""
    ad = _i2v()
    assert ad.kind == "wan_i2v" and ad.max_sequence_length == 512 and ad.noise_shape(H, W) == (4, 2, 4, 4)
    img = _image(40, 56, 0)
    emb = ad.encode_prompts(["a photo of a cat"], images=[img])
    assert emb.image_embeds.shape == (1, 17, 32) and emb.cond_latents.shape == (1, 8, 2, 4, 4)
    ours = tiny_ode(ad, emb, [3], 5.0, True, STEPS, H, W)
    kw = dict(height=H, width=W, num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=5.0,
              latents=ad.initial_noise([3], H, W))
    ref = ad.pipe(img, "a photo of a cat", output_type="latent", **kw).frames
    assert torch.equal(ours, ref)
    video = ad.decode(ours, H, W)
    assert video.shape == (1, FRAMES, H, W, 3) and video.float().std() > 1
    assert torch.equal(video, as_uint8(ad.pipe(img, "a photo of a cat", output_type="np", **kw).frames))
    for field in ("image_embeds", "cond_latents"):
        broken = emb.index([0])
        setattr(broken, field, torch.zeros_like(getattr(emb, field)))
        assert not torch.equal(tiny_ode(ad, broken, [3], 5.0, True, STEPS, H, W), ref), field


@pytest.mark.parametrize("gs,cfg", [(5.0, True), (1.0, False)])
def test_wan_i2v_batched_loop_matches_pipeline_call_bitwise(gs, cfg):
    ad = _i2v()
    img = _image(32, 32, 1)
    emb = ad.encode_prompts(["a photo of a cat", "a dog"], images=[img, img])
    ours = tiny_ode(ad, emb, [3, 4], gs, cfg, STEPS, H, W)
    neg = {"negative_prompt_embeds": emb.neg_prompt_embeds} if cfg else {}
    kw = dict(prompt_embeds=emb.prompt_embeds, height=H, width=W, num_frames=FRAMES, num_inference_steps=STEPS,
              guidance_scale=gs, latents=ad.initial_noise([3, 4], H, W), **neg)
    assert torch.equal(ours, ad.pipe(img, output_type="latent", **kw).frames)
    assert not torch.equal(ours[0], ours[1])


def test_wan_i2v_condition_by_hand():
    """Mask: 1 on the first latent frame (all 4 folded channels), 0 after. Latents: the Wan VAE is causal, so the
    first latent frame of the condition video is the normalised posterior mode of the image alone."""
    ad = _i2v()
    img = _image(32, 32, 2)
    cond = ad.encode_prompts(["x"], images=[img]).cond_latents
    mask, lat = cond[:, :4], cond[:, 4:]
    assert torch.equal(mask[:, :, 0], torch.ones(1, 4, 4, 4)) and torch.equal(mask[:, :, 1:], torch.zeros(1, 4, 1, 4, 4))
    pixels = torch.from_numpy(np.array(img)).float().permute(2, 0, 1)[None, :, None] / 127.5 - 1  # (1, 3, 1, H, W)
    with torch.no_grad():
        mode = ad.vae.encode(pixels).latent_dist.mode()[:, :, 0]
    c = ad.vae.config
    expected = (mode - torch.tensor(c.latents_mean).view(1, -1, 1, 1)) / torch.tensor(c.latents_std).view(1, -1, 1, 1)
    torch.testing.assert_close(lat[:, :, 0], expected, atol=1e-5, rtol=0)
    # another frame count: another condition (cached separately), same first latent frame
    ad.set_num_frames(9)
    cond9 = ad.encode_prompts(["x"], images=[img]).cond_latents
    assert cond9.shape == (1, 8, 3, 4, 4) and len(ad._cond_cache) == 2
    torch.testing.assert_close(cond9[:, 4:, 0], lat[:, :, 0], atol=1e-5, rtol=0)


def test_wan_i2v_errors():
    with pytest.raises(ValueError, match="max_sequence_length must be 512"):
        tiny_adapter("wan_i2v", 0, max_sequence_length=16)
    ad = tiny_adapter("wan_i2v", 0, num_frames=FRAMES)
    with pytest.raises(ValueError, match="set_resolution"):
        ad.encode_prompts(["a"], images=[_image(32, 32, 0)])
    ad.set_resolution(H, W)
    with pytest.raises(ValueError, match="needs a reference image"):
        ad.encode_prompts(["a"])
    emb = ad.encode_prompts(["a"], images=[_image(32, 32, 0)])
    ad.set_num_frames(9)
    with pytest.raises(ValueError, match="set_resolution / set_num_frames"):
        ad.predict_velocity(ad.initial_noise([0], H, W), 0.5, emb)


def test_wan_i2v_sampler_log_probs_are_exact_with_reference_table():
    """The unchanged sampler and training path on I2V through the reference table: the training-path
    recomputation of a rollout's log-prob is bitwise the rollout's (on-policy ratio exactly 1)."""
    from flow_grpo.config import SamplingConfig
    from flow_grpo.sampler import sample_trajectories, score_column

    ad = _i2v()
    ad.set_reference_images({"it moves": _image(32, 32, 1), "it jumps": _image(48, 32, 2)})
    cfg = SamplingConfig(num_steps=3, height=H, width=W, guidance_scale=5.0, cfg=True, sde_kind="flow",
                         step_mode="all", batch_size=2)
    prompts = ["it moves", "it moves", "it jumps", "it jumps"]
    traj = sample_trajectories(ad, prompts, cfg, xt_seeds=[1, 2, 3, 4], noise_seeds=[5, 6, 7, 8],
                               plan_seeds=[0, 0, 1, 1], group_ids=[0, 0, 1, 1])
    assert traj.images.shape == (4, FRAMES, H, W, 3) and traj.latents.shape[2:] == (4, 2, 4, 4)
    with torch.no_grad():
        for chunk in traj.chunks:
            out = score_column(ad, traj, chunk, 1)
            assert torch.equal(out.log_prob, traj.log_probs[chunk[0]:chunk[1], 1])


# Weights compared bitwise; latents within the Wan T2V tolerance. Measured on the 3-step latents (|x| <= 4.0):
# 2.1e-6 apart; one weight element of the image cross-attention moved by 1e-2 moves them by 2.8e-3 (checked below).
ROUNDTRIP_ATOL = 2e-5


def test_wan_i2v_folder_roundtrip_through_load_adapter(tmp_path, roundtrip):
    save_tiny_pipeline(str(tmp_path), kind="wan_i2v", seed=5)
    ad = load_adapter(str(tmp_path), num_frames=FRAMES)
    assert ad.kind == "wan_i2v" and type(ad.pipe.image_processor).__name__ == "CLIPImageProcessor"
    ad.set_resolution(H, W)
    ref = _i2v(seed=5)
    for part in ("transformer", "vae", "text_encoder", "image_encoder"):
        roundtrip.same_weights(getattr(ad.pipe, part), getattr(ref.pipe, part))
    img = _image(40, 56, 3)
    emb, emb_ref = ad.encode_prompts(["a cat"], images=[img]), ref.encode_prompts(["a cat"], images=[img])
    x, x_ref = tiny_ode(ad, emb, [1], 5.0, True, 3, H, W), tiny_ode(ref, emb_ref, [1], 5.0, True, 3, H, W)
    roundtrip.close(x, x_ref, atol=ROUNDTRIP_ATOL)
    roundtrip.images_close(ad.decode(x, H, W), ref.decode(x_ref, H, W))
    with torch.no_grad():
        ad.transformer.blocks[0].attn2.add_k_proj.weight[0, 0] += 1e-2  # the image cross-attention
    with pytest.raises(AssertionError, match="not close"):
        roundtrip.close(tiny_ode(ad, emb, [1], 5.0, True, 3, H, W), x_ref, atol=ROUNDTRIP_ATOL)


def test_wan_i2v_trains_from_a_jsonl_prompt_file_with_first_frames(tmp_path):
    """model.tiny=wan_i2v: the trainer binds each JSONL line's ``image`` (relative to the file) and trains the LoRA
    on videos started from those frames, with a video reward."""
    from flow_grpo.config import load_train_config
    from flow_grpo.train.trainer import FlowGRPOTrainer

    from .conftest import train_overrides

    for name, seed in (("a.png", 1), ("b.png", 2)):
        _image(32, 32, seed).save(tmp_path / name)
    src = tmp_path / "clips.jsonl"
    src.write_text('{"prompt": "it moves left", "image": "a.png"}\n{"prompt": "it jumps", "image": "b.png"}\n')
    ov = {"model.tiny": "wan_i2v", "data.train_path": str(src), "sample.num_frames": FRAMES, "sample.height": H,
          "sample.width": W, "sample.cfg": "true", "sample.guidance_scale": 5.0, "data.eval_prompts": "[]",
          "reward.weights": "{temporal_consistency: 1.0}"}
    tr = FlowGRPOTrainer(load_train_config(None, train_overrides("wan", "flow", tmp_path / "run", **ov)))
    assert tr.adapter.kind == "wan_i2v" and tr.adapter.reference_images["it jumps"] == str(tmp_path / "b.png")
    before = {n: p.detach().clone() for n, p in tr.named_params}
    m = tr.train()[-1]
    assert m["train/ratio_mean"] == 1.0 and tr.state.last_traj.images.shape == (4, FRAMES, H, W, 3)
    assert any(not torch.equal(p.detach(), before[n]) for n, p in tr.named_params)
