"""The VLM GRPO trainer: one readable loop; methods plug in through the hooks of ``mmgrpo.vlm.methods``.

The loop names no method: the methods the config enables (``mmgrpo.vlm.methods.REGISTRY``) are built once and their
hooks called at fixed points, in registry order (``mmgrpo.vlm.methods.base`` lists the points). Per step
(``GRPOTrainer.train``):

1. **collect**: draw prompts (deterministic, resumable stream; each process takes its slice), build processor inputs
   (videos through ``mmgrpo.video``'s fps contract), sample the group's members (seeds from (seed, step,
   stream position, g); methods may add members, e.g. TempSamp-R1's ground truth), score rewards (methods may add
   terms, e.g. T-GRPO's bonus), compute group advantages (explicit integer group ids = stream position; methods
   may shape the reward or replace the estimator), let methods filter the batch and refill it in extra rounds
   (DAPO dynamic sampling);
2. **precompute** on fixed micro-batches of whole groups: old log-probs (num_iterations > 1, or a method needs
   them), reference log-probs (kl_coef > 0), the methods' token weights -- all with ``compute_token_logprobs``,
   the same function and the same padding the loss uses, so on-policy ratios are exactly 1 (the output head runs
   ``algo.logprob_chunk_size`` tokens at a time, ``mmgrpo.vlm.models.chunked``: no full-vocabulary logits exist);
   on a process's first step the trainer's log-probs must also equal the rollout backend's (``rollout.onpolicy_check``,
   ``mmgrpo.vlm.train.onpolicy``: otherwise the run stops before any update, naming the likely cause);
3. **optimise**: ``num_iterations`` AdamW updates over the micro-batches with ``mmgrpo.core.policy_loss`` (PPO-clip
   or Reg-GRPO, chosen aggregation, KL); losses are normalised by *global* token / sequence counts and gradients are
   summed across processes, so the update does not depend on the number of processes or micro-batches;
4. log (every reward, zero-std fraction, clip fractions, KL, lengths, parse failures, tokens/s; sampled
   completions to ``completions.jsonl``) and checkpoint (all state through ``CheckpointManager``; the last
   ``run.keep_last`` plus the best by ``run.best_metric``).

This file holds the loop; the rest of the trainer lives beside it in ``mmgrpo.vlm.train``: ``setup`` (accelerator,
policy, optimizer, run state), ``stream`` / ``prompts`` (which samples a step draws, media prefetch), ``batch``
(``RolloutBatch``, micro-batches), ``scoring`` (reward calls), ``distributed``, ``metrics``, ``checkpointing``,
``stopping`` (skips, stops, signals).

Faults (``mmgrpo.vlm.train.faults``): a reward call that raises or times out is retried with back-off, then its rows
are dropped (counted) or the run stops; NaN/inf rewards drop their rows from the group (``valid``) or stop the run;
groups left with < 2 members get advantage 0 (counted); NaN/inf advantages, loss or gradients skip the optimizer
step (counted); ``run.max_consecutive_skips`` skips in a row stop the run.  A stop always writes a checkpoint
first and raises ``TrainingStopped`` (``mmgrpo train`` exits with code 3).

Preemption (``mmgrpo.utils.signals``): SIGTERM / SIGINT set a flag that every process polls through a max-reduction
after collect (the step is then discarded: stream and RNG roll back) and before each step (the step in progress was
finished); all processes stop at the same step, a checkpoint is written and ``TrainingInterrupted`` raised
(``mmgrpo train`` exits with code 6). A second signal >= 1 s later kills the process at once; atomic checkpoint
writes keep the last complete checkpoint intact.

Several processes: each draws its share of the global batch (``run.prompts_per_step``; a group may be split, its
advantages are computed on the gathered batch).  Gradients are summed by hand for replicated weights
(``run.grad_sync=manual``, the default without FSDP / DeepSpeed) or go through ``accelerator.prepare`` (FSDP2 /
DeepSpeed, see ``optimize``).  Verified on CPU only (gloo, two processes): the manual path and FSDP2 (plugin
set by hand, as accelerate refuses FSDP without GPUs), including a sharded checkpoint resume; DeepSpeed is wired
the same way but untested (not installable here); no GPU / NCCL run has been made.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from mmgrpo.vlm.config import TrainConfig
from mmgrpo.core import AdvantageOutput, gather_groups, group_advantages, policy_loss
from mmgrpo.engine.dist import any_process, global_max, global_sum
from mmgrpo.engine.groups import valid_member_counts
from mmgrpo.vlm.methods import build_methods
from mmgrpo.vlm.models.adapters import Policy
from mmgrpo.vlm.models.rollout import RolloutBackend, SamplingParams, batch_to, collate_prompts, compute_token_logprobs
from mmgrpo.vlm.train.batch import RolloutBatch, cat_batches, empty_batch, micro_batches
from mmgrpo.vlm.train.checkpointing import CheckpointMixin
from mmgrpo.vlm.train.compat import MethodAliases
from mmgrpo.vlm.train.distributed import DistributedMixin
from mmgrpo.vlm.train import onpolicy, validation
from mmgrpo.vlm.train.faults import nonfinite_rows
from mmgrpo.vlm.train.format_guard import FormatGuard, progress_fields
from mmgrpo.vlm.train.metrics import MetricsMixin
from mmgrpo.vlm.train.prompts import PromptMixin
from mmgrpo.vlm.train.scoring import ScoringMixin
from mmgrpo.vlm.train.setup import SetupMixin
from mmgrpo.vlm.train.stopping import StopMixin
from mmgrpo.vlm.train.stream import PromptStream
from mmgrpo.vlm.train.task import PreparedPrompt, accuracy_key, build_rewards, load_samples, sample_id
from mmgrpo.utils.checkpoint import capture_rng_state
from mmgrpo.utils.logging import get_logger
from mmgrpo.utils.runlock import acquire_run_lock
from mmgrpo.utils.seeding import sample_seed, seed_everything
from mmgrpo.utils.signals import StopOnSignal

log = get_logger("mmgrpo.train")


class GRPOTrainer(SetupMixin, PromptMixin, ScoringMixin, DistributedMixin, MetricsMixin, CheckpointMixin, StopMixin,
                  MethodAliases):
    """GRPO for Qwen-VL policies.  ``samples`` / ``policy`` / ``reward_fn`` may be injected (tests, scripts)."""

    def __init__(self, cfg: TrainConfig, samples: Sequence[Any] | None = None, policy: Policy | None = None,
                 reward_fn: Callable | None = None, accuracy_fn: Callable | None = None,
                 backend: RolloutBackend | None = None):
        self.cfg = cfg
        self._setup_accelerator()
        self._setup_global_batch()
        self.run_dir = Path(cfg.run.output_dir)
        # one run per output folder (main process), before anything else: a second run refuses at once, naming the
        # holder, whatever else is wrong with its settings
        self._run_lock = acquire_run_lock(self.run_dir, self.accelerator.is_main_process, owner=self)
        self._preflight(loading=policy is None)  # settings that fail only after loading: exit 2 now (setup.py)
        self._pad_rows = None  # (batch, rows) repeated with weight 0 to pad micro-batch counts (prepared model)
        # same seed on every process: LoRA / head initialisation must be identical across ranks (sampling itself
        # uses explicit per-row seeds, see make_seeds)
        seed_everything(cfg.run.seed)

        # data first: a bad file fails before a (large) model is loaded
        self.media_report = None  # the media check of the loaded data (mmgrpo.vlm.data.media)
        if samples is not None:
            self.samples = list(samples)
        else:
            from mmgrpo.vlm.data.media import MediaScreen

            self.samples, self.media_report = load_samples(
                cfg.data.train_file, cfg.data.max_samples, cfg.data.media_root,
                check_media=cfg.data.on_missing_media == "error", screen=MediaScreen.from_config(cfg.data),
                with_report=True)
        self.all_samples = self.samples
        self._validator = validation.load(self)  # validation.file read now: a bad file fails before the model loads
        self._setup_policy(policy)
        if reward_fn is None:
            reward_fn, accuracy_fn = build_rewards(cfg.reward, cfg.data.task, self.policy.family, self.tok,
                                                   cfg.data.prompt_mode, cfg.data.answer_format)
        self.reward_fn, self.accuracy_fn = reward_fn, accuracy_fn
        self.acc_key = accuracy_key(cfg.reward, cfg.data.task)
        from mmgrpo.vlm.check import start_of_run_check  # what the model sees, checked before anything trains

        start_of_run_check(self.task, self.samples, self.reward_fn, cfg.data.check_samples,
                           log if self.accelerator.is_main_process else None)
        self.methods = build_methods(cfg, self)  # mmgrpo.vlm.methods: their hooks, in registry order
        self.backend = backend if backend is not None else self._default_backend()
        self.sampling = SamplingParams(cfg.rollout.max_new_tokens, cfg.rollout.temperature, cfg.rollout.top_p,
                                       cfg.rollout.top_k)
        self._setup_optimizer()
        self.format_guard = FormatGuard(cfg)
        self.logprob_impl = self._choose_logprob_impl()
        self._setup_run_state()

    # ----------------------------------------------------------------------------------------- rollout
    def rollout(self, step: int, preps: list[tuple[int, PreparedPrompt, list[int] | None]]) -> RolloutBatch:
        """Sample (plus the methods' extra group members), score, then the methods' reward hooks."""
        rows, info = self._sample_rows(step, preps)
        rb = self._score_rows(rows, info)
        ctx = {"step": step, "preps": preps, "reward_samples": [r["pp"].reward_sample for r in rows]}
        for m in self.methods:
            m.on_rewards(rb, ctx)
        return rb

    def _sample_rows(self, step: int, preps: list) -> tuple[list[dict], dict[str, float]]:
        """One dict per completion row (ids, mask, text, lp, offpolicy, truncated, pp, group); a group's rows are
        contiguous: its sampled members, then the methods' ``extra_rows``."""
        cfg = self.cfg
        G_on = cfg.rollout.group_size
        for m in self.methods:
            G_on = m.generations_per_group(G_on)
        # one row per owned (prompt, generation index); seed = f(seed, step, position, g), so a row's sample does
        # not depend on which process draws it
        gens_of = {pos: list(range(G_on)) if gens is None else list(gens) for pos, _, gens in preps}
        # each prompt goes to the backend ONCE with its number of generations, so the HF backend prefills it once
        # and samples its rows from that prefill (rollout.shared_prefix); one call per distinct count (a group
        # split across processes owns fewer rows here)
        sampled: dict[int, list[dict]] = {}
        n_tok = 0
        t0 = time.time()
        with self._generation_context():  # once per step however the groups split: with FSDP it runs collectives
            for k in sorted({len(g) for g in gens_of.values()}, reverse=True):
                part = [(pos, pp) for pos, pp, _ in preps if len(gens_of[pos]) == k]
                if k:
                    out = self._generate_part(step, part, k, gens_of)
                    n_tok += int(out.completion_mask.sum())
                    T = out.completion_ids.shape[1]
                    for i, (pos, _) in enumerate(part):  # prompt-major: prompt i owns rows i*k .. i*k+k-1
                        sampled[pos] = [dict(ids=out.completion_ids[r], mask=out.completion_mask[r],
                                             text=out.texts[r], offpolicy=False, truncated=bool(out.truncated[r]),
                                             lp=out.logprobs[r] if out.logprobs is not None else torch.zeros(T))
                                        for r in range(i * k, (i + 1) * k)]
        gen_time = time.time() - t0
        self.counters["generated_tokens"] += n_tok
        rows: list[dict] = []
        for pos, pp, _ in preps:
            rows += [dict(x, pp=pp, group=pos) for x in sampled.get(pos, [])]
            for m in self.methods:
                rows += [dict(x, pp=pp, group=pos) for x in m.extra_rows(pp)]
        return rows, {"gen_time": gen_time, "gen_tokens": float(n_tok)}

    def _generate_part(self, step: int, part: list, k: int, gens_of: dict):
        """``k`` generations of each prompt of ``part`` [(position, prepared prompt)] in one backend call."""
        seeds = [sample_seed(self.cfg.run.seed, step, pos, g) for pos, _ in part for g in gens_of[pos]]
        return self.backend.generate(
            [pp.item for _, pp in part], k, self.sampling, seeds=seeds,
            raw_prompts=[{"text": pp.text, "images": pp.images, "clip": pp.clip,
                          "video": None if pp.clip is None else pp.clip.frames} for _, pp in part])

    def _score_rows(self, rows: list[dict], info: dict[str, float]) -> RolloutBatch:
        """Pad the rows into a batch and score them; ``valid`` marks rows whose rewards exist and are finite."""
        Tm = max(len(r["ids"]) for r in rows)
        pad1 = lambda x, v: torch.nn.functional.pad(x, (0, Tm - x.shape[0]), value=v)  # noqa: E731
        texts = [r["text"] for r in rows]
        scored = self._score(texts, [r["pp"].reward_sample for r in rows])
        parse_failed = scored.pop("parse_failed").bool()
        failed = scored.pop("_failed").bool()
        rewards = {k: v.float() for k, v in scored.items()}
        return RolloutBatch(items=[r["pp"].item for r in rows], samples=[r["pp"].sample for r in rows], texts=texts,
                            completion_ids=torch.stack([pad1(r["ids"], self.pad_id) for r in rows]),
                            completion_mask=torch.stack([pad1(r["mask"].long(), 0) for r in rows]),
                            group_ids=torch.tensor([r["group"] for r in rows], dtype=torch.long),
                            is_offpolicy=torch.tensor([r["offpolicy"] for r in rows]),
                            truncated=torch.tensor([r["truncated"] for r in rows]), parse_failed=parse_failed,
                            rewards=rewards, rollout_logp=torch.stack([pad1(r["lp"].float(), 0.0) for r in rows]),
                            info=dict(info), valid=self._valid_rows(rewards, failed, rows))

    def _valid_rows(self, rewards: dict[str, torch.Tensor], failed: torch.Tensor, rows: list[dict]) -> torch.Tensor:
        """A row takes part only if its reward call succeeded and its (weighted) rewards are finite."""
        cfg = self.cfg
        keys = ["total"] + [k for k in cfg.reward.weights if k in rewards]
        nonfinite = nonfinite_rows(rewards, len(rows), keys) & ~failed
        self.counters["reward_failed_rows"] += int(failed.sum())
        if nonfinite.any():
            self.counters["reward_nonfinite_rows"] += int(nonfinite.sum())
            bad = nonfinite.nonzero().flatten().tolist()
            which = sorted({k for k in keys if not torch.isfinite(rewards[k][nonfinite]).all()})
            ids = [sample_id(rows[i]["pp"].sample) for i in bad[:10]]
            msg = f"non-finite reward(s) {which} for {len(bad)} row(s) of sample(s) {ids}"
            if cfg.reward.on_nonfinite == "error":
                self._request_stop(msg + " (reward.on_nonfinite=error)")
            else:
                log.warning("%s: dropped from their groups (reward.on_nonfinite=drop)", msg)
        return ~failed & ~nonfinite

    def advantages(self, rb: RolloutBatch) -> None:
        """Group advantages of the reward the methods shape; sets rb.advantages, reward_used, zero_std.

        A method may compute them on this process's whole groups (``local_advantages``); otherwise statistics
        run over the GLOBAL batch (a group may be split across processes; "batch" scale is the std of every
        process's rewards): gather, compute, keep this process's rows -- the numbers of a 1-process run.
        Collective: every process calls advantages() once per sampling round."""
        a = self.cfg.algo
        used = rb.rewards["total"]
        for m in self.methods:
            used = m.shape_rewards(rb, used)
        valid = rb.valid if rb.valid is not None else torch.ones(rb.n, dtype=torch.bool)
        kw = dict(scale=a.adv_scale, eps=a.adv_eps, valid=valid)
        res = next((out for m in self.methods if (out := m.local_advantages(rb, used, kw)) is not None), None)
        gather = res is None and self.world > 1
        if res is not None:
            gid_all, valid_all, sl = rb.group_ids, valid, slice(0, rb.n)
        else:
            if gather:
                (used_all, gid_all, valid_all), sl = gather_groups([used.float(), rb.group_ids, valid])
            else:
                used_all, gid_all, valid_all, sl = used, rb.group_ids, valid, slice(0, rb.n)
            kw["valid"] = valid_all
            adv_fn = next((f for m in self.methods if (f := m.advantage_fn()) is not None), group_advantages)
            if gid_all.numel():
                res = adv_fn(used_all, gid_all, **kw)
            else:
                res = AdvantageOutput(torch.zeros(0), torch.zeros(0, dtype=torch.bool), 0.0, torch.zeros(0),
                                      torch.zeros(0), 0)
        adv_all = self._zero_degenerate(rb, res.advantages, gid_all, valid_all, count=not gather or self.rank == 0)
        rb.advantages, rb.reward_used, rb.zero_std = adv_all[sl], used, res.zero_std_mask[sl]
        rb.info["zero_std_frac"] = res.zero_std_fraction
        for m in self.methods:
            m.after_advantages(rb, valid)

    def _zero_degenerate(self, rb: RolloutBatch, adv: torch.Tensor, gid_all: torch.Tensor, valid_all: torch.Tensor,
                         count: bool) -> torch.Tensor:
        """Groups left with fewer than 2 valid members (rewards dropped) have no baseline: advantage exactly 0 (the
        core already gives 0 to 1-member groups; made explicit here), counted once (``count``: on the main process
        when statistics are global)."""
        n_valid, inv = valid_member_counts(gid_all, valid_all)
        degenerate = n_valid < 2
        adv_all = torch.where(degenerate[inv] | ~valid_all, torch.zeros_like(adv.float()), adv.float())
        n_deg = int(degenerate.sum()) if count else 0
        self.counters["degenerate_groups"] += n_deg
        # groups with a baseline (>= 2 valid members): a step with none anywhere trains nothing (see optimize)
        rb.info["valid_groups"] = float(int((~degenerate).sum()) if count else 0)
        rb.info["degenerate_groups"] = rb.info.get("degenerate_groups", 0.0) + float(n_deg)
        return adv_all

    def collect(self, step: int) -> RolloutBatch:
        """Rollouts for one step: a sampling round, then up to ``extra_rounds`` more while the methods' filters
        (``filter_batch``) leave fewer than the step's groups; ``finish_batch`` trims the result."""
        want = self.prompts_per_step // self.world  # whole groups per process (refills never split groups)
        batches, n_groups, zero_frac_first = [], 0, None
        valid_groups = 0.0  # summed over rounds, also from empty batches (statistics may be global)
        extra = sum(m.extra_rounds() for m in self.methods)
        for rnd in range(1 + extra):
            drawn = self._draw()
            # hint the next draws before preparing this one: the background thread decodes them while this batch
            # is prepared (inline on the first step and after a resume) and while this step generates and trains
            self._prefetch_ahead(current=drawn)
            preps = self._prepare(drawn)
            for m in self.methods:
                preps = m.prepare_prompts(step, preps)
            # a group is counted by the process holding its generation 0 (split groups are counted once)
            first_here = torch.tensor([pos for pos, _, gens in preps if gens is None or 0 in gens], dtype=torch.long)
            rb = self.rollout(step, preps) if preps else empty_batch()
            self.advantages(rb)  # on every process, even without prompts: it may gather across processes
            valid_groups += rb.info.get("valid_groups", 0.0)
            if preps:
                if zero_frac_first is None:
                    zero_frac_first = rb.info["zero_std_frac"]
                if not bool(rb.valid.all()):  # failed / non-finite rewards leave the batch (not the loss)
                    rb = rb.select(rb.valid.nonzero().flatten())
                for m in self.methods:
                    rb = m.filter_batch(rb)
                batches.append(rb)
                n_groups += int(torch.isin(torch.unique(rb.group_ids), first_here).sum())
            # every process runs the same number of rounds (the stream stays in sync): decide on global counts
            done = global_sum(float(n_groups >= want)) >= self.world
            if not extra or done:
                break
        pool = [b for b in batches if b.n > 0]
        rb = cat_batches(pool, self.pad_id) if pool else empty_batch()
        for m in self.methods:
            rb, n_groups = m.finish_batch(rb, n_groups, want)
        rb.info["zero_std_frac"] = zero_frac_first if zero_frac_first is not None else 0.0
        rb.info["degenerate_groups"] = sum(b.info.get("degenerate_groups", 0.0) for b in batches)
        rb.info["groups"] = float(n_groups)
        rb.info["valid_groups"] = valid_groups
        rb.info["rounds"] = float(rnd + 1)
        return rb

    # ----------------------------------------------------------------------------------------- log-probs
    def _mb_inputs(self, rb: RolloutBatch, idx: torch.Tensor):
        T = max(1, int(rb.completion_mask[idx].sum(1).max()))
        batch = batch_to(collate_prompts([rb.items[i] for i in idx.tolist()], self.pad_id), self.device)
        ids = rb.completion_ids[idx, :T].to(self.device)
        mask = rb.completion_mask[idx, :T].to(self.device)
        return batch, ids, mask, T

    def _logp(self, model, rb, idx, return_logits=False):
        """Log-probs of the micro-batch ``idx``; old, reference and current policy all go through here."""
        if self.logprob_impl == "prefix_group":
            from mmgrpo.vlm.models.prefix_group import grouped_rows_token_logprobs

            T = max(1, int(rb.completion_mask[idx].sum(1).max()))
            with self.accelerator.autocast():
                return grouped_rows_token_logprobs(
                    model, [rb.items[i] for i in idx.tolist()], rb.completion_ids[idx, :T],
                    rb.completion_mask[idx, :T], self.pad_id, self.sampling.temperature,
                    self.policy.suppress_token_ids, return_logits=return_logits, device=self.device,
                    chunk_size=self.cfg.algo.logprob_chunk_size)
        batch, ids, mask, T = self._mb_inputs(rb, idx)
        with self.accelerator.autocast():
            return compute_token_logprobs(model, batch, ids, mask, self.sampling.temperature,
                                          self.policy.suppress_token_ids, return_logits=return_logits,
                                          chunk_size=self.cfg.algo.logprob_chunk_size)

    def _mb_plan(self, rb: RolloutBatch, mbs: list[torch.Tensor]) -> list[tuple[RolloutBatch, torch.Tensor, float]]:
        """(batch, rows, weight) per forward.  With a prepared model every process must run the same number of
        forwards (DDP buffer broadcasts, FSDP all-gathers) and backwards (one synchronising backward per update):
        processes with fewer micro-batches repeat one with weight 0 (its loss is multiplied by 0)."""
        plan = [(rb, idx, 1.0) for idx in mbs]
        if self.grad_sync != "accelerate" or self.world == 1:
            return plan
        n_max = int(global_max(len(plan)))
        if len(plan) < n_max:
            if plan:
                pad = plan[-1][:2]
            elif self._pad_rows is not None:
                pad = self._pad_rows
            else:
                raise RuntimeError(f"process {self.rank} has no rows this step (skipped media / failed rewards) and "
                                   "no earlier row to keep the collectives of the prepared model in step; "
                                   "use data.on_missing_media=error or more prompts per process")
            plan += [(pad[0], pad[1], 0.0)] * (n_max - len(plan))
        if rb.n:
            self._pad_rows = (rb, mbs[0][:1])
        return plan

    @torch.no_grad()
    def precompute(self, rb: RolloutBatch, mbs: list[torch.Tensor]) -> None:
        """Old log-probs (several iterations, or a method needs them), reference log-probs (KL) and the methods'
        per-token tensors, on the training micro-batches."""
        cfg = self.cfg
        N, T = rb.completion_ids.shape
        need_old = cfg.algo.num_iterations > 1 or any(m.needs_old_logp for m in self.methods)
        logits_to = [m for m in self.methods if m.needs_logits]
        if need_old:
            rb.old_logp = torch.zeros(N, T)
        for m in self.methods:
            m.before_precompute(rb)
        if cfg.algo.kl_coef > 0:
            rb.ref_logp = torch.zeros(N, T)
        if need_old or cfg.algo.kl_coef > 0:
            was = self.model.training
            self.model.eval()
            try:
                for b, idx, w in self._mb_plan(rb, mbs):
                    self._precompute_mb(rb, b, idx, w, need_old, logits_to)
            finally:
                self.model.train(was)
        for m in self.methods:
            m.after_precompute(rb)

    def _precompute_mb(self, rb: RolloutBatch, b: RolloutBatch, idx: torch.Tensor, w: float, need_old: bool,
                       logits_to: list) -> None:
        """One forward of the plan; weight 0 = a padding forward (collectives only), its result unused."""
        if need_old:
            res = self._logp(self.model, b, idx, return_logits=bool(logits_to))
            lp, logits = res if logits_to else (res, None)
            if w:
                rb.old_logp[idx, :lp.shape[1]] = lp.float().cpu()
                for m in logits_to:  # full logits, or hidden states + head (algo.logprob_chunk_size)
                    m.on_logits(rb, idx, logits, lp)
            del logits
        if self.cfg.algo.kl_coef > 0:
            with self.policy.reference(self.model) as ref:
                lp = self._logp(ref, b, idx)
            if w:
                rb.ref_logp[idx, :lp.shape[1]] = lp.float().cpu()

    # ----------------------------------------------------------------------------------------- update
    def optimize(self, rb: RolloutBatch, mbs: list[torch.Tensor]) -> dict[str, float]:
        """``num_iterations`` updates.  Losses use GLOBAL token / sequence / row counts and gradients are SUMMED
        over processes, so an update does not depend on the number of processes or micro-batches.

        Gradient exchange (``run.grad_sync``):

        * ``manual`` (default without FSDP / DeepSpeed): plain module, one ``all_reduce(SUM)`` per parameter
          after the micro-batches.  Kept for DDP-style replicated training (LoRA, small full fine-tunes) because
          the shared-prefix log-prob forward calls the module twice per backward and micro-batch counts differ
          across processes after dynamic filtering / dropped rows -- both break DDP's one-forward-one-backward
          reducer, while a hand-made sum has neither constraint and costs the same communication;
        * ``accelerate`` (FSDP / DeepSpeed; optional for DDP): ``accelerator.prepare``d module, forwards through
          it, ``no_sync`` for every micro-batch but the last, ``accelerator.backward``,
          ``accelerator.clip_grad_norm_``.  Those engines AVERAGE gradients, so the loss is scaled by the number
          of processes to keep the sum semantics; micro-batch counts are padded (``_mb_plan``).
        """
        a = self.cfg.algo
        loss_mask = rb.completion_mask.clone()
        for meth in self.methods:
            loss_mask = meth.loss_mask(rb, loss_mask)
        totals = {"tokens": global_sum(float(loss_mask.sum())),
                  "sequences": global_sum(float((loss_mask.sum(1) > 0).sum())),
                  "rows": global_sum(float(rb.n)), "micro_batches": global_sum(float(len(mbs)))}
        loss_kw = self._loss_kwargs(totals)
        unusable = self._unusable_step(rb)
        if unusable:
            self._record_skip(unusable, a.num_iterations)
            return {"grad_norm": float("nan"), "lr": self.scheduler.get_last_lr()[0],
                    "skipped_steps": float(a.num_iterations)}
        plan = self._mb_plan(rb, mbs)
        max_norm = self.cfg.optim.max_grad_norm if self.cfg.optim.max_grad_norm > 0 else float("inf")
        self.model.train()
        acc: dict[str, float] = {}
        wsum, grad_norm, skipped = 0.0, 0.0, 0
        for _ in range(a.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            loss_bad = False
            for j, (b, idx, wgt) in enumerate(plan):
                out, lval, n_tok = self._micro_step(rb, b, idx, wgt, j == len(plan) - 1, loss_mask, loss_kw, totals)
                loss_bad |= not math.isfinite(lval)
                if not wgt:
                    continue
                wsum += n_tok
                for k, v in out.metrics.items():
                    if isinstance(v, float) and math.isfinite(v):
                        acc[k] = acc.get(k, 0.0) + v * n_tok
                if math.isfinite(lval):
                    acc["loss"] = acc.get("loss", 0.0) + lval * (1.0 / a.num_iterations)
            grad_norm, applied = self._apply_update(loss_bad, max_norm)
            skipped += not applied
        metrics = {k: (v if k == "loss" else v / max(wsum, 1.0)) for k, v in acc.items() if k != "num_tokens"}
        metrics["grad_norm"] = grad_norm
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        metrics["skipped_steps"] = float(skipped)
        return metrics

    def _loss_kwargs(self, totals: dict) -> dict:
        """``core.policy_loss`` settings of this step (``algo.*``, global counts), then the methods' changes."""
        a = self.cfg.algo
        kw = dict(clip_low=a.clip_low, clip_high=a.clip_high, dual_clip=a.dual_clip, ratio_level=a.ratio_level,
                  loss_type=a.loss_type, agg=a.agg, kl_coef=a.kl_coef, kl_estimator=a.kl_estimator,
                  max_len=self.cfg.rollout.max_new_tokens, num_tokens=totals["tokens"],
                  num_sequences=totals["sequences"], reg_eps=a.adv_eps)
        for meth in self.methods:
            kw = meth.loss_kwargs(kw)
        return kw

    def _unusable_step(self, rb: RolloutBatch) -> str | None:
        """Why no update of this step can be applied (decided on every process alike), or None."""
        # no group with a baseline on any process (every sample's media missing, every reward call failed or
        # non-finite): nothing to learn from -> a skipped step, like a non-finite one (feeds max_consecutive_skips)
        if global_sum(rb.info.get("valid_groups", 0.0)) == 0:
            return "no valid group (missing media / failed or non-finite rewards)"
        # a NaN/inf advantage would poison every update of this step: skip them all
        adv_bad = rb.advantages is not None and rb.n > 0 and not bool(torch.isfinite(rb.advantages).all())
        if global_sum(float(adv_bad)) > 0:
            return "non-finite advantages"
        return self._zero_advantage_cause(rb)  # every advantage 0: a zero gradient (stopping.py)

    def _micro_step(self, rb: RolloutBatch, b: RolloutBatch, idx: torch.Tensor, wgt: float, last: bool,
                    loss_mask: torch.Tensor, loss_kw: dict, totals: dict):
        """Forward + backward of one planned micro-batch: (loss output, weighted loss value, its token count)."""
        with self._sync_context(last):
            extra = [meth for meth in self.methods if meth.needs_train_logits]
            res = self._logp(self.model, b, idx, return_logits=bool(extra))
            lp, logits = res if extra else (res, None)
            lp = lp.float()
            Tm = lp.shape[1]
            lmask = loss_mask if b is rb else b.completion_mask
            m = lmask[idx, :Tm].to(lp.device)
            old = lp.detach() if b.old_logp is None or not wgt else b.old_logp[idx, :Tm].to(lp.device)
            pick = (lambda t: None if (t is None or not wgt) else t[idx, :Tm].to(lp.device))
            out = policy_loss(
                lp, old, b.advantages[idx].to(lp.device), m, token_weights=pick(b.token_weights),
                ref_logp=pick(b.ref_logp), group_ids=b.group_ids[idx].to(lp.device), **loss_kw)
            loss = out.loss
            for meth in extra:  # e.g. an entropy bonus; a padding forward (weight 0) gets an empty mask
                term = meth.extra_loss(b, idx, logits, m if wgt else torch.zeros_like(m), loss_kw)
                loss = loss if term is None else loss + term
            del logits
            loss = self._loss_share(loss, len(idx), totals)
            lval = float(loss.detach()) * wgt
            # backward even for a non-finite loss: every process must run the same collectives; the update is
            # skipped on the (global) non-finite flag
            if self.grad_sync == "accelerate":
                self.accelerator.backward(loss * (self.world * wgt))  # engines average: x world = sum
            else:
                loss.backward()
        return out, lval, float(m.sum())

    def _apply_update(self, loss_bad: bool, max_norm: float) -> tuple[float, bool]:
        """Sum / clip the gradients and step, unless the loss or the norm is non-finite on any process:
        (gradient norm, applied)."""
        if self.grad_sync == "accelerate":
            grad_norm = self._prepared_grad_norm(max_norm)
        else:
            self._allreduce_grads()
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        # the norm is the same on every process (gradients were summed); the loss flag is local -> reduce it
        if global_sum(float(loss_bad or not math.isfinite(grad_norm))) > 0:
            self.optimizer.zero_grad(set_to_none=True)
            self._record_skip("non-finite loss" if loss_bad else "non-finite gradients")
            return grad_norm, False
        self.skips.applied()
        self.optimizer.step()
        self.scheduler.step()
        for m in self.methods:
            m.after_update()
        return grad_norm, True

    def _loss_share(self, loss: torch.Tensor, rows: int, totals: dict) -> torch.Tensor:
        """One micro-batch's loss as its share of the step's: a method's ``loss_share``, else (bnpo: a local
        mean per micro-batch) an average over all micro-batches; token / sequence means use global counts
        already."""
        share = next((f for meth in self.methods if (f := meth.loss_share(rows, totals)) is not None), None)
        if share is not None:
            return loss * share
        if self.cfg.algo.agg == "bnpo":
            return loss / max(totals["micro_batches"], 1.0)
        return loss

    def use_samples(self, keep: list[int]) -> None:
        """Train on ``all_samples[i] for i in keep`` from now on (data selection; checkpointed)."""
        if not keep:
            raise ValueError("data selection kept no samples; relax selection.criterion / thresholds")
        self.selected_indices = list(keep)
        self.samples = [self.all_samples[i] for i in keep]

    # ----------------------------------------------------------------------------------------- loop
    def train_step(self) -> dict[str, float]:
        t0 = time.time()
        self.budget.start()  # only the step counts (not checkpoint writes between steps)
        step = self.step
        # what a stop inside this step rolls back to, so its checkpoint resumes exactly at this step
        self._step_snapshot = {"stream": self.stream.state_dict(), "rng": capture_rng_state(),
                               "subset": getattr(self, "selected_indices", None), "counters": dict(self.counters)}
        rb = self.collect(step)
        self._check_stop()
        mbs = micro_batches(rb.group_ids, self.cfg.run.micro_batch_size) if rb.n else []
        self.precompute(rb, mbs)
        onpolicy.check_first_step(self, rb, mbs)  # first step of this process: ratio 1 before any update
        opt_metrics = self.optimize(rb, mbs)
        self.backend.sync_weights(self.model)  # no-op for the HF backend (it samples from the trained module)
        self.step += 1
        m = self.step_metrics(rb)
        m.update({f"train/{k}": v for k, v in opt_metrics.items()})
        m["faults/skipped_steps"] = float(self.counters["skipped_steps"])
        m["faults/consecutive_skips"] = float(self.consecutive_skips)
        m["faults/zero_advantage_steps"] = float(self.counters["zero_advantage_steps"])
        m["perf/step_time"] = time.time() - t0
        m["perf/data_wait"], self._data_wait = getattr(self, "_data_wait", 0.0), 0.0  # s in _prepare this step
        m["perf/train_seconds"] = self.budget.lap()  # budget clock, summed over resumes
        m = self._reduce_metrics(m)
        guard_stop = self.format_guard.update(self.step, m, rb.texts, self.cfg)  # format collapse: warn / stop
        self._last_metrics = m
        log_now = self.step % self.cfg.run.log_every == 0 or self.step == self.cfg.run.max_steps
        validation.on_step_end(self, m, logged=log_now)  # val/* points when due (validation.every)
        if log_now:
            self.logger.log(m, self.step)
            if rb.n:
                self._log_completions(rb, self.step)
        self.last_batch = rb
        if guard_stop:
            if not log_now:
                self.logger.log(m, self.step)
            self._stop(guard_stop + " (format_guard.action=stop)")
        K = self.cfg.run.max_consecutive_skips
        if self.skips.halt_due:
            self.logger.log(m, self.step)
            never = " (no optimizer step of this run was applied)" if self._applied_updates() <= 0 else ""
            self._stop(f"{self.consecutive_skips} consecutive optimizer steps were skipped{never} (last cause: "
                       f"{self._last_skip_cause}; run.max_consecutive_skips={K}); check the "
                       f"data and media, the rewards, the learning rate and mixed precision before resuming")
        return m

    def train(self) -> list[dict[str, float]]:
        """Train to ``run.max_steps``. SIGTERM / SIGINT (from here on, resume and data selection included) stop it at
        the next step boundary, or discard the step if its rollouts are still being collected, after writing a
        checkpoint: :class:`TrainingInterrupted` (``mmgrpo train`` exits with code 6)."""
        with StopOnSignal() as self._signals:
            try:
                return self._train()
            finally:
                self._signals = None

    def _train(self) -> list[dict[str, float]]:
        resumed = self.resume()
        for m in self.methods:
            m.on_train_start(resumed)
        if not resumed:
            self._make_stream()
        validation.on_train_start(self, resumed)
        history = []
        save_every = self.cfg.run.save_every
        from tqdm.auto import tqdm

        bar = tqdm(total=self.cfg.run.max_steps, initial=self.step, desc="GRPO", unit="step", dynamic_ncols=True,
                   disable=not (self.cfg.run.progress_bar and self.rank == 0))
        try:
            while self.step < self.cfg.run.max_steps:
                if self._signals.agreed(global_max):  # SIGTERM / SIGINT: every process stops at this step
                    self._interrupt(f"step {self.step}")
                # every process stops at the same step (the collective runs on all of them)
                if self.budget.enabled and any_process(self.budget.exhausted):
                    log.info("run.max_train_seconds=%g reached after step %d (%.1f s, %s clock)",
                             self.budget.max_seconds, self.step, self.budget.spent, self.cfg.run.budget_clock)
                    self.budget_stopped = True
                    break
                history.append(self.train_step())
                bar.update(1)
                bar.set_postfix(progress_fields(history[-1]), refresh=False)
                if save_every and self.step % save_every == 0 and self.step < self.cfg.run.max_steps:
                    self.save()
            self._check_trained()  # a run that trained nothing writes no final checkpoint
            if self.step > 0 and (not resumed or history):
                self.save()
        finally:
            bar.close()
            self._close_prefetch()
            self.logger.flush()
        return history


__all__ = ["GRPOTrainer", "PromptStream", "RolloutBatch", "micro_batches", "cat_batches"]
