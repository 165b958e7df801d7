#!/usr/bin/env python
"""Build the temporal-grounding demo's base: a tiny Qwen2.5-VL that grounds, then learns a 1-s annotation lag.

    python scripts/build_grounding_base.py --out runs/grounding_base          # ~75 min on 2 quiet cores
    python scripts/build_grounding_base.py --out /tmp/gb --smoke              # wiring check, seconds

Five ``scripts/build_tiny_vlm.py`` stages on the synthetic grounding benchmark, version 2 (``--clock light
--events 2 3``; ``mmgrpo/vlm/synthetic/grounding.py``), each starting from the previous one (``--init``), the vision
tower frozen after stage 1 (docs/demo_models.md, "Issue #16"):

1. ``W1``: a tagging stage teaches the vision tower which colour+shape each 1-s block shows, then 1,200 SFT steps
   (1,000 training videos);
2. ``W1b``: 2,000 more SFT steps (1,000 videos);
3. ``S1``: 3,000 SFT steps on 3,000 training videos (the first 1,000 are stages 1-2's: one generator stream);
4. ``S2``: 3,000 more at half the learning rate: the clean base (it grounds: its own query's span scores far above
   another query's span of the same video);
5. ``L``: 400 SFT steps on the same videos with every answer **1 s late** (``--label-shift 1.0``), the designed
   weakness GRPO with an IoU reward on correct labels can fix (a systematic annotation lag).

Stage 5's model is written to ``--out`` (a ``from_pretrained`` folder; ``sft_report.json`` = stage 5) with every
earlier stage's report beside it (``sft_report_stage{k}_{name}.json``). Every stage evaluates on the validation
split only. Commands are printed and run in order; a failed stage stops the build.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
BENCH = ["--version", "2", "--clock", "light", "--events", "2", "3"]
COMMON = ["--benchmark", "grounding", "--clock", "light", "--eval-split", "val", "--max-frames", "32",
          "--label-round", "0.5", "--query-position", "before", "--freeze-vision"]
# name, data ("1k" | "3k"), stage arguments; smoke replaces the step counts
STAGES = [
    ("W1", "1k", ["--vision-pretrain-steps", "400", "--steps", "1200", "--lr", "2e-3", "--seconds", "3000"]),
    ("W1b", "1k", ["--steps", "2000", "--lr", "1e-3", "--seconds", "3000"]),
    ("S1", "3k", ["--steps", "3000", "--lr", "1e-3", "--seconds", "6000"]),
    ("S2", "3k", ["--steps", "3000", "--lr", "5e-4", "--seconds", "6000"]),
    ("L", "3k", ["--steps", "400", "--lr", "1e-3", "--seconds", "3000", "--label-shift", "1.0"]),
]
SIZES = {"full": {"1k": 1000, "3k": 3000, "eval": 100, "val": 60},
         "smoke": {"1k": 4, "3k": 6, "eval": 3, "val": 2}}


def _smoke(args: list[str]) -> list[str]:
    out = list(args)
    for flag, value in (("--steps", "2"), ("--vision-pretrain-steps", "2"), ("--seconds", "120")):
        if flag in out:
            out[out.index(flag) + 1] = value
    return out


def commands(out: Path, seed: int, smoke: bool = False) -> list[tuple[str, list[str]]]:
    """The build's commands in order: two data folders, then the five stages."""
    sz = SIZES["smoke" if smoke else "full"]
    work = out / "stages"
    cmds = []
    for key in ("1k", "3k"):
        cmds.append((f"data_{key}", [PY, "data/synthetic_tvg.py", str(work / f"data_{key}"), "--n-train", str(sz[key]),
                                     "--n-eval", str(sz["eval"]), "--n-val", str(sz["val"]), "--seed", str(seed)]
                     + BENCH))
    prev = None
    for name, data, stage in STAGES:
        cmd = [PY, "scripts/build_tiny_vlm.py", "--out", str(work / name), "--data-dir", str(work / f"data_{data}"),
               "--seed", str(seed)] + COMMON + (_smoke(stage) if smoke else stage)
        if prev:
            cmd += ["--init", str(work / prev)]
        cmds.append((name, cmd))
        prev = name
    return cmds


def collect(out: Path) -> None:
    """Stage 5's model files into ``out``, and every stage's report beside them."""
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("build_tiny_vlm", REPO / "scripts" / "build_tiny_vlm.py")
    btv = module_from_spec(spec)
    spec.loader.exec_module(btv)
    work = out / "stages"
    btv.ship(work / STAGES[-1][0], out)
    for k, (name, _, _) in enumerate(STAGES[:-1], start=1):
        shutil.copyfile(work / name / "sft_report.json", out / f"sft_report_stage{k}_{name}.json")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder of the final model (stage folders under <out>/stages)")
    p.add_argument("--seed", type=int, default=0, help="benchmark and training seed of every stage")
    p.add_argument("--smoke", action="store_true", help="a handful of videos and 2 steps per stage: wiring only")
    p.add_argument("--keep-stages", action="store_true", help="keep <out>/stages (data and stage models)")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    for name, cmd in commands(out, args.seed, args.smoke):
        print(f"[build] {name}: {' '.join(cmd)}", flush=True)
        t = time.time()
        if subprocess.run(cmd, cwd=REPO).returncode != 0:
            print(f"[build] stage {name} failed", file=sys.stderr)
            return 1
        print(f"[build] {name} done in {time.time() - t:.0f} s", flush=True)
    collect(out)
    if not args.keep_stages:
        shutil.rmtree(out / "stages")
    print(f"[build] {out} in {time.time() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
