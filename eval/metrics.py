"""Small aggregation helpers for the eval scorer (pure Python): percentages, duration buckets, breakdowns."""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

__all__ = [
    "DEFAULT_DURATION_BUCKETS",
    "pct",
    "mean_pct",
    "rate_at",
    "duration_bucket",
    "group_value",
    "breakdown",
]

# seconds; Charades-STA videos are ~30 s, ActivityNet ~120 s
DEFAULT_DURATION_BUCKETS: tuple[float, ...] = (30.0, 60.0, 120.0, 300.0)


def pct(num: float, den: float) -> Optional[float]:
    """100·num/den, or None when den == 0 (written as JSON null, never NaN)."""
    return None if den == 0 else 100.0 * num / den


def mean_pct(values: Sequence[float]) -> Optional[float]:
    return pct(math.fsum(values), len(values))


def rate_at(values: Sequence[float], threshold: float) -> Optional[float]:
    """Percentage of values ≥ threshold."""
    return pct(sum(1 for v in values if v >= threshold), len(values))


def _fmt(x: float) -> str:
    return f"{x:g}"


def duration_bucket(duration: float, edges: Sequence[float] = DEFAULT_DURATION_BUCKETS) -> str:
    """Label of the half-open bucket holding ``duration``: edges (30, 60) give "0-30s", "30-60s", "60s+"."""
    edges = sorted(float(e) for e in edges)
    lo = 0.0
    for e in edges:
        if duration < e:
            return f"{_fmt(lo)}-{_fmt(e)}s"
        lo = e
    return f"{_fmt(lo)}s+"


def group_value(ann: Mapping[str, Any], key: str, edges: Sequence[float] = DEFAULT_DURATION_BUCKETS) -> str:
    """Breakdown label of an annotation: ``duration_bucket`` from ``duration``; otherwise ``meta[key]`` then
    ``ann[key]``; "unknown" if absent."""
    if key == "duration_bucket":
        d = ann.get("duration")
        try:
            d = float(d)
        except (TypeError, ValueError):
            return "unknown"
        return duration_bucket(d, edges) if math.isfinite(d) else "unknown"
    meta = ann.get("meta")
    if isinstance(meta, Mapping) and meta.get(key) is not None:
        return str(meta[key])
    if ann.get(key) is not None:
        return str(ann[key])
    return "unknown"


def breakdown(
    records: Iterable[Mapping[str, Any]],
    keys: Sequence[str],
    aggregate: Callable[[list], dict],
    label: Callable[[Mapping[str, Any], str], str],
) -> dict[str, dict[str, dict]]:
    """{key: {value: aggregate(records with that value)}} with values sorted."""
    records = list(records)
    out: dict[str, dict[str, dict]] = {}
    for key in keys:
        groups: dict[str, list] = {}
        for r in records:
            groups.setdefault(label(r, key), []).append(r)
        out[key] = {v: aggregate(groups[v]) for v in sorted(groups)}
    return out
