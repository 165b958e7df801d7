"""mmgrpo: GRPO for multimodal models."""
__version__ = "0.1.0"
