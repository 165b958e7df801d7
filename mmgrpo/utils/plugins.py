"""User code by import path: the one plugin mechanism of both front-ends.

A setting whose value is ``'package.module:attr'`` (the flow front-end's ``reward.weights`` / ``reward.pairwise_scorer``,
the VLM front-end's ``reward.weights``) names an object that is imported and used as the run's code. Importing runs the
module's top-level code and the object is then called: a config holding such an entry is code, so only run configs
and overrides you trust (``{'os:system': 1}`` would call ``os.system``).
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["is_import_path", "import_object"]


def is_import_path(name: str) -> bool:
    """``name`` has the form ``'package.module:attr'`` (a built-in registry name never contains ':')."""
    mod, sep, attr = str(name).partition(":")
    return bool(sep)


def import_object(spec: str, setting: str = "import path") -> Any:
    """The object ``attr`` of module ``package.module`` for ``spec = 'package.module:attr'`` (``attr`` may be dotted:
    ``'pkg.mod:Class.method'``). Errors name ``setting`` (the config field) and what is wrong."""
    mod, _, attr = str(spec).partition(":")
    if not mod or not attr:
        raise ValueError(f"{setting}: {spec!r} is not an import path 'package.module:attr'")
    try:
        obj = importlib.import_module(mod)
    except ImportError as e:
        raise ValueError(f"{setting}: cannot import module {mod!r} of {spec!r}: {e}") from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{setting}: {spec!r}: module {mod!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj
