#!/usr/bin/env python
"""Smoke mode of the experiment scripts: the overrides that swap a recipe's model and data for the shipped tiny
models and synthetic data (CPU, one process, 2 steps), and the synthetic data itself.

    python scripts/experiments/smoke.py train vlm|flow RECIPE.yaml RUN_DIR   # prints one override per line
    python scripts/experiments/smoke.py eval  vlm|flow RECIPE.yaml RUN_DIR   # the paired eval's overrides
    python scripts/experiments/smoke.py check vlm|flow RECIPE.yaml [key=value ...]  # overrides load (else exit 2),
                                          # rewards exist (else 1), their settings are complete (else 3)?
    python scripts/experiments/smoke.py check-eval eval/SCRIPT.py [--config FILE] [key=value ...]  # (else exit 2)
    python scripts/experiments/smoke.py base  vlm|flow RECIPE.yaml   # the tiny base model folder it trains

What changes and what does not:

* **swapped**: the model (``data/checkpoints/tiny_vlm``; SD3 recipes ``data/checkpoints/tiny_flow``, FLUX recipes a
  tiny random FLUX built in memory, ``model.tiny=flux``; Wan recipes the tiny Wan of ``model.tiny=wan`` saved as a
  folder, 5 frames at 32 px), the data (synthetic videos / images / prompts of the
  recipe's task), the device (CPU, float32, no mixed precision, one process), and the *shape* of the run: 2 steps,
  1-2 prompts per step, a group of at most 4, at most 24 new tokens, the tiny models' own resolution / frame budget
  (a tiny model at 512 px or 768 frames would take minutes per step without testing anything more);
* **rewards that need downloaded weights** (anything outside ``LIGHT_FLOW_REWARDS``: PickScore, HPS, OCR, CLIP,
  GenEval, a pairwise judge) are replaced by the verifiable ``mini_geneval`` reward on the synthetic prompts (Wan
  recipes: ``video_per_frame`` over ``brightness``, a cheap per-frame reward), and a
  ``reward.pairwise_scorer`` plugin by the built-in score comparator; every substitution is printed to stderr;
* **no reward signal accepted** for tasks the tiny TVG model cannot answer (REC, multiple choice, grounded QA:
  ``run.allow_no_reward_signal=true``, which a real run never sets: there a run without any reward signal exits 4);
* **kept** (read from the recipe, never overridden): the method preset, SDE kind, noise level, step plan / window,
  credit, denoising steps, advantage statistics, clip range, KL, learning rate, TempSamp / T-GRPO / TW-GRPO /
  Reg-GRPO / selection switches, reward weights of the VLM rewards, parse mode, prompt mode.

Synthetic data is written once under ``$SMOKE_DATA`` (default ``runs/smoke/data``), atomically, so parallel smoke
runs can share it.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TINY_VLM = REPO / "data" / "checkpoints" / "tiny_vlm"
TINY_FLOW = REPO / "data" / "checkpoints" / "tiny_flow"
# flow rewards that run on CPU without downloaded weights
LIGHT_FLOW_REWARDS = {"mini_geneval", "brightness", "color_target", "jpeg_compressibility", "jpeg_incompressibility"}
SMOKE_STEPS = 2
# Wan recipes: the tiny Wan's shape (5 frames = 2 latent frames, 32 px, 16 text tokens) and a cheap per-frame reward
WAN_SHAPE = ["sample.height=32", "sample.width=32", "sample.num_frames=5", "model.max_sequence_length=16"]
SMOKE_VIDEO_REWARD = "{reward: brightness, aggregate: mean}"
MAX_GROUP = 4
MAX_NEW_TOKENS = 24


def _note(msg: str) -> None:
    print(f"[smoke] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------ synthetic data
@contextlib.contextmanager
def _stdout_to_stderr():
    """Everything written to stdout, at the file-descriptor level too (building the tiny FLUX prints blank lines
    from native code), goes to stderr: stdout carries only the overrides."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _atomic_dir(final: Path, write) -> Path:
    """Run ``write(tmp_dir)`` and rename the result to ``final`` unless another process got there first."""
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        with _stdout_to_stderr():  # stdout carries the overrides
            write(tmp)
        try:
            os.rename(tmp, final)
        except OSError:  # written concurrently by another smoke run: keep theirs
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _write_videos(d: Path) -> None:
    """Synthetic TVG videos (2 train + 2 eval videos) and their tvg / mcq / gqa sample files."""
    from mmgrpo.vlm.data import Sample, write_jsonl
    from mmgrpo.vlm.synthetic.tvg import generate

    res = generate(d, n_train=2, n_eval=2, seed=0, mcq=True)
    for split in ("train", "eval"):  # grounded QA = the colour question + the event's span as evidence
        rows = [json.loads(x) for x in Path(res[f"{split}_mcq"]).read_text().splitlines() if x.strip()]
        gqa = [Sample.from_dict({**r, "id": r["id"].replace("_mcq", "_gqa"), "task": "gqa",
                                 "spans": [r["meta"]["span"]]}) for r in rows]
        write_jsonl(gqa, d / f"{split}_gqa.jsonl")


def _write_video_r1(d: Path) -> None:
    """Video-R1's data mix on the synthetic videos: each multiple-choice colour question plus one open-answer (qa)
    question of each other problem type about the same event (numerical: the second it appears; OCR: its colour
    word; free-form: a short description; regression: how long it is visible)."""
    from mmgrpo.vlm.data import Sample, write_jsonl
    from mmgrpo.vlm.synthetic.tvg import generate

    res = generate(d, n_train=2, n_eval=2, seed=0, mcq=True)
    for split in ("train", "eval"):
        rows = [json.loads(x) for x in Path(res[f"{split}_mcq"]).read_text().splitlines() if x.strip()]
        out = []
        for r in rows:
            m, (a, b) = r["meta"], r["meta"]["span"]
            out.append(Sample.from_dict(r))
            base = {"task": "qa", "video": r["video"], "duration": r["duration"], "meta": {"source": "smoke"}}
            for k, (ptype, q, ans) in enumerate((
                    ("numerical", f"At which whole second does the {m['shape']} appear?", str(int(a))),
                    ("OCR", f"Write the colour of the {m['shape']} as one word.", m["colour"]),
                    ("free-form", f"Describe the {m['shape']}.", f"a {m['colour']} {m['shape']}"),
                    ("regression", f"For how many seconds is the {m['shape']} visible?", f"{b - a:.1f}"))):
                out.append(Sample.from_dict({**base, "id": f"{r['id']}_qa{k}", "query": q, "answer": ans,
                                             "meta": {"source": "smoke", "problem_type": ptype}}))
        write_jsonl(out, d / f"{split}_video_r1.jsonl")


def _write_images(d: Path) -> None:
    """Synthetic REC: 56x56 images with one coloured square on noise; the query names its colour."""
    import numpy as np
    from PIL import Image

    from mmgrpo.vlm.data import Sample, write_jsonl

    colours = {"red": (255, 0, 0), "green": (0, 200, 0), "blue": (0, 0, 255), "yellow": (255, 255, 0)}
    (d / "images").mkdir(parents=True)
    for split, n in (("train", 4), ("eval", 2)):
        out = []
        for k in range(n):
            rng = np.random.RandomState(100 * (split == "eval") + k)
            img = rng.randint(0, 80, (56, 56, 3), dtype=np.uint8)
            name, rgb = list(colours.items())[k % len(colours)]
            x1, y1 = int(rng.randint(0, 30)), int(rng.randint(0, 30))
            img[y1:y1 + 20, x1:x1 + 20] = rgb
            rel = f"images/{split}_{k}.png"
            Image.fromarray(img).save(d / rel)
            out.append(Sample.from_dict({"id": f"rec_{split}_{k}", "task": "rec", "query": f"the {name} square",
                                         "image": rel, "boxes": [[x1, y1, x1 + 20, y1 + 20]], "image_size": [56, 56],
                                         "meta": {"source": "smoke"}}))
        write_jsonl(out, d / f"{split}_rec.jsonl")


def _write_image_mcq(d: Path) -> None:
    """Synthetic image multiple choice for recipes whose tools crop images (MGPO): 112x112 noise with one small
    coloured square; the question asks its colour (4 options)."""
    import numpy as np
    from PIL import Image

    from mmgrpo.vlm.data import Sample, write_jsonl

    colours = {"red": (255, 0, 0), "green": (0, 200, 0), "blue": (0, 0, 255), "yellow": (255, 255, 0)}
    names = list(colours)
    (d / "images").mkdir(parents=True)
    for split, n in (("train", 4), ("eval", 2)):
        out = []
        for k in range(n):
            rng = np.random.RandomState(200 + 100 * (split == "eval") + k)
            img = rng.randint(0, 80, (112, 112, 3), dtype=np.uint8)
            name = names[k % len(names)]
            x1, y1 = int(rng.randint(0, 100)), int(rng.randint(0, 100))
            img[y1:y1 + 8, x1:x1 + 8] = colours[name]
            rel = f"images/{split}_{k}.png"
            Image.fromarray(img).save(d / rel)
            out.append(Sample.from_dict({"id": f"imcq_{split}_{k}", "task": "mcq",
                                         "query": "What colour is the small square?", "image": rel,
                                         "options": names, "answer": "ABCD"[k % len(names)],
                                         "meta": {"source": "smoke"}}))
        write_jsonl(out, d / f"{split}_mcq.jsonl")


def crops_images(cfg) -> bool:
    """A recipe whose tools crop images (MGPO): its smoke data is image multiple choice, not videos."""
    tools = getattr(cfg, "tools", None)
    return bool(tools is not None and tools.enabled and {"crop", "zoom"} & set(tools.names))


def _write_prompts(d: Path) -> None:
    """Mini-GenEval prompts (train + held-out), the tags the tiny SD3 was trained on."""
    from mmgrpo.synthetic.t2i import main as t2i_main

    tags = json.loads((TINY_FLOW / "mmgrpo_demo.json").read_text()).get("tags") or []
    for split, name in (("train", "train.jsonl"), ("heldout", "heldout.jsonl")):
        t2i_main(["--all", "--split", split, "--out", str(d / name)] + (["--tags", *tags] if tags else []))


def data_root() -> Path:
    return Path(os.environ.get("SMOKE_DATA") or REPO / "runs" / "smoke" / "data").resolve()


def video_r1_mix(cfg) -> bool:
    """A recipe that trains on Video-R1's five problem types (its prompt template and accuracy reward)."""
    return cfg.data.prompt_template == "video_r1" and "video_r1_accuracy" in cfg.reward.weights


def vlm_data(task: str, video_r1: bool = False, images: bool = False) -> tuple[Path, Path, Path]:
    """(train file, eval file, media root) of the synthetic data of ``task``; ``video_r1``: Video-R1's five
    problem types for training (the eval file stays multiple choice, as its benchmarks); ``images``: image multiple
    choice (recipes whose tools crop images)."""
    if images and task == "mcq":
        d = _atomic_dir(data_root() / "image_mcq", _write_image_mcq)
        return d / "train_mcq.jsonl", d / "eval_mcq.jsonl", d
    if video_r1 and task == "mcq":
        d = _atomic_dir(data_root() / "video_r1", _write_video_r1)
        return d / "train_video_r1.jsonl", d / "eval_mcq.jsonl", d
    if task == "rec":
        d = _atomic_dir(data_root() / "rec", _write_images)
        return d / "train_rec.jsonl", d / "eval_rec.jsonl", d
    d = _atomic_dir(data_root() / "videos", _write_videos)
    suffix = {"tvg": "", "mcq": "_mcq", "numeric": "_mcq", "gqa": "_gqa"}[task]
    return d / f"train{suffix}.jsonl", d / f"eval{suffix}.jsonl", d


def flow_prompts() -> tuple[Path, Path]:
    d = _atomic_dir(data_root() / "t2i", _write_prompts)
    return d / "train.jsonl", d / "heldout.jsonl"


# ------------------------------------------------------------------------------------------------ overrides
def _tiny_vlm_video() -> dict:
    return json.loads((TINY_VLM / "sft_report.json").read_text())["video"]


def vlm_train(cfg, run_dir: Path) -> list[str]:
    train, _, media = vlm_data(cfg.data.task, video_r1_mix(cfg), crops_images(cfg))
    v = _tiny_vlm_video()
    g = min(cfg.rollout.group_size, MAX_GROUP)
    ov = [f"model.path={TINY_VLM}", "model.dtype=float32", "model.attn_implementation=sdpa",
          f"data.train_file={train}", f"data.media_root={media}", "data.max_samples=0",
          f"data.video_fps={v['fps']}", f"data.min_frames={v['min_frames']}", f"data.max_frames={v['max_frames']}",
          f"data.video_min_pixels={v['min_pixels']}", f"data.video_max_pixels={v['max_pixels']}",
          f"data.video_total_pixels={v['max_pixels'] * v['max_frames']}",
          f"data.image_min_pixels={v['min_pixels']}", f"data.image_max_pixels={v['max_pixels']}",
          "data.max_prompt_tokens=0", "rollout.backend=hf", f"rollout.group_size={g}",
          f"rollout.max_new_tokens={min(cfg.rollout.max_new_tokens, MAX_NEW_TOKENS)}",
          f"rollout.generation_batch_size={2 * g}", f"run.max_steps={SMOKE_STEPS}", "run.prompts_per_device=1",
          "run.prompts_per_step=0", f"run.micro_batch_size={2 * g}", "run.device=cpu", "run.mixed_precision=no",
          "run.save_every=0", "run.tensorboard=false", "run.progress_bar=false", "run.resume_from=none",
          "run.grad_sync=auto", f"run.output_dir={run_dir}"]
    if cfg.data.task != "tvg":  # the tiny model answers temporal spans only: other tasks' rewards may all be equal
        _note(f"data.task={cfg.data.task}: the tiny TVG model cannot answer it (every reward may be equal): "
              "run.allow_no_reward_signal=true")
        ov.append("run.allow_no_reward_signal=true")
    tg, sel = cfg.methods.t_grpo, cfg.methods.selection
    if tg.enabled and tg.num_shuffled:
        ov.append(f"methods.t_grpo.num_shuffled={min(tg.num_shuffled, g)}")
    if sel.enabled:
        ov.append(f"methods.selection.num_inferences={min(sel.num_inferences, 2)}")
        # the selection pass runs (K inferences, reward statistics) but keeps every sample: a tiny model's rewards
        # are often constant within a prompt, which the variance criteria reject, leaving nothing to train on
        _note(f"methods.selection.criterion={sel.criterion} -> gaussian keeping every sample")
        ov += ["methods.selection.criterion=gaussian", "methods.selection.gaussian_keep_zero=true",
               "methods.selection.num_keep=0"]
    return ov


def vlm_eval(cfg, run_dir: Path) -> list[str]:
    _, ev, media = vlm_data(cfg.data.task, video_r1_mix(cfg), crops_images(cfg))
    v = _tiny_vlm_video()
    ov = [f"data.annotations={ev}", f"data.media_root={media}", "data.max_samples=2",
          "decoding.max_new_tokens=16", "decoding.batch_size=2", "device=cpu", "dtype=float32",
          f"data.video_fps={v['fps']}", f"data.max_frames={v['max_frames']}",
          f"data.video_min_pixels={v['min_pixels']}", f"data.video_max_pixels={v['max_pixels']}",
          f"data.video_total_pixels={v['max_pixels'] * v['max_frames']}", "overwrite=true", "progress=false", "hash_weights=none"]
    if cfg.data.task == "rec" or crops_images(cfg):
        ov += [f"data.image_min_pixels={v['min_pixels']}", f"data.image_max_pixels={v['max_pixels']}"]
    return ov  # the script's model=<run>/final (export_vlm: a full model folder, or a LoRA adapter on the base)


def _flow_kind(cfg) -> str:
    if cfg.model.kind in ("sd3", "flux", "wan"):
        return cfg.model.kind
    if (cfg.model.tiny or "") == "wan":
        return "wan"
    return "flux" if "flux" in (cfg.model.tiny or "") else "sd3"


def flow_train(cfg, run_dir: Path) -> list[str]:
    train, _ = flow_prompts()
    info = json.loads((TINY_FLOW / "mmgrpo_demo.json").read_text())
    g = min(cfg.data.group_size, MAX_GROUP)
    if _flow_kind(cfg) == "sd3":  # the shipped, pre-trained tiny SD3 at its own resolution and text length
        ov = [f"model.pipeline_dir={TINY_FLOW}", "model.tiny=", f"sample.height={info['height']}",
              f"sample.width={info['width']}", f"model.max_sequence_length={info['max_sequence_length']}"]
    elif _flow_kind(cfg) == "wan":  # the tiny Wan (model.tiny=wan's builder) written once as a pipeline folder
        ov = [f"model.pipeline_dir={tiny_wan_dir()}", "model.tiny=", "model.kind=wan"] + WAN_SHAPE
    else:  # a tiny random FLUX written once as a pipeline folder (64 px = 16 packed latent tokens)
        ov = [f"model.pipeline_dir={tiny_flux_dir()}", "model.tiny=", "model.kind=flux", "sample.height=64",
              "sample.width=64", "model.max_sequence_length=16"]
    ov += ["model.dtype=float32", "model.gradient_checkpointing=false", f"data.train_path={train}",
           "data.eval_path=", "data.eval_prompts=[]", f"data.group_size={g}", "data.groups_per_epoch=2",
           f"sample.batch_size={2 * g}", f"sample.completion_batch_size={4 * g}", f"run.num_epochs={SMOKE_STEPS}",
           "run.device=cpu", "run.mixed_precision=no", "run.save_every=0", "run.eval_every=0",
           "run.image_grid_every=0", "run.tensorboard=false", "run.progress_bar=false", "run.reward_curves=false",
           "run.resume_from=none", f"run.output_dir={run_dir}", "reward.async_workers=0"]
    if cfg.optim.best_of_n > g:  # DanceGRPO's best-of-n on the smaller group: 2 of each group of 4 are trained
        ov.append(f"optim.best_of_n={max(2, g - 2)}")
    heavy = sorted(set(cfg.reward.weights) - LIGHT_FLOW_REWARDS)
    if cfg.sample.credit == "adv_grpo":  # Adv-GRPO trains its reward model: keep it, on a tiny random DINOv2
        _note("Adv-GRPO: the reward model adv_dino on a tiny random DINOv2 with the mini-GenEval renderer's references "
              "(+ mini_geneval), and both the policy and the reward model updated every epoch (2 epochs)")
        return ov + ["reward.weights={mini_geneval: 1.0, adv_dino: 1.0}",
                     "reward.kwargs={mini_geneval: {mode: partial}, adv_dino: {tiny: true, refs_per_prompt: 2}}",
                     "methods.adv_grpo.reward=adv_dino", "methods.adv_grpo.schedule=interleave",
                     "methods.adv_grpo.every=1"]
    if _flow_kind(cfg) == "wan":  # videos: per-frame rewards whose image reward is light, and temporal consistency
        inner = (cfg.reward.kwargs.get("video_per_frame") or {}).get("reward", "brightness")
        heavy = sorted(set(cfg.reward.weights) - {"video_per_frame", "temporal_consistency"}
                       | ({f"video_per_frame({inner})"} if inner not in LIGHT_FLOW_REWARDS else set()))
        if heavy:
            _note(f"rewards {heavy} need downloaded weights: substituted by per-frame brightness (video_per_frame)")
            ov += ["reward.weights={video_per_frame: 1.0}", f"reward.kwargs={{video_per_frame: {SMOKE_VIDEO_REWARD}}}"]
    elif heavy:
        _note(f"rewards {heavy} need downloaded weights or a server: substituted by mini_geneval (partial credit)")
        ov += ["reward.weights={mini_geneval: 1.0}", "reward.kwargs={mini_geneval: {mode: partial}}"]
    if cfg.reward.pairwise_scorer:
        _note(f"reward.pairwise_scorer={cfg.reward.pairwise_scorer} substituted by the built-in score comparator")
        ov.append("reward.pairwise_scorer=")
    return ov


def flow_eval(cfg, run_dir: Path) -> list[str]:
    _, heldout = flow_prompts()
    kind = _flow_kind(cfg)
    ov = [f"prompts={heldout}", "max_prompts=2", "images_per_prompt=1", "num_steps=4", "batch_size=2",
          "device=cpu", "dtype=float32", "hash_weights=none", "grid_nrow=0", "progress=false", "overwrite=true",
          "rewards=[mini_geneval]", "reward_kwargs={}"]
    if kind == "wan":  # videos: the per-frame reward, the tiny Wan's frame budget
        ov = [x for x in ov if not x.startswith(("rewards=", "reward_kwargs="))]
        ov += ["rewards=[video_per_frame]", f"reward_kwargs={{video_per_frame: {SMOKE_VIDEO_REWARD}}}",
               "height=32", "width=32", "num_frames=5", "max_sequence_length=16"]
    elif kind == "sd3":
        info = json.loads((TINY_FLOW / "mmgrpo_demo.json").read_text())
        ov += [f"height={info['height']}", f"width={info['width']}",
               f"max_sequence_length={info['max_sequence_length']}"]
    else:
        ov += ["height=64", "width=64", "max_sequence_length=16"]
    if cfg.model.lora.enabled:  # base = the tiny model; full fine-tuning keeps the script's assembled pipeline
        suffix = "_ema" if os.environ.get("WEIGHTS") == "ema" else ""  # _common.sh's WEIGHTS=ema
        ov += [f"pipeline={tiny_base('flow', cfg)}", f"lora={run_dir / ('lora_final' + suffix)}"]
    return ov


def tiny_base(kind: str, cfg) -> Path:
    """The tiny model a smoke run trains (the base of export_vlm / assemble_pipeline)."""
    if kind == "vlm":
        return TINY_VLM
    kind = _flow_kind(cfg)
    return TINY_FLOW if kind == "sd3" else tiny_wan_dir() if kind == "wan" else tiny_flux_dir()


def tiny_wan_dir() -> Path:
    def write(d: Path) -> None:
        from flow_grpo.models import save_tiny_pipeline

        save_tiny_pipeline(str(d), "wan", seed=0)

    return _atomic_dir(data_root() / "tiny_wan", write)


def tiny_flux_dir() -> Path:
    def write(d: Path) -> None:
        from flow_grpo.models.tiny import build_tiny_flux_pipeline

        build_tiny_flux_pipeline(0).save_pretrained(d)

    return _atomic_dir(data_root() / "tiny_flux", write)


def load_recipe(kind: str, path: str, overrides=()):
    if kind == "flow":
        from flow_grpo.config import load_train_config

        return load_train_config(path, list(overrides))
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.utils.config import load_config

    return load_config(TrainConfig, path, list(overrides))


def missing_rewards(kind: str, cfg) -> list[str]:
    """Rewards a recipe names that this checkout does not provide (checked without importing any reward code)."""
    import importlib.util

    if kind == "vlm":
        from mmgrpo.vlm.rewards.registry import REWARDS

        return [f"reward {n!r} (mmgrpo.vlm.rewards.registry.REWARDS)" for n in cfg.reward.weights if n not in REWARDS]
    from flow_grpo.rewards import available_rewards

    def importable(spec: str) -> bool:
        mod = spec.split(":", 1)[0]
        try:
            return bool(mod) and importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            return False

    out = [f"reward {n!r} (flow_grpo.rewards registry)" for n in cfg.reward.weights
           if n not in available_rewards() and not (":" in n and importable(n))]
    if cfg.reward.pairwise_scorer and not importable(cfg.reward.pairwise_scorer):
        out.append(f"pairwise judge {cfg.reward.pairwise_scorer!r} (reward.pairwise_scorer)")
    return out


# the evaluation scripts of the experiment scripts and their config classes (check-eval)
EVAL_CONFIGS = {"eval/generate_vlm.py": ("eval.generate_vlm", "EvalVLMConfig"),
                "eval/generate_t2i.py": ("eval.generate_t2i", "EvalT2IConfig")}


def check_eval(script: str, args: list[str]) -> str | None:
    """Why ``python SCRIPT [--config FILE] key=value ...`` would stop at its config (unknown key, with a close match;
    a value of the wrong type), or None; nothing is loaded."""
    import importlib

    from mmgrpo.utils.config import load_config

    if script not in EVAL_CONFIGS:
        return None
    mod, cls = EVAL_CONFIGS[script]
    config, overrides = None, list(args)
    if "--config" in overrides:
        i = overrides.index("--config")
        config = overrides[i + 1]
        del overrides[i:i + 2]
    try:
        load_config(getattr(importlib.import_module(mod), cls), config, overrides)
    except (ValueError, FileNotFoundError) as e:
        return str(e)
    return None


def reward_setting_problems(kind: str, cfg) -> list[str]:
    """Flow rewards' settings (a remote reward's url, PickScore's folders, ...), as the trainer checks them."""
    if kind != "flow":
        return []
    from flow_grpo.rewards import check_reward_settings

    return check_reward_settings(cfg.reward.weights, cfg.reward.kwargs)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 2 and argv[0] == "check-eval":  # exit 2: an evaluation override is wrong
        why = check_eval(argv[1], argv[2:])
        if why:
            print(f"evaluation override (after --): {why}", file=sys.stderr)
        return 2 if why else 0
    if len(argv) >= 3 and argv[0] == "check" and argv[1] in ("vlm", "flow"):
        # exit 2: a training override (or the recipe) does not load; 1: a reward is missing; 3: reward settings
        try:
            cfg = load_recipe(argv[1], argv[2], argv[3:])
        except (ValueError, FileNotFoundError) as e:
            print(f"training override: {e}", file=sys.stderr)
            return 2
        missing = missing_rewards(argv[1], cfg)
        for m in missing:
            print(f"needs {m}: not in this checkout; pass another one as a key=value override", file=sys.stderr)
        if missing:
            return 1
        problems = reward_setting_problems(argv[1], cfg)
        for m in problems:
            print(f"reward setting: {m}", file=sys.stderr)
        return 3 if problems else 0
    if len(argv) == 3 and argv[0] == "base" and argv[1] in ("vlm", "flow"):
        print(tiny_base(argv[1], load_recipe(argv[1], argv[2])))
        return 0
    if len(argv) != 4 or argv[0] not in ("train", "eval") or argv[1] not in ("vlm", "flow"):
        print("usage: smoke.py train|eval vlm|flow RECIPE.yaml RUN_DIR | check vlm|flow RECIPE.yaml [key=value ...] | "
              "check-eval SCRIPT [--config FILE] [key=value ...] | base vlm|flow RECIPE.yaml", file=sys.stderr)
        return 2
    what, kind, recipe, run_dir = argv
    cfg = load_recipe(kind, recipe)
    fn = {("train", "vlm"): vlm_train, ("eval", "vlm"): vlm_eval,
          ("train", "flow"): flow_train, ("eval", "flow"): flow_eval}[(what, kind)]
    for line in fn(cfg, Path(run_dir).resolve()):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
