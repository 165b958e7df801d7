#!/usr/bin/env python
"""Build the tiny text-to-image base generator of the CPU demo (mini-GenEval), in a few minutes, no downloads.

    python scripts/build_tiny_flow.py --out runs/tiny_flow --seed 0 [--tags single_object colors counting]

What it builds (details, the shipped reference command and measured numbers: docs/demo_models.md, T2I section):

* a ``StableDiffusion3Pipeline`` folder (``save_pretrained``; reload with ``flow_grpo.models.load_adapter(out)`` or
  ``StableDiffusion3Pipeline.from_pretrained(out, text_encoder_3=None, tokenizer_3=None)``):
  - ``vae``: :func:`palette_autoencoder_kl`, a hand-set ``AutoencoderKL`` (scale factor 2) whose latent is the
    per-palette-colour coverage of each 2x2 pixel cell (4 channels, 16x16 at 32 px); decoding snaps soft coverage
    back to crisp flat colours;
  - ``transformer``: a small ``SD3Transformer2DModel`` on that latent (``--patch 4``: 4x4 latent cells = 8x8 px per
    token, 16 image tokens at 32 px);
  - ``text_encoder``/``text_encoder_2``: tiny random CLIP text encoders (trained jointly with ``--train-text``);
    ``tokenizer``/``tokenizer_2``: the real CLIP BPE (open_clip's merges) cut down to the merges the benchmark's
    words use (they tokenize exactly as with the full CLIP vocabulary, mostly one token per word);
  - no T5 (``text_encoder_3=None``): the pipeline appends ``max_sequence_length`` all-zero text tokens, so sampling
    must use the same ``max_sequence_length`` as training (``mmgrpo_demo.json`` in the folder records it, with the
    image size, sampling steps, benchmark tags and the demo's eval protocol);
* pre-trained with the rectified-flow loss (:mod:`flow_grpo.pretrain`) on images drawn by
  ``mmgrpo.synthetic.t2i.render`` for *train-split* prompts of ``--tags`` (rendered on the fly, fresh layout per
  sample);
* evaluated on held-out prompts of ``--tags`` with ``mmgrpo.synthetic.t2i.verify`` through the pipeline call
  (``eval.json``: ``--eval-per-tag`` samples per tag, accuracy = mean over tags).

Training is step-based (``--steps``) so the result does not depend on machine load; ``--seconds`` is a safety cap
(if it stops training early the run is not the reference one, and ``build_info.json`` says so).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mmgrpo.utils.portable import portable_argv, portable_record  # noqa: E402

DEMO_MAX_SEQUENCE_LENGTH = 1  # zero "T5" tokens appended by the SD3 pipeline (no T5 encoder): keep it tiny
CLIP_MAX_LENGTH = 12          # longest mini-GenEval prompt: 10 words -> 12 tokens (whole-word tokens + bos/eos)


# ----------------------------------------------------------------------------------------------- tokenizer
def _byte_symbols() -> list[str]:
    """CLIP/GPT-2 reversible byte -> printable character table, in CLIP's vocab order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    codes, extra = [], 0
    table = {}
    for b in printable:
        table[b] = chr(b)
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    # CLIP orders the base vocab as the printable bytes first, then the remapped ones
    for b in printable:
        codes.append(table[b])
    for b in range(256):
        if b not in printable:
            codes.append(table[b])
    return codes


def _clip_merges() -> list[tuple[str, str]]:
    import open_clip

    path = os.path.join(os.path.dirname(open_clip.__file__), "bpe_simple_vocab_16e6.txt.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    # CLIP uses the first 49152 - 256 - 2 merges of the file (line 0 is a header)
    return [tuple(line.split()) for line in lines[1: 49152 - 256 - 2 + 1]]


def _merges_used(word: str, ranks: dict[tuple[str, str], int]) -> list[tuple[str, str]]:
    """Merges BPE applies to ``word`` (lowest rank first, all occurrences at once), in application order."""
    sym = list(word[:-1]) + [word[-1] + "</w>"]
    used = []
    while len(sym) > 1:
        pairs = {(sym[i], sym[i + 1]) for i in range(len(sym) - 1)}
        best = min(pairs, key=lambda p: ranks.get(p, float("inf")))
        if best not in ranks:
            break
        used.append(best)
        out, i = [], 0
        while i < len(sym):
            if i < len(sym) - 1 and (sym[i], sym[i + 1]) == best:
                out.append(sym[i] + sym[i + 1])
                i += 2
            else:
                out.append(sym[i])
                i += 1
        sym = out
    return used


def build_clip_tokenizer(words, model_max_length: int = CLIP_MAX_LENGTH):
    """A ``CLIPTokenizer`` with CLIP's byte alphabet and only the real CLIP merges that ``words`` need (kept in
    CLIP's rank order), so each of ``words`` tokenizes exactly as with the full CLIP tokenizer (BPE applies merges
    by rank, and every merge it applies to these words is kept); any other text still tokenizes, into smaller
    pieces."""
    from transformers import CLIPTokenizer

    merges = _clip_merges()
    ranks = {m: i for i, m in enumerate(merges)}
    needed = set()
    for w in words:
        needed.update(_merges_used(w, ranks))
    kept = [m for m in merges if m in needed]
    base = _byte_symbols()
    vocab_list = base + [b + "</w>" for b in base] + ["".join(m) for m in kept] + ["<|startoftext|>", "<|endoftext|>"]
    vocab = {t: i for i, t in enumerate(vocab_list)}
    return CLIPTokenizer(vocab=vocab, merges=kept, model_max_length=model_max_length)


# ----------------------------------------------------------------------------------------------- autoencoder
def palette_autoencoder_kl(palette, background, snap: float = 8.0, threshold: float = 0.5, sharpness: float = 100.0,
                           scaling_factor: float = 2.0, shift_factor: float = 0.5, a: float = 1e-3, c: float = 1.0):
    """A hand-set ``AutoencoderKL`` (VAE scale factor 2) for flat-colour images over a known palette.

    Latent (K = len(palette) channels, H/2 x W/2): the *coverage* of each 2x2 pixel cell by palette colour k,
    ``z_k = avgpool2(m_k)`` with ``m_k = 1[pixel == col_k]`` (values in {0, 1/4, 1/2, 3/4, 1}). The default
    normalisation ``(z - 1/2) * 2`` puts model-space latents in [-1, 1].

    * Encoder (exact on pure palette/background pixels): ``m_k = clamp(p_k, 0, 1)``,
      ``p_k = (f_k(x) - t_k) / (f_k(col_k) - t_k)``, ``f_k(x) = (col_k - mean(colours, bg)) . x`` (each colour is
      a vertex of the colours' convex hull, so f_k separates it; t_k sits a quarter of the margin above the best
      other colour), then the 2x2 average (the Downsample2D conv).
    * Decoder: nearest x2 upsampling, a [1,2,1] x [1,2,1] / 16 blur (the Upsample2D conv), then a snap
      ``s_k = clamp(snap (b_k - threshold) + 1/2, 0, 1)`` and ``rgb = bg + sum_k s_k (col_k - bg)``. On encoded renders
      this reproduces images that pass ``verify`` (blur + threshold 1/2 of the coverage); on generated latents
      the snap turns soft coverage into crisp flat colours.

    How the fixed diffusers layout (2 blocks of 4K+2 channels, 1 GroupNorm group, no attention, no quant convs)
    computes this: ResNet blocks are ``x + conv2(silu(norm2(conv1(silu(norm1(x))))))``; all are the identity
    (``conv2 = 0``) except the first encoder block, which holds the per-pixel classifier. Every linear signal u is
    carried as a channel pair ``(+a u, -a u)`` next to two constant channels ``(+c, -c)``: a GroupNorm over such
    channels has mean exactly 0 and a variance equal to its constant part ``2 c^2 / C`` up to a relative
    ``a^2 sum u^2 / c^2`` (< 1e-5 here), so it is a known scaling; ``silu(y) - silu(-y) = y`` passes a pair through
    a SiLU exactly; and GroupNorm's affine turns a pair member into a steep pre-activation ``K (alpha u + beta)``,
    with ``relu(q) ~= silu(K q) / K`` (K = ``sharpness``) and ``clamp(q, 0, 1) = relu(q) - relu(q - 1)``.
    The encoder's log-variance is the constant -30 (std 3e-7), so ``latent_dist.sample() ~= mode()``.
    """
    import numpy as np
    import torch
    from diffusers import AutoencoderKL

    cols = np.asarray(palette, dtype=np.float64) / 127.5 - 1.0  # (K, 3) in [-1, 1]
    bg = np.asarray(background, dtype=np.float64) / 127.5 - 1.0
    k_n = len(cols)
    ch = 4 * k_n + 2
    if ch < 8 + 2 * k_n:
        raise ValueError("need at least 3 palette colours")
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(ch, ch), layers_per_block=1,
        latent_channels=k_n, norm_num_groups=1, sample_size=32, scaling_factor=scaling_factor,
        shift_factor=shift_factor, mid_block_add_attention=False, use_quant_conv=False, use_post_quant_conv=False)
    v0 = 2 * c * c / ch      # GroupNorm variance of every normalised activation here
    g = v0 ** 0.5 / a        # GroupNorm output of a pair member = u / g

    # per-colour linear classifier p_k = alpha_k . x + beta_k (1 at col_k, <= -1/3 at every other colour / bg)
    pts = np.concatenate([cols, bg[None]])
    alpha, beta = np.zeros((k_n, 3)), np.zeros(k_n)
    for k in range(k_n):
        w = cols[k] - pts.mean(0)
        f = pts @ w
        best_other = np.delete(f, k).max()
        if f[k] - best_other <= 1e-3:
            raise ValueError(f"palette colour {k} is not linearly separable from the other colours")
        t = best_other + 0.25 * (f[k] - best_other)
        alpha[k], beta[k] = w / (f[k] - t), -t / (f[k] - t)

    def center(conv, o, i, v):
        conv.weight[o, i, conv.weight.shape[2] // 2, conv.weight.shape[3] // 2] = float(v)

    with torch.no_grad():
        for prm in vae.parameters():
            prm.zero_()
        for m in vae.modules():
            if isinstance(m, torch.nn.GroupNorm):
                m.weight.fill_(1.0)
        # ---------------- encoder. channels: 0-5 rgb pairs, 6/7 constants, 8.. mask pairs (2K)
        enc = vae.encoder
        for j in range(3):
            center(enc.conv_in, 2 * j, j, a)
            center(enc.conv_in, 2 * j + 1, j, -a)
        enc.conv_in.bias[6], enc.conv_in.bias[7] = c, -c
        res = enc.down_blocks[0].resnets[0]
        # conv1: unit u = 2k ("p_k") and 2k+1 ("p_k - 1") as pairs on channels 2u, 2u+1; constants on ch-2, ch-1
        for k in range(k_n):
            for u in (2 * k, 2 * k + 1):
                for j in range(3):
                    wgt = alpha[k, j] * g  # x_j = (silu(y_2j) - silu(y_2j+1)) * g
                    center(res.conv1, 2 * u, 2 * j, wgt * a)
                    center(res.conv1, 2 * u, 2 * j + 1, -wgt * a)
                    center(res.conv1, 2 * u + 1, 2 * j, -wgt * a)
                    center(res.conv1, 2 * u + 1, 2 * j + 1, wgt * a)
                bias_u = beta[k] - (1.0 if u % 2 else 0.0)
                res.norm2.weight[2 * u] = sharpness * g  # (a * alpha.x) / g * (K g / a) -> K alpha.x
                res.norm2.bias[2 * u] = sharpness * bias_u
        res.conv1.bias[ch - 2], res.conv1.bias[ch - 1] = c, -c
        for k in range(k_n):  # mask pairs written into channels 8 + 2k, 9 + 2k
            for sign, o in ((1.0, 8 + 2 * k), (-1.0, 9 + 2 * k)):
                center(res.conv2, o, 2 * (2 * k), sign * a / sharpness)
                center(res.conv2, o, 2 * (2 * k + 1), -sign * a / sharpness)
        down = enc.down_blocks[0].downsamplers[0].conv  # pad (0,1,0,1), 3x3, stride 2 -> taps [0:2, 0:2] = 2x2 mean
        for o in range(ch):
            down.weight[o, o, 0:2, 0:2] = 0.25
        for k in range(k_n):  # conv_out: mean_k = (silu(y+) - silu(y-)) * g ; logvar = -30
            center(enc.conv_out, k, 8 + 2 * k, g)
            center(enc.conv_out, k, 9 + 2 * k, -g)
        enc.conv_out.bias[k_n:] = -30.0
        # ---------------- decoder. channels: 4k, 4k+1 (+a z_k, two units), 4k+2, 4k+3 (-a z_k), ch-2/ch-1 constants
        dec = vae.decoder
        for k in range(k_n):
            for o, sgn in ((4 * k, 1), (4 * k + 1, 1), (4 * k + 2, -1), (4 * k + 3, -1)):
                center(dec.conv_in, o, k, sgn * a)
        dec.conv_in.bias[ch - 2], dec.conv_in.bias[ch - 1] = c, -c
        up = dec.up_blocks[0].upsamplers[0].conv
        blur = torch.tensor([1.0, 2.0, 1.0])
        blur = (blur[:, None] * blur[None, :]) / 16.0
        for o in range(4 * k_n):
            up.weight[o, o] = blur
        center(up, ch - 2, ch - 2, 1.0)
        center(up, ch - 1, ch - 1, 1.0)
        gn, co = dec.conv_norm_out, dec.conv_out
        for k in range(k_n):
            for o, off in ((4 * k, 0.0), (4 * k + 1, -1.0)):  # P = K (snap (b - thr) + 1/2 + off)
                gn.weight[o] = sharpness * snap * g
                gn.bias[o] = sharpness * (0.5 - threshold * snap + off)
            for j in range(3):
                co.weight[j, 4 * k, 1, 1] = float((cols[k, j] - bg[j]) / sharpness)
                co.weight[j, 4 * k + 1, 1, 1] = float(-(cols[k, j] - bg[j]) / sharpness)
        co.bias[:] = torch.tensor(bg, dtype=co.bias.dtype)
    return vae


# ----------------------------------------------------------------------------------------------- pipeline
def benchmark():
    from mmgrpo.synthetic import t2i as bench

    return bench


def benchmark_words() -> list[str]:
    bench = benchmark()
    prompts = [m["prompt"] for s in ("train", "heldout") for m in bench.all_prompts(s)]
    return sorted({w for p in prompts for w in p.split()})


def pixel_stats(size: int, n: int = 512, seed: int = 0) -> tuple[float, float]:
    """Mean and std of rendered train images in [-1, 1] (all pixels, all channels): the VAE shift/scale."""
    import numpy as np

    bench = benchmark()
    mds = bench.make_prompts(n, seed=seed, split="train")
    imgs = np.stack([bench.render(m, size, seed=seed * 7919 + i) for i, m in enumerate(mds)]).astype(np.float64)
    x = imgs / 127.5 - 1.0
    return float(x.mean()), float(x.std())


def build_pipeline(seed: int = 0, size: int = 32, width: int = 128, heads: int = 4, layers: int = 4,
                   patch: int = 4, shift: float = 1.0, text_hidden: int = 32, zero_init: bool = True):
    """Untrained tiny ``StableDiffusion3Pipeline`` (see module docstring)."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    if width % heads:
        raise ValueError(f"width {width} must be divisible by heads {heads}")
    if size % (2 * patch):
        raise ValueError(f"size {size} must be divisible by 2 * patch = {2 * patch} (VAE scale factor 2)")
    torch.manual_seed(seed)
    words = benchmark_words()
    toks, encs = [], []
    for _ in range(2):
        tok = build_clip_tokenizer(words)
        cfg = CLIPTextConfig(
            vocab_size=len(tok), hidden_size=text_hidden, intermediate_size=2 * text_hidden, num_hidden_layers=2,
            num_attention_heads=4, max_position_embeddings=CLIP_MAX_LENGTH, projection_dim=text_hidden,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        toks.append(tok)
        encs.append(CLIPTextModelWithProjection(cfg).eval())
    bench = benchmark()
    vae = palette_autoencoder_kl(list(bench.COLORS.values()), bench.BACKGROUND)
    channels = vae.config.latent_channels
    transformer = SD3Transformer2DModel(
        sample_size=size // 2, patch_size=patch, in_channels=channels, out_channels=channels, num_layers=layers,
        attention_head_dim=width // heads, num_attention_heads=heads, joint_attention_dim=2 * text_hidden,
        caption_projection_dim=width, pooled_projection_dim=2 * text_hidden, pos_embed_max_size=size // 2 // patch)
    if zero_init:
        from flow_grpo.pretrain import adaln_zero_init_

        adaln_zero_init_(transformer)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, scheduler=scheduler, vae=vae, text_encoder=encs[0], tokenizer=toks[0],
        text_encoder_2=encs[1], tokenizer_2=toks[1], text_encoder_3=None, tokenizer_3=None)
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ----------------------------------------------------------------------------------------------- data
def render_slots(metadata, size: int, seed: int, slot: int = 16, order: str = "random"):
    """A *slot-layout* render of ``metadata`` (single-entry prompts: one shape/colour, any count): the image is a
    grid of ``slot`` x ``slot`` px cells (``slot`` = two 8-px transformer tokens at patch 4), each object fills one
    random free cell with a ``d x d`` shape, ``d`` uniform in ``[slot - 4, slot - 2]``, at a random offset inside
    its cell (so neighbours keep a gap of at least 2 px). Same palette, background and shape drawing as
    ``mmgrpo.synthetic.t2i.render``; only the layout is simpler (token-aligned cells, no free placement), which a
    tiny patch-4 transformer learns much faster. ``order="fixed"`` fills the cells in reading order instead (the
    layout is then a function of the count; only size and offset vary). ``verify`` accepts every such image
    (tested)."""
    import random

    import numpy as np
    from PIL import Image, ImageDraw

    bench = benchmark()
    inc = metadata["include"]
    if len(inc) != 1 or "position" in inc[0]:
        raise ValueError(f"slot layout supports single-entry prompts only, got {metadata.get('prompt')!r}")
    n_side = size // slot
    e = inc[0]
    k = int(e.get("count", 1))
    if k > n_side * n_side:
        raise ValueError(f"{k} objects do not fit {n_side}x{n_side} slots at {size}px")
    rng = random.Random(seed)
    if order not in ("random", "fixed"):
        raise ValueError(f"order must be 'random' or 'fixed', got {order!r}")
    cells = rng.sample(range(n_side * n_side), k) if order == "random" else list(range(k))
    img = Image.new("RGB", (size, size), bench.BACKGROUND)
    draw = ImageDraw.Draw(img)
    for c in cells:
        col = bench.COLORS[e.get("color") or rng.choice(list(bench.COLORS))]
        d = rng.randint(slot - 4, slot - 2)
        x0 = (c % n_side) * slot + 1 + rng.randint(0, slot - 2 - d)
        y0 = (c // n_side) * slot + 1 + rng.randint(0, slot - 2 - d)
        bench._draw_shape(draw, e["class"], x0, y0, d, col)  # the benchmark's own shape drawing
    return np.asarray(img, dtype=np.uint8).copy()


class RenderedBatches:
    """``batch_fn(step)`` for :func:`flow_grpo.pretrain.pretrain`: train-split prompts (tag-uniform, as
    ``make_prompts``), each rendered with a fresh seed. Deterministic in (seed, step). ``layout="benchmark"``
    draws with ``mmgrpo.synthetic.t2i.render`` (free placement); ``"slots"`` with :func:`render_slots`.

    ``count_noise`` q > 0 models noisy web captions: with probability q an image shows a *different* number of
    objects (uniform over the other counts 1-4) than its caption says; colour and shape stay right. The base then
    learns to draw well but to follow the count in the prompt only partly (about 1 - q of its training pairs)."""

    def __init__(self, batch_size: int, size: int, seed: int, tags=None, layout: str = "benchmark", slot: int = 16,
                 slot_order: str = "random", count_noise: float = 0.0):
        import random

        if layout not in ("benchmark", "slots"):
            raise ValueError(f"layout must be 'benchmark' or 'slots', got {layout!r}")
        if not 0.0 <= count_noise < 1.0:
            raise ValueError(f"count_noise must be in [0, 1), got {count_noise}")
        self.layout, self.slot, self.slot_order, self.count_noise = layout, slot, slot_order, count_noise
        self.bench = benchmark()
        self.batch_size, self.size, self.seed = batch_size, size, seed
        self.by_tag = {}
        for m in self.bench.all_prompts("train", tags=tags):
            self.by_tag.setdefault(m["tag"], []).append(m)
        self.tags = sorted(self.by_tag)
        self._random = random.Random

    def __call__(self, step: int):
        import numpy as np

        rng = self._random(self.seed * 1_000_003 + step)
        mds = [rng.choice(self.by_tag[rng.choice(self.tags)]) for _ in range(self.batch_size)]
        shown = [self._with_noisy_count(m, rng) for m in mds] if self.count_noise > 0 else mds
        if self.layout == "benchmark":
            imgs = np.stack([self.bench.render(m, self.size, seed=rng.getrandbits(31)) for m in shown])
        else:
            imgs = np.stack([render_slots(m, self.size, seed=rng.getrandbits(31), slot=self.slot,
                                          order=self.slot_order) for m in shown])
        return imgs, [m["prompt"] for m in mds]  # captions always of the drawn prompt, images maybe not

    def _with_noisy_count(self, m: dict, rng) -> dict:
        if rng.random() >= self.count_noise:
            return m
        e = m["include"][0]
        k = int(e.get("count", 1))
        counts = (1, *self.bench.COUNTS)  # every count the benchmark's prompts ask for
        return dict(m, include=[dict(e, count=rng.choice([c for c in counts if c != k]))])


def palette_latents(pipe, images):
    """Exact shortcut of the palette VAE's encoder for pure palette/background images (what ``render`` draws):
    2x2 mean of one {0, 1} mask per palette colour, normalised like the pipeline, ``(z - shift) * scale``
    (B, K, H/2, W/2). About 50x cheaper than the VAE; the tests check both agree."""
    import numpy as np
    import torch

    bench = benchmark()
    imgs = np.asarray(images)
    masks = np.stack([(imgs == np.asarray(c, dtype=imgs.dtype)).all(-1) for c in bench.COLORS.values()], 1)
    b, k, h, w = masks.shape
    cov = masks.astype(np.float32).reshape(b, k, h // 2, 2, w // 2, 2).mean((3, 5))
    cfg = pipe.vae.config
    return (torch.from_numpy(cov) - (cfg.shift_factor or 0.0)) * cfg.scaling_factor


# ----------------------------------------------------------------------------------------------- eval
def heldout_eval_set(per_tag: int = 32, seed: int = 1234, tags=None) -> list[tuple[dict, int]]:
    """(metadata, noise seed) pairs: for every tag (default: all), cycle through its held-out prompts until
    ``per_tag`` samples."""
    bench = benchmark()
    out = []
    for tag in (tags or bench.TAGS):
        mds = bench.all_prompts("heldout", tags=[tag])
        for i in range(per_tag):
            out.append((mds[i % len(mds)], seed * 100_003 + len(out)))
    return out


def generate(pipe, prompts, seeds, steps: int = 10, guidance_scale: float = 1.0, size: int = 32):
    """uint8 (B, H, W, 3) from the pipeline call, one CPU generator per sample."""
    import numpy as np
    import torch

    gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
    out = pipe(prompt=list(prompts), num_inference_steps=steps, guidance_scale=guidance_scale, height=size,
               width=size, generator=gens, output_type="np", max_sequence_length=DEMO_MAX_SEQUENCE_LENGTH)
    return (np.clip(out.images, 0, 1) * 255).round().astype(np.uint8)


def evaluate(pipe, eval_set, steps: int = 10, guidance_scale: float = 1.0, size: int = 32, batch: int = 32) -> dict:
    """Strict accuracy and mean partial score per tag (and their mean over tags, GenEval-style)."""
    bench = benchmark()
    res: dict[str, list] = {}
    for i in range(0, len(eval_set), batch):
        chunk = eval_set[i: i + batch]
        imgs = generate(pipe, [m["prompt"] for m, _ in chunk], [s for _, s in chunk], steps, guidance_scale, size)
        for (m, _), img in zip(chunk, imgs):
            v = bench.verify(img, m)
            res.setdefault(m["tag"], []).append((float(v["correct"]), v["score"]))
    per_tag = {t: {"accuracy": sum(c for c, _ in r) / len(r), "score": sum(s for _, s in r) / len(r), "n": len(r)}
               for t, r in res.items()}
    return {"per_tag": per_tag,
            "accuracy": sum(v["accuracy"] for v in per_tag.values()) / len(per_tag),
            "score": sum(v["score"] for v in per_tag.values()) / len(per_tag),
            "steps": steps, "guidance_scale": guidance_scale, "n": len(eval_set)}


# ----------------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/tiny_flow", help="output pipeline folder")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seconds", type=float, default=240.0, help="wall-clock cap for training (safety net)")
    p.add_argument("--steps", type=int, default=1500, help="optimizer steps (the reference build)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--tags", nargs="+", default=None,
                   help="benchmark tags to train and evaluate on (default: all of mmgrpo.synthetic.t2i.TAGS)")
    p.add_argument("--layout", default="benchmark", choices=["benchmark", "slots"],
                   help="training renders: the benchmark's free placement, or token-aligned slots (render_slots)")
    p.add_argument("--slot-order", default="random", choices=["random", "fixed"],
                   help="slots layout: objects fill random free cells, or the cells in reading order")
    p.add_argument("--count-noise", type=float, default=0.0,
                   help="probability that a training image shows another object count than its caption (noisy "
                        "captions; 0 = every caption right)")
    p.add_argument("--slot", type=int, default=16,
                   help="slots layout: cell size in px (best a multiple of the transformer token, 2 * patch px)")
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--patch", type=int, default=4)
    p.add_argument("--shift", type=float, default=1.0, help="scheduler shift saved in the pipeline")
    p.add_argument("--no-zero-init", action="store_true", help="keep diffusers' default init (no adaLN-Zero)")
    p.add_argument("--ema", type=float, default=0.0, help="EMA decay of the weights (0 = off)")
    p.add_argument("--cond-dropout", type=float, default=0.1)
    p.add_argument("--train-text", action="store_true", help="train the tiny CLIP text encoders jointly")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    p.add_argument("--eval-per-tag", type=int, default=32, help="held-out samples per tag (0 = skip eval)")
    p.add_argument("--eval-steps", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=0, help="also evaluate every N steps (development)")
    p.add_argument("--demo-images-per-prompt", type=int, default=8,
                   help="images per held-out prompt the demo's eval/generate_t2i.py uses (mmgrpo_demo.json)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from flow_grpo.models import adapter_from_pipeline
    from flow_grpo.pretrain import PretrainConfig, pretrain

    t_start = time.perf_counter()
    pipe = build_pipeline(seed=args.seed, size=args.size, width=args.width, heads=args.heads, layers=args.layers,
                          patch=args.patch, shift=args.shift,
                          zero_init=not args.no_zero_init)
    adapter = adapter_from_pipeline(pipe, max_sequence_length=DEMO_MAX_SEQUENCE_LENGTH)
    n_params = {name: sum(p.numel() for p in getattr(pipe, name).parameters())
                for name in ("transformer", "vae", "text_encoder", "text_encoder_2")}
    print(f"params: {n_params}", flush=True)
    eval_set = heldout_eval_set(args.eval_per_tag, tags=args.tags) if args.eval_per_tag > 0 else []
    batches = RenderedBatches(args.batch_size, args.size, args.seed, tags=args.tags, layout=args.layout, slot=args.slot,
                             slot_order=args.slot_order, count_noise=args.count_noise)

    def log(rec):
        print(f"step {rec['step']:5d} loss {rec['loss']:.4f} lr {rec['lr']:.2e} {rec['seconds']:.0f}s", flush=True)
        if args.eval_every and rec["step"] % args.eval_every == 0 and eval_set:
            pipe.transformer.eval()
            ev = evaluate(pipe, eval_set, args.eval_steps, size=args.size)
            pipe.transformer.train()
            print("  eval", json.dumps({t: round(v["accuracy"], 3) for t, v in ev["per_tag"].items()}),
                  f"acc {ev['accuracy']:.3f} score {ev['score']:.3f}", flush=True)

    cfg = PretrainConfig(steps=args.steps, lr=args.lr, warmup_steps=min(100, args.steps // 10), seed=args.seed,
                         cond_dropout=args.cond_dropout, ema_decay=args.ema,
                         train_text_encoders=args.train_text, max_seconds=args.seconds, log_every=50)
    t_train = time.perf_counter()
    hist = pretrain(adapter, batches, cfg, on_log=log,
                    encode_fn=lambda ad, imgs: ad.pack(palette_latents(pipe, imgs).to(ad.device)))
    train_seconds = time.perf_counter() - t_train
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(str(out), safe_serialization=True)
    build_seconds = time.perf_counter() - t_start
    demo = {"pipeline": "StableDiffusion3Pipeline", "height": args.size, "width": args.size,
            "max_sequence_length": DEMO_MAX_SEQUENCE_LENGTH, "num_inference_steps": args.eval_steps,
            "guidance_scale": 1.0, "cfg": False, "tags": list(args.tags or benchmark().TAGS),
            "eval_images_per_prompt": args.demo_images_per_prompt,
            "load": "StableDiffusion3Pipeline.from_pretrained(dir, text_encoder_3=None, tokenizer_3=None)"}
    anchor = out.resolve().parent  # paths outside the repository are recorded relative to this folder
    cmd = "python scripts/build_tiny_flow.py " + " ".join(shlex.quote(a) for a in portable_argv(
        argv if argv is not None else sys.argv[1:], anchor))
    demo["build_command"] = cmd
    (out / "mmgrpo_demo.json").write_text(json.dumps(demo, indent=2) + "\n")
    info = {"command": cmd, "args": portable_record(vars(args), anchor), "params": n_params,
            "train_steps": hist["steps"],
            "train_seconds": train_seconds,
            "build_seconds": build_seconds, "stopped_early": hist["stopped_early"],
            "final_loss": sum(hist["losses"][-50:]) / max(1, len(hist["losses"][-50:])),
            "torch_threads": torch.get_num_threads(), "load_avg": os.getloadavg()}
    if eval_set:
        t = time.perf_counter()
        gen_set = eval_set[:8]
        generate(pipe, [m["prompt"] for m, _ in gen_set], [s for _, s in gen_set], args.eval_steps, size=args.size)
        info["pipeline_seconds_8_images"] = time.perf_counter() - t
        ev = evaluate(pipe, eval_set, args.eval_steps, size=args.size)
        (out / "eval.json").write_text(json.dumps(ev, indent=2) + "\n")
        info["heldout_accuracy"] = ev["accuracy"]
        print("heldout", json.dumps({t: round(v["accuracy"], 3) for t, v in ev["per_tag"].items()}),
              f"acc {ev['accuracy']:.3f} score {ev['score']:.3f}", flush=True)
    (out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps({k: v for k, v in info.items() if k != "args"}, indent=1), flush=True)
    if hist["stopped_early"]:
        print(f"WARNING: stopped after {hist['steps']}/{args.steps} steps (--seconds {args.seconds}); "
              "this is not the reference build", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
