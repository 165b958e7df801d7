"""Rewards through MultiReward (weighted sum, GDPO per-reward, Pref-GRPO win rate) and fault handling: NaN rewards
dropped from their groups, reward calls retried / timed out / dropped / stopping the run, non-finite advantages,
loss and gradients skipping the optimizer step, halting with a checkpoint. Expected values are computed by hand."""
from flow_grpo.train import steps
import json
import math
import socket
import time

import numpy as np
import pytest
import torch

from flow_grpo.rewards import AsyncRewardRunner, Reward, RewardError
from flow_grpo.sampler import sample_trajectories
from flow_grpo.scoring import ResilientReward
from mmgrpo.engine.errors import RewardCallFailed, TrainingStopped

from .conftest import block_reward, brightness_reward, make_adapter, make_trainer

IMGS = np.zeros((3, 8, 8, 3), dtype=np.uint8)


# ------------------------------------------------------------------------------------------- unit: ResilientReward
def test_resilient_reward_retry_timeout_drop_stop_nan():
    calls = {"n": 0}

    def flaky(images, prompts, metadata):  # fails on every odd attempt
        calls["n"] += 1
        if calls["n"] % 2:
            raise ConnectionError("transient")
        return np.arange(len(prompts), dtype=np.float64)

    r = ResilientReward(flaky, "flaky", retries=1, backoff=0.0)
    out = r.evaluate(IMGS, ["a"] * 3)
    assert out["flaky"].tolist() == [0, 1, 2] and "valid" in out and out["valid"].all()
    assert r.counters == {"calls": 1, "retries": 1, "timeouts": 0, "failed_calls": 0, "dropped": 0}

    slow = {"n": 0}

    def sleepy(images, prompts, metadata):  # the first attempt sleeps past the timeout
        slow["n"] += 1
        if slow["n"] == 1:
            time.sleep(1.0)
        return np.ones(len(prompts))

    r = ResilientReward(sleepy, "sleepy", retries=1, backoff=0.0, timeout=0.2)
    t0 = time.perf_counter()
    assert r.evaluate(IMGS, ["a"] * 3)["sleepy"].tolist() == [1, 1, 1]
    assert 0.2 <= time.perf_counter() - t0 < 0.9  # the stuck attempt was abandoned, not waited for
    assert r.counters["timeouts"] == 1 and r.counters["dropped"] == 0

    def broken(images, prompts, metadata):
        raise RuntimeError("model crashed")

    r = ResilientReward(broken, "broken", retries=2, backoff=0.05)
    t0 = time.perf_counter()
    out = r.evaluate(IMGS, ["a"] * 3)
    assert time.perf_counter() - t0 >= 0.05 + 0.1  # backoff * 2**k before retry k
    assert out["broken"].tolist() == [0, 0, 0] and not out["valid"].any()
    assert r.counters == {"calls": 1, "retries": 2, "timeouts": 0, "failed_calls": 1, "dropped": 3}
    with pytest.raises(RewardCallFailed, match="broken.*3 time"):
        ResilientReward(broken, "broken", retries=2, backoff=0.0, on_failure="stop").evaluate(IMGS, ["a"] * 3)

    # a remote reward server that is down: its own retries, then ours, then the samples are dropped
    from flow_grpo.rewards.remote import RemoteReward

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    remote = RemoteReward(f"http://127.0.0.1:{port}/score", timeout=2, retries=0, backoff=0)
    r = ResilientReward(remote, "pickscore", retries=1, backoff=0.0)
    out = r.evaluate(IMGS, ["a"] * 3)
    assert not out["valid"].any() and r.counters["failed_calls"] == 1 and r.counters["retries"] == 1

    # non-finite scores are not retried: dropped (valid=False) or raised, per reward.on_nonfinite (ResilientReward nan_policy)
    def nan_one(images, prompts, metadata):
        return np.array([1.0, np.nan, np.inf])

    r = ResilientReward(nan_one, "nanny", retries=3)
    out = r.evaluate(IMGS, ["a"] * 3)
    assert out["valid"].tolist() == [True, False, False] and r.counters["retries"] == 0
    with pytest.raises(RewardError, match="non-finite"):
        ResilientReward(nan_one, "nanny", nan_policy="raise").evaluate(IMGS, ["a"] * 3)

    class Named(Reward):  # a reward whose own name differs from its config key is renamed
        name = "inner"

        def score(self, images, prompts, metadata, **kw):
            return {"inner": np.ones(len(prompts)), "inner/aux": np.zeros(len(prompts))}

    assert sorted(ResilientReward(Named(), "outer").evaluate(IMGS, ["a"] * 3)) == ["outer", "outer/aux", "valid"]


# ------------------------------------------------------------------------------------------- trainer: NaN drop
def _nan_at(positions, scale=1.0):
    """Component returning NaN for the listed sample positions (counted over successive calls = rollout order)."""
    seen = {"n": 0}

    def fn(images, prompts, metadata):
        r = block_reward(images, prompts, metadata)["block"].double() * scale
        for j in range(len(prompts)):
            if seen["n"] + j in positions:
                r[j] = float("nan") if (seen["n"] + j) % 2 else float("inf")
        seen["n"] += len(prompts)
        return {"nanny": r}

    return fn


def test_nan_rewards_leave_their_groups_counted_and_logged(tmp_path):
    # 3 groups of 3, rollout chunks of 3 (one group each); group 0 loses 1 member, group 1 keeps one, group 2 none
    tr = make_trainer("flux", "fast", tmp_path, rewards={"block": block_reward, "nanny": _nan_at({0, 3, 4, 6, 7, 8})},
                      **{"data.group_size": 3, "data.groups_per_epoch": 3, "sample.batch_size": 3,
                         "reward.weights": "{block: 1.0, nanny: 0.5}",
                         # the by-hand group statistics below (the fast preset's release default is the batch std)
                         "optim.adv_scale": "group", "optim.adv_std_ddof": 1})
    before = [p.detach().clone() for p in tr.params]
    m = tr.train()[-1]
    traj = tr.state.last_traj
    assert traj.rewards["valid"].tolist() == [False, True, True, False, False, True, False, False, False]
    assert m["reward/invalid"] == 6 and m["reward/valid_fraction"] == pytest.approx(3 / 9)
    assert m["adv/groups_empty"] == 1 and m["adv/groups_singleton"] == 1
    # weighted sum of the valid samples, by hand
    for i in (1, 2, 5):
        assert traj.rewards["total"][i].item() == pytest.approx(
            traj.rewards["block"][i].item() * 1.5, rel=1e-6)
    # group 0: the two valid members get +-(d/2)/(|d|/sqrt(2) + 1e-4); the singleton and dropped ones get 0
    adv, _ = steps.advantages(tr, traj)
    r1, r2 = traj.rewards["total"][1].item(), traj.rewards["total"][2].item()
    sd = abs(r1 - r2) / math.sqrt(2)
    expect = [(r1 - r2) / 2 / (sd + 1e-4), (r2 - r1) / 2 / (sd + 1e-4)]
    col = traj.train_mask[1].nonzero()[0, 0]
    assert adv[1, col].item() == pytest.approx(expect[0], rel=1e-5)
    assert adv[2, col].item() == pytest.approx(expect[1], rel=1e-5)
    assert not traj.train_mask[[0, 3, 4, 5, 6, 7, 8]].any() and m["actual_batch_size"] == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, tr.params))  # the run trained on what was left
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["reward/invalid"] == 6 and row["adv/groups_empty"] == 1


# ------------------------------------------------------------------------------------------- trainer: failed calls
def test_failing_reward_calls_are_retried_then_dropped_or_stop_the_run(tmp_path):
    state = {"calls": 0, "attempt": 0}

    def flaky(images, prompts, metadata):  # call 1: fails once then works; call 2 (second chunk): always fails
        state["attempt"] += 1
        if state["calls"] == 0 and state["attempt"] == 1:
            raise TimeoutError("slow server")
        if state["calls"] == 1:
            raise RuntimeError("bad batch")
        state["calls"] += 1
        return block_reward(images, prompts, metadata)["block"]

    tr = make_trainer("flux", "fast", tmp_path, rewards={"flaky": flaky},
                      **{"sample.batch_size": 2, "reward.retries": 2})

    orig = tr.rewards.wrapped["flaky"]._evaluate

    def evaluate(*a, **k):
        out = orig(*a, **k)
        if not out["valid"].all():
            state["calls"] += 1  # the dropped call counts as done
        return out

    tr.rewards.wrapped["flaky"]._evaluate = evaluate
    m = tr.train()[-1]
    assert m["reward/retries"] == 1 + 2 and m["reward/failed_calls"] == 1
    assert m["reward/dropped_by_failure"] == 2 and m["reward/invalid"] == 2
    assert m["adv/groups_empty"] == 1  # group 1 was exactly the dropped chunk
    assert tr.state.last_traj.rewards["valid"].tolist() == [True, True, False, False]
    # the same failure with on_failure=stop writes a checkpoint and stops the run (CLI exit 3) naming the reward
    # (a new run: the first one has ended, and train() on an ended run does nothing)
    state.update(calls=1, attempt=0)
    tr = make_trainer("flux", "fast", tmp_path / "stop", rewards={"flaky": flaky},
                      **{"sample.batch_size": 2, "reward.retries": 2})
    tr.rewards.wrapped["flaky"].on_failure = "stop"
    from mmgrpo.engine.errors import TrainingStopped

    with pytest.raises(TrainingStopped, match=r"flaky.*bad batch \(reward.on_failure=stop\); fix the reward.*checkpoint written") as ei:
        tr.train(num_epochs=1)
    assert isinstance(ei.value.__cause__, RewardCallFailed)


# ------------------------------------------------------------------------------------------- trainer: skip + halt
class _NaNGrad(torch.autograd.Function):
    """Identity forward, NaN gradient backward (a finite loss with a poisoned gradient)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        return g * float("nan")


def test_nonfinite_advantages_loss_grads_skip_step_then_halt_with_checkpoint(tmp_path, monkeypatch):
    from mmgrpo.utils.checkpoint import CheckpointManager

    tr = make_trainer("flux", "fast", tmp_path, **{"optim.max_consecutive_skips": 2, "run.num_epochs": 6})
    # epoch 0: NaN advantages; 1: clean; 2: NaN gradient (finite loss); 3: NaN loss -> 2 in a row -> halt
    orig_adv, orig_loss, orig_count = steps.advantages, tr.loss, steps.count_epoch

    def adv_fn(run, traj):
        adv, st = orig_adv(run, traj)
        return (adv * float("nan") if tr.state.epoch == 0 else adv), st

    def loss_fn(*a, **k):
        loss, m, kl, n = orig_loss(*a, **k)
        if tr.state.epoch == 2:
            loss = loss + _NaNGrad.apply(tr.params[0].sum() * 0.0)
            assert torch.isfinite(loss)
        if tr.state.epoch == 3:
            loss = loss * float("nan")
        return loss, m, kl, n

    monkeypatch.setattr(steps, "advantages", adv_fn)
    tr.loss = loss_fn
    snap = {}

    def count_fn(*a, **k):  # after the epoch's updates, before the epoch counter moves
        snap[tr.state.epoch] = [p.detach().clone() for p in tr.params]
        return orig_count(*a, **k)

    monkeypatch.setattr(steps, "count_epoch", count_fn)
    p0 = [p.detach().clone() for p in tr.params]
    with pytest.raises(TrainingStopped, match="2 consecutive optimizer steps were skipped") as ei:
        tr.train()
    assert tr.state.counters["applied_steps"] == 1 and tr.state.counters["skipped_steps"] == 3
    assert all(torch.equal(a, b) for a, b in zip(p0, snap[0]))           # epoch 0 skipped: unchanged
    assert any(not torch.equal(a, b) for a, b in zip(p0, snap[1]))       # epoch 1 applied
    assert all(torch.equal(a, b) for a, b in zip(snap[1], snap[2]))      # epoch 2 skipped (NaN grad)
    assert all(torch.equal(a, b) for a, b in zip(snap[1], tr.params))    # epoch 3 skipped (NaN loss)
    # the checkpoint was written before stopping and holds the clean weights
    path = CheckpointManager(tmp_path / "halted").latest_valid()
    assert path is not None and str(path) == ei.value.checkpoint
    st = CheckpointManager(tmp_path / "halted").load(path)
    assert st["trainer"]["global_step"] == 4 and st["trainer"]["counters"]["skipped_steps"] == 3
    for n, p in tr.named_params:
        assert torch.equal(st["trainable"][n], p.detach())
        assert torch.isfinite(st["trainable"][n]).all()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("steps/skipped") for r in rows[:3]] == [1.0, 0.0, 1.0] and rows[-1].get("halted") == 1.0


# ------------------------------------------------------------------------------------------- modes
def _z(x):
    x = np.asarray(x, dtype=np.float64)
    return (x - x.mean()) / (x.std(ddof=1) + 1e-4)


def test_per_reward_mode_normalises_each_reward_in_its_group_then_sums(tmp_path):
    tr = make_trainer("flux", "fast", tmp_path, rewards={"block": block_reward, "brightness": brightness_reward},
                      **{"reward.mode": "per_reward", "reward.weights": "{block: 1.0, brightness: 2.0}",
                         "data.group_size": 3, "data.groups_per_epoch": 2, "sample.batch_size": 3,
                         "optim.adv_scale": "group", "optim.adv_std_ddof": 1})  # the by-hand statistics below
    tr.train()
    traj = tr.state.last_traj
    adv, _ = steps.advantages(tr, traj)
    g = traj.group_ids.numpy()
    a, b = traj.rewards["block"].numpy(), traj.rewards["brightness"].numpy()
    s = np.zeros(len(g))
    for gid in np.unique(g):
        m = g == gid
        s[m] = 1.0 * _z(a[m]) + 2.0 * _z(b[m])
    expect = np.clip((s - s.mean()) / (s.std(ddof=1) + 1e-4), -5, 5)
    got = np.array([adv[i, traj.train_mask[i].nonzero()[0, 0]].item() for i in range(len(g))])
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-6)
    # the weighted total is still logged
    np.testing.assert_allclose(traj.rewards["total"].numpy(), a + 2 * b, rtol=1e-6)


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_win_rate_mode_uses_group_ids_not_prompt_strings(kind, tmp_path):
    tr = make_trainer(kind, "fast", tmp_path, **{"reward.mode": "win_rate", "data.prompts": "[same prompt]",
                                                    "data.group_size": 3, "data.groups_per_epoch": 2,
                                                    "sample.batch_size": 3})
    m = tr.train()[-1]
    traj = tr.state.last_traj
    s, g = traj.rewards["block"].numpy(), traj.group_ids.numpy()
    assert len(set(traj.prompts)) == 1 and len(set(g.tolist())) == 2
    expect = np.zeros(len(s))
    for i in range(len(s)):
        others = [j for j in range(len(s)) if g[j] == g[i] and j != i]
        expect[i] = sum(1.0 if s[i] > s[j] else 0.5 if s[i] == s[j] else 0.0 for j in others) / len(others)
    np.testing.assert_allclose(traj.rewards["total"].numpy(), expect)
    assert m["reward/win_rate/mean"] == pytest.approx(0.5)  # win rates of a full group average 1/2


def test_async_rewards_overlap_the_next_chunk_and_match_sync():
    ad = make_adapter("flux")
    calls = {"n": 0}
    orig = ad.predict_velocity

    def counted(*a, **k):
        calls["n"] += 1
        return orig(*a, **k)

    ad.predict_velocity = counted
    progressed = []

    def watcher(images, prompts, metadata):  # the first chunk's reward waits to see sampling go on meanwhile
        if not progressed:
            c0 = calls["n"]
            deadline = time.time() + 5
            while calls["n"] == c0 and time.time() < deadline:
                time.sleep(0.005)
            progressed.append(calls["n"] > c0)
        return block_reward(images, prompts, metadata)

    from flow_grpo.config import SamplingConfig

    cfg = SamplingConfig(num_steps=3, height=64, width=64, guidance_scale=3.5, cfg=False, step_mode="all",
                         batch_size=2)
    args = (ad, ["a", "b"] * 2, cfg, [1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 10, 10], [0, 0, 1, 1])
    with AsyncRewardRunner(watcher) as runner:
        a = sample_trajectories(*args, reward_fn=watcher, reward_runner=runner)
    assert progressed == [True]
    b = sample_trajectories(*args, reward_fn=block_reward)
    assert torch.equal(a.rewards["total"], b.rewards["total"]) and torch.equal(a.images, b.images)
