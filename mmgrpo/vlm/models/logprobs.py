"""The log-probs of a micro-batch of sampled rows, the one function the old, reference and current policy all go
through (so on-policy ratios are exactly 1: same function, same padding).

:class:`TokenLogprobs` holds how a run scores (``run.logprob_impl``: ``prefix_group`` forwards each group's shared
prompt once, :func:`mmgrpo.vlm.models.prefix_group.grouped_rows_token_logprobs`; ``naive`` collates the rows'
prompts and runs :func:`mmgrpo.vlm.models.rollout.compute_token_logprobs`), the sampling temperature, the tokens the
sampler never emits, the device, the output head's chunk size (``algo.logprob_chunk_size``) and the autocast
context of the run's mixed precision; :meth:`TokenLogprobs.rows` scores rows of a batch with any model (policy or
reference).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Sequence

import torch

from mmgrpo.vlm.models.prefix_group import grouped_rows_token_logprobs
from mmgrpo.vlm.models.rollout import batch_to, collate_prompts, compute_token_logprobs

__all__ = ["TokenLogprobs"]


@dataclass(frozen=True)
class TokenLogprobs:
    impl: str  # "prefix_group" | "naive"
    pad_id: int
    temperature: float
    suppress_token_ids: Sequence[int] | None
    device: Any
    chunk_size: int  # output-head tokens at a time (0: full logits)
    autocast: Callable[[], ContextManager]  # the mixed-precision context (accelerator.autocast)

    def rows(self, model, rb, idx: torch.Tensor, return_logits: bool = False):
        """(len(idx), T) log-probs of the rows ``idx`` of ``rb`` (a rollout batch: ``items``, ``completion_ids``,
        ``completion_mask``), T = their longest completion; with ``return_logits`` also what the head saw."""
        T = max(1, int(rb.completion_mask[idx].sum(1).max()))
        items = [rb.items[i] for i in idx.tolist()]
        if self.impl == "prefix_group":
            with self.autocast():
                return grouped_rows_token_logprobs(
                    model, items, rb.completion_ids[idx, :T], rb.completion_mask[idx, :T], self.pad_id,
                    self.temperature, self.suppress_token_ids, return_logits=return_logits, device=self.device,
                    chunk_size=self.chunk_size)
        batch = batch_to(collate_prompts(items, self.pad_id), self.device)
        ids, mask = rb.completion_ids[idx, :T].to(self.device), rb.completion_mask[idx, :T].to(self.device)
        with self.autocast():
            return compute_token_logprobs(model, batch, ids, mask, self.temperature, self.suppress_token_ids,
                                          return_logits=return_logits, chunk_size=self.chunk_size)
