"""Issue 32 "done when": the exit codes of ``mmgrpo train`` / ``flow_grpo train`` match the README's table.

The codes live in ``mmgrpo/utils/exit_codes.py`` (``--help`` prints them from there; tests/engine/test_errors.py
checks each error's code through both CLIs). This pins the documented list to the same constants: the paragraph
that starts with "Exit codes" (README.md, or a docs page if the README moves it) names exactly these codes, each
with its meaning."""
import re
from pathlib import Path

from mmgrpo.utils import exit_codes as ec

REPO = Path(__file__).resolve().parents[2]
# one word of each code's meaning, as exit_codes.HELP says it
MEANING = {ec.OK: "trained", ec.USAGE: "config", ec.STOPPED: "fault policy", ec.NOTHING_TRAINED: "nothing",
           ec.LOCKED: "in use", ec.INTERRUPTED: "SIGTERM", ec.SIGINT_EARLY: "Ctrl-C"}


def _documented() -> tuple[Path, str]:
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text()
        m = re.search(r"^(?:\*\*Exit codes\*\*|#+ Exit codes).*?(?=\n\s*\n(?!\|)|\Z)", text, re.M | re.S)
        if m and re.search(r"\b130\b", m.group(0)):
            return path, m.group(0)
    raise AssertionError("no 'Exit codes' paragraph listing the codes in README.md or docs/*.md")


def test_the_documented_exit_codes_are_the_codes_in_exit_codes_py():
    path, para = _documented()
    # a running text with the codes in backticks ("`0` trained · `2` ...") or a table with the code in its first cell
    rows = re.findall(r"^\|\s*`?(\d+)`?\s*\|(.*)$", para, re.M)
    if rows:
        pairs = [(int(c), text) for c, text in rows]
    else:
        parts = re.split(r"`(\d+)`", para)
        pairs = [(int(c), text) for c, text in zip(parts[1::2], parts[2::2])]  # each code's text up to the next code
    codes = [c for c, _ in pairs]
    assert sorted(set(codes)) == sorted(MEANING), f"{path.name}: documents {codes}, exit_codes.py has {sorted(MEANING)}"
    for code, text in pairs:
        assert MEANING[code].lower() in text.lower(), f"{path.name}: code {code}: {text.strip()[:120]!r}"


def test_help_lists_the_same_codes():
    listed = [int(c) for c in re.findall(r"^\s{2}(\d+)\s", ec.HELP, re.M)]
    assert listed == sorted(MEANING)
