r"""TON (Think or Not, Wang et al. 2025, arXiv 2505.16854): ``methods.ton.enabled=true``.

TON teaches a VLM *when* to reason. Its SFT stage ("thought dropout") replaces the reasoning of some training
answers by an empty thought, ``<think>\n\n</think>``, so the model knows the skip form; its GRPO stage then leaves the
choice to the policy under the task's outcome reward, with a format reward that accepts the empty thought. This
module is the GRPO side:

* :func:`thought_mode`: a completion **skips** when its think block is empty (whitespace only) or, with
  ``direct_is_skip``, when it answers without any think block; otherwise it **thinks**;
* :func:`ton_format`: 1 when the completion is ``<think>T</think><answer>A</answer>`` with T possibly empty (or, with
  ``direct_is_skip``, exactly ``<answer>A</answer>``), else 0; ``format_weight`` times it is added to the total;
* the reward split logged every step: ``ton/think_ratio`` (share of completions that think), mean length and mean
  accuracy of thinking and of skipping completions (``ton/length_think``, ``ton/length_skip``, ``ton/acc_think``,
  ``ton/acc_skip``; -1 when a mode has no completion), so a run shows whether skipping costs accuracy;
* with ``group_by`` (a key of the samples' ``meta``, e.g. the question's kind): the same split per value of that
  key (:func:`group_stats`: ``ton/<value>/think_ratio``, ``ton/<value>/length`` -- mean completion length of
  the value's completions --, ``ton/<value>/acc``), so a run shows *where* the policy thinks.

Not here: the thought-dropout SFT stage (a data transform of SFT targets); a base that never writes a think block
skips on every prompt, and TON then trains exactly as GRPO (plus the format term).
"""
from __future__ import annotations

import re
from typing import Literal

import torch

from mmgrpo.vlm.methods.base import VLMMethod

__all__ = ["TON", "thought_mode", "ton_format", "mode_stats", "group_stats"]

_FULL = re.compile(r"\s*<think>(.*?)</think>\s*<answer>(.*?)</answer>\s*", re.S | re.I)
_DIRECT = re.compile(r"\s*<answer>(.*?)</answer>\s*", re.S | re.I)
_THINK = re.compile(r"<think>(.*?)</think>", re.S | re.I)


def thought_mode(text: str, direct_is_skip: bool = True) -> Literal["think", "skip"]:
    """``skip`` for an empty think block (or none, with ``direct_is_skip``), else ``think``."""
    blocks = _THINK.findall(text or "")
    if not blocks:
        return "skip" if direct_is_skip or "<think" not in (text or "").lower() else "think"
    return "think" if any(b.strip() for b in blocks) else "skip"


def ton_format(text: str, direct_is_skip: bool = True) -> float:
    """TON's format reward (module docstring): 1.0 / 0.0."""
    t = text or ""
    m = _FULL.fullmatch(t)
    if m is not None:
        return 1.0 if "<think" not in m.group(2).lower() and "<answer" not in m.group(2).lower() else 0.0
    if direct_is_skip and "<think" not in t.lower() and _DIRECT.fullmatch(t) is not None:
        return 1.0 if "<answer" not in _DIRECT.fullmatch(t).group(1).lower() else 0.0
    return 0.0


def mode_stats(modes: list[str], lengths: torch.Tensor, acc: torch.Tensor) -> dict[str, float]:
    """Think ratio and per-mode mean length / accuracy (-1 for a mode without completions)."""
    think = torch.tensor([m == "think" for m in modes], dtype=torch.bool)
    L, a = lengths.float(), acc.float()
    out = {"ton/think_ratio": float(think.float().mean()) if len(modes) else 0.0}
    for name, sel in (("think", think), ("skip", ~think)):
        out[f"ton/length_{name}"] = float(L[sel].mean()) if sel.any() else -1.0
        out[f"ton/acc_{name}"] = float(a[sel].mean()) if sel.any() else -1.0
    return out


def group_stats(modes: list[str], lengths: torch.Tensor, acc: torch.Tensor, groups: list[str]) -> dict[str, float]:
    """Per value ``g`` of ``groups`` (one per completion): ``ton/g/think_ratio``, ``ton/g/length`` (mean length of
    all of g's completions) and ``ton/g/acc``."""
    out: dict[str, float] = {}
    L, a = lengths.float(), acc.float()
    for g in sorted(set(groups)):
        sel = [i for i, x in enumerate(groups) if x == g]
        out[f"ton/{g}/think_ratio"] = sum(modes[i] == "think" for i in sel) / len(sel)
        out[f"ton/{g}/length"] = float(L[sel].mean())
        out[f"ton/{g}/acc"] = float(a[sel].mean())
    return out


def _meta(sample, key: str) -> str:
    meta = sample.get("meta") if isinstance(sample, dict) else getattr(sample, "meta", None)
    if not isinstance(meta, dict) or key not in meta:
        raise KeyError(f"methods.ton.group_by={key!r}: sample {getattr(sample, 'id', '?')} has no meta.{key}")
    return str(meta[key])


class TON(VLMMethod):
    name = "ton"

    def on_rewards(self, rb) -> None:
        o = self.cfg.methods.ton
        rows = ~rb.is_offpolicy & (rb.valid if rb.valid is not None else True)
        fmt = torch.tensor([ton_format(t, o.direct_is_skip) for t in rb.texts], dtype=torch.float32)
        rb.rewards["format_ton"] = fmt
        if o.format_weight:
            rb.rewards["total"] = rb.rewards["total"] + o.format_weight * fmt.to(rb.rewards["total"].dtype)
        acc = torch.nan_to_num(self.run.accuracy(rb.texts, rb.samples, rb.rewards), nan=0.0)
        idx = rows.nonzero().flatten().tolist()
        modes = [thought_mode(rb.texts[i], o.direct_is_skip) for i in idx]
        lengths, correct = rb.completion_mask.bool().sum(1)[idx], (acc >= o.threshold).float()[idx]
        self._m = mode_stats(modes, lengths, correct)
        if o.group_by and idx:
            self._m.update(group_stats(modes, lengths, correct, [_meta(rb.samples[i], o.group_by) for i in idx]))
        self._m["ton/format"] = float(fmt[rows].mean()) if rows.any() else 0.0

    def end_of_step(self, rb, metrics: dict) -> None:
        metrics.update(getattr(self, "_m", {}))
