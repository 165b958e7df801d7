"""Kept for old imports: the method kernels live in ``mmgrpo.vlm.methods`` (one module per method)."""
from mmgrpo.vlm.methods.t_grpo import temporal_bonus
from mmgrpo.vlm.methods.tw_grpo import tw_token_weights

__all__ = ["temporal_bonus", "tw_token_weights"]
