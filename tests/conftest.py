"""Test-wide settings: hermetic (no hub), deterministic, CPU."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("FORCE_QWENVL_VIDEO_READER", "decord")
os.environ.setdefault("WANDB_MODE", "disabled")
# One OpenMP thread for the pytest process and every subprocess it starts, set before anything imports torch.
# Why: several tests fork (2-process trainers, SIGKILL/resume). A fork taken after a multi-thread OpenMP team has
# run can deadlock the child in libgomp (seen in CI), and on this shared 2-core machine 2 threads are slower anyway.
# A test that needs more threads sets them itself and restores them.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

try:  # Property tests draw the same examples on every run: CI must not pass or fail by luck. Explore new
    # examples locally with HYPOTHESIS_PROFILE=explore (random draws, the hypothesis default).
    from hypothesis import settings as _hyp_settings

    _hyp_settings.register_profile("ci", derandomize=True)
    _hyp_settings.register_profile("explore", derandomize=False)
    _hyp_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
except ImportError:  # pragma: no cover
    pass


@pytest.fixture(autouse=True)
def _deterministic_torch():
    try:
        import torch
    except ImportError:  # pragma: no cover
        yield
        return
    torch.manual_seed(0)
    yield


@pytest.fixture
def tick_clock():
    """A fake clock for training-time budgets (``mmgrpo.utils.budget.TimeBudget(clock=...)``): every reading
    advances it by 1 s, so a trainer step / epoch (one ``start`` + one ``lap``) costs exactly 1 s."""
    state = {"t": 0.0}

    def read() -> float:
        state["t"] += 1.0
        return state["t"]

    return read
