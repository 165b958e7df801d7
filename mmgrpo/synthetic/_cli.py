"""Argument types shared by the synthetic benchmarks' command lines: a value out of range is an argparse error
(usage + message, exit 2) before anything is written, instead of a traceback, a silent empty output or a generator
that redraws forever (``--lanes 0``)."""
from __future__ import annotations

import argparse
from typing import Callable, Optional


def int_in(lo: int, hi: Optional[int] = None, why: str = "") -> Callable[[str], int]:
    """argparse ``type=``: an integer in ``[lo, hi]`` (``hi=None``: no upper bound); ``why`` ends the message."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < lo or (hi is not None and v > hi):
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
            raise argparse.ArgumentTypeError(f"must be {rng}, got {v}" + (f" ({why})" if why else ""))
        return v

    parse.__name__ = "int"  # argparse names the type in "invalid int value" messages
    return parse
