"""Wan2.2 adapters: the A14B two-expert model (``wan22`` / ``wan22_high`` / ``wan22_low``) and TI2V-5B
(``expand_timesteps``): bitwise equality with ``WanPipeline.__call__`` from the same x_T, each step made by the
expert the pipeline uses (and the log-prob recomputed by that expert), one-expert training, the LoRA files, the
folder round trips and the kind detection."""
import pytest
import torch

from flow_grpo.models import WanAdapter, adapter_from_pipeline, detect_kind, load_adapter
from flow_grpo.models import TINY_BUILDERS, save_tiny_pipeline
from flow_grpo.models.wan22 import LOW_NOISE_LORA_FILE, ExpertPair, Wan22HighAdapter, Wan22LowAdapter

from .conftest import as_uint8, check_folder_roundtrip, check_lora_reference, tiny_adapter, tiny_ode

H = W = 32  # A14B tiny: 8x VAE -> 4x4 latent
H5 = W5 = 64  # TI2V-5B tiny: 16x VAE -> 4x4 latent
FRAMES = 5
STEPS = 4
MSL = 16
PROMPTS = ["a photo of a cat", "a dog"]


def _a14b(cls=None, seed=0, **kw):
    kw.setdefault("num_frames", FRAMES)
    kw.setdefault("max_sequence_length", MSL)
    if cls is None:
        return tiny_adapter("wan22", seed, **kw)
    return cls(TINY_BUILDERS["wan22"](seed=seed), **kw)


def _pipe(ad, emb, seeds, gs, cfg, h, w, output_type="latent", **kw):
    neg = {"negative_prompt_embeds": emb.neg_prompt_embeds} if cfg else {}
    return ad.pipe(prompt_embeds=emb.prompt_embeds, height=h, width=w, num_frames=FRAMES, num_inference_steps=STEPS,
                   guidance_scale=gs, latents=ad.initial_noise(seeds, h, w), max_sequence_length=MSL,
                   output_type=output_type, **neg, **kw).frames


@pytest.mark.parametrize("gs,gs2,cfg", [(5.0, 3.0, True), (1.0, None, False)])
def test_wan22_a14b_matches_pipeline_call_bitwise(gs, gs2, cfg):
    ad = _a14b(guidance_scale_2=gs2)
    assert ad.kind == "wan22" and isinstance(ad.transformer, ExpertPair) and ad.boundary == 875.0
    steps = ad.expert_steps(STEPS, H, W)
    assert steps["high"] and steps["low"]  # both experts take part in the comparison
    emb = ad.encode_prompts(PROMPTS)
    ours = tiny_ode(ad, emb, [3, 4], gs, cfg, STEPS, H, W)
    kw = {"guidance_scale_2": gs2} if gs2 is not None else {}
    assert torch.equal(ours, _pipe(ad, emb, [3, 4], gs, cfg, H, W, **kw))
    video = ad.decode(ours, H, W)
    assert video.shape == (2, FRAMES, H, W, 3) and video.float().std() > 1
    assert torch.equal(video, as_uint8(_pipe(ad, emb, [3, 4], gs, cfg, H, W, output_type="np", **kw)))


def test_wan22_a14b_from_the_prompt_string_bitwise():
    ad = _a14b(max_sequence_length=None)
    assert ad.max_sequence_length == 512
    ours = tiny_ode(ad, ad.encode_prompts(PROMPTS[:1]), [3], 5.0, True, STEPS, H, W)
    ref = ad.pipe(PROMPTS[0], height=H, width=W, num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=5.0,
                  latents=ad.initial_noise([3], H, W), output_type="latent").frames
    assert torch.equal(ours, ref)


def test_wan22_each_step_is_made_by_its_expert():
    """Routing by the fed timestep (t >= 875: high). A row's velocity in a batch of mixed sigmas is the velocity of
    its expert alone (so a training forward recomputes each step's log-prob with the expert that sampled it), and
    sending every step to one expert breaks the pipeline equality (the routing matters)."""
    ad = _a14b()
    ad.set_resolution(H, W)
    assert ad.expert_of(torch.tensor([1000.0, 875.0, 874.9, 0.0])) == ["high", "high", "low", "low"]
    x = ad.initial_noise([3, 4], H, W)
    emb = ad.encode_prompts(PROMPTS)
    sig = torch.tensor([0.95, 0.3])
    with torch.no_grad():
        mixed = ad.predict_velocity(x, sig, emb, 5.0, True)
        for i, e in enumerate(["high", "low"]):
            alone = ad.predict_velocity(x[i:i + 1], float(sig[i]), emb.index([i]), 5.0, True)
            torch.testing.assert_close(mixed[i:i + 1], alone, atol=1e-6, rtol=0)
            t = ad.timestep(float(sig[i]), 1)
            direct = ad.experts[e](hidden_states=x[i:i + 1], timestep=t, encoder_hidden_states=emb.prompt_embeds[i:i + 1],
                                   return_dict=False)[0]
            undirect = ad.experts[e](hidden_states=x[i:i + 1], timestep=t,
                                     encoder_hidden_states=emb.neg_prompt_embeds[i:i + 1], return_dict=False)[0]
            torch.testing.assert_close(alone, undirect + 5.0 * (direct - undirect), atol=1e-6, rtol=0)
    ref = _pipe(ad, emb, [3, 4], 5.0, True, H, W)
    ad.boundary = 0.0  # every step to the high-noise expert
    assert not torch.allclose(tiny_ode(ad, emb, [3, 4], 5.0, True, STEPS, H, W), ref, atol=1e-3)


@pytest.mark.parametrize("cls,trained,frozen", [(Wan22HighAdapter, "high", "low"), (Wan22LowAdapter, "low", "high")])
def test_wan22_one_expert_trained(cls, trained, frozen):
    """Only the chosen expert gets LoRA and gradients; a gradient-carrying forward on the frozen expert's step is
    refused with the steps to train; sampling (no grad) still uses both, equal to the pipeline."""
    ad = _a14b(cls)
    assert ad.kind == f"wan22_{trained}" and ad.transformer is ad.experts[trained]
    torch.manual_seed(1)
    params = ad.add_lora(rank=4, alpha=8)
    assert params and all(p.requires_grad for p in params)
    assert not any("lora_" in n for n, _ in ad.experts[frozen].named_parameters())
    steps = ad.expert_steps(STEPS, H, W)
    sig = ad.sigmas(STEPS, H, W)
    ad.set_resolution(H, W)
    x = ad.initial_noise([3], H, W)
    emb = ad.encode_prompts(PROMPTS[:1])
    v = ad.predict_velocity(x, float(sig[steps[trained][0]]), emb, 5.0, True)
    v.sum().backward()
    assert all(p.grad is not None for p in params)
    with pytest.raises(ValueError, match=f"frozen {frozen}-noise"):
        ad.predict_velocity(x, float(sig[steps[frozen][0]]), emb, 5.0, True)
    with torch.no_grad():  # LoRA B is zero-initialised: the pipeline's result
        assert torch.equal(tiny_ode(ad, emb, [3], 5.0, True, STEPS, H, W), _pipe(ad, emb, [3], 5.0, True, H, W))


def test_wan22_lora_files_load_into_both_experts(tmp_path):
    """save_lora writes one file per expert; WanPipeline.load_lora_weights (into transformer / transformer_2) on a
    fresh pipeline gives the trained adapter's velocities."""
    ad = _a14b()
    torch.manual_seed(1)
    ad.add_lora(rank=4, alpha=8)
    with torch.no_grad():
        for n, p in ad.transformer.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    ad.save_lora(str(tmp_path))
    assert (tmp_path / "pytorch_lora_weights.safetensors").is_file() and (tmp_path / LOW_NOISE_LORA_FILE).is_file()
    pipe = TINY_BUILDERS["wan22"](seed=0)
    pipe.load_lora_weights(str(tmp_path))
    pipe.load_lora_weights(str(tmp_path), weight_name=LOW_NOISE_LORA_FILE, load_into_transformer_2=True)
    fresh = adapter_from_pipeline(pipe, num_frames=FRAMES, max_sequence_length=MSL)
    base = _a14b()
    for a in (ad, fresh, base):
        a.set_resolution(H, W)
    x = ad.initial_noise([3], H, W)
    with torch.no_grad():
        for s in (0.95, 0.3):  # one step per expert
            v, v_fresh = (a.predict_velocity(x, s, a.encode_prompts(PROMPTS[:1]), 5.0, True) for a in (ad, fresh))
            torch.testing.assert_close(v_fresh, v, atol=1e-5, rtol=0)
            assert not torch.allclose(v, base.predict_velocity(x, s, base.encode_prompts(PROMPTS[:1]), 5.0, True))


def test_wan22_lora_reference_is_base_model():
    check_lora_reference("wan22", H, W, 5.0, True, num_frames=FRAMES, max_sequence_length=MSL)


ROUNDTRIP_ATOL = 2e-5


def test_wan22_folder_roundtrip_and_detection(tmp_path, roundtrip):
    def perturb(ad):
        ad.experts["low"].proj_out.weight[0, 0] += 1e-2  # the low-noise expert: its folder is read too

    check_folder_roundtrip(roundtrip, tmp_path, "wan22", H, W, ROUNDTRIP_ATOL, perturb, 5.0, True,
                           parts=("transformer", "transformer_2", "vae", "text_encoder"), num_frames=FRAMES,
                           max_sequence_length=MSL)
    assert detect_kind(str(tmp_path)) == "wan22"
    assert load_adapter(str(tmp_path), kind="wan22_low", num_frames=FRAMES).kind == "wan22_low"
    wan21 = tmp_path / "wan21"
    save_tiny_pipeline(str(wan21), kind="wan")
    assert detect_kind(str(wan21)) == "wan"
    with pytest.raises(ValueError, match="kind=wan\\b"):
        load_adapter(str(wan21), kind="wan22")
    with pytest.raises(ValueError, match="kind=wan22"):
        WanAdapter(TINY_BUILDERS["wan22"](seed=0))


# ------------------------------------------------------------------------------------------------ TI2V-5B
def _ti2v(seed=0, **kw):
    kw.setdefault("num_frames", FRAMES)
    kw.setdefault("max_sequence_length", MSL)
    return tiny_adapter("wan22_ti2v", seed, **kw)


@pytest.mark.parametrize("gs,cfg", [(5.0, True), (1.0, False)])
def test_wan22_ti2v_matches_pipeline_call_bitwise(gs, cfg):
    ad = _ti2v()
    assert ad.kind == "wan22" and ad.expand_timesteps and ad.boundary is None
    assert ad.pipe.vae_scale_factor_spatial == 16 and ad.noise_shape(H5, W5) == (4, 2, 4, 4)
    emb = ad.encode_prompts(PROMPTS)
    ours = tiny_ode(ad, emb, [3, 4], gs, cfg, STEPS, H5, W5)
    assert torch.equal(ours, _pipe(ad, emb, [3, 4], gs, cfg, H5, W5))
    video = ad.decode(ours, H5, W5)
    assert video.shape == (2, FRAMES, H5, W5, 3) and video.float().std() > 1
    assert torch.equal(video, as_uint8(_pipe(ad, emb, [3, 4], gs, cfg, H5, W5, output_type="np")))
    # the per-token timestep is what the pipeline feeds: (B, F' h/2 w/2) of t
    ts = ad._timestep_input(torch.tensor([500.0, 250.0]), ours)
    assert ts.shape == (2, 2 * 2 * 2) and torch.equal(ts[1], torch.full((8,), 250.0))


def test_wan22_ti2v_folder_roundtrip(tmp_path, roundtrip):
    def perturb(ad):
        ad.transformer.proj_out.weight[0, 0] += 1e-2

    check_folder_roundtrip(roundtrip, tmp_path, "wan22_ti2v", H5, W5, ROUNDTRIP_ATOL, perturb, 5.0, True,
                           num_frames=FRAMES, max_sequence_length=MSL)
    assert detect_kind(str(tmp_path)) == "wan22"
    with pytest.raises(ValueError, match="one transformer"):
        load_adapter(str(tmp_path), kind="wan22_high", num_frames=FRAMES)


# ------------------------------------------------------------------------------------------------ A14B I2V
def _image(h, w, seed):
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def _i2v(seed=0, **kw):
    kw.setdefault("num_frames", FRAMES)
    ad = tiny_adapter("wan22_i2v", seed, **kw)
    ad.set_resolution(H, W)
    return ad


def test_wan22_i2v_matches_pipeline_call_bitwise():
    """From the prompt string and the image (40x56, resized to 32x32), CFG 5 / 3 (guidance_scale_2): latents and
    frames are the pipeline's bit for bit; the condition latents matter (zeroing them breaks it)."""
    ad = _i2v(guidance_scale_2=3.0)
    assert ad.kind == "wan22_i2v" and ad.boundary == 900.0 and not ad.clip_image
    assert ad.expert_steps(STEPS, H, W) == {"high": [0], "low": [1, 2, 3]}
    img = _image(40, 56, 0)
    emb = ad.encode_prompts([PROMPTS[0]], images=[img])
    assert emb.image_embeds is None and emb.cond_latents.shape == (1, 8, 2, 4, 4)
    ours = tiny_ode(ad, emb, [3], 5.0, True, STEPS, H, W)
    kw = dict(height=H, width=W, num_frames=FRAMES, num_inference_steps=STEPS, guidance_scale=5.0,
              guidance_scale_2=3.0, latents=ad.initial_noise([3], H, W))
    ref = ad.pipe(img, PROMPTS[0], output_type="latent", **kw).frames
    assert torch.equal(ours, ref)
    video = ad.decode(ours, H, W)
    assert video.shape == (1, FRAMES, H, W, 3) and video.float().std() > 1
    assert torch.equal(video, as_uint8(ad.pipe(img, PROMPTS[0], output_type="np", **kw).frames))
    broken = emb.index([0])
    broken.cond_latents = torch.zeros_like(emb.cond_latents)
    assert not torch.equal(tiny_ode(ad, broken, [3], 5.0, True, STEPS, H, W), ref)


@pytest.mark.parametrize("gs,cfg", [(5.0, True), (1.0, False)])
def test_wan22_i2v_batched_loop_matches_pipeline_call_bitwise(gs, cfg):
    ad = _i2v(max_sequence_length=MSL)
    img = _image(32, 32, 1)
    emb = ad.encode_prompts(PROMPTS, images=[img, img])
    ours = tiny_ode(ad, emb, [3, 4], gs, cfg, STEPS, H, W)
    neg = {"negative_prompt_embeds": emb.neg_prompt_embeds} if cfg else {}
    ref = ad.pipe(img, prompt_embeds=emb.prompt_embeds, height=H, width=W, num_frames=FRAMES,
                  num_inference_steps=STEPS, guidance_scale=gs, latents=ad.initial_noise([3, 4], H, W),
                  output_type="latent", **neg).frames
    assert torch.equal(ours, ref)


def test_wan22_i2v_folder_roundtrip_detection_and_ti2v_refusal(tmp_path, roundtrip):
    from diffusers import WanImageToVideoPipeline

    from flow_grpo.models.wan22 import Wan22I2VAdapter

    def perturb(ad):
        ad.experts["high"].proj_out.weight[0, 0] += 1e-2

    img = _image(32, 32, 1)

    def roundtrip_ode(ad):  # the shared check encodes "a cat": give it its reference image
        ad.set_reference_images({"a cat": img})
        ad.set_resolution(H, W)

    from flow_grpo.models import save_tiny_pipeline as save

    save(str(tmp_path), kind="wan22_i2v", seed=5)
    assert detect_kind(str(tmp_path)) == "wan22_i2v"
    ad, ref = load_adapter(str(tmp_path), num_frames=FRAMES), tiny_adapter("wan22_i2v", 5, num_frames=FRAMES)
    for part in ("transformer", "transformer_2", "vae", "text_encoder"):
        roundtrip.same_weights(getattr(ad.pipe, part), getattr(ref.pipe, part))
    for a in (ad, ref):
        roundtrip_ode(a)
    x, x_ref = (tiny_ode(a, a.encode_prompts(["a cat"]), [1], 5.0, True, 3, H, W) for a in (ad, ref))
    roundtrip.close(x, x_ref, atol=ROUNDTRIP_ATOL)
    with torch.no_grad():
        perturb(ad)
    with pytest.raises(AssertionError, match="not close"):
        roundtrip.close(tiny_ode(ad, ad.encode_prompts(["a cat"]), [1], 5.0, True, 3, H, W), x_ref, atol=ROUNDTRIP_ATOL)
    ti2v = TINY_BUILDERS["wan22_ti2v"](seed=0)
    pipe = WanImageToVideoPipeline(tokenizer=ti2v.tokenizer, text_encoder=ti2v.text_encoder, vae=ti2v.vae,
                                   scheduler=ti2v.scheduler, transformer=ti2v.transformer, expand_timesteps=True)
    with pytest.raises(ValueError, match="TI2V-5B image-to-video"):
        Wan22I2VAdapter(pipe)
