"""``tools.*``: the multi-turn tool rollout section of the VLM TrainConfig (no torch import: ``--help`` lists it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["ToolsConfig"]


def _h(text: str) -> dict:
    return {"help": text}


@dataclass
class ToolsConfig:
    enabled: bool = field(default=False, metadata=_h(
        "multi-turn rollouts: the policy may call tools (<tool_call>{...}</tool_call>), each result is appended as a "
        "tool turn and generation continues (mmgrpo.vlm.tools.rollout; docs/tools.md)"))
    names: list[str] = field(default_factory=lambda: ["crop"], metadata=_h(
        "tools offered (registry mmgrpo.vlm.tools.base.TOOLS; built-ins crop, zoom, seek)"))
    modules: list[str] = field(default_factory=list, metadata=_h(
        "Python modules imported before the run (e.g. [mmgrpo.vlm.synthetic.look_again]): a user tool registered "
        "on import (register_tool) becomes usable by name from the command line; every name in tools.names must "
        "then be a built-in or registered"))
    max_turns: int = field(default=3, metadata=_h("assistant turns per rollout (the last one must answer)"))
    max_tool_calls: int = field(default=2, metadata=_h(
        "tool calls per rollout; calls beyond it are refused (counted as failures, the model is told)"))
    max_visual_tokens: int = field(default=0, metadata=_h(
        "vision tokens the tool turns of one rollout may add (0 = no limit); media over it are refused"))
    max_total_tokens: int = field(default=0, metadata=_h(
        "tokens after the first prompt per rollout, tool turns included (0 = max_turns x rollout.max_new_tokens); "
        "each turn generates at most rollout.max_new_tokens"))
    tool_role: Literal["auto", "tool", "user"] = field(default="auto", metadata=_h(
        "role of the tool turn in the chat template: user = a user turn with <tool_response> (Qwen2.5's text "
        "template convention; the shipped Qwen2.5-VL and tiny templates have no tool branch); tool = the template's "
        "own tool role; auto = tool if the template mentions it, else user"))
    crop_pixels: int = field(default=0, metadata=_h(
        "crop / zoom: pixels of the returned crop (resized, aspect kept, sides multiples of the patch factor); 0 = "
        "the first image's model-input area (the crop gets the first view's token budget)"))
    min_crop_size: int = field(default=4, metadata=_h("crop / zoom: smallest accepted side in source pixels"))
    seek_fps: float = field(default=4.0, metadata=_h("seek: sampling rate of the requested time window"))
    seek_max_frames: int = field(default=8, metadata=_h("seek: at most this many frames (even)"))
    seek_max_pixels: int = field(default=0, metadata=_h(
        "seek: per-frame pixel cap (0 = the first turn's frame size)"))
    call_format: str = field(default="qwen", metadata=_h(
        "how the policy calls tools (mmgrpo.vlm.tools.parse.CALL_FORMATS): qwen = <tool_call>{json}</tool_call> "
        "blocks; mgpo = MGPO's release (fixed two-turn template: the first turn's ```json bbox_2d block is cropped "
        "by mgpo_crop, the second answers in \\boxed{}; data.prompt_template=mgpo); mgpo_plain = our earlier "
        "reading (any [x1, y1, x2, y2] of the first turn, the crop tool, <answer>)"))
    instruction: str = field(default="auto", metadata=_h(
        "text the rollout appends to the first prompt's user turn: auto = the call format's (lists the tools), "
        "none = nothing, else this text"))
    generation_prefix: str = field(default="", metadata=_h(
        "text put after every assistant generation prompt (the first prompt's and each tool turn's), as template "
        "tokens (loss 0): e.g. ParaVT's constrained think prefix '<think>\\n'"))
    reuse_kv: bool = field(default=True, metadata=_h(
        "HF backend: later turns continue from each row's cache of the earlier ones and prefill only the new tokens "
        "(mmgrpo.vlm.models.turn_cache; same tokens and log-probs up to float rounding); false = prefill the whole "
        "conversation at every turn. Other backends always prefill whole (vLLM's own prefix cache may serve it)"))
    answer_pattern: str = field(default="<answer>", metadata=_h(
        "a turn containing this string is the final answer (ends the rollout even if it also calls a tool); a turn "
        "with no tool call ends it too"))

    def check(self) -> None:
        for name in ("max_turns", "max_tool_calls"):
            if getattr(self, name) < 1:
                raise ValueError(f"tools.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_visual_tokens", "max_total_tokens", "crop_pixels", "seek_max_pixels"):
            if getattr(self, name) < 0:
                raise ValueError(f"tools.{name} must be >= 0, got {getattr(self, name)}")
        if self.seek_fps <= 0 or self.seek_max_frames < 2:
            raise ValueError("tools.seek_fps must be > 0 and tools.seek_max_frames >= 2")
        if not self.names:
            raise ValueError("tools.enabled needs at least one tool in tools.names")
        self.import_modules()

    def import_modules(self) -> None:
        """Import ``tools.modules`` (their ``register_tool`` calls run); with any listed, check that every name in
        ``tools.names`` is known. Idempotent (Python imports a module once)."""
        if not self.modules:
            return
        import importlib

        for mod in self.modules:
            try:
                importlib.import_module(mod)
            except ImportError as e:
                raise ValueError(f"tools.modules: cannot import {mod!r}: {e}") from e
        from mmgrpo.vlm.tools.base import tool_names

        unknown = [n for n in self.names if n not in tool_names()]
        if unknown:
            raise ValueError(f"tools.names: {unknown} not registered after importing tools.modules={self.modules}; "
                             f"known: {tool_names()}")
