"""The prompts of a step: this process's share of the stream (:meth:`PromptFeed.draw`), prepared through the task
adapter (:meth:`PromptFeed.prepare`: media decoded, optionally ahead of time in a background thread,
``data.prefetch``, :meth:`PromptFeed.prefetch_ahead`), samples the model cannot take skipped and counted.

A :class:`PromptFeed` is built once per run with what stays fixed (the task adapter, the ``data`` config section,
the global batch and this process's place in it); the stream and the samples it draws from are passed per call (data
selection may narrow the samples during a run)."""
from __future__ import annotations

import copy
import time
from typing import Any, Sequence

from mmgrpo.utils.logging import get_logger
from mmgrpo.vlm.data.prefetch import Prefetcher
from mmgrpo.vlm.data.stream import PromptStream
from mmgrpo.vlm.data.task import BadSampleError, MissingMediaError, PreparedPrompt, TaskAdapter, sample_id

log = get_logger("mmgrpo.train")

__all__ = ["PromptFeed"]


class PromptFeed:
    """``task``: the run's task adapter; ``data_cfg``: the ``data`` config section (``prefetch``,
    ``on_missing_media``, ``on_bad_sample``); ``prompts_per_step`` prompts of ``group_size`` rows per step over
    ``world`` processes, this one ``rank``; ``split_groups``: a group's rows may sit on several processes."""

    def __init__(self, task: TaskAdapter, data_cfg: Any, prompts_per_step: int, group_size: int, rank: int,
                 world: int, split_groups: bool):
        self.task, self.data = task, data_cfg
        self.prompts_per_step, self.group_size, self.rank, self.world = prompts_per_step, group_size, rank, world
        self.split_groups = split_groups
        self.prefetcher: Prefetcher | None = None  # the background preparation (started on first use)
        self.wait = 0.0  # seconds spent preparing prompts since the caller last reset it

    def draw(self, stream: PromptStream) -> list[tuple[int, int, list[int] | None]]:
        """This process's share of the next global prompt batch (all processes advance the stream equally).

        Global row r = k * G + g (prompt k of the step, generation g); process i owns rows [i R/W, (i+1) R/W). When
        the prompts divide evenly, that is whole groups (``gens`` None); otherwise a group may be split and ``gens``
        lists the generation indices sampled here (their seeds do not depend on the split)."""
        P, W, rank = self.prompts_per_step, self.world, self.rank
        drawn = stream.take(P)
        if not self.split_groups:
            k = P // W
            return [(pos, idx, None) for pos, idx in drawn[rank * k:(rank + 1) * k]]
        G = self.group_size
        lo, hi = rank * P * G // W, (rank + 1) * P * G // W
        out = []
        for k, (pos, idx) in enumerate(drawn):
            gens = [g for g in range(G) if lo <= k * G + g < hi]
            if gens:
                out.append((pos, idx, gens))
        return out

    def prepare(self, drawn: Sequence[tuple], samples: Sequence[Any],
                counters: dict[str, int]) -> list[tuple[int, PreparedPrompt, list[int] | None]]:
        """(stream position, prepared prompt, generation indices this process samples or None = all) of the drawn
        ``samples``; skipped ones are counted in ``counters`` (``skipped_missing_media``, ``skipped_bad_samples``)."""
        out = []
        t0 = time.perf_counter()
        pf = self.get_prefetcher()
        for pos, idx, gens in drawn:
            s = samples[idx]
            try:
                pp = self.task.prepare(s) if pf is None else pf.get((pos, idx, id(s)), s, inline=self.task.prepare)
                out.append((pos, pp, gens))
            except MissingMediaError as e:
                if self.data.on_missing_media == "error":
                    raise
                counters["skipped_missing_media"] += 1
                log.warning("skipping sample %s (index %d): %s", sample_id(s), idx, e)
            except BadSampleError as e:
                if self.data.on_bad_sample == "error":
                    raise
                counters["skipped_bad_samples"] += 1
                log.warning("skipping sample (index %d): %s (data.on_bad_sample=skip)", idx, e)
        self.wait += time.perf_counter() - t0
        return out

    def prefetch_ahead(self, stream: PromptStream, samples: Sequence[Any], current: Sequence[tuple] = (),
                       stop_at_epoch: bool = False) -> None:
        """Hint the samples of the next ``data.prefetch`` draws (on a copy of the stream), stopping before an epoch
        boundary when ``stop_at_epoch`` (a method may re-select the data there). ``current``: the batch just drawn
        and not yet prepared (:meth:`draw`'s output); its pending samples stay pending."""
        pf = self.get_prefetcher()
        if pf is None:
            return
        # keyed by the sample object too: a data re-selection may map the same index to another sample
        keep = [(pos, idx, id(samples[idx])) for pos, idx, _ in current]
        st = copy.copy(stream)
        st.on_epoch = None
        upcoming = []
        for _ in range(self.data.prefetch):
            if stop_at_epoch and st.offset + self.prompts_per_step > st.n:
                break
            upcoming += [((pos, idx, id(samples[idx])), samples[idx]) for pos, idx, _ in self.draw(st)]
        pf.schedule(upcoming, keep=keep)

    def close(self) -> None:
        """Stop the background preparation (a later call starts a new one)."""
        if self.prefetcher is not None:
            self.prefetcher.close()
            self.prefetcher = None

    def get_prefetcher(self) -> Prefetcher | None:
        """The background preparation (started on first use); None without ``data.prefetch``."""
        if self.data.prefetch <= 0:
            return None
        if self.prefetcher is None:
            task = copy.copy(self.task)
            task.processor = copy.deepcopy(self.task.processor)  # its own tokenizer: HF's are not thread-safe
            self.prefetcher = Prefetcher(task.prepare)
        return self.prefetcher
