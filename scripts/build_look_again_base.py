#!/usr/bin/env python
"""Build the look-again demo's base: a hub-free tiny Qwen2.5-VL that can call the crop tool (issue #37 item 4).

    python scripts/build_look_again_base.py --out runs/look_again_base            # ~275 CPU s of SFT (~6 min quiet)
    python scripts/build_look_again_base.py --out /tmp/lab --smoke                 # wiring check, seconds

The defaults build the shipped base ``data/checkpoints/look_again_base`` (docs/results.md, "Look-again demo").

1. generate the look-again benchmark (``mmgrpo.synthetic.look_again``) into ``<out>/data`` (train / val /
   heldout) with the demo's layout: ``--marker image --tint 40`` (the whole background's colour says which cell
   holds the object) and ``--object 56`` (a 56-px object: 4 of the crop's 16 visual tokens show the stripes);
2. a byte-level BPE tokenizer on the training prompts and traces, with the answer tokens of
   ``scripts/build_tiny_vlm.py`` and Qwen2.5's tool tokens (``<tool_call>`` ...) as added tokens; the Qwen2.5-VL
   processor (the tiny ChatML template; the rollout engine renders tool turns as Qwen2.5's user turn with
   ``<tool_response>``);
3. a randomly initialised small Qwen2.5-VL (430 k parameters);
4. SFT (``mmgrpo.vlm.sft.train_sft``, fixed steps) in two stages: ``--pretrain-steps`` on single-turn examples
   only (``--crops`` crop examples: the object's cell crop as the image -> the answer; the traces' first turns: the
   view -> the crop call on the object's cell), then ``--steps`` on everything: ``--traces`` tool traces (the first
   turn -> the call; the trace with the crop -> the answer), ``--plain`` plain-prompt examples (the view -> the
   answer, which the view cannot tell: they teach the format and the prior only) and the crop examples;
5. greedy evaluation on the **validation** split (``mmgrpo.vlm.synthetic.look_again.evaluate``), save,
   ``<out>/base_report.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-train", type=int, default=600)
    p.add_argument("--n-val", type=int, default=30)
    p.add_argument("--n-heldout", type=int, default=120)
    p.add_argument("--traces", type=int, default=600, help="training samples given as tool traces")
    p.add_argument("--plain", type=int, default=100, help="training samples given as plain-prompt answers")
    p.add_argument("--crops", type=int, default=600,
                   help="training samples also given as single-turn crop examples (the object's cell crop as the "
                        "image, plain question -> the answer): stage 1 teaches the reading of a crop alone")
    p.add_argument("--pretrain-steps", type=int, default=300,
                   help="stage 1: SFT steps on the single-turn examples only (the crop examples and the traces' "
                        "first turns: view -> call); then --steps on everything")
    p.add_argument("--marker", default="image", choices=["cell", "image"], help="look_again.Layout.marker")
    p.add_argument("--tint", type=int, default=40, help="look_again.Layout.tint (marker colour step)")
    p.add_argument("--object", type=int, default=56, help="look_again.Layout.object (side of the object, source px)")
    p.add_argument("--steps", type=int, default=900)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vision-hidden", type=int, default=64)
    p.add_argument("--vision-depth", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--init", default="", help="continue from this build's folder (its tokenizer, processor, weights)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes and 3 steps: wiring only")
    a = p.parse_args(argv)
    if a.smoke:
        a.n_train, a.n_val, a.n_heldout, a.traces, a.plain, a.steps, a.batch_size = 8, 4, 4, 6, 2, 3, 4
        a.crops, a.pretrain_steps = min(a.crops, 4), min(a.pretrain_steps, 2)
    return a


def build_tok_proc(train: list[dict]):
    """Tokenizer (BPE on the training prompts of both variants, the calls and answers) and processor (Qwen2.5-VL,
    4..16 visual tokens per image: the 112 x 112 view and crops are 16)."""
    from tokenizers import AddedToken

    from mmgrpo.vlm.data import prompts
    from mmgrpo.vlm.models.tiny import build_tiny_tokenizer
    from mmgrpo.vlm.synthetic import look_again as la
    from scripts.build_tiny_vlm import build_processor, build_tokenizer

    tmp = build_tiny_tokenizer()
    corpus = []
    for s in train:
        for tools in (True, False):
            msgs = prompts.build_messages(la.variant(s, tools), mode="no_think")
            corpus.append(tmp.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
                          + la.answer_text(s["answer"]))
        corpus.append(la.tool_call_text(s["meta"]["cell_box_view"]) + "Crop of image 0: source pixels [0, 0, 112, "
                      "112], shown at 112x112.")
    tok = build_tokenizer(corpus)
    tok.add_tokens([AddedToken(t, normalized=False, single_word=False) for t in la.TOOL_TOKENS])
    f2 = 28 * 28
    return tok, build_processor(tok, 4 * f2, 16 * f2)


def main(argv=None) -> dict:
    a = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from mmgrpo.synthetic import look_again as bench
    from mmgrpo.vlm import sft
    from mmgrpo.vlm.synthetic import look_again as la
    from scripts.build_tiny_vlm import build_model, count_params

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    t0 = time.perf_counter()
    out = Path(a.out)
    data = out / "data"
    layout = bench.Layout(marker=a.marker, tint=a.tint, object=a.object)
    bench.generate(str(data), a.n_train, a.n_val, a.n_heldout, a.seed, layout)
    la.write_variants(str(data))
    train = la.load_split(str(data / "train.jsonl"))
    val = la.load_split(str(data / "val.jsonl"))
    if a.init:
        from scripts.demo_tools import load_base

        model, proc = load_base(Path(a.init))
        tok = proc.tokenizer
    else:
        tok, proc = build_tok_proc(train)
        model = build_model(tok, seed=a.seed, hidden=a.hidden, layers=a.layers, heads=4, kv_heads=2,
                            intermediate=3 * a.hidden, vision_hidden=a.vision_hidden, vision_depth=a.vision_depth)
    model.generation_config.max_new_tokens = 40
    params = count_params(model)
    print(f"[model] params {params} vocab {len(tok)}", flush=True)
    ta = la.task_adapter(proc)
    exs = []
    for s in train[:a.traces]:
        exs += la.trace_examples(ta, s)
    for s in train[a.traces:a.traces + a.plain] if a.traces + a.plain <= len(train) else train[:a.plain]:
        exs.append(la.plain_example(ta, s))
    crops = la.crop_examples(ta, train[:a.crops], str(data / "crops"))
    single = crops + exs[0:2 * min(a.traces, len(train)):2]  # crop -> answer; the traces' first turns: view -> call
    exs += crops
    e = exs[0]
    print(f"[prep] {len(exs)} examples in {time.perf_counter() - t0:.0f}s; first-turn prompt "
          f"{e.prompt['input_ids'].shape[-1]} tokens, call {len(e.answer_ids)} tokens: {e.answer_text!r}; "
          f"trace prompt {exs[1].prompt['input_ids'].shape[-1]} tokens", flush=True)
    c0 = time.process_time()
    stages = {}
    for name, examples, steps in (("single_turn", single, a.pretrain_steps), ("all", exs, a.steps)):
        if steps <= 0:
            continue
        cfg = sft.SFTConfig(steps=steps, batch_size=a.batch_size, lr=a.lr, warmup_steps=min(20, steps),
                            seed=a.seed, log_every=25)
        print(f"[sft {name}] {len(examples)} examples, {steps} steps", flush=True)
        res = sft.train_sft(model, examples, cfg, tok.pad_token_id,
                            log=lambda r: print(f"[sft] step {r['step']:4d} loss {r['loss']:.3f} {r['seconds']:.0f}s "
                                                f"{time.process_time() - c0:.0f} CPU s", flush=True))
        stages[name] = res
    cpu_sft = time.process_time() - c0
    ev = la.evaluate(model, proc, val, ta=ta)
    print("[eval val] " + json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in ev.items()
                                      if k != "trajectories"}), flush=True)
    for x in ev["trajectories"][:3]:
        print(f"  {x}", flush=True)
    model.save_pretrained(out)
    proc.save_pretrained(out)
    report = {"args": {**vars(a), "out": Path(a.out).name},  # no machine path in a shipped file
               "params": params, "vocab_size": len(tok), "n_examples": len(exs),
              "layout": layout.__dict__,
              "sft": {n: {k: v for k, v in r.items() if k != "history"} for n, r in stages.items()},
              "sft_cpu_seconds": cpu_sft,
              "loss_curve": {n: [(h["step"], round(h["loss"], 4)) for h in r["history"][:: max(1, len(r["history"]) // 40)]]
                             for n, r in stages.items()},
              "eval_val": ev, "seconds": time.perf_counter() - t0}
    (out / "base_report.json").write_text(json.dumps(report, indent=1))
    print(f"[done] {out} in {report['seconds']:.0f}s (SFT {cpu_sft:.0f} CPU s)", flush=True)
    return report


if __name__ == "__main__":
    main()
