#!/usr/bin/env python
"""Linear probes on a tiny grounding base: does the query reach the answer position, and do the visual tokens say
which object a 1-s block shows? (issue #16; numbers in docs/history/demo_models.md, "Third round")

    python scripts/probe_grounding_base.py data/checkpoints/tiny_vlm_grounding DATA_DIR [--n 431]

DATA_DIR: a version-2 benchmark draw (``python data/synthetic_tvg.py DATA_DIR --version 2 --clock light --events 2 3
--seed 5``; use a seed the base was not trained on). The base is run on the first ``--n`` training queries with its
own prompt and video settings (``sft_report.json``). Two probes, each a multinomial logistic regression (L-BFGS,
features standardised) fitted on the first two thirds and scored on the rest, printed with the majority-class rate:

* the queried colour / shape from the hidden state of the last prompt position, per layer;
* the colour of the single event visible in a temporal block (2 sampled frames; blocks fully covered by exactly one
  event), from the block's raw pixels, its merged visual tokens (LLM input) and each LLM layer (mean over the
  block's tokens).
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch


def probe(x, y) -> tuple[float, float]:
    """(held-out accuracy, majority rate) of a logistic regression fitted on the first 2/3 of (x, y)."""
    labels = sorted(set(y))
    yy = torch.tensor([labels.index(v) for v in y])
    x = torch.tensor(np.asarray(x), dtype=torch.float32)
    k = len(yy) * 2 // 3
    x = (x - x[:k].mean(0)) / (x[:k].std(0) + 1e-6)
    w = torch.zeros(x.shape[1], len(labels), requires_grad=True)
    b = torch.zeros(len(labels), requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=300)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x[:k] @ w + b, yy[:k]) + 1e-3 * (w ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    acc = ((x[k:] @ w + b).argmax(1) == yy[k:]).float().mean().item()
    return round(acc, 3), round(max((yy[k:] == c).float().mean().item() for c in range(len(labels))), 3)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base", help="checkpoint folder of scripts/build_tiny_vlm.py (with sft_report.json)")
    p.add_argument("data", help="version-2 benchmark folder (train.jsonl + videos/)")
    p.add_argument("--n", type=int, default=431, help="training queries to run")
    args = p.parse_args(argv)
    from transformers import AutoProcessor

    from mmgrpo.vlm import sft
    from mmgrpo.vlm.data import prompts
    from mmgrpo.vlm.models.tiny import model_class

    torch.set_num_threads(1)
    rep = json.loads(open(os.path.join(args.base, "sft_report.json")).read())
    proc = AutoProcessor.from_pretrained(args.base)
    model = model_class("qwen2_5_vl").from_pretrained(args.base, dtype=torch.float32).eval()
    pk = rep["prompt"]
    kw = dict(mode=pk["mode"], answer_format=pk["answer_format"])
    msgs = lambda s: prompts.build_messages(s, query_position=pk.get("query_position", "after"), **kw)  # noqa: E731
    vs = sft.VideoSettings(**{k: rep["video"][k] for k in ("fps", "min_frames", "max_frames", "min_pixels",
                                                             "max_pixels")})
    rows = [json.loads(x) for x in open(os.path.join(args.data, "train.jsonl"))]
    for r in rows:
        r["video"] = os.path.join(args.data, r["video"])
    events: dict[str, list] = {}
    for r in rows:
        events.setdefault(r["video"], []).append(r)
    vid_tok = proc.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    last, col, shp, blocks, cache = [], [], [], {}, {}
    for r in rows[:args.n]:
        ex = sft.prepare_example(r, proc, video=vs, messages_fn=msgs,
                                 answer_fn=lambda s: prompts.format_ground_truth_answer(s, **kw), clip_cache=cache)
        with torch.no_grad():
            hs = model(**ex.prompt, output_hidden_states=True).hidden_states
        last.append([h[0, -1].numpy() for h in hs])
        col.append(r["meta"]["colour"])
        shp.append(r["meta"]["shape"])
        if r["video"] not in blocks:
            t, h, w = ex.prompt["video_grid_thw"][0].tolist()
            pos = (ex.prompt["input_ids"][0] == vid_tok).nonzero()[:, 0]
            feats = [ex.prompt["pixel_values_videos"].reshape(t, h * w, -1).numpy()]
            feats += [x[0, pos].numpy().reshape(t, (h // 2) * (w // 2), -1) for x in hs]
            blocks[r["video"]] = (feats, ex.clip.frame_indices, t)
    print("query at the last prompt position, per layer: (accuracy, majority)")
    for layer in range(len(last[0])):
        print(f"  layer {layer}: colour {probe([x[layer] for x in last], col)}  "
              f"shape {probe([x[layer] for x in last], shp)}")
    names = ["raw pixels", "visual tokens (LLM input)"] + [f"LLM layer {i}" for i in range(1, len(last[0]))]
    print("colour of the one event shown in a block: (accuracy, majority)")
    for j, name in enumerate(names):
        x, y = [], []
        for v, (feats, idx, t) in blocks.items():
            for i in range(t):
                fr = idx[2 * i:2 * i + 2]
                vis = [e for e in events[v] if any(e["meta"]["frames"][0] <= f <= e["meta"]["frames"][1] for f in fr)]
                full = [e for e in vis if all(e["meta"]["frames"][0] <= f <= e["meta"]["frames"][1] for f in fr)]
                if len({e["meta"]["colour"] for e in vis}) == 1 and len(full) == len(vis):
                    x.append(feats[j][i].mean(0))
                    y.append(vis[0]["meta"]["colour"])
        print(f"  {name}: {probe(x, y)} over {len(y)} blocks")


if __name__ == "__main__":
    main()
