"""Loading released weight files safely and strictly, with errors that name the file and the keys."""
from __future__ import annotations

import os
from collections.abc import Mapping


def require_file(path: str, what: str) -> None:
    """Raise ``FileNotFoundError`` naming ``path`` and what it should be (e.g. the release's file name)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} not found: {path}")


def load_torch_state_dict(path: str, what: str) -> dict:
    """``torch.load(weights_only=True)`` (nothing in the file runs code); unwraps ``{"state_dict": ...}``."""
    import torch

    require_file(path, what)
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    import pickle

    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(f"{path}: holds objects other than tensors/containers; it is not unpickled "
                         f"(weights_only=True: loading weights never runs code): {str(e)[:300]}") from e
    if isinstance(sd, Mapping) and isinstance(sd.get("state_dict"), Mapping):
        sd = sd["state_dict"]
    if not isinstance(sd, Mapping):
        raise ValueError(f"{path}: expected a state dict (or {{'state_dict': ...}}), got {type(sd).__name__}")
    return dict(sd)


def load_strict(module, sd: Mapping, path: str, hint: str = "") -> None:
    """``module.load_state_dict(sd)`` after checking every key and shape; a mismatch raises ``ValueError``
    naming ``path``, a few missing / unexpected / wrongly shaped keys, and ``hint``."""
    own = module.state_dict()
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    shapes = sorted(k for k in set(own) & set(sd) if tuple(own[k].shape) != tuple(sd[k].shape))
    if missing or unexpected or shapes:
        detail = "; ".join(
            f"{len(v)} {label}, e.g. {v[:4]}" for label, v in
            (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", shapes)) if v)
        raise ValueError(f"{path}: weights do not match the architecture ({detail})" + (f"; {hint}" if hint else ""))
    module.load_state_dict(dict(sd), strict=True)
