"""LTX-2 adapter: bitwise equality with ``LTX2Pipeline.__call__`` from the same x_T (video and audio latents, decoded
frames) with the release's default guidance (CFG + spatio-temporal + modality isolation + rescale) and without CFG;
a batch within tolerance (the pipeline runs the text connectors on the whole batch); the joint audio+video state;
the frozen audio branch; the sigmas; the folder round trip and the LoRA reference."""
import pytest
import torch

from .conftest import as_uint8, check_folder_roundtrip, check_lora_reference, tiny_adapter, tiny_ode

H = W = 32  # tiny video VAE: spatial 2 -> 16x16 latent
FRAMES = 5  # temporal 2 -> 3 latent frames; 5 audio latent frames at 24 fps
STEPS = 3
MSL = 16
PROMPTS = ["a robot dancing", "a dog"]


def _ad(seed=0, **kw):
    kw.setdefault("num_frames", FRAMES)
    kw.setdefault("max_sequence_length", MSL)
    kw.setdefault("stg_blocks", [1])
    return tiny_adapter("ltx2", seed, **kw)


def _call(ad, prompt, seeds, gs, cfg, output_type):
    xv, xa = ad.split(ad.initial_noise(seeds, H, W), H, W)
    kw = dict(guidance_scale=gs) if cfg else dict(guidance_scale=1.0, audio_guidance_scale=1.0)
    return ad.pipe(prompt, height=H, width=W, num_frames=FRAMES, num_inference_steps=STEPS, max_sequence_length=MSL,
                   latents=xv.clone(), audio_latents=xa.clone(), output_type=output_type,
                   spatio_temporal_guidance_blocks=ad.stg_blocks, **kw)


def _as_pipeline_latents(ad, x):
    """Our model-space latents in the pipeline's latent output layout (unpacked, de-normalised video; audio)."""
    p = ad.pipe
    v, a = ad.split(x, H, W)
    h, w = ad.latent_hw(H, W)
    v = p._denormalize_latents(p._unpack_latents(v, ad.latent_frames(), h, w, 1, 1), p.vae.latents_mean,
                               p.vae.latents_std, p.vae.config.scaling_factor)
    a = p._denormalize_audio_latents(a, p.audio_vae.latents_mean, p.audio_vae.latents_std)
    mel = p.audio_vae.config.mel_bins // p.audio_vae_mel_compression_ratio
    return v, p._unpack_audio_latents(a, ad.audio_frames(), num_mel_bins=mel)


@pytest.mark.parametrize("gs,cfg", [(3.0, True), (1.0, False)])
def test_ltx2_matches_pipeline_call_bitwise(gs, cfg):
    ad = _ad()
    g = ad.guidance
    assert (g["stg_scale"], g["modality_scale"], g["guidance_rescale"], g["audio_guidance_scale"]) == (1.0, 3.0, 0.7, 7.0)
    emb = ad.encode_prompts(PROMPTS[:1])
    ours = tiny_ode(ad, emb, [3], gs, cfg, STEPS, H, W)
    ref = _call(ad, PROMPTS[0], [3], gs, cfg, "latent")
    v, a = _as_pipeline_latents(ad, ours)
    assert torch.equal(v, ref.frames) and torch.equal(a, ref.audio)
    video = ad.decode(ours, H, W)
    assert video.shape == (1, FRAMES, H, W, 3) and video.float().std() > 1
    assert torch.equal(video, as_uint8(_call(ad, PROMPTS[0], [3], gs, cfg, "np").frames))


def test_ltx2_batch_and_each_guidance_term_matters():
    """A batch of two prompts: each row within 1e-5 of its own pipeline call (the pipeline runs the connectors on
    the whole batch, the adapter on each prompt's [negative; prompt] pair); switching off STG, modality guidance or
    the rescale changes the velocity (each is really applied)."""
    ad = _ad()
    emb = ad.encode_prompts(PROMPTS)
    both = tiny_ode(ad, emb, [3, 4], 3.0, True, STEPS, H, W)
    for i in range(2):
        v, a = _as_pipeline_latents(ad, both[i:i + 1])
        ref = _call(ad, PROMPTS[i], [3 + i], 3.0, True, "latent")
        torch.testing.assert_close(v, ref.frames, atol=1e-5, rtol=0)
        torch.testing.assert_close(a, ref.audio, atol=1e-5, rtol=0)
    ad.set_resolution(H, W)
    x = ad.initial_noise([3], H, W)
    with torch.no_grad():
        base = ad.predict_velocity(x, 0.7, emb.index([0]), 3.0, True)
        for off in ({"stg_scale": 0.0, "audio_stg_scale": 0.0}, {"modality_scale": 1.0, "audio_modality_scale": 1.0},
                    {"guidance_rescale": 0.0, "audio_guidance_rescale": 0.0}):
            other = _ad(**off)
            other.set_resolution(H, W)
            assert not torch.allclose(other.predict_velocity(x, 0.7, other.encode_prompts(PROMPTS[:1]), 3.0, True),
                                      base, atol=1e-5), off


def test_ltx2_state_is_video_and_audio():
    ad = _ad()
    (sv, dv), (sa, da) = ad._shapes(H, W)
    assert (sv, dv, sa, da) == (3 * 16 * 16, 4, 5, 4) and ad.noise_shape(H, W) == (sv * dv + sa * da,)
    x = ad.initial_noise([1, 2], H, W)
    v, a = ad.split(x, H, W)
    assert torch.equal(ad.join(v, a), x)
    with pytest.raises(ValueError, match="1 \\+ 2k"):
        ad.set_num_frames(4)
    with pytest.raises(ValueError, match="set_resolution"):
        ad.predict_velocity(x, 0.5, ad.encode_prompts(["a", "b"]))


def test_ltx2_lora_is_on_the_video_stream_only():
    """LoRA on attn1/attn2 (video self- and text cross-attention) only; every audio module stays at the base."""
    ad = _ad()
    ad.add_lora(rank=4, alpha=8)
    lora = {n.split(".lora_")[0] for n, _ in ad.transformer.named_parameters() if "lora_" in n}
    assert lora and all(n.split(".")[2] in ("attn1", "attn2") for n in lora)
    assert not any("audio" in n for n in lora)
    assert {n.split(".")[-1] for n in lora} == {"to_q", "to_k", "to_v", "0"}


def test_ltx2_sigmas_follow_the_pipeline():
    ad = _ad()
    _call(ad, PROMPTS[0], [3], 3.0, True, "latent")
    torch.testing.assert_close(ad.sigmas(STEPS, H, W), ad.pipe.scheduler.sigmas.float(), atol=0, rtol=0)


def test_ltx2_folder_roundtrip_through_load_adapter(tmp_path, roundtrip):
    def perturb(ad):
        ad.transformer.proj_in.weight[0, 0] += 1e-2

    check_folder_roundtrip(roundtrip, tmp_path, "ltx2", H, W, 2e-5, perturb, 3.0, True,
                           parts=("transformer", "vae", "audio_vae", "text_encoder", "connectors"), num_frames=FRAMES,
                           max_sequence_length=MSL, stg_blocks=[1])


def test_ltx2_lora_reference_is_base_model():
    check_lora_reference("ltx2", H, W, 3.0, True, num_frames=FRAMES, max_sequence_length=MSL, stg_blocks=[1])
