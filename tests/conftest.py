"""Test-wide settings: hermetic (no hub), deterministic, CPU."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("FORCE_QWENVL_VIDEO_READER", "decord")
os.environ.setdefault("WANDB_MODE", "disabled")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _deterministic_torch():
    try:
        import torch
    except ImportError:  # pragma: no cover
        yield
        return
    torch.manual_seed(0)
    yield
