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
  mode; ``per="row"`` mixes modes inside a group instead (the group then also learns *whether* to think);
* ``exact=True`` (default) asks exactly :math:`\mathrm{round}(p\,P)` of the P prompts of a step to think (lowest
  hash first), so the mix does not fluctuate with small P; ``exact=False`` draws each prompt independently;
* the draw is a hash of (seed, step, prompt key): the same on every process, and a resumed run repeats it;
* the format reward of a no-think row is "a closed ``<answer>`` block and no ``<think>`` tag", of a think row the
  strict think/answer format (:func:`mmgrpo.rewards.format.format_reward`).
"""
from __future__ import annotations

import hashlib
from typing import Any, Literal, Sequence

from mmgrpo.rewards.parsing import parse_structure

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
