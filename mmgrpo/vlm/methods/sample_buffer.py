r"""Skywork R1V2's Selective Sample Buffer (``methods.sample_buffer``): trajectory replay of high-value samples
against vanishing advantages.

After the advantages, every group of the step whose on-policy rows have non-zero advantages enters a buffer (those
rows, with their completions, advantages and prompts) with priority :math:`\mathrm{mean}_i |A_i|`; the buffer keeps
the ``capacity`` most recent groups. Then, for each group of the step whose advantages are all zero (no gradient: all
answers equally good), one buffered group from an *earlier* step is appended to the batch, drawn without replacement
with probability proportional to its priority (seeded by ``run.seed`` and the step), at most
``max_share`` x (the step's groups) per step; a drawn group leaves the buffer after ``max_reuse`` replays.

A replayed row is an old completion trained with its stored advantage: it is marked off-policy
(``is_offpolicy``: out of the step's reward metrics and of the group statistics of later methods), its old log-prob
is the current policy's (ratio 1 at the first update, as for every row without ``algo.num_iterations > 1``), i.e. no
importance correction for its staleness (a choice, as R1V2 does not publish one). The buffer is checkpointed (each
process's own; the stored rows' tensors, their prompts as references to their samples:
:mod:`mmgrpo.vlm.data.buffer_state`). Metrics: ``sample_buffer/replayed``
(groups appended this step), ``sample_buffer/buffer`` (its size), ``sample_buffer/zero_groups``.
"""
from __future__ import annotations

import torch

from mmgrpo.utils.seeding import sample_seed
from mmgrpo.vlm.methods.base import VLMMethod
from mmgrpo.vlm.data.batch import cat_batches
from mmgrpo.vlm.data.buffer_state import PromptCodec

__all__ = ["group_priorities", "draw_weighted", "SampleBuffer"]


def group_priorities(adv: torch.Tensor, group_ids: torch.Tensor, rows: torch.Tensor) -> dict[int, float]:
    """``{group id: mean |A| over its rows that take part}`` for the groups with a non-zero advantage."""
    out = {}
    for g in torch.unique(group_ids[rows]).tolist():
        a = adv[(group_ids == g) & rows].abs().double()
        if bool((a > 0).any()):
            out[int(g)] = float(a.mean())
    return out


def draw_weighted(priorities: list[float], k: int, seed: int) -> list[int]:
    """``k`` distinct indices drawn with probability proportional to ``priorities`` (all of them when k >= n)."""
    n = len(priorities)
    if k >= n:
        return list(range(n))
    if k <= 0:
        return []
    g = torch.Generator().manual_seed(int(seed) % (2**63))
    w = torch.tensor(priorities, dtype=torch.float64).clamp_min(1e-12)
    return torch.multinomial(w, k, replacement=False, generator=g).tolist()


class SampleBuffer(VLMMethod):
    name = "sample_buffer"
    needs_whole_groups = True  # a group's advantages; replayed groups are whole
    state_per_process = True  # the buffer holds this process's groups

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.sample_buffer
        if o.enabled and (o.capacity < 1 or o.max_reuse < 1 or not 0.0 <= o.max_share <= 1.0):
            raise ValueError("methods.sample_buffer: need capacity >= 1, max_reuse >= 1, 0 <= max_share <= 1")
        if o.enabled and (cfg.methods.luffy.enabled or cfg.methods.chord.enabled):
            raise ValueError("methods.sample_buffer marks replayed rows off-policy, which methods.luffy / "
                             "methods.chord would train as expert traces: enable one of them")

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.o = cfg.methods.sample_buffer
        self.entries: list[list] = []  # [priority, batch of the group's rows, step stored, uses]
        self._replayed = self._zero = 0
        self._next_id = -1  # replayed groups get fresh negative ids (never a stream position)

    def on_advantages(self, rb):
        if rb.n == 0 or rb.advantages is None:
            return rb
        step = self.run.state.step
        rows = ~rb.is_offpolicy & (rb.valid if rb.valid is not None else torch.ones(rb.n, dtype=torch.bool))
        prio = group_priorities(rb.advantages, rb.group_ids, rows)
        groups = torch.unique(rb.group_ids[rows]).tolist()
        zero = [g for g in groups if g not in prio]
        self._zero += len(zero)
        # replay first (entries of earlier steps only), then store this step's groups
        old = [i for i, e in enumerate(self.entries) if e[2] < step]
        k = min(len(zero), int(self.o.max_share * len(groups)), len(old))
        pick = [old[j] for j in draw_weighted([self.entries[i][0] for i in old], k,
                                              sample_seed(self.cfg.run.seed, step, 7919))]
        add = []
        for i in pick:
            e = self.entries[i]
            b = e[1].select(torch.arange(e[1].n))
            b.group_ids = torch.full((b.n,), self._next_id, dtype=torch.long)
            self._next_id -= 1
            add.append(b)
            e[3] += 1
        self.entries = [e for e in self.entries if e[3] < self.o.max_reuse]
        self._replayed += len(add)
        for g, p in prio.items():
            idx = ((rb.group_ids == g) & rows).nonzero().flatten()
            b = rb.select(idx)
            b.is_offpolicy = torch.ones(b.n, dtype=torch.bool)
            b.old_logp = b.ref_logp = b.token_weights = None
            self.entries.append([p, b, step, 0])
        self.entries = self.entries[-self.o.capacity:]
        if not add:
            return rb
        for b in add:  # the columns the step's batch has (methods may have added token weights later)
            b.info = {}
            b.zero_std = torch.zeros(b.n, dtype=torch.bool)
            b.valid = torch.ones(b.n, dtype=torch.bool)
            b.reward_used = b.rewards["total"].clone()
            b.rewards = {k: b.rewards.get(k, torch.full((b.n,), float("nan"))).to(v.dtype)
                         for k, v in rb.rewards.items()}
        out = cat_batches([rb] + add, self.run.pad_id)
        out.info = dict(rb.info)
        return out

    def end_of_step(self, rb, metrics: dict) -> None:
        metrics["sample_buffer/replayed"] = float(self._replayed)
        metrics["sample_buffer/zero_groups"] = float(self._zero)
        metrics["sample_buffer/buffer"] = float(len(self.entries))
        self._replayed = self._zero = 0

    def state_dict(self) -> dict:
        codec = PromptCodec(self.run.all_samples, self.run.task)
        return {"entries": [[prio, codec.batch_state(b), stored, uses] for prio, b, stored, uses in self.entries],
                "next_id": self._next_id}

    def load_state_dict(self, sd: dict) -> None:
        codec = PromptCodec(self.run.all_samples, self.run.task)
        self.entries = [[float(prio), codec.batch_from_state(b), int(stored), int(uses)]
                        for prio, b, stored, uses in sd["entries"]]
        self._next_id = int(sd["next_id"])
