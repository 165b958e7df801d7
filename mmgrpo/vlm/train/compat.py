"""Trainer attributes that moved into ``mmgrpo.vlm.methods`` modules, kept so existing callers keep working."""
from __future__ import annotations


class MethodAliases:
    """``GRPOTrainer.select_data`` / ``shape_key`` / ``_tempsamp_shape_key`` of earlier versions."""

    def _method(self, name: str):
        """The enabled method ``name``, or a fresh instance (its options are read from the config as before)."""
        from mmgrpo.vlm.methods import REGISTRY, _load

        got = next((m for m in self.methods if m.name == name), None)
        if got is None:  # kept, so that a value set through an alias stays set
            cache = self.__dict__.setdefault("_disabled_methods", {})
            if name not in cache:
                cache[name] = _load(next(s.target for s in REGISTRY if s.name == name))(self.cfg, self)
            got = cache[name]
        return got

    def select_data(self, round: int = 0) -> list[int]:
        """Data selection round ``round`` now (``mmgrpo.vlm.methods.selection.DataSelection.select``)."""
        return self._method("selection").select(round)

    def _tempsamp_shape_key(self) -> str:
        from mmgrpo.vlm.methods.tempsamp_r1 import shape_key

        return shape_key(self.cfg.tempsamp, self.cfg.reward.weights, self.acc_key)

    @property
    def shape_key(self) -> str:
        return self._method("tempsamp_r1").key

    @shape_key.setter
    def shape_key(self, key: str) -> None:
        self._method("tempsamp_r1").key = key
