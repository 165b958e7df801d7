"""The flow-matching GRPO trainer: one loop, methods differ only by config (see :mod:`flow_grpo.config`).

Per epoch::

    groups g = epoch*groups_per_epoch + [0, groups_per_epoch)   (global ids; samples split over processes)
    sample trajectories (SDE on the plan's steps, exact log-probs)     -> flow_grpo.sampler
    rewards (+ ODE-completion rewards for tp_grpo / g2rpo)
    advantages (N, T) from mmgrpo.core with explicit group ids (gathered across processes)
    for each update (``optim.updates_per_epoch`` per epoch, each over whole trajectories):
        for each rollout chunk, for each trained column k:   # same chunks as the rollout -> ratio == 1 on-policy
            logp = log N(x_{k+1}; mu_theta(x_k), s_k^2)       # fp32
            loss = PPO-clip(logp - logp_old, A[:, k]) (+ beta * KL)      / #trained (sample, step) pairs
            backward                                          # gradients accumulate over steps and chunks
        all-reduce grads (sum), clip to max_grad_norm, AdamW step, EMA update
    log, PNG grid, checkpoint (model/LoRA, optimizer, EMA, epoch, RNG, config)

Multi-process: every process runs the same loop on its slice of the epoch's samples. Gradients are summed with an
explicit all-reduce after local accumulation (the loss is normalised by the *global* count of trained pairs), so
processes may hold different numbers of chunks/columns without DDP hook mismatches.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Optional

import torch

from .config import TrainConfig
from .sampler import Trajectories, _window_layout, sample_trajectories, score_column


# ----------------------------------------------------------------------------------------------------- data
def load_prompts(path: str) -> tuple[list[str], list[dict]]:
    """``.txt``: one prompt per non-empty line. ``.jsonl``: one object per line with a string ``prompt`` (the rest
    is metadata, e.g. GenEval ``tag``/``include``). Errors name the file and line."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    prompts, meta = [], []
    with open(p, encoding="utf-8") as f:
        for ln, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if p.suffix == ".jsonl":
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{ln}: invalid JSON ({exc.msg})") from None
                if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
                    raise ValueError(f"{path}:{ln}: expected an object with a non-empty string field 'prompt'")
                prompts.append(obj["prompt"])
                meta.append({k: v for k, v in obj.items() if k != "prompt"})
            else:
                prompts.append(line.strip())
                meta.append({})
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts, meta


def build_reward_fn(cfg: TrainConfig) -> Callable:
    """Combine ``flow_grpo.rewards.build_reward(name, **kwargs)`` for every weighted name into one typed fn.

    A reward returning one score is keyed by its config name; one returning several keeps its own keys (its
    config name must be one of them to be weighted). ``"valid"`` masks are AND-ed."""
    from flow_grpo.rewards import build_reward  # owned by the rewards engineer

    fns = {name: build_reward(name, **cfg.reward.kwargs.get(name, {})) for name in cfg.reward.weights}

    def fn(images, prompts, metadata):
        out, valid = {}, None
        for name, f in fns.items():
            res = f(images, prompts, metadata)
            res = dict(res) if isinstance(res, dict) else {name: res}
            v = res.pop("valid", None)
            if v is not None:
                v = torch.as_tensor(v).bool()
                valid = v if valid is None else (valid & v)
            if len(res) == 1:
                out[name] = next(iter(res.values()))
            else:
                out.update(res)
        if valid is not None:
            out["valid"] = valid
        return out

    return fn


# ----------------------------------------------------------------------------------------------------- EMA
class EMA:
    """Exponential moving average of trainable parameters (fp32 shadow)."""

    def __init__(self, params: list[torch.nn.Parameter], decay: float):
        self.params = params
        self.decay = decay
        self.shadow = [p.detach().float().clone() for p in params]
        self._backup: Optional[list[torch.Tensor]] = None

    @torch.no_grad()
    def update(self) -> None:
        for s, p in zip(self.shadow, self.params):
            s.mul_(self.decay).add_(p.detach().float(), alpha=1 - self.decay)

    @contextlib.contextmanager
    def swapped_in(self):
        with torch.no_grad():
            backup = [p.detach().clone() for p in self.params]
            for s, p in zip(self.shadow, self.params):
                p.copy_(s.to(p.dtype))
        try:
            yield
        finally:
            with torch.no_grad():
                for b, p in zip(backup, self.params):
                    p.copy_(b)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "shadow": [s.cpu() for s in self.shadow]}

    def load_state_dict(self, sd: dict) -> None:
        if len(sd["shadow"]) != len(self.shadow):
            raise ValueError("EMA state does not match the trainable parameters")
        self.shadow = [s.to(p.device).float() for s, p in zip(sd["shadow"], self.params)]
        self.decay = sd["decay"]


# ----------------------------------------------------------------------------------------------------- trainer
class FlowGRPOTrainer:
    """Build with a config (and optionally a ready adapter / reward fn, e.g. in tests), then :meth:`train`."""

    def __init__(self, cfg: TrainConfig, adapter=None, reward_fn: Optional[Callable] = None):
        from accelerate import Accelerator

        from mmgrpo.utils.seeding import seed_everything

        self.cfg = cfg
        self.accelerator = Accelerator(cpu=cfg.run.cpu, mixed_precision=cfg.run.mixed_precision)
        self.rank = self.accelerator.process_index
        self.world = self.accelerator.num_processes
        self.is_main = self.accelerator.is_main_process
        self.out = Path(cfg.run.output_dir)
        seed_everything(cfg.run.seed)  # identical LoRA init on every process
        self.adapter = adapter if adapter is not None else self._build_adapter()
        self._validate()
        if cfg.model.lora.enabled:
            if not self.adapter.lora_enabled:
                self.adapter.add_lora(cfg.model.lora.rank, cfg.model.lora.alpha, cfg.model.lora.target_modules,
                                      init_lora_weights=_peft_init(cfg.model.lora.init))
        else:
            self.adapter.enable_full_finetune()
        self.adapter.set_gradient_checkpointing(cfg.model.gradient_checkpointing)
        self.named_params = [(n, p) for n, p in self.adapter.transformer.named_parameters() if p.requires_grad]
        self.params = [p for _, p in self.named_params]
        if not self.params:
            raise ValueError("no trainable parameters")
        self._broadcast_params()
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2),
                                           eps=cfg.optim.eps, weight_decay=cfg.optim.weight_decay)
        self.ema = EMA(self.params, cfg.ema.decay) if cfg.ema.enabled else None
        # an injected reward fn (tests, custom scripts) is used as is: its single score, or its "avg" key
        self.reward_weights = dict(cfg.reward.weights) if reward_fn is None else None
        self.reward_fn = reward_fn if reward_fn is not None else build_reward_fn(cfg)
        if cfg.data.train_path:
            self.prompts, self.metadata = load_prompts(cfg.data.train_path)
        elif cfg.data.prompts:
            self.prompts, self.metadata = list(cfg.data.prompts), [{} for _ in cfg.data.prompts]
        else:
            raise ValueError("no prompts: set data.train_path or data.prompts")
        self.epoch = 0
        self.global_step = 0
        self.ckpt = None
        self.logger = None
        if self.is_main:
            from mmgrpo.utils.logging import MetricLogger

            self.logger = MetricLogger(self.out, use_tensorboard=cfg.run.tensorboard, is_main_process=True)
        from mmgrpo.utils.checkpoint import CheckpointManager

        self.ckpt = CheckpointManager(self.out / "checkpoints", keep_last=cfg.run.keep_last, keep_best=False)

    # ------------------------------------------------------------------ setup helpers
    def _build_adapter(self):
        from .models import adapter_from_pipeline, load_adapter

        m = self.cfg.model
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[m.dtype]
        device = self.accelerator.device
        if m.tiny:
            from .models import tiny

            builder = {"sd3": tiny.build_tiny_sd3_pipeline, "flux": tiny.build_tiny_flux_pipeline}[m.tiny]
            return adapter_from_pipeline(builder(seed=self.cfg.run.seed), device=device, dtype=dtype,
                                         max_sequence_length=m.max_sequence_length)
        if not m.pipeline_dir:
            raise ValueError("set model.pipeline_dir (a diffusers folder) or model.tiny=sd3|flux")
        return load_adapter(m.pipeline_dir, kind=m.kind, device=device, dtype=dtype,
                            max_sequence_length=m.max_sequence_length)

    def _validate(self) -> None:
        c = self.cfg
        n_total = c.data.group_size * c.data.groups_per_epoch
        if c.data.group_size < 2:
            raise ValueError("data.group_size must be >= 2 (advantages are group-relative)")
        if n_total % self.world:
            raise ValueError(f"group_size*groups_per_epoch={n_total} must be divisible by the {self.world} processes")
        if self.adapter.kind == "flux" and c.sample.cfg:
            raise ValueError("FLUX uses embedded guidance: set sample.cfg=false")
        if c.optim.kl_type not in ("mean", "mean_exact", "velocity"):
            raise ValueError(f"optim.kl_type must be mean | mean_exact | velocity, got {c.optim.kl_type!r}")
        if c.optim.beta > 0 and not c.model.lora.enabled:
            raise ValueError("KL with full fine-tuning needs a frozen reference copy; use LoRA (reference = adapter off)")

    def _broadcast_params(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and self.world > 1:
            for p in self.params:
                dist.broadcast(p.data, src=0)

    # ------------------------------------------------------------------ seeds / layout
    def _epoch_samples(self, epoch: int):
        """This process's slice of the epoch: prompts, metadata, global group ids and the three seed lists."""
        from mmgrpo.utils.seeding import sample_seed

        c = self.cfg
        G, n_groups = c.data.group_size, c.data.groups_per_epoch
        n_total = G * n_groups
        g = torch.Generator().manual_seed(sample_seed(c.run.seed, epoch, 0))
        order = torch.randperm(len(self.prompts), generator=g)
        per = n_total // self.world
        lo, hi = self.rank * per, (self.rank + 1) * per
        prompts, meta, gids, xs, ns, ps = [], [], [], [], [], []
        for s in range(lo, hi):
            local_g = s // G
            gid = epoch * n_groups + local_g
            pi = int(order[local_g % len(order)])
            prompts.append(self.prompts[pi])
            meta.append(dict(self.metadata[pi]))
            gids.append(gid)
            xs.append(sample_seed(c.run.seed, 1, gid) if c.sample.same_noise_per_group
                      else sample_seed(c.run.seed, 2, epoch, s))
            ns.append(sample_seed(c.run.seed, 3, epoch, s))
            ps.append(sample_seed(c.run.seed, 4, gid))  # plan shared by the group (windows, single step)
        return prompts, meta, gids, xs, ns, ps

    # ------------------------------------------------------------------ advantages
    def compute_advantages(self, traj: Trajectories) -> tuple[torch.Tensor, dict]:
        """(N, T) advantages of the trained columns (0 where not trained) and stats."""
        from mmgrpo.core import distributed_group_advantages, gather_groups, step_advantages, turning_point_rewards

        c = self.cfg
        gids = traj.group_ids
        stats: dict = {}
        kw = dict(scale=c.optim.adv_scale, clamp=c.optim.adv_clip_max)
        N, T = traj.train_mask.shape
        valid = traj.rewards.get("valid")
        if valid is not None and not bool(valid.all()):
            if c.sample.credit != "outcome":
                raise ValueError(f"{int((~valid).sum())} samples have invalid rewards; credit={c.sample.credit} "
                                 "needs every completion scored (use nan_policy='raise')")
            stats["reward/invalid_count"] = float((~valid).sum())
        if c.sample.credit == "outcome":
            out = distributed_group_advantages(traj.rewards["total"], gids, valid=valid, **kw)
            adv = out.advantages.float().unsqueeze(1).expand(N, T).clone()
            stats["adv/zero_std_fraction"] = out.zero_std_fraction
        elif c.sample.credit == "g2rpo":
            total = torch.zeros(N)
            fr = []
            for gi in range(traj.step_rewards.shape[1]):
                out = distributed_group_advantages(traj.step_rewards[:, gi], gids, **kw)
                total += out.advantages.float()
                fr.append(out.zero_std_fraction)
            adv = total.clamp(-c.optim.adv_clip_max, c.optim.adv_clip_max).unsqueeze(1).expand(N, T).clone()
            stats["adv/zero_std_fraction"] = sum(fr) / len(fr)
        elif c.sample.credit == "tp_grpo":
            (R_all, g_all), sl = gather_groups([traj.step_rewards, gids])
            credit = turning_point_rewards(R_all, g_all, balance=True, balance_scope="group")
            A_all = step_advantages(credit.step_rewards, g_all, scale=c.optim.adv_scale, clamp=c.optim.adv_clip_max)
            A = A_all[sl].float()  # (N, n): window position j
            n, pos = _window_layout(traj)
            adv = torch.zeros(N, T)
            adv.scatter_(1, pos, A)
            stats.update(credit.stats())
            stats["adv/zero_std_fraction"] = float((A_all.abs().sum(0) == 0).float().mean())
            for j in range(n):
                stats[f"step_reward/mean_{j}"] = float(credit.step_rewards[sl][:, j].float().mean())
        else:
            raise ValueError(f"unknown credit {c.sample.credit!r}")
        adv = adv * traj.train_mask.float()
        stats["adv/mean_abs"] = float(adv[traj.train_mask].abs().mean()) if traj.train_mask.any() else 0.0
        return adv, stats

    # ------------------------------------------------------------------ loss of one column
    def _column_loss(self, traj: Trajectories, chunk, col: int, adv: torch.Tensor, n_global: float):
        from mmgrpo.core import policy_loss

        from .sde import kl_on_mean, kl_on_velocity, sde_step

        c = self.cfg
        c0, c1 = chunk
        mask = traj.train_mask[c0:c1, col].to(self.adapter.device)
        with self.accelerator.autocast():
            out, v = score_column(self.adapter, traj, chunk, col, return_velocity=True)
        logp = out.log_prob.float()
        old = traj.log_probs[c0:c1, col].to(logp.device)
        a = adv[c0:c1, col].to(logp.device)
        res = policy_loss(logp.unsqueeze(1), old.unsqueeze(1), a.unsqueeze(1), mask.unsqueeze(1),
                          clip_low=c.optim.clip_range, agg="token_mean", num_tokens=n_global)
        loss = res.loss
        kl_val = 0.0
        if c.optim.beta > 0:
            s = traj.sampling
            with torch.no_grad(), self.adapter.reference(), self.accelerator.autocast():
                v_ref = self.adapter.predict_velocity(traj.latents[c0:c1, col], traj.sigmas[col].item(),
                                                      self.adapter.encode_prompts(traj.prompts[c0:c1]),
                                                      s.guidance_scale, s.cfg)
            if c.optim.kl_type == "velocity":
                kl = kl_on_velocity(v, v_ref)
            else:
                ref = sde_step(v_ref, traj.latents[c0:c1, col], traj.sigmas[col].item(), traj.sigmas_next[col].item(),
                               kind=s.sde_kind, noise_level=s.noise_level, noise=torch.zeros_like(v_ref))
                std = out.noise_scale if c.optim.kl_type == "mean" else out.std
                kl = kl_on_mean(out.mean, ref.mean, std)
            m = mask.float()
            loss = loss + c.optim.beta * (kl * m).sum() / n_global
            kl_val = float((kl.detach() * m).sum() / m.sum().clamp_min(1))
        return loss, res.metrics, kl_val, int(mask.sum())

    # ------------------------------------------------------------------ one epoch
    def train_epoch(self) -> dict:
        from mmgrpo.core import global_sum

        c = self.cfg
        epoch = self.epoch
        t0 = time.perf_counter()
        prompts, meta, gids, xs, ns, ps = self._epoch_samples(epoch)
        self.adapter.model.eval()
        traj = sample_trajectories(self.adapter, prompts, c.sample, xs, ns, ps, gids, meta, self.reward_fn,
                                   self.reward_weights,
                                   global_step=self.global_step)
        t_sample = time.perf_counter() - t0
        adv, stats = self.compute_advantages(traj)
        train_mask = traj.train_mask.clone()
        if c.optim.drop_zero_adv:
            train_mask &= (adv != 0).any(1, keepdim=True)
        traj.train_mask = train_mask
        # updates: split the chunks (whole trajectories, all their steps) into updates_per_epoch groups
        n_chunks = len(traj.chunks)
        n_upd = max(1, min(c.optim.updates_per_epoch, n_chunks))
        bounds = [round(i * n_chunks / n_upd) for i in range(n_upd + 1)]
        per_col: dict[int, list[float]] = {}
        metrics_acc: dict[str, list[float]] = {}
        kls = []
        grad_norms = []
        t1 = time.perf_counter()
        for _ in range(c.optim.inner_epochs):
            for u in range(n_upd):
                chunk_ids = range(bounds[u], bounds[u + 1])
                local_pairs = sum(int(train_mask[traj.chunks[i][0]:traj.chunks[i][1]].sum()) for i in chunk_ids)
                n_global = global_sum(float(local_pairs))
                if n_global == 0:
                    continue
                self.adapter.model.train()
                for i in chunk_ids:
                    ch = traj.chunks[i]
                    for col in range(train_mask.shape[1]):
                        if not bool(train_mask[ch[0]:ch[1], col].any()):
                            continue
                        loss, m, kl_val, cnt = self._column_loss(traj, ch, col, adv, n_global)
                        loss.backward()
                        for k, v in m.items():
                            metrics_acc.setdefault(k, []).append(float(v))
                        per_col.setdefault(int(traj.step_indices[col]), []).append(float(m.get("ratio_mean", 1.0)))
                        if c.optim.beta > 0:
                            kls.append(kl_val)
                grad_norms.append(self._optimizer_step())
        t_train = time.perf_counter() - t1
        # ------------------------------------------------------------ logging
        n_local = len(traj)
        n_images = global_sum(float(n_local))
        total = traj.rewards["total"]
        out = {
            "epoch": epoch,
            "reward/mean": float(total.mean()), "reward/std": float(total.std()) if n_local > 1 else 0.0,
            **{f"reward/{k}": float(torch.as_tensor(v).float().mean()) for k, v in traj.rewards.items()
               if k not in ("total", "valid")},
            **stats,
            "nfe_per_trajectory": traj.nfe_per_trajectory,
            "time/sample_s": t_sample, "time/train_s": t_train,
            "images_per_s": n_images / max(t_sample + t_train, 1e-9),
            "actual_batch_size": float(train_mask.any(1).sum()),
            "grad_norm": sum(grad_norms) / max(len(grad_norms), 1),
        }
        for k, v in metrics_acc.items():
            out[f"train/{k}"] = sum(v) / len(v)
        for k, v in per_col.items():
            out[f"ratio/step_{k}"] = sum(v) / len(v)
        if kls:
            out["train/kl"] = sum(kls) / len(kls)
        self._last_traj = traj
        return out

    def _optimizer_step(self) -> float:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and self.world > 1:
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)  # loss is already / global pair count
        gn = 0.0
        if self.cfg.optim.max_grad_norm > 0:
            gn = float(torch.nn.utils.clip_grad_norm_(self.params, self.cfg.optim.max_grad_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.global_step += 1
        if self.ema is not None and self.global_step % self.cfg.ema.update_every == 0:
            self.ema.update()
        return gn

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict:
        from mmgrpo.utils.checkpoint import capture_rng_state
        from mmgrpo.utils.config import config_to_dict

        return {
            "trainable": {n: p.detach().cpu().clone() for n, p in self.named_params},
            "optimizer": self.optimizer.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else {},
            "trainer": {"epoch": self.epoch, "global_step": self.global_step, "world": self.world},
            "rng": capture_rng_state(),
            "config": config_to_dict(self.cfg),
        }

    def load_state_dict(self, st: dict) -> None:
        from mmgrpo.utils.checkpoint import restore_rng_state

        names = dict(self.named_params)
        missing = set(names) - set(st["trainable"])
        if missing:
            raise ValueError(f"checkpoint lacks trainable parameters {sorted(missing)[:5]}")
        with torch.no_grad():
            for n, p in names.items():
                p.copy_(st["trainable"][n].to(p.device, p.dtype))
        self.optimizer.load_state_dict(st["optimizer"])
        if self.ema is not None and st.get("ema"):
            self.ema.load_state_dict(st["ema"])
        self.epoch = int(st["trainer"]["epoch"])
        self.global_step = int(st["trainer"]["global_step"])
        if "rng" in st:
            restore_rng_state(st["rng"])

    def save_checkpoint(self) -> Optional[Path]:
        if not self.is_main:
            return None
        extra = {}
        if self.cfg.model.lora.enabled:
            def write_lora(path):
                os.makedirs(path, exist_ok=True)
                ctx = self.ema.swapped_in() if self.ema is not None else contextlib.nullcontext()
                with ctx:
                    self.adapter.save_lora(str(path))
            extra["lora"] = write_lora
        return self.ckpt.save(self.epoch, self.state_dict(), extra_files=extra)

    def maybe_resume(self) -> Optional[Path]:
        path = self.ckpt.resolve(self.cfg.run.resume_from)
        if path is None:
            return None
        self.load_state_dict(self.ckpt.load(path))
        return path

    # ------------------------------------------------------------------ main loop
    def train(self, num_epochs: Optional[int] = None) -> list[dict]:
        from mmgrpo.utils.config import save_config
        from mmgrpo.utils.logging import save_image_grid

        c = self.cfg
        if self.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            save_config(c, self.out / "config.yaml")
        resumed = self.maybe_resume()
        if resumed is not None and self.is_main:
            print(f"[flow_grpo] resumed from {resumed} at epoch {self.epoch}")
        end = c.run.num_epochs if num_epochs is None else self.epoch + num_epochs
        history = []
        while self.epoch < end:
            metrics = self.train_epoch()
            history.append(metrics)
            if self.logger is not None:
                self.logger.log(metrics, self.global_step)
                every = c.run.image_grid_every
                if every and (self.epoch % every == 0):
                    t = self._last_traj
                    save_image_grid(t.images, self.out / "samples" / f"epoch_{self.epoch:05d}.png",
                                    nrow=c.data.group_size, captions=[f"{p[:30]} r={r:.3f}" for p, r in
                                                                      zip(t.prompts, t.rewards["total"].tolist())])
            self.epoch += 1
            if c.run.save_every and self.epoch % c.run.save_every == 0:
                self.save_checkpoint()
        if not c.run.save_every or self.epoch % c.run.save_every:
            self.save_checkpoint()
        if self.logger is not None:
            self.logger.flush()
        return history


def _peft_init(v: str):
    low = str(v).lower()
    if low in ("true", "default"):
        return True
    if low == "false":
        return False
    return v


def train_from_config(cfg: TrainConfig) -> list[dict]:
    return FlowGRPOTrainer(cfg).train()
