"""Mini-GenEval synthetic text-to-image benchmark: the command line of :mod:`mmgrpo.synthetic.t2i` (import that module,
not this file).

    python data/synthetic_t2i.py --n 1000 --split train --seed 0 --out train.jsonl [--images DIR]
"""
import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout: repo importable
    from mmgrpo.synthetic.t2i import main

    raise SystemExit(main())
