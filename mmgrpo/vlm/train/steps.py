"""The stages of one VLM GRPO step, plain functions of the run (:class:`~mmgrpo.vlm.train.trainer.GRPOTrainer`),
in the order the loop calls them:

* :func:`collect`: prompts -> rollout -> rewards -> advantages, in sampling rounds (the methods' ``before_rollout``,
  ``after_rollout``, ``on_rewards`` and ``on_advantages`` hooks run at those points);
* :func:`precompute`: old / reference log-probs on the training micro-batches (``on_logits``, ``on_logprobs``);
* :func:`optimize`: ``algo.num_iterations`` updates: the policy loss per micro-batch (``on_loss``), gradients summed
  over processes, the optimizer step (``after_optimizer_step``), or a skip when anything is non-finite;
* :func:`step_metrics`: the step's metrics (``end_of_step``), reduced over processes.

What they call is library code with explicit arguments: the prompt feed (:mod:`mmgrpo.vlm.data.feed`), the rollout
batch (:mod:`mmgrpo.vlm.data.batch`), the reward scorer with its retries and fault policy
(:mod:`mmgrpo.vlm.rewards.scoring`), the log-prob function (:mod:`mmgrpo.vlm.models.logprobs`), gradient exchange
(:mod:`mmgrpo.engine.parallel`), the metric reduction (:mod:`mmgrpo.vlm.monitor.metrics`).

Faults: failed or non-finite rewards drop their rows or stop the run (``reward.*``, the scorer); groups left with
< 2 members get advantage 0 (counted); a step without a usable update (:func:`_skip_cause`: no valid group, NaN/inf
advantages, no reward signal) and NaN/inf loss or gradients skip the optimizer step (counted in the guard).
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Sequence

import torch

from mmgrpo.core import AdvantageOutput, group_advantages
from mmgrpo.engine.dist import gather_groups, global_max, global_sum
from mmgrpo.engine.groups import no_reward_signal, valid_member_counts
from mmgrpo.engine.parallel import allreduce_grads, generation_context, prepared_grad_norm, sync_context
from mmgrpo.utils.logging import get_logger
from mmgrpo.utils.seeding import sample_seed
from mmgrpo.vlm.data.batch import RolloutBatch, batch_from_rows, cat_batches, empty_batch, keep_first_groups
from mmgrpo.vlm.data.task import BadSampleError, MissingMediaError, sample_id
from mmgrpo.vlm.methods.base import Estimator, LossInputs, PolicyLoss
from mmgrpo.vlm.models.rollout import make_seeds
from mmgrpo.vlm.monitor.format_guard import well_formed_rows
from mmgrpo.vlm.monitor.metrics import reduce_metrics
from mmgrpo.vlm.rewards.overlap import RewardOverlap

log = get_logger("mmgrpo.train")

__all__ = ["advantage_estimator", "policy_loss", "collect", "rollout", "advantages", "mb_plan", "precompute",
           "optimize", "step_metrics", "score_samples"]


# ------------------------------------------------------------------------------------------- setup
def advantage_estimator(methods: Sequence[Any]) -> Estimator:
    """The parts of the advantage the enabled methods replace; each part from at most one method."""
    parts: dict[str, tuple[str, Callable]] = {}
    for m in methods:
        est = m.advantage_estimator()
        for part in ("shape", "gathered", "local"):
            fn = getattr(est, part) if est is not None else None
            if fn is None:
                continue
            if part in parts:
                raise ValueError(f"{parts[part][0]} and {m.name} both replace the advantage's {part!r} part; "
                                 "enable one of them")
            parts[part] = (m.name, fn)
    return Estimator(**{k: fn for k, (_, fn) in parts.items()})


def policy_loss(methods: Sequence[Any]) -> PolicyLoss:
    """The policy loss of the run: :func:`mmgrpo.vlm.methods.base.grpo_loss` unless one method provides another."""
    got = [(m.name, loss) for m in methods if (loss := m.loss()) is not None]
    if len(got) > 1:
        raise ValueError(f"{got[0][0]} and {got[1][0]} both provide the policy loss; enable one of them")
    return got[0][1] if got else PolicyLoss()


# ------------------------------------------------------------------------------------------- rollout
def collect(run, step: int) -> RolloutBatch:
    """Rollouts for one step: a sampling round, then up to ``extra_rounds`` more while the methods'
    ``on_advantages`` leave fewer than the step's groups; the step keeps its first groups."""
    want = run.prompts_per_step // run.world  # whole groups per process (refills never split groups)
    batches, n_groups, zero_frac_first = [], 0, None
    valid_groups = 0.0  # summed over rounds, also from empty batches (statistics may be global)
    extra = sum(m.extra_rounds for m in run.methods)
    st, feed = run.state, run.feed
    for rnd in range(1 + extra):
        drawn = feed.draw(st.stream)
        # hint the next draws before preparing this one: the background thread decodes them while this batch is
        # prepared (inline on the first step and after a resume) and while this step generates and trains; not
        # past an epoch boundary where a method may re-select the data
        feed.prefetch_ahead(st.stream, run.samples, current=drawn,
                            stop_at_epoch=any(m.reselects_data for m in run.methods))
        preps = feed.prepare(drawn, run.samples, st.counters)
        for m in run.methods:
            preps = m.before_rollout(step, preps)
        # a group is counted by the process holding its generation 0 (split groups are counted once)
        first_here = torch.tensor([pos for pos, _, gens in preps if gens is None or 0 in gens], dtype=torch.long)
        rb = rollout(run, step, preps) if preps else empty_batch()
        advantages(run, rb)  # on every process, even without prompts: it may gather across processes
        valid_groups += rb.info.get("valid_groups", 0.0)
        if preps:
            if zero_frac_first is None:
                zero_frac_first = rb.info["zero_std_frac"]
            if not bool(rb.valid.all()):  # failed / non-finite rewards leave the batch (not the loss)
                rb = rb.select(rb.valid.nonzero().flatten())
            for m in run.methods:
                rb = m.on_advantages(rb)
            batches.append(rb)
            n_groups += int(torch.isin(torch.unique(rb.group_ids), first_here).sum())
        # every process runs the same number of rounds (the stream stays in sync): decide on global counts
        done = global_sum(float(n_groups >= want)) >= run.world
        if not extra or done:
            break
    pool = [b for b in batches if b.n > 0]
    rb = cat_batches(pool, run.pad_id) if pool else empty_batch()
    if extra and n_groups > want:  # refills overshot: the step trains its first `want` groups (fixed batch size)
        rb, n_groups = rb.select(keep_first_groups(rb.group_ids, want)), want
    rb.info["zero_std_frac"] = zero_frac_first if zero_frac_first is not None else 0.0
    rb.info["degenerate_groups"] = sum(b.info.get("degenerate_groups", 0.0) for b in batches)
    rb.info["groups"] = float(n_groups)
    rb.info["valid_groups"] = valid_groups
    rb.info["rounds"] = float(rnd + 1)
    return rb


def rollout(run, step: int, preps: list) -> RolloutBatch:
    """Sample each prompt's members (minus the ones methods inject), the methods' ``after_rollout``, score the rows
    into a batch (``valid`` marks rows whose rewards exist and are finite), then the methods' ``on_rewards``."""
    G_on = run.cfg.rollout.group_size - sum(m.injected_per_group for m in run.methods)
    # one row per owned (prompt, generation index); seed = f(seed, step, position, g), so a row's sample does not
    # depend on which process draws it
    gens_of = {pos: list(range(G_on)) if gens is None else list(gens) for pos, _, gens in preps}
    # each prompt goes to the backend ONCE with its number of generations, so the HF backend prefills it once and
    # samples its rows from that prefill (rollout.shared_prefix); one call per distinct count (a group split across
    # processes owns fewer rows here)
    sampled: dict[int, list[dict]] = {}
    n_tok = 0
    t0 = time.time()
    # reward.overlap_prompts > 0: generate in chunks of that many prompts and score each chunk in the background
    # while the next one generates (mmgrpo.vlm.rewards.overlap; the same rewards, less wall time)
    chunk = run.cfg.reward.overlap_prompts
    overlap = RewardOverlap(run.scorer.score) if chunk > 0 else None
    # once per step however the groups split: with FSDP it runs collectives
    with generation_context(run.accelerator, run.model, run.sharded, run.dist_kind):
        for k in sorted({len(g) for g in gens_of.values()}, reverse=True):
            part_k = [(pos, pp) for pos, pp, _ in preps if len(gens_of[pos]) == k]
            if not k:
                continue
            for c0 in range(0, len(part_k), chunk or len(part_k)):
                part = part_k[c0:c0 + (chunk or len(part_k))]
                seeds = [sample_seed(run.cfg.run.seed, step, pos, g) for pos, _ in part for g in gens_of[pos]]
                out = run.backend.generate(
                    [pp.item for _, pp in part], k, run.sampling, seeds=seeds,
                    raw_prompts=[{"text": pp.text, "images": pp.images, "clip": pp.clip, "sample": pp.sample,
                                  "video": None if pp.clip is None else pp.clip.frames} for _, pp in part])
                n_tok += int(out.completion_mask.sum())
                T = out.completion_ids.shape[1]
                for i, (pos, pp) in enumerate(part):  # prompt-major: prompt i owns rows i*k .. i*k+k-1
                    # a multi-turn rollout's row (mmgrpo.vlm.tools.rollout) also has its own prompt item (tool media
                    # appended), the loss mask over its policy tokens and its turn / tool-call counts
                    sampled[pos] = [dict(ids=out.completion_ids[r], mask=out.completion_mask[r], text=out.texts[r],
                                         offpolicy=False, truncated=bool(out.truncated[r]),
                                         lp=out.logprobs[r] if out.logprobs is not None else torch.zeros(T),
                                         pp=pp, group=pos, **({} if out.items is None else dict(
                                             item=out.items[r], loss_mask=out.loss_mask[r],
                                             turn_info=out.turn_info[r])))
                                    for r in range(i * k, (i + 1) * k)]
                if overlap is not None:
                    overlap.submit([x for pos, _ in part for x in sampled[pos]])
    gen_time = time.time() - t0
    run.state.counters["generated_tokens"] += n_tok
    rows = [x for pos, _, _ in preps for x in sampled.get(pos, [])]
    for m in run.methods:
        rows = m.after_rollout(rows)
    info = {"gen_time": gen_time, "gen_tokens": float(n_tok)}
    if overlap is not None:  # the background scores
        t0 = time.time()
        scored = overlap.collect(rows)
        info["reward_wait"] = time.time() - t0  # what the step still waited for its rewards
    else:
        scored = run.scorer.score([r["text"] for r in rows], [r["pp"].reward_sample for r in rows])
    parse_failed, failed = scored.pop("parse_failed").bool(), scored.pop("_failed").bool()
    rb = batch_from_rows(rows, run.pad_id, {k: v.float() for k, v in scored.items()}, parse_failed, info)
    rb.valid = run.scorer.valid_rows(rb.rewards, failed, rb.samples)
    for m in run.methods:
        m.on_rewards(rb)
    return rb


@torch.no_grad()
def score_samples(run, samples: Sequence[Any], K: int, key: str = "total", round: int = 0,
                  greedy: bool = False) -> torch.Tensor:
    """(S, K) rewards of K sampled (``greedy``: argmax) completions per sample (this process's share, gathered);
    missing media give a row of NaN. Data selection scores the training set with it (``run.score_samples``)."""
    from dataclasses import replace

    from accelerate.utils import gather_object

    idx = list(range(run.rank, len(samples), run.world))
    res = []
    for start in range(0, len(idx), run.cfg.run.prompts_per_device):
        chunk = [(i, samples[i]) for i in idx[start:start + run.cfg.run.prompts_per_device]]
        preps = []
        for i, s in chunk:
            try:
                preps.append((i, run.task.prepare(s)))
            except (MissingMediaError, BadSampleError) as e:
                policy = (run.cfg.data.on_missing_media if isinstance(e, MissingMediaError)
                          else run.cfg.data.on_bad_sample)
                if policy == "error":
                    raise
                log.warning("selection: skipping %s: %s", sample_id(s), e)
                res.append((i, [float("nan")] * K))
        if not preps:
            continue
        with generation_context(run.accelerator, run.model, run.sharded, run.dist_kind):
            sampling = replace(run.sampling, greedy=True) if greedy else run.sampling
            out = run.backend.generate([pp.item for _, pp in preps], K, sampling,
                                       seeds=make_seeds(run.cfg.run.seed, -1 - round, [i for i, _ in preps], K),
                                       raw_prompts=[{"text": pp.text, "images": pp.images, "clip": pp.clip}
                                                    for _, pp in preps])
        rs = [pp.reward_sample for _, pp in preps for _ in range(K)]
        sc = run.scorer.score(out.texts, rs)
        r = sc[key] if key in sc else run.scorer.accuracy(out.texts, rs)
        r = r.float().view(len(preps), K)
        res.extend((i, r[j].tolist()) for j, (i, _) in enumerate(preps))
    allres = gather_object(res) if run.world > 1 else res
    mat = torch.full((len(samples), K), float("nan"))
    for i, row in allres:
        mat[i] = torch.tensor(row)
    return mat


# ------------------------------------------------------------------------------------------- advantages
def advantages(run, rb: RolloutBatch) -> None:
    """Group advantages of the reward entering them; sets rb.advantages, reward_used, zero_std.

    A method may compute them on this process's whole groups (``Estimator.local``); otherwise statistics run over
    the GLOBAL batch (a group may be split across processes; "batch" scale is the std of every process's rewards):
    gather, compute (``Estimator.gathered`` or :func:`mmgrpo.core.group_advantages`), keep this process's rows --
    the numbers of a 1-process run. Collective: every process calls it once per sampling round."""
    a, est = run.cfg.algo, run.estimator
    used = est.shape(rb) if est.shape is not None else rb.rewards["total"]
    valid = rb.valid if rb.valid is not None else torch.ones(rb.n, dtype=torch.bool)
    kw = dict(scale=a.adv_scale, eps=a.adv_eps, valid=valid)
    res = est.local(rb, used, kw) if est.local is not None else None
    gather = res is None and run.world > 1
    if res is not None:
        gid_all, valid_all, sl = rb.group_ids, valid, slice(0, rb.n)
    else:
        if gather:
            (used_all, gid_all, valid_all), sl = gather_groups([used.float(), rb.group_ids, valid])
        else:
            used_all, gid_all, valid_all, sl = used, rb.group_ids, valid, slice(0, rb.n)
        kw["valid"] = valid_all
        if gid_all.numel():
            res = (est.gathered or group_advantages)(used_all, gid_all, **kw)
        else:
            res = AdvantageOutput(torch.zeros(0), torch.zeros(0, dtype=torch.bool), 0.0, torch.zeros(0),
                                  torch.zeros(0), 0)
    # groups left with fewer than 2 valid members (rewards dropped) have no baseline: advantage exactly 0 (the core
    # already gives 0 to 1-member groups; made explicit here), counted once (on the main process when gathered)
    count = not gather or run.rank == 0
    n_valid, inv = valid_member_counts(gid_all, valid_all)
    degenerate = n_valid < 2
    adv = res.advantages.float()
    adv_all = torch.where(degenerate[inv] | ~valid_all, torch.zeros_like(adv), adv)
    n_deg = int(degenerate.sum()) if count else 0
    run.state.counters["degenerate_groups"] += n_deg
    # groups with a baseline (>= 2 valid members): a step with none anywhere trains nothing (see optimize)
    rb.info["valid_groups"] = float(int((~degenerate).sum()) if count else 0)
    rb.info["degenerate_groups"] = rb.info.get("degenerate_groups", 0.0) + float(n_deg)
    rb.advantages, rb.reward_used, rb.zero_std = adv_all[sl], used, res.zero_std_mask[sl]
    rb.info["zero_std_frac"] = res.zero_std_fraction


# ------------------------------------------------------------------------------------------- log-probs
def mb_plan(run, rb: RolloutBatch, mbs: list[torch.Tensor]) -> list[tuple[RolloutBatch, torch.Tensor, float]]:
    """(batch, rows, weight) per forward. With a prepared model every process must run the same number of forwards
    (DDP buffer broadcasts, FSDP all-gathers) and backwards (one synchronising backward per update): processes with
    fewer micro-batches repeat one with weight 0 (its loss is multiplied by 0)."""
    plan = [(rb, idx, 1.0) for idx in mbs]
    if run.grad_sync != "accelerate" or run.world == 1:
        return plan
    st = run.state
    n_max = int(global_max(len(plan)))
    if len(plan) < n_max:
        if plan:
            pad = plan[-1][:2]
        elif st.pad_rows is not None:
            pad = st.pad_rows
        else:
            raise RuntimeError(f"process {run.rank} has no rows this step (skipped media / failed rewards) and no "
                               "earlier row to keep the collectives of the prepared model in step; use "
                               "data.on_missing_media=error or more prompts per process")
        plan += [(pad[0], pad[1], 0.0)] * (n_max - len(plan))
    if rb.n:
        st.pad_rows = (rb, mbs[0][:1])
    return plan


@torch.no_grad()
def precompute(run, rb: RolloutBatch, mbs: list[torch.Tensor]) -> None:
    """Old log-probs (several iterations, or a method needs them), reference log-probs (KL) and the methods'
    per-token tensors (``on_logits`` per micro-batch, ``on_logprobs`` once they all exist)."""
    cfg = run.cfg
    N, T = rb.completion_ids.shape
    need_old = cfg.algo.num_iterations > 1 or any(m.needs_old_logp for m in run.methods)
    logits_to = [m for m in run.methods if m.needs_logits]
    rb.old_logp = torch.zeros(N, T) if need_old else None
    rb.ref_logp = torch.zeros(N, T) if cfg.algo.kl_coef > 0 else None
    if need_old or cfg.algo.kl_coef > 0:
        was = run.model.training
        run.model.eval()
        try:
            for b, idx, w in mb_plan(run, rb, mbs):  # weight 0 = a padding forward (collectives only), unused
                if need_old:
                    res = run.logprobs.rows(run.model, b, idx, return_logits=bool(logits_to))
                    lp, logits = res if logits_to else (res, None)
                    if w:
                        rb.old_logp[idx, :lp.shape[1]] = lp.float().cpu()
                        for m in logits_to:  # full logits, or hidden states + head (algo.logprob_chunk_size)
                            m.on_logits(rb, idx, logits, lp)
                    del logits
                if cfg.algo.kl_coef > 0:
                    with run.policy.reference(run.model) as ref:
                        lp = run.logprobs.rows(ref, b, idx)
                    if w:
                        rb.ref_logp[idx, :lp.shape[1]] = lp.float().cpu()
        finally:
            run.model.train(was)
    for m in run.methods:
        m.on_logprobs(rb)


# ------------------------------------------------------------------------------------------- update
def optimize(run, rb: RolloutBatch, mbs: list[torch.Tensor]) -> dict[str, float]:
    """``num_iterations`` updates. Losses use GLOBAL token / sequence / row counts and gradients are SUMMED over
    processes, so an update does not depend on the number of processes or micro-batches.

    Gradient exchange (``run.grad_sync``):

    * ``manual`` (default without FSDP / DeepSpeed): plain module, one ``all_reduce(SUM)`` per parameter after the
      micro-batches. Kept for DDP-style replicated training (LoRA, small full fine-tunes) because the shared-prefix
      log-prob forward calls the module twice per backward and micro-batch counts differ across processes after
      dynamic filtering / dropped rows -- both break DDP's one-forward-one-backward reducer, while a hand-made sum
      has neither constraint and costs the same communication;
    * ``accelerate`` (FSDP / DeepSpeed; optional for DDP): ``accelerator.prepare``d module, forwards through it,
      ``no_sync`` for every micro-batch but the last, ``accelerator.backward``, ``accelerator.clip_grad_norm_``.
      Those engines AVERAGE gradients, so the loss is scaled by the number of processes to keep the sum semantics;
      micro-batch counts are padded (``mb_plan``).
    """
    a, st = run.cfg.algo, run.state

    def skip(why: str, n: int = 1) -> None:  # a skipped optimizer step: counted, feeds run.max_consecutive_skips
        st.counters["skipped_steps"] += n
        run.guard.skipped(why, n)
        log.warning("step %d: %s -> optimizer step skipped (%d skipped in a row, %d in total)", st.step + 1, why,
                    run.guard.consecutive_skips, st.counters["skipped_steps"])

    off = rb.is_offpolicy.bool()
    totals = {"tokens": global_sum(float(rb.loss_mask.sum())),
              "sequences": global_sum(float((rb.loss_mask.sum(1) > 0).sum())),
              "rows": global_sum(float(rb.n)), "micro_batches": global_sum(float(len(mbs))),
              # what of it is off-policy (injected / replayed rows): methods that train them apart (LUFFY, CHORD)
              "offpolicy_tokens": global_sum(float(rb.loss_mask[off].sum())),
              "offpolicy_sequences": global_sum(float((rb.loss_mask[off].sum(1) > 0).sum()))}
    why = _skip_cause(run, rb)
    if why:
        skip(why, a.num_iterations)
        return {"grad_norm": float("nan"), "lr": run.scheduler.get_last_lr()[0],
                "skipped_steps": float(a.num_iterations)}
    plan = mb_plan(run, rb, mbs)
    max_norm = run.cfg.optim.max_grad_norm if run.cfg.optim.max_grad_norm > 0 else float("inf")
    run.model.train()
    acc: dict[str, float] = {}
    wsum, grad_norm, skipped = 0.0, 0.0, 0
    for _ in range(a.num_iterations):
        run.optimizer.zero_grad(set_to_none=True)
        loss_bad = False
        for j, (b, idx, wgt) in enumerate(plan):
            out, lval, n_tok = _micro_step(run, rb, b, idx, wgt, j == len(plan) - 1, totals)
            loss_bad |= not math.isfinite(lval)
            if not wgt:
                continue
            wsum += n_tok
            for k, v in out.metrics.items():
                if isinstance(v, float) and math.isfinite(v):
                    acc[k] = acc.get(k, 0.0) + v * n_tok
            if math.isfinite(lval):
                acc["loss"] = acc.get("loss", 0.0) + lval * (1.0 / a.num_iterations)
        grad_norm, why = _apply_update(run, loss_bad, max_norm)
        if why:
            skip(why)
            skipped += 1
    metrics = {k: (v if k == "loss" else v / max(wsum, 1.0)) for k, v in acc.items() if k != "num_tokens"}
    metrics["grad_norm"] = grad_norm
    metrics["lr"] = run.scheduler.get_last_lr()[0]
    metrics["skipped_steps"] = float(skipped)
    return metrics


def _skip_cause(run, rb: RolloutBatch) -> str | None:
    """Collective: why no update of this step can be applied (decided on every process alike), or None.

    * no group with a baseline on any process (every sample's media missing, every reward call failed or
      non-finite): nothing to learn from;
    * a NaN/inf advantage: it would poison every update of the step;
    * no reward signal: every advantage of every process is 0 (all groups' rewards are equal, e.g. every completion
      fails to parse; counted in ``zero_advantage_steps``). Its gradient is exactly 0 unless a KL term
      (``algo.kl_coef``) or a method's own loss term (entropy bonus, SFT) applies -- then the step is taken; an
      optimizer step on a zero gradient would only apply AdamW's momentum and weight decay (TRL / verl take it; we
      do not). A run none of whose steps had a reward signal still fails (the recipe's nothing-trained check)."""
    if global_sum(rb.info.get("valid_groups", 0.0)) == 0:
        return "no valid group (missing media / failed or non-finite rewards)"
    adv_bad = rb.advantages is not None and rb.n > 0 and not bool(torch.isfinite(rb.advantages).all())
    if global_sum(float(adv_bad)) > 0:
        return "non-finite advantages"
    st = run.state
    signal = no_reward_signal(rb.advantages if rb.advantages is not None and rb.n else None,
                              rb.rewards["total"] if rb.n else None)
    if signal is None:
        return None
    n_rows, mean, std = signal
    st.counters["zero_advantage_steps"] += 1
    fails = global_sum(float(rb.parse_failed.sum()) if rb.n else 0.0)
    why = (f"no reward signal: every advantage is 0, every group's rewards are equal ({n_rows} rows, parse "
           f"failures {int(fails)} = {100 * fails / max(n_rows, 1.0):.0f} %, reward mean {mean:.4g}, std {std:.3g} "
           "over the step)")
    st.last_zero_advantage = why
    if run.cfg.run.allow_no_reward_signal:
        log.warning("step %d: %s; its zero-gradient step is taken (run.allow_no_reward_signal=true)", st.step + 1, why)
        return None
    # (a method's per-step SFT term may exist on some processes only: decided over all of them)
    if run.cfg.algo.kl_coef > 0 or global_max(float(any(m.needs_train_logits or m.trains_without_advantages
                                                        for m in run.methods))) > 0:
        log.warning("step %d: %s; the KL / entropy / SFT terms are still applied", st.step + 1, why)
        return None
    return why


def _micro_step(run, rb: RolloutBatch, b: RolloutBatch, idx: torch.Tensor, wgt: float, last: bool, totals: dict):
    """Forward + backward of one planned micro-batch: (loss output, weighted loss value, its token count)."""
    with sync_context(run.accelerator, run.model, run.grad_sync, run.dist_kind, last):
        want_logits = any(m.needs_train_logits for m in run.methods)
        res = run.logprobs.rows(run.model, b, idx, return_logits=want_logits)
        lp, logits = res if want_logits else (res, None)
        lp = lp.float()
        Tm = lp.shape[1]
        m = (rb.loss_mask if b is rb else b.completion_mask)[idx, :Tm].to(lp.device)
        pick = (lambda t: None if (t is None or not wgt) else t[idx, :Tm].to(lp.device))
        li = LossInputs(logp=lp, old_logp=lp.detach() if b.old_logp is None or not wgt else pick(b.old_logp),
                        advantages=b.advantages[idx].to(lp.device), mask=m, group_ids=b.group_ids[idx].to(lp.device),
                        token_weights=pick(b.token_weights), ref_logp=pick(b.ref_logp), logits=logits,
                        offpolicy=b.is_offpolicy[idx].to(lp.device),
                        totals=totals, rows=len(idx), algo=run.cfg.algo, max_len=run.cfg.rollout.max_new_tokens,
                        index=idx if b is rb else None)
        out = run.loss.fn(li)
        loss = out.loss
        if not wgt:  # a padding forward (weight 0): the methods' terms see no loss token
            li.mask = torch.zeros_like(m)
        for meth in run.methods:  # e.g. an entropy bonus
            loss = meth.on_loss(li, loss)
        del logits
        li.logits = None
        loss = run.loss.share(loss, li)
        lval = float(loss.detach()) * wgt
        # backward even for a non-finite loss: every process must run the same collectives; the update is skipped
        # on the (global) non-finite flag
        if run.grad_sync == "accelerate":
            run.accelerator.backward(loss * (run.world * wgt))  # engines average: x world = sum
        else:
            loss.backward()
    return out, lval, float(m.sum())


def _apply_update(run, loss_bad: bool, max_norm: float) -> tuple[float, str | None]:
    """Sum / clip the gradients and step, unless the loss or the norm is non-finite on any process:
    (gradient norm, why the step was skipped or None)."""
    if run.grad_sync == "accelerate":
        grad_norm = prepared_grad_norm(run.accelerator, run.model, max_norm)
    else:
        allreduce_grads(run.params, run.world)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(run.params, max_norm))
    # the norm is the same on every process (gradients were summed); the loss flag is local -> reduce it
    if global_sum(float(loss_bad or not math.isfinite(grad_norm))) > 0:
        run.optimizer.zero_grad(set_to_none=True)
        return grad_norm, "non-finite loss" if loss_bad else "non-finite gradients"
    run.guard.applied()
    run.optimizer.step()
    run.scheduler.step()
    for m in run.methods:
        m.after_optimizer_step()
    return grad_norm, None


# ------------------------------------------------------------------------------------------- metrics
def step_metrics(run, rb: RolloutBatch, upd: dict[str, float], t0: float) -> dict[str, float]:
    """The step's metrics (rewards, lengths, faults, data, perf, the update's, the methods' from ``end_of_step``),
    reduced over processes."""
    st = run.state
    onp = ~rb.is_offpolicy
    m: dict[str, float] = {}
    for k, v in rb.rewards.items():
        v = v[onp].float()
        v = v[torch.isfinite(v)]  # an unweighted diagnostic reward may be NaN on a kept row
        if v.numel():
            m[f"reward/{k}/mean"] = float(v.mean())
            m[f"reward/{k}/std"] = float(v.std()) if v.numel() > 1 else 0.0
    lens = rb.completion_mask[onp].sum(1).float()
    if lens.numel():
        m["completions/mean_length"] = float(lens.mean())
        m["completions/max_length"] = float(lens.max())
        m["completions/clipped_ratio"] = float(rb.truncated[onp].float().mean())
        m["completions/parse_failures"] = float(rb.parse_failed[onp].sum())
        m["completions/parse_failure_rate"] = float(rb.parse_failed[onp].float().mean())
        # exactly the answer the prompt asks for (the format guard's signal; clipped_ratio = share at the cap)
        wf = torch.tensor(well_formed_rows(rb.texts, run.cfg.data), dtype=torch.bool)
        m["completions/well_formed"] = float(wf[onp].float().mean())
    if rb.advantages is not None and rb.n:
        m["advantages/abs_mean"] = float(rb.advantages[onp].abs().mean()) if onp.any() else 0.0
    m["frac_reward_zero_std"] = rb.info.get("zero_std_frac", 0.0)
    gt = rb.info.get("gen_time", 0.0)
    m["perf/tokens_per_s"] = rb.info.get("gen_tokens", 0.0) / gt if gt > 0 else 0.0
    m["data/groups"] = rb.info.get("groups", 0.0)
    m["data/valid_groups"] = rb.info.get("valid_groups", 0.0)  # groups with >= 2 valid rows (a baseline)
    m["data/sampling_rounds"] = rb.info.get("rounds", 1.0)
    for k in ("skipped_missing_media", "skipped_bad_samples", "filtered_groups"):
        m[f"data/{k}"] = float(st.counters[k])
    mr = run.media_report  # samples the media check at load time dropped (fixed for the run)
    m["data/dropped_at_load"] = float(mr.n_dropped) if mr is not None else 0.0
    for k in ("reward_nonfinite_rows", "reward_failed_rows", "reward_failed_calls", "reward_retries",
              "reward_timeouts", "degenerate_groups"):
        m[f"faults/{k}"] = float(st.counters[k])
    m["faults/degenerate_groups_step"] = rb.info.get("degenerate_groups", 0.0)
    m["data/epoch"] = float(st.stream.epoch)
    m["perf/generated_tokens"] = float(st.counters["generated_tokens"])  # cumulative, this process
    m["perf/prefix_group"] = float(run.logprob_impl == "prefix_group")
    if rb.old_logp is not None and onp.any():  # engine vs trainer log-probs (vLLM parity diagnostic)
        mk = rb.completion_mask[onp].bool()
        Tm = min(rb.old_logp.shape[1], rb.rollout_logp.shape[1])
        d = (rb.old_logp[onp][:, :Tm] - rb.rollout_logp[onp][:, :Tm]).abs()[mk[:, :Tm]]
        m["rollout/logprob_max_abs_diff"] = float(d.max()) if d.numel() else 0.0
    for meth in run.methods:
        meth.end_of_step(rb, m)
    m.update({f"train/{k}": v for k, v in upd.items()})
    m["faults/skipped_steps"] = float(st.counters["skipped_steps"])
    m["faults/consecutive_skips"] = float(run.guard.consecutive_skips)
    m["faults/zero_advantage_steps"] = float(st.counters["zero_advantage_steps"])
    m["perf/step_time"] = time.time() - t0
    m["perf/data_wait"], run.feed.wait = run.feed.wait, 0.0  # s spent preparing prompts this step
    m["perf/train_seconds"] = run.guard.budget.lap()  # budget clock, summed over resumes
    return reduce_metrics(m, run.world)
