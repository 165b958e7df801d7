"""Cross-process helper of the flow trainer (the collectives themselves are :mod:`mmgrpo.engine.dist`)."""
from __future__ import annotations

from typing import Optional

from mmgrpo.engine.dist import all_gather_object
from mmgrpo.engine.errors import RewardCallFailed


def sync_failure(exc: Optional[BaseException]) -> None:
    """Raise :class:`RewardCallFailed` on every process if it was raised on any (keeps collectives in step)."""
    msgs = all_gather_object(None if exc is None else str(exc))
    bad = [(r, m) for r, m in enumerate(msgs) if m is not None]
    if bad:
        raise RewardCallFailed("; ".join(f"process {r}: {m}" for r, m in bad)) from exc
