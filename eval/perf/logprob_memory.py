"""Benchmark ``logprob_memory_ratio`` (vs full-logit): extra peak memory of token log-probs + backward, full logits
vs our chunked head; TRL 1.16's own chunked path measured beside them.

A = full: ``F.linear`` -> (N, T, V) fp32 logits -> ``mmgrpo.vlm.models.rollout.token_logprobs_from_logits`` (what the
    trainer did before ``algo.logprob_chunk_size``; a plain log-softmax over full logits);
B = chunked: ``mmgrpo.vlm.models.chunked.chunked_token_logprobs`` (the head applied ``--chunk`` tokens at a time, in the
    forward and in the recomputing backward);
C = trl: ``trl.kernels.ChunkedLogProbFunction`` as TRL 1.16's ``GRPOTrainer`` calls it through its fused LM head
    (``add_fused_lm_head``: tiles of 4,096 tokens x 32,768 vocabulary entries, ``outputs=("log_probs", "entropy")``;
    on CPU its torch fallback).  TRL has no suppressed tokens: its log-probs differ from A's by the 5 vision ids'
    share of the softmax (reported, ~1e-5), not a different computation.

Headline ``logprob_memory_ratio`` = A / B: **vs full logits**, the path without any chunking (TRL's GRPO trainer
stopped using it in 1.x).  ``logprob_memory_ratio_vs_trl`` = C / B is the comparison with what TRL users run.

All: Qwen's vocabulary V = 151,936, N = 8 completions x T = 512 tokens (every token valid, so the chunked side
skips nothing), hidden size H (3584 = Qwen2.5-VL-7B by default; ``--quick`` uses 128 because the CPU matmuls at 3584
take minutes; the logits do not depend on H, but the (V, H) weight gradient every side produces does: at H = 3584
it is 2.1 GiB fp32, which lowers the raw ratios; ``workspace_ratio`` in the JSON leaves the gradients out).  Only
the head is modelled (the transformer's depth is truncated to zero): the layers below it add the same activations
and gradients to every side, so a real model's ratio is lower still; the JSON and the printed operating point say
which H was measured.  fp32, temperature 1, Qwen-VL's vision tokens suppressed (A, B), loss = sum_t c_t logp_t with
fixed random c, ``backward()`` into the hidden states AND the head weight (full fine-tuning: the weight gradient
counts on every side).  Each side runs in its OWN subprocess (fresh allocator, nothing cached from another side);
its extra peak memory = peak RSS during forward+backward minus RSS just before (inputs allocated; glibc told to
return freed blocks, see ``common.peak_during``).  The parent compares the sides' log-probs and gradients (max
relative difference per tensor: max|g_A - g_B| / max|g_A|) and prints

    logprob_grad_max_rel_diff=...      (B vs A; target <= 1e-5)
    logprob_memory_ratio_vs_trl=X.XX   (C / B)
    logprob_memory_ratio=X.XX          (A / B, LAST line; target >= 8)

``--json`` also gets ``extra_keys`` (``logprob_grad_max_rel_diff``, ``logprob_memory_ratio_vs_trl``), which
``run.py`` lifts to its top level.  ``--variants chunked,full`` skips TRL; ``--variants chunked,trl`` skips the full
side (at H = 3584 it needs ~14 GB: then TRL is checked against the chunked side and ``logprob_memory_ratio_vs_trl``
is the last line).

    python eval/perf/logprob_memory.py [--quick | --smoke] [--hidden 3584] [--chunk 256] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
sys.path.insert(0, _HERE)
sys.path.insert(0, _ROOT)  # a checkout without `pip install -e .`

import common  # noqa: E402

QWEN_VOCAB = 151_936
QWEN_VISION_IDS = (151652, 151653, 151654, 151655, 151656)  # <|vision_start|> .. <|video_pad|>: suppressed
VARIANTS = ("full", "chunked", "trl")
TRL_GRPO_OUTPUTS = ("log_probs", "entropy")  # what TRL 1.16's GRPOTrainer asks its fused LM head for


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="hidden 128 (default 3584); same V, N, T")
    p.add_argument("--smoke", action="store_true", help="hidden 64, N=2 x T=64 (checks that it runs)")
    p.add_argument("--vocab", type=int, default=QWEN_VOCAB)
    p.add_argument("--N", type=int, default=None, help="completions (default 8; 2 with --smoke)")
    p.add_argument("--T", type=int, default=None, help="tokens per completion (default 512; 64 with --smoke)")
    p.add_argument("--hidden", type=int, default=None, help="hidden size (default 3584; 128 --quick, 64 --smoke)")
    p.add_argument("--chunk", type=int, default=None,
                   help="tokens per chunk (default: algo.logprob_chunk_size's default)")
    p.add_argument("--freeze-head", action="store_true",
                   help="no gradient for the head weight (as with LoRA): only d hidden is computed and compared")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default="")
    p.add_argument("--variants", default="chunked,full,trl",
                   help="sides to run, in this order (chunked and full are required; trl: TRL 1.16's fused head)")
    p.add_argument("--worker", choices=list(VARIANTS), default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.N = a.N or (2 if a.smoke else 8)
    a.T = a.T or (64 if a.smoke else 512)
    a.hidden = a.hidden or (64 if a.smoke else (128 if a.quick else 3584))
    if a.chunk is None:
        from mmgrpo.vlm.config import AlgoConfig

        a.chunk = AlgoConfig().logprob_chunk_size or 256
    return a


# ------------------------------------------------------------------------------------------------- worker
def _inputs(a):
    import torch

    g = torch.Generator().manual_seed(0)
    h = torch.randn(a.N, a.T, a.hidden, generator=g).requires_grad_()
    w = (torch.randn(a.vocab, a.hidden, generator=g) * (3.0 / a.hidden ** 0.5))  # logits ~ N(0, 9)
    w.requires_grad_(not a.freeze_head)
    ids = torch.randint(0, QWEN_VISION_IDS[0], (a.N, a.T), generator=g)
    mask = torch.ones(a.N, a.T, dtype=torch.long)
    c = torch.randn(a.N, a.T, generator=g) / (a.N * a.T)
    return h, w, ids, mask, c


def _step(a, variant, h, w, ids, mask, c):
    import torch.nn.functional as F

    from mmgrpo.vlm.models.chunked import chunked_token_logprobs
    from mmgrpo.vlm.models.rollout import token_logprobs_from_logits

    sup = [i for i in QWEN_VISION_IDS if i < a.vocab]
    if variant == "full":
        lp = token_logprobs_from_logits(F.linear(h, w), ids, 1.0, sup) * mask
    elif variant == "trl":
        from trl.kernels import ChunkedLogProbFunction

        try:  # the vocabulary tile TRL's fused LM head uses (private; 32,768 in 1.16)
            from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE as vocab_tile
        except ImportError:  # pragma: no cover - another TRL version
            vocab_tile = 32768
        out = ChunkedLogProbFunction.apply(h.reshape(-1, a.hidden), w, None, ids.reshape(-1), 1.0, vocab_tile, None,
                                           1.0, TRL_GRPO_OUTPUTS)
        lp = out[0].view(a.N, a.T) * mask
    else:
        lp = chunked_token_logprobs(h, w, ids, None, 1.0, sup, a.chunk, mask=mask)
    (lp * c).sum().backward()
    return lp.detach()


def _suppression_shift(a, h, w, ids, lp_all):
    """log p_suppressed(y) - log p_all(y) = -log(1 - sum_s p_all(s)) over the suppressed ids s, from a side's
    unsuppressed log-probs (TRL has no suppression) and the 5 suppressed logits, in float64: added to TRL's
    log-probs it must give the full side's (the parent checks to 1e-5), so TRL's numbers are checked too."""
    import torch

    sup = [i for i in QWEN_VISION_IDS if i < a.vocab]
    hd = h.double()
    z_y = (hd * w.double()[ids]).sum(-1)  # (N, T) target logits
    log_z = z_y - lp_all.double()  # log Z over the whole vocabulary
    p_s = torch.exp(hd @ w.double()[sup].T - log_z.unsqueeze(-1)).sum(-1)
    return (-torch.log1p(-p_s)).float()


def worker(a) -> None:
    import torch

    common.set_threads(a.threads)
    # imports before the measured call, so no side's peak counts module loading
    import mmgrpo.vlm.models.chunked  # noqa: F401
    import mmgrpo.vlm.models.rollout  # noqa: F401

    if a.worker == "trl":
        import trl.kernels  # noqa: F401
        import trl.trainer.utils  # noqa: F401
    common.release_freed_memory()
    h, w, ids, mask, c = _inputs(a)
    t0 = time.perf_counter()
    lp, extra = common.peak_during(lambda: _step(a, a.worker, h, w, ids, mask, c))
    secs = time.perf_counter() - t0
    saved = {"lp": lp, "grad_h": h.grad, "grad_w": w.grad}
    if a.worker == "trl":  # after the measurement: what suppressing the vision ids would change in TRL's log-probs
        saved["suppression_shift"] = _suppression_shift(a, h.detach(), w.detach(), ids, lp)
    torch.save(saved, a.out)
    grads_mb = sum(t.numel() * t.element_size() for t in (h.grad, w.grad) if t is not None) / 2**20  # kept outputs
    print(json.dumps({"extra_peak_mb": extra, "grads_mb": grads_mb, "workspace_mb": extra - grads_mb,
                      "seconds": secs}))


# ------------------------------------------------------------------------------------------------- parent
def _start_side(a, variant, out_path) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", variant, "--out", out_path, "--vocab", str(a.vocab),
           "--N", str(a.N), "--T", str(a.T), "--hidden", str(a.hidden), "--chunk", str(a.chunk),
           "--threads", str(a.threads)] + (["--freeze-head"] if a.freeze_head else [])
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), PYTHONPATH=_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=_ROOT)


def _finish_side(variant, proc: subprocess.Popen) -> dict:
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} worker failed ({proc.returncode}): {err[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


def _diffs(A: dict, B: dict) -> tuple[float, dict]:
    """(max |log-prob difference|, {gradient: max|g_A - g_B| / max|g_A|})."""
    lp = float((A["lp"] - B["lp"]).abs().max())
    rel = {k: float((A[k] - B[k]).abs().max() / A[k].abs().max()) for k in ("grad_h", "grad_w") if A[k] is not None}
    return lp, rel


def main(argv=None) -> float:
    a = parse_args(argv)
    if a.worker:
        worker(a)
        return 0.0
    import torch

    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    if "chunked" not in variants or set(variants) - set(VARIANTS) or len(variants) < 2:
        raise SystemExit(f"--variants: chunked and at least one of full, trl, from {VARIANTS}; got {variants}")
    # the numbers are checked against the full side; without it (``--variants chunked,trl``: at H = 3584 the full
    # side needs ~14 GB) against the chunked side, itself checked against the full logits by the tests
    ref = "full" if "full" in variants else "chunked"
    res, diffs, trl_checked = {}, {}, None
    with tempfile.TemporaryDirectory(prefix="lpmem_") as tmp:
        paths = {v: os.path.join(tmp, f"{v}.pt") for v in variants}
        for v in variants:  # one after the other: the full side alone needs ~10 GB at hidden 128
            res[v] = _finish_side(v, _start_side(a, v, paths[v]))
            print(f"{v}: extra peak {res[v]['extra_peak_mb']:.0f} MiB, {res[v]['seconds']:.1f} s", flush=True)
        A = torch.load(paths[ref])
        for v in variants:  # one other side in memory at a time (the weight gradients are 2 GiB each at H = 3584)
            if v != ref:
                C = torch.load(paths[v])
                diffs[v] = _diffs(A, C)
                if v == "trl":  # TRL + the suppression shift it does not apply = the reference side's log-probs
                    trl_checked = float((A["lp"] - (C["lp"] + C["suppression_shift"])).abs().max())
                del C
    ratio = res["full"]["extra_peak_mb"] / max(res["chunked"]["extra_peak_mb"], 1e-9) if "full" in res else None
    logits_mb = a.N * a.T * a.vocab * 4 / 2**20
    mode = "smoke" if a.smoke else ("quick" if a.quick else "full")
    op = common.operating_point(rows=f"{a.N} completions x {a.T} tokens", model="LM head only", hidden=a.hidden,
                                vocab=a.vocab, extra=f"chunk {a.chunk}, head {'trained' if not a.freeze_head else 'frozen'}",
                                dtype="float32", threads=a.threads)
    out = {"name": "logprob_memory_ratio", "value": ratio, "baseline": "full-logit log-softmax",
           "extra_keys": {}, "operating_point": op, "reference_side": ref,
           "config": {"vocab": a.vocab, "N": a.N, "T": a.T, "hidden": a.hidden, "chunk": a.chunk, "dtype": "float32",
                      "head_trained": not a.freeze_head, "threads": a.threads, "mode": mode, "variants": variants},
           "extra_peak_mb": {v: res[v]["extra_peak_mb"] for v in res}, "seconds": {v: res[v]["seconds"] for v in res},
           # the same without the gradients every side must produce (d hidden, d weight: persistent training state)
           "workspace_mb": {v: res[v]["workspace_mb"] for v in res},
           "one_fp32_logits_tensor_mb": logits_mb, "machine": common.machine_info()}
    grad_rel = None
    if "full" in res:
        lp_diff, rel = diffs["chunked"]
        grad_rel = max(rel.values())
        out["extra_keys"]["logprob_grad_max_rel_diff"] = grad_rel
        out.update(workspace_ratio=res["full"]["workspace_mb"] / max(res["chunked"]["workspace_mb"], 1e-9),
                   logprob_max_abs_diff=lp_diff, grad_rel_diff=rel)
        print(f"one fp32 logits tensor (N*T*V): {logits_mb:.0f} MiB; chunked vs full: |logp diff| max {lp_diff:.2e}, "
              f"grad rel diff {rel}")
    if "trl" in res:
        vs_trl = res["trl"]["extra_peak_mb"] / max(res["chunked"]["extra_peak_mb"], 1e-9)
        out["extra_keys"]["logprob_memory_ratio_vs_trl"] = vs_trl
        out["trl"] = {"version": _trl_version(), "outputs": list(TRL_GRPO_OUTPUTS), "checked_against": ref,
                      "logprob_max_abs_diff": diffs["trl"][0], "grad_rel_diff": diffs["trl"][1],
                      "logprob_max_abs_diff_after_suppression": trl_checked,
                      "workspace_ratio_vs_trl": res["trl"]["workspace_mb"] / max(res["chunked"]["workspace_mb"], 1e-9)}
        if "full" in res:
            out["trl"]["full_over_trl"] = res["full"]["extra_peak_mb"] / max(res["trl"]["extra_peak_mb"], 1e-9)
        print(f"trl {out['trl']['version']} vs {ref}: |logp diff| max {diffs['trl'][0]:.2e} (TRL suppresses no "
              f"token; {trl_checked:.2e} after shifting by the suppressed ids' mass), grad rel diff {diffs['trl'][1]}")
        if trl_checked > 1e-5:
            print(f"WARNING: TRL's log-probs do not match the {ref} side's ({trl_checked:.2e} > 1e-5)")
    print(f"operating point: {op['text']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    if grad_rel is not None:
        print(f"logprob_grad_max_rel_diff={grad_rel:.2e}")
    if "trl" in res:
        extra = f" (full logits vs TRL: {out['trl']['full_over_trl']:.2f}x)" if "full" in res else ""
        print(f"ours vs TRL {out['trl']['version']}'s chunked path: {out['extra_keys']['logprob_memory_ratio_vs_trl']:.2f}x "
              f"less extra peak memory{extra} at {op['text']}")
        print(f"logprob_memory_ratio_vs_trl={out['extra_keys']['logprob_memory_ratio_vs_trl']:.2f}", flush=True)
    if ratio is None:
        return out["extra_keys"]["logprob_memory_ratio_vs_trl"]
    print(f"ours vs full-logit log-softmax: {ratio:.2f}x less extra peak memory at {op['text']}")
    print(f"logprob_memory_ratio={ratio:.2f}", flush=True)
    return ratio


def _trl_version() -> str:
    try:
        from importlib.metadata import version

        return version("trl")
    except Exception:  # pragma: no cover - not installed
        return "unknown"


if __name__ == "__main__":
    main()
