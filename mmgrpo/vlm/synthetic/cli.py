"""Command line of the synthetic temporal-grounding benchmarks (``python data/synthetic_tvg.py``): version 1
(:mod:`mmgrpo.vlm.synthetic.tvg`) or version 2 (:mod:`mmgrpo.vlm.synthetic.grounding`)."""
from __future__ import annotations

import json

from .grounding import N_EVENTS, generate as generate_v2
from .tvg import generate


def build_parser():
    """The generator's command line (``data/synthetic_tvg.py``); also read by ``scripts/demo.py`` to check a
    recipe's generator arguments against a base's benchmark with these defaults."""
    import argparse

    from mmgrpo.synthetic._cli import int_in

    from .grounding import MAX_EVENTS, max_lanes

    p = argparse.ArgumentParser(description="Generate the synthetic temporal-grounding benchmark (mp4 + JSONL).")
    p.add_argument("out_dir")
    p.add_argument("--n-train", type=int_in(0), default=64, help="training videos (>= 0)")
    p.add_argument("--n-eval", type=int_in(0), default=16, help="held-out videos (>= 0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mcq", action="store_true", help="also write the colour multiple-choice task (version 1)")
    p.add_argument("--version", type=int, default=1, choices=(1, 2),
                   help="1: this module's benchmark; 2: mmgrpo.vlm.synthetic.grounding (3-5 short moving events "
                        "with colour/shape distractors and motion queries, where a video-blind span scores low)")
    p.add_argument("--n-val", type=int_in(0), default=0, help="version 2: also write a validation split val.jsonl")
    p.add_argument("--clock", default="none", choices=("none", "bar", "light"),
                   help="version 2: show each frame's time in its pixels: bar = a progress bar at the bottom, light "
                        "= the background brightens with time (mmgrpo.vlm.synthetic.grounding)")
    p.add_argument("--lanes", type=int_in(1, max_lanes(), "a lane is at least 14 px of the 64 px frame"), default=3,
                   help=f"version 2: horizontal lanes of the shapes, 1-{max_lanes()} (2 = one row of 28 px visual "
                        "tokens each)")
    p.add_argument("--events", type=int_in(2, MAX_EVENTS, f"{MAX_EVENTS} distinct colour-shape kinds per video"),
                   nargs=2, default=None, metavar=("MIN", "MAX"),
                   help=f"version 2: events per video before the optional twin, 2 <= MIN <= MAX <= {MAX_EVENTS} "
                        "(default 3 5)")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if a.version == 2:
        if a.mcq:
            p.error("--mcq exists only for --version 1")
        if a.events and a.events[0] > a.events[1]:
            p.error(f"--events MIN MAX: MIN must be <= MAX, got {a.events[0]} {a.events[1]}")
    elif a.clock != "none" or a.n_val or a.lanes != 3 or a.events:
        p.error("--clock, --n-val, --lanes and --events exist only for --version 2")
    if a.version == 2:
        res = generate_v2(a.out_dir, a.n_train, a.n_eval, a.seed, n_val=a.n_val, clock=a.clock, lanes=a.lanes,
                          n_events=tuple(a.events) if a.events else N_EVENTS)
    else:
        res = generate(a.out_dir, a.n_train, a.n_eval, a.seed, a.mcq)
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
