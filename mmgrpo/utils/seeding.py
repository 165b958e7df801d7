"""Deterministic seeding.

``sample_seed(base_seed, *coords)`` hashes integer coordinates (e.g. ``epoch, prompt_index, sample_index``) into a
seed in ``[0, 2**63)``. It depends only on the values passed, so when callers pass *global* indices (not
rank-local ones) every sample gets the same noise whatever the number of processes.
"""
from __future__ import annotations

import hashlib
import operator
import os
import random
from typing import Any

__all__ = ["sample_seed", "seed_everything", "torch_generator", "numpy_rng"]

_DOMAIN = b"mmgrpo.sample_seed.v1"


def sample_seed(base_seed: int, *coords: int) -> int:
    """Stable seed in ``[0, 2**63)``: ``blake2b(domain | base_seed | coords...)`` truncated to 63 bits.

    Integers of any size and sign are accepted (encoded as decimal text, so ``(1, 23)`` and ``(12, 3)`` differ).
    The value is identical across processes, platforms and Python versions (no ``hash()``, no RNG state).
    """
    parts = []
    for i, c in enumerate((base_seed, *coords)):
        if isinstance(c, bool):
            raise TypeError(f"sample_seed: coordinate {i} is a bool; pass ints")
        try:
            parts.append(str(operator.index(c)))
        except TypeError:
            raise TypeError(f"sample_seed: coordinate {i} must be an int, got {type(c).__name__}: {c!r}") from None
    h = hashlib.blake2b(_DOMAIN + b"|" + ",".join(parts).encode("ascii"), digest_size=8)
    return int.from_bytes(h.digest(), "big") & (2**63 - 1)


def seed_everything(seed: int, deterministic: bool = False) -> int:
    """Seed python ``random``, numpy's global RNG and torch (CPU and all CUDA devices).

    ``deterministic=True`` also asks torch for deterministic algorithms (warn-only, since some ops have none).
    Returns ``seed``.
    """
    seed = operator.index(seed)
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed % 2**32)  # only affects subprocesses started afterwards
    try:
        import numpy as np

        np.random.seed(seed % 2**32)  # numpy's legacy global seed must fit in 32 bits
    except ImportError:  # pragma: no cover
        pass
    try:
        import torch
    except ImportError:  # pragma: no cover
        return seed
    torch.manual_seed(seed % 2**64)  # also seeds every CUDA device
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        if torch.backends.cudnn.is_available():
            torch.backends.cudnn.benchmark = False
            torch.backends.cudnn.deterministic = True
    return seed


def torch_generator(seed: int, device: Any = "cpu"):
    """A fresh ``torch.Generator`` on ``device`` seeded with ``seed`` (e.g. ``sample_seed(...)``)."""
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(operator.index(seed) % 2**64)
    return g


def numpy_rng(seed: int):
    """A fresh ``numpy.random.Generator`` (PCG64) seeded with ``seed``."""
    import numpy as np

    return np.random.default_rng(operator.index(seed))
