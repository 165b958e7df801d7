"""Paths in shipped records without the build machine in them.

Build scripts write what they ran (``sft_report.json``, ``build_info.json``, ``mmgrpo_demo.json``, benchmark JSON)
and those files are committed. An absolute path there names a folder of the machine the file was built on
(``/home/<user>/...``, a scratch folder under ``/tmp``), which means nothing elsewhere. These functions rewrite
absolute paths before they are recorded:

* a path inside the repository becomes relative to the repository (``data/checkpoints/tiny_flow``);
* any other path becomes relative to the folder that holds the output folder (``anchor``): a build that writes
  ``/scratch/g16/L4`` from ``/scratch/g16/g3k`` and ``--init /scratch/g16/S2`` records ``L4``, ``g3k`` and ``S2``,
  so chained stages still name each other;
* the Python interpreter becomes ``python``.

Relative paths are kept as given. ``tests/test_machine_paths.py`` checks that no tracked file holds a machine path.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

REPO = Path(__file__).resolve().parents[2]


def portable_path(path: str | os.PathLike, anchor: Optional[str | os.PathLike] = None,
                  repo: str | os.PathLike = REPO) -> str:
    """``path`` as recorded: relative to ``repo`` if inside it, else relative to ``anchor`` (default: the current
    working directory); relative paths unchanged."""
    p = os.fspath(path)
    if not os.path.isabs(p):
        return p
    p = os.path.normpath(p)
    repo_s = os.path.normpath(os.fspath(repo))
    if p == repo_s:
        return "."
    if p.startswith(repo_s + os.sep):
        return os.path.relpath(p, repo_s)
    return os.path.relpath(p, os.path.normpath(os.fspath(anchor)) if anchor is not None else os.getcwd())


def _is_python(arg: str) -> bool:
    return arg == sys.executable or os.path.basename(arg).startswith("python")


def portable_argv(argv: Iterable[str], anchor: Optional[str | os.PathLike] = None,
                  repo: str | os.PathLike = REPO) -> list[str]:
    """A command line with every absolute path (also in ``--key=/path``) rewritten by :func:`portable_path`, and the
    interpreter (a first word naming python) as ``python``."""
    out = []
    for i, a in enumerate(argv):
        a = str(a)
        if i == 0 and os.path.isabs(a) and _is_python(a):
            out.append("python")
        elif a.startswith("--") and "=" in a and os.path.isabs(a.split("=", 1)[1]):
            key, val = a.split("=", 1)
            out.append(f"{key}={portable_path(val, anchor, repo)}")
        elif os.path.isabs(a):
            out.append(portable_path(a, anchor, repo))
        else:
            out.append(a)
    return out


def portable_record(obj: Any, anchor: Optional[str | os.PathLike] = None,
                    repo: str | os.PathLike = REPO) -> Any:
    """``obj`` (dicts, lists, tuples, strings, numbers) with every string that is an absolute path rewritten; any
    other value unchanged (numbers are never touched)."""
    if isinstance(obj, dict):
        return {k: portable_record(v, anchor, repo) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(portable_record(v, anchor, repo) for v in obj)
    if isinstance(obj, os.PathLike):
        obj = os.fspath(obj)
    if isinstance(obj, str) and os.path.isabs(obj) and "\n" not in obj:
        return portable_path(obj, anchor, repo)
    return obj
