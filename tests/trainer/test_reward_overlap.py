"""reward.overlap_prompts (mmgrpo.vlm.rewards.overlap): the rewards of chunk i are computed while chunk i+1
generates, and the step is exactly the synchronous one (same completions, rewards, trained weights)."""
import threading
import time

import torch

from mmgrpo.vlm.rewards.overlap import merge_scores


def test_merge_scores_by_hand():
    a = {"total": torch.tensor([1.0, 2.0]), "x": torch.tensor([5.0, 6.0]), "ok": torch.tensor([True, False])}
    b = {"total": torch.tensor([3.0])}  # a failed call: no "x", no "ok"
    out = merge_scores([a, b], [(1, 0), (0, 1), (0, 0)])
    assert out["total"].tolist() == [3.0, 2.0, 1.0] and out["ok"].tolist() == [False, False, True]
    assert torch.isnan(out["x"][0]) and out["x"][1:].tolist() == [6.0, 5.0]


def _run(tmp_path, tiny_dirs, th, overlap, sub):
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    events = []
    lock = threading.Lock()

    def slow_reward(texts, samples):
        t0 = time.perf_counter()
        time.sleep(0.3)
        with lock:
            events.append(("reward", t0, time.perf_counter()))
        return th.text_reward(texts, samples)

    cfg = th.make_cfg(tmp_path / sub, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "reward.accuracy_key=acc",
                      f"reward.overlap_prompts={overlap}", "data.check_samples=0")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=slow_reward)
    gen = tr.backend.generate

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        out = gen(*a, **kw)
        time.sleep(0.3)  # a generation long enough for the previous chunk's reward to start inside it
        with lock:
            events.append(("generate", t0, time.perf_counter()))
        return out

    tr.backend.generate = timed_generate
    tr.train()
    params = {k: v.detach().clone() for k, v in tr.policy.model.named_parameters() if v.requires_grad}
    return tr.state.batch, params, events


def test_overlap_is_identical_to_sync_and_overlaps(tmp_path, tiny_dirs, th):
    rb_s, p_s, ev_s = _run(tmp_path, tiny_dirs, th, 0, "sync")
    rb_o, p_o, ev_o = _run(tmp_path, tiny_dirs, th, 1, "overlap")
    assert rb_o.texts == rb_s.texts
    for k in rb_s.rewards:
        assert torch.equal(rb_o.rewards[k], rb_s.rewards[k]), k
    assert torch.equal(rb_o.advantages, rb_s.advantages)
    assert all(torch.equal(p_o[k], p_s[k]) for k in p_s)
    gens_o = [e for e in ev_o if e[0] == "generate"]
    rews_o = [e for e in ev_o if e[0] == "reward"]
    assert len(gens_o) == 2 and len(rews_o) == 2  # one chunk per prompt, one background call each
    # chunk 0's reward call starts before chunk 1's generation ends: they overlap
    assert rews_o[0][1] < gens_o[1][2]
    # synchronous: one generation, then one reward call after it
    gens_s = [e for e in ev_s if e[0] == "generate"]
    rews_s = [e for e in ev_s if e[0] == "reward"]
    assert len(gens_s) == 1 and len(rews_s) == 1 and rews_s[0][1] >= gens_s[0][2]
