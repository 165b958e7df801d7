"""Issue 39 item 4: a prompt's G samples are one batched transformer call per guidance pass, for every tiny
generator. The number of calls ``predict_velocity`` makes does not grow with G, and each call carries all G samples
(twice as many for a one-pass [uncond; cond] CFG); a batch of G samples at one sigma gives each sample the velocity
it gets alone, within float tolerance (batch-size dependent kernels only)."""
import numpy as np
import pytest
import torch
from PIL import Image

from flow_grpo.models.reference import ReferenceImages
from flow_grpo.models import TINY_BUILDERS

from .conftest import tiny_adapter

VIDEO = {"num_frames": 5}
# kind: (height = width, adapter settings)
SETUP = {
    "sd3": (64, {"max_sequence_length": 16}), "sd3_t5": (64, {"max_sequence_length": 16}),
    "sd3_5_medium": (64, {"max_sequence_length": 16}), "sd3_5_large": (64, {"max_sequence_length": 16}),
    "flux": (64, {"max_sequence_length": 16}), "flux_kontext": (64, {"max_sequence_length": 16}),
    "wan": (32, {**VIDEO, "max_sequence_length": 16}), "wan_i2v": (32, VIDEO),
    "qwen_image": (64, {"max_sequence_length": 16}), "qwen_image_edit": (64, {}),
    "flux2": (32, {}), "flux2_klein": (32, {}), "z_image": (32, {"max_sequence_length": 48}),
    "qwen_image21": (64, {"max_sequence_length": 64}), "sana": (128, {"max_sequence_length": 32}),
    "wan22": (32, {**VIDEO, "max_sequence_length": 16}), "wan22_ti2v": (64, {**VIDEO, "max_sequence_length": 16}),
    "wan22_i2v": (32, {**VIDEO, "max_sequence_length": 16}), "hunyuan_video15": (64, VIDEO),
    "ltx2": (32, {**VIDEO, "max_sequence_length": 16, "stg_blocks": [1]}),
}


DEFAULT = (64, {})  # a new model's tiny pipeline runs with these unless it needs a line in SETUP


def test_every_tiny_kind_is_covered():
    assert set(SETUP) <= set(TINY_BUILDERS)  # no stale entry; every tiny kind runs below (SETUP or DEFAULT)


def _count_calls(ad, g, size):
    sizes = []
    inner = ad.model

    def counting(*args, **kwargs):
        x = kwargs.get("hidden_states", args[0] if args else None)
        sizes.append(len(x) if isinstance(x, list) else x.shape[0])  # Z-Image's transformer takes a list
        return inner(*args, **kwargs)

    prompts = ["a photo of a cat"] * g
    if isinstance(ad, ReferenceImages):
        img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8))
        ad.set_reference_images({prompts[0]: img})
    ad.set_resolution(size, size)
    emb = ad.encode_prompts(prompts)
    x = ad.initial_noise(list(range(g)), size, size)
    ad.model = counting
    try:
        with torch.no_grad():
            v = ad.predict_velocity(x, 0.95, emb, 4.0, ad.supports_cfg)
    finally:
        ad.model = inner
    return sizes, v


@pytest.mark.parametrize("kind", sorted(TINY_BUILDERS))
def test_a_prompts_samples_are_one_batched_call_per_pass(kind):
    size, kw = SETUP.get(kind, DEFAULT)
    ad = tiny_adapter(kind, **kw)
    one, v1 = _count_calls(ad, 1, size)
    four, v4 = _count_calls(ad, 4, size)
    assert len(four) == len(one) and four == [4 * n for n in one], (one, four)
    torch.testing.assert_close(v4[:1], v1, atol=1e-4, rtol=1e-4)
