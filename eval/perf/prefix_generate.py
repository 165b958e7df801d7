"""Benchmark ``prefix_generate_speedup``: sampling G completions of one video prompt, repeated vs shared prefix.

A = repeated: ``HFRolloutBackend(shared_prefix=False)``: ``model.generate`` on the prompt repeated G times (G
    vision-tower passes, G prefills of the ~1k-token prompt, then G rows decoded);
B = shared: ``HFRolloutBackend(shared_prefix=True)``: one vision-tower pass and one prefill, the KV cache repeated
    to G rows, the same G rows decoded (``mmgrpo.vlm.models.rollout.shared_prefix_sample``).

Both: the same model (``load_policy`` on one saved folder: fp32, sdpa; ``mid`` by default, see common.VLM_SIZES),
the same video prompt (32 frames at 224x224 -> 1024 video tokens), G = 8, exactly ``--T`` = 64 new tokens (EOS is
suppressed in both so every row runs to the end), temperature 1, the same per-row seeds.  One untimed call of
each (with --quick: the timed calls) checks the numbers: the sampled tokens must be identical and the sampling
log-probs equal to within 1e-5 (reported as ``tokens_equal`` / ``max_abs_logprob_diff``).  Timed interleaved (A,B,B,A,...), median of
the paired ratios A/B.

Prints ``<model>: ...`` and the headline LAST: ``prefix_generate_speedup=X.XX``.

Modes: full (default) = mid, 5 repetitions; ``--quick`` = mid, 1 repetition, no untimed check calls (a G=1,
2-token warm-up of each side; the check compares the timed calls' outputs; ~30 s at load 8 on 2 cores);
``--smoke`` = tiny, 8 frames, T = 8, 1 repetition.

    python eval/perf/prefix_generate.py [--quick | --smoke] [--model mid] [--G 8] [--T 64] [--json out.json]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(0, os.path.dirname(os.path.dirname(_HERE)))  # a checkout without `pip install -e .`

import common  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="mid model, 1 repetition")
    p.add_argument("--smoke", action="store_true", help="tiny model, short video, 8 tokens, 1 repetition")
    p.add_argument("--model", default=None, help="tiny | mid (default mid; tiny with --smoke)")
    p.add_argument("--G", type=int, default=8, help="completions per prompt")
    p.add_argument("--T", type=int, default=None, help="new tokens per completion (default 64; 8 with --smoke)")
    p.add_argument("--frames", type=int, default=None,
                   help="video frames (224x224): 32 -> 1024 video tokens (default; 8 with --smoke)")
    p.add_argument("--reps", type=int, default=None, help="timed rounds (default 5; 1 with --quick or --smoke)")
    p.add_argument("--warmup", type=int, default=0, help="extra untimed calls of each side (the check calls warm up)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default="")
    p.add_argument("--model-dir", default="", help="reuse/save the model folder here (default: a temp dir)")
    a = p.parse_args(argv)
    a.model = a.model or ("tiny" if a.smoke else "mid")
    a.T = a.T or (8 if a.smoke else 64)
    a.frames = a.frames or (8 if a.smoke else 32)
    if a.reps is None:
        a.reps = 1 if (a.smoke or a.quick) else 5
    a.check_call = not a.quick
    return a


def run(args, root: str) -> dict:
    import torch

    from mmgrpo.vlm.models.adapters import load_policy
    from mmgrpo.vlm.models.inputs import build_prompt_item
    from mmgrpo.vlm.models.rollout import HFRolloutBackend, SamplingParams
    from mmgrpo.vlm.models.tiny import synthetic_frames

    d = os.path.join(root, args.model)
    if not os.path.exists(os.path.join(d, "config.json")):
        common.save_bench_vlm(d, args.model)
    pol = load_policy(d)
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text":
            "When does the person open the door? Answer with start and end times in seconds."}]}]
    item = build_prompt_item(pol.processor, pol.adapter, msgs,
                             video=synthetic_frames(0, args.frames, 224, 224), sample_fps=2.0)
    P = int(item["input_ids"].shape[1])
    n_video = int((item["mm_token_type_ids"] == 2).sum())
    eos = pol.tokenizer.convert_tokens_to_ids("<|im_end|>")
    suppress = list(pol.suppress_token_ids) + [eos] + ([pol.tokenizer.eos_token_id]
                                                       if pol.tokenizer.eos_token_id is not None else [])
    params = SamplingParams(max_new_tokens=args.T, temperature=1.0)
    seeds = list(range(1000, 1000 + args.G))
    backends = {name: HFRolloutBackend(pol.model, pol.processor, suppress, max_batch_size=64, shared_prefix=sp)
                for name, sp in (("repeated", False), ("shared", True))}

    def call(name):
        return lambda: backends[name].generate([item], args.G, params, seeds=seeds)

    outs = {}

    def timed(name):
        def fn():
            outs[name] = call(name)()
        return fn

    if args.check_call:  # one untimed call of each side: the correctness check, and the warm-up
        timed("repeated")()
        timed("shared")()
    else:  # --quick: a cheap warm-up (G=1, 2 tokens); the check uses the timed calls' outputs
        warm = SamplingParams(max_new_tokens=2, temperature=1.0)
        for b in backends.values():
            b.generate([item], 1, warm, seeds=[0])
    times = common.interleaved_timing({"repeated": timed("repeated"), "shared": timed("shared")},
                                      reps=args.reps, warmup=args.warmup)
    out_a, out_b = outs["repeated"], outs["shared"]
    tokens_equal = bool(torch.equal(out_a.completion_ids, out_b.completion_ids))
    lp_diff = float((out_a.logprobs - out_b.logprobs).abs().max())
    T_out = int(out_b.completion_ids.shape[1])
    st = common.ratio_stats(times["repeated"], times["shared"])
    info = common.vlm_size_info(d)
    op = common.operating_point(prompt_tokens=P, media_tokens=n_video, media="video", new_tokens=T_out, G=args.G,
                                model=f"{args.model} Qwen2.5-VL", hidden=info["hidden"], layers=info["layers"],
                                vocab=info["vocab"], threads=args.threads, extra="sampling only")
    res = {"model": args.model, "params": common.count_params(pol.model), "prompt_tokens": P, "operating_point": op,
           "video_tokens": n_video, "G": args.G, "T": T_out, "tokens_equal": tokens_equal,
           "max_abs_logprob_diff": lp_diff, "speedup": st["ratio_median"],
           **{f"timing_{k}": v for k, v in st.items()}}
    print(f"{args.model}: params={res['params'] / 1e6:.2f}M prompt={P} (video {n_video}) G={args.G} T={T_out} | "
          f"repeated {st['A_median_s']:.3f}s shared {st['B_median_s']:.3f}s (reps={args.reps}) | speedup "
          f"median={st['ratio_median']:.2f} [{st['ratio_min']:.2f}..{st['ratio_max']:.2f}] | tokens equal="
          f"{tokens_equal} max|dlogp|={lp_diff:.2e}", flush=True)
    return res


def main(argv=None) -> dict:
    args = parse_args(argv)
    common.set_threads(args.threads)
    t0 = time.time()
    root = args.model_dir or tempfile.mkdtemp(prefix="mmgrpo_perf_pgen_")
    try:
        res = run(args, root)
    finally:
        if not args.model_dir:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
    if not res["tokens_equal"] or res["max_abs_logprob_diff"] > 1e-5:
        print(f"WARNING: shared and repeated paths disagree (tokens equal={res['tokens_equal']}, "
              f"max|dlogp|={res['max_abs_logprob_diff']:.2e})", flush=True)
    out = {"benchmark": "prefix_generate",
           "command": common.command_line("prefix_generate.py", argv or sys.argv[1:]),
           "machine": common.machine_info(), "wall_s": time.time() - t0, "result": res,
           "prefix_generate_speedup": res["speedup"]}
    out["operating_point"] = res["operating_point"]
    print(f"operating point: {res['operating_point']['text']}", flush=True)
    common.emit(out, args.json, ("prefix_generate_speedup", res["speedup"]))
    return out


if __name__ == "__main__":
    main()
