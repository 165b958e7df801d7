"""Tool calls in the Qwen-VL family's own format.

The released Qwen2.5 / Qwen3(-VL) chat templates write an assistant tool call as::

    <tool_call>
    {"name": <function-name>, "arguments": <args-json-object>}
    </tool_call>

(one block per call; several blocks in one turn are parallel calls) and render a tool message as a user turn
``<tool_response>\\n...\\n</tool_response>``.  ``<tool_call>`` / ``</tool_call>`` are ids 151657 / 151658 of the real
Qwen2.5-VL tokenizer (:mod:`mmgrpo.vlm.models.real_tokenizer`); the tiny byte-level tokenizer spells them out.  The
chat templates the repo ships for the Qwen2.5-VL processor (``QWEN2_5_VL_CHAT_TEMPLATE``, the released
``chat_template.json``) and the tiny one have no tool branch: a ``tool`` role would be printed verbatim, so
:mod:`mmgrpo.vlm.tools.rollout` renders tool results as the text template does (a user turn with
``<tool_response>``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ToolCall", "parse_tool_calls", "format_tool_call", "TOOL_CALL_OPEN", "TOOL_CALL_CLOSE", "CallFormat",
           "CALL_FORMATS", "get_call_format", "qwen_instruction"]

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


@dataclass
class ToolCall:
    """One parsed call; ``error`` is set (and name / arguments may be empty) when the block is malformed."""

    name: str = ""
    arguments: Any = field(default_factory=dict)
    error: str = ""


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>...</tool_call>`` block of an assistant turn, in order.

    A block whose body is not a JSON object with a string ``name`` gives a ``ToolCall`` with ``error`` set (a
    counted failure); an opening tag without its closing tag counts as one malformed call.  ``arguments`` may be
    a JSON object or a string holding one (OpenAI style); other values are kept as they are (the tool call then
    fails on them)."""
    calls = []
    for body in _BLOCK.findall(text):
        calls.append(_parse_block(body))
    rest = _BLOCK.sub("", text)
    if TOOL_CALL_OPEN in rest:
        calls.append(ToolCall(error="unterminated <tool_call> (no </tool_call>)"))
    return calls


def _parse_block(body: str) -> ToolCall:
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError as e:
        return ToolCall(error=f"tool call is not valid JSON ({e.msg} at char {e.pos})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(error='tool call must be a JSON object {"name": ..., "arguments": {...}}')
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass
    return ToolCall(name=obj["name"], arguments=args)


def format_tool_call(name: str, arguments: dict) -> str:
    """The block the template writes for one call (used by cold-start templates and tests)."""
    return f"{TOOL_CALL_OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{TOOL_CALL_CLOSE}"


# ------------------------------------------------------------------------------------------------ call formats
@dataclass(frozen=True)
class CallFormat:
    """How a run's policy asks for tools (``tools.call_format``): ``parse(text, turn) -> [ToolCall]`` reads the calls
    of policy turn ``turn`` (1-based); ``instruction(tool_names, family) -> str`` is appended to the first prompt's
    user turn by the rollout (the same in training and evaluation); ``result_suffix`` closes every tool turn's text
    (a fixed multi-turn template's second-turn instruction, e.g. MGPO's); ``cut(text, turn) -> int | None``, if
    set, is where the policy turn ends for the conversation (MGPO's release keeps the first turn up to its JSON
    block: the rollout drops the sampled tokens after the one that completes it and closes the turn)."""

    parse: Any
    instruction: Any
    result_suffix: str = ""
    cut: Any = None


def _box_frame_text(family: str) -> str:
    from mmgrpo.vlm.rewards.box import resolve_box_frame

    return ("in pixels of the image as you see it" if resolve_box_frame(family) == "resized_abs"
            else "on a 0-1000 scale of the image's width and height")


TOOL_SIGNATURES = {
    "crop": '{"name": "crop", "arguments": {"bbox_2d": [x1, y1, x2, y2]}} shows the region [x1, y1, x2, y2] '
            "(BOXFRAME) at a higher resolution",
    "zoom": '{"name": "zoom", "arguments": {"point_2d": [x, y], "factor": 2}} shows 1/factor of the image centred '
            "at [x, y] (BOXFRAME) at a higher resolution",
    "seek": '{"name": "seek", "arguments": {"start": s, "end": e}} shows more frames of the video between s and e '
            "seconds",
}


def qwen_instruction(tool_names, family: str) -> str:
    """Our own wording (not a release's): the offered tools and the Qwen call syntax."""
    lines = [TOOL_SIGNATURES.get(n, f'{{"name": "{n}", "arguments": {{...}}}}').replace("BOXFRAME",
                                                                                      _box_frame_text(family))
             for n in tool_names]
    return ("You may call tools before answering, one call per block: <tool_call>\n{call}\n</tool_call>. Tools:\n"
            + "\n".join(f"- {x}" for x in lines)
            + "\nGive the final answer inside <answer> </answer> tags.")


def _qwen_parse(text: str, turn: int) -> list[ToolCall]:
    return parse_tool_calls(text)


QWEN = CallFormat(_qwen_parse, qwen_instruction)
CALL_FORMATS: dict[str, str] = {"qwen": "mmgrpo.vlm.tools.parse:QWEN",
                                "mgpo": "mmgrpo.vlm.methods.mgpo:MGPO_RELEASE_FORMAT",
                                "mgpo_plain": "mmgrpo.vlm.methods.mgpo:MGPO_FORMAT"}


def get_call_format(name: str) -> CallFormat:
    """The registered call format ``name`` (``"module:attr"`` entries of :data:`CALL_FORMATS`, imported lazily)."""
    import importlib

    if name not in CALL_FORMATS:
        raise ValueError(f"unknown tools.call_format {name!r}; registered: {sorted(CALL_FORMATS)}")
    mod, attr = CALL_FORMATS[name].split(":")
    return getattr(importlib.import_module(mod), attr)
