r"""PARA-GRPO-style training of frame requests (ParaVT: parallel video tool calls in agentic video RL; VITAL:
frames sampled on demand inside the chain of thought) on top of the multi-turn tool rollout
(:mod:`mmgrpo.vlm.tools.rollout`, the ``seek`` tool: several ``<tool_call>`` blocks in one turn are parallel
time-window requests).

The two pieces ParaVT's summary names, as we implement them (the paper's exact formulas were not available to us;
this is our reading, stated so it can be checked):

1. **A format reward only at structure tokens.** A rollout is well formed (:func:`well_formed`, r_fmt in {0, 1})
   when every policy turn but the last holds at least one ``<tool_call>`` block, each a JSON object with a name,
   and no ``<answer>``; and the last turn holds exactly one ``<answer> ... </answer>`` and no tool call. Its
   group-normalised advantage :math:`A^{fmt}_i` (:func:`mmgrpo.core.group_advantages` over r_fmt) acts only on the
   tokens that spell the structure strings (``methods.para_grpo.structure_tokens``; :func:`structure_mask`), through
   an extra policy-gradient term

   .. math:: L_{fmt} = -c \, \frac{1}{N_s} \sum_{i} \sum_{t \in S_i} A^{fmt}_i \, \frac{\pi_\theta(o_{i,t})}
             {\pi_{old}(o_{i,t})}

   (:func:`structure_term`; :math:`N_s` = structure tokens of the step over all processes, c = ``format_coef``),
   added to the GRPO loss whose advantage is the answer reward's. The format signal thus never dilutes the answer
   reward on content tokens; only the tokens prone to collapse (the tags) learn from it.
2. **Per-prompt frame-budget randomisation.** Each video prompt's first view keeps an even number of frames drawn
   uniformly from ``[min_frames, max_frames]`` (:func:`frame_budget`; seeded by (run seed, step, prompt position),
   so a resumed run draws the same), evenly spaced over the frames loaded (:func:`subsample_clip`: the clip's time
   axis -- indices, timestamps, ``sample_fps = n / clip frames x video fps`` -- stays exact, so MRoPE time is
   right). With few frames the answer is often not visible and a ``seek`` pays; with many it does not: the policy
   learns when to call.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from mmgrpo.vlm.methods.base import VLMMethod
from mmgrpo.vlm.tools.parse import parse_tool_calls
from mmgrpo.vlm.tools.rollout import turn_spans

__all__ = ["well_formed", "structure_mask", "structure_term", "frame_budget", "subsample_clip", "turn_spans",
           "ParaGRPO"]


def well_formed(turns: Sequence[str]) -> bool:
    """r_fmt of a rollout's policy turns (see the module docstring)."""
    if not turns:
        return False
    for t in turns[:-1]:
        calls = parse_tool_calls(t)
        if not calls or any(c.error for c in calls) or "<answer>" in t:
            return False
    last = turns[-1]
    return (last.count("<answer>") == 1 and last.count("</answer>") == 1
            and last.index("<answer>") < last.index("</answer>") and "<tool_call>" not in last)


def structure_mask(ids: torch.Tensor, spans: Sequence[tuple[int, int]], tokenizer,
                   markers: Sequence[str]) -> torch.Tensor:
    """(T,) bool: the tokens of ``ids`` (inside ``spans``) whose decoded characters overlap an occurrence of a
    marker string (a marker split over several byte-level tokens marks all of them)."""
    out = torch.zeros(ids.shape[0], dtype=torch.bool)
    for s, e in spans:
        pieces = [tokenizer.decode([int(x)]) for x in ids[s:e]]
        text = "".join(pieces)
        ends, pos = [], 0
        for p in pieces:
            pos += len(p)
            ends.append(pos)
        for mk in markers:
            k = text.find(mk)
            while k >= 0:
                lo, hi = k, k + len(mk)
                start = 0
                for j, end in enumerate(ends):
                    if end > lo and start < hi:
                        out[s + j] = True
                    start = end
                k = text.find(mk, k + 1)
    return out


def structure_term(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                   n_total: float) -> torch.Tensor:
    """:math:`-\\frac{1}{N_s}\\sum_{i,t} A_i\\, m_{i,t}\\, e^{\\log\\pi - \\log\\pi_{old}}` (scalar); 0 without
    structure tokens."""
    m = mask.to(logp.dtype)
    ratio = torch.exp(torch.where(mask.bool(), logp - old_logp, torch.zeros_like(logp)))
    return -(adv.to(logp.dtype)[:, None] * ratio * m).sum() / max(float(n_total), 1.0)


def frame_budget(gen: torch.Generator, lo: int, hi: int, available: int) -> int:
    """An even frame count drawn uniformly from the even numbers in [lo, min(hi, available)] (hi 0 = available)."""
    hi = min(hi or available, available)
    lo = max(2, lo + lo % 2)
    evens = list(range(lo, hi - hi % 2 + 1, 2))
    if not evens:
        return available
    return evens[int(torch.randint(len(evens), (1,), generator=gen))]


def subsample_clip(clip, n: int):
    """The clip with ``n`` of its frames, evenly spaced (round(linspace(0, T-1, n))); indices, timestamps and
    ``sample_fps = n / clip_num_frames * video_fps`` follow, so ``n / sample_fps`` is still the covered duration."""
    T = clip.num_frames
    if n >= T:
        return clip
    idx = torch.linspace(0, T - 1, n).round().long()
    frames = clip.frames[idx] if isinstance(clip.frames, torch.Tensor) else clip.frames[idx.numpy()]
    return dataclasses.replace(clip, frames=frames, frame_indices=[clip.frame_indices[i] for i in idx.tolist()],
                               timestamps=[clip.timestamps[i] for i in idx.tolist()],
                               sample_fps=n / clip.clip_num_frames * clip.video_fps)


class ParaGRPO(VLMMethod):
    """``methods.para_grpo.enabled`` (see the module docstring)."""

    name = "para_grpo"
    needs_whole_groups = True  # the format advantage is group-normalised

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.para_grpo
        if not o.enabled:
            return
        if not cfg.tools.enabled:
            raise ValueError("methods.para_grpo needs tools.enabled=true (multi-turn tool rollouts)")
        if o.format_coef < 0 or o.min_frames < 0 or o.max_frames < 0:
            raise ValueError("methods.para_grpo: format_coef, min_frames and max_frames must be >= 0")
        if o.max_frames and o.min_frames > o.max_frames:
            raise ValueError(f"methods.para_grpo: min_frames {o.min_frames} > max_frames {o.max_frames}")

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.o = cfg.methods.para_grpo
        self._adv = self._mask = None
        self._n = 0.0
        self._frames: list[int] = []

    # ---------------------------------------------------------------- frame budget
    def before_rollout(self, step: int, prompts: list) -> list:
        if not self.o.min_frames:
            return prompts
        from mmgrpo.utils.seeding import sample_seed
        from mmgrpo.video.processor import build_video_inputs

        out, self._frames = [], []
        for pos, pp, gens in prompts:
            if pp.clip is not None:
                g = torch.Generator().manual_seed(sample_seed(self.cfg.run.seed, step, pos, 0x9A7A) % (2**63))
                n = frame_budget(g, self.o.min_frames, self.o.max_frames, pp.clip.num_frames)
                self._frames.append(n)
                if n < pp.clip.num_frames:
                    clip = subsample_clip(pp.clip, n)
                    item = build_video_inputs(self.run.task.processor, clip, pp.text, self.run.policy.family)
                    pp = dataclasses.replace(pp, clip=clip, item={k: v for k, v in dict(item).items()
                                                                  if isinstance(v, torch.Tensor)})
            out.append((pos, pp, gens))
        return out

    # ---------------------------------------------------------------- format reward on structure tokens
    def on_rewards(self, rb) -> None:
        tok = self.run.policy.processor.tokenizer
        r = []
        for i in range(rb.n):
            spans = turn_spans(rb.loss_mask[i])
            turns = [tok.decode(rb.completion_ids[i, s:e], skip_special_tokens=True) for s, e in spans]
            r.append(float(well_formed(turns)))
        rb.rewards["format_structure"] = torch.tensor(r)

    def on_logprobs(self, rb) -> None:
        """The step's final batch (after drops and refills): format advantages and structure-token masks."""
        from mmgrpo.core import group_advantages
        from mmgrpo.engine.dist import global_sum

        tok = self.run.policy.processor.tokenizer
        if not rb.n:
            self._adv, self._mask, self._n = torch.zeros(0), torch.zeros(0, 1, dtype=torch.bool), global_sum(0.0)
            return
        r = rb.rewards["format_structure"].float()
        self._adv = group_advantages(r, rb.group_ids, scale=self.cfg.algo.adv_scale, eps=self.cfg.algo.adv_eps,
                                     valid=rb.valid).advantages.float()
        self._mask = torch.stack([structure_mask(rb.completion_ids[i], turn_spans(rb.loss_mask[i]), tok,
                                                 self.o.structure_tokens) for i in range(rb.n)])
        self._mask &= rb.loss_mask.bool()
        self._n = global_sum(float(self._mask.sum()))

    def on_loss(self, li, loss):
        if self._adv is None or li.index is None or not self.o.format_coef or not bool(li.mask.any()):
            return loss
        idx = li.index.cpu()
        T = li.logp.shape[1]
        m = self._mask[idx, :T].to(li.logp.device) & li.mask.bool()
        term = structure_term(li.logp, li.old_logp, self._adv[idx].to(li.logp.device), m, self._n)
        return loss + self.o.format_coef * term

    def end_of_step(self, rb, metrics: dict) -> None:
        if rb.n and "format_structure" in rb.rewards:
            metrics["para_grpo/format_rate"] = float(rb.rewards["format_structure"].mean())
            metrics["para_grpo/structure_tokens"] = float(self._n)
        if self._frames:
            metrics["para_grpo/frames_mean"] = sum(self._frames) / len(self._frames)
