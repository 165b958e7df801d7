r"""TempSamp-R1 hybrid chain-of-thought training schedule (arXiv 2509.18056).

One model learns to answer both directly and after reasoning. TempSamp-R1 trains in two stages: stage 1 on
direct answers (no-think prompts, accuracy reward only); stage 2 adds reasoning prompts with a 1/0 format reward
for ``<think>…</think><answer>…</answer>``. At test time either mode is asked for by the system prompt ("Mixed
CoT" picks the better per query, an oracle upper bound). This module is the schedule: which prompt of which step is
asked in which mode, and the format reward that matches the mode a row was asked in.

.. math::
    p_{think}(s) = \begin{cases} 0 & s < S_1 \\ p\cdot\min\!\big(1, \tfrac{s-S_1+1}{R}\big) & s \ge S_1,\ R>0 \\
    p & s\ge S_1,\ R=0\end{cases}

with :math:`S_1` = ``stage1_steps``, p = ``think_fraction`` (the stage-2 mix) and R = ``ramp_steps``.

Choices (the paper gives the stages, not the per-step mechanics):

* the mode is chosen **per prompt** (the whole group shares it), so group advantages compare answers of one
  mode (mixing modes inside a group would also teach *whether* to think, but needs per-row prompts; not offered);
* ``exact=True`` (default) asks exactly :math:`\mathrm{round}(p\,P)` of the P prompts of a step to think (lowest
  hash first), so the mix does not fluctuate with small P; ``exact=False`` draws each prompt independently;
* the draw is a hash of (seed, step, prompt key): the same on every process, and a resumed run repeats it;
* the format reward of a no-think row is "a closed ``<answer>`` block and no ``<think>`` tag", of a think row the
  strict think/answer format (:func:`mmgrpo.vlm.rewards.format.format_reward`).
"""
from __future__ import annotations

import hashlib
from typing import Any, Literal, Sequence

from mmgrpo.vlm.rewards.parsing import parse_structure

__all__ = ["think_probability", "assign_modes", "mode_format_reward"]

Mode = Literal["think", "no_think"]


def think_probability(step: int, stage1_steps: int = 0, think_fraction: float = 0.5, ramp_steps: int = 0) -> float:
    """:math:`p_{think}(s)` of the module docstring (step counted from 0)."""
    if not 0.0 <= think_fraction <= 1.0:
        raise ValueError(f"think_fraction must be in [0, 1], got {think_fraction}")
    if stage1_steps < 0 or ramp_steps < 0:
        raise ValueError(f"stage1_steps and ramp_steps must be >= 0, got {stage1_steps}, {ramp_steps}")
    if step < stage1_steps:
        return 0.0
    if ramp_steps > 0:
        return think_fraction * min(1.0, (step - stage1_steps + 1) / ramp_steps)
    return think_fraction


def _u(seed: int, step: int, key: Any) -> float:
    """A uniform number in [0, 1) from (seed, step, key), identical on every machine and process."""
    h = hashlib.blake2b(f"{seed}:{step}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2.0 ** 64


def assign_modes(step: int, keys: Sequence[Any], p_think: float, seed: int = 0, exact: bool = True) -> list[Mode]:
    """Mode of each key (a prompt's position in the step, or a row key for ``per="row"``) at ``step``.

    ``exact``: the round(p * len(keys)) keys with the smallest hashes think; else key k thinks iff u_k < p."""
    if not 0.0 <= p_think <= 1.0:
        raise ValueError(f"p_think must be in [0, 1], got {p_think}")
    u = [_u(seed, step, k) for k in keys]
    if not exact:
        return ["think" if x < p_think else "no_think" for x in u]
    n = int(round(p_think * len(keys)))
    order = sorted(range(len(keys)), key=lambda i: u[i])
    thinking = set(order[:n])
    return ["think" if i in thinking else "no_think" for i in range(len(keys))]


def mode_format_reward(text: Any, mode: Mode) -> float:
    """1.0 if ``text`` has the format of ``mode``: think = strict ``<think>…</think><answer>…</answer>``;
    no_think = a closed ``<answer>`` block and no think tag. Else 0.0."""
    st = parse_structure(text)
    if mode == "think":
        return 1.0 if st.strict else 0.0
    if mode == "no_think":
        return 1.0 if (st.loose and st.n_think_open == 0 and st.n_think_close == 0) else 0.0
    raise ValueError(f"mode must be 'think' or 'no_think', got {mode!r}")


# ----------------------------------------------------------------------------------------------- trainer hook
import torch  # noqa: E402

from mmgrpo.vlm.methods.base import VLMMethod  # noqa: E402  (the pure functions above need no trainer)


class HybridCoT(VLMMethod):
    """``methods.hybrid_cot.enabled``: each step asks a :func:`think_probability` share of its prompts (whole
    groups) to think and the rest to answer directly (the prompt is rebuilt with that mode's system prompt from the
    already decoded media), and the ``format`` reward (if weighted) is re-scored per row with
    :func:`mode_format_reward`, so a direct answer is not punished for having no ``<think>`` block."""

    name = "hybrid_cot"

    @classmethod
    def check(cls, cfg):
        if not cfg.methods.hybrid_cot.enabled:  # called for every registered method
            return
        if cfg.data.prompt_mode not in ("think", "no_think"):
            raise ValueError("methods.hybrid_cot chooses think / no_think per prompt; set data.prompt_mode to think "
                             f"or no_think (the mode prompts are prepared in first), not {cfg.data.prompt_mode!r}")
        o = cfg.methods.hybrid_cot
        think_probability(0, o.stage1_steps, o.think_fraction, o.ramp_steps)  # validates the options

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.o = cfg.methods.hybrid_cot
        self.modes: dict[int, str] = {}  # stream position -> mode, for this step's rows
        self._m: dict[str, float] = {}

    def before_rollout(self, step, preps):
        o = self.o
        if step != getattr(self, "_step", None):  # modes of earlier steps are no longer needed
            self.modes, self._step = {}, step
        p = think_probability(step, o.stage1_steps, o.think_fraction, o.ramp_steps)
        modes = assign_modes(step, [pos for pos, _, _ in preps], p, self.cfg.run.seed, o.exact)
        out = []
        for (pos, pp, gens), mode in zip(preps, modes):
            self.modes[pos] = mode
            if mode != self.cfg.data.prompt_mode:
                pp = self.run.task.rebuild(pp, mode=mode)
            out.append((pos, pp, gens))
        self._m = {"hybrid/think_prob": p}
        return out

    def on_rewards(self, rb):
        modes = [self.modes.get(g, self.cfg.data.prompt_mode) for g in rb.group_ids.tolist()]
        w = self.cfg.reward.weights.get("format")
        if w and "format" in rb.rewards:
            new = torch.tensor([mode_format_reward(t, md) for t, md in zip(rb.texts, modes)],
                               dtype=rb.rewards["format"].dtype)
            new = torch.where(rb.is_offpolicy, rb.rewards["format"], new)  # an injected answer keeps its score
            rb.rewards["total"] = rb.rewards["total"] + w * (new - rb.rewards["format"]).to(rb.rewards["total"].dtype)
            rb.rewards["format"] = new
        think = torch.tensor([md == "think" for md in modes]) & ~rb.is_offpolicy
        onp = ~rb.is_offpolicy
        self._m["hybrid/think_row_frac"] = float(think[onp].float().mean()) if onp.any() else 0.0
        for name, sel in (("think", think), ("no_think", onp & ~think)):
            if sel.any():
                self._m[f"hybrid/reward_{name}"] = float(rb.rewards["total"][sel].float().nanmean())

    def end_of_step(self, rb, m):
        m.update(self._m)
