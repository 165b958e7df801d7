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
  to :func:`elimination_hint` (MCQ: name wrong options) or :func:`coarse_span_hint` (temporal grounding: the
  part of the video the event lies in), which use the ground truth and are documented as hints, not answers.

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


def coarse_span_hint(span: Sequence[float], duration: float, bins: int = 2) -> tuple[float, float]:
    """The union of the ``bins`` equal parts of [0, duration] that the ground-truth span touches (temporal
    grounding): e.g. bins=2 says which half (or both) holds the event. Coarser than the answer by construction."""
    if duration <= 0 or bins < 1:
        raise ValueError(f"duration must be > 0 and bins >= 1, got {duration}, {bins}")
    s, e = sorted((float(span[0]), float(span[1])))
    s, e = max(0.0, s), min(float(duration), e)
    w = duration / bins
    lo = min(bins - 1, int(math.floor(s / w)))
    hi = max(lo, min(bins - 1, int(math.ceil(e / w)) - 1))
    return lo * w, (hi + 1) * w
