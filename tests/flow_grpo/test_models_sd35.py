"""SD3.5-large and SD3.5-medium: the ``sd3`` adapter on their transformer options (RMS q/k norms; MMDiT-X's dual
attention for medium) with T5: bitwise equality with ``StableDiffusion3Pipeline.__call__`` from the prompt strings,
the options really present in the tiny transformers, the folder round trip and the LoRA reference."""
import pytest
import torch

from .conftest import as_uint8, check_folder_roundtrip, check_lora_reference, tiny_adapter, tiny_ode

H = W = 64
STEPS = 4
MSL = 16
PROMPTS = ["a photo of a cat", "a dog"]
KINDS = ["sd3_5_large", "sd3_5_medium"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("gs,cfg", [(4.5, True), (1.0, False)])
def test_sd35_matches_pipeline_call_bitwise(kind, gs, cfg):
    """Batched from our (one-prompt-at-a-time) embeddings, and one prompt from its string: the pipeline's latents
    and images bit for bit. (A batched call from strings encodes both prompts in one text-encoder call, whose
    batch-dependent kernels differ by ~1e-6: why the adapter encodes one prompt at a time.)"""
    ad = tiny_adapter(kind, max_sequence_length=MSL)
    assert ad.kind == "sd3" and ad.pipe.text_encoder_3 is not None
    emb = ad.encode_prompts(PROMPTS)
    ours = tiny_ode(ad, emb, [3, 4], gs, cfg, STEPS, H, W)
    kw = dict(height=H, width=W, num_inference_steps=STEPS, guidance_scale=gs, max_sequence_length=MSL)
    neg = dict(negative_prompt_embeds=emb.neg_prompt_embeds, negative_pooled_prompt_embeds=emb.neg_pooled) if cfg else {}
    ref = ad.pipe(prompt_embeds=emb.prompt_embeds, pooled_prompt_embeds=emb.pooled, **neg,
                  latents=ad.initial_noise([3, 4], H, W), output_type="latent", **kw).images
    assert torch.equal(ours, ref)
    one = tiny_ode(ad, ad.encode_prompts(PROMPTS[:1]), [3], gs, cfg, STEPS, H, W)
    call = dict(latents=ad.initial_noise([3], H, W), **kw)
    assert torch.equal(one, ad.pipe(PROMPTS[0], output_type="latent", **call).images)
    assert torch.equal(ad.decode(one, H, W), as_uint8(ad.pipe(PROMPTS[0], output_type="np", **call).images))


@pytest.mark.parametrize("kind", KINDS)
def test_sd35_options_are_present(kind):
    """The tiny transformers carry the release's options (else the equality above would test plain SD3)."""
    tr = tiny_adapter(kind, max_sequence_length=MSL).transformer
    blocks = tr.transformer_blocks
    assert all(b.attn.norm_q is not None and b.attn.norm_k is not None for b in blocks)
    assert [b.use_dual_attention for b in blocks] == ([True, False] if kind == "sd3_5_medium" else [False] * 3)


ROUNDTRIP_ATOL = 2e-5


@pytest.mark.parametrize("kind", KINDS)
def test_sd35_folder_roundtrip_through_load_adapter(kind, tmp_path, roundtrip):
    def perturb(ad):
        ad.transformer.transformer_blocks[0].attn.norm_q.weight[0] += 1e-2

    check_folder_roundtrip(roundtrip, tmp_path, kind, H, W, ROUNDTRIP_ATOL, perturb, 4.5, True,
                           parts=("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"),
                           max_sequence_length=MSL)


@pytest.mark.parametrize("kind", KINDS)
def test_sd35_lora_reference_is_base_model(kind):
    check_lora_reference(kind, H, W, 4.5, True, max_sequence_length=MSL)
