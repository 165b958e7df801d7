"""The rollout batch (mmgrpo.vlm.data.batch): RolloutBatch.select / cat_batches carry every field (built by keyword
now; a field added later without updating them would be caught here); micro-batches keep groups whole."""
import dataclasses

import torch

from mmgrpo.vlm.data.batch import RolloutBatch, cat_batches, micro_batches


def _batch(n: int, T: int, start: int) -> RolloutBatch:
    r = torch.arange(start, start + n)
    f = r.double()
    col = lambda v: (f[:, None] + v * torch.arange(T)).float()  # noqa: E731 - distinct (N, T) values per field
    return RolloutBatch(
        items=[{"i": int(i)} for i in r], samples=[f"s{i}" for i in r.tolist()], texts=[f"t{i}" for i in r.tolist()],
        completion_ids=col(1).long(), completion_mask=torch.ones(n, T, dtype=torch.long),
        loss_mask=(col(1).long() % 3 != 0).long(), group_ids=r // 2,
        is_offpolicy=r % 2 == 0, truncated=r % 3 == 0, parse_failed=r % 5 == 0,
        rewards={"total": f.float(), "iou": -f.float()}, rollout_logp=col(0.5), advantages=f.float() * 2,
        reward_used=f.float() * 3, zero_std=r % 7 == 0, old_logp=col(0.25), ref_logp=col(0.125),
        token_weights=col(2.0), info={"k": float(start)}, valid=r % 4 != 0, prompts=[f"p{i}" for i in r.tolist()])


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def test_select_and_cat_keep_every_field():
    names = [f.name for f in dataclasses.fields(RolloutBatch)]
    assert len(names) == 21
    a, b = _batch(4, 3, 0), _batch(2, 3, 4)
    both = cat_batches([a, b], pad_id=0)
    whole = _batch(6, 3, 0)
    for k in names:
        want = {"k": 4.0} if k == "info" else getattr(whole, k)  # info values are summed
        assert _same(getattr(both, k), want), k
    rows = torch.tensor([5, 1, 2])
    sub = both.select(rows)
    for k in names:
        v = getattr(both, k)
        if isinstance(v, torch.Tensor):
            want = v[rows]
        elif isinstance(v, dict) and k == "rewards":
            want = {kk: vv[rows] for kk, vv in v.items()}
        elif k == "info":
            want = dict(v)
        else:
            want = [v[i] for i in rows.tolist()]
        assert _same(getattr(sub, k), want), k


def test_micro_batches_keep_groups_whole():
    g = torch.tensor([5, 5, 5, 9, 9, 9, 2, 2, 2, 7, 7, 7])
    mbs = micro_batches(g, max_rows=7)
    assert [m.tolist() for m in mbs] == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    assert [m.tolist() for m in micro_batches(g, 2)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
