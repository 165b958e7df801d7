"""Check the planner's Wan 14B rows against measured peaks: real width, truncated depth, short clips, on CPU.

``flow_grpo plan`` predicts Wan2.1-14B / Wan2.2-A14B at 480p x 81 from *counted* activation constants
(:data:`mmgrpo.utils.memory_plan.ACTIVATION_COUNTED`). This script measures one training step (forward, a loss,
backward) of the real-width Wan2.1-T2V-14B transformer (hidden 5120, 40 heads, ffn 13824, text dim 4096: the
release's config in :data:`mmgrpo.utils.memory_plan.MODELS`) cut to 1-2 blocks, on a few hundred to a couple of
thousand video tokens, and compares with :func:`mmgrpo.utils.memory_plan.plan` for exactly that setting.

Each setting runs in its own subprocess (``--worker``): the transformer is built directly in bf16
(``torch.set_default_dtype``: no fp32 copy), LoRA r=16 on ``to_q/to_k/to_v/to_out.0`` (the planner's count; peft
keeps the adapters in fp32) or full fine-tuning, gradient checkpointing per block on or off, 512 text tokens
(``max_sequence_length``), batch 1. ``MALLOC_MMAP_THRESHOLD_`` is fixed at 64 KiB so that glibc returns freed
tensors to the kernel at once (RSS then tracks live memory). Measured:

* ``weights``: RSS after building the model (and the adapter) minus RSS after the imports, against the planner's
  transformer weights (bf16) + LoRA weights (fp32);
* ``step``: peak RSS (VmHWM, reset via ``/proc/self/clear_refs`` right before the forward) of forward + loss +
  backward minus the RSS before it, against the planner's ``activations`` + ``grads`` (what appears during a step;
  the weights are already resident). The optimizer step is not run (its state is exact arithmetic on counts).

Usage (each setting takes 1-3 CPU-minutes at 1 block / 1,024 tokens; run under ``nice -n 5``)::

    OMP_NUM_THREADS=2 nice -n 5 python eval/perf/plan_check.py --json plan_check.json
    python eval/perf/plan_check.py --worker --layers 1 --frames 2 --size 32 --ckpt 1   # one setting, JSON out
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

MODEL = "wan2.1-t2v-14b"
LORA_R = 16
MiB = 1024 ** 2


def _rss(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def tokens_of(frames: int, size: int) -> int:
    """Video tokens of a latent of ``frames`` x ``size`` x ``size`` (patch 1 x 2 x 2)."""
    return frames * (size // 2) * (size // 2)


def worker(layers: int, frames: int, size: int, ckpt: bool, full: bool, lora_fp32: bool = True) -> dict:
    import torch
    from peft import LoraConfig

    from eval.perf.common import reset_peak_rss
    from flow_grpo.memory_plan import flow_transformer
    from mmgrpo.utils.memory_plan import get_spec

    spec = get_spec(MODEL)
    base = _rss("VmRSS")
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # built directly in bf16
    m = flow_transformer(spec, layers)
    torch.set_default_dtype(torch.float32)
    if not full:
        m.add_adapter(LoraConfig(r=LORA_R, lora_alpha=LORA_R, init_lora_weights="gaussian",
                                 target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
        for n, p in m.named_parameters():
            if "lora_" in n and lora_fp32:
                p.data = p.data.float()  # as flow_grpo.models.base.add_lora: trained adapters in fp32
            p.requires_grad_("lora_" in n)
    if ckpt:
        m.enable_gradient_checkpointing()
    m.train()
    lora_dtypes = sorted({str(p.dtype) for n, p in m.named_parameters() if "lora_" in n})
    weights = _rss("VmRSS") - base
    x = torch.randn(1, 16, frames, size, size, dtype=torch.bfloat16)
    text = torch.randn(1, spec["max_sequence_length"], spec["transformer"]["text_dim"], dtype=torch.bfloat16)
    t = torch.tensor([500.0])
    target = torch.randn_like(x, dtype=torch.float32)
    before = _rss("VmRSS")
    reset = reset_peak_rss()
    c0, w0 = time.process_time(), time.perf_counter()
    out = m(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
    loss = ((out.float() - target) ** 2).mean()
    loss.backward()
    step = _rss("VmHWM") - before
    grads = sum(p.grad.numel() * p.grad.element_size() for p in m.parameters() if p.grad is not None)
    return {"layers": layers, "frames": frames, "size": size, "tokens": tokens_of(frames, size), "ckpt": ckpt,
            "mode": "full" if full else "lora", "weights_bytes": weights, "step_peak_bytes": step,
            "grad_bytes": grads, "peak_reset": reset, "loss": float(loss.detach()), "finite": bool(torch.isfinite(loss)),
            "lora_dtypes": lora_dtypes, "cpu_seconds": round(time.process_time() - c0, 1),
            "wall_seconds": round(time.perf_counter() - w0, 1), "threads": torch.get_num_threads(),
            "attention_backend": "torch sdpa (CPU)"}


def predict(layers: int, tokens: int, full: bool, activation: dict | None = None) -> dict:
    """The planner's bytes for one setting: ``weights`` (transformer bf16 + LoRA fp32) and ``step`` (activations +
    gradients), from :func:`mmgrpo.utils.memory_plan.plan` with the counts of the model cut to ``layers``;
    ``activation``: constants to use instead of the planner's (e.g. the meta-device count)."""
    from flow_grpo.memory_plan import counts
    from mmgrpo.utils.memory_plan import get_spec, plan

    n = counts(get_spec(MODEL), layers, LORA_R, ("to_q", "to_k", "to_v", "to_out.0"))
    p = plan(MODEL, full=full, rows=1, flow_tokens=tokens, gpu=False, n=n, activation=activation)
    return {"weights": n["full"] * 2 + (0 if full else p["lora_weights"]),
            "step": p["activations"] + p["grads"], "activations": p["activations"], "grads": p["grads"]}


def fit(rows: list[dict]) -> dict:
    """Least squares of ``step = c + tokens x (a_fixed + layers x a_layer)`` over the checkpointed LoRA settings:
    the measured activation constants (bytes per video token; ``c``: what does not grow with the clip, e.g. the 512
    text tokens' projections, which the planner leaves out) and each setting's residual."""
    import numpy as np

    pts = [r for r in rows if r["ckpt"] and r["mode"] == "lora"]
    a = np.array([[1.0, r["tokens"], r["tokens"] * r["layers"]] for r in pts])
    y = np.array([r["step_peak_bytes"] - r["grad_bytes"] for r in pts], dtype=float)
    (c, a_fixed, a_layer), *_ = np.linalg.lstsq(a, y, rcond=None)
    res = [{"layers": r["layers"], "tokens": r["tokens"], "residual": round(float((a @ [c, a_fixed, a_layer])[i]
                                                                                  / y[i] - 1), 4)}
           for i, r in enumerate(pts)]
    return {"a_layer": round(float(a_layer), 1), "a_fixed": round(float(a_fixed), 1), "c": round(float(c)),
            "residuals": res}


GRID = [  # (layers, frames, size, ckpt, full): 2 depths x 2 token counts with checkpointing, then without, then full
    (1, 2, 32, True, False), (2, 2, 32, True, False), (1, 8, 32, True, False), (2, 8, 32, True, False),
    (1, 2, 32, False, False), (1, 8, 32, False, False), (1, 2, 32, True, True),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help="run one setting in this process, print its JSON")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--frames", type=int, default=2, help="latent frames")
    ap.add_argument("--size", type=int, default=32, help="latent height = width (video tokens: size^2 / 4 a frame)")
    ap.add_argument("--ckpt", type=int, default=1)
    ap.add_argument("--full", type=int, default=0)
    ap.add_argument("--lora-fp32", type=int, default=1, help="adapters in fp32 as the trainer (0: bf16)")
    ap.add_argument("--only", type=str, default="", help="comma-separated indices of GRID to run (default all)")
    ap.add_argument("--json", type=str, default="", help="append results (one JSON object a line) here")
    ap.add_argument("--fit", type=str, default="", help="fit the activation constants to a --json file and exit")
    a = ap.parse_args(argv)
    if a.fit:
        with open(a.fit) as f:
            print(json.dumps(fit([json.loads(line) for line in f if line.strip()]), indent=1))
        return 0
    if a.worker:
        print(json.dumps(worker(a.layers, a.frames, a.size, bool(a.ckpt), bool(a.full), bool(a.lora_fp32))))
        return 0
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", PYTHONPATH=ROOT)
    grid = [GRID[int(i)] for i in a.only.split(",")] if a.only else GRID
    print(f"{'L':>2} {'tokens':>6} {'ckpt':>4} {'mode':>4} {'meas step MiB':>13} {'pred step MiB':>13} "
          f"{'err':>7} {'counted':>8} {'err':>7} {'meas w MiB':>10} {'pred w MiB':>10} {'cpu s':>6}")
    for layers, frames, size, ckpt, full in grid:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--layers", str(layers), "--frames",
               str(frames), "--size", str(size), "--ckpt", str(int(ckpt)), "--full", str(int(full))]
        r = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
        from mmgrpo.utils.memory_plan import ACTIVATION_COUNTED

        p = predict(layers, r["tokens"], full)
        pc = predict(layers, r["tokens"], full, ACTIVATION_COUNTED[MODEL])
        r.update(counted_step_bytes=round(pc["step"]),
                 counted_step_error=round((pc["step"] - r["step_peak_bytes"]) / r["step_peak_bytes"], 4))
        r.update(pred_step_bytes=round(p["step"]), pred_weights_bytes=round(p["weights"]),
                 pred_activation_bytes=round(p["activations"]),
                 step_error=round((p["step"] - r["step_peak_bytes"]) / r["step_peak_bytes"], 4),
                 weights_error=round((p["weights"] - r["weights_bytes"]) / r["weights_bytes"], 4),
                 load=os.getloadavg()[0])
        print(f"{layers:>2} {r['tokens']:>6} {int(ckpt):>4} {r['mode']:>4} {r['step_peak_bytes'] / MiB:>13.1f} "
              f"{p['step'] / MiB:>13.1f} {r['step_error']:>+7.1%} {pc['step'] / MiB:>8.1f} {r['counted_step_error']:>+7.1%} "
              f"{r['weights_bytes'] / MiB:>10.1f} "
              f"{p['weights'] / MiB:>10.1f} {r['cpu_seconds']:>6}", flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
