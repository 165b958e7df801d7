"""Small timing helpers shared by the ``eval/perf`` benchmarks (no torch import at module level).

The machine is shared (2 cores, other jobs running), so absolute times drift.  Every benchmark therefore

* warms both sides up (first calls pay lazy initialisation, allocator growth, kernel selection),
* runs A and B **interleaved** in one process (A,B then B,A, ...: a load change hits both sides),
* reports the **median of the paired per-round ratios** (each round's A and B ran back to back) and the medians,
* measures peak memory either as the traced Python/torch-CPU peak of one call (``peak_traced_mb``; tracemalloc
  sees torch's CPU allocations through its allocator hooks only partially, so prefer RSS for torch work) or as
  a process's peak RSS (``peak_rss_mb``; run each side in its own subprocess for a fair comparison).

Every ratio is printed with its operating point (``operating_point``: prompt and completion lengths, G, model
width / depth / vocabulary, dtype, threads), and its JSON carries it.

Public helpers: ``interleaved_timing``, ``ratio_stats``, ``rss_mb``, ``peak_rss_mb``, ``peak_traced_mb``,
``machine_info``, ``set_threads``, ``emit``, ``operating_point``, ``vlm_size_info``.
"""
from __future__ import annotations

import gc
import json
import os
import platform
import resource
import statistics
import sys
import time
from typing import Any, Callable, Optional


def set_threads(n: int) -> None:
    """torch intra-op threads (1 by default in our benchmarks: oversubscribing 2 shared cores is erratic)."""
    import torch

    torch.set_num_threads(max(1, int(n)))


def interleaved_timing(fns: dict[str, Callable[[], Any]], reps: int, warmup: int = 1,
                       sync: Optional[Callable[[], None]] = None) -> dict[str, list[float]]:
    """Wall-clock seconds per call of each fn: ``warmup`` untimed calls each, then ``reps`` rounds in which every
    fn runs once, the order reversed every other round.  GC is collected before and disabled inside a timed call."""
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            fns[n]()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(reps):
        for n in (names if r % 2 == 0 else names[::-1]):
            gc.collect()
            gc.disable()
            try:
                t0 = time.perf_counter()
                fns[n]()
                if sync is not None:
                    sync()
                times[n].append(time.perf_counter() - t0)
            finally:
                gc.enable()
    return times


def ratio_stats(a: list[float], b: list[float]) -> dict:
    """Paired statistics of A vs B times (seconds): ``ratio_median`` = median_r(a_r / b_r) is the headline;
    also the ratio of medians, min/max of the paired ratios and each side's median/min."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need equally many (>0) paired times, got {len(a)} and {len(b)}")
    paired = [x / y for x, y in zip(a, b)]
    return {
        "A_s": [round(x, 6) for x in a], "B_s": [round(x, 6) for x in b],
        "A_median_s": statistics.median(a), "B_median_s": statistics.median(b),
        "A_min_s": min(a), "B_min_s": min(b),
        "ratio_median": statistics.median(paired), "ratio_of_medians": statistics.median(a) / statistics.median(b),
        "ratio_min": min(paired), "ratio_max": max(paired),
    }


def rss_mb() -> float:
    """Current resident set size of this process (MiB), from /proc (psutil if /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # pragma: no cover - not Linux
        import psutil

        return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    """Peak RSS of this process so far (MiB): ``ru_maxrss`` (KiB on Linux, bytes on macOS)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 2**20 if sys.platform == "darwin" else r / 1024


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS counter (Linux >= 4.0: write 5 to /proc/self/clear_refs), so a later
    ``peak_rss_mb`` measures from here.  Returns False when not supported (then the peak includes the past)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_hwm_mb() -> float:
    """VmHWM (peak RSS, resettable with ``reset_peak_rss``) in MiB; falls back to ``peak_rss_mb``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:  # pragma: no cover
        pass
    return peak_rss_mb()


def peak_traced_mb(fn: Callable[[], Any]) -> float:
    """Peak of Python-level allocations (tracemalloc) during one call of fn, MiB.  Cheap objects only: torch's
    CPU tensor storage is NOT traced, use the RSS helpers for tensor work."""
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def command_line(script: str, argv) -> str:
    """``python eval/perf/<script> ARGS`` as a result JSON records it: absolute paths in ``argv`` become relative to
    the working folder (``mmgrpo.utils.portable``), so a committed result names no folder of the machine it ran on."""
    from mmgrpo.utils.portable import portable_argv

    return " ".join(["python", f"eval/perf/{script}"] + portable_argv(list(argv), anchor=os.getcwd()))


def machine_info() -> dict:
    info: dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version(),
                            "cpu_count": os.cpu_count()}
    try:
        info["loadavg_1m"] = round(os.getloadavg()[0], 2)
    except OSError:  # pragma: no cover
        pass
    try:
        import torch
        import transformers

        info.update(torch=torch.__version__, torch_threads=torch.get_num_threads(),
                    transformers=transformers.__version__)
    except ImportError:  # pragma: no cover
        pass
    return info


def release_freed_memory() -> bool:
    """Make freed tensor memory leave the process so in-process RSS deltas mean something (glibc only).

    glibc keeps freed heap memory and raises its mmap threshold dynamically, so after a big call the next call's
    RSS does not grow at all.  A fixed mmap threshold (128 KiB) returns every large block to the OS on free;
    ``malloc_trim(0)`` releases what is already free.  Returns False when glibc is not available."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD (fixed: disables the dynamic adjustment)
        libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
        libc.malloc_trim(0)
        return True
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return False


def peak_during(fn: Callable[[], Any]) -> tuple[Any, float]:
    """(fn(), peak RSS during the call minus RSS before it, MiB) -- the call's extra working set.  Call
    ``release_freed_memory()`` once first, otherwise memory kept by the allocator hides later calls' needs."""
    gc.collect()
    release_freed_memory()
    before = rss_mb()
    exact = reset_peak_rss()
    out = fn()
    peak = peak_hwm_mb() if exact else peak_rss_mb()
    return out, max(0.0, peak - before)


# ------------------------------------------------------------------------------ VLMs for the VLM benchmarks
VLM_SIZES = {
    # tiny: mmgrpo.vlm.models.tiny (hidden 64, 2 layers, ~0.2M); mid: hidden 256, 6 layers, MLP 1024 (~6.5M)
    "mid": dict(text=dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=4,
                          num_key_value_heads=2, mrope_section=[8, 12, 12]),
                vision=dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2)),
}


def save_bench_vlm(directory: str, size: str = "tiny", family: str = "qwen2_5_vl", seed: int = 0,
                   video_max_tokens_per_frame: int = 64, image_max_tokens: int = 256) -> str:
    """Save a random Qwen-VL (``tiny`` from mmgrpo.vlm.models.tiny, or ``mid``) + its processor to ``directory``.

    The processor's video size allows up to ``video_max_tokens_per_frame`` merged tokens per temporal patch
    (224x224 frames -> 64), so a 32-frame clip gives a 1024-token video prefix; images up to ``image_max_tokens``
    merged tokens (448x448 -> 256)."""
    import torch

    from mmgrpo.vlm.models.adapters import get_adapter
    from mmgrpo.vlm.models.tiny import build_tiny_model, build_tiny_processor, model_class, tiny_config

    proc = build_tiny_processor(family)
    f = 2 * get_adapter(family).patch_size  # a merged token's side: 28, Qwen3-VL 32
    proc.video_processor.size = {"shortest_edge": 4 * f * f, "longest_edge": video_max_tokens_per_frame * f * f}
    proc.image_processor.size = {"shortest_edge": 4 * f * f, "longest_edge": image_max_tokens * f * f}
    if size == "tiny":
        model, proc = build_tiny_model(family, processor=proc, seed=seed)
    elif size in VLM_SIZES:
        spec = VLM_SIZES[size]
        d = tiny_config(family, proc.tokenizer).to_dict()
        t = spec["text"]
        d["text_config"].update({k: v for k, v in t.items() if k != "mrope_section"})
        d["text_config"].pop("layer_types", None)
        d["text_config"]["rope_parameters"] = dict(d["text_config"]["rope_parameters"],
                                                   mrope_section=list(t["mrope_section"]))
        vis = dict(spec["vision"], out_hidden_size=t["hidden_size"])
        if family == "qwen2_vl":  # Qwen2-VL's vision config: embed_dim = ViT width, hidden_size = merger output
            vis = dict(depth=vis["depth"], embed_dim=vis["hidden_size"], hidden_size=t["hidden_size"],
                       num_heads=vis["num_heads"])
        d["vision_config"].update(vis)
        cfg = type(tiny_config(family, proc.tokenizer)).from_dict(d)
        cfg._attn_implementation = "sdpa"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = model_class(family)(cfg)
        ref, _ = build_tiny_model(family, processor=proc, seed=seed)
        model.generation_config = ref.generation_config  # suppress vision tokens, sampling defaults
    else:
        raise ValueError(f"unknown size {size!r}; expected tiny or one of {sorted(VLM_SIZES)}")
    os.makedirs(directory, exist_ok=True)
    model.save_pretrained(directory)
    proc.save_pretrained(directory)
    return directory


def vlm_size_info(model_dir: str) -> dict:
    """Width and depth of a saved Qwen-VL (its config.json): LLM hidden size, layers, vocabulary, vision tower."""
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    t, v = c.get("text_config", c), c.get("vision_config", {})
    return {"hidden": t.get("hidden_size"), "layers": t.get("num_hidden_layers"), "vocab": t.get("vocab_size"),
            "vision_hidden": v.get("hidden_size", v.get("embed_dim")), "vision_depth": v.get("depth"),
            "image_token_id": c.get("image_token_id"), "video_token_id": c.get("video_token_id")}


def operating_point(**fields) -> dict:
    """The setting a ratio was measured at, as a dict with a one-line ``text``: a ratio means little without it
    (the prefix-sharing gains shrink as completions grow, the memory ratio moves with the head's width).  Known
    keys, all optional: prompt_tokens, media_tokens + media ("image" / "video"), new_tokens, B, G, rows, model,
    hidden, layers, vocab, dtype, threads, device, extra (free text)."""
    f = {k: v for k, v in fields.items() if v is not None}
    parts = []
    if "prompt_tokens" in f:
        media = f" ({f['media_tokens']} {f.get('media', 'media')})" if "media_tokens" in f else ""
        parts.append(f"prompt {f['prompt_tokens']} tokens{media}")
    if "new_tokens" in f:
        parts.append(f"{f['new_tokens']} new tokens")
    if "G" in f:
        parts.append(f"{f['B']} prompt(s) x G={f['G']}" if "B" in f else f"G={f['G']}")
    elif "rows" in f:
        parts.append(f["rows"] if isinstance(f["rows"], str) else f"{f['rows']} rows")
    if "model" in f or "hidden" in f:
        dims = ", ".join(x for x in (f"hidden {f['hidden']}" if "hidden" in f else "",
                                     f"{f['layers']} layers" if "layers" in f else "",
                                     f"vocab {f['vocab']:,}" if "vocab" in f else "") if x)
        parts.append(f"{f.get('model', 'model')} ({dims})" if dims else str(f["model"]))
    if "extra" in f:
        parts.append(str(f["extra"]))
    parts.append(str(f.get("dtype", "float32")))
    if "threads" in f:
        parts.append(f"{f['threads']} thread{'s' if f['threads'] != 1 else ''}")
    parts.append(str(f.get("device", "CPU")))
    f["text"] = ", ".join(p for p in parts if p)
    return f


def count_params(model) -> int:
    return int(sum(p.numel() for p in model.parameters()))


def emit(result: dict, json_path: str = "", headline: tuple[str, float] | None = None) -> None:
    """Write ``result`` to ``json_path`` (if given) and print the headline ``name=X.XX`` as the LAST line."""
    if json_path:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2, default=float)
    if headline is not None:
        print(f"{headline[0]}={headline[1]:.2f}", flush=True)


__all__ = ["set_threads", "interleaved_timing", "ratio_stats", "rss_mb", "peak_rss_mb", "reset_peak_rss",
           "peak_hwm_mb", "peak_traced_mb", "machine_info", "emit", "operating_point", "vlm_size_info"]
