"""Qwen-Image adapter: equality with ``QwenImagePipeline.__call__`` from the same x_T (bitwise: same process, same
inputs), the fixed-length masked text padding (rounding only), the scheduler's sigmas by hand, and the
``from_pretrained`` folder round trip.

The adapter pads every prompt to ``max_sequence_length`` tokens with a mask; the batched comparisons hand the pipeline
those embeddings and masks and check the denoising loop and decode bitwise; the one-prompt comparison from the prompt
string (the pipeline then uses the unpadded embedding, no mask) is close within a tolerance that a real bug exceeds.
The tiny tokenizer splits the chat template into 141 tokens (the released one: 34 + the prompt's), so
max_sequence_length=160 keeps the prompt inside the truncation."""
import math

import pytest
import torch

from flow_grpo.models import load_adapter
from flow_grpo.models import save_tiny_pipeline

from .conftest import as_uint8 as _as_uint8, tiny_adapter, tiny_ode

H = W = 64  # 8x8 latents -> 16 packed tokens
STEPS = 4
MSL = 160


def _qwen(seed=0, **kw):
    kw.setdefault("max_sequence_length", MSL)
    return tiny_adapter("qwen_image", seed, **kw)


def _ode(ad, emb, seeds, gs, cfg, steps=STEPS):
    return tiny_ode(ad, emb, seeds, gs, cfg, steps, H, W)


@pytest.mark.parametrize("gs,cfg", [(4.0, True), (1.0, False)])
def test_qwen_image_batched_loop_matches_pipeline_call_bitwise(gs, cfg):
    ad = _qwen()
    emb = ad.encode_prompts(["a photo of a cat", "a dog"])
    assert emb.prompt_embeds.shape == (2, MSL, 64) and emb.pooled is None
    assert 0 < int(emb.prompt_mask[1].sum()) < MSL  # padded, and the padding is masked
    ours = _ode(ad, emb, [3, 4], gs, cfg)
    neg = dict(negative_prompt_embeds=emb.neg_prompt_embeds, negative_prompt_embeds_mask=emb.neg_prompt_mask) if cfg else {}
    kw = dict(prompt_embeds=emb.prompt_embeds, prompt_embeds_mask=emb.prompt_mask, true_cfg_scale=gs, height=H,
              width=W, num_inference_steps=STEPS, latents=ad.initial_noise([3, 4], H, W), max_sequence_length=MSL,
              **neg)
    assert torch.equal(ours, ad.pipe(output_type="latent", **kw).images)
    img = ad.decode(ours, H, W)
    assert img.shape == (2, H, W, 3) and img.float().std() > 1
    assert torch.equal(img, _as_uint8(ad.pipe(output_type="np", **kw).images))


# Padding to max_sequence_length with a mask vs the pipeline's unpadded single-prompt embedding: measured 6.4e-7 on
# the 4-step latents (|x| <= 3.7); attending to the padding (no mask) moves them by 4.7e-2, CFG without the norm
# rescale by 1.2e-2 (both checked below).
PAD_ATOL = 5e-6


def _no_rescale(ad):
    """A real bug to catch: true CFG without the pipeline's per-token norm rescale."""

    def predict(x, sigma, e, gs=4.0, cfg=False):
        b, n, _ = x.shape
        t = (ad._sigma_vec(sigma, b) * 1000.0) / 1000.0
        shapes = [[(1, *ad._token_hw(n))]] * b
        v = ad._forward(x.to(ad.dtype), t, e.prompt_embeds, e.prompt_mask, shapes)
        v_u = ad._forward(x.to(ad.dtype), t, e.neg_prompt_embeds, e.neg_prompt_mask, shapes)
        return (v_u + gs * (v - v_u)).float()

    return predict


def test_qwen_image_from_prompt_string_matches_pipeline_up_to_padding_rounding():
    from dataclasses import replace

    ad = _qwen()
    emb = ad.encode_prompts(["a photo of a cat"])
    ours = _ode(ad, emb, [3], 4.0, True)
    ref = ad.pipe("a photo of a cat", negative_prompt=" ", true_cfg_scale=4.0, height=H, width=W,
                  num_inference_steps=STEPS, latents=ad.initial_noise([3], H, W), max_sequence_length=MSL,
                  output_type="latent").images
    torch.testing.assert_close(ours, ref, atol=PAD_ATOL, rtol=0)
    unmasked = _ode(ad, replace(emb, prompt_mask=None, neg_prompt_mask=None), [3], 4.0, True)
    assert (unmasked - ref).abs().max() > 1000 * PAD_ATOL
    ad.predict_velocity = _no_rescale(ad)
    assert (_ode(ad, emb, [3], 4.0, True) - ref).abs().max() > 1000 * PAD_ATOL


def test_qwen_image_sigmas_by_hand():
    """linspace(1, 1/K, K), exponential shift with mu linear in the token count (0.5 at 256 tokens, 0.9 at 8192),
    then stretched so the last sigma is shift_terminal = 0.02; a final 0."""
    ad = _qwen()
    K, n_tok = 6, 16
    mu = 0.5 + (0.9 - 0.5) * (n_tok - 256) / (8192 - 256)
    s = torch.linspace(1.0, 1 / K, K, dtype=torch.float64)
    sig = math.exp(mu) / (math.exp(mu) + (1 / s - 1))
    one_minus = 1 - sig
    sig = 1 - one_minus / (one_minus[-1] / (1 - 0.02))
    ref = torch.cat([sig, torch.zeros(1, dtype=torch.float64)]).float()
    torch.testing.assert_close(ad.sigmas(K, H, W), ref, atol=1e-6, rtol=0)
    assert abs(float(ad.sigmas(K, H, W)[-2]) - 0.02) < 1e-6


# As test_models.py: bitwise weights, tolerant outputs. Measured on the 3-step latents: 7.2e-7 apart (|x| <= 3.5).
# A 1e-2 change of one element inside a block barely shows at this random init (1.5e-5: the blocks' residual gates
# are small); one element of the image input projection moved by 1e-2 moves the latents by 6.3e-3 (checked below).
ROUNDTRIP_ATOL = 5e-6


def test_qwen_image_folder_roundtrip_through_load_adapter(tmp_path, roundtrip):
    save_tiny_pipeline(str(tmp_path), kind="qwen_image", seed=5)
    ad = load_adapter(str(tmp_path), max_sequence_length=MSL)
    assert ad.kind == "qwen_image"
    ref = _qwen(seed=5)
    for part in ("transformer", "vae", "text_encoder"):
        roundtrip.same_weights(getattr(ad.pipe, part), getattr(ref.pipe, part))
    assert torch.equal(ad.encode_prompts(["a cat"]).prompt_mask, ref.encode_prompts(["a cat"]).prompt_mask)
    x, x_ref = _ode(ad, ad.encode_prompts(["a cat"]), [1], 4.0, True, 3), _ode(ref, ref.encode_prompts(["a cat"]),
                                                                              [1], 4.0, True, 3)
    roundtrip.close(x, x_ref, atol=ROUNDTRIP_ATOL)
    roundtrip.images_close(ad.decode(x, H, W), ref.decode(x_ref, H, W))
    with torch.no_grad():
        ad.transformer.img_in.weight[0, 0] += 1e-2
    with pytest.raises(AssertionError, match="not close"):
        roundtrip.close(_ode(ad, ad.encode_prompts(["a cat"]), [1], 4.0, True, 3), x_ref, atol=ROUNDTRIP_ATOL)


def test_qwen_image_lora_reference_is_base_model():
    base, ad = _qwen(max_sequence_length=8), _qwen(max_sequence_length=8)
    torch.manual_seed(1)
    ad.add_lora(rank=4, alpha=8)
    with torch.no_grad():
        for n, p in ad.transformer.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    ad.set_resolution(H, W)
    base.set_resolution(H, W)
    x = ad.initial_noise([1, 2], H, W)
    with torch.no_grad():
        v_lora = ad.predict_velocity(x, 0.5, ad.encode_prompts(["a", "b"]), 4.0, True)
        with ad.reference():
            v_ref = ad.predict_velocity(x, 0.5, ad.encode_prompts(["a", "b"]), 4.0, True)
        v_base = base.predict_velocity(x, 0.5, base.encode_prompts(["a", "b"]), 4.0, True)
    assert torch.equal(v_ref, v_base) and not torch.allclose(v_lora, v_base)
