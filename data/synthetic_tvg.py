"""Synthetic temporal-grounding benchmark (CLI + module).  The implementation lives in
:mod:`mmgrpo.synthetic.tvg` so it is importable from an installed package; this file re-exports it.

    python data/synthetic_tvg.py OUT_DIR --n-train 64 --n-eval 16 --seed 0 [--mcq]
"""
import os
import sys

if __package__ in (None, ""):  # run as a script from a checkout: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mmgrpo.synthetic.tvg import (  # noqa: E402,F401
    COLOURS,
    SHAPES,
    Event,
    VideoSpec,
    generate,
    main,
    render_frame,
    sample_spec,
)

if __name__ == "__main__":
    raise SystemExit(main())
