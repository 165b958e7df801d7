"""Cross-process helpers of the flow trainer: one collective each, identities without a process group (a single
process, or torch.distributed not initialised)."""
from __future__ import annotations

from typing import Any, Optional

import torch

from mmgrpo.engine.errors import RewardCallFailed


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 else None


def _reduce(values: list[float], op: str, device) -> list[float]:
    """All-reduce a list of floats (``op``: sum | max) in one collective; identity without a process group."""
    d = _dist()
    if d is None:
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    d.all_reduce(t, op=d.ReduceOp.SUM if op == "sum" else d.ReduceOp.MAX)
    return t.cpu().tolist()


def _all_gather_object(obj: Any) -> list:
    d = _dist()
    if d is None:
        return [obj]
    out: list = [None] * d.get_world_size()
    d.all_gather_object(out, obj)
    return out


def _broadcast_object(obj: Any) -> Any:
    d = _dist()
    if d is None:
        return obj
    box = [obj]
    d.broadcast_object_list(box, src=0)
    return box[0]


def _barrier() -> None:
    d = _dist()
    if d is not None:
        d.barrier()


def _gather_rows(tensors: list[torch.Tensor], device) -> tuple[list[torch.Tensor], slice]:
    """:func:`mmgrpo.core.gather_groups` on ``device`` (NCCL needs CUDA tensors); results back on the CPU."""
    from mmgrpo.core import gather_groups

    outs, sl = gather_groups([t.to(device) for t in tensors])
    return [o.cpu() for o in outs], sl



def sync_failure(exc: Optional[BaseException]) -> None:
    """Raise :class:`RewardCallFailed` on every process if it was raised on any (keeps collectives in step)."""
    msgs = _all_gather_object(None if exc is None else str(exc))
    bad = [(r, m) for r, m in enumerate(msgs) if m is not None]
    if bad:
        raise RewardCallFailed("; ".join(f"process {r}: {m}" for r, m in bad)) from exc
