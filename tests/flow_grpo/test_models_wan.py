"""Wan2.1 T2V adapter: equality with ``WanPipeline.__call__`` from the same x_T (bitwise: same process, same
computation), the scheduler's sigma/timestep grid (FlowMatch-Euler shift and UniPC flow sigmas), video geometry,
the ``from_pretrained`` folder round trip and LoRA.

As for SD3+T5/Kontext, the text encoder is run one prompt at a time by the adapter, so batched comparisons hand the
pipeline our embeddings and check the denoising loop and decode bitwise, while the one-prompt comparison checks the
whole path from the prompt string."""
import pytest
import torch

from flow_grpo.models import load_adapter
from flow_grpo.models import save_tiny_pipeline
from flow_grpo.sde import sde_step

from .conftest import as_uint8 as _as_uint8, tiny_adapter, tiny_ode

H = W = 32  # latent 4x4, patch 2 -> 4 tokens per latent frame
FRAMES = 5  # -> 2 latent frames (temporal factor 4)
STEPS = 4


def _wan(seed=0, **kw):
    kw.setdefault("num_frames", FRAMES)
    return tiny_adapter("wan", seed, **kw)


def _ode(ad, emb, seeds, gs, cfg, steps=STEPS):
    return tiny_ode(ad, emb, seeds, gs, cfg, steps, H, W)


def test_wan_ode_matches_pipeline_call_bitwise():
    """Default max_sequence_length (512, WanPipeline's), CFG 5: latents and decoded frames are the pipeline's, bit
    for bit, from the prompt string on."""
    ad = _wan()
    assert ad.max_sequence_length == 512 and ad.kind == "wan"
    emb = ad.encode_prompts(["a photo of a cat"])
    assert emb.prompt_embeds.shape == (1, 512, 32) and emb.pooled is None
    ours = _ode(ad, emb, [3], 5.0, True)
    xt = ad.initial_noise([3], H, W)
    assert xt.shape == (1, 4, 2, 4, 4)
    kw = dict(height=H, width=W, num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=5.0, latents=xt)
    ref = ad.pipe("a photo of a cat", output_type="latent", **kw).frames
    assert torch.equal(ours, ref)
    video = ad.decode(ours, H, W)
    assert video.shape == (1, FRAMES, H, W, 3) and video.dtype == torch.uint8
    assert torch.equal(video, _as_uint8(ad.pipe("a photo of a cat", output_type="np", **kw).frames))
    assert video.float().std() > 1  # not a constant video: the comparison can fail
    # a real bug is caught: feeding sigma instead of 1000 sigma as the timestep
    ad.timestep = lambda sigma, b: ad._sigma_vec(sigma, b)
    assert not torch.equal(_ode(ad, emb, [3], 5.0, True), ref)


@pytest.mark.parametrize("gs,cfg", [(5.0, True), (1.0, False)])
def test_wan_batched_loop_matches_pipeline_call_bitwise(gs, cfg):
    ad = _wan(max_sequence_length=16)
    emb = ad.encode_prompts(["a photo of a cat", "a dog"])
    ours = _ode(ad, emb, [3, 4], gs, cfg)
    neg = {"negative_prompt_embeds": emb.neg_prompt_embeds} if cfg else {}
    kw = dict(prompt_embeds=emb.prompt_embeds, height=H, width=W, num_frames=FRAMES, num_inference_steps=STEPS,
              guidance_scale=gs, latents=ad.initial_noise([3, 4], H, W), max_sequence_length=16, **neg)
    assert torch.equal(ours, ad.pipe(output_type="latent", **kw).frames)
    assert torch.equal(ad.decode(ours, H, W), _as_uint8(ad.pipe(output_type="np", **kw).frames))
    assert not torch.equal(ours[0], ours[1])


def test_wan_sigmas_follow_the_scheduler_shift():
    """FlowMatch-Euler with shift 3, by hand: sigma = f(s) = 3 s / (1 + 2 s) on s = linspace(1, f(1/1000), K) (the
    scheduler's sigma_min is the shifted training minimum), then 0."""
    ad = _wan()
    s = torch.linspace(1.0, 3e-3 / (1 + 2e-3), 10, dtype=torch.float64)
    ref = torch.cat([3 * s / (1 + 2 * s), torch.zeros(1, dtype=torch.float64)]).float()
    torch.testing.assert_close(ad.sigmas(10, H, W), ref, atol=1e-6, rtol=0)
    assert not ad.integer_timesteps


@pytest.mark.parametrize("steps", [4, 20, 50])
def test_wan_unipc_folder_sigmas_and_timesteps_are_the_schedulers(steps):
    """The released Wan2.1 folders ship UniPC with flow sigmas: our grid is its sigmas and the timestep fed at each
    grid point is its (integer) timestep."""
    from diffusers import UniPCMultistepScheduler

    ad = tiny_adapter("wan", 0, builder_kwargs={"scheduler": "unipc"}, num_frames=FRAMES)
    assert ad.integer_timesteps
    ref = UniPCMultistepScheduler.from_config(ad.pipe.scheduler.config)
    ref.set_timesteps(steps)
    sig = ad.sigmas(steps, H, W)
    # UniPC's first sigma is 1 - 1e-6; ours is snapped to 1 (the flow SDE's sigma = 1 form), the rest are its own
    assert float(ref.sigmas[0]) == float(torch.tensor(1 - 1e-6)) and sig[0] == 1.0
    assert torch.equal(sig[1:], ref.sigmas[1:].float())
    # by hand: flow_shift 3 on linspace(1, 1/1000, K+1) without its last point, then a final 0
    a = torch.linspace(1, 1 / 1000, steps + 1, dtype=torch.float64)[:-1]
    torch.testing.assert_close(sig[:-1].double(), 3 * a / (1 + 2 * a), atol=1e-7, rtol=0)
    assert sig[-1] == 0
    fed = torch.stack([ad.timestep(sig[k].item(), 1)[0] for k in range(steps)])
    assert torch.equal(fed, ref.timesteps) and fed[0] == 999
    # the first Flow-GRPO SDE step is a sane Gaussian: g = a sqrt(1 / (1 - sigma_1)), not ~1000 a
    x = torch.zeros(1, 4, 2, 4, 4)
    out = sde_step(x, x, sig[0].item(), sig[1].item(), kind="flow", noise_level=0.7, noise=x)
    assert float(out.std.max()) < 1.0


def test_wan_video_geometry_errors():
    ad = _wan()
    assert ad.noise_shape(H, W) == (4, 2, 4, 4) and ad.latent_frames() == 2
    with pytest.raises(ValueError, match="1 \\+ 4k frames"):
        ad.set_num_frames(6)
    ad.set_num_frames(9)
    assert ad.noise_shape(H, W) == (4, 3, 4, 4)
    with pytest.raises(ValueError, match="multiples of \\(16, 16\\)"):
        ad.noise_shape(24, 32)
    with pytest.raises(ValueError, match="\\(B, C, F, h, w\\)"):
        ad.predict_velocity(torch.zeros(1, 4, 4, 4), 0.5, ad.encode_prompts(["a"]))


# As in test_models.py: weights compared bitwise; computed latents with a tolerance (loaded tensors are unaligned
# views, BLAS rounds differently). Measured on the 3-step latents here (|x| <= 3.5): 0 (the tiny Wan's matmuls
# happen to take the same paths); one weight element moved by 1e-2 moves them by 4.2e-4, 20x the tolerance (checked
# below).
ROUNDTRIP_ATOL = 2e-5


def test_wan_pipeline_folder_roundtrip_through_load_adapter(tmp_path, roundtrip):
    save_tiny_pipeline(str(tmp_path), kind="wan", seed=5)
    ad = load_adapter(str(tmp_path), max_sequence_length=16, num_frames=FRAMES)
    assert ad.kind == "wan" and ad.num_frames == FRAMES
    ref = _wan(seed=5, max_sequence_length=16)
    for part in ("transformer", "vae", "text_encoder"):
        roundtrip.same_weights(getattr(ad.pipe, part), getattr(ref.pipe, part))
    assert torch.equal(ad.encode_prompts(["a cat"]).prompt_embeds.abs().sum(-1) > 0,
                       ref.encode_prompts(["a cat"]).prompt_embeds.abs().sum(-1) > 0)  # same tokenization
    args = (ad.encode_prompts(["a cat"]), [1], 5.0, True, 3)
    x, x_ref = _ode(ad, *args), _ode(ref, ref.encode_prompts(["a cat"]), *args[1:])
    roundtrip.close(x, x_ref, atol=ROUNDTRIP_ATOL)
    roundtrip.images_close(ad.decode(x, H, W), ref.decode(x_ref, H, W))
    with torch.no_grad():
        ad.transformer.blocks[0].attn1.to_out[0].weight[0, 0] += 1e-2
    with pytest.raises(AssertionError, match="not close"):
        roundtrip.close(_ode(ad, *args), x_ref, atol=ROUNDTRIP_ATOL)


def test_wan_lora_reference_is_base_model(tmp_path):
    base, ad = _wan(max_sequence_length=16), _wan(max_sequence_length=16)
    torch.manual_seed(1)
    ad.add_lora(rank=4, alpha=8)
    with torch.no_grad():
        for n, p in ad.transformer.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    x = ad.initial_noise([1, 2], H, W)
    with torch.no_grad():
        v_lora = ad.predict_velocity(x, 0.5, ad.encode_prompts(["a", "b"]), 5.0, True)
        with ad.reference():
            v_ref = ad.predict_velocity(x, 0.5, ad.encode_prompts(["a", "b"]), 5.0, True)
        v_base = base.predict_velocity(x, 0.5, base.encode_prompts(["a", "b"]), 5.0, True)
    assert torch.equal(v_ref, v_base) and not torch.allclose(v_lora, v_base)
    ad.save_lora(str(tmp_path))
    assert (tmp_path / "pytorch_lora_weights.safetensors").is_file()
