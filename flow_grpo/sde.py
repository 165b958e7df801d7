"""Stateless reverse-time SDE / ODE step for rectified-flow models, with exact Gaussian log-probs.

Convention (rectified flow): ``x_t = (1 - t) x0 + t eps`` with ``t == sigma`` in [0, 1] (1 = pure noise); the
model predicts the velocity ``v ~ eps - x0``. A sampler walks a decreasing grid ``sigma_0 = 1 > ... > sigma_K = 0``.
One step goes from ``x`` at ``sigma`` to ``x_next`` at ``sigma_next`` (``dt = sigma_next - sigma < 0``).

Kinds (every kind is ``x_next = mean + std * xi`` with ``xi ~ N(0, I)``):

* ``"ode"``   Euler:            ``mean = x + dt * v``, ``std = 0``.
* ``"flow"``  Flow-GRPO SDE:     ``g = a * sqrt(sigma / (1 - sigma))`` (at sigma == 1 the denominator uses
  ``1 - sigma_next``), ``mean = x + dt * [v + g^2 / (2 sigma) * (x + (1 - sigma) v)]``, ``std = g * sqrt(-dt)``.
* ``"dance"`` DanceGRPO SDE:     same drift with the constant ``g = eta`` (``noise_level``).
* ``"cps"``   coefficients-preserving sampling: ``x0_hat = x - sigma v``, ``x1_hat = x + (1 - sigma) v``,
  ``s = sigma_next * sin(a pi / 2)``, ``mean = x0_hat (1 - sigma_next) + x1_hat sqrt(sigma_next^2 - s^2)``, ``std = s``.

The log-prob returned is ``mean over non-batch dims of log N(x_next; mean, std^2)`` (the per-dimension average used by
every public Flow-GRPO variant; it keeps the value O(1) regardless of resolution). For CPS, ``cps_tempered=True``
reproduces Flow-GRPO's released variant ``-mean((x_next - mean)^2)``, which drops the ``1/(2 s^2)`` factor and the
constants; its "ratio" is ``exp(2 s^2 * true_log_ratio)`` (a tempered ratio), so clip ranges are not comparable.

Everything is computed in float32 regardless of the input dtype (half precision overflows the log-density at the
sharp late steps). The function never reads a scheduler: sigmas are explicit floats or (B,) tensors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch

SDE_KINDS = ("ode", "flow", "dance", "cps")

SigmaLike = Union[float, torch.Tensor]


@dataclass
class SDEStepOutput:
    """Result of one step. Shapes: ``prev_sample``/``mean`` like ``x`` (fp32); ``std`` broadcastable to ``x``
    ((B, 1, ..., 1), fp32); ``log_prob`` (B,) or None for the ODE; ``noise_scale`` (B, 1, ..., 1): Flow-GRPO's
    ``std_dev_t`` used by its KL-on-mean (``g`` for flow/dance, ``s`` for cps, 0 for ode)."""

    prev_sample: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    log_prob: Optional[torch.Tensor]
    noise_scale: torch.Tensor


def _as_batch_sigma(sigma: SigmaLike, x: torch.Tensor, name: str) -> torch.Tensor:
    """float or (B,)/(1,)/() tensor -> (B, 1, ..., 1) float32 on x's device."""
    b = x.shape[0]
    s = torch.as_tensor(sigma, dtype=torch.float32, device=x.device)
    if s.ndim == 0:
        s = s.expand(b)
    elif s.ndim == 1 and s.shape[0] in (1, b):
        s = s.expand(b)
    else:
        raise ValueError(f"{name} must be a float or a (B,) tensor with B={b}; got shape {tuple(s.shape)}")
    return s.reshape(b, *([1] * (x.ndim - 1)))


def _mean_dims(t: torch.Tensor) -> torch.Tensor:
    return t.mean(dim=tuple(range(1, t.ndim))) if t.ndim > 1 else t


def gaussian_log_prob(sample: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """(B,) = mean over non-batch dims of ``-(sample-mean)^2/(2 std^2) - log std - 0.5 log(2 pi)`` in fp32."""
    sample = sample.float()
    mean = mean.float()
    std = std.float()
    if bool((std <= 0).any()):
        raise ValueError("gaussian_log_prob: std must be > 0 (an ODE step has no density)")
    lp = -((sample - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)
    return _mean_dims(lp)


def sde_step(
    velocity: torch.Tensor,
    x: torch.Tensor,
    sigma: SigmaLike,
    sigma_next: SigmaLike,
    kind: str = "flow",
    noise_level: float = 0.7,
    noise: Optional[torch.Tensor] = None,
    generator: Optional[Union[torch.Generator, list]] = None,
    prev_sample: Optional[torch.Tensor] = None,
    cps_tempered: bool = False,
) -> SDEStepOutput:
    """One reverse step from ``x`` at ``sigma`` to ``sigma_next`` (see module docstring for the formulas).

    Args:
        velocity, x: (B, ...) model velocity and current latent (any float dtype; computed in fp32).
        sigma, sigma_next: floats or (B,) tensors, ``sigma_next < sigma``.
        kind: ``"ode" | "flow" | "dance" | "cps"``.
        noise_level: ``a`` for flow/cps, ``eta`` for dance.
        noise: optional (B, ...) standard normal noise ``xi`` (used when sampling).
        generator: torch.Generator, or a list of B generators (one per sample) used when ``noise`` is None.
        prev_sample: if given, the step is only *scored*: ``prev_sample`` is returned unchanged (fp32) with its
            log-prob under the step's Gaussian. Scoring an ODE step raises (no density).
        cps_tempered: for ``kind="cps"``, return Flow-GRPO's tempered log-prob ``-mean((x_next - mean)^2)``.
    """
    if kind not in SDE_KINDS:
        raise ValueError(f"unknown SDE kind {kind!r}; expected one of {SDE_KINDS}")
    if velocity.shape != x.shape:
        raise ValueError(f"velocity shape {tuple(velocity.shape)} != latent shape {tuple(x.shape)}")
    v = velocity.float()
    xf = x.float()
    s = _as_batch_sigma(sigma, xf, "sigma")
    sn = _as_batch_sigma(sigma_next, xf, "sigma_next")
    if bool((sn >= s).any()):
        raise ValueError("sde_step: sigma_next must be < sigma (the reverse process walks towards 0)")
    dt = sn - s  # < 0
    zero = torch.zeros_like(s)

    if kind == "ode":
        mean = xf + dt * v
        std = zero
        noise_scale = zero
    elif kind in ("flow", "dance"):
        if kind == "flow":
            denom = torch.where(s >= 1.0, 1.0 - sn, 1.0 - s)
            g = noise_level * torch.sqrt(s / denom)
        else:
            g = torch.full_like(s, float(noise_level))
        mean = xf + dt * (v + g**2 / (2 * s) * (xf + (1 - s) * v))
        std = g * torch.sqrt(-dt)
        noise_scale = g
    else:  # cps
        x0_hat = xf - s * v
        x1_hat = xf + (1 - s) * v
        std = sn * math.sin(noise_level * math.pi / 2)
        # clamp: sin(a pi/2) <= 1 so the argument is >= 0 up to rounding
        mean = x0_hat * (1 - sn) + x1_hat * torch.sqrt(torch.clamp(sn**2 - std**2, min=0.0))
        noise_scale = std

    if prev_sample is None:
        if noise is None:
            noise = _draw_noise(xf, generator)
        elif noise.shape != xf.shape:
            raise ValueError(f"noise shape {tuple(noise.shape)} != latent shape {tuple(xf.shape)}")
        sample = mean + std * noise.float()
    else:
        if prev_sample.shape != xf.shape:
            raise ValueError(f"prev_sample shape {tuple(prev_sample.shape)} != latent shape {tuple(xf.shape)}")
        sample = prev_sample.float()

    if kind == "ode":
        if prev_sample is not None:
            raise ValueError("cannot score a sample under an ODE step: std = 0, there is no density")
        log_prob = None
    elif kind == "cps" and cps_tempered:
        log_prob = _mean_dims(-((sample.detach() - mean) ** 2))
    else:
        if bool((std <= 0).any()):
            # e.g. cps with sigma_next = 0 (the last step): the Gaussian is degenerate
            log_prob = None
            if prev_sample is not None:
                raise ValueError("cannot score a step whose std is 0 (e.g. the last step to sigma=0)")
        else:
            log_prob = gaussian_log_prob(sample.detach(), mean, std)
    return SDEStepOutput(prev_sample=sample, mean=mean, std=std, log_prob=log_prob, noise_scale=noise_scale)


def _draw_noise(x: torch.Tensor, generator) -> torch.Tensor:
    if isinstance(generator, (list, tuple)):
        if len(generator) != x.shape[0]:
            raise ValueError(f"got {len(generator)} generators for batch size {x.shape[0]}")
        return torch.stack(
            [torch.randn(x.shape[1:], generator=g, dtype=torch.float32, device=x.device) for g in generator]
        )
    return torch.randn(x.shape, generator=generator, dtype=torch.float32, device=x.device)


def kl_on_mean(mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Flow-GRPO's KL surrogate, (B,): ``mean_dims (mu - mu_ref)^2 / (2 std^2)``.

    With ``std`` = the step's true std this is the exact KL between the two equal-variance Gaussians (per dim).
    Flow-GRPO passes ``std = noise_scale`` (g, dropping the |dt| factor, flow_grpo#22), which upweights late steps.
    """
    std = std.float()
    if bool((std <= 0).any()):
        raise ValueError("kl_on_mean: std must be > 0")
    return _mean_dims((mean.float() - ref_mean.float()) ** 2 / (2 * std**2))


def kl_on_velocity(velocity: torch.Tensor, ref_velocity: torch.Tensor) -> torch.Tensor:
    """(B,) = mean_dims (v - v_ref)^2 (the velocity-space regulariser recommended for no-CFG training, flow_grpo#198)."""
    return _mean_dims((velocity.float() - ref_velocity.float()) ** 2)
