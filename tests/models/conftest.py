"""Tiny Qwen-VL checkpoints saved once per session and loaded back with from_pretrained."""
import pytest
import torch

torch.set_num_threads(1)  # the 2-core machine is shared: oversubscription makes 2 threads 5x slower


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    from mmgrpo.vlm.models.tiny import save_tiny_model

    root = tmp_path_factory.mktemp("tiny_vl")
    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = save_tiny_model(root / family, family)
        return cache[family]

    return get


@pytest.fixture(scope="session")
def real_qwen_dir(tmp_path_factory):
    """A real-vocabulary Qwen2.5-VL folder (real tokenizer + processor, random tiny-width model with the released
    vocabulary size and ids), built once per session; skipped without the dev extras (dashscope, tiktoken)."""
    import importlib.util
    import time

    pytest.importorskip("tiktoken")
    if importlib.util.find_spec("dashscope") is None:
        pytest.skip("dashscope (ships qwen.tiktoken) not installed: pip install 'mmgrpo[dev]'")
    from mmgrpo.vlm.models.real_tokenizer import build_qwen2_5_vl_processor, save_real_vocab_tiny_model

    t0 = time.perf_counter()
    proc = build_qwen2_5_vl_processor()
    t1 = time.perf_counter()
    d = save_real_vocab_tiny_model(tmp_path_factory.mktemp("real_qwen") / "qwen25vl", processor=proc)
    print(f"\nreal Qwen tokenizer+processor built in {t1 - t0:.1f} s, tiny real-vocab model saved in "
          f"{time.perf_counter() - t1:.1f} s")
    return d
