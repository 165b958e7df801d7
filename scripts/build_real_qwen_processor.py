#!/usr/bin/env python
"""Write a real-vocabulary Qwen2.5-VL processor folder, offline (needs `pip install 'mmgrpo[dev]'`).

    python scripts/build_real_qwen_processor.py OUT_DIR [--tiny-model]

OUT_DIR gets the real Qwen tokenizer (151,643 BPE ranks from dashscope's qwen.tiktoken + the released added
tokens at ids 151643-151664), the released chat template and image / video processor settings; it loads with
``AutoProcessor.from_pretrained(OUT_DIR)``.  ``--tiny-model`` also saves a random tiny-width Qwen2.5-VL with the
released vocabulary size (151,936) and special-token ids, so the folder is a complete ``from_pretrained``
checkpoint for tests whose token ids must be real.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", help="folder to write")
    p.add_argument("--tiny-model", action="store_true", help="also save a random tiny model with the real vocab")
    a = p.parse_args(argv)
    from mmgrpo.vlm.models.real_tokenizer import (build_qwen2_5_vl_processor, build_qwen_tokenizer,
                                              save_real_vocab_tiny_model)

    t0 = time.perf_counter()
    proc = build_qwen2_5_vl_processor(build_qwen_tokenizer())
    if a.tiny_model:
        save_real_vocab_tiny_model(a.out_dir, processor=proc)
    else:
        Path(a.out_dir).mkdir(parents=True, exist_ok=True)
        proc.save_pretrained(a.out_dir)
    print(f"wrote {a.out_dir} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
