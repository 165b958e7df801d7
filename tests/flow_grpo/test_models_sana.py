"""SANA adapter: bitwise equality with ``SanaPipeline.__call__`` from the same x_T (one prompt from its string with
the release's complex human instruction; a batch from our embeddings), masked text (padding neutral), the
learned-sigma half, the DPM-Solver flow grid and integer timesteps, the folder round trip and the LoRA reference."""
import pytest
import torch

from .conftest import as_uint8, check_folder_roundtrip, check_lora_reference, tiny_adapter, tiny_ode

H = W = 128  # 32x DC-AE -> 4x4 latent
STEPS = 4
MSL = 32
PROMPTS = ["a photo of a cat", "a dog"]


def _ad(seed=0, **kw):
    kw.setdefault("max_sequence_length", MSL)
    return tiny_adapter("sana", seed, **kw)


def _call(ad, gs, seeds, output_type, emb=None, **kw):
    args = dict(height=H, width=W, num_inference_steps=STEPS, guidance_scale=gs, max_sequence_length=MSL,
                latents=ad.initial_noise(seeds, H, W), output_type=output_type, use_resolution_binning=False, **kw)
    if emb is None:
        return ad.pipe(PROMPTS[0], **args).images
    neg = dict(negative_prompt=None, negative_prompt_embeds=emb.neg_prompt_embeds,
               negative_prompt_attention_mask=emb.neg_prompt_mask)
    return ad.pipe(prompt_embeds=emb.prompt_embeds, prompt_attention_mask=emb.prompt_mask, **neg, **args).images


@pytest.mark.parametrize("gs,cfg", [(4.5, True), (1.0, False)])
def test_sana_matches_pipeline_call_bitwise(gs, cfg):
    ad = _ad()
    one = tiny_ode(ad, ad.encode_prompts(PROMPTS[:1]), [3], gs, cfg, STEPS, H, W)
    assert torch.equal(one, _call(ad, gs, [3], "latent"))
    img = ad.decode(one, H, W)
    assert img.shape == (1, H, W, 3) and img.float().std() > 1
    assert torch.equal(img, as_uint8(_call(ad, gs, [3], "np")))
    emb = ad.encode_prompts(PROMPTS)
    assert torch.equal(tiny_ode(ad, emb, [3, 4], gs, cfg, STEPS, H, W), _call(ad, gs, [3, 4], "latent", emb))


def test_sana_text_is_the_pipelines_with_its_instruction():
    """The release's complex human instruction is used (dropping it changes the embeddings); masks mark the kept
    tokens; a row's velocity does not depend on its batch (masked padding)."""
    ad = _ad()
    emb = ad.encode_prompts(PROMPTS)
    pe, mask, _, _ = ad.pipe.encode_prompt(PROMPTS[:1], True, max_sequence_length=MSL,
                                           complex_human_instruction=ad.complex_human_instruction)
    assert ad.complex_human_instruction and torch.equal(emb.prompt_embeds[:1], pe) and torch.equal(emb.prompt_mask[:1], mask)
    plain = _ad(complex_human_instruction=None).encode_prompts(PROMPTS[:1])
    assert not torch.allclose(plain.prompt_embeds, pe)
    x = ad.initial_noise([3, 4], H, W)
    with torch.no_grad():
        both = ad.predict_velocity(x, 0.6, emb, 4.5, True)
        alone = ad.predict_velocity(x[1:], 0.6, ad.encode_prompts(PROMPTS[1:]), 4.5, True)
    torch.testing.assert_close(both[1:], alone, atol=1e-5, rtol=0)  # measured 1.1e-6: batch-size kernels


def test_sana_learned_sigma_keeps_the_velocity_half():
    ad = _ad()
    x = ad.initial_noise([3], H, W)
    emb = ad.encode_prompts(PROMPTS[:1])
    with torch.no_grad():
        v = ad.predict_velocity(x, 0.5, emb)
        orig = ad.model
        ad.model = lambda *a, **k: (torch.cat([orig(*a, **k)[0], torch.full_like(x, 7.0)], dim=1),)
        ad.transformer.register_to_config(out_channels=8)
        try:
            assert torch.equal(ad.predict_velocity(x, 0.5, emb), v)
        finally:
            ad.model = orig
            ad.transformer.register_to_config(out_channels=4)


def test_sana_dpm_solver_grid_and_integer_timesteps():
    """Released folders: DPMSolverMultistepScheduler with flow sigmas (flow_shift 3): its grid, first sigma snapped
    to 1, integer timesteps times timestep_scale."""
    from diffusers import DPMSolverMultistepScheduler

    from flow_grpo.models import adapter_from_pipeline
    from flow_grpo.models import TINY_BUILDERS

    pipe = TINY_BUILDERS["sana"](seed=0)
    pipe.scheduler = DPMSolverMultistepScheduler(use_flow_sigmas=True, flow_shift=3.0, prediction_type="flow_prediction")
    ad = adapter_from_pipeline(pipe, max_sequence_length=MSL)
    sched = DPMSolverMultistepScheduler.from_config(pipe.scheduler.config)
    sched.set_timesteps(STEPS)
    sig = ad.sigmas(STEPS, H, W)
    assert float(sig[0]) == 1.0 and float(sig[-1]) == 0.0
    torch.testing.assert_close(sig[1:], sched.sigmas[1:].float(), atol=0, rtol=0)
    assert ad.integer_timesteps and torch.equal(ad.timestep(float(sig[1]), 1), sched.timesteps[1:2].float())


def test_sana_folder_roundtrip_through_load_adapter(tmp_path, roundtrip):
    def perturb(ad):
        ad.transformer.patch_embed.proj.weight[0, 0, 0, 0] += 1e-2

    check_folder_roundtrip(roundtrip, tmp_path, "sana", H, W, 2e-5, perturb, 4.5, True, max_sequence_length=MSL)


def test_sana_lora_reference_is_base_model():
    check_lora_reference("sana", H, W, 4.5, True, max_sequence_length=MSL)
