"""Tiny tensors: one torch thread is several times faster than two on the shared 2-core machine (no
oversubscription with other test processes).  Only for this area's modules (test_synthetic_t2i.py belongs to
another area and keeps its setting); restored afterwards."""
import os

import pytest

_MINE = {"test_data_converters.py", "test_data_jsonl.py", "test_data_prompts.py", "test_synthetic_tvg.py"}


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread(request):
    if os.path.basename(str(request.fspath)) not in _MINE:
        yield
        return
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
