"""The stages of one VLM GRPO step, plain functions of the run (:class:`~mmgrpo.vlm.train.trainer.GRPOTrainer`),
in the order the loop calls them:

* :func:`collect`: prompts -> rollout -> rewards -> advantages, in sampling rounds (the methods' ``before_rollout``,
  ``after_rollout``, ``on_rewards`` and ``on_advantages`` hooks run at those points);
* :func:`precompute`: old / reference log-probs on the training micro-batches (``on_logits``, ``on_logprobs``);
* :func:`optimize`: ``algo.num_iterations`` updates: the policy loss per micro-batch (``on_loss``), gradients summed
  over processes, the optimizer step (``after_optimizer_step``), or a skip when anything is non-finite;
* :func:`step_metrics`: the step's metrics (``end_of_step``), reduced over processes.

Faults (``reward.*``): a reward call that raises or times out is retried with back-off (the shared policy of
:func:`mmgrpo.engine.reward_calls.call_with_retries`; a hung remote judge cannot block the run), then its rows are
dropped (counted) or the run stops (the guard's stop request); NaN/inf rewards drop their rows (``valid``,
:func:`nonfinite_rows`) or stop the run; groups left with < 2 members get advantage 0 (counted); NaN/inf advantages,
loss or gradients skip the optimizer step (counted in the guard).
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Mapping, Sequence

import torch

from mmgrpo.core import AdvantageOutput, group_advantages
from mmgrpo.engine.dist import gather_groups, global_max, global_sum
from mmgrpo.engine.errors import RewardCallFailed
from mmgrpo.engine.groups import no_reward_signal, valid_member_counts
from mmgrpo.engine.reward_calls import CallStats, RetryPolicy, call_with_retries
from mmgrpo.utils.logging import get_logger
from mmgrpo.utils.seeding import sample_seed
from mmgrpo.vlm.data.task import BadSampleError, MissingMediaError, sample_id
from mmgrpo.vlm.methods.base import Estimator, LossInputs, PolicyLoss
from mmgrpo.vlm.models.rollout import batch_to, collate_prompts, compute_token_logprobs, make_seeds
from mmgrpo.vlm.data.batch import RolloutBatch, cat_batches, empty_batch, keep_first_groups
from mmgrpo.vlm.train.distributed import allreduce_grads, generation_context, prepared_grad_norm, sync_context
from mmgrpo.vlm.monitor.format_guard import well_formed_rows
from mmgrpo.vlm.train.prompts import draw, prefetch_ahead, prepare
from mmgrpo.vlm.rewards.overlap import RewardOverlap

log = get_logger("mmgrpo.train")

__all__ = ["advantage_estimator", "policy_loss", "collect", "advantages", "mb_plan", "precompute", "optimize",
           "step_metrics", "log_completions", "score", "accuracy", "score_samples", "token_logprobs", "nonfinite_rows"]


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
    for rnd in range(1 + extra):
        drawn = draw(run)
        # hint the next draws before preparing this one: the background thread decodes them while this batch is
        # prepared (inline on the first step and after a resume) and while this step generates and trains
        prefetch_ahead(run, current=drawn)
        preps = prepare(run, drawn)
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
    into a batch, then the methods' ``on_rewards``."""
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
    overlap = RewardOverlap(lambda t, s: score(run, t, s)) if chunk > 0 else None
    with generation_context(run):  # once per step however the groups split: with FSDP it runs collectives
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
                    sampled[pos] = [dict(ids=out.completion_ids[r], mask=out.completion_mask[r], text=out.texts[r],
                                         offpolicy=False, truncated=bool(out.truncated[r]),
                                         lp=out.logprobs[r] if out.logprobs is not None else torch.zeros(T),
                                         pp=pp, group=pos, **_multiturn_fields(out, r))
                                    for r in range(i * k, (i + 1) * k)]
                if overlap is not None:
                    overlap.submit([x for pos, _ in part for x in sampled[pos]])
    gen_time = time.time() - t0
    run.state.counters["generated_tokens"] += n_tok
    rows = [x for pos, _, _ in preps for x in sampled.get(pos, [])]
    for m in run.methods:
        rows = m.after_rollout(rows)
    rb = _score_rows(run, rows, {"gen_time": gen_time, "gen_tokens": float(n_tok)}, overlap)
    for m in run.methods:
        m.on_rewards(rb)
    return rb


def _multiturn_fields(out, r: int) -> dict:
    """A multi-turn rollout's (mmgrpo.vlm.tools.rollout) row: its own prompt item (tool media appended), the loss
    mask over its policy tokens and its turn / tool-call counts; nothing for a single-turn backend."""
    if out.items is None:
        return {}
    return dict(item=out.items[r], loss_mask=out.loss_mask[r], turn_info=out.turn_info[r])


TOOL_COUNTS = ("turns", "tool_calls", "tool_failures", "visual_tokens", "tool_tokens", "later_prefill_tokens",
               "later_reused_tokens")  # the last two: prefill of the later turns, and what their cache served


def _score_rows(run, rows: list[dict], info: dict[str, float], overlap: RewardOverlap | None = None) -> RolloutBatch:
    """Pad the rows into a batch and score them (or collect the background scores, ``overlap``); ``valid`` marks
    rows whose rewards exist and are finite."""
    Tm = max(len(r["ids"]) for r in rows)
    pad1 = lambda x, v: torch.nn.functional.pad(x, (0, Tm - x.shape[0]), value=v)  # noqa: E731
    texts = [r["text"] for r in rows]
    if overlap is not None:
        t0 = time.time()
        scored = overlap.collect(rows)
        info = dict(info, reward_wait=time.time() - t0)  # what the step still waited for its rewards
    else:
        scored = score(run, texts, [r["pp"].reward_sample for r in rows])
    parse_failed = scored.pop("parse_failed").bool()
    failed = scored.pop("_failed").bool()
    rewards = {k: v.float() for k, v in scored.items()}
    if any("turn_info" in r for r in rows):  # per-row tool counts, logged as reward/tools/<count>/mean
        for k in TOOL_COUNTS:
            rewards[f"tools/{k}"] = torch.tensor([float(r.get("turn_info", {}).get(k, 0)) for r in rows])
    mask = torch.stack([pad1(r["mask"].long(), 0) for r in rows])
    loss_mask = torch.stack([pad1(r["loss_mask"].long(), 0) if "loss_mask" in r else pad1(r["mask"].long(), 0)
                             for r in rows])
    return RolloutBatch(items=[r.get("item", r["pp"].item) for r in rows], samples=[r["pp"].sample for r in rows],
                        texts=texts, prompts=[r["pp"] for r in rows],
                        completion_ids=torch.stack([pad1(r["ids"], run.pad_id) for r in rows]),
                        completion_mask=mask, loss_mask=loss_mask,
                        group_ids=torch.tensor([r["group"] for r in rows], dtype=torch.long),
                        is_offpolicy=torch.tensor([r["offpolicy"] for r in rows]),
                        truncated=torch.tensor([r["truncated"] for r in rows]), parse_failed=parse_failed,
                        rewards=rewards, rollout_logp=torch.stack([pad1(r["lp"].float(), 0.0) for r in rows]),
                        info=dict(info), valid=_valid_rows(run, rewards, failed, rows))


def nonfinite_rows(rewards: Mapping[str, torch.Tensor], n: int, keys: list[str] | None = None) -> torch.Tensor:
    """(n,) bool: rows where any of the given reward tensors (default: all float ones) is NaN or inf."""
    bad = torch.zeros(n, dtype=torch.bool)
    for k, v in rewards.items():
        if keys is not None and k not in keys:
            continue
        v = torch.as_tensor(v)
        if v.dtype.is_floating_point and v.shape[:1] == (n,):
            bad |= ~torch.isfinite(v.reshape(n, -1)).all(1)
    return bad


def _valid_rows(run, rewards: dict[str, torch.Tensor], failed: torch.Tensor, rows: list[dict]) -> torch.Tensor:
    """A row takes part only if its reward call succeeded and its (weighted) rewards are finite."""
    cfg, counters = run.cfg, run.state.counters
    keys = ["total"] + [k for k in cfg.reward.weights if k in rewards]
    nonfinite = nonfinite_rows(rewards, len(rows), keys) & ~failed
    counters["reward_failed_rows"] += int(failed.sum())
    if nonfinite.any():
        counters["reward_nonfinite_rows"] += int(nonfinite.sum())
        bad = nonfinite.nonzero().flatten().tolist()
        which = sorted({k for k in keys if not torch.isfinite(rewards[k][nonfinite]).all()})
        ids = [sample_id(rows[i]["pp"].sample) for i in bad[:10]]
        msg = f"non-finite reward(s) {which} for {len(bad)} row(s) of sample(s) {ids}"
        if cfg.reward.on_nonfinite == "error":
            run.guard.request_stop(msg + " (reward.on_nonfinite=error)")
        else:
            log.warning("%s: dropped from their groups (reward.on_nonfinite=drop)", msg)
    return ~failed & ~nonfinite


# ------------------------------------------------------------------------------------------- rewards
def _call_reward(run, fn: Callable, texts: list[str], samples: list, what: str) -> dict | None:
    """``fn(texts, samples)`` with retries / timeout (``reward.*``); None if it failed for good.

    A failed call never raises here: its rows are dropped (``reward.on_failure=drop``), or the failure is recorded
    and, once every process has finished the same collectives, the step stops the run (``on_failure=stop``)."""
    rc, counters = run.cfg.reward, run.state.counters
    stats = CallStats()

    def warn(attempt: int, e: BaseException, wait: float | None) -> None:
        if wait is not None:
            log.warning("%s failed (attempt %d/%d: %s: %s); retrying in %.3g s", what, attempt + 1, rc.retries + 1,
                        type(e).__name__, e, wait)

    try:
        return call_with_retries(lambda: fn(texts, samples), RetryPolicy(rc.retries, rc.retry_backoff, rc.timeout),
                                 stats=stats, on_attempt_failed=warn, what=what)
    except RewardCallFailed as e:
        counters["reward_failed_calls"] += 1
        if rc.on_failure == "stop":
            run.guard.request_stop(f"{e} (reward.on_failure=stop)", cause=e)
        else:
            log.warning("%s; dropping its %d row(s) (reward.on_failure=drop)", e, len(texts))
        return None
    finally:
        counters["reward_retries"] += stats.retries
        counters["reward_timeouts"] += stats.timeouts


def score(run, texts: list[str], samples: list[dict]) -> dict[str, torch.Tensor]:
    """Rewards of the rows; ``out["_failed"]`` (bool) marks rows whose reward call failed (rewards NaN)."""
    n = len(texts)
    out = _call_reward(run, run.reward_fn, texts, samples, "reward function")
    if out is None:
        return {"total": torch.full((n,), float("nan")), "parse_failed": torch.zeros(n, dtype=torch.bool),
                "_failed": torch.ones(n, dtype=torch.bool)}
    out = {k: torch.as_tensor(v) for k, v in out.items()}
    if "total" not in out:
        out["total"] = sum(run.cfg.reward.weights[k] * out[k].float() for k in run.cfg.reward.weights)
    if "parse_failed" not in out:
        out["parse_failed"] = torch.zeros(n, dtype=torch.bool)
    for k, v in out.items():
        if v.shape[:1] != (n,):
            raise ValueError(f"reward function returned {k!r} with shape {tuple(v.shape)} for {n} completions")
    out["_failed"] = torch.zeros(n, dtype=torch.bool)
    return out


def accuracy(run, texts: list[str], samples: list[Any], scored: dict | None = None) -> torch.Tensor:
    """Accuracy per row (``reward.accuracy_key``); NaN where the reward failed."""
    if scored is not None and run.acc_key in scored:
        return scored[run.acc_key].float()
    res = _call_reward(run, run.accuracy_fn or run.reward_fn, texts, samples, "accuracy reward")
    if res is None:
        return torch.full((len(texts),), float("nan"))
    return torch.as_tensor(res[run.acc_key] if run.acc_key in res else res["total"]).float()


@torch.no_grad()
def score_samples(run, samples: Sequence[Any], K: int, key: str = "total", round: int = 0,
                  greedy: bool = False) -> torch.Tensor:
    """(S, K) rewards of K sampled (``greedy``: argmax) completions per sample (this process's share, gathered);
    missing media give a row of NaN. Data selection scores the training set with it."""
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
        with generation_context(run):
            sampling = replace(run.sampling, greedy=True) if greedy else run.sampling
            out = run.backend.generate([pp.item for _, pp in preps], K, sampling,
                                       seeds=make_seeds(run.cfg.run.seed, -1 - round, [i for i, _ in preps], K),
                                       raw_prompts=[{"text": pp.text, "images": pp.images, "clip": pp.clip}
                                                    for _, pp in preps])
        rs = [pp.reward_sample for _, pp in preps for _ in range(K)]
        sc = score(run, out.texts, rs)
        r = sc[key] if key in sc else accuracy(run, out.texts, rs)
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
def token_logprobs(run, model, rb: RolloutBatch, idx: torch.Tensor, return_logits: bool = False):
    """Log-probs of the micro-batch ``idx``; old, reference and current policy all go through here."""
    T = max(1, int(rb.completion_mask[idx].sum(1).max()))
    chunk = run.cfg.algo.logprob_chunk_size
    if run.logprob_impl == "prefix_group":
        from mmgrpo.vlm.models.prefix_group import grouped_rows_token_logprobs

        with run.accelerator.autocast():
            return grouped_rows_token_logprobs(
                model, [rb.items[i] for i in idx.tolist()], rb.completion_ids[idx, :T], rb.completion_mask[idx, :T],
                run.pad_id, run.sampling.temperature, run.policy.suppress_token_ids, return_logits=return_logits,
                device=run.device, chunk_size=chunk)
    batch = batch_to(collate_prompts([rb.items[i] for i in idx.tolist()], run.pad_id), run.device)
    ids, mask = rb.completion_ids[idx, :T].to(run.device), rb.completion_mask[idx, :T].to(run.device)
    with run.accelerator.autocast():
        return compute_token_logprobs(model, batch, ids, mask, run.sampling.temperature,
                                      run.policy.suppress_token_ids, return_logits=return_logits, chunk_size=chunk)


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
                    res = token_logprobs(run, run.model, b, idx, return_logits=bool(logits_to))
                    lp, logits = res if logits_to else (res, None)
                    if w:
                        rb.old_logp[idx, :lp.shape[1]] = lp.float().cpu()
                        for m in logits_to:  # full logits, or hidden states + head (algo.logprob_chunk_size)
                            m.on_logits(rb, idx, logits, lp)
                    del logits
                if cfg.algo.kl_coef > 0:
                    with run.policy.reference(run.model) as ref:
                        lp = token_logprobs(run, ref, b, idx)
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
    a = run.cfg.algo
    off = rb.is_offpolicy.bool()
    totals = {"tokens": global_sum(float(rb.loss_mask.sum())),
              "sequences": global_sum(float((rb.loss_mask.sum(1) > 0).sum())),
              "rows": global_sum(float(rb.n)), "micro_batches": global_sum(float(len(mbs))),
              # what of it is off-policy (injected / replayed rows): methods that train them apart (LUFFY, CHORD)
              "offpolicy_tokens": global_sum(float(rb.loss_mask[off].sum())),
              "offpolicy_sequences": global_sum(float((rb.loss_mask[off].sum(1) > 0).sum()))}
    unusable = _unusable_step(run, rb)
    if unusable:
        _record_skip(run, unusable, a.num_iterations)
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
        grad_norm, applied = _apply_update(run, loss_bad, max_norm)
        skipped += not applied
    metrics = {k: (v if k == "loss" else v / max(wsum, 1.0)) for k, v in acc.items() if k != "num_tokens"}
    metrics["grad_norm"] = grad_norm
    metrics["lr"] = run.scheduler.get_last_lr()[0]
    metrics["skipped_steps"] = float(skipped)
    return metrics


def _unusable_step(run, rb: RolloutBatch) -> str | None:
    """Why no update of this step can be applied (decided on every process alike), or None."""
    # no group with a baseline on any process (every sample's media missing, every reward call failed or
    # non-finite): nothing to learn from -> a skipped step, like a non-finite one (feeds max_consecutive_skips)
    if global_sum(rb.info.get("valid_groups", 0.0)) == 0:
        return "no valid group (missing media / failed or non-finite rewards)"
    # a NaN/inf advantage would poison every update of this step: skip them all
    adv_bad = rb.advantages is not None and rb.n > 0 and not bool(torch.isfinite(rb.advantages).all())
    if global_sum(float(adv_bad)) > 0:
        return "non-finite advantages"
    return _zero_advantage_cause(run, rb)  # every advantage 0: a zero gradient


def _zero_advantage_cause(run, rb: RolloutBatch) -> str | None:
    """Collective. Why this step has no reward signal (every advantage of every process is 0: all groups' rewards
    are equal, e.g. every completion fails to parse), or None. Counted in ``zero_advantage_steps``.

    Such a step is a *skipped step* (counted, feeds ``run.max_consecutive_skips``) when its gradient is exactly 0:
    no KL term (``algo.kl_coef=0``) and no method adding a loss term of its own (entropy bonus). An optimizer step
    on a zero gradient would only apply AdamW's momentum and weight decay (TRL / verl take it; we do not). With a
    KL or entropy term the step is taken, but a run none of whose steps had a reward signal still fails (the
    recipe's nothing-trained check)."""
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
    with sync_context(run, last):
        want_logits = any(m.needs_train_logits for m in run.methods)
        res = token_logprobs(run, run.model, b, idx, return_logits=want_logits)
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


def _apply_update(run, loss_bad: bool, max_norm: float) -> tuple[float, bool]:
    """Sum / clip the gradients and step, unless the loss or the norm is non-finite on any process:
    (gradient norm, applied)."""
    if run.grad_sync == "accelerate":
        grad_norm = prepared_grad_norm(run, max_norm)
    else:
        allreduce_grads(run)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(run.params, max_norm))
    # the norm is the same on every process (gradients were summed); the loss flag is local -> reduce it
    if global_sum(float(loss_bad or not math.isfinite(grad_norm))) > 0:
        run.optimizer.zero_grad(set_to_none=True)
        _record_skip(run, "non-finite loss" if loss_bad else "non-finite gradients")
        return grad_norm, False
    run.guard.applied()
    run.optimizer.step()
    run.scheduler.step()
    for m in run.methods:
        m.after_optimizer_step()
    return grad_norm, True


def _record_skip(run, why: str, n: int = 1) -> None:
    st = run.state
    st.counters["skipped_steps"] += n
    run.guard.skipped(why, n)
    log.warning("step %d: %s -> optimizer step skipped (%d skipped in a row, %d in total)", st.step + 1, why,
                run.guard.consecutive_skips, st.counters["skipped_steps"])


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
        wf = torch.tensor(well_formed_rows(rb.texts, run.cfg), dtype=torch.bool)
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
    m["perf/data_wait"], st.data_wait = st.data_wait, 0.0  # s spent preparing prompts this step
    m["perf/train_seconds"] = run.guard.budget.lap()  # budget clock, summed over resumes
    return _reduce_metrics(run, m)


def _reduce_metrics(run, m: dict[str, float]) -> dict[str, float]:
    """Average metrics over processes (max for ``*max*`` keys, sum for counters of this step).

    Cumulative counters (``data/skipped_missing_media``, ``data/filtered_groups``) are per process and summed;
    per-process means are averaged with equal weight (processes hold equally many prompts)."""
    if run.world == 1:
        return m
    from accelerate.utils import gather_object

    allm = gather_object([m])
    out: dict[str, float] = {}
    for k in sorted({k for d in allm for k in d}):
        vals = [d[k] for d in allm if k in d]
        if "max" in k:
            out[k] = max(vals)
        elif "min" in k:
            out[k] = min(vals)
        elif k in ("faults/skipped_steps", "faults/consecutive_skips", "train/skipped_steps"):
            out[k] = vals[0]  # decided globally: the same on every process
        elif k in ("data/skipped_missing_media", "data/skipped_bad_samples", "data/filtered_groups", "data/groups",
                   "data/valid_groups", "completions/parse_failures") or k.startswith(("perf/tokens", "faults/")):
            out[k] = float(sum(vals))
        else:
            out[k] = sum(vals) / len(vals)
    return out


def log_completions(run, rb: RolloutBatch, step: int) -> None:
    rows = []
    for i in range(min(rb.n, run.cfg.run.num_completions_to_log)):
        rows.append({"step": step, "sample_id": sample_id(rb.samples[i]), "group": int(rb.group_ids[i]),
                     "completion": rb.texts[i], "offpolicy": bool(rb.is_offpolicy[i]),
                     "truncated": bool(rb.truncated[i]), "parse_failed": bool(rb.parse_failed[i]),
                     "advantage": float(rb.advantages[i]) if rb.advantages is not None else None,
                     **{f"reward/{k}": float(v[i]) for k, v in rb.rewards.items()}})
    run.logger.log_jsonl("completions.jsonl", rows)
