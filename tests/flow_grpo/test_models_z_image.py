"""Z-Image adapter: equality with ``ZImagePipeline.__call__`` from the same x_T (bitwise: same process, same
computation, from the prompt strings, batched), its CFG options (norm cap, truncation), the reversed-time timestep
and negated output, the sigmas by hand, the folder round trip and the LoRA reference."""
import numpy as np
import pytest
import torch

from .conftest import as_uint8, check_folder_roundtrip, check_lora_reference, tiny_adapter, tiny_ode

H = W = 64  # latent 8x8 -> 16 tokens after the transformer's 2x2 patchify
STEPS = 4
MSL = 48  # the tiny tokenizer's chat template + prompt fit (the padding is dropped either way)
PROMPTS = ["a photo of a cat", "a dog"]


def _ad(seed=0, **kw):
    kw.setdefault("max_sequence_length", MSL)
    return tiny_adapter("z_image", seed, **kw)


def _pipe(ad, output_type, gs, **kw):
    return ad.pipe(prompt=list(PROMPTS), height=H, width=W, num_inference_steps=STEPS, guidance_scale=gs,
                   latents=ad.initial_noise([3, 4], H, W), max_sequence_length=MSL, output_type=output_type,
                   **kw).images


@pytest.mark.parametrize("gs,cfg", [(5.0, True), (0.0, False)])
def test_z_image_matches_pipeline_call_bitwise(gs, cfg):
    ad = _ad()
    emb = ad.encode_prompts(PROMPTS)
    assert emb.prompt_embeds.shape == (2, MSL, 16) and 0 < int(emb.prompt_mask[1].sum()) < MSL
    ours = tiny_ode(ad, emb, [3, 4], gs, cfg, STEPS, H, W)
    assert torch.equal(ours, _pipe(ad, "latent", gs))
    img = ad.decode(ours, H, W)
    assert img.float().std() > 1 and not torch.equal(img[0], img[1])
    assert torch.equal(img, as_uint8(_pipe(ad, "np", gs)))


def test_z_image_cfg_options_match_the_pipeline():
    """The norm cap (per sample, ||v|| <= c ||v_c||) and the truncation (no guidance where 1 - sigma > t) as the
    pipeline's ``cfg_normalization`` / ``cfg_truncation``; each changes the result (the test can fail)."""
    plain = tiny_ode(_ad(), _ad().encode_prompts(PROMPTS), [3, 4], 5.0, True, STEPS, H, W)
    for opts in ({"cfg_normalization": 1.05}, {"cfg_truncation": 0.2}):
        ad = _ad(**opts)
        ours = tiny_ode(ad, ad.encode_prompts(PROMPTS), [3, 4], 5.0, True, STEPS, H, W)
        assert torch.equal(ours, _pipe(ad, "latent", 5.0, **opts)), opts
        assert not torch.equal(ours, plain), opts


def test_z_image_time_is_reversed_and_output_negated():
    """Timestep fed = 1 - sigma; velocity = -output. Each, done the other way, breaks the equality (real bugs)."""
    ad = _ad()
    assert torch.allclose(ad.timestep(0.25, 2), torch.tensor([0.75, 0.75]))
    emb = ad.encode_prompts(PROMPTS)
    ref = _pipe(ad, "latent", 0.0)
    orig = ad.predict_velocity
    ad.predict_velocity = lambda *a, **k: -orig(*a, **k)
    assert not torch.allclose(tiny_ode(ad, emb, [3, 4], 0.0, False, STEPS, H, W), ref, atol=1e-3)
    ad.predict_velocity = orig
    ad.timestep = lambda sigma, b: ad._sigma_vec(sigma, b)
    assert not torch.allclose(tiny_ode(ad, emb, [3, 4], 0.0, False, STEPS, H, W), ref, atol=1e-3)


@pytest.mark.parametrize("steps", [4, 9])
def test_z_image_sigmas_by_hand(steps):
    """Z-Image-Turbo's fixed shift 3 on linspace(1, 1/K, K): 3s / (1 + 2s), then 0."""
    s = np.linspace(1.0, 1 / steps, steps)
    ref = torch.tensor(np.concatenate([3 * s / (1 + 2 * s), [0.0]]), dtype=torch.float32)
    torch.testing.assert_close(_ad().sigmas(steps, H, W), ref, atol=1e-6, rtol=0)


def test_z_image_geometry_errors():
    ad = _ad()
    assert ad.noise_shape(H, W) == (4, 8, 8)
    with pytest.raises(ValueError, match="multiples of 16"):
        ad.noise_shape(72, 64)
    with pytest.raises(ValueError, match="\\(B, C, h, w\\)"):
        ad.predict_velocity(torch.zeros(1, 4, 8), 0.5, ad.encode_prompts(["a"]))


# Measured: the loaded folder's 3-step latents are 0 apart from the in-memory tiny's; one element of the patch
# embedding moved by 1e-2 moves them past the tolerance (checked in the test).
ROUNDTRIP_ATOL = 2e-5


def test_z_image_folder_roundtrip_through_load_adapter(tmp_path, roundtrip):
    def perturb(ad):
        next(iter(ad.transformer.all_x_embedder.values())).weight[0, 0] += 1e-2

    check_folder_roundtrip(roundtrip, tmp_path, "z_image", H, W, ROUNDTRIP_ATOL, perturb, 5.0, True,
                           max_sequence_length=MSL)


def test_z_image_lora_reference_is_base_model():
    check_lora_reference("z_image", H, W, 5.0, True, max_sequence_length=MSL)
