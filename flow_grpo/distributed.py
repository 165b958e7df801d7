"""Cross-process helpers of the flow trainer: one collective each, identities without a process group (a single
process, or torch.distributed not initialised).
The collectives themselves are :mod:`mmgrpo.engine.dist`; this module keeps the old names."""
from __future__ import annotations

from typing import Optional

from mmgrpo.engine import dist as _engine_dist
from mmgrpo.engine.errors import RewardCallFailed


# moved to mmgrpo.engine.dist (shared with the VLM trainer); the old private names stay importable
_dist = _engine_dist.process_group
_all_gather_object = _engine_dist.all_gather_object
_broadcast_object = _engine_dist.broadcast_object
_barrier = _engine_dist.barrier
_gather_rows = _engine_dist.gather_rows


def _reduce(values: list[float], op: str, device) -> list[float]:
    """All-reduce a list of floats (``op``: sum | max) in one collective; identity without a process group."""
    return _engine_dist.all_reduce(values, op, device)


def sync_failure(exc: Optional[BaseException]) -> None:
    """Raise :class:`RewardCallFailed` on every process if it was raised on any (keeps collectives in step)."""
    msgs = _all_gather_object(None if exc is None else str(exc))
    bad = [(r, m) for r, m in enumerate(msgs) if m is not None]
    if bad:
        raise RewardCallFailed("; ".join(f"process {r}: {m}" for r, m in bad)) from exc
