"""Faults during training: NaN/inf rewards, reward calls that raise or hang, non-finite advantages / loss /
gradients, empty and 1-member groups -- toy reward functions on the tiny Qwen2.5-VL (CPU)."""
import json
import logging
import math
import time

import pytest
import torch

from mmgrpo.engine.errors import RewardCallFailed, TrainingStopped
from mmgrpo.engine.reward_calls import CallStats
from mmgrpo.engine.reward_calls import RetryPolicy, call_with_retries
from mmgrpo.vlm.rewards.scoring import nonfinite_rows
from mmgrpo.vlm.train import steps
from mmgrpo.vlm.train.trainer import GRPOTrainer
from mmgrpo.utils.checkpoint import CheckpointManager



def _ok(texts, samples):
    r = torch.tensor([float(sum(map(ord, t)) % 7) / 6.0 for t in texts])
    return {"acc": r, "total": r.clone(), "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}


def _metrics(tmp_path):
    return [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


# ------------------------------------------------------------------------------------------------ pure helpers
def test_call_with_retries_backoff_timeout_and_final_failure():
    calls, waits = [], []

    def flaky(x):
        calls.append(x)
        if len(calls) < 3:
            raise ConnectionError("judge unreachable")
        return x * 2

    st = CallStats()
    assert call_with_retries(lambda: flaky(21), RetryPolicy(2, 0.5), stats=st, sleep=waits.append) == 42
    assert waits == [0.5, 1.0] and st.retries == 2 and st.failures == 0  # exponential back-off

    def always(_):
        raise RuntimeError("boom")

    st = CallStats()
    with pytest.raises(RewardCallFailed, match="failed 3 time.*RuntimeError: boom"):
        call_with_retries(lambda: always(1), RetryPolicy(2, 0.0), stats=st)
    assert st.failures == 1 and st.retries == 2

    st = CallStats()
    t0 = time.time()
    with pytest.raises(RewardCallFailed, match="TimeoutError"):
        call_with_retries(lambda: time.sleep(3), RetryPolicy(1, 0.0, 0.1), stats=st)
    assert st.timeouts == 2 and time.time() - t0 < 2.0  # a hung call does not block the caller

    r = {"total": torch.tensor([1.0, float("nan"), 0.0, float("inf")]), "x": torch.tensor([0.0, 0, float("nan"), 0])}
    assert nonfinite_rows(r, 4, ["total"]).tolist() == [False, True, False, True]
    assert nonfinite_rows(r, 4).tolist() == [False, True, True, True]


# ------------------------------------------------------------------------------------------------ NaN rewards
def _nan_reward(counts):
    """Sample i0: its first 2 rows NaN/inf; i1: 3 of 4 rows NaN (1 member left); i2: all NaN (empty group)."""
    n_bad = {"i0": 2, "i1": 3, "i2": 4}
    seen = {}

    def fn(texts, samples):
        out = _ok(texts, samples)
        for i, s in enumerate(samples):
            k = seen.get(s["id"], 0)
            seen[s["id"]] = k + 1
            if k < n_bad.get(s["id"], 0):
                out["total"][i] = float("inf") if k == 0 else float("nan")
        counts.append(out["total"].clone())
        return out

    return fn


def test_nonfinite_rewards_dropped_from_groups_and_degenerate_groups_zero(tmp_path, tiny_dirs, th):
    scored = []
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "run.prompts_per_device=3",
                   "data.shuffle=false")
    tr = GRPOTrainer(cfg, samples=th.image_samples(3), reward_fn=_nan_reward(scored))
    m = tr.train(steps=1)[-1]
    rb = tr.state.batch
    # i0 keeps 2 rows, i1 keeps 1, i2 none: 3 rows enter the loss
    assert [s["id"] for s in rb.samples] == ["i0", "i0", "i1"] and bool(torch.isfinite(rb.rewards["total"]).all())
    r = scored[0][2:4].double()  # the two finite rewards of group i0, by hand: (r - mean) / (std + eps)
    sd = (r[0] - r[1]).abs() / math.sqrt(2)  # unbiased std of 2 values
    expect = (r - r.mean()) / (sd + 1e-4) if r[0] != r[1] else torch.zeros(2)
    torch.testing.assert_close(rb.advantages[:2].double(), expect, atol=1e-6, rtol=0)
    assert rb.advantages[2] == 0.0  # one member left: no baseline
    assert tr.state.counters["reward_nonfinite_rows"] == 9 and tr.state.counters["degenerate_groups"] == 2  # i1 and i2
    assert m["faults/reward_nonfinite_rows"] == 9 and m["faults/degenerate_groups_step"] == 2
    row = _metrics(tmp_path)[-1]
    assert row["faults/reward_nonfinite_rows"] == 9 and row["data/groups"] == 2
    assert math.isfinite(row["train/loss"]) and row["train/grad_norm"] > 0


def test_nonfinite_reward_error_mode_stops_with_checkpoint(tmp_path, tiny_dirs, th):
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=2", "run.prompts_per_device=3",
                   "data.shuffle=false", "reward.on_nonfinite=error")
    tr = GRPOTrainer(cfg, samples=th.image_samples(3), reward_fn=_nan_reward([]))
    with pytest.raises(TrainingStopped, match=r"non-finite reward.*\['total'\].*'i0'.*checkpoint written") as ei:
        tr.train()
    st = CheckpointManager(tmp_path / "run" / "checkpoints").load(ei.value.checkpoint)
    assert st["trainer"]["step"] == 0 and st["trainer"]["stream"]["position"] == 0  # the failed step is redone


# ------------------------------------------------------------------------------------------------ failing reward calls
def test_reward_call_retried_then_rows_dropped(tmp_path, tiny_dirs, th, caplog):
    state = {"calls": 0}

    def flaky_then_down(texts, samples):
        state["calls"] += 1
        if state["calls"] == 1:
            raise ConnectionError("judge: 503")  # step 1: one retry succeeds
        if state["calls"] >= 3:
            raise ConnectionError("judge: gone")  # step 2: down for good
        return _ok(texts, samples)

    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "reward.retries=1", "reward.retry_backoff=0")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=flaky_then_down)
    m1 = tr.train(steps=1)[-1]
    assert tr.state.batch.n == 8 and m1["faults/reward_retries"] == 1 and m1["faults/reward_failed_calls"] == 0
    before = th.trainable(tr)
    with caplog.at_level(logging.WARNING, logger="mmgrpo"):
        m2 = tr.train(steps=1)[-1]
    assert "dropping its 8 row(s)" in caplog.text
    assert tr.state.batch.n == 0 and m2["faults/reward_failed_calls"] == 1 and m2["faults/reward_failed_rows"] == 8
    assert all(torch.equal(before[k], v) for k, v in th.trainable(tr).items())  # nothing to learn from: no change
    assert _metrics(tmp_path)[-1]["faults/reward_failed_calls"] == 1


def test_reward_timeout_then_stop_writes_checkpoint(tmp_path, tiny_dirs, th):
    state = {"calls": 0}

    def hangs_on_step_2(texts, samples):
        state["calls"] += 1
        if state["calls"] > 1:
            time.sleep(2.0)  # a remote judge that stopped answering
        return _ok(texts, samples)

    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=3", "reward.retries=1",
                   "reward.retry_backoff=0", "reward.timeout=0.2", "reward.on_failure=stop")
    tr = GRPOTrainer(cfg, samples=th.image_samples(3), reward_fn=hangs_on_step_2)
    with pytest.raises(TrainingStopped, match="no answer within 0.2 s.*on_failure=stop.*checkpoint written"):
        tr.train()
    assert tr.state.counters["reward_timeouts"] == 2 and tr.state.counters["reward_failed_calls"] == 1
    ckpt = CheckpointManager(tmp_path / "run" / "checkpoints")
    st, path = ckpt.load_latest()
    assert path.name == "step-00000001" and st["trainer"]["stream"]["position"] == 2  # step 2 is redone on resume


# ------------------------------------------------------------------------------------------------ non-finite updates
def test_nonfinite_advantages_loss_and_grads_skip_then_stop_after_k(tmp_path, tiny_dirs, th, caplog, monkeypatch):
    """Step 1: NaN advantage; step 2: NaN loss; step 3: NaN gradients -> each optimizer step skipped (weights and
    AdamW state untouched, counted, logged); 3 in a row = run.max_consecutive_skips -> checkpoint + stop."""
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=6", "run.max_consecutive_skips=3")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=_ok)
    orig_adv, orig_logp = steps.advantages, tr.logprobs

    def adv(run, rb):
        orig_adv(run, rb)
        if tr.state.step == 0:
            rb.advantages[0] = float("nan")

    class NaNLogprobs:  # the loss's log-probs NaN at step 2 (not the no-grad old / reference ones)
        def rows(self, model, rb, idx, return_logits=False):
            out = orig_logp.rows(model, rb, idx, return_logits)
            return out * float("nan") if (tr.state.step == 1 and torch.is_grad_enabled()) else out

    monkeypatch.setattr(steps, "advantages", adv)
    monkeypatch.setattr(tr, "logprobs", NaNLogprobs())
    p = next(p for p in tr.model.parameters() if p.requires_grad)
    p.register_hook(lambda g: g * float("nan") if tr.state.step == 2 else g)
    w0 = th.trainable(tr)
    with caplog.at_level(logging.WARNING, logger="mmgrpo"):
        with pytest.raises(TrainingStopped, match="3 consecutive optimizer steps were skipped.*checkpoint written"):
            tr.train()
    for what in ("advantages", "loss", "gradients"):
        assert f"non-finite {what} -> optimizer step skipped" in caplog.text
    assert all(torch.equal(v, w0[k]) for k, v in th.trainable(tr).items())
    assert tr.optimizer.state_dict()["state"] == {}  # AdamW never stepped: no moments, no step count
    rows = _metrics(tmp_path)
    assert [r["train/skipped_steps"] for r in rows[:3]] == [1, 1, 1]
    assert rows[0]["train/grad_norm"] is None  # NaN is logged as null
    assert rows[-1]["faults/skipped_steps"] == 3 and rows[-1]["faults/consecutive_skips"] == 3
    st, path = CheckpointManager(tmp_path / "run" / "checkpoints").load_latest()
    assert path.name == "step-00000003" and st["trainer"]["step"] == 3 and st["trainer"]["consecutive_skips"] == 3
    # a good step resets the count
    monkeypatch.setattr(steps, "advantages", orig_adv)
    monkeypatch.setattr(tr, "logprobs", orig_logp)
    m = tr.train(steps=1)[-1]
    assert m["train/skipped_steps"] == 0 and m["faults/consecutive_skips"] == 0
    assert any(not torch.equal(v, w0[k]) for k, v in th.trainable(tr).items())
