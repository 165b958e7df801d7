"""A griffe extension for the API pages (``extensions:`` in mkdocs.yml): the project's docstrings are written with
Sphinx conventions (``:class:`X```, ``:math:`...```, simple RST tables, ``::`` literal blocks); this turns those into
Markdown before mkdocstrings renders them, so the pages read like the source. The docstrings themselves are not
changed."""
from __future__ import annotations

import re

import griffe

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|obj|exc|py:\w+):`~?([^`]+)`")
_MATH = re.compile(r":math:`([^`]+)`")
_RULE = re.compile(r"^\s*=+(?:\s+=+)+\s*$")


def _tables_and_literals(text: str) -> str:
    """Simple RST tables (``=== ===`` rules) and ``::`` literal blocks become fenced text blocks."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        if _RULE.match(line):  # a table: up to and including its third rule line (or the end)
            rules, j = 0, i
            while j < len(lines) and rules < 3:
                rules += bool(_RULE.match(lines[j]))
                j += 1
            out += ["```text", *lines[i:j], "```"]
            i = j
            continue
        if line.rstrip().endswith("::") and not line.strip().startswith(".."):
            out.append(line.rstrip()[:-1] if line.rstrip() != "::" else "")
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            indent = len(lines[j]) - len(lines[j].lstrip()) if j < len(lines) else 0
            base = len(line) - len(line.lstrip())
            if j < len(lines) and indent > base:
                k = j
                while k < len(lines) and (not lines[k].strip() or len(lines[k]) - len(lines[k].lstrip()) >= indent):
                    k += 1
                while k > j and not lines[k - 1].strip():
                    k -= 1
                out += ["", "```text", *[ln[indent:] for ln in lines[j:k]], "```", ""]
                i = k
                continue
            i += 1
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def rst_to_markdown(text: str) -> str:
    text = _ROLE.sub(r"`\1`", text)
    text = _MATH.sub(r"`\1`", text)
    return _tables_and_literals(text)


class RSTToMarkdown(griffe.Extension):
    def on_instance(self, *, obj, **kwargs) -> None:  # every module, class, function and attribute
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
