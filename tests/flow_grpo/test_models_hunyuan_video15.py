"""HunyuanVideo 1.5 T2V adapter: bitwise equality with ``HunyuanVideo15Pipeline.__call__`` from the same x_T (one
prompt from its string, with quoted glyph text so the ByT5 branch is live; a batch from our embeddings), the
guider's CFG, masks making padding neutral, the sigma grid, refused guider settings, the folder round trip and the
LoRA reference."""
import numpy as np
import pytest
import torch

from .conftest import as_uint8, check_folder_roundtrip, check_lora_reference, tiny_adapter, tiny_ode

H = W = 64  # 16x VAE -> 4x4 latent
FRAMES = 5  # -> 2 latent frames
STEPS = 4
PROMPTS = ['a sign saying "open"', "a dog running"]


def _ad(seed=0, **kw):
    kw.setdefault("num_frames", FRAMES)
    return tiny_adapter("hunyuan_video15", seed, **kw)


def _call(ad, gs, seeds, output_type, emb=None, prompt=PROMPTS[0]):
    ad.pipe.guider.guidance_scale = gs
    kw = dict(height=H, width=W, num_frames=FRAMES, num_inference_steps=STEPS, latents=ad.initial_noise(seeds, H, W),
              output_type=output_type)
    if emb is None:
        return ad.pipe(prompt, **kw).frames
    return ad.pipe(prompt_embeds=emb.prompt_embeds, prompt_embeds_mask=emb.prompt_mask,
                   prompt_embeds_2=emb.prompt_embeds_2, prompt_embeds_mask_2=emb.prompt_mask_2,
                   negative_prompt_embeds=emb.neg_prompt_embeds, negative_prompt_embeds_mask=emb.neg_prompt_mask,
                   negative_prompt_embeds_2=emb.neg_prompt_embeds_2,
                   negative_prompt_embeds_mask_2=emb.neg_prompt_mask_2, **kw).frames


@pytest.mark.parametrize("gs,cfg", [(6.0, True), (1.0, False)])
def test_hunyuan_video15_matches_pipeline_call_bitwise(gs, cfg):
    ad = _ad()
    emb = ad.encode_prompts(PROMPTS)
    assert emb.prompt_embeds.shape[:2] == (2, 1000) and emb.prompt_embeds_2.shape[:2] == (2, 256)
    assert int(emb.prompt_mask_2[0].sum()) > 0 and int(emb.prompt_mask_2[1].sum()) == 0  # glyph text only in the 1st
    one = tiny_ode(ad, emb.index([0]), [3], gs, cfg, STEPS, H, W)
    assert torch.equal(one, _call(ad, gs, [3], "latent"))
    video = ad.decode(one, H, W)
    assert video.shape == (1, FRAMES, H, W, 3) and video.float().std() > 1
    assert torch.equal(video, as_uint8(_call(ad, gs, [3], "np")))
    both = tiny_ode(ad, emb, [3, 4], gs, cfg, STEPS, H, W)
    assert torch.equal(both, _call(ad, gs, [3, 4], "latent", emb=emb))
    assert ad.decode(both, H, W).shape == (2, FRAMES, H, W, 3)  # one video at a time (see decode)


def test_hunyuan_video15_glyph_text_matters_and_rows_batch():
    ad = _ad()
    ad.set_resolution(H, W)
    emb = ad.encode_prompts(PROMPTS)
    x = ad.initial_noise([3, 4], H, W)
    with torch.no_grad():
        both = ad.predict_velocity(x, 0.6, emb, 6.0, True)
        alone = ad.predict_velocity(x[1:], 0.6, emb.index([1]), 6.0, True)
        no_glyph = emb.index([0])
        no_glyph.prompt_embeds_2, no_glyph.prompt_mask_2 = emb.prompt_embeds_2[1:], emb.prompt_mask_2[1:]
        v0 = ad.predict_velocity(x[:1], 0.6, no_glyph, 6.0, True)
    torch.testing.assert_close(both[1:], alone, atol=1e-5, rtol=0)
    assert not torch.allclose(v0, both[:1], atol=1e-4)


def test_hunyuan_video15_sigmas_by_hand_and_guider_checks():
    """linspace(1, 0, K+1)[:-1] under the folder's shift 5: 5s / (1 + 4s), then 0."""
    from diffusers import ClassifierFreeGuidance

    from flow_grpo.models import adapter_from_pipeline
    from flow_grpo.models import TINY_BUILDERS

    s = np.linspace(1.0, 0.0, STEPS + 1)[:-1]
    ref = torch.tensor(np.concatenate([5 * s / (1 + 4 * s), [0.0]]), dtype=torch.float32)
    torch.testing.assert_close(_ad().sigmas(STEPS, H, W), ref, atol=1e-6, rtol=0)
    for bad in ({"guidance_rescale": 0.7}, {"use_original_formulation": True}, {"stop": 0.5}):
        pipe = TINY_BUILDERS["hunyuan_video15"](seed=0)
        pipe.guider = ClassifierFreeGuidance(**bad)
        with pytest.raises(ValueError, match="guider has settings"):
            adapter_from_pipeline(pipe)
    with pytest.raises(ValueError, match="text length"):
        _ad(max_sequence_length=16)


def test_hunyuan_video15_folder_roundtrip_through_load_adapter(tmp_path, roundtrip):
    def perturb(ad):
        ad.transformer.proj_out.weight[0, 0] += 1e-2

    check_folder_roundtrip(roundtrip, tmp_path, "hunyuan_video15", H, W, 2e-5, perturb, 6.0, True,
                           parts=("transformer", "vae", "text_encoder", "text_encoder_2"), num_frames=FRAMES)


def test_hunyuan_video15_lora_reference_is_base_model():
    check_lora_reference("hunyuan_video15", H, W, 6.0, True, num_frames=FRAMES)


def test_hunyuan_video15_lora_file_loads_into_the_transformer(tmp_path):
    from flow_grpo.models import adapter_from_pipeline
    from flow_grpo.models import TINY_BUILDERS

    ad = check_lora_reference("hunyuan_video15", H, W, 6.0, True, num_frames=FRAMES)
    ad.save_lora(str(tmp_path))
    pipe = TINY_BUILDERS["hunyuan_video15"](seed=0)
    pipe.transformer.load_lora_adapter(str(tmp_path), weight_name="pytorch_lora_weights.safetensors", prefix=None)
    fresh = adapter_from_pipeline(pipe, num_frames=FRAMES)
    x = ad.initial_noise([1], H, W)
    with torch.no_grad():
        v, v2 = (a.predict_velocity(x, 0.5, a.encode_prompts(["a"]), 6.0, True) for a in (ad, fresh))
    torch.testing.assert_close(v2, v, atol=1e-5, rtol=0)
