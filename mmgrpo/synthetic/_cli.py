"""What the synthetic benchmarks' command lines share: argument types (a value out of range is an argparse error
(usage + message, exit 2) before anything is written, instead of a traceback, a silent empty output or a generator
that redraws forever (``--lanes 0``)), and the train / val / heldout writer and command line of the VLM benchmarks
whose samples are drawn per split from one seed."""
from __future__ import annotations

import argparse
import json
import os
from typing import Any, Callable, Optional


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


def write_splits(out_dir: str, write_split: Callable[[str, int], str], sizes: dict[str, int], head: dict[str, Any],
                 extra: dict[str, Any]) -> dict:
    """Write each split with ``n > 0`` (``write_split(split, n)`` -> its path) and ``info.json``: ``head`` (benchmark,
    seed), the sizes, ``extra`` and the split files' names; returns the info."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {sp: write_split(sp, n) for sp, n in sizes.items() if n > 0}
    info = {**head, "sizes": dict(sizes), **extra, "files": {k: os.path.basename(v) for k, v in paths.items()}}
    with open(os.path.join(out_dir, "info.json"), "w") as f:
        json.dump(info, f, indent=1)
    return info


def split_benchmark_main(argv, doc: str, generate: Callable[..., dict], probe: Callable[..., dict],
                         probe_help: str) -> int:
    """``python -m mmgrpo.synthetic.<benchmark> OUT [--n-train ...] [--probe]``: write the splits, print the sizes
    and, with ``--probe``, the benchmark's probe on the val split."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="output folder")
    p.add_argument("--n-train", type=int_in(1), default=600)
    p.add_argument("--n-val", type=int_in(0), default=60)
    p.add_argument("--n-heldout", type=int_in(0), default=120)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--probe", action="store_true", help=f"also print the {probe_help} (val split)")
    a = p.parse_args(argv)
    info = generate(a.out, a.n_train, a.n_val, a.n_heldout, a.seed)
    print(json.dumps(info["sizes"]))
    if a.probe:
        print(json.dumps(probe(a.seed, test_split="val")))
    return 0
