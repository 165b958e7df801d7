"""Kept for old imports: the data-selection criteria live in ``mmgrpo.vlm.methods.selection``."""
from mmgrpo.vlm.methods.selection import reward_stats, select_indices

__all__ = ["reward_stats", "select_indices"]
