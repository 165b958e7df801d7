"""Flow-matching pre-training / SFT of a text-to-image transformer through the model adapters.

Rectified flow (the same convention as the sampler and the SDE kernel, see ``flow_grpo/sde.py``)::

    x_sigma = (1 - sigma) x0 + sigma eps,        eps ~ N(0, I),  sigma in (0, 1)  (sigma = 1 is pure noise)
    v*      = eps - x0                            (d x_sigma / d sigma)
    loss    = mean_{batch, dims} (v_theta(x_sigma, sigma, text) - v*)^2

``x0`` are *model-space* latents (what :meth:`FlowModelAdapter.predict_velocity` consumes): images are encoded by
the pipeline's VAE (``latent_dist.mode()``), normalised with the VAE config as diffusers pipelines do,
``z = (z_vae - shift_factor) * scaling_factor``, then packed (FLUX: 2x2 patches -> tokens; SD3: unchanged).

``sigma`` is drawn per sample from

* ``logit_normal``: ``sigma = sigmoid(m + s n)``, ``n ~ N(0, 1)`` (SD3's default training density, m=0, s=1);
* ``uniform``: ``sigma ~ U(0, 1)``.

Works for any ``StableDiffusion3Pipeline`` / ``FluxPipeline`` wrapped by :mod:`flow_grpo.models` (full fine-tune of
the transformer; the VAE stays frozen). Text encoders are frozen by default (prompts go through the adapter's cached
``encode_prompts``); with ``train_text_encoders=True`` they are trained jointly (prompts are re-encoded with
gradients every step through the adapter's uncached encoder, and the adapter's prompt cache is cleared at the end) -
useful when the encoders are tiny random ones built for a toy vocabulary. Conditioning dropout (``cond_dropout``) replaces a sample's text by the empty prompt so the
model also learns the unconditional velocity (needed for classifier-free guidance at sampling time).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from flow_grpo.ema import EMA as _EMA
from mmgrpo.utils.schedule import LRFactor

__all__ = [
    "PretrainConfig", "sample_sigmas", "rectified_flow_pair", "encode_images", "flow_matching_loss", "pretrain",
    "EMA", "lr_at", "adaln_zero_init_",
]


# ----------------------------------------------------------------------------------------------------- math
def sample_sigmas(n: int, schedule: str = "logit_normal", mean: float = 0.0, std: float = 1.0,
                  generator: Optional[torch.Generator] = None, eps: float = 1e-5) -> torch.Tensor:
    """(n,) fp32 training noise levels in [eps, 1 - eps] (see module docstring for the two densities)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if schedule == "logit_normal":
        if std <= 0:
            raise ValueError(f"logit_normal std must be > 0, got {std}")
        s = torch.sigmoid(mean + std * torch.randn(n, generator=generator, dtype=torch.float32))
    elif schedule == "uniform":
        s = torch.rand(n, generator=generator, dtype=torch.float32)
    else:
        raise ValueError(f"unknown sigma schedule {schedule!r}; expected 'logit_normal' or 'uniform'")
    return s.clamp(eps, 1.0 - eps)


def rectified_flow_pair(x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x_sigma = (1 - sigma) x0 + sigma noise`` and target ``v = noise - x0``.

    ``x0``, ``noise``: (B, ...) same shape; ``sigma``: (B,) broadcast over the trailing dims."""
    if x0.shape != noise.shape:
        raise ValueError(f"x0 {tuple(x0.shape)} and noise {tuple(noise.shape)} must have the same shape")
    if sigma.ndim != 1 or sigma.shape[0] != x0.shape[0]:
        raise ValueError(f"sigma must be ({x0.shape[0]},), got {tuple(sigma.shape)}")
    s = sigma.to(x0.dtype).view(-1, *([1] * (x0.ndim - 1)))
    return (1.0 - s) * x0 + s * noise, noise - x0


@torch.no_grad()
def encode_images(adapter, images) -> torch.Tensor:
    """uint8 (B, H, W, 3) (numpy or tensor) -> model-space latents (fp32): VAE ``latent_dist.mode()``, then
    ``(z - shift_factor) * scaling_factor``, then ``adapter.pack``."""
    x = torch.as_tensor(images)
    if x.ndim != 4 or x.shape[-1] != 3 or x.dtype != torch.uint8:
        raise ValueError(f"images must be uint8 (B, H, W, 3), got {x.dtype} {tuple(x.shape)}")
    vae = adapter.vae
    pix = x.permute(0, 3, 1, 2).to(adapter.device, torch.float32) / 127.5 - 1.0
    z = vae.encode(pix.to(vae.dtype)).latent_dist.mode().float()
    cfg = vae.config
    shift = getattr(cfg, "shift_factor", None) or 0.0
    z = (z - shift) * cfg.scaling_factor
    return adapter.pack(z)


def flow_matching_loss(adapter, x0: torch.Tensor, embeds, sigma: torch.Tensor,
                       noise: Optional[torch.Tensor] = None, generator: Optional[torch.Generator] = None
                       ) -> torch.Tensor:
    """Scalar ``mean((v_theta(x_sigma, sigma) - (noise - x0))^2)`` (module docstring). ``x0``: model-space
    latents (B, ...); ``embeds``: :class:`PromptEmbeds` with B rows; ``sigma``: (B,)."""
    if noise is None:
        noise = torch.randn(x0.shape, generator=generator, dtype=torch.float32).to(x0.device)
    x_t, target = rectified_flow_pair(x0.float(), noise.float(), sigma)
    pred = adapter.predict_velocity(x_t, sigma.to(adapter.device), embeds, guidance_scale=1.0, cfg=False)
    return torch.mean((pred.float() - target) ** 2)


_ADALN_CLASSES = ("AdaLayerNormZero", "AdaLayerNormZeroSingle", "AdaLayerNormContinuous", "SD35AdaLayerNormZeroX")


@torch.no_grad()
def adaln_zero_init_(transformer: torch.nn.Module) -> int:
    """DiT's "adaLN-Zero" initialisation for a *fresh* SD3/FLUX transformer: zero the modulation linears of every
    adaptive LayerNorm (so each block starts as the identity: gates 0, scale 1, shift 0) and the output projection
    ``proj_out`` (so the initial velocity is 0). diffusers uses the default PyTorch init; the DiT paper found the
    zero init trains markedly faster. Returns the number of zeroed modules."""
    n = 0
    for name, m in transformer.named_modules():
        if type(m).__name__ in _ADALN_CLASSES and isinstance(getattr(m, "linear", None), torch.nn.Linear):
            m.linear.weight.zero_()
            m.linear.bias.zero_()
            n += 1
        elif name == "proj_out" and isinstance(m, torch.nn.Linear):
            m.weight.zero_()
            m.bias.zero_()
            n += 1
    return n


# ----------------------------------------------------------------------------------------------------- loop
@dataclass
class PretrainConfig:
    """Hyper-parameters of :func:`pretrain` (all steps are optimizer steps)."""

    steps: int = 1000
    lr: float = 1e-3
    min_lr_ratio: float = 0.1        # cosine decay from lr to lr * min_lr_ratio after warmup
    warmup_steps: int = 50
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    max_grad_norm: float = 1.0       # <= 0 disables clipping
    sigma_schedule: str = "logit_normal"
    sigma_mean: float = 0.0
    sigma_std: float = 1.0
    cond_dropout: float = 0.1        # probability of training a sample on the empty prompt
    ema_decay: float = 0.0           # 0 disables EMA; else decay_n = min(ema_decay, (1 + n) / (10 + n))
    train_text_encoders: bool = False
    seed: int = 0
    max_seconds: float = 0.0         # > 0: stop early when the wall clock budget is exceeded
    log_every: int = 50


def lr_at(step: int, cfg: PretrainConfig) -> float:
    """Linear warmup over ``warmup_steps`` (step 0 -> lr / warmup), then cosine from ``lr`` to ``lr * min_lr_ratio``
    at ``steps`` (:class:`mmgrpo.utils.schedule.LRFactor`)."""
    return cfg.lr * LRFactor("cosine", cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)(step)


class EMA(_EMA):
    """:class:`flow_grpo.ema.EMA` with the warm-up always on, counted in updates: the k-th ``update()`` (k = 1, 2, ...)
    uses ``d = min(decay, (1+k)/(10+k))`` (keeps early averages from being dominated by the random init)."""

    def __init__(self, params: Sequence[torch.nn.Parameter], decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        super().__init__(list(params), decay, warmup=True)

    def update(self, step: Optional[int] = None) -> None:
        super().update(self.num_updates + 1 if step is None else step)


def _drop_condition(embeds, empty, drop: torch.Tensor):
    """Rows where ``drop`` (B,) is True get the empty-prompt embeddings (``empty`` has 1 row)."""
    from dataclasses import fields, replace

    out = {}
    for f in fields(embeds):
        v, e = getattr(embeds, f.name), getattr(empty, f.name)
        if v is None or e is None or f.name == "text_ids":
            continue
        mask = drop.view(-1, *([1] * (v.ndim - 1)))
        out[f.name] = torch.where(mask, e.expand_as(v), v)
    return replace(embeds, **out)


def _text_encoders(adapter) -> list[torch.nn.Module]:
    mods = [getattr(adapter.pipe, n, None) for n in ("text_encoder", "text_encoder_2", "text_encoder_3")]
    return [m for m in mods if m is not None]


def _encode_with_grad(adapter, prompts: list[str]):
    """Encode with gradients through the adapter's (uncached) architecture-specific encoder; each distinct prompt
    once, then gathered back to batch order."""
    from flow_grpo.models.base import PromptEmbeds

    uniq = list(dict.fromkeys(prompts))
    enc = adapter._encode_uncached(uniq)
    idx = torch.tensor([uniq.index(p) for p in prompts], device=adapter.device)
    out = {}
    from dataclasses import fields

    for f in fields(enc):
        v = getattr(enc, f.name)
        out[f.name] = v if (v is None or f.name == "text_ids") else v.index_select(0, idx)
    return PromptEmbeds(**out)


def pretrain(adapter, batch_fn: Callable[[int], tuple[Any, list[str]]], cfg: PretrainConfig,
             on_log: Optional[Callable[[dict], None]] = None, use_ema_weights: bool = True,
             encode_fn: Callable[[Any, Any], torch.Tensor] = encode_images) -> dict:
    """Full fine-tune of ``adapter.transformer`` with the rectified-flow loss.

    ``batch_fn(step) -> (images uint8 (B, H, W, 3) or videos (B, F, H, W, 3), prompts list[str] of length B)``; ``encode_fn(adapter, images)``
    turns the images into model-space latents (default :func:`encode_images`, i.e. the pipeline's VAE; a caller may
    pass an exact shortcut for a hand-set autoencoder). Returns
    ``{"losses": [...] per step, "steps": n_done, "seconds": wall, "stopped_early": bool, "config": {...}}``.
    With ``cfg.ema_decay > 0`` and ``use_ema_weights`` the EMA weights are copied into the transformer at the end.
    The transformer is left in eval mode with ``requires_grad=False``.
    """
    gen = torch.Generator().manual_seed(cfg.seed)
    params = adapter.enable_full_finetune()
    adapter.transformer.train()
    text_encoders = _text_encoders(adapter) if cfg.train_text_encoders else []
    for te in text_encoders:
        te.requires_grad_(True)
        te.train()
        params = params + [p for p in te.parameters()]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    ema = EMA(params, cfg.ema_decay) if cfg.ema_decay > 0 else None
    empty = adapter.encode_prompts([""]) if cfg.cond_dropout > 0 and not text_encoders else None
    losses: list[float] = []
    t0 = time.perf_counter()
    stopped_early = False
    shape_checked = False
    for step in range(cfg.steps):
        if cfg.max_seconds > 0 and time.perf_counter() - t0 > cfg.max_seconds:
            stopped_early = True
            break
        images, prompts = batch_fn(step)
        if len(prompts) != len(images):
            raise ValueError(f"batch_fn({step}) returned {len(images)} images but {len(prompts)} prompts")
        if not shape_checked:
            adapter.set_resolution(int(images.shape[-3]), int(images.shape[-2]))  # (B, [F,] H, W, 3)
            shape_checked = True
        x0 = encode_fn(adapter, images)
        b = len(prompts)
        if text_encoders:
            if cfg.cond_dropout > 0:
                drop = torch.rand(b, generator=gen) < cfg.cond_dropout
                prompts = ["" if bool(d) else p for p, d in zip(prompts, drop)]
            embeds = _encode_with_grad(adapter, prompts)
        else:
            embeds = adapter.encode_prompts(prompts)
        if empty is not None:
            drop = torch.rand(b, generator=gen) < cfg.cond_dropout
            if bool(drop.any()):
                embeds = _drop_condition(embeds, empty, drop.to(adapter.device))
        sigma = sample_sigmas(b, cfg.sigma_schedule, cfg.sigma_mean, cfg.sigma_std, generator=gen)
        noise = torch.randn(x0.shape, generator=gen, dtype=torch.float32).to(x0.device)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, cfg)
        loss = flow_matching_loss(adapter, x0, embeds, sigma, noise)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"pretrain: non-finite loss {loss.item()} at step {step}")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        if ema is not None:
            ema.update()
        losses.append(float(loss.detach()))
        if on_log is not None and cfg.log_every > 0 and (step + 1) % cfg.log_every == 0:
            k = cfg.log_every
            on_log({"step": step + 1, "loss": sum(losses[-k:]) / len(losses[-k:]), "lr": lr_at(step, cfg),
                    "seconds": time.perf_counter() - t0})
    if ema is not None and use_ema_weights and losses:
        ema.copy_to()
    adapter.transformer.eval()
    adapter.transformer.requires_grad_(False)
    for te in text_encoders:
        te.eval()
        te.requires_grad_(False)
    if text_encoders:
        adapter.clear_prompt_cache()  # cached embeddings came from the old encoder weights
    return {"losses": losses, "steps": len(losses), "seconds": time.perf_counter() - t0,
            "stopped_early": stopped_early, "config": asdict(cfg)}
