"""Prepare (decode + preprocess) the next batches' samples in a background thread while the current step trains.

``Prefetcher`` is a cache of futures keyed by (stream position, sample index): the trainer asks for the sample it
is about to use with ``get``; a prefetched result is returned (after waiting for it if needed), anything else is
prepared inline.  Which samples come next is only a hint (``schedule``), never a decision: the data stream is not
advanced by prefetching, so a checkpoint records the position of the batch being trained, and a wrong guess costs
work, not correctness.  Preparing a sample is deterministic (the same sample gives the same tensors), so results do
not depend on timing.  One worker thread processes the hinted samples in order; at most the hinted batches are
pending (older hints are cancelled).
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Hashable, Iterable, Sequence


class Prefetcher:
    def __init__(self, prepare: Callable[[Any], Any]):
        self.prepare = prepare
        self._pool: ThreadPoolExecutor | None = ThreadPoolExecutor(1, thread_name_prefix="mmgrpo-prefetch")
        self._pending: dict[Hashable, Future] = {}
        self.wait_seconds = 0.0  # time spent in ``get`` (waiting for a prefetched result or preparing inline)
        self.hits = 0
        self.misses = 0

    def schedule(self, upcoming: Sequence[tuple[Hashable, Any]], keep: Iterable[Hashable] = ()) -> None:
        """The samples expected next, in order: start the new ones, cancel pending ones no longer expected.

        ``keep``: keys about to be collected with ``get`` (the current batch, when the next one is hinted before it
        is collected): left pending if they are, never started if they are not."""
        if self._pool is None:
            return
        want = {k for k, _ in upcoming} | set(keep)
        for k in [k for k in self._pending if k not in want]:
            self._pending.pop(k).cancel()
        for k, sample in upcoming:
            if k not in self._pending:
                self._pending[k] = self._pool.submit(self.prepare, sample)

    def get(self, key: Hashable, sample: Any, inline: Callable[[Any], Any] | None = None) -> Any:
        """The prepared ``sample`` (its exception re-raised, as inline); prepared now if it was not prefetched."""
        t0 = time.perf_counter()
        fut = self._pending.pop(key, None)
        try:
            if fut is None or fut.cancelled():
                self.misses += 1
                return (inline or self.prepare)(sample)
            self.hits += 1
            return fut.result()
        finally:
            self.wait_seconds += time.perf_counter() - t0

    def close(self) -> None:
        """Cancel what has not started, wait for the running preparation, stop the thread."""
        for f in self._pending.values():
            f.cancel()
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


__all__ = ["Prefetcher"]
