"""Groups whose samples sit on several processes.

Each process holds a slice of the batch; a group may be split across processes (Flow-GRPO's
``DistributedKRepeatSampler`` does that on purpose). Advantages must then be computed on the gathered batch and
each process keeps its own rows, so the result equals the single-process computation bit for bit.

Built on ``torch.distributed`` as initialised by ``accelerate`` (``Accelerator()`` / ``PartialState()``):
every process calls these functions collectively. Without an initialised process group they are identities.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from mmgrpo.engine.dist import global_sum, world_info  # noqa: F401 - moved to the engine, kept importable here

from .advantages import AdvantageOutput, group_advantages

__all__ = ["gather_groups", "distributed_group_advantages", "global_sum", "world_info"]


_MAX_DIMS = 8
_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
           torch.float32, torch.float64, torch.complex64, torch.complex128)


def _layout(tensors: Sequence[Tensor]) -> Tensor:
    """(len(tensors), 2 + _MAX_DIMS) long: dtype code, ndim and shape of each tensor (-1 padded)."""
    rows = []
    for t in tensors:
        if t.dim() > _MAX_DIMS:
            raise ValueError(f"gather_groups supports tensors of at most {_MAX_DIMS} dims, got shape "
                             f"{tuple(t.shape)}")
        code = _DTYPES.index(t.dtype) if t.dtype in _DTYPES else -1
        rows.append([code, t.dim()] + list(t.shape) + [-1] * (_MAX_DIMS - t.dim()))
    return torch.tensor(rows, dtype=torch.long)


def gather_groups(tensors: Sequence[Tensor]) -> tuple[list[Tensor], slice]:
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
    dev = tensors[0].device
    mine = _layout(tensors).to(dev)
    layouts_t = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(layouts_t, mine)
    layouts = [x.cpu() for x in layouts_t]
    for i in range(len(tensors)):
        rest = {tuple(x[i, [0, 1]].tolist()) + tuple(x[i, 3:].tolist()) for x in layouts}
        if len(rest) > 1:
            shapes = "; ".join(f"process {r}: {_describe(x[i])}" for r, x in enumerate(layouts))
            raise ValueError(f"gather_groups: tensor {i} differs between processes in more than dim 0 ({shapes}); "
                             "only the number of rows may differ")
    sizes = [int(x[0, 2]) for x in layouts]
    max_n = max(sizes)
    offset = sum(sizes[:rank])
    out = []
    for t in tensors:
        pad = torch.zeros((max_n - n_local,) + tuple(t.shape[1:]), dtype=t.dtype, device=t.device)
        padded = torch.cat([t.contiguous(), pad], dim=0)
        parts = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(parts, padded)
        out.append(torch.cat([p[:s] for p, s in zip(parts, sizes)], dim=0))
    return out, slice(offset, offset + n_local)


def _describe(row: Tensor) -> str:
    code, nd = int(row[0]), int(row[1])
    dtype = _DTYPES[code] if 0 <= code < len(_DTYPES) else "other dtype"
    return f"shape {tuple(int(d) for d in row[2:2 + nd])} {dtype}"


def distributed_group_advantages(
    rewards: Tensor, group_ids: Tensor, valid: Tensor | None = None, **adv_kwargs
) -> AdvantageOutput:
    """:func:`group_advantages` over the samples of all processes; returns this process's rows.

    ``group_ids`` must be global (the same id on every process for the same group). ``zero_std_fraction`` and
    ``num_groups`` describe the whole gathered batch.
    """
    r = torch.as_tensor(rewards)
    g = torch.as_tensor(group_ids, device=r.device)
    v = torch.ones(r.shape[0], dtype=torch.bool, device=r.device) if valid is None else torch.as_tensor(
        valid, dtype=torch.bool, device=r.device)
    (r_all, g_all, v_all), sl = gather_groups([r, g, v])
    full = group_advantages(r_all, g_all, valid=v_all, **adv_kwargs)
    return AdvantageOutput(
        advantages=full.advantages[sl],
        zero_std_mask=full.zero_std_mask[sl],
        zero_std_fraction=full.zero_std_fraction,
        group_mean=full.group_mean[sl],
        group_std=full.group_std[sl],
        num_groups=full.num_groups,
    )
