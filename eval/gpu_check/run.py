"""The GPU check's runner: the sections in priority order, each with its own time budget, inside one total deadline.

    python -m eval.gpu_check OUT_DIR [--dry-run] [--deadline 450] [--only a,b] [--skip a,b] [--budget name=S]

Each section runs in its own process (``--isolate process``, the default on a GPU): its GPU memory is freed when it
ends, a crash or an out-of-memory error is recorded in the report and the next section runs, and a section past
its budget is killed (its process group: SIGTERM, then SIGKILL) keeping the figures it had already written. A
section starts only if the time to the deadline covers its minimum; it gets ``min(budget, time left)``. The dry
run (``--dry-run``: CPU, tiny widths, the same sections) runs them in this process (``--isolate inline``: one
import of torch / transformers / diffusers instead of ten) unless asked otherwise.

``report.json`` is rewritten after every section, so a run killed from outside still leaves what it measured.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGETS = {"vlm_mfu": ">= 0.30 (training phase, forward+backward)", "trl_over_ours": ">= 1.5 (TRL step time / ours)",
           "flow_rollout_overhead": "<= 1.05 (ours / bare pipeline)", "planner_error": "|error| <= 10 %"}


@dataclass(frozen=True)
class Section:
    name: str
    fn: str  # module:function in eval.gpu_check
    budget: float  # seconds on the GPU
    minimum: float  # do not start with less than this left
    what: str


SECTIONS = (
    Section("env", "envinfo:env", 30, 5, "GPU, driver, torch/CUDA, package versions, bf16 matmul rate"),
    Section("pytest_gpu", "envinfo:pytest_gpu", 60, 20, "pytest -m gpu tests/gpu"),
    Section("vlm_build", "vlm:vlm_build", 75, 30, "Qwen2.5-VL-7B at full depth, random bf16 weights, saved once"),
    Section("vlm_lora", "vlm:vlm_lora", 80, 40, "one GRPO step, LoRA: phases, tokens/s, MFU, memory vs plan"),
    Section("flux_512", "flow:flux_512", 110, 50, "FLUX.1-dev LoRA Flow-GRPO-Fast 512^2: s/epoch, images/s, "
                                                   "rollout overhead, memory vs plan"),
    Section("trl", "vlm:trl_side_by_side", 100, 50, "TRL GRPOTrainer vs ours, same model / prompt / G"),
    Section("vlm_full", "vlm:vlm_full", 80, 40, "one GRPO step, full fine-tuning"),
    Section("sd3", "flow:sd3", 50, 25, "SD3.5-medium one epoch"),
    Section("wan", "flow:wan", 50, 25, "Wan2.1-T2V-1.3B one epoch, a short clip"),
    Section("flux_1024", "flow:flux_1024", 90, 60, "FLUX.1-dev 1024^2 (if time allows)"),
)

# widths and sizes: the released models on the GPU; tiny on CPU (the dry run: fp32, whose CPU kernels are ~10x faster
# than bf16 here, one step / epoch each: it checks that every section runs, not how fast)
PARAMS = {
    "gpu": {"vlm": {"spec": "qwen2.5-vl-7b", "layers": None, "vision_layers": None, "frames": 16, "height": 364,
                    "width": 392, "G": 8, "T": 256, "image_size": 1064, "dtype": "bfloat16", "steps": 2},
            "flow": {"res": 512, "res_hi": 1024, "G": 8, "G_small": 4, "wan_h": 240, "wan_w": 416, "wan_frames": 33,
                     "epochs": 2, "reps": 3}},
    "dry": {"vlm": {"spec": "qwen2.5-vl-7b/28", "layers": 2, "vision_layers": 2, "frames": 4, "height": 56,
                    "width": 56, "G": 4, "T": 6, "image_size": 56, "dtype": "float32", "steps": 1},
            "flow": {"res": 64, "res_hi": 128, "G": 2, "G_small": 2, "wan_h": 32, "wan_w": 32, "wan_frames": 5,
                     "epochs": 1, "reps": 1}},
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m eval.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", nargs="?", help="folder for report.json, summary.md and gpu_check.log")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny widths: checks that every section runs")
    p.add_argument("--deadline", type=float, default=None,
                   help="total seconds for all sections, counted from --t0 (default 450 on a GPU, 600 dry)")
    p.add_argument("--t0", type=float, default=None, help="start time (epoch seconds; default now): the shell "
                                                         "wrapper passes its own start so the install counts")
    p.add_argument("--only", default="", help="comma-separated sections to run (default all): "
                   + ",".join(s.name for s in SECTIONS))
    p.add_argument("--skip", default="", help="comma-separated sections to leave out")
    p.add_argument("--budget", action="append", default=[], metavar="NAME=S", help="override a section's budget")
    p.add_argument("--work", default="", help="scratch folder for checkpoints (default: $TMPDIR/mmgrpo_gpu_check); "
                                              "deleted at the end unless --keep-work")
    p.add_argument("--keep-work", action="store_true")
    p.add_argument("--isolate", choices=["auto", "process", "inline"], default="auto",
                   help="process: each section in its own process (default on a GPU); inline (default for --dry-run)")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="bf16 dense peak for MFU (989: H100/H200 datasheet, as verl-omni)")
    p.add_argument("--list", action="store_true", help="print the sections, their budgets and minimums, and exit")
    p.add_argument("--section", default=None, help=argparse.SUPPRESS)
    p.add_argument("--ctx", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.section is None and not a.out_dir and not a.list:
        p.error("OUT_DIR is required")
    return a


def _resolve(fn: str):
    mod, name = fn.split(":")
    return getattr(importlib.import_module(f"eval.gpu_check.{mod}"), name)


def _child(a) -> int:
    from .common import Ctx, run_section_function

    d = json.loads(Path(a.ctx).read_text())
    return run_section_function(_resolve(d["fn"]), Ctx(d))


def _run_one(sec: Section, base_ctx: dict, limit: float, isolate: str, log) -> dict:
    from .common import Ctx, run_section_function

    res_path = Path(base_ctx["work_dir"]) / f"result_{sec.name}.json"
    res_path.unlink(missing_ok=True)
    d = dict(base_ctx, section=sec.name, fn=sec.fn, section_deadline=time.time() + limit, result_path=str(res_path))
    t0 = time.time()
    status = "ok"
    if isolate == "inline":
        log.flush()
        code = run_section_function(_resolve(sec.fn), Ctx(d))
        status = "ok" if code == 0 else "error"
    else:
        ctx_file = Path(base_ctx["work_dir"]) / f"ctx_{sec.name}.json"
        ctx_file.write_text(json.dumps(d))
        log.flush()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen([sys.executable, "-m", "eval.gpu_check", "--section", sec.name, "--ctx", str(ctx_file)],
                                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        try:
            code = proc.wait(timeout=limit)
            status = "ok" if code == 0 else "error"
        except subprocess.TimeoutExpired:
            status = "timeout"
            for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 30)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if status == "error" and not res_path.exists():
            res_path.write_text(json.dumps({"error": f"the section's process exited with code {code} (killed: out "
                                                     "of host memory? see gpu_check.log)"}))
    results = json.loads(res_path.read_text()) if res_path.exists() else {}
    if results.get("skipped"):
        status = "skipped"
    out = {"status": status, "seconds": round(time.time() - t0, 2), "limit_s": round(limit, 1), "what": sec.what,
           "results": results}
    if status == "timeout":
        out["error"] = f"over its budget of {limit:.0f} s: killed; the figures above are what it had measured"
    elif status == "error":
        out["error"] = results.get("error", "failed")
    elif isolate == "inline" and out["seconds"] > limit:
        out["over_budget"] = True
    return out


def _summary(report: dict) -> dict:
    """Each target's figures: met / missed / not measured."""
    s = report["sections"]

    def head(name):
        return (s.get(name) or {}).get("results", {}).get("headline") or {}

    on_gpu = not report["dry_run"]
    rows = []

    def row(figure, value, target, met):
        rows.append({"figure": figure, "value": value, "target": target,
                     "status": "not measured" if value is None else ("met" if met else "missed") if on_gpu
                     else "dry run (not a GPU figure)"})

    for sec in ("vlm_lora", "vlm_full"):
        h = head(sec)
        row(f"{sec}: step seconds", h.get("step_seconds"), "-", True)
        row(f"{sec}: generated tokens/s", h.get("generated_tokens_per_s"), "-", True)
        row(f"{sec}: MFU (forward+backward)", h.get("mfu"), TARGETS["vlm_mfu"], (h.get("mfu") or 0) >= 0.30)
        pe = h.get("planner_error")
        row(f"{sec}: planner error (predicted {h.get('predicted_gib', 0):.1f} / measured "
            f"{h.get('measured_gib', 0):.1f} GiB)", pe, TARGETS["planner_error"], pe is not None and abs(pe) <= 0.10)
    h = head("trl")
    row("TRL step time / ours (LoRA, image prompt)", h.get("trl_over_ours"), TARGETS["trl_over_ours"],
        (h.get("trl_over_ours") or 0) >= 1.5)
    for sec in ("flux_512", "flux_1024", "sd3", "wan"):
        h = head(sec)
        row(f"{sec}: seconds per epoch", h.get("epoch_seconds"), "-", True)
        row(f"{sec}: samples/s", h.get("samples_per_s"), "-", True)
        if sec == "flux_512":
            ro = h.get("rollout_overhead")
            row("flux_512: rollout / bare pipeline", ro, TARGETS["flow_rollout_overhead"], ro is not None and ro <= 1.05)
        if sec in ("flux_512", "flux_1024", "sd3"):
            pe = h.get("planner_error")
            row(f"{sec}: planner error (predicted {h.get('predicted_gib', 0):.1f} / measured "
                f"{h.get('measured_gib', 0):.1f} GiB)", pe, TARGETS["planner_error"],
                pe is not None and abs(pe) <= 0.10)
    h = head("pytest_gpu")
    row("pytest -m gpu: failed", h.get("failed") if h else None, "0", h.get("failed", 1) == 0)
    return {"rows": rows, "sections": {k: v["status"] for k, v in s.items()}}


def _summary_md(report: dict) -> str:
    env = (report["sections"].get("env") or {}).get("results", {})
    gpu = env.get("gpu", "no GPU (dry run)")
    date = time.strftime("%Y-%m-%d", time.gmtime(report["started"]))
    lines = [f"GPU check {date}, {gpu}, `{report['command']}` ({report['total_seconds']:.0f} s; sections: "
             + ", ".join(f"{k} {v}" for k, v in report["summary"]["sections"].items()) + ")", "",
             "| date | GPU | figure | value | target | status |", "|---|---|---|---|---|---|"]
    for r in report["summary"]["rows"]:
        v = r["value"]
        v = "-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))
        lines.append(f"| {date} | {gpu} | {r['figure']} | {v} | {r['target']} | {r['status']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.section:
        return _child(a)
    if a.list:
        for s in SECTIONS:
            print(f"{s.name:<11} budget {s.budget:>4.0f} s, min {s.minimum:>3.0f} s  {s.what}")
        print(f"sum of budgets {sum(s.budget for s in SECTIONS):.0f} s; default deadline 450 s (later sections are "
              "skipped when earlier ones use their whole budgets)")
        return 0
    import tempfile

    t0 = a.t0 or time.time()
    deadline = t0 + (a.deadline or (600.0 if a.dry_run else 450.0))
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(a.work or os.path.join(tempfile.gettempdir(), "mmgrpo_gpu_check"))
    work.mkdir(parents=True, exist_ok=True)
    isolate = a.isolate if a.isolate != "auto" else ("inline" if a.dry_run else "process")
    budgets = {}
    for b in a.budget:
        k, _, v = b.partition("=")
        budgets[k] = float(v)
    only = {x for x in a.only.split(",") if x}
    skip = {x for x in a.skip.split(",") if x}
    unknown = (only | skip | set(budgets)) - {s.name for s in SECTIONS}
    if unknown:
        raise SystemExit(f"unknown section(s) {sorted(unknown)}; sections: {[s.name for s in SECTIONS]}")
    if not a.dry_run:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run with --dry-run on a CPU machine")
    base = {"dry_run": a.dry_run, "out_dir": str(out), "work_dir": str(work), "peak_tflops": a.peak_tflops,
            "params": PARAMS["dry" if a.dry_run else "gpu"]}
    report = {"command": "python -m eval.gpu_check " + " ".join(sys.argv[1:] if argv is None else argv),
              "started": t0, "deadline_s": deadline - t0, "dry_run": a.dry_run, "isolate": isolate,
              "peak_tflops": a.peak_tflops, "params": base["params"], "targets": TARGETS, "sections": {}}
    log = open(out / "gpu_check.log", "a")
    # in inline mode the sections print into this process's stdout: send it to the log too
    real_stdout = sys.stdout
    try:
        for sec in SECTIONS:
            if (only and sec.name not in only) or sec.name in skip:
                continue
            left = deadline - time.time() - 3.0
            budget = budgets.get(sec.name, sec.budget if not a.dry_run else 600.0)
            minimum = sec.minimum if not a.dry_run else 0.0
            if left < max(minimum, 1.0):
                report["sections"][sec.name] = {"status": "skipped", "what": sec.what,
                                                "error": f"deadline: {left:.0f} s left, needs {minimum:.0f} s"}
                print(f"gpu_check: {sec.name}: skipped ({left:.0f} s left)", file=real_stdout, flush=True)
                continue
            limit = min(budget, left)
            print(f"gpu_check: {sec.name} (budget {limit:.0f} s) ...", file=real_stdout, flush=True)
            log.write(f"\n===== {sec.name} ({sec.what}), budget {limit:.0f} s, {time.strftime('%H:%M:%S')}\n")
            if isolate == "inline":
                sys.stdout = log
            try:
                res = _run_one(sec, base, limit, isolate, log)
            finally:
                sys.stdout = real_stdout
            report["sections"][sec.name] = res
            msg = f"gpu_check: {sec.name}: {res['status']} in {res['seconds']:.0f} s"
            if res.get("error"):
                msg += f" ({str(res['error']).splitlines()[0][:200]})"
            print(msg, file=real_stdout, flush=True)
            report["total_seconds"] = time.time() - t0
            report["summary"] = _summary(report)
            (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    finally:
        log.close()
        report["total_seconds"] = time.time() - t0
        report["summary"] = _summary(report)
        (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
        (out / "summary.md").write_text(_summary_md(report))
        if not a.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    print((out / "summary.md").read_text())
    failed = [k for k, v in report["sections"].items() if v["status"] in ("error", "timeout")]
    print(f"gpu_check: {len(report['sections'])} sections in {report['total_seconds']:.0f} s; "
          f"{len(failed)} failed {failed if failed else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
