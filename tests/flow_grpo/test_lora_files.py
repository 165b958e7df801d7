"""The LoRA a run exports loads back into the release pipeline class: ``adapter.save_lora(d)`` then
``Pipeline.load_lora_weights(d)`` on a fresh tiny pipeline gives the trained adapter's velocity, for each 2026
generator (Wan2.2 A14B's two files and HunyuanVideo 1.5's transformer-level file are tested in their own modules)."""
import pytest
import torch

from flow_grpo.models import adapter_from_pipeline
from flow_grpo.models.reference import ReferenceImages
from flow_grpo.models import TINY_BUILDERS

from .test_batched_rollouts import SETUP

KINDS = ["sd3_5_large", "flux2", "flux2_klein", "z_image", "qwen_image21", "sana", "wan22_ti2v", "ltx2"]


@pytest.mark.parametrize("kind", KINDS)
def test_saved_lora_reloads_into_the_pipeline(kind, tmp_path):
    size, kw = SETUP[kind]
    ad = adapter_from_pipeline(TINY_BUILDERS[kind](seed=0), **kw)
    assert not isinstance(ad, ReferenceImages)
    torch.manual_seed(1)
    ad.add_lora(rank=4, alpha=8)
    with torch.no_grad():
        for n, p in ad.transformer.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.3)
    ad.save_lora(str(tmp_path))
    pipe = TINY_BUILDERS[kind](seed=0)
    pipe.load_lora_weights(str(tmp_path))
    fresh, base = adapter_from_pipeline(pipe, **kw), adapter_from_pipeline(TINY_BUILDERS[kind](seed=0), **kw)
    for a in (ad, fresh, base):
        a.set_resolution(size, size)
    x = ad.initial_noise([1], size, size)
    with torch.no_grad():
        v, v_fresh, v_base = (a.predict_velocity(x, 0.6, a.encode_prompts(["a cat"]), 4.0, a.supports_cfg)
                              for a in (ad, fresh, base))
    torch.testing.assert_close(v_fresh, v, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(v, v_base, atol=1e-4)
