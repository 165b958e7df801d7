"""Synthetic temporal-grounding benchmark: the command line of :mod:`mmgrpo.synthetic.tvg` (import that module, not this file).

    python data/synthetic_tvg.py OUT_DIR --n-train 64 --n-eval 16 --seed 0 [--mcq]
"""
import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout: repo importable
    from mmgrpo.synthetic.tvg import main

    raise SystemExit(main())
