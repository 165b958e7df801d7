"""Synthetic temporal-grounding benchmarks: the command line of :mod:`mmgrpo.vlm.synthetic.cli` (version 1: ``tvg``,
version 2: ``grounding``; import those modules, not this file).

    python data/synthetic_tvg.py OUT_DIR --n-train 64 --n-eval 16 --seed 0 [--mcq | --version 2 ...]
"""
import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout: repo importable
    from mmgrpo.vlm.synthetic.cli import main

    raise SystemExit(main())
