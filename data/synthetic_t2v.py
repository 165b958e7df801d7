"""Mini-T2V synthetic text-to-video benchmark: the command line of :mod:`mmgrpo.synthetic.t2v` (import that module,
not this file).

    python data/synthetic_t2v.py OUT [--splits train val heldout] [--n 200 | --all] [--seed 0] [--mp4]
"""
import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # a checkout: repo importable
    from mmgrpo.synthetic.t2v import main

    raise SystemExit(main())
