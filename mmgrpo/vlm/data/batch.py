"""The rollout batch of one step (``RolloutBatch``) and how it is joined and cut into micro-batches."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

__all__ = ["RolloutBatch", "batch_from_rows", "cat_batches", "empty_batch", "keep_first_groups", "micro_batches"]


@dataclass
class RolloutBatch:
    """All rows of one step on this process.  Rows of a group are contiguous; group id = stream position."""

    items: list[dict]  # per row: processor output of its prompt (shared objects across the group)
    samples: list[Any]
    texts: list[str]
    completion_ids: torch.Tensor  # (N, T)
    completion_mask: torch.Tensor  # (N, T) real tokens
    loss_mask: torch.Tensor  # (N, T) the tokens that enter the loss and its counts (methods may narrow it)
    group_ids: torch.Tensor  # (N,) int64
    is_offpolicy: torch.Tensor  # (N,) bool (TempSamp ground-truth rows)
    truncated: torch.Tensor  # (N,) bool
    parse_failed: torch.Tensor  # (N,) bool
    rewards: dict[str, torch.Tensor]  # name -> (N,), includes "total"
    rollout_logp: torch.Tensor  # (N, T) sampling log-probs (0 on off-policy rows)
    advantages: torch.Tensor | None = None
    reward_used: torch.Tensor | None = None  # rewards entering the advantage (after shaping / bonus)
    zero_std: torch.Tensor | None = None  # (N,) bool
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    token_weights: torch.Tensor | None = None
    info: dict[str, float] = field(default_factory=dict)
    valid: torch.Tensor | None = None  # (N,) bool: False = reward failed / non-finite (dropped after advantages)
    prompts: list | None = None  # per row: its PreparedPrompt (the group's prompt; methods read reward_sample, clip)

    @property
    def n(self) -> int:
        return self.completion_ids.shape[0]

    def select(self, rows: torch.Tensor) -> "RolloutBatch":
        idx = rows.tolist()
        pick = (lambda t: None if t is None else t[rows])
        return RolloutBatch(
            items=[self.items[i] for i in idx], samples=[self.samples[i] for i in idx],
            texts=[self.texts[i] for i in idx], completion_ids=self.completion_ids[rows],
            completion_mask=self.completion_mask[rows], loss_mask=self.loss_mask[rows], group_ids=self.group_ids[rows],
            is_offpolicy=self.is_offpolicy[rows], truncated=self.truncated[rows], parse_failed=self.parse_failed[rows],
            rewards={k: v[rows] for k, v in self.rewards.items()}, rollout_logp=self.rollout_logp[rows],
            advantages=pick(self.advantages), reward_used=pick(self.reward_used), zero_std=pick(self.zero_std),
            old_logp=pick(self.old_logp), ref_logp=pick(self.ref_logp), token_weights=pick(self.token_weights),
            info=dict(self.info), valid=pick(self.valid),
            prompts=None if self.prompts is None else [self.prompts[i] for i in idx])


def _pad_cols(t: torch.Tensor, T: int, value=0) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, T - t.shape[1]), value=value) if t.shape[1] < T else t[:, :T]


def cat_batches(bs: Sequence[RolloutBatch], pad_id: int) -> RolloutBatch:
    bs = [b for b in bs if b.n > 0]
    if len(bs) == 1:
        return bs[0]
    T = max(b.completion_ids.shape[1] for b in bs)

    def cat(get, value=0):
        vals = [get(b) for b in bs]
        if any(v is None for v in vals):
            return None
        if vals[0].dim() == 2:
            vals = [_pad_cols(v, T, value) for v in vals]
        return torch.cat(vals)

    info: dict[str, float] = {}
    for b in bs:
        for k, v in b.info.items():
            info[k] = info.get(k, 0.0) + v
    return RolloutBatch(
        items=sum((b.items for b in bs), []), samples=sum((b.samples for b in bs), []),
        texts=sum((b.texts for b in bs), []), completion_ids=cat(lambda b: b.completion_ids, pad_id),
        completion_mask=cat(lambda b: b.completion_mask), loss_mask=cat(lambda b: b.loss_mask),
        group_ids=cat(lambda b: b.group_ids),
        is_offpolicy=cat(lambda b: b.is_offpolicy), truncated=cat(lambda b: b.truncated),
        parse_failed=cat(lambda b: b.parse_failed),
        rewards={k: torch.cat([b.rewards[k] for b in bs]) for k in bs[0].rewards},
        rollout_logp=cat(lambda b: b.rollout_logp), advantages=cat(lambda b: b.advantages),
        reward_used=cat(lambda b: b.reward_used), zero_std=cat(lambda b: b.zero_std),
        old_logp=cat(lambda b: b.old_logp), ref_logp=cat(lambda b: b.ref_logp),
        token_weights=cat(lambda b: b.token_weights, 1.0), info=info, valid=cat(lambda b: b.valid),
        prompts=None if any(b.prompts is None for b in bs) else sum((b.prompts for b in bs), []))


def micro_batches(group_ids: torch.Tensor, max_rows: int) -> list[torch.Tensor]:
    """Row indices of micro-batches made of whole groups (<= max_rows rows unless one group is larger)."""
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids.tolist()):
        groups.setdefault(g, []).append(i)
    out, cur = [], []
    for rows in groups.values():
        if cur and len(cur) + len(rows) > max_rows:
            out.append(torch.tensor(cur))
            cur = []
        cur.extend(rows)
    if cur:
        out.append(torch.tensor(cur))
    return out


def empty_batch() -> RolloutBatch:
    """A batch with no rows (a process without prompts still runs the step's collectives)."""
    z = torch.zeros(0, 1)
    no = torch.zeros(0, dtype=torch.bool)
    return RolloutBatch(items=[], samples=[], texts=[], completion_ids=z.long(), completion_mask=z.long(),
                        loss_mask=z.long(), prompts=[],
                        group_ids=torch.zeros(0, dtype=torch.long), is_offpolicy=no, truncated=no.clone(),
                        parse_failed=no.clone(), rewards={"total": torch.zeros(0)}, rollout_logp=z,
                        advantages=torch.zeros(0), reward_used=torch.zeros(0), zero_std=no.clone(),
                        valid=no.clone())


def keep_first_groups(group_ids: torch.Tensor, want: int) -> torch.Tensor:
    """Rows of the first ``want`` groups (in row order; a group's rows are contiguous)."""
    first = torch.unique_consecutive(group_ids)[:want]
    return torch.isin(group_ids, first).nonzero().flatten()


TOOL_COUNTS = ("turns", "tool_calls", "tool_failures", "visual_tokens", "tool_tokens", "later_prefill_tokens",
               "later_reused_tokens")  # the last two: prefill of the later turns, and what their cache served


def batch_from_rows(rows: list[dict], pad_id: int, rewards: dict[str, torch.Tensor], parse_failed: torch.Tensor,
                    info: dict[str, float]) -> RolloutBatch:
    """The sampled ``rows`` (dicts: ``ids``, ``mask``, ``text``, ``lp``, ``pp`` = its prepared prompt, ``group``,
    ``offpolicy``, ``truncated``; a multi-turn row also ``item``, ``loss_mask``, ``turn_info``) padded into one
    batch with their ``rewards`` (name -> (N,) float) and ``parse_failed``. A multi-turn row's tool counts become
    rewards ``tools/<count>`` (logged as reward/tools/<count>/mean); ``valid`` is left to the caller."""
    Tm = max(len(r["ids"]) for r in rows)
    pad1 = lambda x, v: torch.nn.functional.pad(x, (0, Tm - x.shape[0]), value=v)  # noqa: E731
    rewards = dict(rewards)
    if any("turn_info" in r for r in rows):
        for k in TOOL_COUNTS:
            rewards[f"tools/{k}"] = torch.tensor([float(r.get("turn_info", {}).get(k, 0)) for r in rows])
    mask = torch.stack([pad1(r["mask"].long(), 0) for r in rows])
    loss_mask = torch.stack([pad1(r["loss_mask"].long(), 0) if "loss_mask" in r else pad1(r["mask"].long(), 0)
                             for r in rows])
    return RolloutBatch(items=[r.get("item", r["pp"].item) for r in rows], samples=[r["pp"].sample for r in rows],
                        texts=[r["text"] for r in rows], prompts=[r["pp"] for r in rows],
                        completion_ids=torch.stack([pad1(r["ids"], pad_id) for r in rows]),
                        completion_mask=mask, loss_mask=loss_mask,
                        group_ids=torch.tensor([r["group"] for r in rows], dtype=torch.long),
                        is_offpolicy=torch.tensor([r["offpolicy"] for r in rows]),
                        truncated=torch.tensor([r["truncated"] for r in rows]), parse_failed=parse_failed,
                        rewards=rewards, rollout_logp=torch.stack([pad1(r["lp"].float(), 0.0) for r in rows]),
                        info=dict(info))
