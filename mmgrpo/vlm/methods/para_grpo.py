r"""PARA-GRPO (ParaVT: Taming the Tool Prior Paradox for Parallel Tool Use in Agentic Video RL; release
EvolvingLMMs-Lab/ParaVT @cf55249e39, ``paravt/rl``) on top of the multi-turn tool rollout
(:mod:`mmgrpo.vlm.tools.rollout`, the ``seek`` tool: several ``<tool_call>`` blocks in one turn are parallel
time-window requests).

**As released** (facts read from ``paravt/rl/rewards/{format,tool,compose,utils}.py``, ``paravt/rl/workflow.py``,
``paravt/rl/config.py`` and ``paravt/rl/configs/paragrpo_8b.yaml``; no code copied), the default here:

1. **Format reward in the scalar reward**, computed on the decoded *policy tokens* of the whole trajectory (every
   model turn, tool turns excluded: the release's ``completion``), :func:`paravt_format_reward` in [0, 1]:
   "answer suffix" weights (``answer_suffix``: think 0.2, ``<answer>`` 0.3, ``</answer>`` 0.2; else 0.3 / 0.2 / 0.1;
   the answer credit only with a non-empty answer block), the **exploration anchoring** bonus scaled by
   ``anchor_weight`` (+0.4 for a closed substantive think, +0.3 for think and a closed non-empty answer, -0.3 for an
   unclosed ``<think>``), +0.3 when a substantive think precedes a parseable tool call, +0.1 when all four tag pairs
   are balanced (and the score is positive), capped at 1; plus the **tool reward** :func:`paravt_tool_reward` (0.1 for
   a parseable call, 0.3 if ``<tool_response>`` is in the completion -- never, with policy tokens only --, +0.5 with
   a correct answer). The step's reward is ``total + format_weight x format + tool`` (compose_reward).
2. **nFrames gating**: each video prompt's first view keeps K frames, K drawn from ``frame_choices`` ({4, 8, 16, 32,
   64}) once per prompt -- the release seeds a ``random.Random`` with the hash of the video path, so a video keeps its
   K for the run (here: seeded by the run seed and the sample id, identical across processes and resumes) -- evenly
   spaced over the frames loaded (:func:`subsample_clip`: the clip's time axis -- indices, timestamps,
   ``sample_fps = n / clip frames x video fps`` -- stays exact, so MRoPE time is right).
3. **Constrained think prefix**: ``<think>\n`` after every generation prompt: ``tools.generation_prefix`` (rollout).

Not reproduced (docs/tools.md): the release's tool ``crop_video`` is a *subagent* -- the same model, given the frames
of the requested window as images, writes a text summary that comes back as the ``<tool_response>``; our ``seek``
feeds the frames to the policy itself (VITAL's design). The release's answer extraction for the accuracy term
(first ``<answer>`` of all policy tokens, fallbacks) is the recipe's reward here (the last turn's).

**Our earlier reading** (from the paper's summary, before the release was read), kept as an option: a 0/1
well-formedness reward (:func:`well_formed`) whose group-normalised advantage acts only on the structure tokens
(``structure_tokens``; :func:`structure_mask`) through an extra policy-gradient term

.. math:: L_{fmt} = -c \, \frac{1}{N_s} \sum_{i} \sum_{t \in S_i} A^{fmt}_i \, \frac{\pi_\theta(o_{i,t})}
          {\pi_{old}(o_{i,t})}

(:func:`structure_term`, c = ``format_coef``, 0 = off, the default), and frame budgets drawn per step from the even
numbers in ``[min_frames, max_frames]`` when ``frame_choices`` is empty.
"""
from __future__ import annotations

import dataclasses
import json
import re
import zlib
from typing import Sequence

import torch

from mmgrpo.vlm.methods.base import VLMMethod
from mmgrpo.vlm.tools.parse import parse_tool_calls
from mmgrpo.vlm.tools.rollout import turn_spans

__all__ = ["well_formed", "structure_mask", "structure_term", "frame_budget", "subsample_clip", "turn_spans",
           "ParaGRPO", "paravt_format_reward", "paravt_tool_reward", "FRAME_CHOICES"]

FRAME_CHOICES = (4, 8, 16, 32, 64)  # paravt/rl/workflow.py NFRAMES_CHOICES

_ANS = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK_CLOSED = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_THINK_OPEN = re.compile(r"<think>(.*?)(?:<tool_|<answer>|<\|im_end\|>|$)", re.DOTALL)
_CALL_BODY = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_CODE_BODY = re.compile(r"<tool_code>(.*?)(?:</tool_code>|$)", re.DOTALL)
_PAIRS = (("<think>", "</think>"), ("<tool_call>", "</tool_call>"), ("<tool_code>", "</tool_code>"),
          ("<answer>", "</answer>"))


def _substantive_think(c: str, min_chars: int = 10) -> bool:
    m = _THINK_CLOSED.search(c) or _THINK_OPEN.search(c)
    return m is not None and len(m.group(1).strip()) >= min_chars


def _parseable_call(c: str) -> bool:
    """A ``<tool_call>`` body that is a JSON object with a name, or a ``<tool_code>`` line with a "(" (not a
    comment); an unclosed block counts up to the end."""
    for body in _CALL_BODY.findall(c):
        body = body.strip()
        if not body or body.startswith("<|im_end|>"):
            continue
        try:
            obj = json.loads(body)
        except ValueError:
            continue
        if isinstance(obj, dict) and "name" in obj:
            return True
    for body in _CODE_BODY.findall(c):
        body = body.strip()
        if body and not body.startswith("<|im_end|>") and any(
                ln.strip() and "(" in ln and not ln.strip().startswith("#") for ln in body.splitlines()):
            return True
    return False


def _think_before_tool(c: str) -> bool:
    t = c.find("<think>")
    calls = [p for p in (c.find("<tool_call>"), c.find("<tool_code>")) if p != -1]
    return t != -1 and bool(calls) and t < min(calls)


def paravt_format_reward(c: str, answer_suffix: bool = True, anchor_weight: float = 0.5) -> float:
    """ParaVT's continuous format reward of a completion (see the module docstring), in [0, 1]."""
    think = _substantive_think(c)
    answer = any(b.strip() for b in _ANS.findall(c))
    w_think, w_open, w_close = (0.2, 0.3, 0.2) if answer_suffix else (0.3, 0.2, 0.1)
    score = w_think * think
    if answer:
        score += w_open * ("<answer>" in c) + w_close * ("</answer>" in c)
    if anchor_weight > 0:
        closed = "</think>" in c and think
        bonus = 0.4 * closed + 0.3 * (closed and answer and "</answer>" in c)
        bonus -= 0.3 * ("<think>" in c and "</think>" not in c)
        score += anchor_weight * bonus
    if think and _parseable_call(c) and _think_before_tool(c):
        score += 0.3
    if score > 0 and all(c.count(a) == c.count(b) for a, b in _PAIRS):
        score += 0.1
    return min(score, 1.0)


def paravt_tool_reward(c: str, acc: float) -> float:
    """ParaVT's tool reward: 0 without a parseable call; 0.1, or 0.3 if ``<tool_response>`` appears; +0.5 if the
    answer is right (acc > 0); capped at 1."""
    if not _parseable_call(c):
        return 0.0
    r = 0.3 if "<tool_response>" in c else 0.1
    return min(r + 0.5 * (acc > 0), 1.0)


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
        if min(o.format_coef, o.format_weight, o.anchor_weight, o.min_frames, o.max_frames) < 0:
            raise ValueError("methods.para_grpo: format_weight, anchor_weight, format_coef, min_frames and max_frames "
                             "must be >= 0")
        if any(int(k) < 1 for k in o.frame_choices):
            raise ValueError("methods.para_grpo.frame_choices must be positive frame counts, got "
                             f"{list(o.frame_choices)}")
        if o.max_frames and o.min_frames > o.max_frames:
            raise ValueError(f"methods.para_grpo: min_frames {o.min_frames} > max_frames {o.max_frames}")

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.o = cfg.methods.para_grpo
        self._adv = self._mask = None
        self._n = 0.0
        self._frames: list[int] = []

    # ---------------------------------------------------------------- frame budget
    def frames_for(self, step: int, pos: int, sample, available: int) -> int:
        """The first view's frame count of one prompt: ``frame_choices`` (release: one K per sample for the run,
        seeded by the run seed and the sample id), else an even count in [min_frames, max_frames] drawn per step."""
        from mmgrpo.utils.seeding import sample_seed
        from mmgrpo.vlm.data.task import sample_id

        if self.o.frame_choices:
            key = zlib.crc32(str(sample_id(sample)).encode())
            g = torch.Generator().manual_seed(sample_seed(self.cfg.run.seed, key, 0x9A7B) % (2**63))
            k = int(self.o.frame_choices[int(torch.randint(len(self.o.frame_choices), (1,), generator=g))])
            return min(k, available)
        g = torch.Generator().manual_seed(sample_seed(self.cfg.run.seed, step, pos, 0x9A7A) % (2**63))
        return frame_budget(g, self.o.min_frames, self.o.max_frames, available)

    def before_rollout(self, step: int, prompts: list) -> list:
        if not (self.o.frame_choices or self.o.min_frames):
            return prompts
        from mmgrpo.video.processor import build_video_inputs

        out, self._frames = [], []
        for pos, pp, gens in prompts:
            if pp.clip is not None:
                n = self.frames_for(step, pos, pp.sample, pp.clip.num_frames)
                self._frames.append(n)
                if n < pp.clip.num_frames:
                    clip = subsample_clip(pp.clip, n)
                    item = build_video_inputs(self.run.task.processor, clip, pp.text, self.run.policy.family,
                                              video_time=self.run.policy.adapter.video_time)
                    pp = dataclasses.replace(pp, clip=clip, item={k: v for k, v in dict(item).items()
                                                                  if isinstance(v, torch.Tensor)})
            out.append((pos, pp, gens))
        return out

    # ---------------------------------------------------------------- format reward on structure tokens
    def on_rewards(self, rb) -> None:
        tok = self.run.policy.processor.tokenizer
        o = self.o
        if not rb.n:
            return
        if o.format_weight or o.tool_reward:  # the release's terms, on the decoded policy tokens of each trajectory
            comps = [tok.decode(rb.completion_ids[i][rb.loss_mask[i].bool()].tolist()) for i in range(rb.n)]
            fmt = torch.tensor([paravt_format_reward(c, o.answer_suffix, o.anchor_weight) for c in comps])
            acc = torch.nan_to_num(self.run.accuracy(rb.texts, rb.samples, rb.rewards).float(), nan=0.0)
            tool = torch.tensor([paravt_tool_reward(c, float(a)) if o.tool_reward else 0.0
                                 for c, a in zip(comps, acc.tolist())])
            rb.rewards["paravt_format"], rb.rewards["paravt_tool"] = fmt, tool
            add = o.format_weight * fmt + tool
            rb.rewards["total"] = rb.rewards["total"] + add.to(rb.rewards["total"].dtype)
        if o.format_coef:
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
        if not self.o.format_coef:
            return
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
        if rb.n and "paravt_format" in rb.rewards:
            metrics["para_grpo/format_reward"] = float(rb.rewards["paravt_format"].mean())
            metrics["para_grpo/tool_reward"] = float(rb.rewards["paravt_tool"].mean())
        if rb.n and "format_structure" in rb.rewards:
            metrics["para_grpo/format_rate"] = float(rb.rewards["format_structure"].mean())
            metrics["para_grpo/structure_tokens"] = float(self._n)
        if self._frames:
            metrics["para_grpo/frames_mean"] = sum(self._frames) / len(self._frames)
