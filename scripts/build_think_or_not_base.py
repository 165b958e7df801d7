#!/usr/bin/env python
"""Build the think-or-not bases: hub-free tiny Qwen2.5-VLs SFT'd on short traces (issue #38 item 4, TON's row).

    python scripts/build_think_or_not_base.py --out runs/ton_base/dropout --dropout 0.5   # TON's cold start
    python scripts/build_think_or_not_base.py --out runs/ton_base/think   --dropout 0     # the always-think one
    python scripts/build_think_or_not_base.py --out /tmp/tb --smoke                       # wiring check, seconds

1. generate the think-or-not benchmark (``mmgrpo.synthetic.think_or_not``) into ``<out>/data``;
2. a byte-level BPE tokenizer on the training prompts and targets (``scripts/build_tiny_vlm.py``'s, with its answer
   and think tags), the Qwen2.5-VL processor (56 x 56 px images: 4 visual tokens);
3. a randomly initialised small Qwen2.5-VL (``--init`` continues another build instead);
4. SFT (``mmgrpo.vlm.sft.train_sft``, fixed steps) on one trace per training sample, its thought replaced by TON's
   empty thought ``<think>\\n\\n</think>`` with probability ``--dropout`` (TON's "thought dropout", independent of
   the question's kind);
5. greedy evaluation on the **validation** split per kind: free choice (think ratio, length, accuracy), thought
   forced on, thought forced off (the premise: ``partner`` needs the thought, ``direct`` does not); save,
   ``<out>/base_report.json``.

The two bases of the comparison share the seed, data, tokenizer recipe, steps and batch order; only ``--dropout``
differs.
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
    p.add_argument("--n-train", type=int, default=1200)
    p.add_argument("--n-val", type=int, default=120)
    p.add_argument("--n-heldout", type=int, default=240)
    p.add_argument("--dropout", type=float, default=0.5, help="TON's thought dropout probability (0: always think)")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vision-hidden", type=int, default=32)
    p.add_argument("--vision-depth", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--init", default="", help="continue from this build's folder (its tokenizer, processor, weights)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes and 3 steps: wiring only")
    a = p.parse_args(argv)
    if a.smoke:
        a.n_train, a.n_val, a.n_heldout, a.steps, a.batch_size = 8, 4, 4, 3, 4
    return a


def build_tok_proc(ta_factory, train: list[dict]):
    """Tokenizer (BPE on the training prompts and both targets of every sample) and processor (Qwen2.5-VL, 4 visual
    tokens per 56 x 56 image)."""
    from mmgrpo.vlm.data import prompts
    from mmgrpo.vlm.models.tiny import build_tiny_tokenizer
    from mmgrpo.vlm.synthetic import think_or_not as ton
    from scripts.build_tiny_vlm import build_processor, build_tokenizer

    tmp = build_tiny_tokenizer()
    corpus = []
    for s in train:
        msgs = prompts.build_messages(s, mode="hybrid")
        head = tmp.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        corpus += [head + ton.target_text(s, True), ton.target_text(s, False)]
    tok = build_tokenizer(corpus)
    f2 = 28 * 28
    return tok, build_processor(tok, 4 * f2, 4 * f2)


def main(argv=None) -> dict:
    a = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from mmgrpo.synthetic import think_or_not as bench
    from mmgrpo.vlm import sft
    from mmgrpo.vlm.synthetic import think_or_not as ton
    from scripts.build_tiny_vlm import build_model, count_params

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    t0, c0 = time.perf_counter(), time.process_time()
    out = Path(a.out)
    data = out / "data"
    bench.generate(str(data), a.n_train, a.n_val, a.n_heldout, a.seed)
    train = ton.load_split(str(data / "train.jsonl"))
    val = ton.load_split(str(data / "val.jsonl"))
    if a.init:
        from scripts.demo_tools import load_base

        model, proc = load_base(Path(a.init))
        tok = proc.tokenizer
    else:
        tok, proc = build_tok_proc(ton.task_adapter, train)
        model = build_model(tok, seed=a.seed, hidden=a.hidden, layers=a.layers, heads=4, kv_heads=2,
                            intermediate=3 * a.hidden, vision_hidden=a.vision_hidden, vision_depth=a.vision_depth)
    model.generation_config.max_new_tokens = 24
    params = count_params(model)
    print(f"[model] params {params} vocab {len(tok)}", flush=True)
    ta = ton.task_adapter(proc)
    exs = ton.sft_examples(ta, train, a.dropout, seed=a.seed)
    e = exs[0]
    print(f"[prep] {len(exs)} examples in {time.perf_counter() - t0:.0f}s; prompt {e.prompt['input_ids'].shape[-1]} "
          f"tokens, target {len(e.answer_ids)} tokens: {e.answer_text!r}", flush=True)
    cfg = sft.SFTConfig(steps=a.steps, batch_size=a.batch_size, lr=a.lr, warmup_steps=min(20, a.steps),
                        seed=a.seed, log_every=25)
    c1 = time.process_time()
    res = sft.train_sft(model, exs, cfg, tok.pad_token_id,
                        log=lambda r: print(f"[sft] step {r['step']:4d} loss {r['loss']:.3f} {r['seconds']:.0f}s",
                                            flush=True))
    cpu_sft = time.process_time() - c1
    ev = ton.evaluate(model, proc, val, ta=ta)
    print("[eval val] " + json.dumps({k: ev[k] for k in ("all",) + bench.KINDS}), flush=True)
    for x in ev["examples"][:4]:
        print(f"  {x}", flush=True)
    model.save_pretrained(out)
    proc.save_pretrained(out)
    report = {"args": vars(a), "params": params, "vocab_size": len(tok), "n_examples": len(exs),
              "sft": {k: v for k, v in res.items() if k != "history"}, "sft_cpu_seconds": cpu_sft,
              "cpu_seconds": time.process_time() - c0,
              "loss_curve": [(h["step"], round(h["loss"], 4)) for h in res["history"][:: max(1, a.steps // 40)]],
              "eval_val": ev, "seconds": time.perf_counter() - t0}
    (out / "base_report.json").write_text(json.dumps(report, indent=1))
    print(f"[done] {out} in {report['seconds']:.0f}s (SFT {cpu_sft:.0f} CPU s)", flush=True)
    return report


if __name__ == "__main__":
    main()
