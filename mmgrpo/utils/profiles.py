"""Named override profiles: ``--profile NAME`` on ``mmgrpo train``, ``flow_grpo train``, ``eval/generate_vlm.py`` and
``eval/generate_t2i.py`` (and ``PROFILE=NAME`` for ``scripts/experiments/*.sh``).

A profile is a list of ``key=value`` overrides applied after ``--config`` and before the command line's own
``key=value`` (precedence: defaults < method preset < YAML < profile < key=value), so any of its values can be
overridden. Nothing else changes: the recipe's method, rewards, parse mode, prompts, learning rate and schedules
stay as they are.

``cpu``: a **CPU rehearsal** of a recipe on its real (depth-cut) model (``scripts/rehearse_real_scale.py
--build-only``), to check a whole run end to end — data, model folder, rewards, export, evaluation, interrupt and
resume — before booking GPUs. It forces what a CPU needs (CPU device, no autocast, SDPA attention, bf16 weights: the
dtype CPU runs at real width were measured in, half of fp32's memory) and shrinks the run to minutes: 2 steps of 1
prompt x 4 rollouts, 32 new tokens, 8 frames of at most 224x224 per video (256 visual tokens), images of at most
224x224; flow: 2 epochs of 1 group of 4 images at 256x256, 4 denoising steps, 2 evaluation prompts. The evaluation
profiles keep 2 samples / prompts with the same media budgets and 32 new tokens (VLM). What it cannot tell: speed and memory on
a GPU (``mmgrpo plan`` / ``flow_grpo plan``), and anything about the trained model's quality.
"""
from __future__ import annotations

import sys
from typing import Sequence

__all__ = ["PROFILES", "expand_profile"]

_PX = 224 * 224  # pixels per frame / image (a 224x224 frame = 16x16 patches of 14 px = 64 merged tokens per 2 frames)

PROFILES: dict[str, dict[str, list[str]]] = {
    "cpu": {
        "vlm": ["run.device=cpu", "run.mixed_precision=no", "model.attn_implementation=sdpa", "model.dtype=bfloat16",
                "model.gradient_checkpointing=true", "rollout.backend=hf", "rollout.group_size=4",
                "rollout.max_new_tokens=32", "rollout.generation_batch_size=8", "run.prompts_per_device=1",
                "run.prompts_per_step=0", "run.micro_batch_size=8", "run.max_steps=2", "run.save_every=1",
                "data.max_frames=8", "data.min_frames=4", f"data.video_max_pixels={_PX}",
                f"data.video_total_pixels={_PX * 8}", f"data.image_max_pixels={_PX}", "validation.every=0"],
        "flow": ["run.device=cpu", "run.mixed_precision=no", "model.dtype=bfloat16",
                 "model.gradient_checkpointing=true", "data.group_size=4", "data.groups_per_epoch=1",
                 "sample.batch_size=4", "sample.completion_batch_size=4", "sample.height=256", "sample.width=256",
                 "sample.num_steps=4", "sample.eval_num_steps=4", "run.num_epochs=2", "run.save_every=1",
                 "run.eval_every=0", "data.eval_num_prompts=2", "run.image_grid_every=0", "reward.async_workers=0"],
        "eval_vlm": ["device=cpu", "dtype=bfloat16", "attn_implementation=sdpa", "data.max_samples=2",
                     "decoding.batch_size=2", "decoding.max_new_tokens=32", "data.max_frames=8", f"data.video_max_pixels={_PX}",
                     f"data.video_total_pixels={_PX * 8}", f"data.image_max_pixels={_PX}"],
        "eval_t2i": ["device=cpu", "dtype=bfloat16", "max_prompts=2", "images_per_prompt=1", "batch_size=2",
                     "num_steps=4", "height=256", "width=256"],
    },
}


def expand_profile(argv: Sequence[str], kind: str, prog: str) -> list[str]:
    """``argv`` with ``--profile NAME`` replaced by the profile's overrides for ``kind`` (vlm | flow | eval_vlm |
    eval_t2i), placed before the first ``key=value`` of the command line so that those still win. An unknown
    profile exits with code 2."""
    argv = list(argv)
    if "--profile" not in argv:
        return argv
    i = argv.index("--profile")
    if i + 1 >= len(argv):
        print(f"{prog}: --profile needs a name: {', '.join(PROFILES)}", file=sys.stderr)
        raise SystemExit(2)
    name = argv[i + 1]
    if name not in PROFILES or kind not in PROFILES[name]:
        print(f"{prog}: unknown profile {name!r}; available: {', '.join(PROFILES)}", file=sys.stderr)
        raise SystemExit(2)
    rest = argv[:i] + argv[i + 2:]
    first = next((j for j, a in enumerate(rest) if "=" in a and not a.startswith("-")), len(rest))
    return rest[:first] + PROFILES[name][kind] + rest[first:]
