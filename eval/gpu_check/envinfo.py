"""Environment section (GPU, driver, torch / CUDA, package versions, a bf16 matmul rate) and the ``pytest -m gpu``
section (the GPU-only tests in tests/gpu: bf16 vs fp32 log-probs at real width, SDE ratio on CUDA, chunked log-prob
memory, prefix-shared vs naive, kill-and-resume with CUDA RNG)."""
from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

from .common import Ctx, sync

PACKAGES = ("torch", "torchvision", "transformers", "diffusers", "accelerate", "peft", "trl", "datasets", "tokenizers",
            "safetensors", "numpy", "pillow", "tiktoken", "dashscope", "open_clip_torch", "decord", "qwen-vl-utils",
            "av", "pytest", "hypothesis")
REPO = Path(__file__).resolve().parents[2]


def _version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def env(ctx: Ctx) -> None:
    import torch

    info = {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count(),
            "packages": {p: _version(p) for p in PACKAGES}, "torch_cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            "cuda_available": torch.cuda.is_available(), "device": ctx.device,
            "found_without_import": {m: importlib.util.find_spec(m) is not None for m in ("dashscope", "open_clip")}}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, capability=f"{p.major}.{p.minor}", gpu_memory_gib=p.total_memory / 2 ** 30,
                    multiprocessors=p.multi_processor_count)
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            info["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            info["nvidia_smi"] = f"unavailable: {e}"
    ctx.put(**info)
    # the bf16 matmul rate this GPU reaches (the MFU peak is the datasheet's 989 TFLOP/s; this shows the ceiling)
    n, reps = (8192, 10) if torch.cuda.is_available() else (256, 3)
    dt = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    a = torch.randn(n, n, device=ctx.device, dtype=dt)
    b = torch.randn(n, n, device=ctx.device, dtype=dt)
    for _ in range(3):
        a @ b
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync()
    tf = 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e12
    ctx.put(matmul={"n": n, "dtype": str(dt), "tflops": tf}, headline={"gpu": info.get("gpu", "cpu (dry run)"),
                                                                       "matmul_tflops": tf})
    ctx.log(f"{info.get('gpu', 'no GPU')}: {n}^3 {dt} matmul {tf:.1f} TFLOP/s")


def pytest_gpu(ctx: Ctx) -> None:
    """``pytest -m gpu tests/gpu`` in a child process; counts from pytest's closing line."""
    limit = max(10, int(ctx.time_left()) - 5)
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/gpu", "-p", "no:cacheprovider",
           "--timeout", str(limit), "-rs"]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=limit + 5)
        text, code = out.stdout + out.stderr, out.returncode
    except subprocess.TimeoutExpired as e:
        text, code = f"{e.stdout or ''}{e.stderr or ''}\n(timed out after {limit} s)", -1
    print(text[-6000:], flush=True)
    counts = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|error|errors|deselected)", text)}
    ctx.put(command=" ".join(cmd[1:]), exit_code=code, counts=counts, seconds=time.perf_counter() - t0,
            output_tail=text[-3000:], headline={"passed": counts.get("passed", 0), "failed": counts.get("failed", 0),
                                                "skipped": counts.get("skipped", 0)})
    if code not in (0, 5):  # 5: nothing collected
        raise RuntimeError(f"pytest -m gpu exited {code}: {counts}")
