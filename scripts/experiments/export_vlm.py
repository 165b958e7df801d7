#!/usr/bin/env python
"""Write the newest checkpoint of ``mmgrpo train`` as a folder the eval harness loads with ``model=OUT_DIR``.

    python scripts/experiments/export_vlm.py RUN_DIR BASE_MODEL OUT_DIR [--keep-fp32]

RUN_DIR is the training run folder (its newest ``checkpoints/step-*`` is used) or one checkpoint folder.

* **Full fine-tuning**: a checkpoint holds only the trained tensors (``policy.pt``), so this loads BASE_MODEL,
  overwrites those tensors, and saves the model plus every non-weight file of BASE_MODEL (configs, tokenizer, chat
  template, processor) to OUT_DIR. The model is saved in BASE_MODEL's dtype (``torch_dtype`` of its config.json,
  bf16 for the released Qwen-VL checkpoints): trained tensors in another dtype (fp32 when ``model.dtype=float32``)
  are **cast** to it, which the output says, with the largest change the cast made; ``--keep-fp32`` saves the whole
  model in float32 instead (the base's tensors upcast exactly, the trained ones as they were).
  Sharded (FSDP / DeepSpeed) runs store the gathered weights in ``policy.pt`` too (``run.grad_sync=accelerate``).
* **LoRA** (``model.lora.enabled=true``): the checkpoint's ``adapter/`` (peft) is copied to OUT_DIR with its
  ``adapter_config.json`` pointing at BASE_MODEL, so ``eval/generate_vlm.py model=OUT_DIR`` applies it to the base
  exactly as a full fine-tune's folder is evaluated (nothing is merged or cast here).

``OUT_DIR/export.json`` records what was written: the checkpoint and its step, ``"kind": "full" | "lora"``, the
saved dtype and the casts made.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

WEIGHTS = (".safetensors", ".bin", ".pt", ".pth")


def latest_checkpoint(run: Path) -> Path:
    if (run / "policy.pt").is_file() or (run / "adapter" / "adapter_config.json").is_file():
        return run
    ckpts = sorted((run / "checkpoints").glob("step-*"))
    if not ckpts:
        raise FileNotFoundError(f"{run}: no policy.pt and no checkpoints/step-* folder (did the run save?)")
    return ckpts[-1]


def _write_info(dst: Path, info: dict) -> None:
    (dst / "export.json").write_text(json.dumps(info, indent=1) + "\n")


def export_lora(ckpt: Path, base: str, out: str) -> Path:
    """The checkpoint's peft adapter, its base set to ``base`` (an absolute local path)."""
    src, dst = ckpt / "adapter", Path(out)
    if not (Path(base) / "config.json").is_file():
        raise FileNotFoundError(f"BASE_MODEL={base}: no config.json (the base model folder the run trained on)")
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file():
            shutil.copy2(f, dst / f.name)
    cfg_path = dst / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = str(Path(base).resolve())
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    _write_info(dst, {"checkpoint": str(ckpt.resolve()), "step": _step(ckpt), "kind": "lora",
                      "base": str(Path(base).resolve())})
    print(f"exported the LoRA adapter of {ckpt} on {base} -> {dst} (evaluate with model={dst})")
    return dst


def _step(ckpt: Path):
    try:
        return int(ckpt.name.split("-")[-1])
    except ValueError:
        return None


def export(run: str, base: str, out: str, keep_fp32: bool = False) -> Path:
    import torch

    from mmgrpo.vlm.models.adapters import detect_family, get_adapter

    ckpt = latest_checkpoint(Path(run))
    if (ckpt / "adapter" / "adapter_config.json").is_file():
        return export_lora(ckpt, base, out)
    sd = torch.load(ckpt / "policy.pt", map_location="cpu", weights_only=True)
    if not sd:
        raise ValueError(f"{ckpt / 'policy.pt'}: no trained tensors")
    model = get_adapter(detect_family(base)).model_class().from_pretrained(
        base, dtype=torch.float32 if keep_fp32 else "auto")
    params = dict(model.state_dict())
    unexpected = [k for k in sd if k not in params]
    if unexpected:  # every trained tensor must land somewhere
        raise ValueError(f"{ckpt / 'policy.pt'}: tensors not in {base}: {unexpected[:5]}")
    casts: dict[str, dict] = {}
    for k, v in sd.items():
        to = params[k].dtype
        if v.dtype != to:
            c = casts.setdefault(f"{v.dtype} -> {to}".replace("torch.", ""), {"tensors": 0, "max_abs_change": 0.0})
            c["tensors"] += 1
            c["max_abs_change"] = max(c["max_abs_change"], float((v.to(to).float() - v.float()).abs().max()))
    model.load_state_dict(sd, strict=False)
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    for what, c in casts.items():
        print(f"export_vlm: {c['tensors']} of the {len(sd)} trained tensors cast {what} (the base's dtype; largest "
              f"change {c['max_abs_change']:.3g}); --keep-fp32 saves the model in float32 instead", file=sys.stderr)
    dst = Path(out)
    dst.mkdir(parents=True, exist_ok=True)
    for f in Path(base).iterdir():  # configs, tokenizer, processor, chat template
        if f.is_file() and not f.name.endswith(WEIGHTS) and not f.name.endswith(".index.json"):
            shutil.copy2(f, dst / f.name)
    model.save_pretrained(dst)
    _write_info(dst, {"checkpoint": str(ckpt.resolve()), "step": _step(ckpt), "kind": "full",
                      "base": str(Path(base).resolve()), "dtype": dtype, "trained_tensors": len(sd), "casts": casts})
    print(f"exported {ckpt} ({len(sd)} trained tensors) on {base} -> {dst} ({dtype})")
    return dst


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="export_vlm.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    p.add_argument("run_dir", help="the training run folder (newest checkpoints/step-*) or one checkpoint folder")
    p.add_argument("base_model", help="the base model folder the run trained on")
    p.add_argument("out_dir", help="the folder to write (evaluate with model=OUT_DIR)")
    p.add_argument("--keep-fp32", action="store_true",
                   help="full fine-tuning: save the model in float32 instead of casting the trained tensors to the "
                        "base's dtype (bf16 for the released checkpoints)")
    a = p.parse_args(argv)
    try:
        export(a.run_dir, a.base_model, a.out_dir, keep_fp32=a.keep_fp32)
    except (FileNotFoundError, ValueError) as e:
        print(f"export_vlm: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
