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

__all__ = ["ToolCall", "parse_tool_calls", "format_tool_call", "TOOL_CALL_OPEN", "TOOL_CALL_CLOSE"]

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
