"""The tool interface of multi-turn rollouts ("thinking with images / videos"): what a tool is, what it returns,
how a failure is counted, and the registry by name.

A **tool** is a pure function ``fn(ctx, args) -> ToolResult``:

* ``ctx`` (:class:`ToolContext`): read-only facts of ONE sample -- the canonical sample, the full-resolution
  source images (PIL, as loaded before the processor resized them), the first turn's video clip (its source path or
  frames, fps and time axis), the model family's box frame and the model-input image sizes, and the tool options
  (``tools.*``).  Nothing in it depends on the turn or on earlier calls, so the same (sample, arguments) gives the
  same result, in a rollout, a resumed rollout and the evaluation harness alike;
* ``args``: the JSON ``arguments`` object the model wrote in its tool call (a dict, already parsed);
* returns a :class:`ToolResult`: a short text for the model, plus new media -- ``images`` (PIL images, fed back
  through the processor's image path) and/or ``clips`` (:class:`mmgrpo.video.VideoClip`, fed back through the
  video contract: sample fps, frame indices and timestamps fix the MRoPE time axis, as for the first turn's video).

**Bad arguments are a counted failure, never a crash.** A tool raises :class:`ToolError` (or any ``ValueError`` /
``TypeError`` / ``KeyError``) for arguments it cannot serve (box outside the image, unknown field, empty time
window); :func:`call_tool` turns it into a :class:`ToolResult` whose text is the error message (the model sees it as
the tool turn) and ``ok=False``; the rollout counts it per row (``tool_failures``) so a reward or a method can
penalise it.  Any other exception is a bug in the tool and propagates.

Registering a tool: ``@register_tool("name")`` on the function (or ``register_tool("name", fn)``); the config lists
the tools a run offers (``tools.names``).  Built-ins: :mod:`mmgrpo.vlm.tools.builtin` (``crop`` / ``zoom``,
``seek``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

__all__ = ["ToolError", "ToolResult", "ToolContext", "TOOLS", "BUILTIN_TOOLS", "register_tool", "get_tool",
           "call_tool", "tool_names"]


class ToolError(ValueError):
    """Arguments a tool cannot serve; the message is what the model reads in the tool turn."""


@dataclass
class ToolResult:
    """What one tool call returns: ``text`` for the model, new ``images`` (PIL) and ``clips`` (VideoClip)."""

    text: str = ""
    images: list = field(default_factory=list)
    clips: list = field(default_factory=list)
    ok: bool = True  # False: a failed call (bad arguments, over budget); text is the error message
    name: str = ""
    # a fixed template's whole user turn instead of the <tool_response> block: chat-template content items
    # ({"type": "text", "text": ...} / {"type": "image"} / {"type": "video"}, media in the order of images + clips)
    content: list | None = None


@dataclass
class ToolContext:
    """Read-only facts of one sample a tool may use (see the module docstring)."""

    sample: Any = None  # the canonical sample (dict or Sample)
    images: list = field(default_factory=list)  # full-resolution source images (PIL RGB), prompt order
    clip: Any = None  # the first turn's VideoClip (path / frames, fps, time axis), or None
    family: str = "qwen2_5_vl"  # model family: fixes the box frame of crop (mmgrpo.vlm.rewards.box)
    resized_sizes: list = field(default_factory=list)  # (W_r, H_r) of each prompt image as the model saw it
    image_factor: int = 28  # patch_size * merge_size (28 Qwen2/2.5-VL, 32 Qwen3-VL)
    options: Any = None  # the run's ToolsConfig (tools.*)


TOOLS: dict[str, Callable[[ToolContext, dict], ToolResult]] = {}  # user tools (register_tool)
BUILTIN_TOOLS = {"crop": "mmgrpo.vlm.tools.builtin:crop", "zoom": "mmgrpo.vlm.tools.builtin:zoom",
                 "seek": "mmgrpo.vlm.tools.builtin:seek",
                 "mgpo_crop": "mmgrpo.vlm.methods.mgpo:mgpo_crop"}  # MGPO's release crop (call_format mgpo)  # imported when first used


def register_tool(name: str, fn: Callable | None = None):
    """Register ``fn`` under ``name`` (usable as a decorator); a name already taken raises."""
    def add(f):
        if name in BUILTIN_TOOLS or (name in TOOLS and TOOLS[name] is not f):
            raise ValueError(f"tool {name!r} is already registered")
        TOOLS[name] = f
        return f

    return add(fn) if fn is not None else add


def tool_names() -> list[str]:
    return sorted(set(TOOLS) | set(BUILTIN_TOOLS))


def get_tool(name: str) -> Callable:
    """The tool ``name`` (a built-in or a registered one); ValueError listing the names otherwise."""
    if name in BUILTIN_TOOLS:
        import importlib

        mod, attr = BUILTIN_TOOLS[name].split(":")
        return getattr(importlib.import_module(mod), attr)
    if name not in TOOLS:
        raise ValueError(f"unknown tool {name!r}; known: {tool_names()} (register_tool in mmgrpo.vlm.tools.base)")
    return TOOLS[name]


def call_tool(name: str, ctx: ToolContext, args: Any, allowed: list[str] | None = None) -> ToolResult:
    """Run tool ``name`` on ``args``; a failure (unknown / not offered tool, arguments not an object, the tool's
    ``ToolError`` / ``ValueError`` / ``TypeError`` / ``KeyError``) returns ``ok=False`` with the error as text."""
    if allowed is not None and name not in allowed:
        return ToolResult(text=f"Error: unknown tool {name!r}; available: {', '.join(allowed)}", ok=False, name=name)
    try:
        fn = get_tool(name)
    except ValueError as e:
        return ToolResult(text=f"Error: {e}", ok=False, name=name)
    if not isinstance(args, dict):
        return ToolResult(text=f"Error: the arguments of {name} must be a JSON object, got {type(args).__name__}",
                          ok=False, name=name)
    try:
        res = fn(ctx, args)
    except (ToolError, ValueError, TypeError, KeyError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        return ToolResult(text=f"Error: {name}: {msg}", ok=False, name=name)
    if not isinstance(res, ToolResult):
        raise TypeError(f"tool {name!r} returned {type(res).__name__}, expected a ToolResult")
    res.name = name
    return res
