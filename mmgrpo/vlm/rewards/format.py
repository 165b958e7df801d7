"""Format rewards (pure Python); see :func:`mmgrpo.vlm.rewards.parsing.parse_structure` for the exact rules.

:func:`well_formed` is the project's strict answer-shape rule (the ``format_exact`` reward, the trainer's
``completions/well_formed`` metric and format guard, the evaluator's ``well_formed_rate``): the whole output is
exactly the answer the prompt asks for, nothing else.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

from .parsing import completion_text, parse_structure

__all__ = ["format_reward", "well_formed", "WELL_FORMED_TASKS"]


def format_reward(text: Any, *, strict: bool = True, think_in_prompt: bool = False) -> float:
    """strict: exactly ``<think>…</think>`` then ``<answer>…</answer>``, one tag of each kind, only whitespace
    around (tags case-insensitive); loose: a closed ``<answer>…</answer>`` block exists. 1.0 / 0.0."""
    st = parse_structure(text, think_in_prompt=think_in_prompt)
    return 1.0 if (st.strict if strict else st.loose) else 0.0


# ------------------------------------------------------------------------------------------ well-formed answers
_NUM = r"\d+(?:\.\d+)?"  # an unsigned decimal, as every release's span / box regex reads it
_SP = r"[ \t]*"  # spaces inside one line (a newline inside an answer is malformed, as TempSamp-R1's strict check)
_SPAN = _NUM + r"[ \t]+to[ \t]+" + _NUM  # "12.54 to 17.83": the prompt's "start to end"
_CONTENT = {
    # tvg / gqa spans in the "seconds" answer format; json is checked with json.loads below
    "tvg": re.compile(_SP + _SPAN + _SP),
    # option letters ("C", "A, C") or one number (numeric questions)
    "mcq": re.compile(_SP + r"(?:[A-Z](?:" + _SP + "," + _SP + r"[A-Z])*|-?" + _NUM + ")" + _SP),
    # "(C) <glue>3.00 to 7.50</glue>" (several evidence spans comma separated)
    "gqa": re.compile(_SP + r"\(?[A-Z]\)?" + _SP + "<glue>" + _SP + _SPAN + "(?:" + _SP + "," + _SP + _SPAN + ")*"
                      + _SP + "</glue>" + _SP),
    # "[x1, y1, x2, y2]"
    "rec": re.compile(_SP + r"\[" + _SP + _NUM + "(?:" + _SP + "," + _SP + _NUM + "){3}" + _SP + r"\]" + _SP),
    # free text (an open answer): one line, something besides spaces, no tag
    "qa": re.compile(r"[^\n<>]*[^\s<>][^\n<>]*"),
}
_TAG = re.compile(r"</?(?:think|answer)>", re.IGNORECASE)
WELL_FORMED_TASKS = ("tvg", "mcq", "gqa", "rec", "numeric", "qa")


_GQA_JSON = re.compile(_SP + r"\(?[A-Z]\)?" + _SP + "<glue>(.*)</glue>" + _SP)


def _json_span(d: Any) -> bool:
    """``{"start_time": a, "end_time": b}`` with two finite non-negative JSON numbers."""
    if not isinstance(d, dict) or set(d) != {"start_time", "end_time"}:
        return False
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
               for v in d.values())


def _json_spans(content: str, several: bool) -> bool:
    """The json answer format: one span object, or (``several``: gqa evidence) a non-empty list of them."""
    try:
        d = json.loads(content)
    except ValueError:
        return False
    if several and isinstance(d, list):
        return bool(d) and all(_json_span(x) for x in d)
    return _json_span(d)


def well_formed(text: Any, task: str, *, mode: str = "think", answer_format: str = "seconds") -> bool:
    """Is ``text`` exactly the answer the prompt asks for (``mmgrpo.vlm.data.prompts``), and nothing else?

    Structure (tags exact lower-case, as the releases match them; whitespace allowed around the blocks):

    * ``mode="no_think"``: one ``<answer>…</answer>`` block and nothing else (no think tag anywhere);
    * ``mode="think"``: ``<think>…</think>`` then one answer block, nothing else (the think text holds no tag);
    * ``mode="hybrid"``: either of the two.

    The answer's content, on one line:

    * tvg: ``A to B`` (unsigned decimals; ``answer_format="json"``: ``{"start_time": a, "end_time": b}``);
    * mcq / numeric: option letters (``C``, ``A, C``) or one number;
    * gqa: ``(C) <glue>A to B</glue>`` (more spans comma separated; json: a span object or a list of them);
    * rec: ``[x1, y1, x2, y2]`` (four unsigned numbers).
    * qa: free text, one non-blank line without ``<`` or ``>``.

    Text after the closing tag, a second answer block, a missing closing tag (a completion cut at the token cap),
    trailing characters inside the block ("2.00 to 4.00.00.00") or a newline inside it all make it malformed.
    Stricter than any release's format reward (TempSamp-R1's strict check accepts text before the block and
    anything around the number pair inside it) and than the evaluators' parsers (which pick one span out of
    garbage); it is a diagnostic of the answer's shape, not of its correctness. Never raises."""
    if task not in WELL_FORMED_TASKS:
        raise ValueError(f"well_formed: unknown task {task!r}; choose one of {WELL_FORMED_TASKS}")
    if mode not in ("think", "no_think", "hybrid"):
        raise ValueError(f"well_formed: mode must be think, no_think or hybrid, got {mode!r}")
    t = completion_text(text)
    if t is None:
        return False
    t = t.strip()
    think = ""
    if t.startswith("<think>"):
        end = t.find("</think>")
        if mode == "no_think" or end < 0:
            return False
        think, t = t[len("<think>"):end], t[end + len("</think>"):].lstrip()
        if _TAG.search(think):
            return False
    elif mode == "think":
        return False
    if not (t.startswith("<answer>") and t.endswith("</answer>")):
        return False
    content = t[len("<answer>"):-len("</answer>")]
    if "<answer>" in content.lower() or "</answer>" in content.lower() or "<think>" in content.lower():
        return False
    key = "mcq" if task == "numeric" else task
    if answer_format == "json" and key in ("tvg", "gqa"):
        if "\n" in content:
            return False
        if key == "tvg":
            return _json_spans(content.strip(), several=False)
        m = _GQA_JSON.fullmatch(content)
        return m is not None and _json_spans(m.group(1).strip(), several=True)
    return _CONTENT[key].fullmatch(content) is not None
