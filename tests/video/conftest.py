"""Tiny tensors: one torch thread is several times faster than two on the shared 2-core machine (no
oversubscription with other test processes).  Restored afterwards so other areas keep their setting."""
import pytest


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
