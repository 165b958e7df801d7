"""Run every benchmark of ``eval/perf`` and collect their ratios in one JSON.

Each benchmark is a script run as a subprocess (one at a time: they time the same 2 cores). Its result is the LAST
``name=value`` line of its stdout; if it also wrote ``--json`` details they are attached. A benchmark that is
missing, fails, or exceeds its time limit is recorded with its error (value ``null``); the runner itself does not
fail.

    python eval/perf/run.py --quick --json perf.json          # < 5 minutes on 2 cores
    python eval/perf/run.py --only flow_rollout_overhead,tp_batched_speedup --smoke

Output JSON: ``{"flow_rollout_overhead": 1.03, "flow_train_overhead": ..., "tp_batched_speedup": ...,
"prefix_group_speedup": ..., "trl_speedup": ..., "logprob_memory_ratio": ..., "operating_points": {name: text},
"details": {name: {script, command, returncode, seconds, error, stdout_tail, result}}, "machine": {...}, "mode": ...,
"total_seconds": ...}``; a benchmark's JSON ``extra_keys`` (e.g. ``logprob_grad_max_rel_diff``) are added at the
top level too, and its ``operating_point`` (the prompt / completion lengths, G, model width and depth, dtype and
threads the ratio was measured at) goes to ``operating_points`` and is printed beside the value.
No heavy imports: ``--help`` is instant and the runner never imports torch.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# (result key, script in this folder).
BENCHMARKS: list[tuple[str, str]] = [
    ("flow_rollout_overhead", "flow_rollout.py"),
    ("flow_train_overhead", "flow_train.py"),
    ("tp_batched_speedup", "tp_completions.py"),
    ("prefix_group_speedup", "prefix_group.py"),
    # before trl_compare: the runner splits the remaining budget evenly over the benchmarks still to run, and the
    # last one gets what is left; trl_compare (3 worker processes) needs the most
    ("prefix_generate_speedup", "prefix_generate.py"),
    ("data_wait_fraction", "data_prefetch.py"),
    ("trl_speedup", "trl_compare.py"),
    ("logprob_memory_ratio", "logprob_memory.py"),
]

_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf)\s*$")


def parse_last_ratio(stdout: str) -> Optional[tuple[str, float]]:
    """The last line of the form ``name=number`` (None if there is none)."""
    for line in reversed(stdout.splitlines()):
        m = _LINE.match(line)
        if m:
            return m.group(1), float(m.group(2))
    return None


def _tail(text: str, n: int = 2000) -> str:
    return text if len(text) <= n else "..." + text[-n:]


def _run(cmd: list[str], timeout: float, env: dict) -> tuple[int, str, str, bool]:
    """Run ``cmd`` in its own process group; on timeout kill that group (only what we started)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, cwd=ROOT)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # pragma: no cover - already gone
            pass
        out, err = proc.communicate()
        return -9, out or "", err or "", True


_OPTIONS_WITH_VALUE = {"--json"}


def _unrecognized(stderr: str) -> list[str]:
    """Option names argparse rejected (``error: unrecognized arguments: --smoke --json /x``); only ours."""
    m = re.search(r"unrecognized arguments: (.*)$", stderr.strip(), re.MULTILINE)
    if not m:
        return []
    return [a for a in m.group(1).split() if a in ("--json", "--smoke", "--quick")]


def _drop_args(cmd: list[str], names: list[str]) -> list[str]:
    out, skip = [], False
    for a in cmd:
        if skip:
            skip = False
            continue
        if a in names:
            skip = a in _OPTIONS_WITH_VALUE
            continue
        out.append(a)
    return out


def run_benchmark(key: str, script: str, mode_args: list[str], timeout: float, folder: str = HERE,
                  extra_args: Optional[list[str]] = None) -> dict:
    """Run one benchmark script; returns its record (never raises for a benchmark failure)."""
    path = os.path.join(folder, script)
    rec: dict = {"script": os.path.relpath(path), "value": None, "error": None}
    if not os.path.isfile(path):
        rec["error"] = f"not present: {path}"
        return rec
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory(prefix="perf_") as tmp:
        jpath = os.path.join(tmp, "result.json")
        base = [sys.executable, path, *mode_args, *(extra_args or [])]
        cmd = base + ["--json", jpath]
        t0 = time.perf_counter()
        rc, out, err, timed_out = _run(cmd, timeout, env)
        dropped = _unrecognized(err) if rc == 2 else []
        if dropped:
            # a benchmark without --json / --smoke: rerun it without those options (the ratio line is enough)
            cmd = _drop_args(cmd, dropped)
            if "--smoke" in dropped and "--quick" not in cmd:
                cmd.append("--quick")  # the closest mode it has
            rec["dropped_args"] = dropped
            rc, out, err, timed_out = _run(cmd, max(1.0, timeout - (time.perf_counter() - t0)), env)
        rec["seconds"] = round(time.perf_counter() - t0, 2)
        from mmgrpo.utils.portable import portable_argv  # no torch: recorded without this machine's paths

        rec["command"] = " ".join(portable_argv(cmd, anchor=tmp))
        rec["returncode"] = rc
        rec["stdout_tail"] = _tail(out)
        parsed = parse_last_ratio(out)
        if parsed is not None:
            rec["reported_name"] = parsed[0]
        if timed_out:
            rec["error"] = f"timeout after {timeout:.0f} s"
        elif rc != 0:
            rec["error"] = f"exit code {rc}: {_tail(err.strip(), 1500)}"
        elif parsed is None:
            rec["error"] = "no 'name=value' line in stdout"
        else:
            rec["value"] = parsed[1]
            if parsed[0] != key:
                rec["warning"] = f"reported name {parsed[0]!r} != expected {key!r}"
        if rec["error"] is not None:
            rec["stderr_tail"] = _tail(err)
        if os.path.isfile(jpath):
            try:
                with open(jpath) as f:
                    rec["result"] = json.load(f)
            except (OSError, json.JSONDecodeError) as exc:
                rec["json_error"] = f"{type(exc).__name__}: {exc}"
    return rec


def main(argv: Optional[list[str]] = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    p.add_argument("--smoke", action="store_true", help="pass --smoke to every benchmark (tiny models)")
    p.add_argument("--json", default="", help="write all results here")
    p.add_argument("--only", default="", help="comma-separated result keys to run (default: all)")
    p.add_argument("--budget", type=float, default=None,
                   help="total seconds for all benchmarks (default 290 with --quick/--smoke, else 3600; <= 0: no limit); "
                        "a benchmark gets the remaining budget split over those still to run, at least --min-timeout")
    p.add_argument("--min-timeout", type=float, default=30.0, help="lower bound of a benchmark's time limit")
    p.add_argument("--folder", default=HERE, help=argparse.SUPPRESS)  # tests point this at fake benchmarks
    args = p.parse_args(argv)
    mode = ["--smoke"] if args.smoke else (["--quick"] if args.quick else [])
    budget = args.budget if args.budget is not None else (290.0 if (args.quick or args.smoke) else 3600.0)
    todo = BENCHMARKS
    if args.only:
        keys = [k.strip() for k in args.only.split(",") if k.strip()]
        unknown = [k for k in keys if k not in dict(BENCHMARKS)]
        if unknown:
            p.error(f"unknown benchmark(s) {unknown}; known: {[k for k, _ in BENCHMARKS]}")
        todo = [(k, s) for k, s in BENCHMARKS if k in keys]
    t_start = time.perf_counter()
    results: dict = {k: None for k, _ in todo}
    details: dict = {}
    present = [(k, s) for k, s in todo if os.path.isfile(os.path.join(args.folder, s))]
    for k, s in todo:
        remaining = budget - (time.perf_counter() - t_start)
        left = max(1, sum(1 for kk, _ in present if kk not in details))
        timeout = max(args.min_timeout, remaining / left) if budget > 0 else 7 * 24 * 3600.0
        print(f"[perf] {k} ({s}) ...", flush=True)
        rec = run_benchmark(k, s, mode, timeout, folder=args.folder)
        details[k] = rec
        results[k] = rec["value"]
        status = f"{rec['value']:.2f}" if rec["value"] is not None else f"FAILED ({(rec['error'] or '')[:200]})"
        print(f"[perf] {k} = {status}   [{rec.get('seconds', 0)} s]", flush=True)
    operating_points = {}
    for key, rec in details.items():  # secondary results a benchmark reports in its JSON (``extra_keys``)
        res = rec.get("result") if isinstance(rec.get("result"), dict) else {}
        extra = res.get("extra_keys", {})
        for k, v in (extra if isinstance(extra, dict) else {}).items():
            results.setdefault(k, v)
        op = res.get("operating_point")
        if isinstance(op, dict) and op.get("text"):  # where the ratio was measured (prompt/new tokens, G, model)
            operating_points[key] = op["text"]
    out = {**results, "operating_points": operating_points, "details": details,
           "machine": {"platform": platform.platform(), "python": platform.python_version(),
                       "cpu_count": os.cpu_count(), "loadavg_1m": _loadavg()},
           "mode": "smoke" if args.smoke else ("quick" if args.quick else "full"),
           "total_seconds": round(time.perf_counter() - t_start, 1)}
    torch_v = next((d["result"].get("machine", {}).get("torch") for d in details.values()
                    if isinstance(d.get("result"), dict) and isinstance(d["result"].get("machine"), dict)), None)
    if torch_v:
        out["machine"]["torch"] = torch_v
    if args.json:
        d = os.path.dirname(os.path.abspath(args.json))
        os.makedirs(d, exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=str)
    for k, text in operating_points.items():
        print(f"[perf] {k} = {'null' if results.get(k) is None else f'{results[k]:.3g}'} at {text}")
    print("[perf] summary: " + ", ".join(f"{k}={'null' if v is None else f'{v:.3g}'}" for k, v in results.items())
          + f"   ({out['total_seconds']} s)")
    return out


def _loadavg() -> Optional[float]:
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover
        return None


if __name__ == "__main__":
    main()
