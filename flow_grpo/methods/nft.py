r"""DiffusionNFT (Negative-aware FineTuning on the forward process; NVlabs/DiffusionNFT): pure functions.

Not a policy gradient: no reverse-process likelihood, no ratio. Rollouts give clean samples :math:`x_0` (any
deterministic solver; the release samples 10-step DPM2 without CFG **from the "old" adapter**) and one scalar
reward each; training is flow matching on the *forward* process with an implicit positive and negative policy.

Notation (rectified flow, :math:`x_t=(1-t)x_0+t\epsilon`, :math:`v\approx\epsilon-x_0`,
:math:`\hat x_0(v)=x_t-t\,v`):

* advantages: per-prompt mean, **global** std (the release's ``PerPromptStatTracker(global_std=True)``: population
  std of every reward of the epoch, + 1e-4), clipped to :math:`\pm A_{max}` (``adv_clip_max`` = 5);
* optimality weight :math:`r=\mathrm{clip}\big(A/(2A_{max})+\tfrac12,0,1\big)` (:func:`reward_weight`);
* implicit velocities, with :math:`v_{old}` detached (:func:`implicit_velocities`):
  :math:`v^+=\beta v_\theta+(1-\beta)v_{old}`, :math:`v^-=(1+\beta)v_{old}-\beta v_\theta`;
* per-sample adaptive weights, detached, computed in float64:
  :math:`w^\pm=\max\big(\mathrm{mean}_{dims}|\hat x_0(v^\pm)-x_0|,\,10^{-5}\big)` (:func:`adaptive_weight`);
* loss per sample :math:`\ell=\big[r\,\mathrm{mean}_{dims}(\hat x_0(v^+)-x_0)^2/w^+
  +(1-r)\,\mathrm{mean}_{dims}(\hat x_0(v^-)-x_0)^2/w^-\big]/\beta`, and the batch loss
  :math:`L=A_{max}\cdot\mathrm{mean}_i\,\ell_i+\beta_{kl}\,\mathrm{mean}_i\,\mathrm{mean}_{dims}(v_\theta-v_{ref})^2`
  (:func:`nft_loss`; the :math:`A_{max}` factor is the release's, it only rescales the learning rate);
* the gradient w.r.t. :math:`v_\theta` (β cancels): :math:`\partial\ell/\partial v_\theta=\frac{2t}{D}\big[
  -r\,(\hat x_0(v^+)-x_0)/w^+ + (1-r)\,(\hat x_0(v^-)-x_0)/w^-\big]` (D = elements per sample). On-policy
  (:math:`v_\theta=v_{old}`) it is :math:`(2r-1)` times the gradient of the weighted flow-matching loss
  :math:`\mathrm{mean}(\hat x_0(v)-x_0)^2/w`: samples above the group mean are fitted, those below pushed away;
* timesteps: each sample trains ``int(K * timestep_fraction)`` (release 0.99, so 9 of 10) of the K sampling
  timesteps :math:`t=\sigma_k`, a fresh random permutation per sample (:func:`train_timestep_indices`), with a fresh
  :math:`\epsilon` per (sample, timestep); the loss is divided by ``grad_accum * num_train_timesteps``;
* the "old" adapter: after every epoch :math:`\theta_{old}\leftarrow d\,\theta_{old}+(1-d)\,\theta`, with the
  schedule :math:`d(s)=0` for :math:`s<` ``flat`` else :math:`\min((s-\text{flat})\cdot\text{uprate},\text{uphold})`
  of the optimizer step s (:func:`old_decay`; release types 0/1/2 in :data:`OLD_DECAY_TYPES`, type 1 by default,
  type 2 for OCR) and :func:`ema_update_`. A separate parameter EMA (decay 0.9 with the (1+n)/(10+n) warm-up:
  :class:`flow_grpo.ema.EMA` with ``warmup=True``) is used only for evaluation and checkpoints.

Release defaults (``config/nft.py``, SD3.5-M): β = 1 (0.1 for OCR and multi-reward), :math:`\beta_{kl}` = 1e-4, lr 3e-4,
LoRA r=32 α=64, 10 sampling steps, CFG 1, 24 images per prompt, 48 groups per epoch.

**In the recipe** (``method=nft``: ``step_mode=nft``, ``credit=nft``; the hooks of :class:`NFT`): rollouts run with the old weights swapped in (deterministic: Euler or DPM-Solver++(2M),
the preset's ``sample.ode_solver=dpmpp2m``; the release's own 2nd-order multistep DPM solver was not compared
step by step); the trained timesteps are drawn per sample when the rollout is planned (the release draws them per
inner epoch: the same with one inner epoch); the forward noise is seeded per (sample, timestep, optimizer step);
the loss is normalised by the global number of trained (sample, timestep) pairs of the update (the release divides
the per-timestep batch mean by grad_accum * timesteps: the same for equal batches). Not supported with
FSDP/DeepSpeed (the old adapter is a local copy).

Deviation (deliberate): the loss is computed in float32 with the float64 weights cast to float32 (the release divides a
float32/bf16 tensor by the float64 weight, promoting the loss to float64); the difference is rounding only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

import torch
from torch import Tensor

from .base import FlowMethod

__all__ = [
    "ADV_MODES",
    "OLD_DECAY_TYPES",
    "NFTLoss",
    "advantages",
    "reward_weight",
    "noised",
    "x0_from_velocity",
    "implicit_velocities",
    "adaptive_weight",
    "nft_loss",
    "train_timestep_indices",
    "old_decay",
    "ema_update_",
    "forward_loss",
]

ADV_MODES = ("all", "positive_only", "negative_only", "one_only", "binary")

# the release's return_decay(step, decay_type): (flat, uprate, uphold)
OLD_DECAY_TYPES = {0: (0, 0.0, 0.0), 1: (0, 0.001, 0.5), 2: (75, 0.0075, 0.999)}


def _bcast(t: Tensor | float, like: Tensor) -> Tensor:
    """float or (B,) -> (B, 1, ..., 1) float32 on like's device."""
    t = torch.as_tensor(t, dtype=torch.float32, device=like.device)
    if t.ndim == 0:
        t = t.expand(like.shape[0])
    if t.ndim != 1 or t.shape[0] != like.shape[0]:
        raise ValueError(f"expected a float or a ({like.shape[0]},) tensor, got shape {tuple(t.shape)}")
    return t.reshape(-1, *([1] * (like.ndim - 1)))


def _mean_dims(t: Tensor) -> Tensor:
    return t.mean(dim=tuple(range(1, t.ndim)))


def advantages(rewards: Tensor, group_ids: Tensor, valid: Optional[Tensor] = None) -> Tensor:
    """The release's advantages: per-group mean, population std of the whole batch + 1e-4 (not clipped here; the
    clip to ``adv_clip_max`` is part of :func:`reward_weight`). (N,) -> (N,)."""
    from mmgrpo.core.advantages import group_advantages

    return group_advantages(rewards, group_ids, scale="batch", eps=1e-4, unbiased=False, valid=valid).advantages


def reward_weight(advantages: Tensor, adv_clip_max: float = 5.0, mode: str = "all") -> Tensor:
    r"""Optimality weight :math:`r=\mathrm{clip}(A_c/(2A_{max})+\tfrac12,0,1)` with :math:`A_c=\mathrm{clip}(A,\pm
    A_{max})`, then the release's ``adv_mode``: ``positive_only`` clamps :math:`A_c` to :math:`[0,A_{max}]`,
    ``negative_only`` to :math:`[-A_{max},0]`, ``one_only`` maps it to 1 if > 0 else 0, ``binary`` to its sign.
    Any shape in, same shape out."""
    if adv_clip_max <= 0:
        raise ValueError(f"adv_clip_max must be > 0, got {adv_clip_max}")
    a = torch.clamp(torch.as_tensor(advantages, dtype=torch.float32), -adv_clip_max, adv_clip_max)
    if mode == "positive_only":
        a = torch.clamp(a, 0, adv_clip_max)
    elif mode == "negative_only":
        a = torch.clamp(a, -adv_clip_max, 0)
    elif mode == "one_only":
        a = torch.where(a > 0, torch.ones_like(a), torch.zeros_like(a))
    elif mode == "binary":
        a = torch.sign(a)
    elif mode != "all":
        raise ValueError(f"unknown adv_mode {mode!r}; expected one of {ADV_MODES}")
    return torch.clamp(a / adv_clip_max / 2.0 + 0.5, 0.0, 1.0)


def noised(x0: Tensor, noise: Tensor, t: Tensor | float) -> Tensor:
    """Forward process :math:`x_t=(1-t)x_0+t\\epsilon`; ``t`` a float or (B,)."""
    if noise.shape != x0.shape:
        raise ValueError(f"noise shape {tuple(noise.shape)} != x0 shape {tuple(x0.shape)}")
    tb = _bcast(t, x0)
    return (1 - tb) * x0.float() + tb * noise.float()


def x0_from_velocity(xt: Tensor, v: Tensor, t: Tensor | float) -> Tensor:
    r""":math:`\hat x_0=x_t-t\,v`."""
    return xt - _bcast(t, xt) * v


def implicit_velocities(v_theta: Tensor, v_old: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    r""":math:`v^+=\beta v_\theta+(1-\beta)v_{old}`, :math:`v^-=(1+\beta)v_{old}-\beta v_\theta`; ``v_old`` is
    detached (the old adapter receives no gradient)."""
    if beta <= 0:
        raise ValueError(f"nft beta must be > 0, got {beta}")
    v_old = v_old.detach()
    return beta * v_theta + (1 - beta) * v_old, (1 + beta) * v_old - beta * v_theta


def adaptive_weight(x0_pred: Tensor, x0: Tensor, floor: float = 1e-5) -> Tensor:
    r"""Detached per-sample weight :math:`\max(\mathrm{mean}_{dims}|\hat x_0-x_0|, \text{floor})` in float64,
    shape (B, 1, ..., 1)."""
    with torch.no_grad():
        w = (x0_pred.detach().double() - x0.detach().double()).abs()
        w = w.mean(dim=tuple(range(1, w.ndim)), keepdim=True)
        return w.clamp(min=floor)


@dataclass
class NFTLoss:
    """Output of :func:`nft_loss`. ``loss`` is the scalar to backpropagate; the rest are (B,) diagnostics
    (detached except ``per_sample``)."""

    loss: Tensor
    per_sample: Tensor      # (B,) [r pos/w+ + (1-r) neg/w-]/beta, before the adv_clip_max factor
    positive: Tensor        # (B,) mean (x0_hat(v+) - x0)^2 / w+
    negative: Tensor        # (B,) mean (x0_hat(v-) - x0)^2 / w-
    kl: Tensor              # (B,) mean (v_theta - v_ref)^2 (zeros without v_ref)
    old_deviation: Tensor   # (B,) mean (v_theta - v_old)^2

    def stats(self) -> dict[str, float]:
        return {"nft/policy_loss": float(self.per_sample.detach().mean()), "nft/positive": float(self.positive.mean()),
                "nft/negative": float(self.negative.mean()), "nft/kl": float(self.kl.mean()),
                "nft/old_deviation": float(self.old_deviation.mean())}


def nft_loss(
    v_theta: Tensor,
    v_old: Tensor,
    x0: Tensor,
    xt: Tensor,
    t: Tensor | float,
    r: Tensor,
    beta: float = 1.0,
    adv_clip_max: float = 5.0,
    v_ref: Optional[Tensor] = None,
    kl_beta: float = 0.0,
    weight_floor: float = 1e-5,
    sample_weights: Optional[Tensor] = None,
    denominator: Optional[float] = None,
) -> NFTLoss:
    r"""DiffusionNFT loss on one timestep of a batch (see the module docstring for the formulas).

    Args:
        v_theta: (B, ...) velocity of the trained adapter at (x_t, t) (carries the gradient).
        v_old: (B, ...) velocity of the old adapter at the same input (detached here).
        x0, xt: (B, ...) clean sample and its noised version :math:`x_t=(1-t)x_0+t\epsilon`.
        t: float or (B,) timesteps in [0, 1] (sigma, i.e. the model timestep / 1000).
        r: (B,) optimality weights from :func:`reward_weight`.
        beta: the NFT β (guidance strength of the implicit policies), > 0.
        adv_clip_max: the release multiplies the mean loss by it.
        v_ref, kl_beta: optional velocity of the reference (adapter disabled) and the weight of
            :math:`\mathrm{mean}(v_\theta-v_{ref})^2`.
        sample_weights, denominator: the batch mean becomes :math:`\sum_i w_i(\cdot)_i/\text{denominator}`
            (default w = 1, denominator = B): a trainer masks untrained samples and normalises by the number of
            trained (sample, timestep) pairs of the whole update.
    """
    if v_theta.shape != x0.shape or v_old.shape != x0.shape or xt.shape != x0.shape:
        raise ValueError(f"shape mismatch: v_theta {tuple(v_theta.shape)}, v_old {tuple(v_old.shape)}, "
                         f"x0 {tuple(x0.shape)}, xt {tuple(xt.shape)}")
    r = torch.as_tensor(r, dtype=torch.float32, device=x0.device).flatten()
    if r.shape[0] != x0.shape[0]:
        raise ValueError(f"r must be ({x0.shape[0]},), got {tuple(r.shape)}")
    if bool(((r < 0) | (r > 1)).any()):
        raise ValueError("r must lie in [0, 1] (use reward_weight)")
    v = v_theta.float()
    vo = v_old.float()
    x0f, xtf = x0.float(), xt.float()
    v_pos, v_neg = implicit_velocities(v, vo, beta)
    x0_pos = x0_from_velocity(xtf, v_pos, t)
    x0_neg = x0_from_velocity(xtf, v_neg, t)
    w_pos = adaptive_weight(x0_pos, x0f, weight_floor).float()
    w_neg = adaptive_weight(x0_neg, x0f, weight_floor).float()
    positive = _mean_dims((x0_pos - x0f) ** 2 / w_pos)
    negative = _mean_dims((x0_neg - x0f) ** 2 / w_neg)
    per_sample = (r * positive + (1.0 - r) * negative) / beta
    w = torch.ones_like(per_sample) if sample_weights is None else \
        torch.as_tensor(sample_weights, dtype=torch.float32, device=per_sample.device).flatten()
    denom = float(per_sample.shape[0]) if denominator is None else float(denominator)
    loss = adv_clip_max * (w * per_sample).sum() / denom
    if v_ref is not None:
        kl = _mean_dims((v - v_ref.detach().float()) ** 2)
        if kl_beta:
            loss = loss + kl_beta * (w * kl).sum() / denom
    else:
        if kl_beta:
            raise ValueError("kl_beta > 0 needs v_ref")
        kl = torch.zeros_like(per_sample)
    return NFTLoss(loss=loss, per_sample=per_sample, positive=positive.detach(), negative=negative.detach(),
                   kl=kl.detach(), old_deviation=_mean_dims((v - vo) ** 2).detach())


def train_timestep_indices(num_samples: int, num_steps: int, fraction: float = 0.99,
                           generator: Optional[torch.Generator] = None) -> Tensor:
    """(N, int(K * fraction)) long: for each sample the first ``int(K * fraction)`` entries of an independent random
    permutation of the K sampling-timestep indices (the release: ``num_train_timesteps = int(num_steps *
    timestep_fraction)`` and a ``randperm`` per sample). Index k means :math:`t=\\sigma_k` (k = 0 is t = 1)."""
    m = int(num_steps * fraction)
    if m < 1 or m > num_steps:
        raise ValueError(f"int({num_steps} * {fraction}) = {m} timesteps: need 1..{num_steps}")
    return torch.stack([torch.randperm(num_steps, generator=generator)[:m] for _ in range(num_samples)])


def old_decay(step: int, decay_type: int | None = 1, flat: int = 0, uprate: float = 0.0,
              uphold: float = 0.0) -> float:
    """Decay d of the old adapter's EMA after optimizer step ``step``: 0 while ``step < flat``, else
    ``min((step - flat) * uprate, uphold)``. ``decay_type`` 0/1/2 selects the release's (flat, uprate, uphold)
    (:data:`OLD_DECAY_TYPES`; type 0 = the old adapter is a copy of the current one after every epoch); ``None``
    uses the explicit arguments."""
    if decay_type is not None:
        if decay_type not in OLD_DECAY_TYPES:
            raise ValueError(f"unknown decay_type {decay_type}; expected one of {sorted(OLD_DECAY_TYPES)} or None")
        flat, uprate, uphold = OLD_DECAY_TYPES[decay_type]
    if step < flat:
        return 0.0
    return min((step - flat) * uprate, uphold)


@torch.no_grad()
def ema_update_(old: Iterable[Tensor], new: Iterable[Tensor], decay: float) -> None:
    r"""In place :math:`\theta_{old}\leftarrow d\,\theta_{old}+(1-d)\,\theta` for paired tensors (d = ``decay``)."""
    if not 0.0 <= decay <= 1.0:
        raise ValueError(f"decay must be in [0, 1], got {decay}")
    old, new = list(old), list(new)
    if len(old) != len(new):
        raise ValueError(f"{len(old)} old tensors vs {len(new)} new tensors")
    for o, n in zip(old, new):
        if o.shape != n.shape:
            raise ValueError(f"shape mismatch {tuple(o.shape)} vs {tuple(n.shape)}")
        o.copy_(o * decay + n.detach().to(o.dtype) * (1.0 - decay))


def forward_loss(adapter, x0: Tensor, sigma: float, embeds, noise: Tensor, r: Tensor, old, beta: float = 1.0,
                 adv_clip_max: float = 5.0, kl_beta: float = 0.0, guidance_scale: float = 1.0, cfg: bool = False,
                 weight_floor: float = 1e-5, sample_weights: Optional[Tensor] = None,
                 denominator: Optional[float] = None) -> NFTLoss:
    """:func:`nft_loss` at one timestep ``sigma`` for a batch of clean latents ``x0`` (B, ...) of a
    :class:`~flow_grpo.models.base.FlowModelAdapter`: :math:`x_t` from ``noise``, :math:`v_{old}` with ``old``
    (an object with a ``swapped_in()`` context, e.g. :class:`flow_grpo.ema.EMA` over the trainable parameters)
    swapped in, :math:`v_{ref}` with the adapter's reference (LoRA disabled) when ``kl_beta > 0``, then
    :math:`v_\theta`. The old and reference forwards run first, without gradient: swapping parameters after the
    trained forward would modify tensors its backward needs."""
    xt = noised(x0, noise, sigma)
    with torch.no_grad():
        with old.swapped_in():
            v_old = adapter.predict_velocity(xt, sigma, embeds, guidance_scale, cfg).float()
        v_ref = None
        if kl_beta > 0:
            with adapter.reference():
                v_ref = adapter.predict_velocity(xt, sigma, embeds, guidance_scale, cfg).float()
    v = adapter.predict_velocity(xt, sigma, embeds, guidance_scale, cfg)
    return nft_loss(v, v_old, x0, xt, sigma, r, beta=beta, adv_clip_max=adv_clip_max, v_ref=v_ref, kl_beta=kl_beta,
                    weight_floor=weight_floor, sample_weights=sample_weights, denominator=denominator)


# ------------------------------------------------------------------------------------------- the method
# step_mode=nft: every step is deterministic (sample.ode_solver; the release: its 2nd-order multistep DPM solver,
# here Euler or DPM-Solver++(2M)); the "trained" columns are the timesteps at which the forward-process loss is taken.
def plan_nft(cfg, plan_seeds, iteration: int, timestep_fraction: float = 0.99):
    r"""No SDE step; each sample trains ``int(K * timestep_fraction)`` of the K sampling timesteps (a random subset
    from its plan seed; the release draws a fresh permutation per inner epoch, the same thing with one inner epoch).
    Unlike the reverse-process plans the last timestep may be drawn: the loss is taken on
    :math:`x_t=(1-t)x_0+t\epsilon` at :math:`t=\sigma_{K-1}>0`, where nothing is degenerate."""
    from .plans import StepPlan, _sample_seed

    K = cfg.num_steps
    m = int(K * timestep_fraction)
    if not 1 <= m <= K:
        raise ValueError(f"methods.nft.timestep_fraction={timestep_fraction} trains int({K} * f) = {m} timesteps: "
                         f"need 1..{K}")
    p = StepPlan.empty(len(plan_seeds), K)
    for i, s in enumerate(plan_seeds):
        g = torch.Generator().manual_seed(_sample_seed(s, 6))
        p.train_mask[i, torch.randperm(K, generator=g)[:m]] = True
    return p


class NFT(FlowMethod):
    """DiffusionNFT inside the recipe: the old adapter (an fp32 copy of the trainable weights, initialised to them,
    as the release), rollouts with the old weights (``rollout_context``), the forward-process loss per (rollout
    chunk, timestep column) (``loss``), and the old adapter's EMA after each epoch (``end_of_step``, :func:`old_decay`
    of the optimizer step). The advantages are the outcome credit's with the preset's statistics (group mean,
    population batch std + 1e-4 = the release's PerPromptStatTracker(global_std=True)); the loss turns them into r.
    ``optim.kl_coef`` is the velocity KL weight (release ``train.beta`` 1e-4), ``optim.adv_clip_max`` :math:`A_{max}`."""

    name = "nft"

    def __init__(self, cfg, run=None):
        super().__init__(cfg, run)
        self.o = cfg.methods.nft
        self.old = None
        if run is not None:
            from flow_grpo.ema import EMA

            if run.sharded:
                raise ValueError("sample.credit=nft is not supported with FSDP/DeepSpeed (its old adapter is a local "
                                 "copy)")
            self.old = EMA(run.params, decay=0.0)

    def check_sampling(self, s) -> None:
        if s.step_mode != "nft":
            raise ValueError("sample.credit=nft needs sample.step_mode=nft (deterministic rollouts, trained timesteps)")

    def plan(self, s, plan_seeds, iteration: int, members):
        return plan_nft(s, plan_seeds, iteration, self.o.timestep_fraction)

    def advantage_estimator(self):
        from .outcome import outcome_advantages

        return outcome_advantages

    def rollout_context(self):
        return self.old.swapped_in()

    def loss(self):
        return self.column_loss

    def column_loss(self, traj, chunk, col: int, adv: Tensor, n_global: float, dummy: bool = False):
        from mmgrpo.utils.seeding import sample_seed

        run, c0, c1 = self.run, chunk[0], chunk[1]
        s, o = traj.sampling, run.cfg.optim
        dev = run.adapter.device
        mask = traj.train_mask[c0:c1, col].float().to(dev)
        if dummy:
            mask = torch.zeros_like(mask)
        x0 = traj.final_latents[c0:c1].to(dev)
        k = int(traj.step_indices[col])
        # fresh noise per (sample, timestep, optimizer step), reproducible on resume
        gens = [torch.Generator().manual_seed(sample_seed(int(traj.noise_seeds[i]), 11, k, run.state.global_step))
                for i in range(c0, c1)]
        noise = torch.stack([torch.randn(x0.shape[1:], generator=g) for g in gens]).to(dev)
        r = reward_weight(adv[c0:c1, col], adv_clip_max=o.adv_clip_max, mode=self.o.adv_mode).to(dev)
        emb = run.adapter.encode_prompts(traj.prompts[c0:c1])
        with run.accelerator.autocast():
            out = forward_loss(run.adapter, x0, float(traj.sigmas[col]), emb, noise, r, self.old, beta=self.o.beta,
                               adv_clip_max=o.adv_clip_max, kl_beta=o.kl_coef, guidance_scale=s.guidance_scale,
                               cfg=s.cfg, sample_weights=mask, denominator=n_global)
        loss = out.loss
        if dummy:
            loss = loss * 0.0
        m = mask.sum().clamp_min(1)
        metrics = {"nft_policy_loss": float((out.per_sample.detach() * mask).sum() / m),
                   "nft_old_deviation": float((out.old_deviation * mask).sum() / m)}
        kl = float((out.kl * mask).sum() / m) if o.kl_coef > 0 else 0.0
        return loss, metrics, kl, int(mask.sum())

    def end_of_step(self, traj, metrics: dict) -> None:
        d = old_decay(self.run.state.global_step, self.o.decay_type)
        self.old.decay = d
        self.old.update()
        # cost per trained (sample, timestep) pair: the current and the old forward (+ the reference for the KL);
        # a GRPO column costs one forward (+ one for its KL)
        metrics.update({"nft/old_decay": d, "nft/forwards_per_pair": 2.0 + (self.cfg.optim.kl_coef > 0)})

    def state_dict(self) -> dict:
        return {"old": self.old.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.old.load_state_dict(sd["old"])
