"""Tolerant, pure parsers for VLM completions (no torch, no numpy).

This is the project's **lenient** parser (parse mode ``lenient``), a deliberate choice: it reads the answer a
model meant in as many spellings as possible (unclosed ``<answer>``, "25.3s", "(C)", "The answer is C", option
text, float or reversed boxes), so training gets a signal and evaluation counts format errors separately
(``status``). The released methods read answers more strictly; their rules are reproduced, one mode per release,
in :mod:`mmgrpo.vlm.rewards.protocols` (``reward.parse_mode=...`` for training, ``eval/score.py --protocol official``
for evaluation).

Every public function here **never raises on any input** (strings, ``None``, other objects): it returns a
:class:`Parsed` whose ``status`` says what happened, so trainers and the eval harness can count parse failures
instead of crashing or silently scoring garbage.

Where the value is looked for
-----------------------------
1. The **last** ``<answer>…</answer>`` block (tag matched case-insensitively, whitespace inside the tag allowed:
   ``<Answer>``, ``< answer >``). If the last opening tag has no closing tag, its text up to the end of the string
   is used when ``allow_unclosed=True`` (default); otherwise the last *complete* block is used.
2. If there is no answer block: the whole text when ``fallback_to_text=True`` (``source="text"``), else
   ``status=NO_ANSWER_BLOCK``.

Inside the chosen text, ``which="auto"`` takes the **first** match in an answer block (the model's answer) and the
**last** match when falling back to the whole text (the conclusion of free-form reasoning); ``"first"`` /
``"last"`` force one.

Statuses: ``ok``; ``empty`` (None, non-string, or blank text); ``no_answer_block``; ``no_match`` (text present but
nothing of the requested kind found); ``invalid`` (something found but unusable: non-finite number, bad clock time,
option letter out of range).
"""
from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from typing import Any, Generic, Iterator, Literal, Optional, Sequence, TypeVar

__all__ = [
    "ParseStatus",
    "Parsed",
    "Span",
    "Box",
    "AnswerBlock",
    "Structure",
    "extract_answer",
    "extract_block",
    "parse_structure",
    "find_spans",
    "find_choices",
    "find_numbers",
    "find_boxes",
    "parse_spans",
    "parse_span",
    "parse_choice",
    "parse_number",
    "parse_boxes",
    "parse_box",
    "completion_text",
]

T = TypeVar("T")
Which = Literal["auto", "first", "last"]


class ParseStatus(str, enum.Enum):
    OK = "ok"
    EMPTY = "empty"
    NO_ANSWER_BLOCK = "no_answer_block"
    NO_MATCH = "no_match"
    INVALID = "invalid"


@dataclass(frozen=True)
class Parsed(Generic[T]):
    """Result of a parse: ``value`` is None unless ``status is ParseStatus.OK``.

    ``source`` is ``"answer"`` (value read from an answer block), ``"text"`` (whole-text fallback) or None.
    """

    value: Optional[T]
    status: ParseStatus
    source: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.status is ParseStatus.OK


@dataclass(frozen=True)
class Span:
    """A temporal span in seconds with ``start <= end``; ``reversed`` records that the text had start > end."""

    start: float
    end: float
    reversed: bool = False

    def __iter__(self) -> Iterator[float]:  # so ``s, e = span`` works
        yield self.start
        yield self.end


@dataclass(frozen=True)
class Box:
    """An axis-aligned box ``[x1, y1, x2, y2]`` with ``x1 <= x2, y1 <= y2`` in the frame the model wrote it in;
    ``reversed`` records that the text had a swapped corner pair."""

    x1: float
    y1: float
    x2: float
    y2: float
    reversed: bool = False

    def __iter__(self) -> Iterator[float]:
        yield from (self.x1, self.y1, self.x2, self.y2)


@dataclass(frozen=True)
class AnswerBlock:
    """Text selected for value parsing. ``content`` is None iff status is not OK."""

    content: Optional[str]
    status: ParseStatus
    source: Optional[str]  # "answer" | "text" | None
    closed: bool = False  # the chosen <answer> block had a closing tag
    n_blocks: int = 0  # number of opening answer tags in the text


# --------------------------------------------------------------------------------------------------------------
# Completion normalisation and answer blocks
# --------------------------------------------------------------------------------------------------------------


def completion_text(completion: Any) -> Optional[str]:
    """Text of a completion given as a string or as chat messages (TRL conversational format: a list of
    ``{"role", "content"}`` dicts whose content is a string or a list of ``{"type": "text", "text"}`` parts).
    The last message is used. Returns None for anything else. Never raises."""
    try:
        if isinstance(completion, str):
            return completion
        if isinstance(completion, dict):
            completion = [completion]
        if isinstance(completion, (list, tuple)) and completion:
            msg = completion[-1]
            if isinstance(msg, str):
                return msg
            if isinstance(msg, dict):
                content = msg.get("content")
                if isinstance(content, str):
                    return content
                if isinstance(content, (list, tuple)):
                    parts = [p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
                    return "".join(parts)
        return None
    except Exception:  # pragma: no cover - defensive: parsers never raise
        return None


def _tag_res(tag: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    t = re.escape(tag)
    return (re.compile(rf"<\s*{t}\s*>", re.IGNORECASE), re.compile(rf"<\s*/\s*{t}\s*>", re.IGNORECASE))


_TAG_CACHE: dict[str, tuple[re.Pattern[str], re.Pattern[str]]] = {}


def _tags(tag: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    if tag not in _TAG_CACHE:
        _TAG_CACHE[tag] = _tag_res(tag)
    return _TAG_CACHE[tag]


def extract_block(text: Any, tag: str = "answer", *, allow_unclosed: bool = True) -> Optional[str]:
    """Content of the last ``<tag>…</tag>`` block (see module docstring), or None. Never raises."""
    try:
        if not isinstance(text, str):
            return None
        open_re, close_re = _tags(tag)
        opens = list(open_re.finditer(text))
        if not opens:
            return None
        last = opens[-1]
        close = close_re.search(text, last.end())
        if close is not None:
            return text[last.end() : close.start()]
        if allow_unclosed:
            return text[last.end() :]
        # last complete block: the last closing tag and the last opening tag before it
        closes = list(close_re.finditer(text))
        for c in reversed(closes):
            before = [o for o in opens if o.end() <= c.start()]
            if before:
                return text[before[-1].end() : c.start()]
        return None
    except Exception:  # pragma: no cover
        return None


def extract_answer(
    text: Any, *, tag: str = "answer", allow_unclosed: bool = True, fallback_to_text: bool = False
) -> AnswerBlock:
    """Select the text to parse a value from: the last answer block, or the whole text as a fallback."""
    try:
        text = completion_text(text)
        if text is None or not text.strip():
            return AnswerBlock(None, ParseStatus.EMPTY, None)
        open_re, close_re = _tags(tag)
        n_blocks = len(open_re.findall(text))
        content = extract_block(text, tag, allow_unclosed=allow_unclosed)
        if content is not None:
            last_open = list(open_re.finditer(text))[-1]
            closed = close_re.search(text, last_open.end()) is not None
            return AnswerBlock(content, ParseStatus.OK, "answer", closed=closed, n_blocks=n_blocks)
        if fallback_to_text:
            return AnswerBlock(text, ParseStatus.OK, "text", closed=False, n_blocks=n_blocks)
        return AnswerBlock(None, ParseStatus.NO_ANSWER_BLOCK, None, n_blocks=n_blocks)
    except Exception:  # pragma: no cover
        return AnswerBlock(None, ParseStatus.EMPTY, None)


@dataclass(frozen=True)
class Structure:
    """Think/answer layout of a completion.

    ``strict``: the text is exactly ``<think>…</think>`` then ``<answer>…</answer>`` with only whitespace
    before, between and after, and exactly one tag of each kind (with ``think_in_prompt=True`` the opening
    ``<think>`` belongs to the prompt, so there must be none in the completion).
    ``loose``: at least one closed ``<answer>…</answer>`` block exists.
    """

    n_think_open: int
    n_think_close: int
    n_answer_open: int
    n_answer_close: int
    strict: bool
    loose: bool


def parse_structure(text: Any, *, think_in_prompt: bool = False) -> Structure:
    """Count think/answer tags and check the strict / loose format. Linear time; never raises."""
    text = completion_text(text)
    if text is None:
        return Structure(0, 0, 0, 0, False, False)
    to_re, tc_re = _tags("think")
    ao_re, ac_re = _tags("answer")
    to, tc, ao, ac = (list(r.finditer(text)) for r in (to_re, tc_re, ao_re, ac_re))
    loose = extract_block(text, "answer", allow_unclosed=False) is not None
    strict = False
    n_to_expected = 0 if think_in_prompt else 1
    if len(to) == n_to_expected and len(tc) == 1 and len(ao) == 1 and len(ac) == 1:
        think_start = to[0].start() if to else 0
        think_open_end = to[0].end() if to else 0
        strict = (
            text[:think_start].strip() == ""
            and think_open_end <= tc[0].start()
            and tc[0].end() <= ao[0].start()
            and text[tc[0].end() : ao[0].start()].strip() == ""
            and ao[0].end() <= ac[0].start()
            and text[ac[0].end() :].strip() == ""
        )
    return Structure(len(to), len(tc), len(ao), len(ac), strict, loose)


# --------------------------------------------------------------------------------------------------------------
# Temporal spans
# --------------------------------------------------------------------------------------------------------------

# A time token: hh:mm:ss(.ff), mm:ss(.ff) or a plain non-negative decimal, optionally followed by a seconds unit.
# Not preceded by a word character, '.' or ':' (so "Qwen2.5" and the middle of "1:2:3:4" are not numbers).
_TIME_RE = re.compile(
    r"(?<![\w.:])"
    r"(?P<val>\d{1,3}:\d{1,2}:\d{1,2}(?:\.\d+)?|\d{1,4}:\d{1,2}(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
    r"(?P<unit>\s*(?:seconds|second|secs|sec|s)(?![A-Za-z]))?"
    r"(?![\d:])"
)
# What may sit between the two times of "X to Y": to, dashes, tilde, and, until, arrows.
_SEP_RE = re.compile(
    r"\s*(?:to|and|until|till|through|-|\u2010|\u2011|\u2012|\u2013|\u2014|\u2015|~|\uff5e|->|\u2192)\s*",
    re.IGNORECASE,
)
_COMMA_RE = re.compile(r"\s*,\s*")
# A JSON/YAML-ish key right before a value: "start_time": "12.5" / start=12.5 / 'end': -3
_KEY_BEFORE_RE = re.compile(r"""(?P<key>[A-Za-z_]+)\s*["']?\s*[:=]\s*["']?\s*(?P<neg>-)?$""")
_KEY_WINDOW = 48
_NONFINITE_WORD_RE = re.compile(r"\b(?:nan|inf|infinity)\b", re.IGNORECASE)


@dataclass
class _Tok:
    start: int
    end: int
    value: Optional[float]  # None if invalid (bad clock, non-finite)
    kind: Optional[str] = None  # "start" / "end" when preceded by a key


def _time_value(val: str) -> Optional[float]:
    try:
        if ":" in val:
            parts = [float(p) for p in val.split(":")]
            if len(parts) == 3:
                h, m, s = parts
                if m >= 60 or s >= 60:
                    return None
                v = h * 3600 + m * 60 + s
            else:
                m, s = parts
                if s >= 60:
                    return None
                v = m * 60 + s
        else:
            v = float(val)
        return v if math.isfinite(v) else None
    except (ValueError, OverflowError):
        return None


def _time_tokens(s: str) -> list[_Tok]:
    toks = []
    for m in _TIME_RE.finditer(s):
        v = _time_value(m.group("val"))
        tok = _Tok(m.start(), m.end(), v)
        km = _KEY_BEFORE_RE.search(s[max(0, m.start() - _KEY_WINDOW) : m.start()])
        if km is not None:
            key = km.group("key").lower()
            if "start" in key or "begin" in key:
                tok.kind = "start"
            elif "end" in key or "stop" in key:
                tok.kind = "end"
            if tok.kind is not None and km.group("neg") and tok.value is not None:
                tok.value = -tok.value
        toks.append(tok)
    return toks


def _make_span(a: float, b: float) -> Span:
    return Span(b, a, True) if a > b else Span(a, b, False)


def find_spans(s: Any) -> tuple[list[Span], bool]:
    """All temporal spans in ``s`` in text order, and whether an unusable candidate was seen.

    Recognised: keyed values (``{"start_time": "12.5", "end_time": 17.8}``, quoted or not, either key order,
    clock strings allowed), bracketed pairs (``[12.5, 17.8]``, ``(12.5, 17.8)``, nested lists), a text that is
    only ``12.5, 17.8``, and
    "X <sep> Y" with sep in {to, -, en/em dash, ~, and, until, through, arrows} ("from 12.5s to 17.8s",
    "between 0:12 and 0:17.5", "12.5–17.8 seconds"). Reversed pairs are swapped with ``reversed=True``.
    Negative numbers only come from keyed values (elsewhere '-' is a separator).
    """
    try:
        if not isinstance(s, str) or not s:
            return [], False
        toks = _time_tokens(s)
        used = [False] * len(toks)
        found: list[tuple[int, Span]] = []
        invalid = False

        # 1) keyed pairs: pair each start/end token with the next token of the other kind
        pending: Optional[int] = None
        for i, t in enumerate(toks):
            if t.kind is None:
                continue
            if pending is not None and toks[pending].kind != t.kind:
                a, b = (toks[pending], t) if toks[pending].kind == "start" else (t, toks[pending])
                used[pending] = used[i] = True
                if a.value is None or b.value is None:
                    invalid = True
                else:
                    found.append((toks[pending].start, _make_span(a.value, b.value)))
                pending = None
            else:
                pending = i
        for i, t in enumerate(toks):  # an unpaired key ("start: 12.5 to 17.8") falls through to step 2
            if not used[i]:
                t.kind = None

        # 2) consecutive unkeyed tokens joined by a separator, or a bracketed "[a, b]"
        i = 0
        while i < len(toks) - 1:
            a, b = toks[i], toks[i + 1]
            if used[i] or used[i + 1]:
                i += 1
                continue
            between = s[a.end : b.start]
            pair = _SEP_RE.fullmatch(between) is not None
            if not pair and _COMMA_RE.fullmatch(between) is not None:
                before = s[: a.start].rstrip()[-1:]
                after = s[b.end :].lstrip()[:1]
                # "[a, b]" / "(a, b)", or the whole text is just "a, b"
                pair = (before in ("[", "(") and after in ("]", ")")) or (
                    before == "" and s[b.end :].strip() in ("", ".")
                )
            if pair:
                used[i] = used[i + 1] = True
                if a.value is None or b.value is None:
                    invalid = True
                else:
                    found.append((a.start, _make_span(a.value, b.value)))
                i += 2
            else:
                i += 1
        found.sort(key=lambda x: x[0])
        if not found and _NONFINITE_WORD_RE.search(s):
            invalid = True
        return [sp for _, sp in found], invalid
    except Exception:  # pragma: no cover
        return [], True


def _pick(items: Sequence[T], which: Which, source: Optional[str]) -> T:
    if which == "first" or (which == "auto" and source == "answer"):
        return items[0]
    return items[-1]


def parse_spans(
    text: Any, *, allow_unclosed: bool = True, fallback_to_text: bool = True, tag: str = "answer"
) -> Parsed[list[Span]]:
    """All spans (GQA evidence, multi-interval answers) from the answer block / fallback text."""
    blk = extract_answer(text, tag=tag, allow_unclosed=allow_unclosed, fallback_to_text=fallback_to_text)
    if blk.status is not ParseStatus.OK:
        return Parsed(None, blk.status, None)
    spans, invalid = find_spans(blk.content)
    if spans:
        return Parsed(spans, ParseStatus.OK, blk.source)
    return Parsed(None, ParseStatus.INVALID if invalid else _empty_or_nomatch(blk.content), blk.source)


def parse_span(
    text: Any,
    *,
    which: Which = "auto",
    allow_unclosed: bool = True,
    fallback_to_text: bool = True,
    tag: str = "answer",
) -> Parsed[Span]:
    """One span (TVG): first span of the answer block, or last of the fallback text (``which="auto"``)."""
    p = parse_spans(text, allow_unclosed=allow_unclosed, fallback_to_text=fallback_to_text, tag=tag)
    if not p.ok:
        return Parsed(None, p.status, p.source)
    return Parsed(_pick(p.value, which, p.source), ParseStatus.OK, p.source)


def _empty_or_nomatch(content: Optional[str]) -> ParseStatus:
    return ParseStatus.EMPTY if content is None or not content.strip() else ParseStatus.NO_MATCH


# --------------------------------------------------------------------------------------------------------------
# Multiple-choice letters
# --------------------------------------------------------------------------------------------------------------

_PREFIX_RE = re.compile(
    r"^\s*(?:so\s*,?\s*|therefore\s*,?\s*|thus\s*,?\s*)?(?:the\s+)?"
    r"(?:final\s+|correct\s+|best\s+|right\s+)?(?:answer|option|choice)s?\b"
    r"(?:\s+is|\s+are|\s+would\s+be|\s+should\s+be)?\s*[:=]?\s*(?:option\s+|choice\s+)?",
    re.IGNORECASE,
)
_ITEM_RE = re.compile(r"(?P<open>[(\[])?\s*(?P<letter>[A-Z])\s*(?P<close>[)\]])?")
_LIST_SEP_RE = re.compile(r"\s*(?:,|;|/|&|\+|\band\b)\s*", re.IGNORECASE)
# what may follow a bare letter: end, punctuation, or the next tag ("C <glue>…</glue>")
_DELIM_AFTER_RE = re.compile(r"^\s*(?:$|[.:,;\-\u2013\u2014)\]!<])")
_PAREN_LETTER_RE = re.compile(r"\(([A-Z])\)")
# only upper-case letters here: "answer: a cat" is option text, not option A
_ANSWER_IS_RE = re.compile(
    r"(?i:answer|option|choice)\s*(?i:is|:)\s*(?i:option\s+|choice\s+)?[(\[]?([A-Z])(?![A-Za-z])"
)
_OPT_PREFIX_RE = re.compile(r"^\s*[(\[]?([A-Za-z])[)\].:]\s+")
_WS_PUNCT_RE = re.compile(r"[\s\W_]+")
_MARKUP_RE = re.compile(r"[*`\"']")


def _norm_option_text(s: str) -> str:
    return _WS_PUNCT_RE.sub(" ", s).strip().lower()


def _letter_list_at_start(s: str, prefixed: bool, lowercase_ok: bool) -> Optional[list[str]]:
    """Letters at the start of ``s`` ("(C)", "C.", "A, C", "Answer: C) blah"), with the rest checked so that the
    article in "A person walks" is not read as option A (unless an "answer is" prefix made it explicit)."""
    # upper-case ASCII only, so positions in ``src`` and ``s`` stay aligned
    src = "".join(c.upper() if "a" <= c <= "z" else c for c in s) if lowercase_ok else s
    pos = 0
    letters: list[str] = []
    last_delimited = False
    while True:
        m = _ITEM_RE.match(src, pos)
        if m is None:
            break
        letters.append(m.group("letter"))
        last_delimited = bool(m.group("close"))
        pos = m.end()
        sep = _LIST_SEP_RE.match(src, pos)
        if sep is None or sep.end() == pos:
            break
        nxt = _ITEM_RE.match(src, sep.end())
        if nxt is None:
            break
        # the item after a separator must itself be a stand-alone letter
        after = src[nxt.end() : nxt.end() + 1]
        if not nxt.group("close") and after.isalpha():
            break
        pos = sep.end()
    if not letters:
        return None
    rest = s[pos:]
    if lowercase_ok:
        # a lower-case answer is accepted only as the whole content ("c", "(b).", "a, c")
        return letters if rest.strip().strip(".") == "" else None
    if last_delimited or _DELIM_AFTER_RE.match(rest):
        return letters
    if prefixed and (rest[:1].isspace() or rest == ""):
        return letters
    return None


def find_choices(
    s: Any, *, options: Optional[Sequence[Any]] = None, n_options: Optional[int] = None
) -> tuple[Optional[tuple[str, ...]], bool]:
    """Option letters in ``s`` (sorted, unique) and whether an invalid (out-of-range) letter was seen.

    Accepts "(C)", "C.", "C", "The answer is C", "Answer: C) blah", "A, C", "(A) and (C)", lower-case as the
    whole answer, and, when ``options`` are given, the exact text of one option (with or without its "(B)" prefix).
    ``options`` may be strings like "(A) a dog" or bare texts; valid letters are the first ``len(options)``
    (or ``n_options``) letters, else A-Z.
    """
    try:
        if not isinstance(s, str):
            return None, False
        n = len(options) if options is not None else n_options
        valid = {chr(65 + i) for i in range(min(int(n), 26))} if n else {chr(65 + i) for i in range(26)}
        body = _MARKUP_RE.sub("", s).strip()
        if not body:
            return None, False
        pm = _PREFIX_RE.match(body)
        prefixed = pm is not None and pm.end() > 0 and re.search(r"[A-Za-z]", pm.group(0)) is not None
        rest = body[pm.end() :] if pm is not None else body
        letters = _letter_list_at_start(rest, prefixed, lowercase_ok=False)
        if letters is None:
            letters = _letter_list_at_start(rest, prefixed, lowercase_ok=True)
        if letters is None:
            m = list(_ANSWER_IS_RE.finditer(body))
            if m:
                letters = [m[-1].group(1).upper()]
        if letters is None:
            paren = set(_PAREN_LETTER_RE.findall(body))
            if len(paren) == 1:
                letters = [paren.pop()]
        if letters is None and options:
            targets = {t for t in (_norm_option_text(rest), _norm_option_text(body)) if t}
            hits = []
            for i, opt in enumerate(options):
                if not isinstance(opt, str):
                    continue
                stripped = _OPT_PREFIX_RE.sub("", opt, count=1)
                if targets & {_norm_option_text(stripped), _norm_option_text(opt)}:
                    hits.append(chr(65 + i))
            if len(hits) == 1:
                letters = hits
        if not letters:
            return None, False
        out = tuple(sorted(set(letters)))
        if any(x not in valid for x in out):
            return None, True
        return out, False
    except Exception:  # pragma: no cover
        return None, True


def parse_choice(
    text: Any,
    *,
    options: Optional[Sequence[Any]] = None,
    n_options: Optional[int] = None,
    allow_unclosed: bool = True,
    fallback_to_text: bool = True,
    tag: str = "answer",
) -> Parsed[tuple[str, ...]]:
    """Option letter(s) from the answer block / fallback text, as a sorted tuple like ``("A", "C")``."""
    blk = extract_answer(text, tag=tag, allow_unclosed=allow_unclosed, fallback_to_text=fallback_to_text)
    if blk.status is not ParseStatus.OK:
        return Parsed(None, blk.status, None)
    letters, invalid = find_choices(blk.content, options=options, n_options=n_options)
    if letters:
        return Parsed(letters, ParseStatus.OK, blk.source)
    return Parsed(None, ParseStatus.INVALID if invalid else _empty_or_nomatch(blk.content), blk.source)


# --------------------------------------------------------------------------------------------------------------
# Numbers and boxes
# --------------------------------------------------------------------------------------------------------------

_NUMBER_RE = re.compile(
    r"(?<![\w.])(?P<num>[-+]?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+|\.\d+)(?:[eE][-+]?\d+)?)"
    r"(?:\s*/\s*(?P<den>\d+(?:\.\d+)?)(?![\d.]))?"
    r"(?![\d])"
)


def find_numbers(s: Any) -> tuple[list[float], bool]:
    """Numbers in ``s`` in text order (thousands separators, sign, exponent, fraction "3/4"), and whether a
    non-finite one (overflow, division by zero) was skipped."""
    try:
        if not isinstance(s, str):
            return [], False
        out: list[float] = []
        invalid = False
        for m in _NUMBER_RE.finditer(s):
            try:
                v = float(m.group("num").replace(",", ""))
                if m.group("den") is not None:
                    d = float(m.group("den"))
                    v = v / d if d != 0 else math.inf
            except (ValueError, OverflowError):
                invalid = True
                continue
            if math.isfinite(v):
                out.append(v)
            else:
                invalid = True
        return out, invalid
    except Exception:  # pragma: no cover
        return [], True


def parse_number(
    text: Any, *, which: Which = "auto", allow_unclosed: bool = True, fallback_to_text: bool = True, tag: str = "answer"
) -> Parsed[float]:
    """One number (numeric QA): first in the answer block, last in the fallback text (``which="auto"``)."""
    blk = extract_answer(text, tag=tag, allow_unclosed=allow_unclosed, fallback_to_text=fallback_to_text)
    if blk.status is not ParseStatus.OK:
        return Parsed(None, blk.status, None)
    nums, invalid = find_numbers(blk.content)
    if nums:
        return Parsed(_pick(nums, which, blk.source), ParseStatus.OK, blk.source)
    return Parsed(None, ParseStatus.INVALID if invalid else _empty_or_nomatch(blk.content), blk.source)


_BN = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_BOX_LIST_RE = re.compile(
    rf"[\[(]\s*({_BN})\s*,\s*({_BN})\s*,\s*({_BN})\s*,\s*({_BN})\s*[\])]"
)
# Qwen2-VL style "(x1,y1),(x2,y2)" (optionally inside <|box_start|> ... <|box_end|>)
_BOX_PAIRS_RE = re.compile(rf"\(\s*({_BN})\s*,\s*({_BN})\s*\)\s*,?\s*\(\s*({_BN})\s*,\s*({_BN})\s*\)")


def find_boxes(s: Any) -> tuple[list[Box], bool]:
    """Boxes ``[x1, y1, x2, y2]`` in text order, from JSON (``{"bbox_2d": [..]}``), plain lists/tuples or
    Qwen2-VL ``(x1,y1),(x2,y2)``; corners are swapped per axis when reversed. Returns (boxes, invalid_seen)."""
    try:
        if not isinstance(s, str):
            return [], False
        found: list[tuple[int, Box]] = []
        invalid = False
        taken: list[tuple[int, int]] = []
        for rx in (_BOX_LIST_RE, _BOX_PAIRS_RE):
            for m in rx.finditer(s):
                if any(a < m.end() and m.start() < b for a, b in taken):
                    continue
                try:
                    v = [float(g) for g in m.groups()]
                except (ValueError, OverflowError):
                    invalid = True
                    continue
                if not all(math.isfinite(x) for x in v):
                    invalid = True
                    continue
                x1, y1, x2, y2 = v
                rev = x1 > x2 or y1 > y2
                found.append((m.start(), Box(min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2), rev)))
                taken.append((m.start(), m.end()))
        found.sort(key=lambda x: x[0])
        return [b for _, b in found], invalid
    except Exception:  # pragma: no cover
        return [], True


def parse_boxes(
    text: Any, *, allow_unclosed: bool = True, fallback_to_text: bool = True, tag: str = "answer"
) -> Parsed[list[Box]]:
    blk = extract_answer(text, tag=tag, allow_unclosed=allow_unclosed, fallback_to_text=fallback_to_text)
    if blk.status is not ParseStatus.OK:
        return Parsed(None, blk.status, None)
    boxes, invalid = find_boxes(blk.content)
    if boxes:
        return Parsed(boxes, ParseStatus.OK, blk.source)
    return Parsed(None, ParseStatus.INVALID if invalid else _empty_or_nomatch(blk.content), blk.source)


def parse_box(
    text: Any, *, which: Which = "auto", allow_unclosed: bool = True, fallback_to_text: bool = True, tag: str = "answer"
) -> Parsed[Box]:
    """One box (REC): first box in the answer block, last in the fallback text (``which="auto"``)."""
    p = parse_boxes(text, allow_unclosed=allow_unclosed, fallback_to_text=fallback_to_text, tag=tag)
    if not p.ok:
        return Parsed(None, p.status, p.source)
    return Parsed(_pick(p.value, which, p.source), ParseStatus.OK, p.source)
