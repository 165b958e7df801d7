#!/usr/bin/env python
"""Build the tiny text-to-video base generator of the CPU T2V demo (Mini-T2V, issue #22 item 5), no downloads.

    python scripts/build_tiny_t2v.py --out runs/tiny_t2v [--seconds 840] [--direction-noise 0.3] [--eval-per-prompt 1]

The shipped base of the T2V demo (``data/checkpoints/tiny_t2v``, ~11 min on one core; docs/demo_models.md, "T2V")
is ``--demo`` (:data:`DEMO_RECIPE`; options given on the command line override it)::

    python scripts/build_tiny_t2v.py --demo --out data/checkpoints/tiny_t2v

Its text encoder (the tiny UMT5) gets a supervised warm-up and is then frozen (``--text-pretrain-steps 1500
--no-train-text``), as a real Wan's pre-trained UMT5 is: without it the encoder is a bag of words and the base goes
left for "from left to right" half of the time. Its deliberate weakness is ``--ghost-noise 0.6``: 60 % of its
training clips also show a still distractor of another colour in the top-left cell, so it draws one in about half of
its samples, which the motion verifier's ``extra`` check (and GRPO on it) can remove. Without ``--demo`` the
defaults are the round-1 pilot (free layout, patch 4, width 96), which does not draw clean objects; every option is
a step of the pilots in docs/history/demo_models.md.

What it builds (measured numbers and the pilots: docs/demo_models.md, "T2V"):

* a ``WanPipeline`` folder (``save_pretrained``; reload with ``flow_grpo.models.load_adapter(out)``):
  - ``vae``: :func:`identity_wan_vae`, a hand-set ``AutoencoderKLWan`` with no down/up-sampling (spatial and
    temporal factor 1) whose latent *is* the clip's RGB in [-1, 1] (3 channels), up to float error. Why not the
    tiny random Wan VAE of :mod:`flow_grpo.models.tiny_wan`: it cannot reconstruct anything (random weights; the
    builder prints its reconstruction error), and training a 3-D VAE is not affordable in a CPU build. Every
    residual branch and attention projection is zeroed (identity blocks); the only non-linear parts left, the
    heads' RMS-norm + SiLU, are made linear to ~1e-4 by carrying the signal at 1e-3 of a large constant channel
    (RMS-norm then divides by ~that constant) and rescaling after SiLU (``silu(e) = e/2 + O(e^2)``);
  - ``transformer``: a small ``WanTransformer3DModel`` with patch (1, ``--patch``, ``--patch``) on that
    pixel-space latent (``--patch 4``, width 96: 64 tokens per frame at 32 px, 576 for 9 frames; patch 8 at
    width 64 cannot carry a token's 192 noise numbers and its samples stay noise, docs/demo_models.md);
  - ``text_encoder``: the tiny random ``UMT5EncoderModel`` + hand-built tokenizer of ``tiny_wan`` (frozen unless
    ``--train-text``).
* training: rectified flow (:func:`flow_grpo.pretrain.pretrain`) on Mini-T2V reference clips
  (:func:`mmgrpo.synthetic.t2v.render_clip`) of the *train* split, tags ``motion`` / ``count_motion`` /
  ``two_motion`` / ``order``, with the deliberate weakness below.
* **Weakness (direction noise)**: with probability ``--direction-noise`` per training clip that has at least one
  moving object, the clip is rendered with the *first* moving entry's direction replaced by another one (uniform
  over the other three); the caption stays the drawn prompt. So the base follows the prompt's direction only
  partly, which the motion verifier's direction check (and GRPO on it) can fix. :func:`noisy_spec` is the rule.
* ``build_info.json``: command, args, parameter counts, VAE reconstruction errors (identity VAE and tiny random
  VAE), steps, seconds, final loss, load average, count of noised clips.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import time
from pathlib import Path

from mmgrpo.utils.portable import portable_argv, portable_record

DEMO_MAX_SEQUENCE_LENGTH = 32  # UMT5 tokens (Mini-T2V prompts are short); --text-len overrides it
TAGS = ("motion", "count_motion", "two_motion", "order")
_K = 1000.0   # constant channel carried through the VAE heads (RMS-norm then divides by ~_K)
_EPS = 1e-3   # signal scale inside the heads: SiLU(e) = e/2 + O(e^2), so the head is linear to ~e/2 relative
# --demo: the shipped base's build (round 5 in docs/demo_models.md); argparse dests -> values
DEMO_RECIPE = {"abs_pos": True, "paths": "fixed", "layout": "aligned", "move_cells": 3, "tags": ["motion"],
               "frames": 5, "patch": 8, "width": 256, "heads": 4, "layers": 2, "batch_size": 16, "train_text": False,
               "text_pretrain_steps": 1500,
               "word_tokens": True, "text_len": 12, "sigma_mean": 2.0, "sigma_std": 1.5, "direction_noise": 0.0,
               "ghost_noise": 0.6, "steps": 3200, "seconds": 3000.0, "eval_per_prompt": 8}


# ----------------------------------------------------------------------------------------------- VAE
def identity_wan_vae(base_dim: int = 4, latent_mean: float = 0.0, latent_std: float = 0.5):
    """A hand-set ``AutoencoderKLWan`` (``dim_mult=[1]``, no resampling, ``scale_factor_temporal/spatial=1``):
    encode ``x`` (B, 3, F, H, W) in [-1, 1] -> latent mean = x; decode latent -> x (clamped to [-1, 1]).

    Channels inside: 0..2 carry the RGB, channel 3 a constant ``_K`` (set by a conv bias), so each head's RMS-norm
    divides by ~``_K`` (relative error |x|^2 / (2 K^2)); the norm gains bring the RGB to ``_EPS`` scale before the
    SiLU and the output conv multiplies back by ``2 / _EPS`` (error ~``_EPS / 2`` relative). ``latents_mean/std``
    (per channel) normalise the model-space latent: ``z = (x - mean) / std``."""
    import torch
    from diffusers import AutoencoderKLWan

    if base_dim < 4:
        raise ValueError(f"base_dim must be >= 4 (3 RGB channels + 1 constant), got {base_dim}")
    vae = AutoencoderKLWan(base_dim=base_dim, z_dim=3, dim_mult=[1], num_res_blocks=1, temperal_downsample=[],
                           latents_mean=[latent_mean] * 3, latents_std=[latent_std] * 3,
                           scale_factor_temporal=1, scale_factor_spatial=1)
    with torch.no_grad():
        for p in vae.parameters():
            p.zero_()
        for m in vae.modules():  # RMS-norm gains back to 1 (zeroed above), re-set in the heads below
            if type(m).__name__ == "WanRMS_norm":
                m.gamma.fill_(1.0)
        # every residual branch / attention output is zero already (all convs zeroed): blocks are identities

        def center(conv, pairs, bias=None):
            """Causal 3x3x3 (or 1x1x1) conv: out[o] += w * in[i] at the current frame, centre pixel."""
            kt = conv.weight.shape[2] - 1
            ks = conv.weight.shape[3] // 2
            for o, i, w in pairs:
                conv.weight[o, i, kt, ks, ks] = w
            if bias is not None:
                for o, b in bias.items():
                    conv.bias[o] = b

        rgb = [(c, c, 1.0) for c in range(3)]
        scale = (base_dim ** 0.5)  # WanRMS_norm multiplies by sqrt(dim)
        # encoder: rgb -> [rgb, K]; head: norm -> rgb * _EPS (gamma), SiLU, conv_out -> mean = rgb, logvar = -30
        center(vae.encoder.conv_in, rgb, bias={3: _K})
        vae.encoder.norm_out.gamma.fill_(_K * _EPS / scale)
        center(vae.encoder.conv_out, [(c, c, 2.0 / _EPS) for c in range(3)], bias={3 + c: -30.0 for c in range(3)})
        center(vae.quant_conv, [(c, c, 1.0) for c in range(6)])
        center(vae.post_quant_conv, [(c, c, 1.0) for c in range(3)])
        center(vae.decoder.conv_in, rgb, bias={3: _K})
        vae.decoder.norm_out.gamma.fill_(_K * _EPS / scale)
        center(vae.decoder.conv_out, [(c, c, 2.0 / _EPS) for c in range(3)])
    return vae


def vae_roundtrip_error(vae, clip) -> float:
    """Max |decode(encode(x).mode()) - x| in uint8 levels for one uint8 clip (F, H, W, 3)."""
    import numpy as np
    import torch

    x = torch.from_numpy(np.asarray(clip)).permute(3, 0, 1, 2)[None].float() / 127.5 - 1.0
    with torch.no_grad():
        z = vae.encode(x).latent_dist.mode()
        y = vae.decode(z).sample
    f = min(x.shape[2], y.shape[2])
    return float(((y[:, :, :f] - x[:, :, :f]).abs().max() * 127.5))


# ----------------------------------------------------------------------------------------------- pipeline
def build_pipeline(seed: int = 0, width: int = 64, heads: int = 2, layers: int = 2, patch: int = 8,
                   shift: float = 1.0, zero_init: bool = True, word_tokens: bool = False, abs_pos: bool = False):
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from flow_grpo.models.tiny_tokenizers import build_t5_unigram_tokenizer
    from flow_grpo.pretrain import adaln_zero_init_

    torch.manual_seed(seed)
    # word_tokens: every word of the Mini-T2V train prompts is one token. The shared tiny vocabulary splits
    # "circle", "left", "right", ... into characters, and the longest prompts then exceed the 32-token text
    # length: "a blue triangle moves from right to left" is 37 tokens, cut inside its last word.
    extra = [m["prompt"] for m in __import__("mmgrpo.synthetic.t2v", fromlist=["all_prompts"]).all_prompts(
        "train")] if word_tokens else []
    tok = build_t5_unigram_tokenizer(extra_corpus=extra)
    te = UMT5EncoderModel(UMT5Config(
        vocab_size=len(tok), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        decoder_start_token_id=tok.pad_token_id,
    ))
    if width % heads:
        raise ValueError(f"--width {width} must be a multiple of --heads {heads}")
    if abs_pos:  # Wan + a fixed 3-D sin-cos position embedding (flow_grpo/models/wan_abspos.py says why)
        from flow_grpo.models.wan_abspos import WanAbsPosTransformer3DModel as WanTransformer3DModel  # noqa: N814
    transformer = WanTransformer3DModel(
        patch_size=(1, patch, patch), num_attention_heads=heads, attention_head_dim=width // heads, in_channels=3,
        out_channels=3, text_dim=32, freq_dim=32, ffn_dim=2 * width, num_layers=layers, rope_max_seq_len=64,
    )
    if zero_init:
        with torch.no_grad():  # Wan's final projection: start from a zero velocity (adaLN-Zero style)
            transformer.proj_out.weight.zero_()
            transformer.proj_out.bias.zero_()
        adaln_zero_init_(transformer)
    pipe = WanPipeline(tokenizer=tok, text_encoder=te, transformer=transformer, vae=identity_wan_vae(),
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=shift))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def pretrain_text_encoder(pipe, steps: int, text_len: int, tags=("motion",), seed: int = 0, lr: float = 3e-3,
                          batch_size: int = 32) -> dict:
    """Supervised warm-up of the tiny UMT5 (``--text-pretrain-steps``): a linear probe on the masked mean of its
    token outputs classifies the first entry's colour, shape and direction of the Mini-T2V *train* prompts
    (cross-entropy, AdamW); the probe is thrown away. Why: trained only through the diffusion loss, the random
    2-layer encoder stays a bag of words ("from left to right" and "from right to left" get the same token
    outputs up to a few %, and the transformer's cross-attention sees text tokens as a set), so the base cannot
    follow left / right. A real Wan's UMT5 comes pre-trained; this is the tiny model's stand-in. Returns the first /
    last loss and the probe's accuracy per label on the train prompts and on the val prompts (new colour x shape x
    direction combinations: does the encoder's reading of word order carry over?)."""
    import torch

    from mmgrpo.synthetic.t2v import COLORS, DIRECTIONS, SHAPES, all_prompts

    names = {"color": list(COLORS), "shape": list(SHAPES), "direction": [*DIRECTIONS, "none"]}

    def data(split):
        specs = all_prompts(split, tags=list(tags))
        y = {k: torch.tensor([v.index(m["objects"][0][k]) for m in specs]) for k, v in names.items()}
        return specs, y, pipe.tokenizer([m["prompt"] for m in specs], padding="max_length", max_length=text_len,
                                        truncation=True, add_special_tokens=True, return_attention_mask=True,
                                        return_tensors="pt")

    specs, y, tok = data("train")
    te = pipe.text_encoder
    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():  # the probe's init comes from its own seed (the encoder's dropout still draws)
        torch.manual_seed(seed)
        heads = torch.nn.ModuleDict({k: torch.nn.Linear(te.config.d_model, len(v)) for k, v in names.items()})
    flags = [q.requires_grad for q in te.parameters()]
    te.requires_grad_(True)  # the adapter freezes the text encoder; a warm-up with it frozen trains only the probe
    opt = torch.optim.AdamW([*te.parameters(), *heads.parameters()], lr=lr, weight_decay=0.0)
    te.train()

    def forward(idx, tok=tok, y=y):
        mask = tok.attention_mask[idx]
        h = te(tok.input_ids[idx], mask).last_hidden_state
        pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        logits = {k: head(pooled) for k, head in heads.items()}
        return logits, sum(torch.nn.functional.cross_entropy(logits[k], y[k][idx]) for k in names)

    losses = []
    for _ in range(steps):
        idx = torch.randint(len(specs), (batch_size,), generator=g)
        _, loss = forward(idx)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    te.eval()
    for q, f in zip(te.parameters(), flags):
        q.requires_grad_(f)
    acc = {}
    with torch.no_grad():
        for split in ("train", "val"):
            sp, ys, tk = data(split)
            logits, _ = forward(torch.arange(len(sp)), tk, ys)
            acc[split] = {k: float((logits[k].argmax(-1) == ys[k]).float().mean()) for k in names}
    return {"steps": steps, "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
            "accuracy": acc}


# ----------------------------------------------------------------------------------------------- data
def noisy_spec(spec: dict, rng: random.Random, p: float) -> tuple[dict, bool]:
    """The direction-noise rule: with probability ``p`` (one ``rng.random()`` draw per spec *with a mover*; specs
    without a moving entry draw nothing and are returned unchanged), the first entry whose direction is not
    ``"none"`` gets another direction, ``rng.choice`` of the other three in ``DIRECTIONS`` order. Returns
    ``(spec_to_render, noised)``; the input is not modified."""
    from mmgrpo.synthetic.t2v import DIRECTIONS

    movers = [i for i, e in enumerate(spec["objects"]) if e["direction"] != "none"]
    if not movers or rng.random() >= p:
        return spec, False
    i = movers[0]
    objs = [dict(e) for e in spec["objects"]]
    objs[i]["direction"] = rng.choice([d for d in DIRECTIONS if d != objs[i]["direction"]])
    return dict(spec, objects=objs), True


# --paths fixed: the cell a mover keeps across its axis (row for left / right, column for up / down), per direction
FIXED_ACROSS = {"right": 1, "left": 2, "down": 1, "up": 2}
# --ghost-noise: the (column, row) cell of the distractor; the top-left corner is on none of the fixed paths
GHOST_CELL = (0, 0)


def render_aligned(spec: dict, size: int = 32, frames: int = 5, cell: int = 8, move_cells: int = 2,
                   seed: int = 0, paths: str = "random", stall: bool = False, ghost: tuple[str, str] | None = None):
    """A token-aligned reference clip of ``spec`` (the ``--layout aligned`` training data): uint8 (F, H, W, 3).

    The frame is a grid of ``cell`` px cells (``cell`` = the transformer's patch = the shape size, so each token
    holds either background or one whole shape). Every object sits exactly in one cell on every frame. A mover
    starts in a random cell from which it can go ``move_cells`` cells its way, and on frame k is
    ``floor(k * move_cells / (F - 1))`` cells along (so at 5 frames and 2 cells: 0, 0, 1, 1, 2); its other
    coordinate is random and constant. Still objects ("none") sit in a random cell. Objects of one clip never
    share a cell. ``paths="fixed"``: one path per direction instead: a mover starts at the edge it leaves
    (column / row 0 for right / down, the last one for left / up) and keeps the cell ``FIXED_ACROSS[direction]``
    across its axis (single-entry specs only; ``seed`` then changes nothing). ``stall=True`` (the ``--stall-noise``
    weakness): every mover stays in its start cell on every frame (same start cell and RNG draws as without it), so
    the clip fails the verifier's direction check only. ``ghost=(colour, shape)`` (the ``--ghost-noise``
    weakness, ``paths="fixed"`` only): a still distractor of that colour (not one of the spec's) and shape sits in
    ``GHOST_CELL`` on every frame; the clip fails the verifier's ``extra`` check only. Only specs whose entries all
    have count 1 and order 0 (tags ``motion`` and ``two_motion``): others raise ValueError. The verifier accepts
    these clips (tested) as long as ``move_cells * cell >= min_move * size`` (16 px >= 8 px at the defaults)."""
    import numpy as np

    from mmgrpo.synthetic.t2v import BACKGROUND, COLORS, validate_spec
    from mmgrpo.synthetic.shapes import _shape_mask

    objs = validate_spec(spec)
    if any(e["count"] != 1 or e["order"] != 0 for e in objs):
        raise ValueError(f"render_aligned: only count-1, order-0 entries (tags motion / two_motion), got "
                         f"{spec.get('prompt')!r}")
    if paths not in ("random", "fixed"):
        raise ValueError(f"render_aligned: paths must be 'random' or 'fixed', got {paths!r}")
    if ghost is not None and (paths != "fixed" or ghost[0] in {e["color"] for e in objs}):
        raise ValueError(f"render_aligned: a ghost needs paths='fixed' and a colour outside the spec, got {ghost} "
                         f"for {spec.get('prompt')!r}")
    if paths == "fixed" and len(objs) != 1:
        raise ValueError(f"render_aligned: paths='fixed' takes single-entry specs (tag motion), got "
                         f"{spec.get('prompt')!r}")
    g = size // cell
    if paths == "fixed" and max(FIXED_ACROSS.values()) >= g:
        raise ValueError(f"render_aligned: paths='fixed' needs more than {max(FIXED_ACROSS.values())} cells per side")
    if g * cell != size or move_cells >= g or frames < 2:
        raise ValueError(f"render_aligned: size {size} must be a multiple of cell {cell} with more than "
                         f"move_cells {move_cells} cells per side, frames {frames} >= 2")
    rng = random.Random(seed)
    axis_sign = {"left": (0, -1), "right": (0, 1), "up": (1, -1), "down": (1, 1)}
    for _attempt in range(200):
        tracks = []  # per object: list of (col, row) per frame
        for e in objs:
            if e["direction"] == "none":
                c = (rng.randrange(g), rng.randrange(g))
                tracks.append([c] * frames)
                continue
            axis, sign = axis_sign[e["direction"]]
            if paths == "fixed":
                a, b = (g - 1 if sign < 0 else 0), FIXED_ACROSS[e["direction"]]
            else:
                a = rng.randrange(g - move_cells) + (move_cells if sign < 0 else 0)
                b = rng.randrange(g)
            steps = [0 if stall else sign * (k * move_cells // (frames - 1)) for k in range(frames)]
            tracks.append([(a + s, b) if axis == 0 else (b, a + s) for s in steps])
        if all(len(set(p[k] for p in tracks)) == len(tracks) for k in range(frames)):
            break
    else:
        raise RuntimeError(f"render_aligned: could not place {spec.get('prompt')!r}")
    clip = np.empty((frames, size, size, 3), np.uint8)
    clip[:] = BACKGROUND
    if ghost is not None:
        objs, tracks = objs + [{"color": ghost[0], "shape": ghost[1]}], tracks + [[GHOST_CELL] * frames]
    for e, path in zip(objs, tracks):
        m = _shape_mask(e["shape"], cell)
        for k, (cx, cy) in enumerate(path):
            clip[k, cy * cell:(cy + 1) * cell, cx * cell:(cx + 1) * cell][m] = COLORS[e["color"]]
    return clip


class ClipBatches:
    """``batch_fn(step) -> (uint8 (B, F, H, W, 3), prompts)`` of train-split Mini-T2V clips; captions are always
    the drawn prompt, clips follow :func:`noisy_spec`. ``self.noised`` / ``self.drawn`` count clips.
    ``layout="free"``: the benchmark's :func:`render_clip`; ``"aligned"``: :func:`render_aligned` (``cell``,
    ``move_cells``, ``paths``; ``stall_noise``: :func:`render_aligned`'s ``stall`` with that probability per clip
    with a mover, counted in ``self.stalled``; ``ghost_noise``: a still distractor of a random other colour and
    random shape in ``GHOST_CELL`` with that probability per clip, counted in ``self.ghosted``)."""

    def __init__(self, batch_size: int, size: int, frames: int, seed: int, direction_noise: float = 0.0,
                 tags=TAGS, layout: str = "free", cell: int = 8, move_cells: int = 2, paths: str = "random",
                 stall_noise: float = 0.0, ghost_noise: float = 0.0):
        from mmgrpo.synthetic.t2v import all_prompts

        self.batch_size, self.size, self.frames, self.p = batch_size, size, frames, direction_noise
        self.layout, self.cell, self.move_cells, self.paths = layout, cell, move_cells, paths
        self.specs = all_prompts("train", tags=list(tags))
        if stall_noise and layout != "aligned":
            raise ValueError("stall_noise needs layout='aligned'")
        if ghost_noise and paths != "fixed":
            raise ValueError("ghost_noise needs layout='aligned' and paths='fixed'")
        self.stall_noise, self.ghost_noise = stall_noise, ghost_noise
        self.rng = random.Random(seed)
        self.noised = self.drawn = self.stalled = self.ghosted = 0

    def __call__(self, step: int):
        import numpy as np

        from mmgrpo.synthetic.t2v import COLORS, SHAPES, render_clip

        clips, prompts = [], []
        for _ in range(self.batch_size):
            spec = self.rng.choice(self.specs)
            shown, noised = noisy_spec(spec, self.rng, self.p)
            self.noised += noised
            self.drawn += 1
            seed = self.rng.getrandbits(31)
            # one extra draw per clip only when the option is on (stall_noise = 0 keeps the old RNG stream)
            stall = bool(self.stall_noise) and any(e["direction"] != "none" for e in shown["objects"]) \
                and self.rng.random() < self.stall_noise
            self.stalled += stall
            ghost = None  # as above: the ghost's draws happen only when the option is on
            if self.ghost_noise and self.rng.random() < self.ghost_noise:
                used = {e["color"] for e in shown["objects"]}
                ghost = (self.rng.choice([c for c in COLORS if c not in used]), self.rng.choice(SHAPES))
                self.ghosted += 1
            if self.layout == "aligned":
                clips.append(render_aligned(shown, self.size, self.frames, self.cell, self.move_cells, seed,
                                             self.paths, stall, ghost))
            else:
                clips.append(render_clip(shown, self.size, self.frames, seed=seed))
            prompts.append(spec["prompt"])
        return np.stack(clips), prompts


def clip_latents(pipe, clips):
    """Exact shortcut of :func:`identity_wan_vae`'s encoder: uint8 (B, F, H, W, 3) -> model-space latents
    (B, 3, F, H, W) = ``(x / 127.5 - 1 - mean) / std`` (the VAE's latent is the RGB itself)."""
    import numpy as np
    import torch

    x = torch.from_numpy(np.asarray(clips)).permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0
    cfg = pipe.vae.config
    mean = torch.tensor(cfg.latents_mean).view(1, 3, 1, 1, 1)
    std = torch.tensor(cfg.latents_std).view(1, 3, 1, 1, 1)
    return (x - mean) / std


# ----------------------------------------------------------------------------------------------- eval
def generate(adapter, prompts, seeds, steps: int = 10, size: int = 32):
    """uint8 (B, F, H, W, 3): the adapter's Euler ODE from per-sample CPU noise (seeded), no CFG."""
    import torch

    from flow_grpo.models.base import PromptEmbeds  # noqa: F401  (adapter.encode_prompts returns it)

    with torch.no_grad():
        shape = adapter.noise_shape(size, size)
        x = torch.stack([torch.randn(shape, generator=torch.Generator().manual_seed(int(s))) for s in seeds])
        emb = adapter.encode_prompts(list(prompts))
        sig = adapter.sigmas(steps, size, size)
        for k in range(steps):
            v = adapter.predict_velocity(x, sig[k].expand(len(seeds)), emb, cfg=False)
            x = x + (sig[k + 1] - sig[k]) * v
        return adapter.decode(x, size, size).cpu().numpy()


def drawn_direction(displacement) -> str:
    """The way a tracked object actually went: the dominant axis of its ``[dx, dy]`` (image y grows down), or
    ``"none"`` when it was not tracked over two frames (the verifier's ``tracks[i]["displacement"]``)."""
    if not displacement or displacement[0] is None:
        return "none"
    dx, dy = displacement
    if abs(dx) >= abs(dy):
        return "right" if dx > 0 else "left" if dx < 0 else "none"
    return "down" if dy > 0 else "up"


def evaluate(adapter, split: str = "val", per_prompt: int = 1, steps: int = 10, size: int = 32, seed: int = 1234,
             batch: int = 16, tags=TAGS, keep_videos: bool = False) -> dict:
    """Motion-verifier strict accuracy / mean partial score over all prompts of ``split`` with ``tags``
    (``per_prompt`` seeds each), overall, per tag and per check kind; ``samples``: one record per clip (prompt,
    seed, strict, partial, failed checks, the first entry's asked and drawn direction). ``keep_videos``: the
    uint8 clips too, under ``"videos"`` (not JSON)."""
    from flow_grpo.rewards.motion import verify_clip
    from mmgrpo.synthetic.t2v import all_prompts

    items = [(m, seed * 100_003 + i * per_prompt + j) for i, m in enumerate(all_prompts(split, tags=list(tags)))
             for j in range(per_prompt)]
    rows, samples, videos = [], [], []
    for i in range(0, len(items), batch):
        chunk = items[i:i + batch]
        vids = generate(adapter, [m["prompt"] for m, _ in chunk], [s for _, s in chunk], steps, size)
        for (m, sd), v in zip(chunk, vids):
            r = verify_clip(v, m)
            rows.append((m["tag"], r))
            samples.append({"prompt": m["prompt"], "tag": m["tag"], "seed": sd, "strict": r["strict"],
                            "partial": r["partial"], "failed": [c["check"] for c in r["checks"] if not c["ok"]],
                            "asked": m["objects"][0]["direction"],
                            "drawn": drawn_direction(r["tracks"][0].get("displacement"))})
            if keep_videos:
                videos.append(v)

    def agg(rs):
        return {"strict": sum(r["strict"] for r in rs) / len(rs), "partial": sum(r["partial"] for r in rs) / len(rs),
                "n": len(rs)}
    checks: dict[str, list[bool]] = {}
    for _, r in rows:
        for c in r["checks"]:
            checks.setdefault(c["check"], []).append(bool(c["ok"]))
    out = {"split": split, "tags": list(tags), "per_prompt": per_prompt, **agg([r for _, r in rows]),
           "per_tag": {t: agg([r for tt, r in rows if tt == t]) for t in sorted({t for t, _ in rows})},
           "per_check": {k: sum(v) / len(v) for k, v in checks.items()}, "steps": steps, "samples": samples}
    if keep_videos:
        out["videos"] = videos
    return out


# ----------------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/tiny_t2v", help="output pipeline folder")
    p.add_argument("--demo", action="store_true",
                   help="the shipped demo base's recipe (DEMO_RECIPE: aligned fixed paths, abs-pos, patch 8, width "
                        "256, --ghost-noise 0.6, 3200 steps, ...) as the defaults; options given here override it")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights init and of the training clips")
    p.add_argument("--seconds", type=float, default=840.0, help="wall-clock budget for training (stops early)")
    p.add_argument("--steps", type=int, default=1800, help="optimizer steps (if the --seconds budget allows)")
    p.add_argument("--batch-size", type=int, default=8, help="training clips per optimizer step")
    p.add_argument("--lr", type=float, default=2e-3, help="peak AdamW lr (warm-up, then cosine)")
    p.add_argument("--size", type=int, default=32, help="clip side in px (Mini-T2V needs >= 32)")
    p.add_argument("--frames", type=int, default=9, help="clip frames (the Wan VAE encodes 1 + 4k frames)")
    p.add_argument("--direction-noise", type=float, default=0.3,
                   help="probability that a training clip with a mover shows its first mover going another "
                        "direction than the caption says (the deliberate weakness; 0 = clean)")
    p.add_argument("--width", type=int, default=96, help="transformer width (heads x head dim)")
    p.add_argument("--heads", type=int, default=2, help="attention heads (--width / heads = head dim)")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks")
    p.add_argument("--patch", type=int, default=4, help="spatial patch of the transformer (px, latent = pixels)")
    p.add_argument("--shift", type=float, default=1.0, help="scheduler shift saved in the pipeline")
    p.add_argument("--cond-dropout", type=float, default=0.1, help="probability of training on the empty prompt")
    p.add_argument("--ema", type=float, default=0.995, help="EMA decay of the transformer weights (0 = off)")
    p.add_argument("--train-text", action=argparse.BooleanOptionalAction, default=False,
                   help="train the tiny UMT5 encoder jointly with the transformer (--no-train-text: frozen)")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--eval-steps", type=int, default=10, help="Euler steps of the base evaluation")
    p.add_argument("--eval-per-prompt", type=int, default=0, help="val-split seeds per prompt (0 = skip eval)")
    p.add_argument("--eval-only", default="",
                   help="no build: evaluate this pipeline folder on --eval-split (with --lora), print JSON, exit")
    p.add_argument("--lora", default="", help="--eval-only: a LoRA folder (pytorch_lora_weights.safetensors), "
                                              "e.g. a flow_grpo run's lora_final")
    p.add_argument("--eval-split", default="val", choices=["train", "val", "heldout"],
                   help="--eval-only: the Mini-T2V split to evaluate (choose settings on train / val only)")
    p.add_argument("--eval-seed", type=int, default=1234, help="noise seed base of the evaluation clips")
    p.add_argument("--eval-out", default="", help="--eval-only: also write the JSON (with per-clip records) here "
                                                  "and the clips as frame-strip PNGs next to it (<stem>_strips/)")
    p.add_argument("--tags", nargs="+", default=list(TAGS), choices=list(TAGS),
                   help="Mini-T2V tags of the training clips and of the evaluation")
    p.add_argument("--layout", default="free", choices=["free", "aligned"],
                   help="training clips: 'free' = the benchmark's render_clip; 'aligned' = render_aligned (shapes "
                        "in patch-sized cells, movers go --move-cells cells; tags motion / two_motion only)")
    p.add_argument("--word-tokens", action="store_true",
                   help="tokenizer vocabulary with every Mini-T2V word as one token (default: the shared tiny "
                        "vocabulary, which spells shape and direction words letter by letter and cuts the longest "
                        "prompts at 32 tokens)")
    p.add_argument("--sigma-mean", type=float, default=0.0,
                   help="mean of the logit-normal training noise levels (0 = SD3's default; > 0 trains more at "
                        "high noise, where a clip's trajectory is decided)")
    p.add_argument("--text-len", type=int, default=DEMO_MAX_SEQUENCE_LENGTH,
                   help="UMT5 tokens fed to the transformer (max_sequence_length; Wan zero-pads the prompt to it, "
                        "and the zero tokens share the cross-attention with the words). --eval-only reads the "
                        "folder's mmgrpo_demo.json instead")
    p.add_argument("--sigma-std", type=float, default=1.0, help="std of the logit-normal training noise levels")
    p.add_argument("--move-cells", type=int, default=2, help="--layout aligned: cells a mover travels in a clip")
    p.add_argument("--paths", default="random", choices=["random", "fixed"],
                   help="--layout aligned: 'random' start cells, or 'fixed': one path per direction (a mover "
                        "starts at the edge it leaves, on a fixed row / column; tag motion only)")
    p.add_argument("--stall-noise", type=float, default=0.0,
                   help="--layout aligned: probability that a training clip with a mover shows it still in its "
                        "start cell on every frame (caption unchanged; such a clip fails only the verifier's "
                        "direction check). 0 = off")
    p.add_argument("--ghost-noise", type=float, default=0.0,
                   help="--paths fixed: probability that a training clip also shows a still distractor (a random "
                        "other colour and shape) in the top-left cell on every frame (caption unchanged; such a "
                        "clip fails only the verifier's extra check). 0 = off")
    p.add_argument("--text-pretrain-steps", type=int, default=0,
                   help="supervised warm-up steps of the tiny UMT5 before the diffusion training (a probe on its "
                        "mean output classifies the train prompts' colour / shape / direction): without it the "
                        "random encoder stays a bag of words and cannot tell 'from left to right' from 'from right "
                        "to left'. 0 = off")
    p.add_argument("--abs-pos", action="store_true",
                   help="transformer = WanAbsPosTransformer3DModel (Wan + a fixed 3-D sin-cos absolute position "
                        "embedding): Wan alone (RoPE only) cannot place an object in a given cell from noise")
    if p.parse_known_args(argv)[0].demo:
        p.set_defaults(**DEMO_RECIPE)
    return p.parse_args(argv)


def eval_only(args) -> int:
    """``--eval-only DIR [--lora L]``: the motion-verifier evaluation of a saved base (or base + GRPO LoRA)."""
    from flow_grpo.models import load_adapter

    demo = Path(args.eval_only) / "mmgrpo_demo.json"
    text_len = json.loads(demo.read_text())["max_sequence_length"] if demo.is_file() else args.text_len
    ad = load_adapter(args.eval_only, max_sequence_length=text_len, num_frames=args.frames)
    if args.lora:
        ad.pipe.load_lora_weights(args.lora)  # as eval/generate_t2i.py: peft layers injected in place
    ad.transformer.eval()
    t = time.perf_counter()
    ev = evaluate(ad, args.eval_split, max(1, args.eval_per_prompt), args.eval_steps, args.size,
                  seed=args.eval_seed, tags=args.tags, keep_videos=bool(args.eval_out))
    ev.update(seconds=time.perf_counter() - t, pipeline=args.eval_only, lora=args.lora or None)
    videos = ev.pop("videos", None)
    if args.eval_out:
        out = Path(args.eval_out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(ev, indent=1) + "\n")
        import numpy as np

        from flow_grpo.media import save_frame_strips

        save_frame_strips(np.stack(videos), str(out.parent / f"{out.stem}_strips"))
    print(json.dumps({k: v for k, v in ev.items() if k != "samples"}), flush=True)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    torch.set_num_threads(max(1, args.threads))
    from flow_grpo.models import adapter_from_pipeline, load_adapter
    from flow_grpo.pretrain import PretrainConfig, pretrain
    from mmgrpo.synthetic.t2v import all_prompts, render_clip

    if args.eval_only:
        return eval_only(args)
    if (args.frames - 1) % 4:
        raise ValueError(f"--frames {args.frames}: the Wan VAE encodes 1 + 4k frames (e.g. 9, 13)")
    t_start = time.perf_counter()
    if args.layout == "aligned" and args.size % args.patch:
        raise ValueError(f"--layout aligned: --size {args.size} must be a multiple of --patch {args.patch}")
    if args.paths == "fixed" and (args.layout != "aligned" or set(args.tags) != {"motion"}):
        raise ValueError("--paths fixed needs --layout aligned --tags motion")
    if not 0.0 <= args.stall_noise <= 1.0 or (args.stall_noise and args.layout != "aligned"):
        raise ValueError("--stall-noise must be in [0, 1] and needs --layout aligned")
    if not 0.0 <= args.ghost_noise <= 1.0 or (args.ghost_noise and args.paths != "fixed"):
        raise ValueError("--ghost-noise must be in [0, 1] and needs --paths fixed")
    pipe = build_pipeline(args.seed, args.width, args.heads, args.layers, args.patch, args.shift,
                          word_tokens=args.word_tokens, abs_pos=args.abs_pos)
    # reconstruction check: the identity VAE vs the tiny random Wan VAE of flow_grpo.models.tiny_wan
    ref = render_clip(all_prompts("train", tags=["two_motion"])[0], args.size, args.frames, seed=0)
    from flow_grpo.models.tiny_wan import build_tiny_wan_pipeline

    recon = {"identity_vae_max_err_uint8": vae_roundtrip_error(pipe.vae, ref),
             "tiny_random_wan_vae_max_err_uint8": vae_roundtrip_error(build_tiny_wan_pipeline(0).vae, ref)}
    print("vae reconstruction", json.dumps(recon), flush=True)
    adapter = adapter_from_pipeline(pipe, max_sequence_length=args.text_len, num_frames=args.frames)
    n_params = {n: sum(p.numel() for p in getattr(pipe, n).parameters()) for n in ("transformer", "vae",
                                                                                    "text_encoder")}
    print(f"params: {n_params}", flush=True)
    text_pre = None
    if args.text_pretrain_steps > 0:
        text_pre = pretrain_text_encoder(pipe, args.text_pretrain_steps, args.text_len, args.tags, args.seed)
        print("text encoder warm-up", json.dumps(text_pre), flush=True)
    batches = ClipBatches(args.batch_size, args.size, args.frames, args.seed, args.direction_noise, args.tags,
                          args.layout, args.patch, args.move_cells, args.paths, args.stall_noise,
                          args.ghost_noise)

    def log(rec):
        print(f"step {rec['step']:5d} loss {rec['loss']:.4f} lr {rec['lr']:.2e} {rec['seconds']:.0f}s", flush=True)

    cfg = PretrainConfig(steps=args.steps, lr=args.lr, warmup_steps=min(50, args.steps // 10), seed=args.seed,
                         cond_dropout=args.cond_dropout, ema_decay=args.ema, sigma_mean=args.sigma_mean,
                         sigma_std=args.sigma_std,
                         train_text_encoders=args.train_text,
                         max_seconds=args.seconds, log_every=25)
    hist = pretrain(adapter, batches, cfg, on_log=log, encode_fn=lambda ad, clips: clip_latents(pipe, clips))
    if hist["steps"] == 0:
        raise RuntimeError("pretrain did no step (budget too small?); nothing saved")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(str(out), safe_serialization=True)
    anchor = out.resolve().parent  # paths outside the repository are recorded relative to this folder
    cmd = "python scripts/build_tiny_t2v.py " + " ".join(shlex.quote(a) for a in portable_argv(
        argv if argv is not None else sys.argv[1:], anchor))
    info = {"command": cmd, "args": portable_record(vars(args), anchor), "params": n_params,
            "vae_reconstruction": recon,
            "train_steps": hist["steps"], "train_seconds": hist["seconds"], "stopped_early": hist["stopped_early"],
            "final_loss": sum(hist["losses"][-25:]) / len(hist["losses"][-25:]),
            "first_loss": hist["losses"][0], "clips_drawn": batches.drawn, "clips_direction_noised": batches.noised,
            "clips_stalled": batches.stalled, "clips_ghosted": batches.ghosted, "text_pretrain": text_pre,
            "max_sequence_length": args.text_len, "num_frames": args.frames, "size": args.size,
            "torch_threads": torch.get_num_threads(), "load_avg": os.getloadavg()}
    if args.eval_per_prompt > 0:
        ad = load_adapter(str(out), max_sequence_length=args.text_len, num_frames=args.frames)
        t = time.perf_counter()
        ev = evaluate(ad, "val", args.eval_per_prompt, args.eval_steps, args.size, seed=args.eval_seed,
                      tags=args.tags)
        ev["seconds"] = time.perf_counter() - t
        (out / "eval_val.json").write_text(json.dumps(ev, indent=2) + "\n")
        info["val_strict"], info["val_partial"] = ev["strict"], ev["partial"]
        print("val", json.dumps({k: v for k, v in ev.items() if k != "samples"}), flush=True)
    info["build_seconds"] = time.perf_counter() - t_start
    demo = {"num_frames": args.frames, "size": args.size, "tags": list(args.tags), "sample_steps": args.eval_steps,
            "max_sequence_length": args.text_len, "layout": args.layout, "move_cells": args.move_cells,
            "paths": args.paths, "abs_pos": args.abs_pos,
            "direction_noise": args.direction_noise, "stall_noise": args.stall_noise, "ghost_noise": args.ghost_noise,
            "build_command": cmd}
    (out / "mmgrpo_demo.json").write_text(json.dumps(demo, indent=2) + "\n")  # what scripts/demo_t2v.py reads
    (out / "build_info.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps({k: v for k, v in info.items() if k != "args"}, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
