"""What one VLM step reports beyond its numbers' computation: the reduction of a step's metrics over processes
(:func:`reduce_metrics`) and the sampled completions written to ``completions.jsonl`` (:func:`completion_rows`)."""
from __future__ import annotations

from typing import Any

from mmgrpo.vlm.data.task import sample_id

__all__ = ["reduce_metrics", "completion_rows"]

# decided globally (the same on every process): the first process's value
SAME_ON_EVERY_PROCESS = ("faults/skipped_steps", "faults/consecutive_skips", "train/skipped_steps")
# counts of this step or per-process running totals: summed over processes
SUMMED = ("data/skipped_missing_media", "data/skipped_bad_samples", "data/filtered_groups", "data/groups",
          "data/valid_groups", "completions/parse_failures")
SUMMED_PREFIXES = ("perf/tokens", "faults/")


def reduce_metrics(m: dict[str, float], world: int) -> dict[str, float]:
    """Collective: a step's metrics over the ``world`` processes: max for ``*max*`` keys, min for ``*min*``, the
    counts (:data:`SUMMED`, ``faults/*``, ``perf/tokens*``) summed, what was decided globally
    (:data:`SAME_ON_EVERY_PROCESS`) taken once, every other value averaged with equal weight (processes hold equally
    many prompts). With one process, ``m`` itself."""
    if world == 1:
        return m
    from accelerate.utils import gather_object

    allm = gather_object([m])
    out: dict[str, float] = {}
    for k in sorted({k for d in allm for k in d}):
        vals = [d[k] for d in allm if k in d]
        if "max" in k:
            out[k] = max(vals)
        elif "min" in k:
            out[k] = min(vals)
        elif k in SAME_ON_EVERY_PROCESS:
            out[k] = vals[0]
        elif k in SUMMED or k.startswith(SUMMED_PREFIXES):
            out[k] = float(sum(vals))
        else:
            out[k] = sum(vals) / len(vals)
    return out


def completion_rows(rb: Any, step: int, n: int) -> list[dict]:
    """The first ``n`` rows of the rollout batch ``rb`` as ``completions.jsonl`` records: sample, group, text, flags,
    advantage and every reward."""
    rows = []
    for i in range(min(rb.n, n)):
        rows.append({"step": step, "sample_id": sample_id(rb.samples[i]), "group": int(rb.group_ids[i]),
                     "completion": rb.texts[i], "offpolicy": bool(rb.is_offpolicy[i]),
                     "truncated": bool(rb.truncated[i]), "parse_failed": bool(rb.parse_failed[i]),
                     "advantage": float(rb.advantages[i]) if rb.advantages is not None else None,
                     **{f"reward/{k}": float(v[i]) for k, v in rb.rewards.items()}})
    return rows
