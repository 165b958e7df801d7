"""Dataclass configs: defaults < YAML file < ``key=value`` overrides, with type-directed parsing.

Configs are (nested) ``@dataclass`` classes whose fields all have defaults and document themselves with
``field(metadata={"help": "..."})``::

    cfg = load_config(TrainConfig, "run.yaml", ["train.lr=1e-5", "model.lora.rank=8"])

Parsing rules (the same for YAML values and ``key=value`` strings):

* ``int``: ``3``, ``-2``, ``1_000``, and integral floats such as ``1e3``; ``float``: anything ``float()`` takes
  (``1e-5``, ``nan``, ``inf``) plus YAML's ``.inf``/``.nan``; ``bool``: ``true/false/1/0/yes/no/on/off``
  (any case); ``str``: the text as written.
* ``Optional[X]``: ``none``/``null``/``~`` (any case, *unquoted*) or an empty value mean ``None``; a quoted
  ``'none'`` stays a string.
* ``list[X]``/``tuple[X, ...]``/``tuple[X, Y]``: YAML flow syntax ``[1, 2]`` (or ``1,2``); ``dict[K, V]``:
  ``{a: 1}``; ``Literal[...]``: one of the choices; ``Any``: YAML semantics. These are the types the configs use;
  any other field type is a ``TypeError``-like ``unsupported field type`` error naming the key.
* Nested dataclasses take a mapping (YAML) or are addressed with dotted keys (``model.lora.rank=8``); a field of type
  ``Optional[SubConfig]`` that is ``None`` is created from ``SubConfig()`` when one of its keys is set.

:func:`check_choices` validates ``Literal`` fields of a config built in Python (the loader already checks them when
parsing). Why this module and not a library: docs/config.md ("Would a library do this with less code?").

Errors are ``ValueError`` naming the key (and the YAML file), the value and the expected type; unknown keys list
close matches. The final config is constructed once from the merged values, so ``__post_init__`` validation sees
the final values. This module imports nothing heavy (no torch): CLIs can print ``--help`` instantly.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import os
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence, TypeVar, Union

import yaml

from mmgrpo.utils._fsio import atomic_write_text

__all__ = [
    "load_config",
    "apply_overrides",
    "config_to_dict",
    "save_config",
    "config_to_yaml",
    "config_argparser",
    "parse_config_cli",
    "iter_fields",
    "fields_help",
    "check_choices",
]

T = TypeVar("T")

_NULL_WORDS = frozenset({"none", "null", "~", ""})
_TRUE_WORDS = frozenset({"true", "yes", "on", "1", "y", "t"})
_FALSE_WORDS = frozenset({"false", "no", "off", "0", "n", "f"})
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*$")


# ---------------------------------------------------------------------------------------------------------------
# Raw YAML: every scalar is kept as text plus "was it quoted", so that parsing is directed by the field type
# (YAML 1.1 would otherwise turn `1e-5` into a string, `no` into False and `0123` into 83 before we see them).
# ---------------------------------------------------------------------------------------------------------------
class _Scalar(str):
    """A scalar's source text. ``quoted``: written with quotes/block style (never null, never re-typed)."""

    quoted: bool

    def __new__(cls, text: str, quoted: bool = False) -> "_Scalar":
        obj = super().__new__(cls, text)
        obj.quoted = quoted
        return obj

    def __reduce__(self):  # keep picklable/copyable
        return (_Scalar, (str(self), self.quoted))


class _RawLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        # PyYAML keeps the last of two equal keys in silence: a recipe with two `run:` sections lost the first
        # one's settings. Equal keys of one mapping are an error naming both lines (merge keys `<<` may still be
        # overridden: that is what they are for).
        if isinstance(node, yaml.MappingNode):
            _check_unique_keys(node)
        return super().construct_mapping(node, deep=deep)


def _check_unique_keys(node: yaml.MappingNode) -> None:
    seen: dict[str, yaml.Node] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        first = seen.setdefault(key_node.value, key_node)
        if first is not key_node:
            raise yaml.constructor.ConstructorError(
                f"while reading the mapping that starts on line {node.start_mark.line + 1}", node.start_mark,
                f"duplicate key {key_node.value!r} (first on line {first.start_mark.line + 1}): a second section "
                "or key would silently replace the first; merge them into one", key_node.start_mark)


def _check_dotted_duplicates(node: Any, prefix: str = "", seen: dict | None = None) -> None:
    """The same config key written twice in one file in two spellings (``run.bf16: true`` and ``run: {bf16:
    false}``): an error naming both lines, as for equal keys."""
    seen = {} if seen is None else seen
    if not isinstance(node, yaml.MappingNode):
        return
    for key_node, value in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        full = prefix + key_node.value.strip()
        if isinstance(value, yaml.MappingNode):
            _check_dotted_duplicates(value, full + ".", seen)
            continue
        first = seen.setdefault(full, key_node)
        if first is not key_node:
            raise yaml.constructor.ConstructorError(
                None, None, f"config key {full!r} is set twice (first on line {first.start_mark.line + 1}, in another "
                f"spelling): keep one", key_node.start_mark)


# Keep only the merge-key resolver; everything else resolves to str and reaches _construct_raw.
_RawLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag == "tag:yaml.org,2002:merge"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_RawLoader.yaml_implicit_resolvers = {k: v for k, v in _RawLoader.yaml_implicit_resolvers.items() if v}


def _construct_raw(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> _Scalar:
    return _Scalar(node.value, quoted=node.style in ("'", '"', "|", ">"))


_RawLoader.add_constructor("tag:yaml.org,2002:str", _construct_raw)


def _raw_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_RawLoader)


def _yaml_resolve_plain(text: str) -> Any:
    """What standard (safe) YAML would make of a plain scalar ``text``."""
    loader = yaml.SafeLoader("")
    try:
        tag = loader.resolve(yaml.ScalarNode, text, (True, False))
        return loader.construct_object(yaml.ScalarNode(tag, text), deep=True)
    finally:
        loader.dispose()


class _ConfigDumper(yaml.SafeDumper):
    pass


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    # Strings that our loader would read as null must be quoted to survive a round trip.
    if any(ch in "\x85\u2028\u2029\ufeff" for ch in data):
        # Unicode line breaks would be emitted raw (with allow_unicode) and read back as newlines: escape them.
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style='"')
    if data.strip().lower() in _NULL_WORDS:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="'")
    return dumper.represent_str(data)


_ConfigDumper.add_representer(str, _represent_str)
_ConfigDumper.add_representer(_Scalar, _represent_str)


# ---------------------------------------------------------------------------------------------------------------
# Types
# ---------------------------------------------------------------------------------------------------------------
def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _union_args(tp: Any) -> tuple | None:
    origin = typing.get_origin(tp)
    if origin is Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        return typing.get_args(tp)
    return None


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    """``Optional[X]`` -> ``(X, True)``; a bigger union keeps its other members."""
    args = _union_args(tp)
    if args is None or type(None) not in args:
        return tp, False
    rest = tuple(a for a in args if a is not type(None))
    if len(rest) == 1:
        return rest[0], True
    return Union[rest], True  # type: ignore[return-value]


_HINTS_CACHE: dict[type, dict[str, Any]] = {}


def _type_hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS_CACHE:
        try:
            _HINTS_CACHE[cls] = typing.get_type_hints(cls)
        except Exception as exc:  # unresolved forward reference etc.: a programming error in the config class
            raise TypeError(f"cannot resolve type hints of config class {cls.__qualname__}: {exc}") from exc
    return _HINTS_CACHE[cls]


def _init_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init]


def type_name(tp: Any) -> str:
    """Readable name of a field type, e.g. ``Optional[list[int]]``, ``{'sd3', 'flux'}``."""
    if tp is Any:
        return "any"
    if tp is type(None):
        return "none"
    args = _union_args(tp)
    if args is not None:
        inner, opt = _strip_optional(tp)
        if opt:
            return f"Optional[{type_name(inner)}]"
        return " | ".join(type_name(a) for a in args)
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "{" + ", ".join(repr(c) for c in typing.get_args(tp)) + "}"
    if origin is not None:
        args = typing.get_args(tp)
        oname = getattr(origin, "__name__", str(origin))
        if not args:
            return oname
        parts = ["..." if a is Ellipsis else type_name(a) for a in args]
        return f"{oname}[{', '.join(parts)}]"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp)


# ---------------------------------------------------------------------------------------------------------------
# Value parsing
# ---------------------------------------------------------------------------------------------------------------
class _BadValue(Exception):
    """Internal: raised by the coercers; turned into a ValueError naming the key by the caller."""


def _text(v: Any) -> str | None:
    return str(v) if isinstance(v, str) else None


def _plain_null(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, _Scalar):
        return (not v.quoted) and v.strip().lower() in _NULL_WORDS
    return False


def _parse_int(v: Any) -> int:
    if isinstance(v, bool):
        raise _BadValue("a bool is not an int")
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if math.isfinite(v) and v.is_integer():
            return int(v)
        raise _BadValue("not an integral number")
    s = _text(v)
    if s is None:
        raise _BadValue(f"got {type(v).__name__}")
    s = s.strip()
    try:
        return int(s, 10)
    except ValueError:
        pass
    try:
        f = float(s)
    except ValueError:
        raise _BadValue("not an integer") from None
    if math.isfinite(f) and f.is_integer() and abs(f) < 2**53:  # e.g. 1e3; beyond 2**53 floats lose digits
        return int(f)
    raise _BadValue("not an integer")


def _parse_float(v: Any) -> float:
    if isinstance(v, bool):
        raise _BadValue("a bool is not a float")
    if isinstance(v, (int, float)):
        return float(v)
    s = _text(v)
    if s is None:
        raise _BadValue(f"got {type(v).__name__}")
    s = s.strip()
    low = s.lower()
    yaml_special = {".inf": math.inf, "+.inf": math.inf, "-.inf": -math.inf, ".nan": math.nan}
    if low in yaml_special:
        return yaml_special[low]
    try:
        return float(s)
    except ValueError:
        raise _BadValue("not a number") from None


def _parse_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    s = _text(v)
    if s is None:
        raise _BadValue(f"got {type(v).__name__}")
    low = s.strip().lower()
    if low in _TRUE_WORDS:
        return True
    if low in _FALSE_WORDS:
        return False
    raise _BadValue("expected one of true/false/1/0/yes/no/on/off")


def _parse_str(v: Any) -> str:
    if isinstance(v, str):
        return str(v)
    if isinstance(v, (int, float)) and not isinstance(v, bool):  # explicit YAML tags (!!int) only
        return str(v)
    raise _BadValue(f"got {type(v).__name__}")


def _to_plain(v: Any) -> Any:
    """Raw YAML value -> what standard YAML would give (for ``Any`` fields)."""
    if isinstance(v, _Scalar):
        if v.quoted:
            return str(v)
        try:
            return _yaml_resolve_plain(str(v))
        except Exception:  # e.g. an impossible date that the timestamp resolver matched: keep the text
            return str(v)
    if isinstance(v, list):
        return [_to_plain(x) for x in v]
    if isinstance(v, dict):
        return {_to_plain(k): _to_plain(x) for k, x in v.items()}
    return v


def _maybe_yaml(v: Any, from_cli: bool) -> Any:
    """Command-line text for a container type is YAML flow syntax: parse it (raw)."""
    if from_cli and isinstance(v, _Scalar) and not v.quoted:
        try:
            return _raw_yaml(str(v))
        except Exception as exc:  # YAMLError, or errors of explicitly tagged scalars (`!!int x`)
            msg = " ".join(str(exc).split())
            raise _BadValue(f"invalid YAML: {msg}") from None
    return v


def _coerce(v: Any, tp: Any, from_cli: bool = False) -> Any:
    """Convert a raw value (``_Scalar``/list/dict from the raw YAML loader, or a python object) to type ``tp``."""
    if tp is Any or tp is object:
        return _to_plain(_maybe_yaml(v, from_cli))
    inner, optional = _strip_optional(tp)
    if optional:
        if _plain_null(v):
            return None
        return _coerce(v, inner, from_cli)
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        for c in choices:
            if isinstance(v, str) and isinstance(c, str):
                if str(v) == c:
                    return c
                continue
            try:
                if type(c)(_coerce(v, type(c))) == c:  # type: ignore[call-arg]
                    return c
            except (_BadValue, TypeError, ValueError):
                continue
        hint = ""
        if isinstance(v, str):
            close = difflib.get_close_matches(str(v), [str(c) for c in choices], n=1)
            if close:
                hint = f" (did you mean {close[0]!r}?)"
        raise _BadValue(f"not one of {list(choices)}{hint}")
    if tp is bool:
        return _parse_bool(v)
    if tp is int:
        return _parse_int(v)
    if tp is float:
        return _parse_float(v)
    if tp is str:
        return _parse_str(v)
    if origin in (list, tuple) or tp in (list, tuple):
        container = origin or tp
        v = _maybe_yaml(v, from_cli)
        if isinstance(v, str):
            s = str(v).strip()
            if s in ("", "[]"):
                items: list = []
            else:
                items = [_Scalar(p.strip()) for p in s.split(",")]
        elif isinstance(v, (list, tuple)):
            items = list(v)
        else:
            raise _BadValue(f"expected a list, got {type(v).__name__}")
        args = typing.get_args(tp)
        if container is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            if len(items) != len(args):
                raise _BadValue(f"expected {len(args)} items, got {len(items)}")
            return tuple(_coerce_item(x, a, i) for i, (x, a) in enumerate(zip(items, args)))
        el = args[0] if args else Any
        out = [_coerce_item(x, el, i) for i, x in enumerate(items)]
        return tuple(out) if container is tuple else out
    if origin is dict or tp is dict:
        v = _maybe_yaml(v, from_cli)
        if isinstance(v, str) and not str(v).strip():
            v = {}
        if not isinstance(v, dict):
            raise _BadValue(f"expected a mapping, got {type(v).__name__}")
        args = typing.get_args(tp)
        kt, vt = (args if len(args) == 2 else (Any, Any))
        out = {}
        for k, x in v.items():
            try:
                ck = _coerce(k, kt)
                cx = _coerce(x, vt)
            except _BadValue as exc:
                raise _BadValue(f"entry {str(k)!r}: {exc}") from None
            out[ck] = cx
        return out
    if isinstance(tp, type) and isinstance(v, tp):
        return v
    raise _BadValue(f"unsupported field type {type_name(tp)}")


def _coerce_item(x: Any, tp: Any, i: int) -> Any:
    try:
        return _coerce(x, tp)
    except _BadValue as exc:
        raise _BadValue(f"item {i}: {exc}") from None


def check_choices(cfg: Any, prefix: str = "") -> None:
    """Raise ``ValueError`` naming the key and the allowed values if a ``Literal`` field of the (nested) config
    ``cfg`` holds another value: the check of :func:`load_config`, for configs built or edited in Python."""
    hints = _type_hints(type(cfg))
    for f in _init_fields(type(cfg)):
        v = getattr(cfg, f.name)
        tp, optional = _strip_optional(hints[f.name])
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            check_choices(v, f"{prefix}{f.name}.")
        elif typing.get_origin(tp) is Literal and not (optional and v is None):
            choices = typing.get_args(tp)
            if not any(v == c and type(v) is type(c) for c in choices):
                raise ValueError(f"config key '{prefix}{f.name}': invalid value {v!r}, expected one of {list(choices)}")


# ---------------------------------------------------------------------------------------------------------------
# Merge tree: field values of a dataclass with nested dataclasses as sub-trees; built into instances at the end.
# ---------------------------------------------------------------------------------------------------------------
def _default_instance(cls: type) -> Any:
    try:
        return cls()
    except TypeError as exc:
        missing = [
            f.name
            for f in _init_fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
        ]
        raise TypeError(
            f"config class {cls.__qualname__} must be constructible without arguments "
            f"(fields without defaults: {missing})"
        ) from exc


class _Tree:
    def __init__(self, cls: type, values: dict[str, Any]):
        self.cls = cls
        self.values = values
        self.hints = _type_hints(cls)
        self.fields = {f.name: f for f in _init_fields(cls)}
        self.sources: dict[str, str | None] = {}  # field -> the file that set it (None: a key=value override)

    def source_of(self, key: str) -> str | None:
        """The file that set the dotted ``key`` last (None: a default or a ``key=value`` override)."""
        name, _, rest = key.partition(".")
        sub = self.values.get(name)
        return sub.source_of(rest) if rest and isinstance(sub, _Tree) else self.sources.get(name)

    @classmethod
    def from_instance(cls, obj: Any) -> "_Tree":
        vals: dict[str, Any] = {}
        for f in _init_fields(type(obj)):
            v = getattr(obj, f.name)
            vals[f.name] = cls.from_instance(v) if dataclasses.is_dataclass(v) and not isinstance(v, type) else v
        return cls(type(obj), vals)

    def build(self) -> Any:
        kwargs = {k: (v.build() if isinstance(v, _Tree) else v) for k, v in self.values.items()}
        return self.cls(**kwargs)


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    out = []
    hints = _type_hints(cls)
    for f in _init_fields(cls):
        name = prefix + f.name
        out.append(name)
        inner, _ = _strip_optional(hints[f.name])
        if _is_dataclass_type(inner):
            out.extend(_all_keys(inner, name + "."))
    return out


def _unknown_key_error(key: str, root_cls: type, source: str | None, section_keys: Iterable[str]) -> ValueError:
    where = f"{source}: " if source else ""
    # keys that moved: the root config's ``__config_moved__`` maps an old key or prefix (a section, or one ending in
    # "_" or ".") to its new place; the old key is an error naming the new one, never an alias
    for old, new in getattr(root_cls, "__config_moved__", {}).items():
        if key == old or key.startswith(old if old.endswith(("_", ".")) else old + "."):
            return ValueError(f"{where}config key '{key}' moved: it is now '{new}{key[len(old):]}'")
    candidates = _all_keys(root_cls)
    close = difflib.get_close_matches(key, candidates, n=3, cutoff=0.6)
    last = key.rsplit(".", 1)[-1]
    for c in candidates:  # `lr=` when the field is `train.lr`
        if c.rsplit(".", 1)[-1] == last and c not in close:
            close.append(c)
    msg = f"{where}unknown config key '{key}'"
    if close:
        msg += f"; did you mean: {', '.join(repr(c) for c in close[:5])}?"
    else:
        keys = sorted(section_keys)
        msg += f"; valid keys here: {', '.join(keys[:30])}{' ...' if len(keys) > 30 else ''}"
    return ValueError(msg)


def _describe(v: Any) -> str:
    if isinstance(v, _Scalar):
        return repr(str(v))
    return repr(_to_plain(v)) if isinstance(v, (list, dict)) else repr(v)


def _bad_value_error(key: str, v: Any, tp: Any, exc: Exception, source: str | None) -> ValueError:
    where = f"{source}: " if source else ""
    return ValueError(f"{where}config key '{key}': invalid value {_describe(v)}, expected {type_name(tp)} ({exc})")


def _set_path(
    tree: _Tree, parts: list[str], raw: Any, *, root_cls: type, full_key: str, source: str | None, from_cli: bool
) -> None:
    name = parts[0]
    if name not in tree.fields:
        raise _unknown_key_error(full_key, root_cls, source, tree.fields)
    tp = tree.hints[name]
    inner, optional = _strip_optional(tp)
    if len(parts) > 1:
        if _is_dataclass_type(inner):
            sub = tree.values.get(name)
            if sub is None:  # Optional[SubConfig] currently None: create the default sub-config to set into
                sub = _Tree.from_instance(_default_instance(inner))
                tree.values[name] = sub
            elif not isinstance(sub, _Tree):
                sub = _Tree.from_instance(sub)
                tree.values[name] = sub
            _set_path(sub, parts[1:], raw, root_cls=root_cls, full_key=full_key, source=source, from_cli=from_cli)
            return
        origin = typing.get_origin(inner)
        if origin is dict or inner is dict:  # dotted key into a dict field: set one entry
            args = typing.get_args(inner)
            kt, vt = (args if len(args) == 2 else (Any, Any))
            cur = tree.values.get(name)
            cur = dict(cur) if isinstance(cur, dict) else {}
            entry = ".".join(parts[1:])
            try:
                cur[_coerce(_Scalar(entry), kt)] = _coerce(raw, vt, from_cli)
            except _BadValue as exc:
                raise _bad_value_error(full_key, raw, vt, exc, source) from None
            tree.values[name] = cur
            tree.sources[name] = source
            return
        prefix = full_key[: len(full_key) - len(".".join(parts[1:])) - 1]
        raise _unknown_key_error(full_key, root_cls, source, [f"{prefix} is a {type_name(tp)}, not a section"])
    # leaf (or a whole sub-config given as a mapping)
    if _is_dataclass_type(inner):
        if _plain_null(raw):
            if optional:
                tree.values[name] = None
                tree.sources[name] = source
            # else: an empty section (`train:` with only comments under it) keeps its current values
            return
        try:
            val = _maybe_yaml(raw, from_cli)
        except _BadValue as exc:
            raise _bad_value_error(full_key, raw, tp, exc, source) from None
        if isinstance(val, dict):
            sub = tree.values.get(name)
            if not isinstance(sub, _Tree):
                sub = _Tree.from_instance(sub if sub is not None else _default_instance(inner))
                tree.values[name] = sub
            _apply_mapping(sub, val, prefix=full_key + ".", source=source, root_cls=root_cls)
            return
        raise _bad_value_error(full_key, raw, tp, _BadValue(f"expected a mapping of {inner.__name__} fields"), source)
    try:
        tree.values[name] = _coerce(raw, tp, from_cli)
        tree.sources[name] = source
    except _BadValue as exc:
        # values that were renamed: the root config's ``__config_renamed_values__`` maps a key to {old value: the
        # message naming the new one}; the old value is an error with that pointer, never an alias
        moved = getattr(root_cls, "__config_renamed_values__", {}).get(full_key, {})
        if isinstance(raw, str) and str(raw) in moved:
            where = f"{source}: " if source else ""
            raise ValueError(f"{where}config key '{full_key}': {moved[str(raw)]}") from None
        raise _bad_value_error(full_key, raw, tp, exc, source) from None
    except RecursionError:
        raise _bad_value_error(full_key, raw, tp, _BadValue("nested too deeply"), source) from None


def _apply_mapping(
    tree: _Tree, mapping: dict, *, prefix: str, source: str | None, root_cls: type | None = None
) -> None:
    root_cls = root_cls or tree.cls
    for k, v in mapping.items():
        key = str(k).strip() if isinstance(k, str) else str(_to_plain(k))
        full = prefix + key
        if not _KEY_RE.match(key):
            raise ValueError(f"{source + ': ' if source else ''}invalid config key {full!r}")
        _set_path(tree, key.split("."), v, root_cls=root_cls, full_key=full, source=source, from_cli=False)


def _split_override(item: str) -> tuple[str, str]:
    if not isinstance(item, str):
        raise ValueError(f"override must be a 'key=value' string, got {type(item).__name__}: {item!r}")
    if "=" not in item:
        raise ValueError(f"override {item!r} is not of the form key=value")
    key, value = item.split("=", 1)
    key = key.strip()
    if key.startswith("--"):  # tolerate `--train.lr=1e-5`
        key = key[2:]
    if not _KEY_RE.match(key):
        raise ValueError(f"override {item!r}: invalid key {key!r} (expected dotted.field.name)")
    return key, value


# ---------------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------------
def _read_yaml_file(path: str | os.PathLike) -> dict:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"config file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
        data = _raw_yaml(text)
        _check_dotted_duplicates(yaml.compose(text, Loader=_RawLoader))
    except yaml.MarkedYAMLError as exc:  # name file:line first; PyYAML's own text calls the file "<unicode string>"
        mark = exc.problem_mark or exc.context_mark
        where = f"{p}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(p)
        context = f" ({exc.context})" if exc.context else ""
        raise ValueError(f"{where}: invalid YAML: {exc.problem}{context}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{p}: invalid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{p}: top level must be a mapping of config keys, got {type(data).__name__}")
    return data


def load_config(
    cls: type[T],
    yaml_path: str | os.PathLike | None = None,
    overrides: Iterable[str] = (),
) -> T:
    """Build ``cls`` from its defaults, then the YAML file ``yaml_path`` (if given), then ``key=value`` overrides.

    YAML may nest sections (``train: {lr: 1e-5}``) or use dotted keys (``train.lr: 1e-5``). Raises ``ValueError``
    for unknown keys (with close matches), unparsable values (naming key, value and type) and malformed overrides;
    ``FileNotFoundError`` for a missing YAML file.
    """
    if not _is_dataclass_type(cls):
        raise TypeError(f"load_config expects a dataclass type, got {cls!r}")
    if isinstance(overrides, str):
        overrides = [overrides]
    tree = _Tree.from_instance(_default_instance(cls))
    if yaml_path is not None and str(yaml_path) != "":
        _apply_mapping(tree, _read_yaml_file(yaml_path), prefix="", source=str(yaml_path))
    for item in overrides:
        key, value = _split_override(item)
        _set_path(
            tree, key.split("."), _Scalar(value), root_cls=cls, full_key=key, source=None, from_cli=True
        )
    try:
        return tree.build()
    except ValueError as exc:
        # a check in a __post_init__ (a registry lookup, a range) names only its key: add the file that set it
        m = re.match(r"config key '([^']+)'", str(exc))
        if m and (source := tree.source_of(m.group(1))):
            raise ValueError(f"{source}: {exc}") from exc
        raise


def apply_overrides(cfg: T, overrides: Iterable[str]) -> T:
    """A new config: ``cfg`` with ``key=value`` overrides applied (``cfg`` itself is unchanged)."""
    tree = _Tree.from_instance(cfg)
    for item in ([overrides] if isinstance(overrides, str) else overrides):
        key, value = _split_override(item)
        _set_path(tree, key.split("."), _Scalar(value), root_cls=type(cfg), full_key=key, source=None, from_cli=True)
    return tree.build()


def config_to_dict(cfg: Any) -> Any:
    """Nested plain-python (YAML/JSON-safe) view: dataclasses -> dicts, tuples -> lists."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: config_to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.init}
    if isinstance(cfg, (list, tuple)):
        return [config_to_dict(x) for x in cfg]
    if isinstance(cfg, dict):
        return {config_to_dict(k): config_to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, _Scalar):
        return str(cfg)
    return cfg


def config_to_yaml(cfg: Any) -> str:
    return yaml.dump(
        config_to_dict(cfg), Dumper=_ConfigDumper, sort_keys=False, default_flow_style=False, allow_unicode=True
    )


def save_config(cfg: Any, path: str | os.PathLike) -> Path:
    """Write ``cfg`` as YAML (atomically); ``load_config(type(cfg), path) == cfg``."""
    from mmgrpo.utils.write_errors import naming_write_errors

    with naming_write_errors("the config", path):
        return atomic_write_text(path, config_to_yaml(cfg))


# ---------------------------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------------------------
def _fmt_default(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        s = str(v)
        return repr(s) if (not s or s != s.strip() or " " in s or s.lower() in _NULL_WORDS) else s
    if isinstance(v, (list, tuple, dict)):
        return yaml.dump(
            config_to_dict(v), Dumper=_ConfigDumper, default_flow_style=True, width=10**6, allow_unicode=True
        ).strip()
    return repr(v)


def iter_fields(cls: type, prefix: str = "", default_obj: Any = None):
    """Yield ``(dotted_name, type, default, help, is_section)`` for every field, recursively (sections first)."""
    if default_obj is None:
        try:
            default_obj = cls()
        except Exception:
            default_obj = None
    hints = _type_hints(cls)
    for f in _init_fields(cls):
        tp = hints[f.name]
        if default_obj is not None:
            default = getattr(default_obj, f.name)
        elif f.default is not dataclasses.MISSING:
            default = f.default
        else:
            default = dataclasses.MISSING
        help_text = str(f.metadata.get("help", "")) if f.metadata else ""
        inner, _ = _strip_optional(tp)
        name = prefix + f.name
        if _is_dataclass_type(inner):
            yield name, tp, default, help_text, True
            sub_obj = default if dataclasses.is_dataclass(default) else None
            yield from iter_fields(inner, name + ".", sub_obj)
        else:
            yield name, tp, default, help_text, False


def fields_help(cls: type, width: int = 100) -> str:
    """Text listing every config field: dotted name, type, default and help."""
    import textwrap

    lines = [
        "config fields (set as key=value; precedence: defaults < --config YAML < key=value;",
        "lists as [a,b], none/null for Optional):",
    ]
    for name, tp, default, help_text, is_section in iter_fields(cls):
        depth = name.count(".")
        ind = "  " + "  " * depth
        if is_section:
            head = f"{ind}{name}:  [section {type_name(tp)}]"
            if default is None:
                head += " (default: none)"
        else:
            d = "(required)" if default is dataclasses.MISSING else _fmt_default(default)
            head = f"{ind}{name}  ({type_name(tp)}, default: {d})"
        lines.append(head)
        if help_text:
            lines.extend(
                textwrap.wrap(help_text, width=width, initial_indent=ind + "    ", subsequent_indent=ind + "    ")
            )
    return "\n".join(lines)


def config_argparser(
    cls: type, prog: str | None = None, description: str | None = None
) -> argparse.ArgumentParser:
    """``argparse`` parser with ``--config FILE``, ``--print-config`` and positional ``key=value`` overrides.

    ``--help`` lists every field of ``cls`` recursively (dotted name, type, default, help text).
    """
    epilog = fields_help(cls)
    if "%(" in epilog:  # argparse %-formats an epilog that contains '%(prog)': escape every '%'
        epilog = epilog.replace("%", "%%")
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", metavar="FILE", default=None, help="YAML config file (applied over defaults)")
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved config as YAML and exit"
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.lr=1e-5 model.lora.rank=8"
    )
    return parser


def parse_config_cli(
    cls: type[T],
    argv: Sequence[str] | None = None,
    prog: str | None = None,
    description: str | None = None,
) -> T:
    """Parse ``argv`` (default ``sys.argv[1:]``) with :func:`config_argparser` and return the config.

    Config errors exit with status 2 and the message (argparse convention); ``--print-config`` prints and exits 0.
    """
    parser = config_argparser(cls, prog=prog, description=description)
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        cfg = load_config(cls, args.config, args.overrides)
    except (ValueError, FileNotFoundError) as exc:
        parser.error(str(exc))
    if args.print_config:
        sys.stdout.write(config_to_yaml(cfg))
        parser.exit(0)
    return cfg
