"""Kept for old imports: the data-selection criteria live in ``mmgrpo.methods.selection``."""
from mmgrpo.methods.selection import reward_stats, select_indices

__all__ = ["reward_stats", "select_indices"]
