"""The prompts of a step: this process's share of the stream, prepared through the task adapter (media decoded,
optionally ahead of time in a background thread, ``data.prefetch``), samples the model cannot take skipped and
counted."""
from __future__ import annotations

import copy
import time
from typing import Sequence

from mmgrpo.utils.logging import get_logger
from mmgrpo.vlm.data.task import BadSampleError, MissingMediaError, PreparedPrompt, sample_id
from mmgrpo.vlm.data.stream import PromptStream

log = get_logger("mmgrpo.train")

__all__ = ["make_stream", "draw", "prepare", "prefetch_ahead", "get_prefetcher", "close_prefetch"]


def make_stream(run) -> PromptStream:
    """A fresh stream over the run's (selected) samples. When an epoch begins, the methods' ``on_epoch`` hooks run
    (data selection may re-select: the new epoch then permutes the new set)."""
    def epoch_start(epoch: int) -> int:
        for m in run.methods:
            m.on_epoch(epoch)
        return len(run.samples)

    return PromptStream(len(run.samples), run.cfg.run.seed, run.cfg.data.shuffle, on_epoch=epoch_start)


def draw(run, stream: PromptStream | None = None) -> list[tuple[int, int, list[int] | None]]:
    """This process's share of the next global prompt batch (all processes advance the stream equally).

    Global row r = k * G + g (prompt k of the step, generation g); process i owns rows [i R/W, (i+1) R/W). When the
    prompts divide evenly, that is whole groups (``gens`` None); otherwise a group may be split and ``gens`` lists
    the generation indices sampled here (their seeds do not depend on the split)."""
    P, W, rank = run.prompts_per_step, run.world, run.rank
    drawn = (run.state.stream if stream is None else stream).take(P)
    if not run.split_groups:
        k = P // W
        return [(pos, idx, None) for pos, idx in drawn[rank * k:(rank + 1) * k]]
    G = run.cfg.rollout.group_size
    lo, hi = rank * P * G // W, (rank + 1) * P * G // W
    out = []
    for k, (pos, idx) in enumerate(drawn):
        gens = [g for g in range(G) if lo <= k * G + g < hi]
        if gens:
            out.append((pos, idx, gens))
    return out


def prepare(run, drawn: Sequence[tuple]) -> list[tuple[int, PreparedPrompt, list[int] | None]]:
    """(stream position, prepared prompt, generation indices this process samples or None = all)."""
    out, st = [], run.state
    t0 = time.perf_counter()
    pf = get_prefetcher(run)
    for pos, idx, gens in drawn:
        s = run.samples[idx]
        try:
            pp = run.task.prepare(s) if pf is None else pf.get(_key(run, pos, idx), s, inline=run.task.prepare)
            out.append((pos, pp, gens))
        except MissingMediaError as e:
            if run.cfg.data.on_missing_media == "error":
                raise
            st.counters["skipped_missing_media"] += 1
            log.warning("skipping sample %s (index %d): %s", sample_id(s), idx, e)
        except BadSampleError as e:
            if run.cfg.data.on_bad_sample == "error":
                raise
            st.counters["skipped_bad_samples"] += 1
            log.warning("skipping sample (index %d): %s (data.on_bad_sample=skip)", idx, e)
    st.data_wait += time.perf_counter() - t0
    return out


def prefetch_ahead(run, current: Sequence[tuple] = ()) -> None:
    """Hint the samples of the next ``data.prefetch`` draws (on a copy of the stream), stopping before an epoch
    boundary where a method may re-select the data. ``current``: the batch just drawn and not yet
    prepared (:func:`draw`'s output); its pending samples stay pending."""
    pf = get_prefetcher(run)
    if pf is None:
        return
    keep = [_key(run, pos, idx) for pos, idx, _ in current]
    st = copy.copy(run.state.stream)
    st.on_epoch = None
    reselects = any(m.reselects_data for m in run.methods)
    upcoming = []
    for _ in range(run.cfg.data.prefetch):
        if reselects and st.offset + run.prompts_per_step > st.n:
            break
        upcoming += [(_key(run, pos, idx), run.samples[idx]) for pos, idx, _ in draw(run, st)]
    pf.schedule(upcoming, keep=keep)


def close_prefetch(run) -> None:
    if run.state.prefetcher is not None:
        run.state.prefetcher.close()
        run.state.prefetcher = None


def get_prefetcher(run):
    if run.cfg.data.prefetch <= 0:
        return None
    if run.state.prefetcher is None:
        from mmgrpo.vlm.data.prefetch import Prefetcher

        task = copy.copy(run.task)
        task.processor = copy.deepcopy(run.task.processor)  # its own tokenizer: HF's are not thread-safe
        run.state.prefetcher = Prefetcher(task.prepare)
    return run.state.prefetcher


def _key(run, pos: int, idx: int) -> tuple:
    # keyed by the sample object too: a data re-selection may map the same index to another sample
    return pos, idx, id(run.samples[idx])
