"""VLM GRPO trainer entry point; the implementation lives in :mod:`mmgrpo.vlm.train.trainer`."""
from mmgrpo.vlm.train.trainer import GRPOTrainer, PromptStream, RolloutBatch, cat_batches, micro_batches  # noqa: F401

__all__ = ["GRPOTrainer", "PromptStream", "RolloutBatch", "cat_batches", "micro_batches"]
