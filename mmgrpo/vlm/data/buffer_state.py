"""Checkpoint state of the prompts and rollout rows that methods keep across steps (Prompt Replay's prompt buffer,
the selective sample buffer's stored groups, ReLIFT's hardest questions).

Checkpoint entries hold only tensors, numbers, strings, lists and dicts (they are read with
``torch.load(weights_only=True)``), and a :class:`~mmgrpo.vlm.data.task.PreparedPrompt` holds decoded media and
processor output. So a prompt is written as a reference to its sample (its index in the run's ``all_samples``, the
full data set, which data selection does not reorder) plus the prompt mode and hint a method may have rebuilt it with,
and read back by preparing that sample again through the run's task adapter: the same processor on the same sample
gives the same tensors, bit for bit. The one thing not restored: video frames a method replaced in the prompt
(DeepVideo-R1's augmentation) come back as the sample's own frames.

A :class:`~mmgrpo.vlm.data.batch.RolloutBatch` is written as its tensors, texts, rewards and info, with each
distinct prompt once (rows of a group share one prompt object, and share it again after the restore); a row's
``item`` is rebuilt from its prompt unless it had its own (a multi-turn row's, with tool media appended), which is
stored as is.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from mmgrpo.vlm.data.task import PreparedPrompt, TaskAdapter, sample_id
from mmgrpo.vlm.data.batch import RolloutBatch

__all__ = ["PromptCodec", "TENSOR_FIELDS"]

# the RolloutBatch fields that are tensors (or None); the others are written by hand (a test checks that every
# field is one or the other)
TENSOR_FIELDS = ("completion_ids", "completion_mask", "loss_mask", "group_ids", "is_offpolicy", "truncated",
                 "parse_failed", "rollout_logp", "advantages", "reward_used", "zero_std", "old_logp", "ref_logp",
                 "token_weights", "valid")


class PromptCodec:
    """Writes prompts and batches of one run as checkpoint state and reads them back. ``all_samples``: the run's full
    data set (prompts are written as indices into it); ``task``: the run's task adapter (prepares them again). One
    codec per ``state_dict`` / ``load_state_dict`` call: it indexes the samples once."""

    def __init__(self, all_samples: Sequence[Any], task: TaskAdapter):
        self.all_samples, self.task = all_samples, task
        self._by_object: dict[int, int] | None = None
        self._by_id: dict[str, int] | None = None

    # ------------------------------------------------------------------------------------------ prompts
    def sample_index(self, sample: Any) -> int:
        """The index of ``sample`` in ``all_samples``: the same object, else the one sample with its id."""
        if self._by_object is None:
            self._by_object = {id(s): i for i, s in enumerate(self.all_samples)}
        i = self._by_object.get(id(sample))
        if i is not None:
            return i
        if self._by_id is None:
            ids: dict[str, list[int]] = {}
            for j, s in enumerate(self.all_samples):
                ids.setdefault(sample_id(s), []).append(j)
            self._by_id = {k: v[0] for k, v in ids.items() if len(v) == 1}
        key = sample_id(sample)
        if key not in self._by_id:
            raise ValueError(f"checkpoint: a buffered prompt's sample {key!r} is not one of the run's samples (or "
                             f"its id is not unique), so it cannot be written as a reference to it")
        return self._by_id[key]

    def prompt_state(self, pp: PreparedPrompt) -> dict:
        return {"index": self.sample_index(pp.sample), "mode": pp.mode, "hint": pp.hint}

    def prompt_from_state(self, sd: dict) -> PreparedPrompt:
        task = self.task
        pp = task.prepare(self.all_samples[int(sd["index"])])
        if sd.get("mode") or sd.get("hint"):
            pp = task.rebuild(pp, mode=sd.get("mode"), hint=sd.get("hint") or "")
        return pp

    # ------------------------------------------------------------------------------------------ batches
    def batch_state(self, rb: RolloutBatch) -> dict:
        if rb.prompts is None:
            raise ValueError("checkpoint: a stored batch without its prompts (RolloutBatch.prompts) cannot be written")
        where: dict[int, int] = {}  # id(prompt) -> its place in "prompts"
        distinct, rows = [], []
        for pp in rb.prompts:
            if id(pp) not in where:
                where[id(pp)] = len(distinct)
                distinct.append(pp)
            rows.append(where[id(pp)])
        return {**{f: getattr(rb, f) for f in TENSOR_FIELDS},
                "texts": list(rb.texts), "rewards": dict(rb.rewards), "info": dict(rb.info),
                "prompts": [self.prompt_state(pp) for pp in distinct], "prompt_of_row": rows,
                # a row's own item (multi-turn: tool media appended); None: its prompt's
                "items": [None if it is pp.item else it for it, pp in zip(rb.items, rb.prompts)]}

    def batch_from_state(self, sd: dict) -> RolloutBatch:
        prompts = [self.prompt_from_state(p) for p in sd["prompts"]]
        pps = [prompts[j] for j in sd["prompt_of_row"]]
        return RolloutBatch(items=[pp.item if it is None else it for it, pp in zip(sd["items"], pps)],
                            samples=[pp.sample for pp in pps], texts=list(sd["texts"]), prompts=pps,
                            rewards=dict(sd["rewards"]), info=dict(sd["info"]),
                            **{f: sd[f] for f in TENSOR_FIELDS})

