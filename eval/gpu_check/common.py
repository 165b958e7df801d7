"""What every section of the GPU check shares: its context (budget, partial results), phase timers, memory probes,
the FLOP count behind MFU, and the Qwen2.5-VL model folder (built once per run).

MFU (model FLOPs utilisation) of the VLM training phase, the convention of the peers' figures (PaLM's "model
FLOPs": recomputation by gradient checkpointing is not counted, EasyR1 / verl report it the same way):

    F_fwd = 2 N_layers t_llm + 2 d V t_comp + 4 L d_attn A + 2 N_vis p
    model FLOPs = 3 (F_fwd - 2 N_vis p) + 2 N_vis p          (forward + backward = 3 forwards; the frozen ViT: forward)
    MFU = model FLOPs / (forward+backward seconds x peak)

``N_layers``: parameters of the LLM's decoder layers (no embedding, no head); ``t_llm``: tokens through the LLM
(shared-prefix log-probs: ``P + R T``, the prompt once per group; naive: ``R (P + T)``); ``d V t_comp``: the output
head on the ``t_comp = R T`` completion positions only; ``A``: attended (query, key) pairs, causal (shared prefix:
``P(P+1)/2 + R (P T + T(T+1)/2)``; naive ``R (P+T)(P+T+1)/2``), ``d_attn`` = heads x head_dim, 4 = QK^T and AV at 2
FLOPs per multiply-add; ``N_vis p``: the vision tower's parameters times its patches (its windowed attention is not
counted: < 1 % at these sizes). ``P`` prompt tokens (vision included), ``R`` rows, ``T`` padded completion length.
LoRA trains no base weight, so its backward does one matmul per layer instead of two: ``mfu_lora_work`` uses
``2 (F_fwd - ...) + ...`` for the work actually done, ``mfu`` keeps the 6N convention of the peers' tables.
Peak: 989 TFLOP/s, H100/H200 dense bf16 (the figure verl-omni uses; a measured 8192^3 bf16 matmul here reaches
~790).
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

H200_BF16_DENSE_TFLOPS = 989.0
GiB = 1024 ** 3


# ------------------------------------------------------------------------------------------------ section context
class Ctx:
    """One section's view of the run: parameters, its deadline, and ``put`` for results (written to disk at once,
    so a section killed at its budget keeps what it measured)."""

    def __init__(self, d: dict):
        self.d = d
        self.name: str = d["section"]
        self.dry_run: bool = d["dry_run"]
        self.out_dir = Path(d["out_dir"])
        self.work_dir = Path(d["work_dir"])
        self.deadline: float = d["section_deadline"]  # absolute time.time()
        self.peak_tflops: float = d["peak_tflops"]
        self.p: dict = d["params"]
        self.result_path = Path(d["result_path"])
        self.results: dict[str, Any] = {}

    @property
    def device(self) -> str:
        import torch

        return "cuda" if torch.cuda.is_available() and not self.dry_run else "cpu"

    def time_left(self) -> float:
        return self.deadline - time.time()

    def put(self, **kv) -> None:
        self.results.update(kv)
        tmp = self.result_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.results, indent=1, default=_jsonable))
        os.replace(tmp, self.result_path)

    def log(self, msg: str) -> None:
        print(f"[{self.name} {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _jsonable(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return repr(x)


def run_section_function(fn: Callable[[Ctx], None], ctx: Ctx) -> int:
    """Call a section; an exception is recorded in its results (``error``) and gives exit code 1."""
    try:
        fn(ctx)
        return 0
    except BaseException as e:  # noqa: BLE001 - the section's error goes into the report; the run goes on
        ctx.put(error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc()[-4000:])
        traceback.print_exc()
        return 1


# ------------------------------------------------------------------------------------------------ timing
def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


class PhaseTimer:
    """Seconds per named phase, synchronised with the GPU at both ends; ``wrap`` a callable to time each call."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, name: str, fn: Callable) -> Callable:
        def timed(*a, **kw):
            sync()
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                sync()
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1
        return timed

    def take(self) -> dict[str, float]:
        out = dict(self.seconds)
        self.seconds.clear()
        self.calls.clear()
        return out


@contextlib.contextmanager
def timed(into: dict, key: str):
    sync()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        sync()
        into[key] = time.perf_counter() - t0


# ------------------------------------------------------------------------------------------------ memory
def _perf_common():
    """eval/perf/common.py (RSS probes; a script folder, not a package)."""
    perf = str(Path(__file__).resolve().parents[1] / "perf")
    if perf not in sys.path:
        sys.path.insert(0, perf)
    import common as perf_common

    return perf_common


def reset_peak_memory(on_gpu: bool) -> None:
    import torch

    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    else:
        _perf_common().reset_peak_rss()


def peak_memory(on_gpu: bool) -> dict[str, float]:
    """GPU: the caching allocator's peaks and the device memory in use now (CUDA context and non-torch
    allocations included), in bytes; ``measured_bytes`` = reserved peak + (device used - reserved now), what the
    planner's GPU plan (allowances included) predicts. CPU: peak RSS (VmHWM)."""
    import torch

    if on_gpu:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        reserved_now = torch.cuda.memory_reserved()
        peak_res = torch.cuda.max_memory_reserved()
        outside = max(0, (total - free) - reserved_now)
        return {"max_allocated_bytes": torch.cuda.max_memory_allocated(), "max_reserved_bytes": peak_res,
                "device_used_bytes": total - free, "device_total_bytes": total, "outside_torch_bytes": outside,
                "measured_bytes": peak_res + outside}
    hwm = _perf_common().peak_hwm_mb() * 2 ** 20
    return {"peak_rss_bytes": hwm, "measured_bytes": hwm}


def planner_comparison(pred: dict, measured: dict, on_gpu: bool) -> dict:
    """Predicted vs measured peak; on CPU the figure is not comparable (RSS holds the whole process)."""
    out = {"predicted_bytes": pred["total"], "predicted_breakdown_gib": {k: round(v / GiB, 3) for k, v in pred.items()
                                                                         if isinstance(v, (int, float))},
           "measured_bytes": measured["measured_bytes"]}
    if on_gpu:
        out["planner_error"] = (pred["total"] - measured["measured_bytes"]) / measured["measured_bytes"]
    else:
        out["planner_error"] = None
        out["note"] = "CPU dry run: RSS is not the GPU peak the planner predicts (no comparison)"
    return out


# ------------------------------------------------------------------------------------------------ FLOPs
def vlm_step_flops(*, n_layer_params: int, n_vis_params: int, hidden: int, vocab: int, layers: int, attn_dim: int,
                   prompt_tokens: int, rows: int, completion_len: int, vision_patches: int,
                   shared_prefix: bool) -> dict[str, float]:
    """FLOPs of one training forward+backward of ``rows`` completions of one prompt (module docstring)."""
    P, R, T = prompt_tokens, rows, completion_len
    if shared_prefix:
        t_llm = P + R * T
        pairs = P * (P + 1) / 2 + R * (P * T + T * (T + 1) / 2)
    else:
        t_llm = R * (P + T)
        pairs = R * (P + T) * (P + T + 1) / 2
    vis = 2.0 * n_vis_params * vision_patches
    llm = 2.0 * n_layer_params * t_llm + 2.0 * hidden * vocab * R * T + 4.0 * layers * attn_dim * pairs
    return {"forward_llm": llm, "forward_vision": vis, "model_flops": 3 * llm + vis, "lora_work_flops": 2 * llm + vis,
            "tokens_llm": float(t_llm), "attended_pairs": float(pairs)}


# ------------------------------------------------------------------------------------------------ models
def default_dtype(dtype):
    """Context: build modules directly in ``dtype`` (a 7B fp32 copy would double the build peak)."""
    import torch

    @contextlib.contextmanager
    def cm():
        prev = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            yield
        finally:
            torch.set_default_dtype(prev)
    return cm()


def qwen_processor(ctx: Ctx):
    """The real Qwen2.5-VL processor (dashscope's BPE ranks, the released chat template), built once per run into
    the work folder and loaded from there by later sections."""
    from transformers import AutoProcessor

    folder = ctx.work_dir / "qwen_processor"
    if not (folder / "done").exists():
        from mmgrpo.vlm.models.real_tokenizer import save_qwen2_5_vl_processor

        save_qwen2_5_vl_processor(folder)
        (folder / "done").write_text("1")
    return AutoProcessor.from_pretrained(folder)


def vlm_folder(ctx: Ctx) -> Path:
    """The Qwen2.5-VL checkpoint folder of this run (random weights at the released widths, ``params["vlm"]``'s
    depth and dtype; sharded safetensors + the real processor), built on the device once; later calls reuse it."""
    import torch

    from mmgrpo.utils.memory_plan import get_spec
    from mmgrpo.vlm.memory_plan import vlm_config
    from mmgrpo.vlm.models.tiny import model_class, vision_token_ids

    v = ctx.p["vlm"]
    folder = ctx.work_dir / "qwen_model"
    done = folder / "built.json"
    if done.exists():
        return folder
    t0 = time.perf_counter()
    proc = qwen_processor(ctx)
    spec = get_spec(v["spec"])
    cfg = vlm_config(spec, v["layers"], v["vision_layers"])
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(ctx.device), default_dtype(getattr(torch, v["dtype"])):
        model = model_class(spec["family"])(cfg)
    tok = proc.tokenizer
    gc = model.generation_config
    gc.suppress_tokens = vision_token_ids(tok)
    gc.bos_token_id = gc.pad_token_id = tok.convert_tokens_to_ids("<|endoftext|>")
    gc.eos_token_id = [tok.convert_tokens_to_ids("<|im_end|>"), gc.pad_token_id]
    t_build = time.perf_counter() - t0
    model.save_pretrained(folder, max_shard_size="5GB")
    proc.save_pretrained(folder)
    n = sum(p.numel() for p in model.parameters())
    del model
    info = {"params": n, "spec": v["spec"], "layers": v["layers"], "build_seconds": t_build,
            "total_seconds": time.perf_counter() - t0}
    done.write_text(json.dumps(info))
    return folder


def synthetic_video_sample(frames: int, height: int, width: int, fps: float = 2.0) -> dict:
    """A TVG sample with in-memory frames (the trainer's frame-list video path; no decoder needed)."""
    from mmgrpo.vlm.models.tiny import synthetic_frames

    return {"id": "gpu_check_video", "task": "tvg", "query": "the person opens the door and walks out",
            "video": synthetic_frames(0, frames, height, width), "meta": {"video_fps": fps},
            "duration": frames / fps, "spans": [[1.0, 2.5]]}


def text_reward(texts, samples):
    """A deterministic reward that varies within a group (random weights never answer a task: a task reward would
    be 0 for every rollout and the step would train nothing): (sum of code points mod 7) / 6."""
    import torch

    acc = torch.tensor([float(sum(map(ord, t)) % 7) / 6.0 for t in texts])
    return {"acc": acc, "total": acc.clone(), "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}


def image_reward(images, prompts, metadata):
    """A deterministic image statistic (mean of the top-left 64x64 block) for the flow sections."""
    import torch

    x = torch.as_tensor(images).float()
    if x.ndim == 5:  # video (B, F, H, W, 3)
        x = x[:, 0]
    return {"block": x[:, :64, :64].mean(dim=(1, 2, 3)) / 255.0}
