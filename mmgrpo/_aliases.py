"""Old import paths of the VLM front-end, kept working as aliases of the new ones.

The VLM front-end moved under :mod:`mmgrpo.vlm` and the synthetic generators under :mod:`mmgrpo.synthetic`, so that
the top level of ``mmgrpo`` is only what both front-ends share.  Code outside this repository may still write
``from mmgrpo.train.trainer import GRPOTrainer`` or ``import mmgrpo.models.rollout``: a finder at the front of
``sys.meta_path`` resolves every old name (and every submodule below it) to the module of the new name, so both names
give the SAME module object (monkeypatching through either one is seen by both).  Nothing is imported until an old
name is; the table is the whole mapping.  New code in this repository uses the new paths only.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

# old dotted prefix -> new dotted prefix; the longest matching old prefix wins
ALIASES: dict[str, str] = {
    "mmgrpo.train": "mmgrpo.vlm.train",
    "mmgrpo.models": "mmgrpo.vlm.models",
    "mmgrpo.rewards": "mmgrpo.vlm.rewards",
    "mmgrpo.methods": "mmgrpo.vlm.methods",
    "mmgrpo.cli": "mmgrpo.vlm.cli",
    "mmgrpo.config": "mmgrpo.vlm.config",
    "mmgrpo.sft": "mmgrpo.vlm.sft",
    "mmgrpo.trainer": "mmgrpo.vlm.trainer",
    "mmgrpo.utils.timeline": "mmgrpo.vlm.timeline",
    "mmgrpo.data": "mmgrpo.vlm.data",
    "mmgrpo.data.synthetic_t2i": "mmgrpo.synthetic.t2i",
    "mmgrpo.data.synthetic_t2v": "mmgrpo.synthetic.t2v",
    "mmgrpo.data.synthetic_tvg": "mmgrpo.synthetic.tvg",
    "mmgrpo.data.synthetic_grounding": "mmgrpo.synthetic.grounding",
    # ``from mmgrpo.data import synthetic_t2i`` looks the submodule up under the real name of ``mmgrpo.data``
    # (``mmgrpo.vlm.data``), so that spelling needs these too.
    "mmgrpo.vlm.data.synthetic_t2i": "mmgrpo.synthetic.t2i",
    "mmgrpo.vlm.data.synthetic_t2v": "mmgrpo.synthetic.t2v",
    "mmgrpo.vlm.data.synthetic_tvg": "mmgrpo.synthetic.tvg",
    "mmgrpo.vlm.data.synthetic_grounding": "mmgrpo.synthetic.grounding",
}


def new_name(old: str) -> str | None:
    """The new dotted name of module ``old``, or None when ``old`` is not an old path."""
    best = max((p for p in ALIASES if old == p or old.startswith(p + ".")), key=len, default=None)
    return None if best is None else ALIASES[best] + old[len(best):]


class _AliasLoader(importlib.abc.Loader):
    """Hands the import system the already-imported target module instead of executing anything."""

    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self._target_spec = module.__spec__  # the import system overwrites __spec__ with the alias spec: restore it
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self._target_spec

    def get_code(self, fullname):  # ``python -m mmgrpo.cli`` (runpy) runs the target's code
        return importlib.util.find_spec(self.target).loader.get_code(self.target)

    def is_package(self, fullname) -> bool:
        return importlib.util.find_spec(self.target).submodule_search_locations is not None


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = new_name(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new))


def install() -> None:
    """Put the alias finder first on ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
