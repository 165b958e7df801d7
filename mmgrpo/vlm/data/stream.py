"""The prompt stream of the VLM trainer: which sample each stream position draws (seeded, resumable)."""
from __future__ import annotations

from typing import Callable

import torch

from mmgrpo.utils.seeding import sample_seed

__all__ = ["PromptStream"]


class PromptStream:
    """Endless, seeded, resumable stream of sample indices; epoch e uses permutation(seed, e).

    ``take(k)`` returns (stream position, sample index) pairs; the stream position is unique over the run and is
    the group id and the seed coordinate of a prompt, independent of the number of processes.

    ``on_epoch(e)`` (optional) runs when epoch e > 0 begins and may return a new number of samples: per-epoch data
    re-selection (Time-R1 multi-round); epoch e then permutes the new set.
    """

    def __init__(self, num_samples: int, seed: int, shuffle: bool = True,
                 on_epoch: Callable[[int], int | None] | None = None):
        if num_samples < 1:
            raise ValueError("the training set is empty")
        self.n, self.seed, self.shuffle = num_samples, seed, shuffle
        self.position = 0
        self._epoch, self.offset = 0, 0  # current epoch and how many of its samples were taken
        self.on_epoch = on_epoch
        self._perm_epoch, self._perm = -1, None

    def _order(self, epoch: int) -> list[int]:
        if self._perm_epoch != epoch:
            if self.shuffle:
                g = torch.Generator().manual_seed(sample_seed(self.seed, 7919, epoch))
                self._perm = torch.randperm(self.n, generator=g).tolist()
            else:
                self._perm = list(range(self.n))
            self._perm_epoch = epoch
        return self._perm

    def take(self, k: int) -> list[tuple[int, int]]:
        out = []
        for _ in range(k):
            if self.offset >= self.n:  # next epoch (for a constant n: epoch = position // n, as always)
                self._epoch, self.offset = self._epoch + 1, 0
                if self.on_epoch is not None:
                    n = self.on_epoch(self._epoch)
                    if n is not None:
                        if n < 1:
                            raise ValueError(f"epoch {self._epoch}: data re-selection kept no samples")
                        self.n, self._perm_epoch = int(n), -1
            out.append((self.position, self._order(self._epoch)[self.offset]))
            self.position += 1
            self.offset += 1
        return out

    @property
    def epoch(self) -> int:
        return self._epoch + self.offset // self.n

    def state_dict(self) -> dict:
        return {"position": self.position, "num_samples": self.n, "seed": self.seed, "shuffle": self.shuffle,
                "epoch": self._epoch, "offset": self.offset}

    def load_state_dict(self, sd: dict) -> None:
        if sd["num_samples"] != self.n:
            raise ValueError(f"resume: the checkpoint's data stream had {sd['num_samples']} samples, the current "
                             f"training set has {self.n}; same data (and selection) is required for an exact resume")
        self.position = int(sd["position"])
        self._epoch, self.offset = int(sd["epoch"]), int(sd["offset"])
        self._perm_epoch = -1

