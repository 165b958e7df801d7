"""data.prefetch: the next steps' samples are prepared in a background thread; the training is unchanged (same
weights, same data positions, checkpoints record the batch being trained), only the waiting moves."""
import threading
import time

import pytest
import torch

from mmgrpo.vlm.data.prefetch import Prefetcher
from mmgrpo.vlm.train.trainer import GRPOTrainer


def test_prefetcher_order_hits_misses_cancel_and_errors():
    calls = []

    def prep(x):
        calls.append((x, threading.current_thread().name))
        if x == "bad":
            raise ValueError("undecodable")
        time.sleep(0.01)
        return x.upper()

    pf = Prefetcher(prep)
    try:
        pf.schedule([((0, 5), "a"), ((1, 3), "b"), ((2, 9), "bad")])
        assert pf.get((0, 5), "a") == "A" and pf.get((1, 3), "b") == "B"
        with pytest.raises(ValueError, match="undecodable"):  # the worker's error reaches the caller
            pf.get((2, 9), "bad")
        assert [c[0] for c in calls] == ["a", "b", "bad"]  # one worker, in hint order
        assert all(name.startswith("mmgrpo-prefetch") for _, name in calls)
        assert pf.get((3, 1), "c") == "C" and calls[-1] == ("c", threading.current_thread().name)  # inline
        assert (pf.hits, pf.misses) == (3, 1)
        pf.schedule([((4, 0), "d")])
        pf.schedule([((5, 0), "e")])  # (4, 0) no longer expected: dropped
        assert pf.get((5, 0), "e") == "E" and (4, 0) not in pf._pending
    finally:
        pf.close()


def test_schedule_keep_leaves_the_current_batch_alone():
    """``keep``: the batch about to be collected is neither cancelled (pending) nor started (not pending)."""
    gate = threading.Event()
    started = []

    def prep(x):
        started.append(x)
        gate.wait(10)
        return x.upper()

    pf = Prefetcher(prep)
    try:
        pf.schedule([((0, 0), "a"), ((1, 0), "b")])
        pf.schedule([((2, 0), "c")], keep=[(1, 0), (9, 9)])  # (0, 0) dropped, (1, 0) kept, (9, 9) not started
        assert set(pf._pending) == {(1, 0), (2, 0)}
        gate.set()
        assert pf.get((1, 0), "b") == "B" and pf.get((2, 0), "c") == "C"
        assert pf.get((9, 9), "z") == "Z" and (pf.hits, pf.misses) == (2, 1)  # prepared inline
        assert "z" not in started[:-1] and started.count("z") == 1
    finally:
        gate.set()
        pf.close()


def test_next_batch_decodes_while_the_first_is_prepared_inline(tmp_path, tiny_dirs, th):
    """The first step (and the first after a resume) prepares its batch inline; the background thread must already
    be decoding the next batch meanwhile, not only once the step's own batch is ready (which left the first
    prefetched step waiting for most of a batch)."""
    cfg = th.make_cfg(tmp_path / "p1", tiny_dirs("qwen2_5_vl"), "data.prefetch=1", "run.max_steps=3")
    tr = GRPOTrainer(cfg, samples=th.video_samples(6), reward_fn=th.text_reward)
    tr.state.stream = tr.new_stream()
    pf = tr.feed.get_prefetcher()
    worker_started = threading.Event()
    seen = []
    worker_prepare, inline_prepare = pf.prepare, tr.task.prepare

    def in_worker(s):
        worker_started.set()
        return worker_prepare(s)

    def inline(s):
        # pending when the first inline preparation starts: the next draw's 2 samples (positions 2 and 3)
        seen.append((s["id"], sorted(k[0] for k in pf._pending), worker_started.wait(30)))
        return inline_prepare(s)

    pf.prepare, tr.task.prepare = in_worker, inline
    try:
        tr.train(steps=3)
        first = seen[0]
        assert first[1] == [2, 3], seen  # the next batch was hinted before this one was prepared
        assert first[2], "the background thread did not start while the first batch was prepared inline"
        assert len(seen) == 2 and (pf.hits, pf.misses) == (4, 2)  # steps 2-3 from the thread
    finally:
        tr.feed.close()


def _run(tr, n):
    """n steps one by one: the checkpointed stream after each, and the run's prefetcher (closed when it ends)."""
    positions, pf = [], None
    for _ in range(n):
        tr.train(steps=1)
        pf = pf or tr.feed.prefetcher
        positions.append(tr.state.stream.state_dict())  # what the checkpoint writes
    return positions, pf


def test_prefetch_changes_nothing_but_the_waiting(tmp_path, tiny_dirs, th):
    samples = th.video_samples(3) + th.image_samples(2)  # 5 samples, 2 per step: epochs wrap (reshuffled)
    runs = {}
    for n in (0, 2):
        cfg = th.make_cfg(tmp_path / f"p{n}", tiny_dirs("qwen2_5_vl"), f"data.prefetch={n}", "run.max_steps=3")
        torch.manual_seed(0)
        tr = GRPOTrainer(cfg, samples=samples, reward_fn=th.text_reward)
        try:
            pos, pf = _run(tr, 3)
            runs[n] = (pos, th.trainable(tr), pf)
            if n:
                # step 1 prepared inline; steps 2 and 3 came from the background thread
                assert (pf.hits, pf.misses) == (4, 2)
        finally:
            tr.feed.close()
    (pos0, w0, _), (pos2, w2, _) = runs[0], runs[2]
    # the checkpointed data position is the trained batch's, not the prefetched one's
    assert pos2 == pos0 and [p["position"] for p in pos2] == [2, 4, 6]
    assert w0.keys() == w2.keys() and all(torch.equal(w0[k], w2[k]) for k in w0)
