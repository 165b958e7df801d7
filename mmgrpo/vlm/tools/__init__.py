"""Multi-turn, tool-augmented rollouts ("thinking with images and videos"): the tool interface and registry
(:mod:`.base`), the tool-call format (:mod:`.parse`), the built-in tools (:mod:`.builtin`), the options
(:mod:`.config`) and the rollout engine (:mod:`.rollout`). See docs/tools.md."""
from mmgrpo.vlm.tools.base import TOOLS, ToolContext, ToolError, ToolResult, call_tool, get_tool, register_tool
from mmgrpo.vlm.tools.config import ToolsConfig
from mmgrpo.vlm.tools.parse import ToolCall, format_tool_call, parse_tool_calls

__all__ = ["TOOLS", "ToolContext", "ToolError", "ToolResult", "call_tool", "get_tool", "register_tool",
           "ToolsConfig", "ToolCall", "format_tool_call", "parse_tool_calls"]
