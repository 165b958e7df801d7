"""``flow_grpo check``: see what the generator will see, before training (issue #33 item 6).

    flow_grpo check --config configs/flow/flow_grpo_fast_sd35_pickscore.yaml model.pipeline_dir=/ckpt/sd35m \\
        data.train_path=prompts.txt [--num-prompts 4] [--json out.json]

For a recipe and its prompt file it prints, without loading any weight:

* **text-encoder tokens** of the first ``--num-prompts`` prompts, per tokenizer of the pipeline, exactly as the
  adapter's ``encode_prompt`` call tokenises them (diffusers pads to ``max_length`` with truncation: CLIP 77, T5 /
  umT5 ``model.max_sequence_length`` or the release's, FLUX.1 512, SD3 256, Wan 512), the token count before
  truncation, and what truncation drops (the tokens past the limit; the tokenizer's end token is kept); the prompt
  is tokenised as written (WanPipeline first cleans HTML entities and repeated whitespace);
* the **sigma schedule** of a rollout (``sample.num_steps`` at ``sample.height x width``, after ``sample.shift``; the
  adapter's own ``sigmas``: FLUX's resolution-dependent shift, Wan's UniPC grid);
* the **step plan of the first epoch**: for each group of epoch 0 (prompt order and seeds of
  :func:`flow_grpo.data.epoch_samples`, the trainer's), which steps are SDE and which are trained, per sample when
  the plan differs inside a group (:func:`flow_grpo.methods.plans.make_step_plan`, iteration 0).

The pipeline folder is read for its tokenizers, scheduler and configs only: the transformer, VAE and text encoders are
built on the meta device (no memory, no weights read), so checking a 12B FLUX folder takes seconds. ``model.tiny``
builds the tiny pipeline instead. Exit 0; 2 for a bad config or folder.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any, Optional, Sequence

USAGE = "usage: flow_grpo check [--config FILE] [--num-prompts N] [--json FILE] [key=value ...]"


def _meta_pipeline(pipeline_dir: str, kind: str):
    """The folder's pipeline with its tokenizers and scheduler loaded and every model built from its config on the
    meta device."""
    import torch
    import transformers

    from .models import ADAPTERS, detect_kind

    kind = detect_kind(pipeline_dir) if kind == "auto" else kind
    with open(os.path.join(pipeline_dir, "model_index.json")) as f:
        index = json.load(f)
    comps: dict[str, Any] = {}
    for name, spec in index.items():
        if name.startswith("_") or not isinstance(spec, list) or spec[0] is None or spec[1] is None:
            if not name.startswith("_"):
                comps[name] = None
            continue
        lib, cls_name = spec
        cls = getattr(importlib.import_module(lib), cls_name)
        sub = os.path.join(pipeline_dir, name)
        if name.startswith(("tokenizer", "scheduler")) or "processor" in name or "feature_extractor" in name:
            comps[name] = cls.from_pretrained(pipeline_dir, subfolder=name)
        elif not os.path.isdir(sub):
            comps[name] = None
        else:
            with torch.device("meta"):
                if lib == "diffusers":
                    comps[name] = cls.from_config(cls.load_config(sub))
                else:
                    comps[name] = cls._from_config(transformers.AutoConfig.from_pretrained(sub))
    import diffusers

    pipe = getattr(diffusers, ADAPTERS[kind].pipeline_cls_name)(**comps)
    return pipe, kind


def build_light_adapter(cfg):
    """The recipe's adapter without weights: tiny pipelines as the trainer builds them (cheap), a folder's pipeline
    on the meta device (``_meta_pipeline``); ``sample.shift`` and ``sample.num_frames`` applied as in training."""
    from .build import set_num_frames, set_shift
    from .models import ADAPTERS, adapter_from_pipeline

    m = cfg.model
    if m.tiny:
        from .models import TINY_BUILDERS

        ad = adapter_from_pipeline(TINY_BUILDERS[m.tiny](seed=cfg.run.seed),
                                   max_sequence_length=m.max_sequence_length)
    elif m.pipeline_dir:
        pipe, kind = _meta_pipeline(m.pipeline_dir, m.kind)
        ad = ADAPTERS[kind](pipe, device="meta", max_sequence_length=m.max_sequence_length)
    else:
        raise ValueError("set model.pipeline_dir (a diffusers folder) or model.tiny=...")
    set_num_frames(ad, cfg.sample.num_frames)
    set_shift(ad, cfg.sample.shift)
    return ad


def text_tokens(ad, prompts: Sequence[str]) -> list[dict]:
    """Per prompt, per tokenizer of the pipeline: the ids the encoder gets (padding="max_length", truncation, as
    diffusers' ``encode_prompt``), their tokens without padding, the untruncated count and the dropped text."""
    out = []
    toks = [(n, getattr(ad.pipe, n, None)) for n in ("tokenizer", "tokenizer_2", "tokenizer_3")]
    toks = [(n, t) for n, t in toks if t is not None]
    for p in prompts:
        rec = {"prompt": p, "encoders": []}
        for name, tok in toks:
            clip = "CLIP" in type(tok).__name__  # CLIP: its 77 positions (tokenizer_max_length); T5 / umT5: the adapter's
            L = int(tok.model_max_length) if clip else ad.max_sequence_length
            enc = tok(p, padding="max_length", max_length=L, truncation=True, add_special_tokens=True,
                      return_attention_mask=True)
            full = tok(p, padding="longest", add_special_tokens=True).input_ids
            real = [i for i, m in zip(enc.input_ids, enc.attention_mask) if m]
            trunc = len(full) > L
            c = 0  # kept = full[:c] + the special tokens the tokenizer appends (T5 </s>, CLIP EOS): full[c:-tail] dropped
            while c < len(real) and real[c] == full[c]:
                c += 1
            dropped = full[c:len(full) - (len(real) - c)] if trunc else []
            rec["encoders"].append({
                "tokenizer": name, "class": type(tok).__name__, "max_length": L,
                "release_max_length": 77 if clip else ad.release_max_sequence_length,
                "tokens": tok.convert_ids_to_tokens(real), "count": len(real), "untruncated_count": len(full),
                "truncated": trunc, "dropped_tokens": len(dropped), "dropped_text": tok.decode(dropped)})
        out.append(rec)
    return out


def first_epoch_plan(cfg, prompts: list[str], metadata: list[dict]) -> list[dict]:
    """Epoch 0's groups: prompt, and the SDE / trained step indices of each sample (as the trainer draws them)."""
    from .data import epoch_samples
    from .methods import credit_method
    from .methods.plans import make_step_plan

    G = cfg.data.group_size
    n = G * cfg.data.groups_per_epoch
    ps_prompts, _, gids, _, _, plan_seeds = epoch_samples(cfg, prompts, metadata, 0, 0, n)
    plan = make_step_plan(cfg.sample, plan_seeds, iteration=0, members=[s % G for s in range(n)],
                          method=credit_method(cfg))  # a method's own plan (tree, b2, nft) with its options
    groups = []
    for g in range(cfg.data.groups_per_epoch):
        rows = range(g * G, (g + 1) * G)
        per = [{"sde": plan.sde_mask[i].nonzero().flatten().tolist(),
                "trained": plan.train_mask[i].nonzero().flatten().tolist()} for i in rows]
        groups.append({"group": int(gids[g * G]), "prompt": ps_prompts[g * G],
                       "samples": per if any(x != per[0] for x in per) else per[:1],
                       "same_for_all_samples": all(x == per[0] for x in per)})
    return groups


def run_check(cfg, num_prompts: int = 4) -> dict:
    from .data import train_prompts

    prompts, metadata = train_prompts(cfg.data)
    ad = build_light_adapter(cfg)
    s = cfg.sample
    sig = ad.sigmas(s.num_steps, s.height, s.width)
    tokens = text_tokens(ad, prompts[:num_prompts])
    n_trunc = sum(any(e["truncated"] for e in r["encoders"]) for r in text_tokens(ad, prompts))
    return {"model": {"kind": ad.kind, "pipeline_dir": cfg.model.pipeline_dir, "tiny": cfg.model.tiny,
                      "max_sequence_length": ad.max_sequence_length,
                      "release_max_sequence_length": ad.release_max_sequence_length},
            "prompts": {"count": len(prompts), "source": cfg.data.train_path or "data.prompts",
                        "truncated_by_some_encoder": n_trunc},
            "text_encoders": tokens,
            "sigmas": {"num_steps": s.num_steps, "height": s.height, "width": s.width, "shift": s.shift,
                       "values": [round(float(x), 6) for x in sig]},
            "first_epoch": {"method": cfg.method, "step_mode": s.step_mode, "window_size": s.window_size,
                            "window_range": list(s.window_range), "window_policy": s.window_policy,
                            "groups": first_epoch_plan(cfg, prompts, metadata)}}


def format_report(r: dict) -> str:
    m = r["model"]
    lines = [f"model: {m['kind']} ({m['pipeline_dir'] or 'tiny=' + m['tiny']}); T5-type tokens "
             f"{m['max_sequence_length']} (release {m['release_max_sequence_length']})",
             f"prompts: {r['prompts']['count']} from {r['prompts']['source']}; "
             f"{r['prompts']['truncated_by_some_encoder']} truncated by some text encoder", "", "text-encoder tokens:"]
    for i, p in enumerate(r["text_encoders"]):
        lines.append(f"  [{i}] {p['prompt']!r}")
        for e in p["encoders"]:
            t = e["tokens"]
            shown = " ".join(t if len(t) <= 40 else t[:30] + ["..."] + t[-8:])
            lines.append(f"      {e['tokenizer']} ({e['class']}, max {e['max_length']}): {e['count']} tokens: {shown}")
            if e["truncated"]:
                lines.append(f"      TRUNCATED: {e['untruncated_count']} tokens > {e['max_length']}; "
                             f"{e['dropped_tokens']} dropped: {e['dropped_text']!r}")
    sg = r["sigmas"]
    lines += ["", f"sigma schedule ({sg['num_steps']} steps at {sg['height']}x{sg['width']}, shift "
                  f"{sg['shift'] if sg['shift'] is not None else 'from the folder scheduler'}):",
              "  " + " ".join(f"{x:.4f}" for x in sg["values"])]
    fe = r["first_epoch"]
    lines += ["", f"step plan of epoch 0 (method {fe['method'] or '-'}, step_mode {fe['step_mode']}; window "
                  f"{fe['window_size']} in [{fe['window_range'][0]}, {fe['window_range'][1]}), {fe['window_policy']}):"]
    for g in fe["groups"]:
        lines.append(f"  group {g['group']} {g['prompt']!r}:")
        for j, smp in enumerate(g["samples"]):
            who = "all samples" if g["same_for_all_samples"] else f"sample {j}"
            lines.append(f"      {who}: SDE steps {smp['sde']}, trained {smp['trained']}")
    return "\n".join(lines)


def check_main(argv: Sequence[str], prog: str = "flow_grpo check") -> int:
    import argparse

    from .config import load_train_config

    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0] + " See flow_grpo/check.py.")
    p.add_argument("--config", default=None, help="recipe YAML (as flow_grpo train)")
    p.add_argument("--num-prompts", type=int, default=4, help="prompts whose tokens are printed (default 4)")
    p.add_argument("--json", default="", help="also write the report as JSON here")
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. data.train_path=prompts.txt")
    a = p.parse_intermixed_args(list(argv))  # options and key=value overrides in any order
    try:
        cfg = load_train_config(a.config, a.overrides)
        report = run_check(cfg, a.num_prompts)
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    print(format_report(report))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


__all__ = ["build_light_adapter", "text_tokens", "first_epoch_plan", "run_check", "format_report", "check_main"]


def main(argv: Optional[Sequence[str]] = None) -> int:  # python -m flow_grpo.check
    return check_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
