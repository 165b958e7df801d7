#!/usr/bin/env python
"""Generate images for a prompt set with a flow-matching pipeline (+ optional LoRA) and score them.

    python eval/generate_t2i.py pipeline=DIR [lora=DIR] prompts=FILE rewards=mini_geneval,jpeg_compressibility \
        out_dir=runs/eval/t2i_<name> [num_steps=40 guidance_scale=4.5 height=512 width=512 images_per_prompt=4]

* ``pipeline``: a diffusers folder (StableDiffusion3Pipeline / FluxPipeline) loaded with
  ``flow_grpo.models.load_adapter``; ``lora``: a folder with ``pytorch_lora_weights.safetensors`` (what the trainer
  exports; a trainer checkpoint holding ``lora/`` works too), loaded with ``pipe.load_lora_weights``.
* ``prompts``: ``.txt`` (one per line) or GenEval-style ``.jsonl`` (``{"prompt", "tag", "include", ...}``), read
  with the trainer's ``load_prompts``; the metadata goes to the rewards, ``tag`` gives the per-category breakdown.
* Sampling: deterministic Euler ODE (``flow_grpo.sampler.generate_images``) with ``num_steps``, ``guidance_scale``
  (CFG for SD3, embedded guidance for FLUX; ``cfg`` auto = on for SD3, off for FLUX) at ``height`` x ``width``.
  Image k of prompt p starts from x_T seeded with ``sample_seed(seed, p, k)``: the same noise for every model
  evaluated with the same seed (paired comparisons) and independent of batching.
* ``ode_solver=dpmpp2m``: DPM-Solver++(2M) instead of Euler. ``rlg_weight=w`` (with ``lora=``): RL guidance,
  ``v = v_base + w (v_tuned - v_base)`` per step, the base being the same transformer with the LoRA disabled
  (peft's adapter switch, no second model copy); ``scripts/rlg_curve.sh`` sweeps w.
* Rewards: ``flow_grpo.rewards.MultiReward`` over ``rewards`` (each with weight 1; ``reward_kwargs={name: {...}}``).
* Videos: with a text-to-video pipeline (a Wan2.1 ``WanPipeline`` folder; ``num_frames``, 1 + 4k) each sample is
  a video (F, H, W, 3) scored by video rewards (``video_per_frame``, ``temporal_consistency``; an image reward is
  refused) and saved as one lossless PNG *frame strip* ``images/NNNNNN.png`` (H x F*W: frames left to right in time
  order, no gap; ``video_from_strip(path, num_frames)`` splits it back, the row's ``num_frames`` says how many).
  A PNG strip rather than an mp4: no video codec dependency, viewable anywhere, and exact pixels, so re-scoring a
  saved video gives the same rewards. Grids show one frame strip per row (at most 8 frames). Benchmark layouts are
  image-only.

Outputs in ``out_dir``: ``settings.json`` (pipeline + LoRA fingerprints, sampler, sigma schedule, prompt file
sha256, rewards, versions; written before generation), ``images.jsonl`` (one row per image: index, prompt, seed,
tag, reward values, image path; appended + fsynced per batch), ``images/NNNNNN.png``, ``grids/batch_NNNNN.png``
(captioned), ``metrics.json`` (mean ± std per reward, per-tag means, Mini-GenEval accuracy: image-level and GenEval's
"overall" = mean of per-tag accuracies), ``report.md`` / ``report.json``.  Resumable at batch granularity like
``eval/generate_vlm.py`` (fixed batches; settings must match; ``overwrite=true`` starts over; ``max_batches=N``
stops early, unscored).

Official benchmark layouts (``layout=``, details and the scorer commands in ``eval/t2i_layouts.py`` and
``docs/benchmarks.md``): ``geneval`` reads GenEval's ``evaluation_metadata.jsonl`` and writes
``out_dir/geneval/{i:05d}/{metadata.jsonl, samples/{k:05d}.png, grid.png}``; ``dpgbench`` reads DPG-Bench's
``prompts/`` folder or ``dpg_bench.csv`` and writes ``out_dir/dpgbench/<item_id>.png`` (the prompt's images as a
2-column grid); ``t2icompbench`` reads a T2I-CompBench ``*_val.txt`` and writes
``out_dir/t2icompbench/samples/{prompt}_{n:06d}.png``.  The benchmark's own scorer then runs unchanged on
``out_dir/<layout>``; ``images.jsonl`` rows point at these files, and rewards / metrics work as in the default
layout.
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval import t2i_layouts  # noqa: E402
from eval.harness import (  # noqa: E402
    ResumableJsonl,
    check_resume,
    fingerprint_dir,
    fixed_batches,
    git_info,
    library_versions,
    mean_std,
    settings_fingerprint,
    write_json,
)

ROWS = "images.jsonl"
LIBRARIES = ("torch", "diffusers", "transformers", "peft", "accelerate", "numpy", "pillow", "open_clip_torch")
MINI_GENEVAL_STRICT = "mini_geneval/strict"


def _h(text: str) -> dict:
    return {"help": text}


@dataclass
class EvalT2IConfig:
    """Generate + score a flow-matching text-to-image pipeline on a prompt set (see the module docstring)."""

    pipeline: str = field(default="", metadata=_h("diffusers pipeline folder (SD3 or FLUX)"))
    kind: Literal["auto", "sd3", "flux", "wan"] = field(default="auto", metadata=_h(
        "adapter kind; auto = model_index.json (wan: a text-to-video WanPipeline folder, see num_frames)"))
    lora: str = field(default="", metadata=_h("LoRA folder (pytorch_lora_weights.safetensors) or trainer checkpoint"))
    prompts: str = field(default="", metadata=_h(
        ".txt (one prompt per line) or .jsonl ({'prompt', 'tag', ...}); with a benchmark layout, that benchmark's "
        "prompt file (see layout)"))
    layout: Literal["default", "geneval", "dpgbench", "t2icompbench"] = field(
        default="default", metadata=_h(t2i_layouts.LAYOUT_HELP))
    max_prompts: int = field(default=0, metadata=_h("use only the first N prompts (0 = all)"))
    images_per_prompt: int = field(default=1, metadata=_h("images per prompt (GenEval uses 4)"))
    rewards: list[str] = field(default_factory=lambda: ["mini_geneval"],
                               metadata=_h("reward names (flow_grpo.rewards registry), e.g. mini_geneval,clip_score"))
    reward_kwargs: dict[str, dict] = field(default_factory=dict, metadata=_h("per-reward constructor kwargs"))
    num_steps: int = field(default=40, metadata=_h("ODE (Euler) steps"))
    ode_solver: Literal["euler", "dpmpp2m"] = field(default="euler", metadata=_h(
        "ODE solver: euler | dpmpp2m (DPM-Solver++ 2nd-order multistep, flow_grpo.solvers.dpmpp2m_step)"))
    rlg_weight: Optional[float] = field(default=None, metadata=_h(
        "RL guidance (RLG): sample with v_base + w (v_tuned - v_base), tuned = the pipeline with lora=, base = the "
        "same transformer with the LoRA disabled (no second copy); 0 = base, 1 = tuned, > 1 extrapolates; each "
        "model's velocity has its own CFG. Two model calls per step. none = off (the pipeline as loaded)"))
    guidance_scale: float = field(default=4.5, metadata=_h("CFG scale (SD3) / embedded guidance (FLUX)"))
    cfg: Optional[bool] = field(default=None, metadata=_h("classifier-free guidance; none = auto (SD3 on, FLUX off)"))
    num_frames: int = field(default=0, metadata=_h(
        "video generators (Wan): frames per video, 1 + 4k; 0 = the adapter's default (Wan: 81); must stay 0 for "
        "image generators. Each video is saved as one PNG frame strip (frames left to right, no gap)"))
    shift: Optional[float] = field(default=None, metadata=_h(
        "flow-matching time shift of the sigma schedule (as the trainer's sample.shift); none = the folder's"))
    height: int = field(default=512, metadata=_h("image height"))
    width: int = field(default=512, metadata=_h("image width"))
    seed: int = field(default=0, metadata=_h("x_T of image k of prompt p is seeded with sample_seed(seed, p, k)"))
    batch_size: int = field(default=8, metadata=_h("images per generation batch (fixed batches; resume unit)"))
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto", metadata=_h("transformer dtype; auto = bfloat16 on GPU, float32 on CPU"))
    device: str = field(default="auto", metadata=_h("auto | cpu | cuda | cuda:N"))
    max_sequence_length: Optional[int] = field(
        default=None, metadata=_h("T5 text tokens; none = the release's (FLUX.1 512, SD3 256; CLIP always 77)"))
    out_dir: str = field(default="", metadata=_h("run folder"))
    name: str = field(default="", metadata=_h("run name in reports (default: out_dir's basename)"))
    save_images: bool = field(default=True, metadata=_h("write every image as PNG (re-scoring later needs them)"))
    grid_nrow: int = field(default=4, metadata=_h("images per row of the per-batch PNG grids (0 = no grids)"))
    grid_min_tile: int = field(default=128, metadata=_h(
        "grids only: nearest-neighbour upscale tiles to at least this many pixels so small images and their "
        "captions are readable (0 = original size); the saved images are never resized"))
    hash_weights: Literal["sampled", "full", "none"] = field(
        default="sampled", metadata=_h("weights fingerprint: sampled (size + 64 chunks per file) | full | none"))
    overwrite: bool = field(default=False, metadata=_h("delete existing results in out_dir first"))
    max_batches: int = field(default=0, metadata=_h("stop after N generated batches, unscored (0 = to the end)"))
    progress: bool = field(default=True, metadata=_h("tqdm progress bar"))


def video_from_strip(path, num_frames: int):
    """A saved video (PNG frame strip of ``num_frames`` frames, no gap) -> uint8 (F, H, W, 3)."""
    import numpy as np
    from PIL import Image

    strip = np.asarray(Image.open(path).convert("RGB"))
    h, total = strip.shape[:2]
    if num_frames < 1 or total % num_frames:
        raise ValueError(f"{path}: width {total} is not {num_frames} frames")
    return np.stack(np.split(strip, num_frames, axis=1))


def resolve_lora(path: str) -> str:
    """Folder holding ``pytorch_lora_weights.safetensors`` (given directly or as ``<checkpoint>/lora``)."""
    p = Path(path)
    for cand in (p, p / "lora"):
        if (cand / "pytorch_lora_weights.safetensors").is_file():
            return str(cand)
    raise FileNotFoundError(f"lora={path}: no pytorch_lora_weights.safetensors here or in {p / 'lora'}")


def lora_weights(folder: str) -> str:
    """Which weights a trainer export holds, from its ``export.json`` (``flow_grpo train`` writes the trained
    weights to ``lora_final`` and their EMA to ``lora_final_ema``)."""
    try:
        m = json.loads((Path(folder) / "export.json").read_text())
    except (OSError, ValueError):
        return "no export.json (not a final export of flow_grpo train: which weights it holds is not recorded)"
    if m.get("weights") == "ema":
        return (f"the EMA of the trained weights (decay {m.get('ema_decay')}, {m.get('ema_updates')} updates; "
                f"epoch {m.get('epoch')}, step {m.get('global_step')})")
    if m.get("weights") == "trained":
        return f"the trained weights (epoch {m.get('epoch')}, step {m.get('global_step')})"
    return "exported before issue 32 (the EMA when ema.enabled was on)"


def load_eval_adapter(cfg: EvalT2IConfig):
    """(adapter, resolved lora folder or None, device, dtype name)."""
    import torch

    from flow_grpo.models import load_adapter

    if not cfg.pipeline:
        raise ValueError("pipeline=DIR is required (a diffusers pipeline folder)")
    if not Path(cfg.pipeline).is_dir():
        raise FileNotFoundError(f"pipeline folder not found: {cfg.pipeline}")
    lora = resolve_lora(cfg.lora) if cfg.lora else None
    if cfg.rlg_weight is not None and lora is None:
        raise ValueError(f"rlg_weight={cfg.rlg_weight} needs lora=DIR: RL guidance combines the tuned model (the LoRA) "
                         f"with the base (LoRA disabled)")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu") if cfg.device == "auto" \
        else torch.device(cfg.device)
    dtype_name = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype_name]
    adapter = load_adapter(cfg.pipeline, kind=cfg.kind, device=device, dtype=dtype,
                           max_sequence_length=cfg.max_sequence_length)
    from flow_grpo.build import set_num_frames, set_shift

    set_num_frames(adapter, cfg.num_frames)  # refused for image generators
    set_shift(adapter, cfg.shift)
    if adapter.media == "video" and cfg.layout != "default":
        raise ValueError(f"layout={cfg.layout} is an image benchmark's; {adapter.kind!r} generates videos: use "
                         "layout=default")
    if lora is not None:
        print(f"lora={lora}: {lora_weights(lora)}", file=sys.stderr)
        adapter.pipe.load_lora_weights(lora)  # peft layers injected into adapter.transformer in place
        adapter.lora_enabled = True  # adapter.reference() (LoRA disabled) is the base model of RL guidance
    adapter.transformer.requires_grad_(False)
    adapter.transformer.eval()
    return adapter, lora, device, dtype_name


def _items(cfg: EvalT2IConfig, prompts: Sequence[str], meta: Sequence[dict]) -> list[dict]:
    from mmgrpo.utils.seeding import sample_seed

    K = cfg.images_per_prompt
    return [{"index": p * K + k, "prompt_index": p, "sample": k, "prompt": prompts[p], "metadata": meta[p],
             "seed": sample_seed(cfg.seed, p, k)} for p in range(len(prompts)) for k in range(K)]


def build_settings(cfg: EvalT2IConfig, adapter, lora: Optional[str], device, dtype: str, n_prompts: int) -> dict:
    from mmgrpo.utils.config import config_to_dict

    use_cfg = _use_cfg(cfg, adapter)
    s = {
        "kind": "t2i",
        "model": {
            "pipeline": str(Path(cfg.pipeline).resolve()),
            "fingerprint": fingerprint_dir(cfg.pipeline, cfg.hash_weights),
            "adapter_kind": adapter.kind,
            "lora": None if lora is None else str(Path(lora).resolve()),
            "lora_fingerprint": None if lora is None else fingerprint_dir(lora, cfg.hash_weights),
            "dtype": dtype,
            "device": device.type,
            "max_sequence_length": adapter.max_sequence_length,  # resolved (release default when unset)
        },
        "sampling": {
            "sampler": "euler_ode" if cfg.ode_solver == "euler" else f"{cfg.ode_solver}_ode",
            **({} if cfg.rlg_weight is None else {"rlg_weight": float(cfg.rlg_weight)}),
            "num_steps": cfg.num_steps,
            "guidance_scale": cfg.guidance_scale,
            "cfg": use_cfg,
            "height": cfg.height,
            "width": cfg.width,
            "media": adapter.media,
            **({"num_frames": adapter.num_frames} if adapter.media == "video" else {}),
            "shift": cfg.shift,
            "seed": cfg.seed,
            "seed_rule": "x_T of image k of prompt p: sample_seed(seed, p, k)",
            "batch_size": cfg.batch_size,
            "sigmas": [round(float(x), 8) for x in adapter.sigmas(cfg.num_steps, cfg.height, cfg.width).tolist()],
            "scheduler": dict(adapter.pipe.scheduler.config),
        },
        "prompts": {
            "file": str(Path(cfg.prompts).resolve()),
            "sha256": t2i_layouts.prompts_sha256(cfg.prompts),
            "n_prompts": n_prompts,
            "max_prompts": cfg.max_prompts,
            "images_per_prompt": cfg.images_per_prompt,
        },
        "output": {"layout": cfg.layout},  # a resume must not mix layouts
        "rewards": {"names": list(cfg.rewards), "kwargs": dict(cfg.reward_kwargs)},
        "versions": library_versions(LIBRARIES),
        "code": git_info(),
        "run": {"out_dir": str(Path(cfg.out_dir).resolve()), "name": cfg.name or Path(cfg.out_dir).name,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "config": config_to_dict(cfg)},
    }
    s["fingerprint"] = settings_fingerprint(s)
    return s


def _use_cfg(cfg: EvalT2IConfig, adapter) -> bool:
    if cfg.cfg is None:
        return adapter.supports_cfg
    if cfg.cfg and not adapter.supports_cfg:
        raise ValueError("FLUX uses embedded guidance: set cfg=false (or leave it unset)")
    return bool(cfg.cfg)


def _scalar_rewards(out: dict, n: int) -> dict[str, list[float]]:
    """Per-image float lists of every reward output except the bookkeeping keys."""
    import torch

    res = {}
    for k, v in out.items():
        if k in ("total", "valid"):
            continue
        t = torch.as_tensor(v).detach().float().cpu().reshape(-1)
        if t.numel() != n:
            raise ValueError(f"reward output {k!r} has {t.numel()} values for {n} images")
        res[k] = [float(x) for x in t.tolist()]
    return res


def generate(cfg: EvalT2IConfig, adapter, reward, items: Sequence[dict], writer: ResumableJsonl,
             out_dir: Path) -> dict:
    """Generate + score the missing images, batch by batch (fixed batches); returns counters."""
    import numpy as np
    from PIL import Image
    from tqdm.auto import tqdm

    from flow_grpo.config import SamplingConfig
    from flow_grpo.sampler import generate_images
    from flow_grpo.media import frame_strip, save_media_grid

    scfg = SamplingConfig(num_steps=cfg.num_steps, height=cfg.height, width=cfg.width,
                          guidance_scale=cfg.guidance_scale, cfg=_use_cfg(cfg, adapter), batch_size=cfg.batch_size,
                          ode_solver=cfg.ode_solver)
    batches = fixed_batches(len(items), cfg.batch_size)
    todo = [(bi, b) for bi, b in enumerate(batches) if any(str(items[i]["index"]) not in writer.done for i in b)]
    n_todo = sum(1 for _, b in todo for i in b if str(items[i]["index"]) not in writer.done)
    stats = {"n_batches_generated": 0, "n_generated": 0, "interrupted": False, "n_already_done": len(writer.done)}
    bar = tqdm(total=n_todo, desc="generate", unit="image", disable=not cfg.progress, dynamic_ncols=True)
    try:
        for bi, b in todo:
            if cfg.max_batches and stats["n_batches_generated"] >= cfg.max_batches:
                stats["interrupted"] = True
                break
            batch = [items[i] for i in b]  # the whole batch: composition stays fixed across resumes
            prompts = [it["prompt"] for it in batch]
            imgs = generate_images(adapter, prompts, [it["seed"] for it in batch], scfg,  # uint8 (B, [F,] H, W, 3)
                                   rlg_weight=cfg.rlg_weight)
            scores = _scalar_rewards(reward(imgs, prompts, [it["metadata"] for it in batch]), len(batch))
            arr = imgs.cpu().numpy() if hasattr(imgs, "cpu") else np.asarray(imgs)
            rows = []
            for j, it in enumerate(batch):
                rel = None
                if cfg.save_images or cfg.layout != "default":  # a benchmark layout is made of the images
                    rel = t2i_layouts.image_relpath(cfg.layout, it)
                    (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                    if cfg.layout == "geneval":
                        t2i_layouts.write_geneval_metadata(out_dir, it["prompt_index"], it["layout_meta"])
                    # a video: one lossless frame strip (H, F*W, 3), split back with video_from_strip
                    Image.fromarray(arr[j] if arr.ndim == 4 else frame_strip(arr[j], gap=0)).save(
                        out_dir / rel, format="PNG")
                if str(it["index"]) in writer.done:
                    continue
                rows.append({"index": it["index"], "prompt_index": it["prompt_index"], "sample": it["sample"],
                             "prompt": it["prompt"], "seed": it["seed"], "tag": it["metadata"].get("tag"),
                             "metadata": it["metadata"], "rewards": {k: v[j] for k, v in scores.items()},
                             "image": rel, **({"num_frames": int(arr.shape[1])} if arr.ndim == 5 else {})})
            if cfg.grid_nrow > 0:
                main_key = next(iter(scores), None)
                caps = [it["prompt"] + (f" | {scores[main_key][j]:.3f}" if main_key else "")
                        for j, it in enumerate(batch)]
                save_media_grid(arr, out_dir / "grids" / f"batch_{bi:05d}.png", nrow=cfg.grid_nrow, captions=caps,
                                min_tile=cfg.grid_min_tile)  # videos: one frame strip per row
            writer.append(rows)  # after the PNGs: a row never points at a missing file
            stats["n_batches_generated"] += 1
            stats["n_generated"] += len(rows)
            bar.update(len(rows))
    finally:
        bar.close()
    return stats


def compute_metrics(rows: Sequence[dict], images_per_prompt: int) -> dict:
    """mean ± std per reward, per-tag means, Mini-GenEval accuracy (see the module docstring).

    ``accuracy`` = mean of ``mini_geneval/strict`` over images; ``overall`` = mean over tags of the per-tag
    accuracy (GenEval's headline); both fractions in [0, 1]."""
    rows = sorted(rows, key=lambda r: r["index"])
    keys: list[str] = []
    for r in rows:
        for k in r["rewards"]:
            if k not in keys:
                keys.append(k)
    m: dict[str, Any] = {"kind": "t2i", "n_images": len(rows), "n_prompts": len({r["prompt_index"] for r in rows}),
                         "images_per_prompt": images_per_prompt}
    m["rewards"] = {k: mean_std([r["rewards"][k] for r in rows if k in r["rewards"]]) for k in keys}
    by_tag: dict[str, list[dict]] = {}
    for r in rows:
        by_tag.setdefault(str(r.get("tag") or "untagged"), []).append(r)
    m["by_tag"] = {t: {"n": len(rs), "rewards": {k: mean_std([r["rewards"][k] for r in rs])["mean"] for k in keys}}
                   for t, rs in sorted(by_tag.items())}
    if MINI_GENEVAL_STRICT in keys:
        acc = {t: mean_std([r["rewards"][MINI_GENEVAL_STRICT] for r in rs])["mean"] for t, rs in sorted(by_tag.items())}
        m["mini_geneval"] = {
            "accuracy": m["rewards"][MINI_GENEVAL_STRICT]["mean"],
            "overall": sum(acc.values()) / len(acc),
            "by_tag": acc,
        }
    return m


def run(cfg: EvalT2IConfig) -> dict:
    from flow_grpo.rewards import MultiReward
    from mmgrpo.utils.logging import get_logger

    log = get_logger("flow_grpo.eval")
    if not cfg.out_dir:
        raise ValueError("out_dir=DIR is required")
    if not cfg.prompts:
        raise ValueError("prompts=FILE is required (.txt or .jsonl)")
    if not cfg.rewards:
        raise ValueError("rewards=name[,name...] is required")
    if cfg.images_per_prompt < 1 or cfg.batch_size < 1:
        raise ValueError("images_per_prompt and batch_size must be >= 1")
    t2i_layouts.check_layout(cfg.layout, cfg.images_per_prompt, cfg.height, cfg.width)
    stray = sorted(set(cfg.reward_kwargs) - set(cfg.rewards))
    if stray:
        raise ValueError(f"reward_kwargs for rewards not in rewards={list(cfg.rewards)}: {stray}")
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.overwrite:
        for name in (ROWS, "settings.json", "metrics.json", "report.md", "report.json"):
            (out_dir / name).unlink(missing_ok=True)
        for d in ("images", "grids", *t2i_layouts.layout_dirs(cfg.layout)):
            shutil.rmtree(out_dir / d, ignore_errors=True)
    prompts, layout_meta = t2i_layouts.read_prompts(cfg.prompts, cfg.layout)
    if cfg.max_prompts:
        prompts, layout_meta = prompts[: cfg.max_prompts], layout_meta[: cfg.max_prompts]
    meta = [t2i_layouts.reward_metadata(cfg.layout, m) for m in layout_meta]
    items = _items(cfg, prompts, meta)
    for it in items:
        it["layout_meta"] = layout_meta[it["prompt_index"]]
    adapter, lora, device, dtype = load_eval_adapter(cfg)
    settings = build_settings(cfg, adapter, lora, device, dtype, len(prompts))
    check_resume(out_dir, settings, ROWS)
    write_json(out_dir / "settings.json", settings)
    kw = {k: dict(v) for k, v in cfg.reward_kwargs.items()}
    built = {}
    if "video_per_frame" in cfg.rewards:  # its outputs are named after its image reward (brightness, hpsv2, ...):
        from flow_grpo.rewards import build_reward  # renamed to the config key, as the trainer does (R -> key)
        from flow_grpo.scoring import ResilientReward

        built["video_per_frame"] = ResilientReward(build_reward("video_per_frame", **kw.pop("video_per_frame", {})),
                                                   "video_per_frame", retries=0, on_failure="stop")
    reward = MultiReward({n: 1.0 for n in cfg.rewards}, rewards=built, reward_kwargs=kw)
    writer = ResumableJsonl(out_dir / ROWS, key="index").open()
    if writer.n_truncated_bytes:
        log.warning("%s: truncated a torn last line (%d bytes) from an interrupted run", writer.path,
                    writer.n_truncated_bytes)
    extra = writer.done - {str(it["index"]) for it in items}
    if extra:
        raise ValueError(f"{writer.path} holds image indices beyond this prompt set (e.g. {sorted(extra)[:3]})")
    t0 = time.time()
    stats = generate(cfg, adapter, reward, items, writer, out_dir)
    stats["seconds"] = round(time.time() - t0, 3)
    if stats["interrupted"]:
        log.info("stopped after %d batches (max_batches); rerun the same command to continue",
                 stats["n_batches_generated"])
        return {"settings": settings, "stats": stats, "metrics": None, "out_dir": str(out_dir)}
    metrics = compute_metrics(writer.rows, cfg.images_per_prompt)
    metrics["layout"] = t2i_layouts.finalize(cfg.layout, out_dir, writer.rows, layout_meta, cfg.images_per_prompt,
                                             cfg.grid_nrow)
    cmd = t2i_layouts.scorer_command(cfg.layout, cfg.out_dir, cfg.images_per_prompt, cfg.height)
    if cmd:
        metrics["layout"]["scorer_command"] = cmd
        log.info("%s layout written to %s; score it with: %s", cfg.layout, out_dir / cfg.layout, cmd)
    metrics["settings_fingerprint"] = settings["fingerprint"]
    metrics["generation"] = {"last_invocation": stats}
    write_json(out_dir / "metrics.json", metrics)
    from eval.report import write_report

    write_report(out_dir)
    return {"settings": settings, "stats": stats, "metrics": metrics, "out_dir": str(out_dir)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    from eval.report import run_generation_cli

    return run_generation_cli(EvalT2IConfig, run, argv, prog="eval/generate_t2i.py",
                              description="Generate images for a prompt set with a diffusers pipeline and score them.")


if __name__ == "__main__":
    raise SystemExit(main())
