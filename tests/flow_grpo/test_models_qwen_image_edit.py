"""Qwen-Image-Edit adapter: equality with ``QwenImageEditPipeline.__call__`` from the same x_T, the reference's
resize by hand, the (prompt, image) text conditioning, errors, exact sampler log-probs with reference images from
the table, the ``from_pretrained`` folder round trip, and a training run from a JSONL prompt file.

The pipeline resizes every reference to 1024 x 1024 pixels' area (a 31 s VAE encode of the tiny VAE on this CPU),
so the tests run adapter and pipeline at a 64 x 64 area (``reference_area``, and the pipeline's
``calculate_dimensions`` patched to the same area); the release default is checked on its own. As for Qwen-Image,
the batched comparisons hand the pipeline our padded embeddings and masks (bitwise), and the comparison from the
prompt string (the pipeline then pads nothing) holds within a tolerance that a real bug exceeds."""
import numpy as np
import pytest
import torch
from PIL import Image

from flow_grpo.models import load_adapter
from flow_grpo.models.qwen_image_edit import RELEASE_REFERENCE_AREA
from flow_grpo.models import save_tiny_pipeline

from .conftest import as_uint8, tiny_adapter, tiny_ode

H = W = 64  # 16 generated tokens
STEPS = 3
MSL = 320  # the tiny template with a 64 x 64 reference: ~230 tokens
AREA = 64 * 64  # reference pixels in these tests (8x8 latents -> 16 context tokens)


@pytest.fixture
def small_area(monkeypatch):
    """The pipeline's reference resize at AREA pixels instead of its hard-coded 1024 x 1024."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit as mod

    orig = mod.calculate_dimensions
    monkeypatch.setattr(mod, "calculate_dimensions", lambda area, ratio: orig(AREA, ratio))


def _edit(seed=0, **kw):
    kw.setdefault("max_sequence_length", MSL)
    kw.setdefault("reference_area", AREA)
    return tiny_adapter("qwen_image_edit", seed, **kw)


def _image(h, w, seed):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


def _call(ad, img, **kw):
    return ad.pipe(img, height=H, width=W, num_inference_steps=STEPS, **kw)


def test_qwen_edit_from_the_prompt_string_matches_pipeline_call(small_area):
    """CFG 4 with negative prompt " ": our loop (padded, masked text) within 5e-6 of the pipeline's (unpadded);
    measured 9.5e-7 (|x| <= 3.7). Text encoded without the image, or no reference tokens, are far off."""
    ad = _edit()
    img = _image(40, 56, 0)
    emb = ad.encode_prompts(["make it red"], images=[img])
    assert emb.prompt_embeds.shape == (1, MSL, 64) and emb.cond_latents.shape == (1, 4, 8, 8)
    ours = tiny_ode(ad, emb, [3], 4.0, True, STEPS, H, W)
    kw = dict(negative_prompt=" ", true_cfg_scale=4.0, latents=ad.initial_noise([3], H, W))
    ref = _call(ad, img, prompt="make it red", output_type="latent", **kw).images
    torch.testing.assert_close(ours, ref, atol=5e-6, rtol=0)
    img_ours = ad.decode(ours, H, W)
    assert img_ours.float().std() > 1
    assert (img_ours.int() - as_uint8(_call(ad, img, prompt="make it red", output_type="np", **kw).images).int()
            ).abs().max() <= 1
    other = ad.encode_prompts(["make it red"], images=[_image(40, 56, 9)])  # the VLM saw another image
    broken = emb.index([0])
    broken.prompt_embeds, broken.prompt_mask = other.prompt_embeds, other.prompt_mask
    assert (tiny_ode(ad, broken, [3], 4.0, True, STEPS, H, W) - ref).abs().max() > 1e-3
    broken = emb.index([0])
    broken.cond_latents = torch.zeros_like(emb.cond_latents)
    assert (tiny_ode(ad, broken, [3], 4.0, True, STEPS, H, W) - ref).abs().max() > 1e-3


@pytest.mark.parametrize("gs,cfg", [(4.0, True), (1.0, False)])
def test_qwen_edit_batched_loop_matches_pipeline_call_bitwise(gs, cfg, small_area):
    ad = _edit()
    img = _image(48, 48, 1)  # the pipeline takes one reference per call
    emb = ad.encode_prompts(["make it red", "add a hat"], images=[img, img])
    ours = tiny_ode(ad, emb, [3, 4], gs, cfg, STEPS, H, W)
    neg = dict(negative_prompt_embeds=emb.neg_prompt_embeds, negative_prompt_embeds_mask=emb.neg_prompt_mask) if cfg else {}
    kw = dict(prompt_embeds=emb.prompt_embeds, prompt_embeds_mask=emb.prompt_mask, true_cfg_scale=gs,
              latents=ad.initial_noise([3, 4], H, W), **neg)
    assert torch.equal(ours, _call(ad, img, output_type="latent", **kw).images)
    assert torch.equal(ad.decode(ours, H, W), as_uint8(_call(ad, img, output_type="np", **kw).images))
    assert not torch.equal(ours[0], ours[1])


def test_qwen_edit_reference_size_by_hand_and_release_area(monkeypatch):
    """width = round(sqrt(A r) / 32) 32, height = round(sqrt(A / r) / 32) 32 with r = w / h, A = 1024^2 (the
    pipeline's, recorded from its own call)."""
    ad = _edit(reference_area=RELEASE_REFERENCE_AREA)
    assert RELEASE_REFERENCE_AREA == 1024 * 1024
    # 56 x 40: r = 1.4, sqrt(A r) = 1211.6 -> 1216, sqrt(A / r) = 865.4 -> 864
    assert ad.reference_size(_image(40, 56, 0)) == (864, 1216)
    assert ad.reference_size(_image(64, 64, 0)) == (1024, 1024)
    assert _edit().reference_size(_image(40, 56, 0)) == (64, 64)  # AREA: 75.7 -> 64, 54.1 -> 64
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit as mod

    seen = []

    def spy(area, ratio):
        seen.append(area)
        raise RuntimeError("stop")

    monkeypatch.setattr(mod, "calculate_dimensions", spy)
    with pytest.raises(RuntimeError, match="stop"):
        ad.pipe(_image(40, 56, 0), "x")
    assert seen == [ad.reference_area]


def test_qwen_edit_text_depends_on_the_image_and_errors(small_area):
    ad = _edit()
    a = ad.encode_prompts(["make it red"], images=[_image(48, 48, 1)])
    b = ad.encode_prompts(["make it red"], images=[_image(48, 48, 2)])
    assert not torch.equal(a.prompt_embeds, b.prompt_embeds) and not torch.equal(a.neg_prompt_embeds, b.neg_prompt_embeds)
    assert len(ad._edit_cache) == 2 and len(ad._ref_cache) == 2
    with pytest.raises(ValueError, match="needs a reference image"):
        ad.encode_prompts(["x"])
    with pytest.raises(ValueError, match="same latent size"):
        ad.encode_prompts(["x", "y"], images=[_image(48, 48, 1), _image(32, 96, 1)])
    with pytest.raises(ValueError, match="max_sequence_length=100"):
        _edit(max_sequence_length=100).encode_prompts(["x"], images=[_image(48, 48, 1)])


def test_qwen_edit_sampler_log_probs_are_exact_with_reference_table():
    from flow_grpo.config import SamplingConfig
    from flow_grpo.sampler import sample_trajectories, score_column

    ad = _edit()
    ad.set_reference_images({"make it red": _image(48, 48, 1), "add a hat": _image(40, 40, 2)})
    cfg = SamplingConfig(num_steps=3, height=H, width=W, guidance_scale=4.0, cfg=True, sde_kind="flow",
                         step_mode="all", batch_size=2)
    prompts = ["make it red", "make it red", "add a hat", "add a hat"]
    traj = sample_trajectories(ad, prompts, cfg, xt_seeds=[1, 2, 3, 4], noise_seeds=[5, 6, 7, 8],
                               plan_seeds=[0, 0, 1, 1], group_ids=[0, 0, 1, 1])
    assert traj.images.shape == (4, H, W, 3)
    with torch.no_grad():
        for chunk in traj.chunks:
            out = score_column(ad, traj, chunk, 1)
            assert torch.equal(out.log_prob, traj.log_probs[chunk[0]:chunk[1], 1])


# Weights compared bitwise; latents with the Qwen-Image tolerance. Measured on the 3-step CFG latents (|x| <= 3.5):
# 9.8e-7 apart; one weight element of img_in moved by 1e-2 moves them by 6.3e-3 (checked below).
ROUNDTRIP_ATOL = 5e-6


def test_qwen_edit_folder_roundtrip_through_load_adapter(tmp_path, roundtrip):
    save_tiny_pipeline(str(tmp_path), kind="qwen_image_edit", seed=5)
    ad = load_adapter(str(tmp_path), max_sequence_length=MSL, reference_area=AREA)
    assert ad.kind == "qwen_image_edit"
    ref = _edit(seed=5)
    for part in ("transformer", "vae", "text_encoder"):
        roundtrip.same_weights(getattr(ad.pipe, part), getattr(ref.pipe, part))
    img = _image(40, 56, 3)
    emb, emb_ref = ad.encode_prompts(["make it red"], images=[img]), ref.encode_prompts(["make it red"], images=[img])
    assert torch.equal(emb.prompt_mask, emb_ref.prompt_mask)  # same tokenization, vision tokens included
    x, x_ref = tiny_ode(ad, emb, [1], 4.0, True, STEPS, H, W), tiny_ode(ref, emb_ref, [1], 4.0, True, STEPS, H, W)
    roundtrip.close(x, x_ref, atol=ROUNDTRIP_ATOL)
    roundtrip.images_close(ad.decode(x, H, W), ref.decode(x_ref, H, W))
    with torch.no_grad():
        ad.transformer.img_in.weight[0, 0] += 1e-2
    with pytest.raises(AssertionError, match="not close"):
        roundtrip.close(tiny_ode(ad, emb, [1], 4.0, True, STEPS, H, W), x_ref, atol=ROUNDTRIP_ATOL)


def test_qwen_edit_trains_from_a_jsonl_prompt_file(tmp_path):
    """The trainer binds each JSONL line's ``image`` and trains the LoRA on edits (adapter injected: the tiny
    reference area is an adapter argument)."""
    from flow_grpo.config import load_train_config
    from flow_grpo.train.trainer import FlowGRPOTrainer

    from .conftest import block_reward, train_overrides

    for name, seed in (("a.png", 1), ("b.png", 2)):
        _image(48, 48, seed).save(tmp_path / name)
    src = tmp_path / "edits.jsonl"
    src.write_text('{"prompt": "make it red", "image": "a.png"}\n{"prompt": "add a hat", "image": "b.png"}\n')
    ov = {"data.train_path": str(src), "sample.cfg": "true", "sample.guidance_scale": 4.0, "data.eval_prompts": "[]"}
    cfg = load_train_config(None, train_overrides("sd3", "flow", tmp_path / "run", **ov))
    tr = FlowGRPOTrainer(cfg, adapter=_edit(), reward_fn={"block": block_reward})
    assert tr.adapter.reference_images == {"make it red": str(tmp_path / "a.png"), "add a hat": str(tmp_path / "b.png")}
    before = {n: p.detach().clone() for n, p in tr.named_params}
    m = tr.train()[-1]
    assert m["train/ratio_mean"] == 1.0
    assert any(not torch.equal(p.detach(), before[n]) for n, p in tr.named_params)
