#!/usr/bin/env python
"""Write a full fine-tuning checkpoint of ``mmgrpo train`` as a model folder the eval harness loads.

    python scripts/experiments/export_vlm.py RUN_DIR BASE_MODEL OUT_DIR

RUN_DIR is the training run folder (its newest ``checkpoints/step-*`` is used) or one checkpoint folder. A LoRA run
needs no export (``eval/generate_vlm.py adapter=<checkpoint>`` applies the adapter); a full fine-tuning checkpoint
holds only the trained tensors (``policy.pt``), so this loads BASE_MODEL, overwrites those tensors, and saves the
model plus every non-weight file of BASE_MODEL (configs, tokenizer, chat template, processor) to OUT_DIR.
Sharded (FSDP / DeepSpeed) runs store the gathered weights in ``policy.pt`` too (``run.grad_sync=accelerate``).
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

WEIGHTS = (".safetensors", ".bin", ".pt", ".pth")


def latest_checkpoint(run: Path) -> Path:
    if (run / "policy.pt").is_file():
        return run
    ckpts = sorted((run / "checkpoints").glob("step-*"))
    if not ckpts:
        raise FileNotFoundError(f"{run}: no policy.pt and no checkpoints/step-* folder (did the run save?)")
    return ckpts[-1]


def export(run: str, base: str, out: str) -> Path:
    import torch

    from mmgrpo.vlm.models.adapters import detect_family, get_adapter

    ckpt = latest_checkpoint(Path(run))
    if (ckpt / "adapter").is_dir():
        raise ValueError(f"{ckpt} is a LoRA checkpoint: evaluate it with adapter={ckpt} instead of exporting")
    sd = torch.load(ckpt / "policy.pt", map_location="cpu", weights_only=True)
    if not sd:
        raise ValueError(f"{ckpt / 'policy.pt'}: no trained tensors")
    model = get_adapter(detect_family(base)).model_class().from_pretrained(base, dtype="auto")
    res = model.load_state_dict(sd, strict=False)
    if res.unexpected_keys:  # every trained tensor must land somewhere
        raise ValueError(f"{ckpt / 'policy.pt'}: tensors not in {base}: {res.unexpected_keys[:5]}")
    dst = Path(out)
    dst.mkdir(parents=True, exist_ok=True)
    for f in Path(base).iterdir():  # configs, tokenizer, processor, chat template
        if f.is_file() and not f.name.endswith(WEIGHTS) and not f.name.endswith(".index.json"):
            shutil.copy2(f, dst / f.name)
    model.save_pretrained(dst)
    print(f"exported {ckpt} ({len(sd)} trained tensors) on {base} -> {dst}")
    return dst


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    export(*argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
