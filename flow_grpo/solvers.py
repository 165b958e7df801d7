"""Stateless deterministic solvers for the ODE steps of a rectified-flow sampler, and RL guidance (RLG).

Convention as :mod:`flow_grpo.sde`: ``x_t = (1 - sigma) x0 + sigma eps``, the model predicts ``v ~ eps - x0``, the
sampler walks a decreasing grid ``sigma_0 = 1 > ... > sigma_K = 0``.

**DPM-Solver++(2M)** (Lu et al. 2022, arXiv 2211.01095; the multistep data-prediction solver MixGRPO-Flash uses
for the ODE steps after its SDE window, ``dpm_algorithm_type=dpmsolver++``, ``dpm_solver_order=2``,
``dpm_solver_type=midpoint``). In flow form ``alpha = 1 - sigma``, ``lambda(sigma) = log(alpha / sigma)``
(``-inf`` at sigma = 1, ``+inf`` at sigma = 0), and the data prediction is ``x0 = x - sigma v``. One step from
``sigma`` (s0) to ``sigma_next`` (t), with ``h = lambda_t - lambda_s0`` and
``exp(-h) = sigma_t alpha_s0 / (alpha_t sigma_s0)``:

* first order (no history, or ``sigma_next == 0``):
  ``x_t = (sigma_t / sigma_s0) x + alpha_t (1 - exp(-h)) x0``. Expanding ``x0`` this is exactly the Euler step
  ``x + (sigma_t - sigma_s0) v`` (in exact arithmetic); at ``sigma_t = 0`` it returns ``x0``.
* second order (midpoint), with the previous step's data prediction ``x0_prev`` at ``sigma_prev`` (s1):
  ``r = h_0 / h`` with ``h_0 = lambda_s0 - lambda_s1``, ``D1 = (x0 - x0_prev) / r``,
  ``x_t = (sigma_t / sigma_s0) x + alpha_t (1 - exp(-h)) (x0 + D1 / 2)``. When ``sigma_prev = 1``, ``h_0 = inf``
  so ``D1 = 0`` (first order).

The last step (``sigma_next == 0``) is always first order, as diffusers' ``DPMSolverMultistepScheduler`` with
``final_sigmas_type="zero"`` (``lower_order_final``) and MixGRPO's ``dpm_step`` (``lower_order_final`` on the last
index): the second-order formula at ``alpha_t = 1, exp(-h) = 0`` would add ``D1 / 2`` to the clean image. The first
step has no history and is first order too. The history is passed in explicitly (``x0_prev``, ``sigma_prev``): the
caller keeps it, nothing here is stateful.

Coefficients are computed in float64 Python arithmetic, the tensor update in float32 (diffusers computes the
lambdas in float32 tensors: the two agree to a few float32 ulps per step).

**RLG** (RL guidance, "Inference-Time Alignment Control for Diffusion Models with Reinforcement Learning
Guidance", code jinluo12345/Reinforcement-learning-guidance): at sampling time
``v = v_base + w (v_tuned - v_base)``, where both velocities are each model's *guided* prediction (CFG applied to
each model separately with the same guidance scale, as the release's SD3 pipeline does) and ``v_base`` is the same
transformer with the LoRA disabled. ``w = 0`` is the base model, ``w = 1`` the tuned one, ``w > 1`` extrapolates.
For a Gaussian-noise model the velocity is affine in the score, so this is the score of the geometric mixture
``p_base^(1-w) p_tuned^w``. The paper's reading: the KL-regularised optimum is ``p_tuned ~ p_base exp(r / beta)``,
so the mixture is ``~ p_base exp(w r / beta)``, i.e. weight ``w`` acts as the KL coefficient ``beta / w``.
The release's ``zero_init_step`` (the first steps with the tuned model only) is not implemented (its default 0).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

ODE_SOLVERS = ("euler", "dpmpp2m")


def _lambda(sigma: float) -> float:
    """log-SNR ``log((1 - sigma) / sigma)`` of the flow schedule, with the infinite end points."""
    if sigma >= 1.0:
        return -math.inf
    if sigma <= 0.0:
        return math.inf
    return math.log((1.0 - sigma) / sigma)


def _check_sigma(name: str, value) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be one float for the whole batch (the solver's grid is shared), got shape "
                             f"{tuple(value.shape)}")
        value = value.item()
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")
    return value


def dpmpp2m_step(velocity: torch.Tensor, x: torch.Tensor, sigma, sigma_next,
                 x0_prev: Optional[torch.Tensor] = None, sigma_prev=None) -> tuple[torch.Tensor, torch.Tensor]:
    """One DPM-Solver++(2M) step from ``x`` at ``sigma`` to ``sigma_next`` (formulas in the module docstring).

    Args:
        velocity, x: (B, ...) velocity of the model at (x, sigma) and the latent; computed in float32.
        sigma, sigma_next: floats (one grid for the batch), ``sigma_next < sigma``.
        x0_prev, sigma_prev: the data prediction of the previous step and its sigma; ``None`` = first order.

    Returns ``(x_next, x0)``: the new latent and this step's data prediction ``x - sigma v`` (the next step's
    ``x0_prev``), both float32.
    """
    s0 = _check_sigma("sigma", sigma)
    t = _check_sigma("sigma_next", sigma_next)
    if not t < s0:
        raise ValueError(f"dpmpp2m_step: sigma_next ({t}) must be < sigma ({s0})")
    if velocity.shape != x.shape:
        raise ValueError(f"velocity shape {tuple(velocity.shape)} != latent shape {tuple(x.shape)}")
    xf = x.float()
    x0 = xf - s0 * velocity.float()
    # alpha_t (1 - exp(-h)) = alpha_t - sigma_t alpha_s0 / sigma_s0 (no logs: finite at sigma = 1 and sigma_next = 0)
    c_x = t / s0
    c_d = (1.0 - t) - t * (1.0 - s0) / s0
    d = x0
    if x0_prev is not None and t > 0.0:
        if sigma_prev is None:
            raise ValueError("dpmpp2m_step: x0_prev needs sigma_prev")
        s1 = _check_sigma("sigma_prev", sigma_prev)
        if not s1 > s0:
            raise ValueError(f"dpmpp2m_step: sigma_prev ({s1}) must be > sigma ({s0})")
        h = _lambda(t) - _lambda(s0)
        h0 = _lambda(s0) - _lambda(s1)
        if math.isfinite(h0):  # sigma_prev = 1: h0 = inf, D1 = 0
            r = h0 / h
            d = x0 + (0.5 / r) * (x0 - x0_prev.float())
    return c_x * xf + c_d * d, x0


def rlg_combine(v_base: torch.Tensor, v_tuned: torch.Tensor, weight: float) -> torch.Tensor:
    """RL guidance: ``v_base + weight * (v_tuned - v_base)`` (see the module docstring).

    ``weight == 0`` returns ``v_base`` and ``weight == 1`` returns ``v_tuned`` exactly (a copy): in floating point
    ``v_base + (v_tuned - v_base)`` can differ from ``v_tuned`` in the last bit, and the end points must reproduce the
    base and the tuned model bit for bit."""
    if v_base.shape != v_tuned.shape:
        raise ValueError(f"rlg_combine: v_base {tuple(v_base.shape)} and v_tuned {tuple(v_tuned.shape)} differ in shape")
    w = float(weight)
    if not math.isfinite(w):
        raise ValueError(f"rlg weight must be finite, got {weight}")
    if w == 0.0:
        return v_base.clone()
    if w == 1.0:
        return v_tuned.clone()
    return v_base + w * (v_tuned - v_base)
