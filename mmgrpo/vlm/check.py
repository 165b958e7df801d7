"""``mmgrpo check``: see what the model sees -- and stop before step 1 when it cannot learn from it.

For the first N samples of a recipe's data file, with the recipe's processor (no model weights are loaded):

* the rendered prompt exactly as tokenised (the decoded ``input_ids``; runs of ``<|video_pad|>`` / ``<|image_pad|>``
  shown once with their count), its token count split into text and visual tokens;
* the frames taken (frame index and timestamp in seconds), and the pixel budget that reached the processor
  (frame / image size, the visual grid, against ``data.*_pixels`` / ``min_frames`` / ``max_frames``);
* the ground truth written in the format the prompt asks for (``TaskAdapter.gt_completion``) and its reward under
  the recipe's reward weights and parse mode.

It fails (:class:`CheckError`, ``mmgrpo check`` exits 1) when

* the ground truth does not get the maximum of every weighted reward (each reward's maximum is 1; ``length`` is
  left out: it depends on the completion's length and the group) -- a prompt that asks for one answer format and a
  reward that pays for another (e.g. ``[x1, y1, x2, y2]`` asked for, braces required);
* a configured budget never reached the processor (a frame, image or frame count outside the configured bounds, or a
  visual grid that does not match the frames given);
* the prompt differs between rollout and training: the prompt a method rebuilds (``TaskAdapter.rebuild``, the route
  of hybrid CoT and augmentation) must tokenise to the same ids, and the ground-truth completion must survive
  tokenisation (decode(encode(gt)) == gt, the TempSamp-R1 off-policy member is injected as tokens).

The same check runs at the start of ``mmgrpo train`` (``data.check_samples``, default 2) and of
``eval/generate_vlm.py`` (there the reward is the evaluation protocol's accuracy, ``check_reward_fn``).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

# a written answer rounds times to 2 decimals and Qwen2.5-VL boxes to integer pixels of the resized image: the
# ground truth then scores slightly below 1 (a contradiction scores 0)
REWARD_TOLERANCE = 0.05
UNCHECKED_REWARDS = ("length",)


class CheckError(ValueError):
    """The inputs contradict the recipe (the message lists every problem, per sample)."""


@dataclass
class SampleCheck:
    id: str
    prompt: str = ""
    n_tokens: int = 0
    n_visual: int = 0
    frames: list = field(default_factory=list)  # [(frame index, seconds)]
    media: dict = field(default_factory=dict)
    ground_truth: str = ""
    rewards: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)

    @property
    def n_text(self) -> int:
        return self.n_tokens - self.n_visual


@dataclass
class CheckReport:
    template: str
    samples: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return [f"sample {s.id}: {p}" for s in self.samples for p in s.problems]

    @property
    def ok(self) -> bool:
        return not self.problems

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise CheckError("mmgrpo check failed (see `mmgrpo check --config RECIPE` for the rendered prompts):\n  "
                             + "\n  ".join(self.problems))


def _pad_ids(tokenizer) -> dict[int, str]:
    out = {}
    for t in ("<|image_pad|>", "<|video_pad|>"):
        i = tokenizer.convert_tokens_to_ids(t)
        if i is not None and i != getattr(tokenizer, "unk_token_id", None):
            out[int(i)] = t
    return out


def rendered_prompt(tokenizer, ids: Sequence[int]) -> tuple[str, int]:
    """(the decoded prompt with each run of vision pad tokens written once as ``<|video_pad|>×N``, visual tokens)."""
    pads = _pad_ids(tokenizer)
    parts: list[str] = []
    run: list[int] = []
    n_vis = 0
    k = 0
    ids = [int(x) for x in ids]
    while k < len(ids):
        if ids[k] in pads:
            j = k
            while j < len(ids) and ids[j] == ids[k]:
                j += 1
            if run:
                parts.append(tokenizer.decode(run, skip_special_tokens=False))
                run = []
            parts.append(f"{pads[ids[k]]}×{j - k}")
            n_vis += j - k
            k = j
            continue
        run.append(ids[k])
        k += 1
    if run:
        parts.append(tokenizer.decode(run, skip_special_tokens=False))
    return "".join(parts), n_vis


def _budget(task_adapter, prep, sc: SampleCheck) -> None:
    """Frames / pixels that reached the processor, against the configured bounds."""
    cfg, item = task_adapter.cfg, prep.item
    patch = task_adapter.adapter.patch_size
    if prep.clip is not None:
        clip = prep.clip
        n, h, w = int(clip.frames.shape[0]), int(clip.frames.shape[1]), int(clip.frames.shape[2])
        sc.frames = [(int(i), round(float(t), 3)) for i, t in zip(clip.frame_indices, clip.timestamps)]
        sc.media = {"kind": "video", "frames": n, "frame_size": [w, h], "pixels_per_frame": h * w,
                    "sample_fps": round(float(clip.sample_fps), 4), "video_fps": round(float(clip.video_fps), 4),
                    "configured": {"fps": cfg.video_fps, "min_frames": cfg.min_frames, "max_frames": cfg.max_frames,
                                   "min_pixels": cfg.video_min_pixels, "max_pixels": cfg.video_max_pixels,
                                   "total_pixels": cfg.video_total_pixels}}
        if cfg.max_frames and n > cfg.max_frames:
            sc.problems.append(f"{n} frames > data.max_frames={cfg.max_frames}")
        if cfg.video_max_pixels and h * w > cfg.video_max_pixels:
            sc.problems.append(f"frames of {w}x{h} = {h * w} pixels > data.video_max_pixels={cfg.video_max_pixels}")
        # (no lower-bound check: qwen-vl-utils' rounding down to the patch grid may end below min_pixels when both
        # bounds are tight; that is the reference behaviour, not a lost setting)
        grid = item.get("video_grid_thw")
        if grid is not None:
            t_, gh, gw = (int(x) for x in grid[0])
            tps = int(getattr(task_adapter.adapter, "temporal_patch_size", 2) or 2)
            sc.media["grid_thw"] = [t_, gh, gw]
            if (gh * patch, gw * patch) != (h, w) or t_ * tps < n or (t_ - 1) * tps >= n:
                sc.problems.append(f"the processor resized or resampled the frames: grid {t_}x{gh}x{gw} (patch "
                                   f"{patch}) for {n} frames of {w}x{h}; the configured budget did not reach it")
    elif prep.images:
        grid = item.get("image_grid_thw")
        sizes = [list(im.size) for im in prep.images]
        sc.media = {"kind": "image", "original_size": sizes[0] if len(sizes) == 1 else sizes,
                    "configured": {"min_pixels": cfg.image_min_pixels, "max_pixels": cfg.image_max_pixels},
                    "processor_kwargs": task_adapter.image_size_kwargs()}
        if grid is not None:
            _, gh, gw = (int(x) for x in grid[0])
            px = gh * gw * patch * patch
            sc.media.update({"resized_size": [gw * patch, gh * patch], "pixels": px, "grid_thw": [1, gh, gw]})
            if cfg.image_max_pixels and px > cfg.image_max_pixels:
                sc.problems.append(f"the processor gave the image {gw * patch}x{gh * patch} = {px} pixels > "
                                   f"data.image_max_pixels={cfg.image_max_pixels}: the budget did not reach it")


def _rewards(task_adapter, reward_fn, prep, sc: SampleCheck) -> None:
    gt = task_adapter.gt_completion(prep.sample, prep.item)
    sc.ground_truth = gt
    tok = getattr(task_adapter.processor, "tokenizer", task_adapter.processor)
    back = tok.decode(tok(gt, add_special_tokens=False).input_ids, skip_special_tokens=False)
    if back != gt:
        sc.problems.append(f"the ground-truth completion does not survive tokenisation: {gt!r} -> {back!r}")
    if reward_fn is None or not hasattr(reward_fn, "score") or not hasattr(reward_fn, "weights"):
        sc.rewards = {"(not checked)": "a custom reward function"}
        return
    out = reward_fn.score([gt], [prep.reward_sample])
    for name, w in reward_fn.weights.items():
        v = float(out[name][0])
        sc.rewards[name] = round(v, 6)
        if name in UNCHECKED_REWARDS or name in getattr(reward_fn, "unchecked", ()) or w == 0:
            continue
        if not math.isfinite(v) or v < 1.0 - REWARD_TOLERANCE:
            sc.problems.append(f"the ground truth written as the prompt asks ({gt!r}) gets reward {name}={v:.4g} "
                               f"(maximum 1): the prompt and the reward contradict each other")
    sc.rewards["total"] = round(float(out["total"][0]), 6)


def check_samples(task_adapter, samples: Sequence[Any], reward_fn=None, n: int = 2) -> CheckReport:
    """Run the checks of the module docstring on the first ``n`` samples that can be prepared (a sample whose
    media is missing is reported, not raised)."""
    from mmgrpo.vlm.data.task import BadSampleError, MissingMediaError, sample_id

    rep = CheckReport(task_adapter.template)
    tok = getattr(task_adapter.processor, "tokenizer", task_adapter.processor)
    for s in list(samples)[:n]:
        sc = SampleCheck(sample_id(s))
        rep.samples.append(sc)
        try:
            prep = task_adapter.prepare(s)
        except (MissingMediaError, BadSampleError) as e:
            rep.notes.append(f"sample {sc.id}: not checked ({e})")
            rep.samples.pop()
            continue
        ids = prep.item["input_ids"][0].tolist()
        sc.prompt, sc.n_visual = rendered_prompt(tok, ids)
        sc.n_tokens = len(ids)
        _budget(task_adapter, prep, sc)
        again = task_adapter.rebuild(prep)
        if again.item["input_ids"].shape != prep.item["input_ids"].shape or \
                not bool((again.item["input_ids"] == prep.item["input_ids"]).all()):
            sc.problems.append("the prompt a method rebuilds (TaskAdapter.rebuild) differs from the rollout's: "
                               f"{again.text!r} vs {prep.text!r}")
        _rewards(task_adapter, reward_fn, prep, sc)
    if not rep.samples:
        rep.notes.append("no sample could be prepared: nothing checked")
    return rep


def format_report(rep: CheckReport, full: bool = True) -> str:
    from mmgrpo.vlm.data.templates import describe

    lines = [f"prompt template: {rep.template} -- {describe(rep.template)}"]
    for s in rep.samples:
        lines += [f"--- sample {s.id}: {s.n_tokens} tokens = {s.n_text} text + {s.n_visual} visual"]
        if full:
            lines += ["prompt (as tokenised):", s.prompt]
        if s.media:
            lines.append(f"media: {s.media}")
        if s.frames:
            lines.append("frames (index, seconds): " + ", ".join(f"({i}, {t:g})" for i, t in s.frames))
        lines.append(f"ground truth as the prompt asks: {s.ground_truth!r}")
        lines.append(f"its rewards: {s.rewards}")
        lines += [f"PROBLEM: {p}" for p in s.problems]
    lines += [f"note: {x}" for x in rep.notes]
    lines.append("check: OK" if rep.ok else f"check: FAILED ({len(rep.problems)} problem(s))")
    return "\n".join(lines)


def start_of_run_check(task_adapter, samples: Sequence[Any], reward_fn, n: int, log=None) -> Optional[CheckReport]:
    """The check at the start of training / evaluation: log the report (first sample in full), raise on a problem.
    ``n = 0`` skips it."""
    if n <= 0:
        return None
    rep = check_samples(task_adapter, samples, reward_fn, n)
    if log is not None:
        log.info("what the model sees (data.check_samples=%d):\n%s", n, format_report(rep, full=True))
    rep.raise_if_failed()
    return rep


# ------------------------------------------------------------------------------------------------------ CLI
def check_main(argv: Sequence[str]) -> int:
    """``mmgrpo check --config RECIPE [--samples N] [--quiet] [key=value ...]``."""
    import argparse

    p = argparse.ArgumentParser(
        prog="mmgrpo check", description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="training recipe (YAML), e.g. configs/vlm/time_r1_charades.yaml")
    p.add_argument("--samples", type=int, default=3, help="how many samples of data.train_file to show (default 3)")
    p.add_argument("--quiet", action="store_true", help="no rendered prompts, only counts, media and rewards")
    p.add_argument("overrides", nargs="*", help="key=value overrides of the recipe (model.path=..., "
                                                 "data.train_file=..., data.media_root=...)")
    a = p.parse_args(list(argv))
    from mmgrpo.utils.config import load_config
    from mmgrpo.vlm.config import TrainConfig

    cfg = load_config(TrainConfig, a.config, list(a.overrides))
    if not cfg.model.path or not cfg.data.train_file:
        p.error("set model.path=FOLDER (its processor is used; no weights are loaded) and data.train_file=FILE")
    task_adapter, tokenizer = processor_task_adapter(cfg.model.path, cfg.model.family, cfg.data)
    from mmgrpo.vlm.data.task import load_samples
    from mmgrpo.vlm.rewards.registry import build_rewards

    samples = load_samples(cfg.data.train_file, a.samples, cfg.data.media_root)
    reward_fn, _ = build_rewards(cfg.reward, cfg.data.task, task_adapter.adapter.family, tokenizer,
                                 cfg.data.prompt_mode)
    rep = check_samples(task_adapter, samples, reward_fn, a.samples)
    print(format_report(rep, full=not a.quiet))
    return 0 if rep.ok else 1


def processor_task_adapter(model_path: str, family: str, data_cfg):
    """A TaskAdapter on the processor of ``model_path`` (no weights loaded) and its tokenizer."""
    from transformers import AutoProcessor

    from mmgrpo.vlm.models.adapters import detect_family, get_adapter
    from mmgrpo.vlm.data.task import TaskAdapter

    fam = detect_family(model_path) if family in ("auto", "", None) else family
    proc = AutoProcessor.from_pretrained(model_path, local_files_only=True)
    return TaskAdapter(proc, get_adapter(fam), data_cfg), proc.tokenizer


if __name__ == "__main__":
    sys.exit(check_main(sys.argv[1:]))
