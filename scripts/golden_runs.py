#!/usr/bin/env python
"""Golden runs: record the numbers of a few fixed end-to-end runs, then check later code against them bit for bit.

    python scripts/golden_runs.py record runs/golden/reference.json [--only NAME ...]
    python scripts/golden_runs.py check  runs/golden/reference.json [--only NAME ...]

A guard for refactors that must not change any number (issue #34): the same runs on the same machine, with the
same process layout and one thread, must give the same floats. Each case runs in fresh subprocesses (the public
CLIs, as a user runs them) in a temporary folder, and records

* every row of every ``metrics.jsonl`` the run wrote (training, validation), without the keys that measure time or
  speed (``time/``, ``perf/``, ``*_s``, ``*seconds*``, ``*per_s``);
* the ``metrics.json`` summaries the demo and the paired evaluations write;
* a digest of every trained tensor of the final checkpoint and of the exported weights (name, dtype, shape,
  bytes): a change in any weight, anywhere, shows.

Cases: the demo's ``--smoke`` mode; experiment scripts in ``SMOKE=1`` mode across both front-ends and several
methods; and a kill-and-resume pair per trainer (the run is stopped by SIGTERM once a checkpoint exists, resumed
with ``run.resume_from=auto``, and must end bitwise equal to the uninterrupted run, which is also compared with
the reference). The reference is machine-specific (float results depend on the CPU and the libraries): keep it
out of the repository; record it on the code you trust, then check every later stage against it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SKIP_PARTS = ("time/", "perf/", "seconds", "per_s", "elapsed")
# experiment scripts run in smoke mode: both front-ends, several methods each
EXPERIMENTS = ["flow_grpo_sd35_pickscore", "tp_grpo_sd35_pickscore", "mixgrpo_flux", "dancegrpo_flux_hps_clip",
               "tempsamp_r1_charades", "dapo_overlong_entropy_charades", "deepvideo_r1_reg_grpo", "gdpo_charades",
               "seed_grpo_nextgqa", "tw_grpo_nextgqa"]
RESUME = {"vlm": "configs/vlm/tempsamp_r1_charades.yaml", "flow": "configs/flow/tp_grpo_sd35_pickscore.yaml"}


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHON=sys.executable,
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    for k in ("MODEL_DIR", "DATA_DIR", "OUT_DIR", "NUM_GPUS"):
        env.pop(k, None)
    return env


def _kept(key: str) -> bool:
    # settings_fingerprint: a hash of an evaluation's settings, its file paths (in this run's temporary folder)
    # included; the settings themselves are compared with those paths normalised (_same)
    return key not in ("time", "settings_fingerprint") and not any(p in key for p in SKIP_PARTS) \
        and not key.endswith("_s")


def _same(a, b) -> bool:
    """Equal values; NaN equals NaN; paths inside two runs' temporary folders are equal if the rest is."""
    if isinstance(a, str) and isinstance(b, str):
        norm = lambda s: re.sub(r"/(?:[^/\s]+/)*golden-[^/\s]+", "<work>", s)  # noqa: E731
        return norm(a) == norm(b)
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


def _metrics_rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            rows.append({k: v for k, v in r.items() if _kept(k)})
    return rows


def _summary(obj):
    if isinstance(obj, dict):
        return {k: _summary(v) for k, v in obj.items() if _kept(k)}
    if isinstance(obj, list):
        return [_summary(v) for v in obj]
    return obj


def _tensor_digest(named) -> dict[str, str]:
    out = {}
    for name, t in sorted(named.items()):
        if not hasattr(t, "detach"):
            continue
        t = t.detach().cpu().contiguous()
        h = hashlib.sha256(f"{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.view(-1).view(__import__("torch").uint8).numpy().tobytes() if t.numel() else b"")
        out[name] = h.hexdigest()[:16]
    return out


def _weights(root: Path) -> dict[str, dict[str, str]]:
    """Digests of the trained tensors of the newest checkpoint and of the exports under ``root``."""
    import torch

    out: dict[str, dict[str, str]] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if "/.tmp-" in f"/{rel}" or not p.is_file():
            continue
        if p.suffix == ".safetensors":
            from safetensors.torch import load_file

            out[rel] = _tensor_digest(load_file(str(p)))
        elif p.name in ("policy.pt", "trainable.pt", "ema.pt"):
            sd = torch.load(p, map_location="cpu", weights_only=True)
            out[rel] = _tensor_digest(sd if isinstance(sd, dict) else {"": sd})
    return out


def _collect(run_dir: Path) -> dict:
    res: dict = {"metrics": {}, "summaries": {}}
    for p in sorted(run_dir.rglob("metrics.jsonl")):
        res["metrics"][p.relative_to(run_dir).as_posix()] = _metrics_rows(p)
    for p in sorted(run_dir.rglob("metrics.json")):
        res["summaries"][p.relative_to(run_dir).as_posix()] = _summary(json.loads(p.read_text()))
    res["weights"] = _weights(run_dir)
    return res


def _run(cmd: list[str], log: Path, env: dict | None = None, timeout: float = 3600) -> None:
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        r = subprocess.run(cmd, cwd=REPO, env=env or _env(), stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}; see {log}")


# ------------------------------------------------------------------------------------------------ cases
def case_demo(work: Path) -> dict:
    out = work / "demo"
    _run([sys.executable, "scripts/demo.py", "--out", str(out), "--smoke"], work / "log.txt")
    return _collect(out)


def case_experiment(name: str, work: Path) -> dict:
    out = work / name
    env = dict(_env(), SMOKE="1", OUT_DIR=str(out), SMOKE_DATA=str(work / "smoke_data"))
    _run(["bash", f"scripts/experiments/{name}.sh"], work / "log.txt", env=env)
    return _collect(out)


def _smoke_train_cmd(kind: str, recipe: str, run_dir: Path, work: Path, *extra: str) -> list[str]:
    env = dict(_env(), SMOKE_DATA=str(work / "smoke_data"))
    ov = subprocess.run([sys.executable, "scripts/experiments/smoke.py", "train", kind, recipe, str(run_dir)],
                        cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout.split("\n")
    module = "mmgrpo.vlm.cli" if kind == "vlm" else "flow_grpo.cli"
    return [sys.executable, "-m", module, "train", "--config", recipe, *[o for o in ov if o], *extra]


def case_resume(kind: str, work: Path) -> dict:
    """The uninterrupted run, and the same run stopped by SIGTERM after its first checkpoint and resumed."""
    recipe = RESUME[kind]
    n = 3
    steps = [f"run.max_steps={n}" if kind == "vlm" else f"run.num_epochs={n}", "run.save_every=1",
             "run.resume_from=auto"]  # the smoke overrides say none
    env = dict(_env(), SMOKE_DATA=str(work / "smoke_data"))
    straight, split = work / f"{kind}_straight", work / f"{kind}_resumed"
    _run(_smoke_train_cmd(kind, recipe, straight, work, *steps), work / "log.txt", env=env)
    cmd = _smoke_train_cmd(kind, recipe, split, work, *steps)
    ckpts = split / "checkpoints"
    with open(work / "log.txt", "a") as f:
        f.write("$ " + " ".join(cmd) + "   (SIGTERM after the first checkpoint)\n")
        f.flush()
        p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
        while p.poll() is None and not (ckpts.is_dir() and any(not c.name.startswith(".") for c in ckpts.iterdir())):
            time.sleep(0.2)
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=600)
    interrupted = rc == 6
    _run(cmd, work / "log.txt", env=env)  # run.resume_from=auto (the default): continues from the checkpoint
    a, b = _collect(straight), _collect(split)
    last = lambda r: {k: v[-1] for k, v in r["metrics"].items() if v}  # noqa: E731
    newest = lambda r: {k: v for k, v in r["weights"].items() if f"{n:08d}" in k or "final" in k}  # noqa: E731
    same = last(a) == last(b) and newest(a) == newest(b)
    return {"straight": a, "resumed_equals_straight": same, "interrupted_exit_code": rc,
            "interrupted_mid_run": interrupted}


CASES = {"demo": case_demo, **{f"exp:{e}": (lambda w, e=e: case_experiment(e, w)) for e in EXPERIMENTS},
         "resume:vlm": lambda w: case_resume("vlm", w), "resume:flow": lambda w: case_resume("flow", w)}


def _diff(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        a, b = ({k: v for k, v in d.items() if _kept(k)} for d in (a, b))  # references recorded before a new skip
        out = [f"{path}/{k}: only in reference" for k in a.keys() - b.keys()]
        out += [f"{path}/{k}: only in this run" for k in b.keys() - a.keys()]
        for k in sorted(a.keys() & b.keys()):
            out += _diff(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} entries in the reference, {len(b)} now"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if _same(a, b) else [f"{path}: {a!r} -> {b!r}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["record", "check"])
    ap.add_argument("reference", type=Path)
    ap.add_argument("--only", nargs="*", help=f"cases to run (default all): {' '.join(CASES)}")
    ap.add_argument("--keep", type=Path, help="keep the run folders here (default: a temporary folder)")
    args = ap.parse_args()
    names = args.only or list(CASES)
    ref = json.loads(args.reference.read_text()) if args.reference.exists() else {}
    failed = []
    for name in names:
        work = Path(tempfile.mkdtemp(prefix="golden-", dir=args.keep)) if args.keep else None
        with tempfile.TemporaryDirectory(prefix="golden-") as tmp:
            w = work or Path(tmp)
            t0 = time.time()
            try:
                res = json.loads(json.dumps(CASES[name](w)))  # JSON round trip: the form the reference has
            except Exception as e:  # noqa: BLE001 - report every case
                print(f"[golden] {name}: FAILED TO RUN: {e}", flush=True)
                failed.append(name)
                continue
            dt = time.time() - t0
        if name.startswith("resume:") and not res["resumed_equals_straight"]:
            print(f"[golden] {name}: the resumed run differs from the uninterrupted one", flush=True)
            failed.append(name)
        if args.mode == "record":
            ref[name] = res
            args.reference.parent.mkdir(parents=True, exist_ok=True)
            args.reference.write_text(json.dumps(ref, indent=1, sort_keys=True) + "\n")
            print(f"[golden] {name}: recorded ({dt:.0f} s)", flush=True)
            continue
        if name not in ref:
            print(f"[golden] {name}: not in the reference", flush=True)
            failed.append(name)
            continue
        diffs = _diff(ref[name], res)
        if name.startswith("resume:"):  # where SIGTERM landed depends on timing, not on the code
            diffs = [d for d in diffs if "interrupted" not in d and "resumed_equals_straight" not in d]
        print(f"[golden] {name}: {'same' if not diffs else f'{len(diffs)} difference(s)'} ({dt:.0f} s)", flush=True)
        for d in diffs[:40]:
            print("    " + d)
        if diffs:
            failed.append(name)
    print(f"[golden] {len(names) - len(failed)}/{len(names)} cases {'recorded' if args.mode == 'record' else 'same'}"
          + (f"; failed: {' '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
