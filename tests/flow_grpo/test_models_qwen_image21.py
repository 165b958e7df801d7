"""Qwen-Image 2.1 adapter: equality with ``QwenImage21Pipeline.__call__`` from the same x_T (one prompt per pipeline
call: the pipeline's batched call right-pads the shorter prompt, which moves its image RoPE position; our rows are
the single-prompt conditioning whatever the batch), with and without true CFG, the text-length grouping, RGBA
decode over white, the sigmas by hand, the folder round trip and the LoRA reference."""
import numpy as np
import pytest
import torch

from flow_grpo.models.qwen_image21 import over_white

from .conftest import as_uint8, check_folder_roundtrip, check_lora_reference, tiny_adapter, tiny_ode

H = W = 64  # 16x VAE -> 4x4 latent, 16 tokens (unpatched)
STEPS = 4
MSL = 64
PROMPTS = ["a photo of a cat on a red sofa", "a dog"]
SEEDS = [3, 4]


def _ad(seed=0, **kw):
    kw.setdefault("max_sequence_length", MSL)
    return tiny_adapter("qwen_image21", seed, **kw)


def _pipe_one(ad, i, output_type, gs, cfg):
    kw = {"negative_prompt": ad.negative_prompt, "true_cfg_scale": gs} if cfg else {}
    return ad.pipe(prompt=PROMPTS[i], height=H, width=W, num_inference_steps=STEPS,
                   latents=ad.initial_noise([SEEDS[i]], H, W), output_type=output_type, use_kv_cache=False,
                   **kw).images


@pytest.mark.parametrize("gs,cfg", [(4.0, True), (1.0, False)])
def test_qwen_image21_matches_pipeline_call(gs, cfg):
    ad = _ad()
    emb = ad.encode_prompts(PROMPTS)
    n0, n1 = (int(m.sum()) for m in emb.prompt_mask)
    assert emb.prompt_embeds.shape[:2] == (2, MSL) and n0 > n1 > 0  # two text lengths: two groups per forward
    ours = tiny_ode(ad, emb, SEEDS, gs, cfg, STEPS, H, W)
    ref = torch.cat([_pipe_one(ad, i, "latent", gs, cfg) for i in range(2)])
    assert torch.equal(ours, ref)  # bitwise: same process, same computation
    img = ad.decode(ours, H, W)
    assert img.shape == (2, H, W, 3) and img.float().std() > 1
    pipe_img = np.concatenate([_pipe_one(ad, i, "np", gs, cfg) for i in range(2)])
    assert pipe_img.shape[-1] == 4  # the pipeline returns RGBA; ours is that over white
    ref_img = as_uint8(over_white(torch.from_numpy(pipe_img)).numpy())
    assert (img.int() - ref_img.int()).abs().max() <= 1


def test_qwen_image21_row_does_not_depend_on_batch():
    """A prompt's velocity alone equals its row in a batch with a longer prompt (padding is not neutral here)."""
    ad = _ad()
    ad.set_resolution(H, W)
    x = ad.initial_noise(SEEDS, H, W)
    with torch.no_grad():
        both = ad.predict_velocity(x, 0.7, ad.encode_prompts(PROMPTS))
        alone = ad.predict_velocity(x[1:], 0.7, ad.encode_prompts(PROMPTS[1:]))
        padded = ad._call(x[1:], ad.timestep(0.7, 1), ad.encode_prompts(PROMPTS[1:]).prompt_embeds)
    torch.testing.assert_close(both[1:], alone, atol=1e-6, rtol=0)
    assert not torch.allclose(padded.float(), alone, atol=1e-4)  # the zero padding would change it


def test_qwen_image21_sigmas_by_hand():
    """linspace(1, 1/K, K) under the exponential dynamic shift mu(h w): e^mu / (e^mu + 1/s - 1), then 0."""
    ad = _ad()
    c = ad.pipe.scheduler.config
    m = (c.max_shift - c.base_shift) / (c.max_image_seq_len - c.base_image_seq_len)
    mu = 16 * m + c.base_shift - m * c.base_image_seq_len
    s = np.linspace(1.0, 1 / STEPS, STEPS)
    ref = np.concatenate([np.exp(mu) / (np.exp(mu) + (1 / s - 1)), [0.0]])
    torch.testing.assert_close(ad.sigmas(STEPS, H, W), torch.tensor(ref, dtype=torch.float32), atol=1e-6, rtol=0)
    assert torch.allclose(ad.timestep(0.25, 2), torch.tensor([0.25, 0.25]))


def test_qwen_image21_errors():
    ad = _ad(max_sequence_length=8)
    assert ad.noise_shape(H, W) == (4, 4, 4)
    with pytest.raises(ValueError, match="multiples of 32"):
        ad.noise_shape(48, 64)
    with pytest.raises(ValueError, match="max_sequence_length"):
        ad.encode_prompts(["a very long prompt " * 8])


def test_over_white():
    rgba = torch.tensor([[0.2, 0.4, 0.6, 0.0], [0.2, 0.4, 0.6, 1.0], [0.0, 0.0, 0.0, 0.5]])
    torch.testing.assert_close(over_white(rgba), torch.tensor([[1.0, 1, 1], [0.2, 0.4, 0.6], [0.5, 0.5, 0.5]]))


ROUNDTRIP_ATOL = 2e-5


def test_qwen_image21_folder_roundtrip_through_load_adapter(tmp_path, roundtrip):
    def perturb(ad):
        ad.transformer.img_in.weight[0, 0] += 1e-2

    check_folder_roundtrip(roundtrip, tmp_path, "qwen_image21", H, W, ROUNDTRIP_ATOL, perturb, 4.0, True,
                           max_sequence_length=MSL)


def test_qwen_image21_lora_reference_is_base_model():
    check_lora_reference("qwen_image21", H, W, 4.0, True, max_sequence_length=MSL)
