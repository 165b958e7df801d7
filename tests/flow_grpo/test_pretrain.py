"""flow_grpo.pretrain (rectified-flow pre-training) and scripts/build_tiny_flow.py (the demo's base generator)."""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from flow_grpo.pretrain import (EMA, PretrainConfig, _drop_condition, encode_images, flow_matching_loss, lr_at,
                                pretrain, rectified_flow_pair, sample_sigmas)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def build():
    """scripts/build_tiny_flow.py imported as a module."""
    spec = importlib.util.spec_from_file_location("build_tiny_flow", REPO / "scripts" / "build_tiny_flow.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["build_tiny_flow"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench(build):
    return build.benchmark()


@pytest.fixture(scope="module")
def tiny_pipe(build):
    torch.manual_seed(0)
    return build.build_pipeline(seed=0, width=32, heads=2, layers=1, patch=2)


# ------------------------------------------------------------------------------------------------ math
def test_sample_sigmas_logit_normal_moments():
    g = torch.Generator().manual_seed(0)
    s = sample_sigmas(40_000, "logit_normal", mean=0.5, std=0.8, generator=g).double()
    logit = torch.log(s / (1 - s))
    assert abs(logit.mean().item() - 0.5) < 0.02
    assert abs(logit.std().item() - 0.8) < 0.02
    assert s.min() > 0 and s.max() < 1


def test_sample_sigmas_uniform_and_errors():
    g = torch.Generator().manual_seed(1)
    s = sample_sigmas(40_000, "uniform", generator=g)
    # U(0,1): mean 1/2, var 1/12, and the empirical CDF at 0.3 is 0.3
    assert abs(s.mean().item() - 0.5) < 0.01
    assert abs(s.var().item() - 1 / 12) < 0.003
    assert abs((s < 0.3).float().mean().item() - 0.3) < 0.01
    with pytest.raises(ValueError, match="unknown sigma schedule"):
        sample_sigmas(3, "cosine")
    with pytest.raises(ValueError, match="std"):
        sample_sigmas(3, "logit_normal", std=0.0)


def test_rectified_flow_pair_by_hand_and_derivative():
    x0 = torch.tensor([[1.0, -2.0], [0.5, 0.0]])
    eps = torch.tensor([[0.0, 1.0], [2.0, -1.0]])
    sigma = torch.tensor([0.25, 1.0])
    xt, v = rectified_flow_pair(x0, eps, sigma)
    # row 0: 0.75*x0 + 0.25*eps ; row 1: pure noise
    assert torch.allclose(xt, torch.tensor([[0.75, -1.25], [2.0, -1.0]]))
    assert torch.allclose(v, torch.tensor([[-1.0, 3.0], [1.5, -1.0]]))
    # v is d x_sigma / d sigma (central finite difference)
    h = 1e-3
    xp, _ = rectified_flow_pair(x0.double(), eps.double(), torch.tensor([0.3 + h, 0.6 + h], dtype=torch.float64))
    xm, _ = rectified_flow_pair(x0.double(), eps.double(), torch.tensor([0.3 - h, 0.6 - h], dtype=torch.float64))
    assert torch.allclose((xp - xm) / (2 * h), (eps - x0).double(), atol=1e-9)
    with pytest.raises(ValueError):
        rectified_flow_pair(x0, eps[:1], sigma)
    with pytest.raises(ValueError):
        rectified_flow_pair(x0, eps, sigma[:1])


def test_lr_schedule_endpoints():
    cfg = PretrainConfig(steps=110, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1)
    assert lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.1 + 0.9 * 0.5)  # half way: cos(pi/2) = 0
    assert lr_at(110, cfg) == pytest.approx(0.1)


def test_ema_by_hand():
    p = torch.nn.Parameter(torch.tensor([0.0]))
    ema = EMA([p], decay=0.9)
    with torch.no_grad():
        p.fill_(1.0)
    ema.update()  # d = min(0.9, 2/11)
    d1 = 2 / 11
    assert ema.shadow[0].item() == pytest.approx(d1 * 0 + (1 - d1) * 1.0)
    with torch.no_grad():
        p.fill_(3.0)
    ema.update()  # d = min(0.9, 3/12)
    d2 = 3 / 12
    expect = d2 * (1 - d1) + (1 - d2) * 3.0
    assert ema.shadow[0].item() == pytest.approx(expect)
    ema.copy_to()
    assert p.item() == pytest.approx(expect)


def test_drop_condition_rows():
    from flow_grpo.models.base import PromptEmbeds

    e = PromptEmbeds(prompt_embeds=torch.arange(12.0).view(3, 2, 2), pooled=torch.arange(6.0).view(3, 2),
                     neg_prompt_embeds=None, neg_pooled=None, text_ids=torch.zeros(2, 3))
    empty = PromptEmbeds(prompt_embeds=-torch.ones(1, 2, 2), pooled=-torch.ones(1, 2))
    out = _drop_condition(e, empty, torch.tensor([False, True, False]))
    assert torch.equal(out.prompt_embeds[0], e.prompt_embeds[0])
    assert torch.equal(out.prompt_embeds[1], -torch.ones(2, 2))
    assert torch.equal(out.pooled[1], -torch.ones(2))
    assert torch.equal(out.pooled[2], e.pooled[2])
    assert out.text_ids is e.text_ids


class _LinearAdapter:
    """Stand-in adapter: v = w * x (w a scalar parameter) - to check the loss against a closed form."""

    device = torch.device("cpu")

    def __init__(self, w):
        self.w = w

    def predict_velocity(self, x, sigma, embeds, guidance_scale=1.0, cfg=False):
        return self.w * x


def test_flow_matching_loss_closed_form():
    w = torch.tensor(0.5, requires_grad=True)
    ad = _LinearAdapter(w)
    x0 = torch.tensor([[1.0, 2.0], [-1.0, 0.0]])
    eps = torch.tensor([[0.5, -0.5], [1.0, 1.0]])
    sigma = torch.tensor([0.2, 0.8])
    loss = flow_matching_loss(ad, x0, None, sigma, eps)
    s = sigma[:, None]
    xt = (1 - s) * x0 + s * eps
    expect = ((0.5 * xt - (eps - x0)) ** 2).mean()
    assert loss.item() == pytest.approx(expect.item(), rel=1e-6)
    loss.backward()
    expect_grad = (2 * (0.5 * xt - (eps - x0)) * xt).mean()
    assert w.grad.item() == pytest.approx(expect_grad.item(), rel=1e-5)


# ------------------------------------------------------------------------------------------------ autoencoder
def test_palette_autoencoder_roundtrip(build, bench):
    vae = build.palette_autoencoder_kl(list(bench.COLORS.values()), bench.BACKGROUND)
    mds = bench.make_prompts(24, seed=3, split="heldout")
    imgs = np.stack([bench.render(m, 32, seed=i) for i, m in enumerate(mds)])
    x = torch.from_numpy(imgs).permute(0, 3, 1, 2).float() / 127.5 - 1
    with torch.no_grad():
        z = vae.encode(x).latent_dist.mode()
        rec = vae.decode(z).sample
    # independent coverage: fraction of each 2x2 cell with exactly colour k
    cols = list(bench.COLORS.values())
    cov = np.stack([(imgs == np.array(c)).all(-1) for c in cols], 1).astype(np.float64)
    cov = cov.reshape(24, len(cols), 16, 2, 16, 2).mean((3, 5))
    assert np.abs(z.numpy() - cov).max() < 1e-3
    out = ((rec / 2 + 0.5).clamp(0, 1) * 255).round().byte().permute(0, 2, 3, 1).numpy()
    assert all(bench.verify(out[i], mds[i])["correct"] for i in range(24))
    # decoder snaps: a soft coverage of 0.3 everywhere is background, 0.7 is full colour 0
    soft = torch.zeros(1, len(cols), 4, 4)
    soft[0, 0] = 0.3
    lo = vae.decode(soft).sample
    soft[0, 0] = 0.7
    hi = vae.decode(soft).sample
    to255 = lambda t: ((t / 2 + 0.5) * 255).round()[0, :, 3, 3].tolist()  # noqa: E731 (centre pixel)
    assert to255(lo) == list(map(float, bench.BACKGROUND))
    assert to255(hi) == list(map(float, cols[0]))


def test_palette_latents_shortcut_matches_vae(build, tiny_pipe, bench):
    from flow_grpo.models import adapter_from_pipeline

    ad = adapter_from_pipeline(tiny_pipe, max_sequence_length=build.DEMO_MAX_SEQUENCE_LENGTH)
    imgs, _ = build.RenderedBatches(6, 32, seed=0)(0)
    via_vae = encode_images(ad, imgs)
    assert via_vae.shape == (6, 4, 16, 16)
    assert torch.allclose(via_vae, build.palette_latents(tiny_pipe, imgs), atol=1e-3)


def test_render_slots_verifies_and_is_token_aligned(build, bench):
    """Every slot-layout render of the demo's tags passes the (unchanged) verifier, objects stay inside their own
    16 px cell (so neighbours are separated), and the batch function is deterministic in (seed, step)."""
    tags = ["single_object", "colors", "counting"]
    for split in ("train", "heldout"):
        for m in bench.all_prompts(split, tags=tags):
            for s in range(3):
                img = build.render_slots(m, 48, seed=s)
                assert img.shape == (48, 48, 3) and img.dtype == np.uint8
                v = bench.verify(img, m)
                assert v["correct"], (m["prompt"], s, v["details"])
                for o in v["details"]["objects"]:  # bbox within one cell, 1 px margin on each side
                    x0, y0, x1, y1 = o["bbox"]
                    assert x0 // 16 == x1 // 16 and y0 // 16 == y1 // 16
                    assert x0 % 16 >= 1 and y0 % 16 >= 1 and x1 % 16 <= 14 and y1 % 16 <= 14
    b = build.RenderedBatches(5, 48, seed=3, tags=tags, layout="slots")
    (i1, p1), (i2, p2) = b(7), b(7)
    assert p1 == p2 and np.array_equal(i1, i2) and i1.shape == (5, 48, 48, 3)
    with pytest.raises(ValueError, match="layout"):
        build.RenderedBatches(2, 48, seed=0, layout="grid")
    with pytest.raises(ValueError, match="single-entry"):
        build.render_slots(bench.all_prompts("train", tags=["position"])[0], 48, seed=0)
    with pytest.raises(ValueError, match="do not fit"):
        build.render_slots(bench.all_prompts("train", tags=["counting"])[0], 16, seed=0, slot=16)



def test_render_slots_fixed_order_fills_cells_in_reading_order(build, bench):
    """order="fixed" at 32 px (2 x 2 cells of 16 px): k objects occupy exactly cells 0..k-1 (reading order), the
    verifier accepts every render, and a bad order name is refused."""
    tags = ["single_object", "colors", "counting"]
    for m in bench.all_prompts("train", tags=tags):
        k = m["include"][0].get("count", 1)
        for s in range(3):
            img = build.render_slots(m, 32, seed=s, order="fixed")
            v = bench.verify(img, m)
            assert v["correct"], (m["prompt"], s, v["details"])
            cells = sorted((o["bbox"][1] // 16) * 2 + o["bbox"][0] // 16 for o in v["details"]["objects"])
            assert cells == list(range(k)), (m["prompt"], cells)
    with pytest.raises(ValueError, match="order"):
        build.render_slots(bench.all_prompts("train", tags=["counting"])[0], 32, seed=0, order="spiral")


def test_count_noise_changes_only_the_count_at_the_requested_rate(build, bench):
    """RenderedBatches(count_noise=q): the caption is always a train prompt; the image shows the caption's colour
    and shape, and its object count differs from the caption's with frequency ~q (binomial, 4 sigma), uniformly
    over the other counts 1-4. q = 0 reproduces the clean batches exactly."""
    tags = ["single_object", "colors", "counting"]
    meta = {m["prompt"]: m for m in bench.all_prompts("train", tags=tags)}
    q, n_steps, bs = 0.3, 40, 16
    noisy = build.RenderedBatches(bs, 32, seed=1, tags=tags, layout="slots", slot_order="fixed", count_noise=q)
    wrong, shown_counts = 0, []
    for step in range(n_steps):
        imgs, caps = noisy(step)
        for img, cap in zip(imgs, caps):
            e = meta[cap]["include"][0]
            objs = bench.segment_objects(img)[0]
            assert objs and all(o["shape"] == e["class"] for o in objs), cap
            if e.get("color"):
                assert all(o["color"] == e["color"] for o in objs), cap
            if len(objs) != e.get("count", 1):
                wrong += 1
                shown_counts.append(len(objs))
    n = n_steps * bs
    assert abs(wrong / n - q) < 4 * (q * (1 - q) / n) ** 0.5, wrong / n
    assert set(shown_counts) == {1, 2, 3, 4}
    clean = build.RenderedBatches(bs, 32, seed=1, tags=tags, layout="slots", slot_order="fixed")
    zero = build.RenderedBatches(bs, 32, seed=1, tags=tags, layout="slots", slot_order="fixed", count_noise=0.0)
    (a, pa), (b, pb) = clean(5), zero(5)
    assert pa == pb and np.array_equal(a, b)
    with pytest.raises(ValueError, match="count_noise"):
        build.RenderedBatches(2, 32, seed=0, count_noise=1.0)

def test_clip_tokenizer_words_match_open_clip(build):
    from open_clip.tokenizer import SimpleTokenizer

    words = build.benchmark_words()
    tok = build.build_clip_tokenizer(words)
    ref = SimpleTokenizer()
    for w in words:  # identical pieces to the full CLIP BPE (mostly whole words; "triangles" is tri + angles)
        assert tok.tokenize(w) == [ref.decoder[i] for i in ref.encode(w)]
    assert tok.tokenize("circle") == ["circle</w>"]
    prompts = [m["prompt"] for s in ("train", "heldout") for m in build.benchmark().all_prompts(s)]
    assert max(len(tok(p).input_ids) for p in prompts) <= build.CLIP_MAX_LENGTH  # no prompt is truncated
    ids = tok("a red circle").input_ids
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id and len(ids) == 5
    assert len(tok.tokenize("a purple hexagon")) > 3  # out-of-grammar text still tokenizes (byte pieces)


# ------------------------------------------------------------------------------------------------ training
def _fixed_batch_loss(ad, x0, embeds, sigma, noise):
    with torch.no_grad():
        return flow_matching_loss(ad, x0, embeds, sigma, noise).item()


def test_pretrain_loss_decreases_sd3(build, tiny_pipe):
    from flow_grpo.models import adapter_from_pipeline

    ad = adapter_from_pipeline(tiny_pipe, max_sequence_length=build.DEMO_MAX_SEQUENCE_LENGTH)
    batch = build.RenderedBatches(8, 32, seed=0)
    imgs, prompts = batch(0)
    x0 = build.palette_latents(tiny_pipe, imgs)
    g = torch.Generator().manual_seed(0)
    sigma = sample_sigmas(8, generator=g)
    noise = torch.randn(x0.shape, generator=g)
    before = _fixed_batch_loss(ad, x0, ad.encode_prompts(prompts), sigma, noise)
    hist = pretrain(ad, lambda step: (imgs, prompts), PretrainConfig(steps=12, lr=3e-3, warmup_steps=0, log_every=0),
                    encode_fn=lambda a, im: build.palette_latents(tiny_pipe, im))
    after = _fixed_batch_loss(ad, x0, ad.encode_prompts(prompts), sigma, noise)
    assert hist["steps"] == 12 and not hist["stopped_early"]
    assert after < 0.8 * before, (before, after)
    assert not any(p.requires_grad for p in ad.transformer.parameters())


def test_pretrain_runs_through_flux_adapter():
    """The same loop on a FLUX pipeline (packed tokens, VAE encode path) from the project's tiny builders."""
    from flow_grpo.models import adapter_from_pipeline
    from flow_grpo.models.tiny import build_tiny_flux_pipeline

    pipe = build_tiny_flux_pipeline(seed=0, guidance_embeds=False)
    ad = adapter_from_pipeline(pipe, max_sequence_length=8)
    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, size=(4, 64, 64, 3), dtype=np.uint8)
    prompts = ["a red circle", "two blue squares", "a cat", "a dog"]
    x0 = encode_images(ad, imgs)
    assert x0.shape == (4, 16, 16)  # 8x8 latent, 2x2-packed -> 16 tokens of 4*4 channels
    g = torch.Generator().manual_seed(0)
    sigma, noise = sample_sigmas(4, generator=g), torch.randn(x0.shape, generator=g)
    before = _fixed_batch_loss(ad, x0, ad.encode_prompts(prompts), sigma, noise)
    pretrain(ad, lambda step: (imgs, prompts), PretrainConfig(steps=15, lr=3e-3, warmup_steps=0, log_every=0,
                                                              cond_dropout=0.0))
    after = _fixed_batch_loss(ad, x0, ad.encode_prompts(prompts), sigma, noise)
    assert after < 0.8 * before, (before, after)


def test_pretrain_time_budget_stops_early(build, tiny_pipe):
    from flow_grpo.models import adapter_from_pipeline

    ad = adapter_from_pipeline(tiny_pipe, max_sequence_length=build.DEMO_MAX_SEQUENCE_LENGTH)
    batch = build.RenderedBatches(2, 32, seed=1)
    hist = pretrain(ad, batch, PretrainConfig(steps=10_000, max_seconds=1e-9, log_every=0),
                    encode_fn=lambda a, im: build.palette_latents(tiny_pipe, im))
    assert hist["stopped_early"] and hist["steps"] < 10_000
    with pytest.raises(ValueError, match="images but"):
        pretrain(ad, lambda s: (batch(0)[0], ["x"]), PretrainConfig(steps=1, log_every=0),
                 encode_fn=lambda a, im: build.palette_latents(tiny_pipe, im))


# ------------------------------------------------------------------------------------------------ save / reload
def test_saved_pipeline_reloads_and_reproduces_images(build, tiny_pipe, tmp_path, roundtrip):
    from diffusers import StableDiffusion3Pipeline

    from flow_grpo.models import load_adapter

    tiny_pipe.save_pretrained(str(tmp_path))
    prompts, seeds = ["a red circle", "two blue squares"], [11, 12]
    a = build.generate(tiny_pipe, prompts, seeds, steps=4)
    re = StableDiffusion3Pipeline.from_pretrained(str(tmp_path), text_encoder_3=None, tokenizer_3=None)
    re.set_progress_bar_config(disable=True)
    b = build.generate(re, prompts, seeds, steps=4)
    assert a.shape == (2, 32, 32, 3) and a.dtype == np.uint8
    # across save/load (conftest.RoundTrip): the weights bit for bit, the images to one uint8 level
    for part in ("transformer", "vae", "text_encoder", "text_encoder_2"):
        roundtrip.same_weights(getattr(re, part), getattr(tiny_pipe, part))
    roundtrip.images_close(b, a)
    assert re.tokenizer("a red circle").input_ids == tiny_pipe.tokenizer("a red circle").input_ids
    # the project's loader takes the same folder, and its decode matches the pipeline's
    ad = load_adapter(str(tmp_path), max_sequence_length=build.DEMO_MAX_SEQUENCE_LENGTH)
    assert ad.kind == "sd3"
    lat = torch.randn(1, re.vae.config.latent_channels, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = re.vae.decode(lat / re.vae.config.scaling_factor + re.vae.config.shift_factor).sample
    ref = ((ref / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)
    assert torch.equal(ad.decode(lat, 32, 32), ref)


# ------------------------------------------------------------------------------------------------ shipped base
SHIPPED = REPO / "data" / "checkpoints" / "tiny_flow"


def test_shipped_base_loads_and_generates(build, bench):
    """The demo's shipped base: both loaders take it, images have the recorded size, and the recorded settings
    are the ones the demo reads (scripts/demo.py t2i)."""
    import json

    from diffusers import StableDiffusion3Pipeline

    from flow_grpo.models import load_adapter
    from flow_grpo.config import SamplingConfig
    from flow_grpo.sampler import generate_images

    demo = json.loads((SHIPPED / "mmgrpo_demo.json").read_text())
    info = json.loads((SHIPPED / "build_info.json").read_text())
    ev = json.loads((SHIPPED / "eval.json").read_text())
    size, seqlen = demo["height"], demo["max_sequence_length"]
    assert demo["width"] == size and seqlen == build.DEMO_MAX_SEQUENCE_LENGTH
    assert set(demo["tags"]) <= set(bench.TAGS) and set(ev["per_tag"]) == set(demo["tags"])
    assert info["command"].startswith("python scripts/build_tiny_flow.py") and 0.0 <= ev["accuracy"] <= 1.0
    total = sum(f.stat().st_size for f in SHIPPED.rglob("*") if f.is_file())
    assert total < 12 * 2 ** 20, f"shipped base is {total / 2 ** 20:.1f} MiB"
    pipe = StableDiffusion3Pipeline.from_pretrained(str(SHIPPED), text_encoder_3=None, tokenizer_3=None)
    pipe.set_progress_bar_config(disable=True)
    imgs = build.generate(pipe, ["a red circle", "two blue squares"], [0, 1], steps=3, size=size)
    assert imgs.shape == (2, size, size, 3) and imgs.dtype == np.uint8
    # not a blank canvas: some palette-coloured pixels
    assert (imgs != np.array(bench.BACKGROUND, dtype=np.uint8)).any(-1).sum() > 0
    ad = load_adapter(str(SHIPPED), max_sequence_length=seqlen)
    assert ad.kind == "sd3"
    scfg = SamplingConfig(num_steps=3, height=size, width=size, guidance_scale=1.0, cfg=False)
    out = generate_images(ad, ["a red circle", "a blue square"], [0, 1], scfg)
    assert tuple(out.shape) == (2, size, size, 3) and out.dtype == torch.uint8


def test_builder_smoke_main(build, tmp_path):
    """The builder's CLI end to end at toy scale: pipeline folder + the three JSON records the demo relies on."""
    import json

    out = tmp_path / "tf"
    rc = build.main(["--out", str(out), "--steps", "2", "--batch-size", "2", "--width", "32", "--heads", "2",
                     "--layers", "1", "--eval-per-tag", "1", "--eval-steps", "2", "--tags", "colors", "counting",
                     "--threads", "1"])
    assert rc == 0
    demo = json.loads((out / "mmgrpo_demo.json").read_text())
    info = json.loads((out / "build_info.json").read_text())
    ev = json.loads((out / "eval.json").read_text())
    assert demo["tags"] == ["colors", "counting"] and demo["num_inference_steps"] == 2
    assert "--tags colors counting" in info["command"] and info["train_steps"] == 2
    assert set(ev["per_tag"]) == {"colors", "counting"} and ev["n"] == 2
    assert (out / "model_index.json").exists()
