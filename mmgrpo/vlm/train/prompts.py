"""Drawing and preparing the prompts of a step: the stream share of this process, media decoding (optionally
prefetched in a background thread, ``data.prefetch``), skipped samples."""
from __future__ import annotations

import copy
import time
from typing import Sequence

from mmgrpo.vlm.train.stream import PromptStream, chain_epoch_hooks
from mmgrpo.vlm.data.task import BadSampleError, MissingMediaError, PreparedPrompt, sample_id
from mmgrpo.utils.logging import get_logger

log = get_logger("mmgrpo.train")

__all__ = ["PromptMixin"]


class PromptMixin:
    """``GRPOTrainer._make_stream`` / ``_draw`` / ``_prepare`` and the prefetcher."""

    def _make_stream(self) -> None:
        hooks = [m.on_epoch for m in self.methods if m.uses_epoch_hook]
        self.stream = PromptStream(len(self.samples), self.cfg.run.seed, self.cfg.data.shuffle,
                                   on_epoch=chain_epoch_hooks(hooks) if hooks else None)

    def _prepare(self, drawn: Sequence[tuple]) -> list[tuple[int, PreparedPrompt, list[int] | None]]:
        """(stream position, prepared prompt, generation indices this process samples or None = all)."""
        out = []
        t0 = time.perf_counter()
        for pos, idx, gens in drawn:
            s = self.samples[idx]
            try:
                out.append((pos, self._prepare_sample(pos, idx, s), gens))
            except MissingMediaError as e:
                if self.cfg.data.on_missing_media == "error":
                    raise
                self.counters["skipped_missing_media"] += 1
                log.warning("skipping sample %s (index %d): %s", sample_id(s), idx, e)
            except BadSampleError as e:
                if self.cfg.data.on_bad_sample == "error":
                    raise
                self.counters["skipped_bad_samples"] += 1
                log.warning("skipping sample (index %d): %s (data.on_bad_sample=skip)", idx, e)
        self._data_wait = getattr(self, "_data_wait", 0.0) + time.perf_counter() - t0
        return out

    def _prepare_sample(self, pos: int, idx: int, s):
        pf = self._get_prefetcher()
        return self.task.prepare(s) if pf is None else pf.get(self._sample_key(pos, idx), s, inline=self.task.prepare)

    def _get_prefetcher(self):
        if self.cfg.data.prefetch <= 0:
            return None
        if getattr(self, "_prefetcher", None) is None:
            from mmgrpo.vlm.data.prefetch import Prefetcher

            task = copy.copy(self.task)
            task.processor = copy.deepcopy(self.task.processor)  # its own tokenizer: HF's are not thread-safe
            self._prefetcher = Prefetcher(task.prepare)
        return self._prefetcher

    def _prefetch_ahead(self, current: Sequence[tuple] = ()) -> None:
        """Hint the samples of the next ``data.prefetch`` draws (on a copy of the stream), stopping before an epoch
        boundary that runs a data re-selection (it may change the data).  ``current``: the batch just drawn and not
        yet prepared (``_draw``'s output); its pending samples stay pending."""
        pf = self._get_prefetcher()
        if pf is None:
            return
        keep = [self._sample_key(pos, idx) for pos, idx, _ in current]
        st = copy.copy(self.stream)
        hook, st.on_epoch = st.on_epoch, None
        upcoming = []
        for _ in range(self.cfg.data.prefetch):
            if hook is not None and st.offset + self.prompts_per_step > st.n:
                break
            upcoming += [(self._sample_key(pos, idx), self.samples[idx]) for pos, idx, _ in self._draw(st)]
        pf.schedule(upcoming, keep=keep)

    def _sample_key(self, pos: int, idx: int) -> tuple:
        # keyed by the sample object too: a data re-selection may map the same index to another sample
        return pos, idx, id(self.samples[idx])

    def _close_prefetch(self) -> None:
        pf = getattr(self, "_prefetcher", None)
        if pf is not None:
            pf.close()
            self._prefetcher = None

    def _draw(self, stream=None) -> list[tuple[int, int, list[int] | None]]:
        """This process's share of the next global prompt batch (all processes advance the stream equally).

        Global row r = k * G + g (prompt k of the step, generation g); process i owns rows [i R/W, (i+1) R/W).
        When the prompts divide evenly, that is whole groups (``gens`` None); otherwise a group may be split and
        ``gens`` lists the generation indices sampled here (their seeds do not depend on the split)."""
        P, W = self.prompts_per_step, self.world
        drawn = (self.stream if stream is None else stream).take(P)
        if not self.split_groups:
            k = P // W
            return [(pos, idx, None) for pos, idx in drawn[self.rank * k:(self.rank + 1) * k]]
        G = self.cfg.rollout.group_size
        lo, hi = self.rank * P * G // W, (self.rank + 1) * P * G // W
        out = []
        for k, (pos, idx) in enumerate(drawn):
            gens = [g for g in range(G) if lo <= k * G + g < hi]
            if gens:
                out.append((pos, idx, gens))
        return out
