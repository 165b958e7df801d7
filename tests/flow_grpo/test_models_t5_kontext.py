"""SD3.5 with its T5 text encoder and FLUX.1-Kontext: equality with the diffusers pipelines' own ``__call__`` from the
same x_T (bitwise: same process, same computation), prompt/reference encoding, and the ``from_pretrained`` round trip.

Bitwise equality holds when both sides encode the same batch: the text encoders (and the VAE encoder) are run one
prompt (image) at a time by the adapter, so batched comparisons give the pipeline our embeddings (and, for Kontext,
our reference latents, which ``FluxKontextPipeline`` accepts as ``image``) and check the denoising loop bitwise,
while one-prompt comparisons check the whole path from the prompt string / reference image."""
import json

import numpy as np
import pytest
import torch
from PIL import Image

from flow_grpo.models import load_adapter
from flow_grpo.models import save_tiny_pipeline
from flow_grpo.models.tiny import build_tiny_sd3_t5_pipeline

from .conftest import H, W, as_uint8 as _as_uint8, tiny_adapter, tiny_ode

STEPS = 4


def _sd3_t5(seed=0, **kw):
    return tiny_adapter("sd3_t5", seed, **kw)


def _kontext(seed=0, **kw):
    return tiny_adapter("flux_kontext", seed, max_sequence_length=16, auto_resize=False, **kw)


def _ode(ad, emb, seeds, gs, cfg, steps=STEPS):
    return tiny_ode(ad, emb, seeds, gs, cfg, steps, H, W)


def _image(h, w, seed):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


# ------------------------------------------------------------------------------------------------ SD3.5 + T5
def test_sd3_t5_ode_matches_pipeline_call_bitwise():
    """Default max_sequence_length (256, the SD3 pipelines' default): latents and decoded images are the
    pipeline's, bit for bit, from the prompt string on."""
    ad = _sd3_t5()
    assert ad.max_sequence_length == 256 and ad.pipe.text_encoder_3 is not None
    emb = ad.encode_prompts(["a photo of a cat"])
    assert emb.prompt_embeds.shape == (1, 77 + 256, 64)  # CLIP-L|G tokens, then T5 tokens
    ours = _ode(ad, emb, [3], 4.5, True)
    xt = ad.initial_noise([3], H, W)
    kw = dict(height=H, width=W, num_inference_steps=STEPS, guidance_scale=4.5, latents=xt)
    ref = ad.pipe("a photo of a cat", output_type="latent", **kw).images
    assert torch.equal(ours, ref)
    assert torch.equal(ad.decode(ours, H, W), _as_uint8(ad.pipe("a photo of a cat", output_type="np", **kw).images))


@pytest.mark.parametrize("gs,cfg", [(4.5, True), (1.0, False)])
def test_sd3_t5_batched_loop_matches_pipeline_call_bitwise(gs, cfg):
    ad = _sd3_t5(max_sequence_length=16)
    emb = ad.encode_prompts(["a photo of a cat", "a dog"])
    ours = _ode(ad, emb, [3, 4], gs, cfg)
    neg = {}
    if cfg:
        neg = dict(negative_prompt_embeds=emb.neg_prompt_embeds, negative_pooled_prompt_embeds=emb.neg_pooled)
    ref = ad.pipe(prompt_embeds=emb.prompt_embeds, pooled_prompt_embeds=emb.pooled, height=H, width=W,
                  num_inference_steps=STEPS, guidance_scale=gs, latents=ad.initial_noise([3, 4], H, W),
                  output_type="latent", max_sequence_length=16, **neg).images
    assert torch.equal(ours, ref)


def test_sd3_t5_joint_embedding_layout():
    """Checked against the encoders called directly: CLIP-L and CLIP-G penultimate hidden states side by side
    (64 = joint_attention_dim, so no zero padding here) on 77 tokens, then the T5 last hidden state on
    max_sequence_length tokens (the value the adapter is given); pooled = both CLIP projections."""
    ad = _sd3_t5(max_sequence_length=16)
    p = ad.pipe
    prompt = "a photo of a cat"  # 5 T5 tokens + </s>: padded to 16
    emb = ad.encode_prompts([prompt])
    assert emb.prompt_embeds.shape == (1, 77 + 16, 64)
    with torch.no_grad():
        clip, pooled = [], []
        for tok, enc in ((p.tokenizer, p.text_encoder), (p.tokenizer_2, p.text_encoder_2)):
            ids = tok(prompt, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
            out = enc(ids, output_hidden_states=True)
            clip.append(out.hidden_states[-2])
            pooled.append(out.text_embeds)
        t5_ids = p.tokenizer_3(prompt, padding="max_length", max_length=16, truncation=True,
                               return_tensors="pt").input_ids
        assert t5_ids[0, -1] == p.tokenizer_3.pad_token_id and p.tokenizer_3.eos_token_id in t5_ids[0].tolist()
        t5 = p.text_encoder_3(t5_ids)[0]
        neg_ids = p.tokenizer_3("", padding="max_length", max_length=16, return_tensors="pt").input_ids
        t5_neg = p.text_encoder_3(neg_ids)[0]
    torch.testing.assert_close(emb.prompt_embeds[:, :77], torch.cat(clip, -1), rtol=0, atol=1e-6)
    torch.testing.assert_close(emb.prompt_embeds[:, 77:], t5, rtol=0, atol=1e-6)
    torch.testing.assert_close(emb.pooled, torch.cat(pooled, -1), rtol=0, atol=1e-6)
    torch.testing.assert_close(emb.neg_prompt_embeds[:, 77:], t5_neg, rtol=0, atol=1e-6)
    # the T5 branch is live: the same weights without T5 (zeros in its place) give another velocity
    no_t5 = tiny_adapter("sd3", 0, max_sequence_length=16)
    e0 = no_t5.encode_prompts([prompt])
    assert torch.equal(e0.prompt_embeds[:, :77], emb.prompt_embeds[:, :77]) and not e0.prompt_embeds[:, 77:].any()
    x = ad.initial_noise([1], H, W)
    with torch.no_grad():
        assert not torch.allclose(ad.predict_velocity(x, 0.5, emb, 4.5, True),
                                  no_t5.predict_velocity(x, 0.5, e0, 4.5, True), atol=1e-4)


def test_tiny_t5_tokenizer_is_a_t5_unigram_tokenizer():
    from transformers import T5TokenizerFast

    tok = build_tiny_sd3_t5_pipeline(0).tokenizer_3
    assert isinstance(tok, T5TokenizerFast)
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)  # T5's id layout
    assert type(tok.backend_tokenizer.model).__name__ == "Unigram"
    ids = tok("a photo of a cat").input_ids
    assert len(ids) == 6 and ids[-1] == tok.eos_token_id  # one piece per corpus word, </s> appended
    assert tok.convert_ids_to_tokens(ids[:2]) == ["\u2581a", "\u2581photo"]  # SentencePiece word-start marker
    assert tok.convert_ids_to_tokens(tok("zebra").input_ids) == ["\u2581", "z", "e", "b", "r", "a", "</s>"]


# ------------------------------------------------------------------------------------------------ FLUX.1-Kontext
def test_kontext_ode_matches_pipeline_call_bitwise():
    """One prompt, a non-square reference (48x80 px -> 6x10 latents -> 15 context tokens) and a 64x64 output:
    latents and images are ``FluxKontextPipeline.__call__``'s (``_auto_resize=False``, ``max_area=H*W`` so that
    it keeps our output size), bit for bit, from the prompt string and the PIL image on."""
    ad = _kontext()
    ref_img = _image(48, 80, 0)
    emb = ad.encode_prompts(["make the cat blue"], images=[ref_img])
    assert emb.cond_latents.shape == (1, 4, 6, 10)
    # 11 steps: sigma_2 of this grid is one where the pipeline's timestep (1000 sigma) / 1000 != sigma in float32
    # (the adapter feeds sigma: equal after the transformer's own x1000)
    steps = 11
    sig = ad.sigmas(steps, H, W)
    assert sig[2] * 1000 / 1000 != sig[2]
    ours = _ode(ad, emb, [3], 3.5, False, steps=steps)
    kw = dict(prompt="make the cat blue", image=ref_img, height=H, width=W, num_inference_steps=steps,
              guidance_scale=3.5, latents=ad.initial_noise([3], H, W), max_sequence_length=16, max_area=H * W,
              _auto_resize=False)
    assert torch.equal(ours, ad.pipe(output_type="latent", **kw).images)
    assert torch.equal(ad.decode(ours, H, W), _as_uint8(ad.pipe(output_type="np", **kw).images))
    # the context matters: without the reference (plain FLUX text-to-image) the result differs
    plain = _ode(ad, ad.encode_prompts(["make the cat blue"]), [3], 3.5, False, steps=steps)
    assert not torch.allclose(ours, plain, atol=1e-3)


def test_kontext_batched_per_sample_references_match_pipeline_bitwise():
    """Two prompts with two different references: the pipeline gets our text embeddings and our reference latents
    (it takes 4-channel ``image`` tensors as latents), so the batched denoising loop is compared bitwise."""
    ad = _kontext()
    emb = ad.encode_prompts(["make it red", "add a hat"], images=[_image(32, 48, 1), _image(32, 48, 2)])
    assert not torch.equal(emb.cond_latents[0], emb.cond_latents[1])
    ours = _ode(ad, emb, [5, 6], 2.5, False)
    ref = ad.pipe(prompt_embeds=emb.prompt_embeds, pooled_prompt_embeds=emb.pooled, image=emb.cond_latents,
                  height=H, width=W, num_inference_steps=STEPS, guidance_scale=2.5,
                  latents=ad.initial_noise([5, 6], H, W), output_type="latent", max_sequence_length=16,
                  max_area=H * W, _auto_resize=False).images
    assert torch.equal(ours, ref)


def test_kontext_context_tokens_ids_and_slicing():
    """What the transformer receives, checked by hand: generated tokens then context tokens, ids (0, r, c) then
    (1, r, c) on the reference's own token grid; the returned velocity is the first n output tokens."""
    ad = _kontext()
    emb = ad.encode_prompts(["a"], images=[_image(32, 48, 3)])  # 4x6 latents -> 2x3 = 6 context tokens
    ad.set_resolution(H, W)
    x = ad.initial_noise([1], H, W)  # 16 generated tokens (4x4)
    seen = {}

    def hook(module, args, kwargs, out):
        seen.update(hidden=kwargs["hidden_states"], ids=kwargs["img_ids"], out=out[0])

    handle = ad.transformer.register_forward_hook(hook, with_kwargs=True)
    with torch.no_grad():
        v = ad.predict_velocity(x, 0.7, emb, 3.5)
    handle.remove()
    expected_ids = [[0.0, r, c] for r in range(4) for c in range(4)] + [[1.0, r, c] for r in range(2) for c in range(3)]
    assert seen["ids"].tolist() == expected_ids
    assert seen["hidden"].shape == (1, 22, 16)
    assert torch.equal(seen["hidden"][:, :16], x)
    assert torch.equal(seen["hidden"][0, 16 + 1 * 3 + 2].view(4, 2, 2), emb.cond_latents[0, :, 2:4, 4:6])
    assert v.shape == x.shape and torch.equal(v, seen["out"][:, :16])
    with pytest.raises(ValueError, match="embedded guidance"):
        ad.predict_velocity(x, 0.5, emb, 3.5, cfg=True)


def test_kontext_lora_reference_is_the_base_model_with_context():
    base, ad = _kontext(), _kontext()
    torch.manual_seed(1)
    ad.add_lora(rank=4, alpha=8)
    with torch.no_grad():
        for n, p in ad.transformer.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # peft's B starts at 0: make the adapter non-trivial
    images = [_image(32, 48, 1), _image(32, 48, 2)]
    x = ad.initial_noise([1, 2], H, W)
    with torch.no_grad():
        v_lora = ad.predict_velocity(x, 0.5, ad.encode_prompts(["a", "b"], images=images), 3.5)
        with ad.reference():
            v_ref = ad.predict_velocity(x, 0.5, ad.encode_prompts(["a", "b"], images=images), 3.5)
        v_base = base.predict_velocity(x, 0.5, base.encode_prompts(["a", "b"], images=images), 3.5)
    assert torch.equal(v_ref, v_base) and not torch.allclose(v_lora, v_base)


def test_kontext_reference_size_follows_the_pipeline():
    ad = _kontext()
    # floored to multiples of 2 x VAE scale factor (16 px) without auto-resize
    assert ad._reference_size(_image(50, 83, 0)) == (48, 80)
    with pytest.raises(ValueError, match="smaller than 16"):
        ad._reference_size(_image(8, 40, 0))
    # auto-resize: the preferred Kontext resolution (w, h) of the closest aspect ratio; 80/48 = 1.667 is closest
    # to 1328/800 = 1.66 in diffusers' PREFERRED_KONTEXT_RESOLUTIONS
    ad.auto_resize = True
    assert ad._reference_size(_image(48, 80, 0)) == (800, 1328)
    assert ad._reference_size(_image(64, 64, 0)) == (1024, 1024)


def test_kontext_reference_table_from_jsonl_metadata(tmp_path):
    """The prompt-file format: JSONL lines with ``image`` (relative to the file); errors name the file/prompt."""
    from flow_grpo.data import load_prompts

    (tmp_path / "img").mkdir()
    _image(32, 48, 1).save(tmp_path / "img" / "a.png")
    _image(32, 48, 2).save(tmp_path / "img" / "b.png")
    src = tmp_path / "edits.jsonl"
    src.write_text(json.dumps({"prompt": "make it red", "image": "img/a.png"}) + "\n"
                   + json.dumps({"prompt": "add a hat", "image": "img/b.png", "tag": "hat"}) + "\n")
    prompts, meta = load_prompts(str(src))
    ad = _kontext()
    ad.bind_reference_images(prompts, meta, source=str(src))
    emb = ad.encode_prompts(["add a hat", "make it red", "add a hat"])
    explicit = ad.encode_prompts(["add a hat"], images=[Image.open(tmp_path / "img" / "b.png")])
    assert torch.equal(emb.cond_latents[0], explicit.cond_latents[0])
    assert torch.equal(emb.cond_latents[0], emb.cond_latents[2])
    assert not torch.equal(emb.cond_latents[0], emb.cond_latents[1])
    assert len(ad._ref_cache) == 3  # two paths + one pixel-content key; repeated prompts reuse the cache
    with pytest.raises(KeyError, match="no reference image"):
        ad.encode_prompts(["an unknown prompt"])
    with pytest.raises(ValueError, match="two reference images"):
        ad.bind_reference_images(["make it red"], [{"image": "img/b.png"}], source=str(src))
    with pytest.raises(FileNotFoundError, match="edits.jsonl: prompt #1"):
        ad.bind_reference_images(["x"], [{"image": "img/missing.png"}], source=str(src))
    with pytest.raises(ValueError, match="string field 'image'"):
        ad.bind_reference_images(["x"], [{}], source=str(src))
    with pytest.raises(ValueError, match="mixes"):
        ad.encode_prompts(["a", "b"], images=[_image(32, 48, 1), None])
    with pytest.raises(ValueError, match="same latent size"):
        ad.encode_prompts(["a", "b"], images=[_image(32, 48, 1), _image(48, 48, 1)])


def test_kontext_sampler_log_probs_are_exact_with_context():
    """The unchanged sampler and training path run on Kontext through the reference table: the training-path
    recomputation of a rollout's log-prob is bitwise the rollout's (on-policy ratio exactly 1)."""
    from flow_grpo.config import SamplingConfig
    from flow_grpo.sampler import sample_trajectories, score_column

    ad = _kontext()
    ad.set_reference_images({"make it red": _image(32, 48, 1), "add a hat": _image(32, 48, 2)})
    cfg = SamplingConfig(num_steps=4, height=H, width=W, guidance_scale=3.5, cfg=False, sde_kind="flow",
                         step_mode="all", batch_size=2)
    prompts = ["make it red", "make it red", "add a hat", "add a hat"]
    traj = sample_trajectories(ad, prompts, cfg, xt_seeds=[1, 2, 3, 4], noise_seeds=[5, 6, 7, 8],
                               plan_seeds=[0, 0, 1, 1], group_ids=[0, 0, 1, 1])
    assert traj.images.shape == (4, H, W, 3)
    with torch.no_grad():
        for chunk in traj.chunks:
            out = score_column(ad, traj, chunk, 1)
            assert torch.equal(out.log_prob, traj.log_probs[chunk[0]:chunk[1], 1])


# ------------------------------------------------------------------------------------------------ save / load
# Save/load keeps every stored value (weights compared bitwise); the computed latents are not bitwise reproducible
# across the layout change (see tests/conftest.py RoundTrip). Measured on the 3-step ODE latents (|x| <= 3.9):
# 1.7e-6 (SD3+T5, CFG 4.5) and 2.4e-7 (Kontext); ROUNDTRIP_ATOL (~40 ulps at |x| = 4) is exceeded 17-23x by one
# weight element moved by 1e-2 (measured 3.4e-4 and 4.7e-4; checked below).
ROUNDTRIP_ATOL = 2e-5


@pytest.mark.parametrize("kind", ["sd3_t5", "flux_kontext"])
def test_folder_roundtrip_through_load_adapter(kind, tmp_path, roundtrip):
    save_tiny_pipeline(str(tmp_path), kind=kind, seed=5)
    if kind == "sd3_t5":
        ad = load_adapter(str(tmp_path), max_sequence_length=16)
        ref = _sd3_t5(5, max_sequence_length=16)
        parts = ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3")
        assert ad.kind == "sd3" and type(ad.pipe.text_encoder_3).__name__ == "T5EncoderModel"
        prompt = "a bowl of fruit and a zebra"  # 'zebra' is out of the corpus: sub-pieces must survive the reload
        assert ad.pipe.tokenizer_3(prompt).input_ids == ref.pipe.tokenizer_3(prompt).input_ids
        emb_args, gs, cfg = ([prompt],), 4.5, True
    else:
        ad = load_adapter(str(tmp_path), auto_resize=False, max_sequence_length=16)
        ref = _kontext(5)
        parts = ("transformer", "vae", "text_encoder", "text_encoder_2")
        assert ad.kind == "flux_kontext" and type(ad.pipe).__name__ == "FluxKontextPipeline"
        emb_args, gs, cfg = (["make it red"], [_image(32, 48, 1)]), 3.5, False
    for part in parts:
        roundtrip.same_weights(getattr(ad.pipe, part), getattr(ref.pipe, part))
    x_ref = _ode(ref, ref.encode_prompts(*emb_args), [1], gs, cfg, steps=3)
    emb = ad.encode_prompts(*emb_args)
    x = _ode(ad, emb, [1], gs, cfg, steps=3)
    roundtrip.close(x, x_ref, atol=ROUNDTRIP_ATOL)
    roundtrip.images_close(ad.decode(x, H, W), ref.decode(x_ref, H, W))
    with torch.no_grad():
        ad.transformer.transformer_blocks[0].attn.to_out[0].weight[0, 0] += 1e-2
    with pytest.raises(AssertionError, match="not close"):
        roundtrip.close(_ode(ad, emb, [1], gs, cfg, steps=3), x_ref, atol=ROUNDTRIP_ATOL)


def test_kontext_trains_from_a_jsonl_prompt_file_with_reference_images(tmp_path):
    """The trainer binds each JSONL line's ``image`` (relative to the file) and trains the LoRA on edits."""
    from flow_grpo.config import load_train_config
    from flow_grpo.train.trainer import FlowGRPOTrainer

    from .conftest import block_reward, train_overrides

    for name, seed in (("a.png", 1), ("b.png", 2)):
        _image(32, 48, seed).save(tmp_path / name)
    src = tmp_path / "edits.jsonl"
    src.write_text('{"prompt": "make it red", "image": "a.png"}\n{"prompt": "add a hat", "image": "b.png"}\n')
    cfg = load_train_config(None, train_overrides("flux", "fast", tmp_path / "run", **{"data.train_path": str(src)}))
    tr = FlowGRPOTrainer(cfg, adapter=_kontext(), reward_fn={"block": block_reward})
    assert tr.adapter.reference_images == {"make it red": str(tmp_path / "a.png"), "add a hat": str(tmp_path / "b.png")}
    before = {n: p.detach().clone() for n, p in tr.named_params}
    m = tr.train()[-1]
    assert m["train/ratio_mean"] == 1.0
    assert any(not torch.equal(p.detach(), before[n]) for n, p in tr.named_params)
    assert tr.adapter.encode_prompts(["add a hat"]).cond_latents.shape == (1, 4, 4, 6)
