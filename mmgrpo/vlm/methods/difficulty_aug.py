r"""DeepVideo-R1 difficulty-aware data augmentation (Park et al., NeurIPS 2025, arXiv 2506.07464).

GRPO learns nothing from a group whose rewards are all equal (all right: too easy; all wrong: too hard). The
augmentation moves a prompt's difficulty towards the solvable middle so its group keeps reward variance:

* **difficulty** of prompt q at step s, relative to a replay window of the last W steps' rewards:
  :math:`\Delta(q) = \bar r_q - \mu_W` with :math:`\bar r_q` the mean reward of q's group and :math:`\mu_W` the
  mean reward over the window (positive = easier than usual, negative = harder);
* **easy** prompts (:math:`\Delta > \delta`) are made harder by perturbing the video: Gaussian pixel noise of std
  :math:`\sigma = s\,\sigma_{max}` and masking (blanking) a fraction :math:`s\,m_{max}` of the frames, with
  strength :math:`s = \min(1, \Delta/\Delta_{scale})` ("scaled by easiness");
* **hard** prompts (:math:`\Delta < -\delta`) are made easier with a partial reasoning hint: the first
  :math:`s\,h_{max}` fraction of the reasoning of a successful trajectory for that prompt (from the replay
  buffer), :math:`s = \min(1, -\Delta/\Delta_{scale})` ("scaled by difficulty").

Choices the paper leaves open (its code is not reachable), and what this module does:

* the window statistic :math:`\mu_W` is the mean of the per-step mean rewards of the last W steps (W = 8), so every
  step weighs the same whatever its batch size; before any history, :math:`\Delta=0` (no augmentation);
* the threshold :math:`\delta` (0.1) and scale :math:`\Delta_{scale}` (0.5) are ours;
* perturbations keep the time axis: frames are **masked in place** (set to the clip's mean colour) rather than
  dropped, so timestamps, ``second_per_grid_ts`` and ground-truth spans stay valid (dropping frames or cutting a
  shorter clip would move or cut a temporal-grounding answer; :func:`drop_frames` exists for tasks without a
  time answer and returns the kept indices so the caller can rebuild timestamps);
* the frames to mask and the noise are drawn from a ``torch.Generator`` the caller seeds per (step, prompt), so a
  run is reproducible and a resumed run draws the same augmentation;
* a hard prompt without any successful trajectory in the buffer gets no reasoning hint; the caller may fall back
  to :func:`elimination_hint` (MCQ: name wrong options) or :func:`coarse_span_hint` (temporal grounding: a
  randomly placed window of half the video that holds the event), which use the ground truth but never give
  the answer itself.

All functions are pure (explicit tensors / strings in, out); :class:`DifficultyWindow` holds the W-step history
and round-trips through ``state_dict``.
"""
from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass
from typing import Literal, Sequence

import torch
from torch import Tensor

__all__ = ["DifficultyWindow", "AugPlan", "plan_augmentation", "mask_frames", "add_frame_noise", "drop_frames",
           "reasoning_hint", "elimination_hint", "coarse_span_hint"]


class DifficultyWindow:
    """Replay window of the last ``window`` steps' mean rewards; :meth:`difficulty` gives :math:`\\Delta`."""

    def __init__(self, window: int = 8):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = int(window)
        self.means: deque[float] = deque(maxlen=self.window)

    def mean(self) -> float | None:
        return (sum(self.means) / len(self.means)) if self.means else None

    def difficulty(self, group_mean_rewards: Tensor) -> Tensor:
        """(P,) group mean rewards -> (P,) float64 :math:`\\Delta = \\bar r_q - \\mu_W` (0 without history)."""
        r = torch.as_tensor(group_mean_rewards, dtype=torch.float64)
        mu = self.mean()
        return torch.zeros_like(r) if mu is None else r - mu

    def push(self, step_rewards: Tensor) -> None:
        """Record one step: the mean of its (finite) rewards."""
        r = torch.as_tensor(step_rewards, dtype=torch.float64).flatten()
        r = r[torch.isfinite(r)]
        if r.numel():
            self.means.append(float(r.mean()))

    def state_dict(self) -> dict:
        return {"window": self.window, "means": list(self.means)}

    def load_state_dict(self, sd: dict) -> None:
        self.window = int(sd["window"])
        self.means = deque((float(x) for x in sd["means"]), maxlen=self.window)


@dataclass(frozen=True)
class AugPlan:
    """What to do with one prompt: ``kind`` "harden" | "ease" | "none", ``strength`` in [0, 1]."""

    kind: Literal["harden", "ease", "none"]
    strength: float


def plan_augmentation(delta: Tensor, threshold: float = 0.1, scale: float = 0.5) -> list[AugPlan]:
    """Per prompt: harden if :math:`\\Delta > \\delta`, ease if :math:`\\Delta < -\\delta`, strength
    :math:`\\min(1, |\\Delta|/\\Delta_{scale})`; else none."""
    if threshold < 0 or scale <= 0:
        raise ValueError(f"threshold must be >= 0 and scale > 0, got {threshold}, {scale}")
    out = []
    for d in torch.as_tensor(delta, dtype=torch.float64).tolist():
        s = min(1.0, abs(d) / scale)
        out.append(AugPlan("harden", s) if d > threshold else AugPlan("ease", s) if d < -threshold
                   else AugPlan("none", 0.0))
    return out


def _check_frames(frames: Tensor) -> None:
    if frames.dim() != 4 or frames.shape[-1] != 3:
        raise ValueError(f"frames must be (T, H, W, 3), got {tuple(frames.shape)}")


def mask_frames(frames: Tensor, frac: float, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Blank ``round(frac * T)`` randomly chosen frames (set to the clip's mean colour, same dtype); the time
    axis is unchanged. Returns (new frames, (T,) bool of masked frames). At least one frame is always kept."""
    _check_frames(frames)
    if not 0.0 <= frac <= 1.0:
        raise ValueError(f"frac must be in [0, 1], got {frac}")
    T = frames.shape[0]
    k = min(T - 1, int(round(frac * T)))
    masked = torch.zeros(T, dtype=torch.bool)
    if k <= 0:
        return frames.clone(), masked
    masked[torch.randperm(T, generator=gen)[:k]] = True
    fill = frames.float().mean(dim=(0, 1, 2))
    if not frames.dtype.is_floating_point:
        fill = fill.round()
    out = frames.clone()
    out[masked] = fill.to(frames.dtype)
    return out, masked


def add_frame_noise(frames: Tensor, sigma: float, gen: torch.Generator) -> Tensor:
    """Gaussian pixel noise of std ``sigma`` (in the frames' units: 0-255 for uint8), clamped and rounded back to
    uint8 for integer frames."""
    _check_frames(frames)
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    if sigma == 0:
        return frames.clone()
    noise = torch.randn(frames.shape, generator=gen) * sigma
    out = frames.float() + noise
    if frames.dtype == torch.uint8:
        return out.round().clamp(0, 255).to(torch.uint8)
    return out.to(frames.dtype)


def drop_frames(frames: Tensor, keep_frac: float, gen: torch.Generator, multiple: int = 2) -> tuple[Tensor, Tensor]:
    """Keep a random, ordered subset of ``~keep_frac * T`` frames, a multiple of ``multiple`` (Qwen-VL merges 2
    frames per temporal patch). Returns (frames, kept indices (K,) int64). Changes the time axis: not for tasks
    whose answer is a time."""
    _check_frames(frames)
    T = frames.shape[0]
    k = max(multiple, int(round(keep_frac * T)) // multiple * multiple)
    k = min(k, T // multiple * multiple) if T >= multiple else T
    idx = torch.sort(torch.randperm(T, generator=gen)[:k]).values
    return frames[idx], idx


_THINK = re.compile(r"<think>(.*?)(</think>|$)", re.S | re.I)


def reasoning_hint(successful_completion: str, frac: float) -> str:
    """The first ``frac`` of the words of a successful completion's reasoning (its ``<think>`` block, or the text
    before ``<answer>`` when there is no think block). Cut on a word boundary; '' when frac is 0 or there is no
    reasoning. Never includes the answer block."""
    if not 0.0 <= frac <= 1.0:
        raise ValueError(f"frac must be in [0, 1], got {frac}")
    m = _THINK.search(successful_completion or "")
    body = m.group(1) if m else re.split(r"<answer>", successful_completion or "", flags=re.I)[0]
    words = body.split()
    n = int(math.floor(frac * len(words)))
    return " ".join(words[:n])


def elimination_hint(options: Sequence[str], correct: Sequence[str], n: int, gen: torch.Generator,
                     letters: str = "ABCDEFGHIJKLMNOPQRSTUVWXYZ") -> list[str]:
    """Up to ``n`` randomly chosen wrong option letters (MCQ), never a correct one; always leaves at least one
    wrong option so the question is not reduced to the answer."""
    wrong = [letters[i] for i in range(len(options)) if letters[i] not in set(correct)]
    k = max(0, min(int(n), len(wrong) - 1))
    if k == 0:
        return []
    pick = torch.randperm(len(wrong), generator=gen)[:k].tolist()
    return sorted(wrong[i] for i in pick)


def coarse_span_hint(span: Sequence[float], duration: float, gen: torch.Generator, frac: float = 0.5
                     ) -> tuple[float, float]:
    """A window of length ``min(duration, max(frac * duration, span length / frac))`` that contains the
    ground-truth span, placed at a uniformly random offset (temporal grounding): it narrows the search without
    giving the boundaries away (it is always longer than the span, and a window aligned to a fixed grid could
    coincide with the answer). A span too long for that returns the whole clip (no information)."""
    if duration <= 0 or not 0 < frac <= 1:
        raise ValueError(f"duration must be > 0 and frac in (0, 1], got {duration}, {frac}")
    s, e = sorted((float(span[0]), float(span[1])))
    s, e = max(0.0, s), min(float(duration), e)
    w = min(float(duration), max(frac * duration, (e - s) / frac))
    lo, hi = max(0.0, e - w), min(s, duration - w)
    start = lo + (hi - lo) * float(torch.rand((), generator=gen, dtype=torch.float64)) if hi > lo else lo
    return start, start + w


# ----------------------------------------------------------------------------------------------- trainer hook
from mmgrpo.vlm.methods.base import VLMMethod  # noqa: E402  (the pure functions above need no trainer)


def _sample_key(sample) -> str:
    from mmgrpo.vlm.data.task import sample_id

    return str(sample_id(sample))


class DifficultyAug(VLMMethod):
    """``methods.difficulty_aug.enabled``: a prompt's difficulty is its group's mean reward the last time it was
    sampled, relative to the mean reward of the last ``window`` steps (:class:`DifficultyWindow`); when drawn
    again, an easy prompt's video is perturbed (masked frames + pixel noise; images: noise) and a hard prompt gets a
    hint (a prefix of its best successful completion's reasoning; else, with ``fallback_hints``, eliminated MCQ
    options or the coarse part of the video holding the event). A prompt seen for the first time is not changed.
    The augmentation is drawn from (run.seed, step, position): reproducible and identical after a resume."""

    name = "difficulty_aug"

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.o = o = cfg.methods.difficulty_aug
        if not (0 <= o.max_mask_frac < 1 and o.max_noise >= 0 and 0 <= o.max_hint_frac <= 1):
            raise ValueError("methods.difficulty_aug: need 0 <= max_mask_frac < 1, max_noise >= 0, "
                             f"0 <= max_hint_frac <= 1 (got {o.max_mask_frac}, {o.max_noise}, {o.max_hint_frac})")
        self.window = DifficultyWindow(o.window)
        self.last_mean: dict[str, float] = {}  # sample key -> group mean reward when last sampled
        self.best: dict[str, tuple[float, str]] = {}  # sample key -> (reward, text) of its best successful answer
        self._m: dict[str, float] = {}

    def _gen(self, step: int, pos: int) -> torch.Generator:
        return torch.Generator().manual_seed((self.cfg.run.seed * 1_000_003 + step * 7919 + pos) % (2 ** 63))

    def _hint(self, pp, key: str, strength: float, gen: torch.Generator) -> str:
        o = self.o
        if key in self.best:
            h = reasoning_hint(self.best[key][1], strength * o.max_hint_frac)
            if h:
                return h
        if not o.fallback_hints:
            return ""
        s = pp.reward_sample or {}
        if s.get("options") and s.get("answer"):
            ans = s["answer"] if isinstance(s["answer"], (list, tuple)) else [s["answer"]]
            wrong = elimination_hint(s["options"], [str(a) for a in ans], max(1, round(strength * len(s["options"]))),
                                     gen)
            return f"the answer is not {', '.join(wrong)}." if wrong else ""
        if s.get("spans") and s.get("duration"):
            off = s.get("video_start") or 0.0
            span = [x - off for x in s["spans"][0]]
            dur = (s.get("video_end") or s["duration"]) - off
            lo, hi = coarse_span_hint(span, dur, gen)
            if hi - lo < dur:  # a window as long as the clip says nothing
                return f"the event happens between {lo:.2f} and {hi:.2f} seconds."
        return ""

    def before_rollout(self, step, preps):
        keys = [_sample_key(pp.sample) for _, pp, _ in preps]
        hist = torch.tensor([self.last_mean.get(k, float("nan")) for k in keys], dtype=torch.float64)
        delta = torch.where(torch.isnan(hist), torch.zeros_like(hist), self.window.difficulty(hist))
        if self.window.mean() is None:
            delta = torch.zeros_like(delta)
        plans = plan_augmentation(delta, self.o.threshold, self.o.scale)
        out, n_hard, n_ease = [], 0, 0
        for (pos, pp, gens), key, plan in zip(preps, keys, plans):
            gen = self._gen(step, pos)
            if plan.kind == "harden" and pp.clip is not None:
                fr = torch.as_tensor(pp.clip.frames)
                fr, _ = mask_frames(fr, plan.strength * self.o.max_mask_frac, gen)
                fr = add_frame_noise(fr, plan.strength * self.o.max_noise, gen)
                pp, n_hard = self.run.task.rebuild(pp, frames=fr), n_hard + 1
            elif plan.kind == "harden" and pp.images:
                import numpy as np
                from PIL import Image

                imgs = [Image.fromarray(add_frame_noise(torch.from_numpy(np.array(im))[None],
                                                        plan.strength * self.o.max_noise, gen)[0].numpy())
                        for im in pp.images]
                pp, n_hard = self.run.task.rebuild(pp, images=imgs), n_hard + 1
            elif plan.kind == "ease":
                hint = self._hint(pp, key, plan.strength, gen)
                if hint:
                    pp, n_ease = self.run.task.rebuild(pp, hint=hint), n_ease + 1
            out.append((pos, pp, gens))
        self._m = {"aug/hardened": float(n_hard), "aug/eased": float(n_ease),
                   "aug/window_mean": self.window.mean() if self.window.mean() is not None else 0.0}
        return out

    def on_rewards(self, rb):
        use = rb.valid & ~rb.is_offpolicy
        r = rb.rewards["total"].double()
        acc_key = self.run.acc_key
        acc = rb.rewards.get(acc_key, rb.rewards["total"]).double()
        for g in torch.unique(rb.group_ids[use]).tolist():
            rows = (use & (rb.group_ids == g)).nonzero().flatten()
            key = _sample_key(rb.samples[int(rows[0])])
            self.last_mean[key] = float(r[rows].mean())
            i = int(rows[torch.argmax(r[rows])])
            if acc[i] >= self.o.success_threshold and float(r[i]) >= self.best.get(key, (-float("inf"), ""))[0]:
                self.best[key] = (float(r[i]), rb.texts[i])
        if use.any():
            self.window.push(r[use])

    def state_dict(self):
        return {"window": self.window.state_dict(), "last_mean": dict(self.last_mean),
                "best": {k: [v[0], v[1]] for k, v in self.best.items()}}

    def load_state_dict(self, sd):
        self.window.load_state_dict(sd["window"])
        self.last_mean = {k: float(v) for k, v in sd["last_mean"].items()}
        self.best = {k: (float(v[0]), str(v[1])) for k, v in sd["best"].items()}

    def end_of_step(self, rb, m):
        m.update(self._m)
