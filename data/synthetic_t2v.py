"""Mini-T2V synthetic text-to-video benchmark (CLI + module).  The implementation lives in
:mod:`mmgrpo.synthetic.t2v` so it is importable from an installed package (the ``motion_verifier`` reward
uses it); this file is an alias of it.

    python data/synthetic_t2v.py OUT [--splits train val heldout] [--n 200 | --all] [--seed 0] [--mp4]
"""
import os
import sys

if __package__ in (None, ""):  # run as a script from a checkout: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mmgrpo.synthetic import t2v as _impl  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(_impl.main())
sys.modules[__name__] = _impl  # one module object under both names
