"""Parse one JSON record of an input file (a JSONL line, a prompt line, a converter's input) so that every way it can
be unreadable is one ``ValueError`` with a short reason, for a message that names file and line and for a counted
skip. ``json.loads`` itself raises three unrelated errors: ``JSONDecodeError`` (malformed text), ``RecursionError``
(nesting deeper than ~1000 levels; not a ValueError, so skip policies missed it) and a plain ``ValueError`` (an
integer of more than 4300 digits). Records nested deeper than :data:`MAX_DEPTH` are refused too: they parse, but
copying them later (``copy.deepcopy``, ``dataclasses.asdict``) can still exhaust the stack in the middle of a run.

Numbers: JSON integers of any length up to Python's limit parse to ``int``; whether a huge one is a usable value
(``float(10**400)`` overflows) is the schema's business (``mmgrpo.vlm.data.schema`` refuses non-finite numbers)."""
from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64  # canonical samples nest <= 4 levels; GenEval metadata <= 3

__all__ = ["MAX_DEPTH", "JSONRecordError", "parse_record", "depth"]


class JSONRecordError(ValueError):
    """One record is not usable JSON; ``reason`` says why (no location: the caller adds file and line)."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


def depth(obj: Any) -> int:
    """Nesting depth of lists / dicts (a scalar is 0, ``[]`` and ``{}`` are 1), without recursion."""
    best, stack = 0, [(obj, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, dict):
            best = max(best, d)
            stack.extend((v, d + 1) for v in x.values())
        elif isinstance(x, list):
            best = max(best, d)
            stack.extend((v, d + 1) for v in x)
    return best


def parse_record(text: str, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads(text)``; raises :class:`JSONRecordError` for malformed JSON (with the column), nesting deeper
    than ``max_depth`` and numbers Python will not convert."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as ex:
        raise JSONRecordError(f"malformed JSON: {ex.msg} (column {ex.colno})") from None
    except RecursionError:
        raise JSONRecordError(f"JSON nested too deeply to parse (more than {max_depth} levels allowed)") from None
    except ValueError as ex:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        raise JSONRecordError(f"unreadable JSON: {' '.join(str(ex).split())[:200]}") from None
    if depth(obj) > max_depth:
        raise JSONRecordError(f"JSON nested {depth(obj)} levels deep (at most {max_depth} allowed)")
    return obj
