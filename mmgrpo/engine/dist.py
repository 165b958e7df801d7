"""Cross-process reductions shared by both trainers: one collective each, identities without a process group
(a single process, or ``torch.distributed`` not initialised), so single-process code needs no branches.

Every function is collective: all processes call it in the same order.  Floats are reduced in float64; the
reduction tensor goes to ``device`` if given, else to CUDA when the backend is NCCL (which needs CUDA tensors),
else stays on the CPU.

Replicated rows (sequence parallelism, :func:`set_row_source`): the processes of a sequence-parallel group hold the
same samples. A process whose rows are another process's copy contributes nothing to sums (``all_reduce(op="sum")``,
:func:`global_sum`) and no rows to gathers (:func:`gather_groups`, :func:`gather_rows`), so each sample counts once;
it still receives the results, and its gather slice is its source's rows. Max reductions (stop flags, budgets),
broadcasts, object gathers and barriers are unchanged: they run over every process.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

__all__ = ["process_group", "world_info", "set_row_source", "row_source", "all_reduce", "global_sum", "global_max", "any_process", "all_gather_object",
           "broadcast_object", "barrier", "gather_groups", "gather_rows"]


def process_group():
    """``torch.distributed`` if a process group with more than one process is running, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 else None


def world_info() -> tuple[int, int]:
    """(rank, world_size); (0, 1) when torch.distributed is not initialised."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


_ROW_SOURCE: Optional[int] = None  # the process whose rows this process holds (None: its own)


def set_row_source(rank: Optional[int]) -> None:
    """Declare this process's rows a copy of process ``rank``'s (a sequence-parallel group's first process), or its
    own (``None``, the default): see the module docstring. Every process of the group calls it with the same rank."""
    global _ROW_SOURCE
    _ROW_SOURCE = None if rank is None else int(rank)


def row_source() -> Optional[int]:
    """The rank given to :func:`set_row_source` (None: this process's rows are its own)."""
    return _ROW_SOURCE


def _is_copy(d) -> bool:
    return _ROW_SOURCE is not None and _ROW_SOURCE != d.get_rank()


def _device(d, device):
    if device is not None:
        return device
    return "cuda" if d.get_backend() == "nccl" and torch.cuda.is_available() else "cpu"


def all_reduce(values: Sequence[float], op: str = "sum", device=None) -> list[float]:
    """All-reduce a list of floats (``op``: sum | max) in one collective; identity without a process group."""
    if op not in ("sum", "max"):
        raise ValueError(f"op must be 'sum' or 'max', got {op!r}")
    d = process_group()
    if d is None:
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_device(d, device))
    if op == "sum" and _is_copy(d):
        t.zero_()  # replicated rows: counted by their source process only
    d.all_reduce(t, op=d.ReduceOp.SUM if op == "sum" else d.ReduceOp.MAX)
    return t.cpu().tolist()


def global_sum(x: float | torch.Tensor, device=None) -> float:
    """Sum of a scalar over processes (e.g. the global token count for ``aggregate_loss(num_tokens=...)``)."""
    return all_reduce([float(x)], "sum", device)[0]


def global_max(x: float | torch.Tensor, device=None) -> float:
    """Max of a scalar over processes (e.g. "does any process want to stop", the longest micro-batch plan)."""
    return all_reduce([float(x)], "max", device)[0]


def any_process(flag: bool, device=None) -> bool:
    """True on every process if ``flag`` is true on any (a stop request, an exhausted time budget, a non-finite
    loss): every process then takes the same branch, so the collectives stay in step."""
    return global_max(float(bool(flag)), device) > 0


def all_gather_object(obj: Any) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` (picklable objects); ``[obj]`` without a process group."""
    d = process_group()
    if d is None:
        return [obj]
    out: list = [None] * d.get_world_size()
    d.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every process; ``obj`` itself without a process group."""
    d = process_group()
    if d is None:
        return obj
    box = [obj]
    d.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    """Wait for every process; no-op without a process group."""
    d = process_group()
    if d is not None:
        d.barrier()


_MAX_DIMS = 8
_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
           torch.float32, torch.float64, torch.complex64, torch.complex128)


def _layout(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """(len(tensors), 2 + _MAX_DIMS) long: dtype code, ndim and shape of each tensor (-1 padded)."""
    rows = []
    for t in tensors:
        if t.dim() > _MAX_DIMS:
            raise ValueError(f"gather_groups supports tensors of at most {_MAX_DIMS} dims, got shape "
                             f"{tuple(t.shape)}")
        code = _DTYPES.index(t.dtype) if t.dtype in _DTYPES else -1
        rows.append([code, t.dim()] + list(t.shape) + [-1] * (_MAX_DIMS - t.dim()))
    return torch.tensor(rows, dtype=torch.long)


def _describe(row: torch.Tensor) -> str:
    code, nd = int(row[0]), int(row[1])
    dtype = _DTYPES[code] if 0 <= code < len(_DTYPES) else "other dtype"
    return f"shape {tuple(int(d) for d in row[2:2 + nd])} {dtype}"


def gather_groups(tensors: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], slice]:
    """All-gather variable-length tensors along dim 0, concatenated in rank order.

    The shapes and dtypes are gathered first: only dim 0 may differ between processes.  A tensor whose other dims
    (or dtype) differ raises ``ValueError`` on every process alike, naming the shapes; without this check gloo
    aborts the process ("Received data size doesn't match expected size") and NCCL may hang.

    Args:
        tensors: local tensors that share their first dimension n_local (which may differ per process).

    Returns:
        (gathered tensors, slice of this process's rows in the gathered tensors).
    """
    rank, world = world_info()
    n_local = tensors[0].shape[0]
    if any(t.shape[0] != n_local for t in tensors):
        raise ValueError("all tensors passed to gather_groups must share dim 0")
    if world == 1:
        return list(tensors), slice(0, n_local)
    import torch.distributed as d

    source = rank if _ROW_SOURCE is None else _ROW_SOURCE
    if source != rank:  # replicated rows: gathered from their source process only
        tensors = [t[:0] for t in tensors]
    dev = tensors[0].device
    mine = _layout(tensors).to(dev)
    layouts_t = [torch.empty_like(mine) for _ in range(world)]
    d.all_gather(layouts_t, mine)
    layouts = [x.cpu() for x in layouts_t]
    for i in range(len(tensors)):
        rest = {tuple(x[i, [0, 1]].tolist()) + tuple(x[i, 3:].tolist()) for x in layouts}
        if len(rest) > 1:
            shapes = "; ".join(f"process {r}: {_describe(x[i])}" for r, x in enumerate(layouts))
            raise ValueError(f"gather_groups: tensor {i} differs between processes in more than dim 0 ({shapes}); "
                             "only the number of rows may differ")
    sizes = [int(x[0, 2]) for x in layouts]
    max_n = max(sizes)
    out = []
    for t in tensors:
        pad = torch.zeros((max_n - t.shape[0],) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
        padded = torch.cat([t.contiguous(), pad], dim=0)
        parts = [torch.empty_like(padded) for _ in range(world)]
        d.all_gather(parts, padded)
        out.append(torch.cat([p[:s] for p, s in zip(parts, sizes)], dim=0))
    offset = sum(sizes[:source])
    return out, slice(offset, offset + sizes[source])


def gather_rows(tensors: list[torch.Tensor], device: Optional[Any] = None) -> tuple[list[torch.Tensor], slice]:
    """:func:`gather_groups` on ``device`` (NCCL needs CUDA tensors); results back on the CPU.
    Returns the gathered tensors and the slice of this process's rows."""
    outs, sl = gather_groups([t.to(device) if device is not None else t for t in tensors])
    return [o.cpu() for o in outs], sl
