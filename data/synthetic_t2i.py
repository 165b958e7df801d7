"""Mini-GenEval synthetic text-to-image benchmark (CLI + module).  The implementation lives in
:mod:`mmgrpo.synthetic.t2i` so it is importable from an installed package; this file is an alias of it.

    python data/synthetic_t2i.py --n 1000 --split train --seed 0 --out train.jsonl [--images DIR]

``import data.synthetic_t2i`` (from a checkout) gives the very module object ``mmgrpo.synthetic.t2i``
(private helpers and monkeypatching included), not a copy.
"""
import os
import sys

if __package__ in (None, ""):  # run as a script from a checkout: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mmgrpo.synthetic import t2i as _impl  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(_impl.main())
sys.modules[__name__] = _impl  # one module object under both names
