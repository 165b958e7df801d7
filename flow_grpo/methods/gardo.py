"""GARDO (He et al., arXiv 2512.24138, release tinnerhrhe/GARDO): gated and adaptive regularisation.

As released (``scripts/train_sd3_grpo_gardo.py``), on top of Flow-GRPO's clipped loss:

* **gate** -- only uncertain samples are regularised. Over the gathered batch, rank every sample by the training
  reward and by each auxiliary reward (rank 1 = best); the uncertainty of a sample is
  ``u = rank_main - mean_j rank_aux_j`` (the training reward ranks it much better than the others do). Of the
  samples with ``u >= 0``, those above the ``(100 - 100 p)``-th percentile (numpy's linear interpolation) get the
  KL term: a fraction ``p`` of them (:func:`gate`).
* **adaptive p** (the release's RiskCompensator): ``p`` starts at ``base``; each epoch, with ``m`` the mean of the
  ``u >= 0`` values and a window of the last 20 ``m``: ``p *= 1 + alpha`` if ``m`` exceeds the window's max,
  ``p *= 1 - alpha`` if below its min; clipped to [``p_min``, ``p_max``]; then ``m`` joins the window
  (:class:`RiskCompensator`).
* **adaptive reference** -- the KL is to a *copy of the policy* (the release's "old" LoRA adapter), not the base:
  ``beta * mean_{gated} mean_d (mu - mu_ref)^2 / (2 g^2)`` (the KL-on-mean with Flow-GRPO's ``std_dev_t``), and
  the copy is reset to the current policy before an epoch's updates when an optimizer step's mean KL exceeded
  ``kl_thres`` or ``reset_freq`` epochs passed since the last reset.

Deviations: the KL is averaged over the gated (sample, step) pairs of the epoch (the release: over the gated
samples of each micro-batch, then over micro-batches); the release's diversity-aware advantage shaping (DINOv3
features) and its per-sample std reweighting of the policy loss (1 for samples on one timestep grid) are not
implemented. Replicated runs only (the reference copy is this process's trainable parameters).
``methods.gardo.enabled=true methods.gardo.aux_rewards=[...]`` (components scored with weight 0 if they should
not be trained on).
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from mmgrpo.engine.dist import all_reduce, gather_rows

from .base import ColumnContext, FlowMethod

__all__ = ["descending_ranks", "uncertainty", "gate", "RiskCompensator", "GARDO"]


def descending_ranks(r: torch.Tensor) -> torch.Tensor:
    """(N,) rank of each value, 1 = the largest (ties: stable sort order, as ``torch.sort(descending=True)``)."""
    order = torch.sort(r.double(), descending=True, stable=True).indices
    ranks = torch.empty_like(order)
    ranks[order] = torch.arange(1, len(r) + 1)
    return ranks.double()


def uncertainty(main: torch.Tensor, aux: list[torch.Tensor]) -> torch.Tensor:
    """(N,) ``rank(main) - mean_j rank(aux_j)`` (descending ranks)."""
    if not aux:
        raise ValueError("GARDO's uncertainty needs at least one auxiliary reward")
    return descending_ranks(main) - torch.stack([descending_ranks(a) for a in aux]).mean(0)


def gate(u: torch.Tensor, p: float) -> torch.Tensor:
    """(N,) bool: ``u > percentile(u[u >= 0], 100 - 100 p)``; all False when no ``u >= 0``."""
    pos = u[u >= 0].numpy()
    if pos.size == 0:
        return torch.zeros_like(u, dtype=torch.bool)
    return u > float(np.percentile(pos, 100.0 - 100.0 * p))


class RiskCompensator:
    """The adaptive gated fraction ``p`` (see the module docstring)."""

    def __init__(self, base: float = 0.1, alpha: float = 0.1, p_min: float = 0.02, p_max: float = 0.2,
                 window: int = 20):
        self.base, self.alpha, self.p_min, self.p_max, self.window = base, alpha, p_min, p_max, window
        self.p = base
        self.buffer: list[float] = []

    def update(self, values) -> float:
        m = float(np.mean(values)) if len(values) else 0.0
        if not self.buffer:
            self.p = self.base
        elif m > max(self.buffer):
            self.p = self.p * (1 + self.alpha)
        elif m < min(self.buffer):
            self.p = self.p * (1 - self.alpha)
        self.p = float(np.clip(self.p, self.p_min, self.p_max))
        self.buffer = (self.buffer + [m])[-self.window:]
        return self.p


class GARDO(FlowMethod):
    name = "gardo"

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.gardo
        if not o.aux_rewards:
            raise ValueError("methods.gardo.aux_rewards: name at least one auxiliary reward component")
        missing = [k for k in o.aux_rewards if k not in cfg.reward.weights]
        if missing:
            raise ValueError(f"methods.gardo.aux_rewards {missing} are not scored: add them to reward.weights "
                             f"(weight 0 scores a component without training on it)")
        if cfg.sample.credit == "nft":
            raise ValueError("methods.gardo adds its KL to the PPO column loss; sample.credit=nft has its own loss")

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        o = self.opts = cfg.methods.gardo
        self.risk = RiskCompensator(o.p_base, o.alpha, o.p_min, o.p_max)
        self.ref: list[torch.Tensor] = []
        self.last_reset = 0
        self.reset_due = False
        self._gate = None
        self._scale = 1.0
        self._kl_step: list[float] = []
        self._kl_epoch: list[float] = []
        self._resets = 0

    def _params(self):
        return [p for _, p in self.run.named_params]

    def on_train_start(self, resumed: bool) -> None:
        if not self.ref:  # the reference starts as the initial policy
            self.ref = [p.detach().clone() for p in self._params()]

    @contextlib.contextmanager
    def _reference_weights(self):
        """The reference copy swapped into the trainable parameters (values restored exactly afterwards)."""
        params = self._params()
        saved = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, r in zip(params, self.ref):
                p.data.copy_(r)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, s in zip(params, saved):
                    p.data.copy_(s)

    def on_advantages(self, traj):
        o, st = self.opts, self.run.state
        if self.reset_due or st.epoch - self.last_reset > o.reset_freq:  # before this epoch's updates
            self.ref = [p.detach().clone() for p in self._params()]
            self.last_reset, self.reset_due = st.epoch, False
            self._resets += 1
        names = list(o.aux_rewards)
        cols = torch.stack([traj.rewards["total"].double()] + [traj.rewards[k].double() for k in names], 1)
        (all_cols,), sl = gather_rows([cols], self.run.device)
        u = uncertainty(all_cols[:, 0], [all_cols[:, j + 1] for j in range(len(names))])
        self.risk.update(u[u >= 0].numpy())
        g = gate(u, self.risk.p)
        self._gate = g[sl]
        mask = traj.train_mask
        n_pairs, n_gated = all_reduce([float(mask.sum()), float((mask & self._gate.unsqueeze(1)).sum())], "sum",
                                      self.run.device)
        self._scale = n_pairs / n_gated if n_gated > 0 else 0.0  # sum/n_global * scale = mean over gated pairs
        self._frac = float(g.double().mean())
        return traj

    def on_loss(self, ctx: ColumnContext, loss):
        from ..sde import kl_on_mean, sde_step

        c0, c1 = ctx.chunk
        run, traj, s = ctx.run, ctx.traj, ctx.traj.sampling
        gated = ctx.mask & self._gate[c0:c1].to(ctx.mask.device)
        if self._scale == 0.0 or not bool(gated.any()):
            return loss
        x = traj.latents[c0:c1, ctx.col]
        sig, sig_n = traj.sigmas[ctx.col].item(), traj.sigmas_next[ctx.col].item()
        with torch.no_grad(), self._reference_weights(), run.accelerator.autocast():
            v_ref = run.adapter.predict_velocity(x, sig, run.adapter.encode_prompts(traj.prompts[c0:c1]),
                                                 s.guidance_scale, s.cfg)
        ref = sde_step(v_ref, x, sig, sig_n, kind=s.sde_kind, noise_level=s.noise_level,
                       noise=torch.zeros_like(v_ref))
        kl = kl_on_mean(ctx.out.mean, ref.mean, ctx.out.noise_scale)
        g = gated.to(kl.device).float()
        self._kl_step.append(float((kl.detach() * g).sum() / g.sum()))
        return loss + self.opts.beta * self._scale * (kl * g).sum() / ctx.n_global

    def after_optimizer_step(self) -> None:
        kl = sum(self._kl_step) / len(self._kl_step) if self._kl_step else 0.0
        kl = all_reduce([kl], "sum", self.run.device)[0] / self.run.world if self.run.world > 1 else kl
        if kl > self.opts.kl_thres:
            self.reset_due = True
        self._kl_epoch.append(kl)
        self._kl_step = []

    def end_of_step(self, traj, metrics: dict) -> None:
        metrics["gardo/kl_perc"] = self.risk.p
        metrics["gardo/gated_frac"] = getattr(self, "_frac", 0.0)
        metrics["gardo/kl"] = sum(self._kl_epoch) / len(self._kl_epoch) if self._kl_epoch else 0.0
        metrics["gardo/resets"] = float(self._resets)
        self._kl_epoch = []

    def state_dict(self):
        return {"ref": [r.cpu() for r in self.ref], "last_reset": self.last_reset, "reset_due": self.reset_due,
                "p": self.risk.p, "buffer": list(self.risk.buffer), "resets": self._resets}

    def load_state_dict(self, sd: dict) -> None:
        dev = [p.device for p in self._params()]
        self.ref = [r.to(d) for r, d in zip(sd["ref"], dev)]
        self.last_reset, self.reset_due = int(sd["last_reset"]), bool(sd["reset_due"])
        self.risk.p, self.risk.buffer, self._resets = float(sd["p"]), list(sd["buffer"]), int(sd["resets"])
