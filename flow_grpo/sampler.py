"""Trajectory sampling with per-sample step plans, exact log-prob recording and batched ODE completions.

One code path serves every method; they differ only in the *step plan* (which steps are SDE, which are trained;
``sample.step_mode``: a plan of :mod:`flow_grpo.methods.plans` or a method's own) and in the *step credit* (what
extra rewards are computed: the credit method's ``step_rewards``, :class:`flow_grpo.methods.base.FlowMethod`).
The plans and the methods using them are listed in :mod:`flow_grpo.methods.plans`.

``credit`` (:mod:`flow_grpo.methods`): ``"outcome"`` (final reward only), ``"tp_grpo"`` (R_0..R_n from ODE
completions after every SDE step; R_0 is the ODE completion from the window-start latent, i.e. from the
trajectory's *own* x_T through the shared ODE prefix), ``"g2rpo"`` (rewards of ODE completions at several step
granularities after the single SDE step).

ODE steps: Euler, or with ``sample.ode_solver=dpmpp2m`` DPM-Solver++(2M) (:mod:`flow_grpo.solvers`) on the steps
after the last SDE step of each sample (MixGRPO-Flash's ``dpm_apply_strategy=post``); ``sample.post_compress_ratio``
re-grids that part with fewer steps (:func:`compress_post_grid`). Steps before and inside the window are unchanged,
so are their log-probs.

Determinism: x_T of sample i comes from ``xt_seeds[i]``; the SDE noise of sample i at step k from a generator
seeded with ``sample_seed(noise_seeds[i], k)``; the plan of sample i from ``plan_seeds[i]`` (pass one seed per
group to share windows within a group, or one per sample: ``sample.plan_per_sample``); the sliding window (MixGRPO)
from the sampling ``iteration`` (the epoch). Nothing depends on batch layout or process count.

Rewards: ``reward_fn(images_uint8_nhwc, prompts, metadata) -> dict[name, (N,)]`` (a ``flow_grpo.rewards`` reward or
:class:`~flow_grpo.rewards.MultiReward`; a ``"total"`` key is used as the scalar reward, an optional bool ``"valid"``
marks samples to leave out). With ``reward_runner`` (an :class:`~flow_grpo.rewards.AsyncRewardRunner`) every chunk is
decoded and submitted as soon as it is sampled, so the reward of chunk c runs while chunk c+1 is sampled; results are
collected after the last chunk (a reward failure therefore surfaces only after every model call of the rollout,
which keeps processes in step when forwards are collective, e.g. FSDP).

Exactness: the model is called on the same chunks (``batch_size``) during rollout and during
:func:`score_column` (the training path), so log-probs recomputed on-policy equal the rollout ones bit for bit --
except on the steps a tree / branch plan shares (``sample.shared_prefix``): there the rollout evaluates each shared
row once in a smaller batch, so the two agree to float rounding (ratio 1 +- ~1e-7), not bit for bit.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Optional, Sequence

import torch

from .config import SamplingConfig
from .methods.plans import StepPlan, _sample_seed, make_step_plan
from .models.base import FlowModelAdapter, PromptEmbeds
from .scoring import RewardFn, finish_scores, merge_scores, score_rewards
from .sde import sde_step
from .solvers import ODE_SOLVERS, dpmpp2m_step, rlg_combine


def check_ode_solver(name: str, post_compress_ratio: float = 1.0) -> None:
    if name not in ODE_SOLVERS:
        raise ValueError(f"sample.ode_solver must be one of {' | '.join(ODE_SOLVERS)}, got {name!r}")
    if not 0.0 < post_compress_ratio <= 1.0:
        raise ValueError(f"sample.post_compress_ratio must be in (0, 1], got {post_compress_ratio}")
    if post_compress_ratio < 1.0 and name != "dpmpp2m":
        raise ValueError("sample.post_compress_ratio < 1 needs sample.ode_solver=dpmpp2m (MixGRPO-Flash)")


def post_window_mask(sde_mask: torch.Tensor) -> torch.Tensor:
    """(N, K) bool: step k of sample i comes after its last SDE step (every step if it has none). These are the
    steps ``sample.ode_solver=dpmpp2m`` integrates with DPM-Solver++(2M); the ODE steps before and between SDE steps
    stay Euler (MixGRPO-Flash's ``dpm_apply_strategy=post``), so the state entering every SDE step, hence its
    log-prob, does not depend on the solver."""
    n, K = sde_mask.shape
    idx = torch.arange(K).expand(n, K)
    last = torch.where(sde_mask, idx, torch.full_like(idx, -1)).max(1).values  # -1 when no SDE step
    return idx > last.unsqueeze(1)


def compress_post_grid(sig: torch.Tensor, sde_mask: torch.Tensor, ratio: float) -> tuple[torch.Tensor, int]:
    """MixGRPO-Flash's ``dpm_post_compress_ratio``: fewer ODE steps after the SDE window. Returns the new grid and
    the last SDE step L (shared by every sample; -1 if none).

    The grid is kept up to ``sig[L+1]`` and the part from ``sig[L+1]`` to 0 is replaced by
    ``M = max(int((K - L) * ratio), 2)`` points at equally spaced *fractional step indices* from L+1 to K, with sigma
    interpolated linearly between the adapter's own nodes (both ends are nodes: ``sig[L+1]`` and 0). The release
    (``run_sample_step``, ``dpm_apply_strategy=post``) uses ``int(max((K - L) * ratio, 1))`` points equally spaced in
    the unshifted time ``t`` and applies its SD3 time shift to them; deviations, both deliberate: (1) the shift is
    not known for every adapter (FLUX uses a resolution-dependent one), so we interpolate the adapter's grid, which
    matches the release at the nodes and differs between nodes by the curvature of the shift; (2) at least 2 points,
    because with 1 point the release's rollout stops at ``sig[L+1]`` and decodes a latent that is still noisy
    (a window ending at K-3 or later with ratio 0.4)."""
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"sample.post_compress_ratio must be in (0, 1], got {ratio}")
    K = len(sig) - 1
    idx = torch.arange(K).expand_as(sde_mask)
    lasts = torch.where(sde_mask, idx, torch.full_like(idx, -1)).max(1).values
    if bool((lasts != lasts[0]).any()):
        raise ValueError("sample.post_compress_ratio < 1 needs the same SDE window for every sample of a rollout "
                         f"(last SDE steps {sorted(set(lasts.tolist()))}): use window_policy=sliding or fixed")
    last = int(lasts[0])
    m = max(int((K - last) * ratio), 2)
    pos = torch.linspace(last + 1, K, m, dtype=torch.float64)
    lo = pos.floor().long().clamp(max=K - 1)
    frac = pos - lo
    s64 = sig.double()
    post = (1 - frac) * s64[lo] + frac * s64[lo + 1]
    post[0], post[-1] = s64[last + 1], 0.0  # exact end points
    return torch.cat([s64[: last + 1], post]).to(sig.dtype), last


@dataclass
class Trajectories:
    """A batch of N rollouts. Trained data is stored per *column* (a step index used by any sample):

    ``step_indices`` (T,), ``sigmas``/``sigmas_next`` (T,), ``latents``/``next_latents`` (N, T, *latent),
    ``log_probs`` (N, T) (0 where not SDE), ``train_mask`` (N, T). ``chunks`` lists the rollout batches
    (index ranges) that the training path must reuse for exact log-probs. ``ode_next_latents`` (N, T, *latent)
    is set only for ``credit="tp_grpo"``.
    """

    prompts: list
    metadata: list
    group_ids: torch.Tensor
    xt_seeds: list
    noise_seeds: list
    step_indices: torch.Tensor
    sigmas: torch.Tensor
    sigmas_next: torch.Tensor
    latents: torch.Tensor
    next_latents: torch.Tensor
    log_probs: torch.Tensor
    train_mask: torch.Tensor
    sde_mask: torch.Tensor
    window_start: torch.Tensor
    final_latents: torch.Tensor
    images: torch.Tensor
    chunks: list
    sampling: SamplingConfig
    rewards: dict = field(default_factory=dict)           # name -> (N,) of the final images
    step_rewards: Optional[torch.Tensor] = None           # tp_grpo: (N, n+1) R_0..R_n; g2rpo: (N, |granularities|)
    # tp_grpo only (None otherwise, to save memory): (N, T, *latent) Euler step from ``latents`` with the rollout's
    # own velocity, x_k + (sigma_{k+1} - sigma_k) v(x_k); the first step of every TP-GRPO completion
    ode_next_latents: Optional[torch.Tensor] = None
    members: Optional[torch.Tensor] = None                # (N,) index of each sample in its group (if given)
    advantages: Optional[torch.Tensor] = None             # (N, T) set by the recipe (methods' on_advantages read it)
    # (N, T, *latent) mean of each trained SDE step's Gaussian under the sampling policy (methods with keeps_means)
    old_means: Optional[torch.Tensor] = None
    nfe_per_trajectory: float = 0.0
    seconds: float = 0.0

    def __len__(self) -> int:
        return len(self.prompts)


@dataclass
class _RolloutGrid:
    """The sigma grid a rollout integrates and, per sample and step of it, SDE / DPM-Solver masks (after
    ``sample.post_compress_ratio`` re-gridded the part after the last SDE step)."""

    grid: torch.Tensor               # (L+1,) sigmas, ending at 0
    sde: torch.Tensor                # (N, L) bool
    post: Optional[torch.Tensor]     # (N, L) bool: DPM-Solver++(2M) step (ode_solver=dpmpp2m), else None


def _rollout_grid(cfg: SamplingConfig, plan: StepPlan, sig: torch.Tensor, method) -> _RolloutGrid:
    post = post_window_mask(plan.sde_mask) if cfg.ode_solver == "dpmpp2m" else None
    if post is None or cfg.post_compress_ratio >= 1.0:
        return _RolloutGrid(sig, plan.sde_mask, post)
    if method.has_step_rewards:
        raise ValueError(f"sample.post_compress_ratio < 1 needs credit=outcome (the {cfg.credit} completions "
                         f"integrate the full grid)")
    n = plan.sde_mask.shape[0]
    grid, last = compress_post_grid(sig, plan.sde_mask, cfg.post_compress_ratio)
    n_pre, n_post = last + 1, len(grid) - 1 - (last + 1)
    sde = torch.cat([plan.sde_mask[:, :n_pre], torch.zeros(n, n_post, dtype=torch.bool)], 1)
    return _RolloutGrid(grid, sde, torch.cat([post[:, :n_pre], torch.ones(n, n_post, dtype=torch.bool)], 1))


@dataclass
class _Columns:
    """The recorded transitions of the trained columns (``col_of``: step index -> column)."""

    col_of: dict
    lat: torch.Tensor                # (N, T, *latent) x_k
    nxt: torch.Tensor                # (N, T, *latent) x_{k+1}
    onx: Optional[torch.Tensor]      # (N, T, *latent) Euler step from x_k (credits with keeps_ode_next)
    logp: torch.Tensor               # (N, T) log-probs of SDE steps (0 elsewhere)
    mean: Optional[torch.Tensor] = None  # (N, T, *latent) mean of the SDE step's Gaussian (keep_means)

    @classmethod
    def allocate(cls, cols: torch.Tensor, xt: torch.Tensor, keep_ode_next: bool,
                 keep_means: bool = False) -> "_Columns":
        n, T = xt.shape[0], len(cols)
        lat = torch.zeros((n, T) + tuple(xt.shape[1:]), dtype=torch.float32, device=xt.device)
        return cls({int(k): j for j, k in enumerate(cols.tolist())}, lat, torch.zeros_like(lat),
                   torch.zeros_like(lat) if keep_ode_next else None, torch.zeros(n, T, dtype=torch.float32),
                   torch.zeros_like(lat) if keep_means else None)

    def record_mean(self, k: int, c0: int, c1: int, mean: torch.Tensor) -> None:
        j = self.col_of.get(k)
        if j is not None and self.mean is not None:
            self.mean[c0:c1, j] = mean

    def record(self, k: int, c0: int, c1: int, x, x_next, euler_next, log_prob) -> None:
        """Store step k of samples [c0, c1) if k is a trained column (also for a chunk that does not train it:
        the layout is per column)."""
        j = self.col_of.get(k)
        if j is None:
            return
        self.lat[c0:c1, j] = x
        self.nxt[c0:c1, j] = x_next
        if self.onx is not None:
            self.onx[c0:c1, j] = euler_next
        if log_prob is not None:
            self.logp[c0:c1, j] = log_prob


def _ode_next(v, x, grid: torch.Tensor, k: int, post: Optional[torch.Tensor], x0_prev):
    """Deterministic step k: (next state, Euler next state, DPM-Solver history). With ``post`` (the chunk's
    DPM-Solver mask) DPM-Solver++(2M) on the steps after the last SDE step (MixGRPO-Flash's "post" strategy); the
    history (x0 of the previous step) is kept at every step, SDE or ODE, as the release does."""
    euler_next = sde_step(v, x, grid[k].item(), grid[k + 1].item(), kind="ode").prev_sample
    if post is None:
        return euler_next, euler_next, x0_prev
    dpm_next, x0 = dpmpp2m_step(v, x, grid[k].item(), grid[k + 1].item(), x0_prev,
                                grid[k - 1].item() if k > 0 else None)
    pm = post[:, k].to(x.device).view(-1, *([1] * (x.dim() - 1)))
    return torch.where(pm, dpm_next, euler_next), euler_next, x0


def _embeds_row_keys(emb: PromptEmbeds) -> list[tuple]:
    """One hashable key per row of ``emb``: the bytes of every per-row conditioning tensor (text, masks, reference
    image latents...; ``text_ids`` is shared by the batch)."""
    rows = [getattr(emb, f.name) for f in fields(emb) if f.name != "text_ids" and getattr(emb, f.name) is not None]
    rows = [t.detach().cpu().contiguous() for t in rows]
    return [tuple(t[i].numpy().tobytes() for t in rows) for i in range(len(emb))]


def _unique_rows(x: torch.Tensor, emb_keys: list[tuple]) -> tuple[list[int], torch.Tensor]:
    """Rows of ``x`` whose latent and conditioning are bitwise equal: (the first row of each class, the class of
    every row as an index into that list)."""
    first, inverse, uniq = {}, [], []
    flat = x.detach().cpu().contiguous()
    for i in range(x.shape[0]):
        j = first.setdefault((emb_keys[i], flat[i].numpy().tobytes()), len(first))
        if j == len(uniq):  # a new class: row i is its first row
            uniq.append(i)
        inverse.append(j)
    return uniq, torch.as_tensor(inverse, dtype=torch.long, device=x.device)


def _roll_chunk(adapter, cfg: SamplingConfig, x, emb, rg: _RolloutGrid, buf: _Columns, c0: int, c1: int,
                noise_seeds: Sequence[int], noise_keys: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, int]:
    """Integrate samples [c0, c1) (one model batch) along the grid, SDE where the plan says, recording the trained
    columns; returns the final latents and the number of model evaluations (rows x steps, before CFG).
    ``noise_keys`` (N, K), if the plan gives them, replace ``noise_seeds[i]`` as the base seed of sample i's step-k
    noise (tree / branch plans share a prefix this way); with ``sample.shared_prefix`` the rows of such a plan whose
    latent and conditioning are bitwise equal at a step (the shared trunk of a tree) are evaluated once."""
    shape, dev, grid = tuple(x.shape[1:]), x.device, rg.grid
    post = rg.post[c0:c1] if rg.post is not None else None
    x0_prev = None
    share = noise_keys is not None and cfg.shared_prefix
    emb_keys = _embeds_row_keys(emb) if share else None
    evals = 0
    for k in range(len(grid) - 1):
        uniq, inverse = _unique_rows(x, emb_keys) if share else (None, None)
        if uniq is not None and len(uniq) < x.shape[0]:
            v = adapter.predict_velocity(x[uniq], grid[k].item(), emb.index(uniq), cfg.guidance_scale,
                                         cfg.cfg)[inverse]
            evals += len(uniq)
        else:
            v = adapter.predict_velocity(x, grid[k].item(), emb, cfg.guidance_scale, cfg.cfg)
            evals += x.shape[0]
        ode_next, euler_next, x0_prev = _ode_next(v, x, grid, k, post, x0_prev)
        m = rg.sde[c0:c1, k]
        log_prob = None
        if bool(m.any()):
            keys = noise_seeds if noise_keys is None else noise_keys[:, k].tolist()
            gens = [torch.Generator().manual_seed(_sample_seed(keys[i], k)) for i in range(c0, c1)]
            noise = torch.stack([torch.randn(shape, generator=g, dtype=torch.float32) for g in gens]).to(dev)
            out = sde_step(v, x, grid[k].item(), grid[k + 1].item(), kind=cfg.sde_kind,
                           noise_level=cfg.noise_level, noise=noise, cps_tempered=cfg.cps_tempered)
            x_next = torch.where(m.to(dev).view(-1, *([1] * len(shape))), out.prev_sample, ode_next)
            if k in buf.col_of:
                if out.log_prob is None:
                    raise ValueError(f"step {k} (sigma_next={grid[k + 1].item()}) has zero std: cannot train it")
                log_prob = torch.where(m, out.log_prob.cpu(), torch.zeros_like(out.log_prob.cpu()))
                buf.record_mean(k, c0, c1, out.mean)
        else:
            x_next = ode_next
        buf.record(k, c0, c1, x, x_next, euler_next, log_prob)
        x = x_next
    return x, evals


def credit_for(cfg: SamplingConfig):
    """The credit method ``cfg.credit`` names with its default options (the sampler used on its own)."""
    from .config import TrainConfig
    from .methods import credit_method

    return credit_method(TrainConfig(sample=cfg))


def _check_rollout(cfg: SamplingConfig, n: int, seeds: Sequence[Sequence[int]], metadata: list, reward_fn, method):
    """Validate the inputs of :func:`sample_trajectories`."""
    if not all(len(s) == n for s in seeds) or len(metadata) != n:
        raise ValueError("prompts, xt_seeds, noise_seeds, plan_seeds and metadata must have the same length")
    if method.has_step_rewards and reward_fn is None:
        raise ValueError(f"credit={cfg.credit!r} needs reward_fn")
    method.check_sampling(cfg)
    if cfg.sde_kind not in ("flow", "dance", "cps"):
        raise ValueError(f"sde_kind must be flow | dance | cps, got {cfg.sde_kind!r}")
    check_ode_solver(cfg.ode_solver, cfg.post_compress_ratio)


def _rollout_sigmas(adapter: FlowModelAdapter, cfg: SamplingConfig) -> torch.Tensor:
    H, W, K = cfg.height, cfg.width, cfg.num_steps
    adapter.set_resolution(H, W)
    sig = adapter.sigmas(K, H, W)
    if len(sig) != K + 1 or float(sig[-1]) != 0.0:
        raise ValueError(f"adapter.sigmas({K}) must return K+1 values ending at 0, got {sig.tolist()}")
    return sig


def _score_rollout(adapter, traj: Trajectories, embeds, sig, method, reward_fn, weights, futures) -> float:
    """Rewards of the final images (background futures of the chunks, or one call now) and, for credits that have
    them, the step rewards; returns the extra NFEs per trajectory (before the CFG factor)."""
    n = len(traj)
    if futures:  # every model call of the rollout is done: now wait for the background scores
        raw = merge_scores([f.result() for f in futures], [c1 - c0 for c0, c1 in traj.chunks])
        total, scores = finish_scores(raw, n, weights)
    else:
        total, scores = score_rewards(reward_fn, traj.images, traj.prompts, traj.metadata, weights)
    traj.rewards = dict(scores)
    traj.rewards["total"] = total
    if not method.has_step_rewards:
        return 0
    traj.step_rewards, extra, step_valid = method.step_rewards(adapter, traj, embeds, sig, reward_fn, weights, total)
    # a sample is usable only if every reward of its sequence is valid
    traj.rewards["valid"] = traj.rewards["valid"] & step_valid
    traj.step_rewards = torch.where(traj.rewards["valid"].unsqueeze(1), traj.step_rewards,
                                    torch.zeros_like(traj.step_rewards))
    return extra


class SamplingInterrupted(Exception):
    """``on_chunk`` asked to stop sampling (SIGTERM / SIGINT during a rollout)."""


@torch.no_grad()
def sample_trajectories(
    adapter: FlowModelAdapter,
    prompts: Sequence[str],
    cfg: SamplingConfig,
    xt_seeds: Sequence[int],
    noise_seeds: Sequence[int],
    plan_seeds: Sequence[int],
    group_ids: Sequence[int] | torch.Tensor,
    metadata: Optional[Sequence[dict]] = None,
    reward_fn: Optional[RewardFn] = None,
    reward_weights: Optional[dict] = None,
    iteration: int = 0,
    xt: Optional[torch.Tensor] = None,
    reward_runner=None,
    members: Optional[Sequence[int]] = None,
    method=None,
    on_chunk=None,
    keep_means: bool = False,
) -> Trajectories:
    """Roll out N = len(prompts) trajectories (see the module docstring). ``xt`` optionally overrides the
    initial noise (N, *model-space latent). Rewards are computed if ``reward_fn`` is given (required for the
    tp_grpo / g2rpo credits); ``reward_runner`` (``submit(images, prompts, metadata) -> Future``) scores each chunk
    in the background while the next one is sampled (it must wrap the same reward as ``reward_fn``). ``members``:
    the index of each sample in its group (tree / branch plans need it to give a group's samples their paths).
    ``method``: the run's credit method (:class:`~flow_grpo.methods.base.FlowMethod`; default: the one
    ``cfg.credit`` names, with default options). ``on_chunk(done, total)``: called after each rollout chunk
    (progress lines); a True return stops sampling with :class:`SamplingInterrupted` (a SIGTERM: the caller
    discards the epoch)."""
    t_start = time.perf_counter()
    n = len(prompts)
    metadata = list(metadata) if metadata is not None else [{} for _ in range(n)]
    method = method if method is not None else credit_for(cfg)
    _check_rollout(cfg, n, (xt_seeds, noise_seeds, plan_seeds), metadata, reward_fn, method)
    group_ids = torch.as_tensor(group_ids, dtype=torch.long)
    sig = _rollout_sigmas(adapter, cfg)
    plan = make_step_plan(cfg, plan_seeds, iteration, members, method)
    if method.has_step_rewards and not bool(plan.train_mask.any()):
        raise ValueError(f"credit={cfg.credit!r} needs at least one SDE step, but the step plan of iteration "
                         f"{iteration} is empty (window_policy=sliding has an empty window once per cycle)")
    cols = torch.nonzero(plan.train_mask.any(0)).flatten()
    embeds = adapter.encode_prompts(prompts)
    if xt is None:
        xt = adapter.initial_noise(xt_seeds, cfg.height, cfg.width)
    elif xt.shape[0] != n:
        raise ValueError(f"xt has batch {xt.shape[0]} != {n}")
    # TP-GRPO completions start with the Euler step; GRPO-Guard's ratio needs the old Gaussian's mean
    buf = _Columns.allocate(cols, xt, method.keeps_ode_next, keep_means)
    final = torch.zeros(tuple(xt.shape), dtype=torch.float32, device=xt.device)
    chunks = [(c0, min(n, c0 + cfg.batch_size)) for c0 in range(0, n, cfg.batch_size)]
    rg = _rollout_grid(cfg, plan, sig, method)
    chunk_images, futures, evals = [], [], 0
    for c0, c1 in chunks:
        x, e = _roll_chunk(adapter, cfg, xt[c0:c1].float().clone(), embeds.index(slice(c0, c1)), rg, buf, c0, c1,
                           noise_seeds, plan.noise_keys)
        evals += e
        final[c0:c1] = x
        chunk_images.append(adapter.decode(x, cfg.height, cfg.width).cpu())
        if reward_fn is not None and reward_runner is not None:
            futures.append(reward_runner.submit(chunk_images[-1], list(prompts[c0:c1]), metadata[c0:c1]))
        if on_chunk is not None and on_chunk(len(chunk_images), len(chunks)) and len(chunk_images) < len(chunks):
            for f in futures:  # the epoch is abandoned: its background reward calls are not waited for
                f.cancel()
            raise SamplingInterrupted(f"sampling stopped after {len(chunk_images)} of {len(chunks)} chunks")
    traj = Trajectories(
        prompts=list(prompts), metadata=metadata, group_ids=group_ids, xt_seeds=list(xt_seeds),
        noise_seeds=list(noise_seeds), step_indices=cols.clone(), sigmas=sig[cols].clone(),
        sigmas_next=sig[cols + 1].clone(), latents=buf.lat, next_latents=buf.nxt, log_probs=buf.logp,
        train_mask=plan.train_mask[:, cols].clone(), sde_mask=plan.sde_mask, window_start=plan.window_start,
        final_latents=final, images=torch.cat(chunk_images), chunks=chunks, sampling=cfg, ode_next_latents=buf.onx,
        members=None if members is None else torch.as_tensor(list(members), dtype=torch.long),
        old_means=buf.mean,
    )
    nfe = evals / n  # len(rg.grid) - 1, less the shared trunk of tree plans evaluated once
    if reward_fn is not None:
        nfe += _score_rollout(adapter, traj, embeds, sig, method, reward_fn, reward_weights, futures)
    traj.nfe_per_trajectory = float(nfe * (2 if cfg.cfg else 1))
    traj.seconds = time.perf_counter() - t_start
    return traj


def _window_layout(traj: Trajectories) -> tuple[int, torch.Tensor]:
    """Window length n and the (N, n) columns of each sample's SDE steps
    (:func:`flow_grpo.methods.tp_grpo.window_layout`)."""
    from .methods.tp_grpo import window_layout

    return window_layout(traj.train_mask)


def score_column(adapter: FlowModelAdapter, traj: Trajectories, chunk: tuple[int, int], col: int,
                 embeds: Optional[PromptEmbeds] = None, return_velocity: bool = False):
    """The training path: recompute the Gaussian of trained column ``col`` for the rollout chunk ``chunk``
    with the *current* model (gradients flow if enabled) and score the stored ``x_{k+1}``.
    Returns the :class:`~flow_grpo.sde.SDEStepOutput` (and the velocity if asked)."""
    c0, c1 = chunk
    s = traj.sampling
    if embeds is None:
        embeds = adapter.encode_prompts(traj.prompts[c0:c1])
    x = traj.latents[c0:c1, col]
    sigma, sigma_next = traj.sigmas[col].item(), traj.sigmas_next[col].item()
    v = adapter.predict_velocity(x, sigma, embeds, s.guidance_scale, s.cfg)
    out = sde_step(v, x, sigma, sigma_next, kind=s.sde_kind, noise_level=s.noise_level,
                   prev_sample=traj.next_latents[c0:c1, col], cps_tempered=s.cps_tempered)
    return (out, v) if return_velocity else out


def rlg_velocity(adapter: FlowModelAdapter, x: torch.Tensor, sigma, emb: PromptEmbeds, guidance_scale: float,
                 cfg: bool, weight: float) -> torch.Tensor:
    """RL guidance (:func:`flow_grpo.solvers.rlg_combine`): the guided velocity of the tuned model (LoRA on) and of
    the base model (the same transformer inside ``adapter.reference()``, i.e. peft's adapters disabled: no second
    model copy), combined as ``v_base + w (v_tuned - v_base)``. Two model calls per step (CFG doubles each)."""
    v_tuned = adapter.predict_velocity(x, sigma, emb, guidance_scale, cfg)
    with adapter.reference():
        v_base = adapter.predict_velocity(x, sigma, emb, guidance_scale, cfg)
    return rlg_combine(v_base, v_tuned, weight)


@torch.no_grad()
def generate_images(adapter: FlowModelAdapter, prompts: Sequence[str], xt_seeds: Sequence[int],
                    cfg: SamplingConfig, num_steps: Optional[int] = None,
                    rlg_weight: Optional[float] = None) -> torch.Tensor:
    """Deterministic (ODE) generation for eval/inference: uint8 (N, H, W, 3). ``num_steps`` defaults to
    ``cfg.num_steps`` (eval usually uses more steps than the rollout). The solver is ``cfg.ode_solver`` (Euler, or
    DPM-Solver++(2M) on every step). ``rlg_weight`` (needs a LoRA on the adapter) samples with RL guidance
    (:func:`rlg_velocity`) instead of the adapter as it is."""
    check_ode_solver(cfg.ode_solver)
    K = int(num_steps or cfg.num_steps)
    H, W = cfg.height, cfg.width
    adapter.set_resolution(H, W)
    sig = adapter.sigmas(K, H, W)
    out = []
    for c0 in range(0, len(prompts), cfg.batch_size):
        c1 = min(len(prompts), c0 + cfg.batch_size)
        x = adapter.initial_noise(xt_seeds[c0:c1], H, W)
        emb = adapter.encode_prompts(prompts[c0:c1])
        x0_prev = None
        for k in range(K):
            s, sn = sig[k].item(), sig[k + 1].item()
            if rlg_weight is None:
                v = adapter.predict_velocity(x, s, emb, cfg.guidance_scale, cfg.cfg)
            else:
                v = rlg_velocity(adapter, x, s, emb, cfg.guidance_scale, cfg.cfg, rlg_weight)
            if cfg.ode_solver == "dpmpp2m":
                x, x0_prev = dpmpp2m_step(v, x, s, sn, x0_prev, sig[k - 1].item() if k > 0 else None)
            else:
                x = sde_step(v, x, s, sn, kind="ode").prev_sample
        out.append(adapter.decode(x, H, W).cpu())
    return torch.cat(out)
