"""Benchmark ``data_wait_fraction``: share of VLM GRPO step time spent waiting for data, with ``data.prefetch``.

Real mp4 files (``--seconds`` 10 s at 30 fps, ``--size`` 640x360, H.264 crf 23 written with PyAV),
decoded through decord (``FORCE_QWENVL_VIDEO_READER=decord``) at ``data.video_fps=2`` capped to 16 sampled frames
(``data.max_frames=16``), resized by the processor (``data.video_max_pixels``) and trained on by ``GRPOTrainer``
(the ``mid`` model of common.VLM_SIZES, fp32, 2 prompts x G=4 per step, 32 new tokens, one optimizer step).

The waiting time of a step is the trainer's ``perf/data_wait`` metric (seconds spent in ``PromptFeed.prepare``: with
``data.prefetch=0`` the decoding + preprocessing itself, with prefetching only the wait for the background thread);
the step time is ``perf/step_time``.  Headline = sum(wait) / sum(step time) over the steps after the first with
``data.prefetch`` at its default (2; ``--prefetch N`` for another depth): the steady state of a run.  The first step is excluded because nothing can be prefetched
before it (its batch is prepared inline while the thread starts on the next one); a run pays that once, so in a
short benchmark it would weigh as if a real run had a few steps.  Its wait is reported separately, as are the
fraction over all steps (``data_wait_fraction_incl_step1``, printed and lifted to ``run.py``'s top level beside
the headline) and the fraction with ``data.prefetch=0``.  The two modes run one after the other (not interleaved: a prefetching trainer's
thread would work during the other trainer's steps and flatter it); order prefetch=0 first.

First, with no training running, it prepares each clip inline 3 times and prints the CPU time (process time, so
decord's decoding threads count) and wall time of one sample: the work the background thread must hide behind
each step (2 samples per step).  Prints ``prefetch=N: ...`` lines and the headline LAST:
``data_wait_fraction=X.XX``.  ``--decode-threads 0`` restores FFmpeg's automatic decoder threads (the setting
before ``data.decode_threads`` existed).

Modes: full (default) = mid, 8 steps per mode, two 640x360 clips; ``--quick`` = only the prefetching mode (no
inline reference), the tiny model (a harder test: its step is far shorter than a real one, so the decoding has less
time to hide in), 8 steps like the full mode (4 until session 8: 3 measured steps were mostly the start-up, see
docs/performance.md), one 480x270 clip, 32 new tokens like the full mode (16 until issue #18's third pass, which
made the tiny step, 0.31 s, shorter than any real one; ``--new-tokens 16`` gives the old setting), ~15 s at load 1;
``--smoke`` = tiny model, 2 s clips, 3 steps per mode, 16 new tokens.

    python eval/perf/data_prefetch.py [--quick | --smoke] [--steps N] [--json out.json]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("FORCE_QWENVL_VIDEO_READER", "decord")
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))  # a checkout without `pip install -e .`

import common  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="prefetching mode only, tiny model, one smaller clip")
    p.add_argument("--smoke", action="store_true", help="tiny model, 2 s clips, 3 steps per mode")
    p.add_argument("--model", default=None, help="tiny | mid (default mid; tiny with --quick / --smoke)")
    p.add_argument("--steps", type=int, default=None, help="steps per mode (default 8; 3 with --smoke)")
    p.add_argument("--seconds", type=float, default=None, help="clip length (default 10; 2 with --smoke)")
    p.add_argument("--fps", type=float, default=30.0)
    p.add_argument("--size", default=None, help="WxH of the written mp4s (default 640x360; 480x270 with --quick)")
    p.add_argument("--videos", type=int, default=None,
                   help="distinct mp4 files, samples cycle over them (default 2; 1 with --quick)")
    p.add_argument("--new-tokens", type=int, default=None,
                   help="completion tokens per sample (rollout.max_new_tokens; default 32, 16 with --smoke)")
    p.add_argument("--prefetch", type=int, default=None,
                   help="data.prefetch of the measured mode (default: the config default, 2)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--decode-threads", type=int, default=None,
                   help="data.decode_threads (default: the config default, 1; 0 = FFmpeg's automatic threads, the "
                        "setting before it existed)")
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    a.model = a.model or ("tiny" if (a.smoke or a.quick) else "mid")
    a.steps = a.steps or (3 if a.smoke else 8)  # --quick: 8 too (4 measured mostly the start-up)
    a.seconds = a.seconds or (2.0 if a.smoke else 10.0)
    light = a.quick or a.smoke
    a.size = a.size or ("480x270" if light else "640x360")
    a.videos = a.videos or (1 if light else 2)
    a.new_tokens = a.new_tokens or (16 if a.smoke else 32)  # --quick: 32 like the full mode (was 16: see docs)
    return a


def write_clips(root: str, args) -> list[str]:
    """H.264 mp4s (yuv420p, crf 23, one encoder thread) written with PyAV: a textured background scrolling
    sideways and a moving square (RGB -> yuv420p conversion by libswscale: fast enough to write in the benchmark)."""
    import av
    import numpy as np

    W, H = (int(x) for x in args.size.lower().split("x"))
    n = int(round(args.seconds * args.fps))
    paths = []
    for v in range(args.videos):
        rng = np.random.default_rng(v)
        base = rng.integers(0, 60, (H, W + n, 3), dtype=np.uint8)  # texture: a non-trivial H.264 stream
        base += ((np.arange(W + n) + 40 * v) % 256 // 4).astype(np.uint8)[None, :, None]
        path = os.path.join(root, f"clip{v}.mp4")
        with av.open(path, "w") as c:
            s = c.add_stream("libx264", rate=int(args.fps))
            s.width, s.height, s.pix_fmt = W, H, "yuv420p"
            s.options = {"crf": "23", "preset": "veryfast", "threads": "1"}
            for i in range(n):
                f = np.ascontiguousarray(base[:, i:i + W])
                x0 = int((i / n) * (W - 80))
                f[H // 3:H // 3 + 80, x0:x0 + 80] = (200, 60 + 40 * v, 30)  # a moving square
                for pkt in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                    c.mux(pkt)
            for pkt in s.encode():
                c.mux(pkt)
        paths.append(path)
    return paths


def make_trainer(model_dir: str, out_dir: str, paths: list[str], prefetch: int | None, args):
    import torch

    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.vlm.train.trainer import GRPOTrainer
    from mmgrpo.utils.config import load_config

    overrides = [f"model.path={model_dir}", "model.dtype=float32", "data.task=tvg", "data.prompt_mode=no_think",
                 "data.video_fps=2.0", "data.max_frames=16", "data.min_frames=4",
                 f"data.video_max_pixels={224 * 224}", f"data.video_total_pixels={16 * 224 * 224}",
                 "rollout.group_size=4", f"rollout.max_new_tokens={args.new_tokens}",
                 f"run.max_steps={args.steps}", "run.prompts_per_device=2", "run.micro_batch_size=8",
                 "optim.lr=1e-4", f"run.output_dir={out_dir}", "run.tensorboard=false", "run.save_every=0",
                 "run.resume_from=none", "run.progress_bar=false"]
    if prefetch is not None:  # None: the config default
        overrides.append(f"data.prefetch={prefetch}")
    if args.decode_threads is not None:
        overrides.append(f"data.decode_threads={args.decode_threads}")
    cfg = load_config(TrainConfig, None, overrides)
    samples = [{"id": f"s{i}", "task": "tvg", "query": "when does the square cross the middle?",
                "video": paths[i % len(paths)], "duration": args.seconds,
                "spans": [[args.seconds * 0.4, args.seconds * 0.6]]} for i in range(4 * args.steps)]

    def reward(texts, _samples):
        acc = torch.tensor([float(sum(map(ord, t)) % 7) / 6.0 for t in texts])
        return {"acc": acc, "total": acc.clone(), "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}

    return GRPOTrainer(cfg, samples=samples, reward_fn=reward)


def prepare_cost(model_dir, root, paths, args, reps: int = 3) -> dict:
    """CPU (process time: decord's decoding threads included) and wall seconds to prepare one sample (decode,
    sample, resize, processor) inline, with no training running: what one batch costs the background thread."""
    tr = make_trainer(model_dir, os.path.join(root, "cost"), paths, 0, args)
    s = tr.samples[:len(paths)]
    tr.task.prepare(s[0])  # lazy imports / first-call setup
    cpu, wall = [], []
    for _ in range(reps):
        for x in s:
            w0, c0 = time.perf_counter(), time.process_time()
            tr.task.prepare(x)
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    res = {"decode_threads": tr.cfg.data.decode_threads, "cpu_s": [round(c, 4) for c in cpu],
           "wall_s": [round(w, 4) for w in wall], "cpu_median_s": med(cpu), "wall_median_s": med(wall),
           "batch_cpu_s": 2 * med(cpu)}  # 2 prompts per step
    print(f"prepare one sample inline (data.decode_threads={res['decode_threads']}): CPU median "
          f"{res['cpu_median_s']:.3f}s (min {min(cpu):.3f}), wall median {res['wall_median_s']:.3f}s; "
          f"one step's batch of 2: {res['batch_cpu_s']:.3f}s CPU", flush=True)
    return res


def _cpu_busy_s() -> float | None:
    """Seconds of CPU the whole machine has been busy (all processes; /proc/stat), None where unavailable."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal: everything but idle and iowait is busy
    return (sum(v[:8]) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def run_mode(model_dir, root, paths, prefetch, args) -> dict:
    tr = make_trainer(model_dir, os.path.join(root, f"run{prefetch}"), paths, prefetch, args)
    prefetch = tr.cfg.data.prefetch
    waits, steps, work = [], [], []
    pf = tr.feed.get_prefetcher()
    if pf is not None:  # wall time of each background preparation (stretched when it competes with the step)
        prepare = pf.prepare

        def timed_prepare(sample):
            w0 = time.perf_counter()
            try:
                return prepare(sample)
            finally:
                work.append(time.perf_counter() - w0)

        pf.prepare = timed_prepare
    # how much of the machine other processes took during the steps: the headline depends on it (the step and the
    # background decoding share the cores with them)
    busy0, own0, w0 = _cpu_busy_s(), _own_cpu_s(), time.perf_counter()
    try:
        for _ in range(args.steps):
            m = tr.train(steps=1)[-1]
            waits.append(float(m["perf/data_wait"]))
            steps.append(float(m["perf/step_time"]))
    finally:
        tr.feed.close()
    busy1, own1, w1 = _cpu_busy_s(), _own_cpu_s(), time.perf_counter()
    counts = None if pf is None else {"prefetched": pf.hits, "inline": pf.misses}
    others = None if busy0 is None else max(0.0, (busy1 - busy0) - (own1 - own0)) / (w1 - w0)
    rest = slice(1, None)
    frac = sum(waits[rest]) / max(sum(steps[rest]), 1e-9)
    res = {"prefetch": prefetch, "wait_s": waits, "step_s": steps, "fraction_after_first": frac,
           "first_step_wait_s": waits[0], "headline_steps": f"2..{len(steps)} of {len(steps)}",
           "other_processes_cores": others, "own_cores": (own1 - own0) / (w1 - w0), "samples": counts,
           "fraction_all": sum(waits) / sum(steps),
           "decode_threads": tr.cfg.data.decode_threads,
           "worker_prepare_wall_s": [round(w, 4) for w in work]}  # samples prepared by the background thread
    print(f"prefetch={prefetch}: step median {sorted(steps)[len(steps) // 2]:.2f}s | wait per step "
          f"{' '.join(f'{w:.3f}' for w in waits)} s | wait fraction after step 1 = {frac:.3f} "
          f"(all steps {res['fraction_all']:.3f}; step 1 has nothing prefetched and is left out)", flush=True)
    if others is not None:
        print(f"prefetch={prefetch}: during the steps, other processes used {others:.2f} and this one "
              f"{res['own_cores']:.2f} of the {os.cpu_count()} cores", flush=True)
    if counts:
        print(f"prefetch={prefetch}: samples {counts['prefetched']} prefetched, {counts['inline']} inline", flush=True)
    if work:
        print(f"prefetch={prefetch}: background preparation per sample (data.decode_threads="
              f"{res['decode_threads']}): wall median {sorted(work)[len(work) // 2]:.3f}s over {len(work)} samples",
              flush=True)
    return res


def main(argv=None) -> dict:
    args = parse_args(argv)
    common.set_threads(args.threads)
    t0 = time.time()
    import logging

    logging.getLogger("mmgrpo").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="mmgrpo_perf_data_") as root:
        t_w = time.time()
        paths = write_clips(root, args)
        t_w = time.time() - t_w
        model_dir = common.save_bench_vlm(os.path.join(root, args.model), args.model)
        size = common.vlm_size_info(model_dir)
        cost = prepare_cost(model_dir, root, paths, args)
        inline = None if args.quick else run_mode(model_dir, root, paths, 0, args)  # quick: the headline only
        ahead = run_mode(model_dir, root, paths, args.prefetch, args)
    out = {"benchmark": "data_prefetch",
           "command": common.command_line("data_prefetch.py", argv or sys.argv[1:]),
           "machine": common.machine_info(), "wall_s": time.time() - t0, "write_clips_s": t_w,
           "clip": {"seconds": args.seconds, "fps": args.fps, "size": args.size, "sampled_frames": 16,
                    "reader": os.environ.get("FORCE_QWENVL_VIDEO_READER")},
           "prepare_cost": cost, "inline": inline, "prefetched": ahead,
           "data_wait_fraction": ahead["fraction_after_first"],
           "data_wait_fraction_inline": inline["fraction_after_first"] if inline else None}
    op = common.operating_point(
        model=f"{args.model} Qwen2.5-VL", hidden=size.get("hidden"), layers=size.get("layers"), vocab=size.get("vocab"),
        B=2, G=4, new_tokens=args.new_tokens, threads=args.threads,
        extra=f"{args.steps} steps, {args.videos} x {args.seconds:g} s {args.size} H.264 clip(s) -> 16 frames, "
              f"data.prefetch={ahead['prefetch']}, data.decode_threads={ahead['decode_threads']}")
    out["operating_point"] = op
    # the headline leaves step 1 out (nothing can be prefetched before it); counting it is reported beside it
    out["extra_keys"] = {"data_wait_fraction_incl_step1": ahead["fraction_all"]}
    if inline:
        print(f"data_wait_fraction_inline={inline['fraction_after_first']:.2f}")
    print(f"data_wait_fraction: steps 2..{args.steps} {ahead['fraction_after_first']:.3f} (headline: step 1 has "
          f"nothing prefetched and a run pays it once), all {args.steps} steps {ahead['fraction_all']:.3f} "
          f"(step 1 waited {ahead['first_step_wait_s']:.2f} s) | at {op['text']}")
    print(f"data_wait_fraction_incl_step1={ahead['fraction_all']:.2f}")
    common.emit(out, args.json, ("data_wait_fraction", ahead["fraction_after_first"]))
    return out


if __name__ == "__main__":
    main()
