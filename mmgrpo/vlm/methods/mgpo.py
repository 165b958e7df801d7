r"""MGPO, multi-turn grounding-based policy optimisation (High-Resolution Visual Reasoning via Multi-Turn
Grounding-Based RL; github.com/EvolvingLMMs-Lab/MGPO): the model first predicts the box of the region that answers
the question, the region is cropped from the full-resolution image and fed back in a second turn, and the model
answers; the only reward is the binary answer accuracy, the loss covers the model's turns only.

How it maps here (our wording and choices, not the release's strings):

* the **fixed multi-turn template** (MGPO's cold-start fix: a base model that never called a tool still produces a
  box when asked in a fixed two-turn dialogue) is the call format ``tools.call_format=mgpo`` (:data:`MGPO_FORMAT`):
  the rollout appends :func:`mgpo_instruction` to the question; in the first turn the first ``[x1, y1, x2, y2]``
  (in the model's box frame, :mod:`mmgrpo.vlm.rewards.box`) -- or a ``crop`` tool call -- is the crop request
  (:func:`mgpo_calls`); the tool turn shows the crop (``crop``: cut from the source image, resized to the view's
  budget) with :data:`SECOND_TURN` after it; a second turn is the answer. A first turn without a box is a counted
  tool failure (the model is told, and answers from the first view);
* the multi-turn rollout, the loss on policy tokens only and group advantages over the final reward are
  :mod:`mmgrpo.vlm.tools.rollout` and the trainer's; the **binary answer reward** is the recipe's reward
  (``reward.weights: {mcq: 1.0}``: exact option letter, 1/0);
* this module (``methods.mgpo.enabled``) checks that combination and logs the grounding statistics:
  ``mgpo/grounded`` (rows whose first turn gave a usable box), ``mgpo/acc_grounded`` / ``mgpo/acc_ungrounded``
  (accuracy of those rows and of the others).
"""
from __future__ import annotations

import re

import torch

from mmgrpo.vlm.methods.base import VLMMethod
from mmgrpo.vlm.tools.parse import CallFormat, ToolCall, _box_frame_text, parse_tool_calls

__all__ = ["grounding_box", "mgpo_calls", "mgpo_instruction", "MGPO_FORMAT", "SECOND_TURN", "MGPO"]

_NUM = r"\s*(-?\d+(?:\.\d+)?)\s*"
_BOX = re.compile(r"\[" + ",".join([_NUM] * 4) + r"\]")
SECOND_TURN = ("This is the region you selected, cropped from the full-resolution image. Answer the question "
               "inside <answer> </answer> tags.")


def grounding_box(text: str) -> list[float] | None:
    """The first ``[x1, y1, x2, y2]`` of four numbers in ``text`` (None if there is none)."""
    m = _BOX.search(text)
    return [float(x) for x in m.groups()] if m else None


def mgpo_calls(text: str, turn: int) -> list[ToolCall]:
    """Turn 1: a ``crop`` tool call if written, else the first box as a crop call, else one failed call; later
    turns: none (they answer)."""
    if turn != 1:
        return []
    calls = [c for c in parse_tool_calls(text) if c.error or c.name == "crop"]
    if calls:
        return calls[:1]
    box = grounding_box(text)
    if box is None:
        return [ToolCall(error="no bounding box [x1, y1, x2, y2] in the first turn; answer from the full image")]
    return [ToolCall(name="crop", arguments={"bbox_2d": box})]


def mgpo_instruction(tool_names, family: str) -> str:
    return ("Answer in two turns. First turn: only the bounding box [x1, y1, x2, y2] of the region of the image "
            f"that holds the answer ({_box_frame_text(family)}). That region is then cropped from the "
            "full-resolution image and shown to you. Second turn: the answer inside <answer> </answer> tags.")


MGPO_FORMAT = CallFormat(mgpo_calls, mgpo_instruction, SECOND_TURN)


class MGPO(VLMMethod):
    """``methods.mgpo.enabled``: checks the MGPO setting (tools on, call format ``mgpo``, the ``crop`` tool, two
    turns) and logs the grounding statistics; the rollout and loss are the tool rollout's."""

    name = "mgpo"

    @classmethod
    def check(cls, cfg) -> None:
        if not cfg.methods.mgpo.enabled:
            return
        t = cfg.tools
        if not t.enabled or t.call_format != "mgpo" or "crop" not in t.names or t.max_turns < 2:
            raise ValueError("methods.mgpo needs tools.enabled=true, tools.call_format=mgpo, 'crop' in tools.names "
                             f"and tools.max_turns >= 2 (got enabled={t.enabled}, call_format={t.call_format!r}, "
                             f"names={list(t.names)}, max_turns={t.max_turns})")

    def end_of_step(self, rb, metrics: dict) -> None:
        if not rb.n or "tools/tool_calls" not in rb.rewards:
            return
        onp = ~rb.is_offpolicy
        grounded = (rb.rewards["tools/tool_calls"] > 0) & (rb.rewards["tools/tool_failures"] == 0)
        metrics["mgpo/grounded"] = float(grounded[onp].float().mean())
        acc = torch.nan_to_num(self.run.accuracy(rb.texts, rb.samples, rb.rewards).float(), nan=0.0)
        for name, sel in (("acc_grounded", grounded & onp), ("acc_ungrounded", ~grounded & onp)):
            if sel.any():
                metrics[f"mgpo/{name}"] = float(acc[sel].mean())
