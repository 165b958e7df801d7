"""Format rewards (pure Python); see :func:`mmgrpo.vlm.rewards.parsing.parse_structure` for the exact rules."""
from __future__ import annotations

from typing import Any

from .parsing import parse_structure

__all__ = ["format_reward"]


def format_reward(text: Any, *, strict: bool = True, think_in_prompt: bool = False) -> float:
    """strict: exactly ``<think>…</think>`` then ``<answer>…</answer>``, one tag of each kind, only whitespace
    around (tags case-insensitive); loose: a closed ``<answer>…</answer>`` block exists. 1.0 / 0.0."""
    st = parse_structure(text, think_in_prompt=think_in_prompt)
    return 1.0 if (st.strict if strict else st.loose) else 0.0
