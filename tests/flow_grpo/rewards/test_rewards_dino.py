"""Adv-GRPO's DINOv2 rewards (flow_grpo/rewards/dino.py): the hinge loss, the adversarial reward and the DINO
similarity reward computed by hand on known features, the backbone against transformers' Dinov2Model, local
loading, and the Mini-GenEval oracle references."""
import math

import numpy as np
import pytest
import torch

from flow_grpo.rewards import build_reward
from flow_grpo.rewards.dino import (AdversarialDinoReward, DinoBackbone, DinoSimilarityReward, ReferenceImages,
                                    discriminator_loss, hinge_loss, tiny_dinov2_config)


class FakeBackbone:
    """tokens(images) -> the features given per image (keyed by the image's first pixel value)."""

    def __init__(self, table, dim):
        self.table, self.dim = table, dim

    def tokens(self, images):
        cls = torch.tensor([self.table[int(im[0, 0, 0])][0] for im in images], dtype=torch.float32)
        patches = torch.tensor([self.table[int(im[0, 0, 0])][1] for im in images], dtype=torch.float32)
        return cls, patches


def _img(v, size=8):
    return np.full((size, size, 3), v, dtype=np.uint8)


def _linear_head(w, b):
    head = torch.nn.Linear(len(w), 1)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([w]))
        head.bias.fill_(b)
    return head


def _unit(v):
    n = math.sqrt(sum(x * x for x in v)) + 1e-6
    return [x / n for x in v]


def _dot(a, b):
    return sum(x * y for x, y in zip(a, b))


def test_hinge_loss_by_hand():
    real, fake = torch.tensor([2.0, 0.5, -1.0]), torch.tensor([-2.0, 0.3])
    # relu(1 - real) = 0, 0.5, 2 -> 2.5 / 3; relu(1 + fake) = 0, 1.3 -> 0.65
    assert float(hinge_loss(real, fake)) == pytest.approx(0.5 * (2.5 / 3 + 0.65), abs=1e-7)


def test_discriminator_loss_by_hand_cls_and_patches():
    w, b = [1.0, -2.0], 0.25
    head = _linear_head(w, b)
    cls_r = [[3.0, 4.0], [1.0, 0.0]]
    cls_f = [[0.0, 2.0], [-1.0, -1.0]]
    # patch tokens all equal within an image: the random draw cannot change the patch term
    pr, pf = [[2.0, 1.0]], [[0.0, -3.0]]
    t = lambda x: torch.tensor(x)  # noqa: E731
    patch_r = t([pr * 5, [[1.0, 1.0]] * 5])
    patch_f = t([pf * 5, [[-2.0, 0.0]] * 5])
    loss, st = discriminator_loss(head, t(cls_r), patch_r, t(cls_f), patch_f, patch_weight=0.3, n_patches=3,
                                  generator=torch.Generator().manual_seed(0))
    h = lambda v: _dot(w, _unit(v)) + b  # noqa: E731

    def hinge(rs, fs):
        return 0.5 * (sum(max(0.0, 1 - h(v)) for v in rs) / len(rs) + sum(max(0.0, 1 + h(v)) for v in fs) / len(fs))

    want = hinge(cls_r, cls_f) + 0.3 * hinge([[2.0, 1.0], [1.0, 1.0]], [[0.0, -3.0], [-2.0, 0.0]])
    assert float(loss) == pytest.approx(want, abs=1e-6)
    # the release's accuracy: CLS logits > 0 for real, < 0 for fake
    acc_r = sum(h(v) > 0 for v in cls_r) / 2
    acc_f = sum(h(v) < 0 for v in cls_f) / 2
    assert st["adv_grpo/d_acc"] == pytest.approx(0.5 * (acc_r + acc_f))
    # CLS only (patch_weight 0) and the release's unnormalised training features
    loss0, _ = discriminator_loss(head, t(cls_r), patch_r, t(cls_f), patch_f, patch_weight=0.0)
    assert float(loss0) == pytest.approx(hinge(cls_r, cls_f), abs=1e-6)
    raw, _ = discriminator_loss(head, t(cls_r), patch_r, t(cls_f), patch_f, patch_weight=0.0, normalize=False)
    h_raw = lambda v: _dot(w, v) + b  # noqa: E731
    want_raw = 0.5 * (sum(max(0.0, 1 - h_raw(v)) for v in cls_r) / 2 + sum(max(0.0, 1 + h_raw(v)) for v in cls_f) / 2)
    assert float(raw) == pytest.approx(want_raw, abs=1e-6)


def test_discriminator_loss_gradient_by_hand():
    """Linear head on unit features: dL/dw = 0.5 [-mean_{real, h<1} x + mean_{fake, h>-1} x] (hinge subgradient)."""
    w, b = [0.5, 0.0], 0.0
    head = _linear_head(w, b)
    cls_r, cls_f = [[1.0, 0.0], [0.0, 1.0]], [[0.6, 0.8], [-1.0, 0.0]]
    p = torch.zeros(2, 1, 2)
    loss, _ = discriminator_loss(head, torch.tensor(cls_r), p, torch.tensor(cls_f), p, patch_weight=0.0)
    loss.backward()
    # h(real) = 0.5, 0 (both < 1: active); h(fake) = 0.3, -0.5 (both > -1: active)
    x = [_unit(v) for v in cls_r + cls_f]
    g = [0.5 * (-(x[0][k] + x[1][k]) / 2 + (x[2][k] + x[3][k]) / 2) for k in range(2)]
    assert head.weight.grad[0].tolist() == pytest.approx(g, abs=1e-6)
    assert float(head.bias.grad) == pytest.approx(0.5 * (-1 + 1), abs=1e-7)


def test_adversarial_reward_by_hand():
    table = {10: ([3.0, 4.0], [[1.0, 0.0], [0.0, 2.0]]), 20: ([-1.0, 1.0], [[2.0, 2.0], [0.0, -1.0]])}
    m = AdversarialDinoReward(backbone=FakeBackbone(table, 2), head_hidden=4, cls_weight=0.7)
    m.head = _linear_head([1.0, -2.0], 0.1)
    out = m(np.stack([_img(10), _img(20)]), ["a", "b"])
    h = lambda v: _dot([1.0, -2.0], _unit(v)) + 0.1  # noqa: E731
    for i, k in enumerate((10, 20)):
        cls, patches = table[k]
        want = 0.7 * h(cls) + 0.3 * sum(h(p) for p in patches) / len(patches)
        assert float(out["adv_dino"][i]) == pytest.approx(want, abs=1e-6)
        assert float(out["adv_dino/cls"][i]) == pytest.approx(h(cls), abs=1e-6)


def test_adversarial_reward_patch_draws_depend_on_the_image_only():
    m = AdversarialDinoReward(tiny=True, head_hidden=8, reward_patches=5)
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 255, (2, 32, 32, 3), dtype=np.uint8)
    r_ab = m(np.stack([a, b]), ["x", "y"])["adv_dino"]
    r_ba = m(np.stack([b, a]), ["y", "x"])["adv_dino"]
    assert torch.equal(r_ab, r_ba.flip(0))


def test_similarity_reward_is_the_max_cosine_over_the_prompts_references():
    table = {1: ([1.0, 0.0], [[0.0, 0.0]]), 2: ([0.0, 1.0], [[0.0, 0.0]]), 3: ([1.0, 1.0], [[0.0, 0.0]]),
             9: ([2.0, 1.0], [[0.0, 0.0]])}

    class Refs(ReferenceImages):
        def _load(self, prompt, md, size):
            return np.stack([_img(v, size) for v in ({"p": (1, 2), "q": (3,)}[prompt])])

    r = DinoSimilarityReward(backbone=FakeBackbone(table, 2))
    r.refs = Refs(per_prompt=2)
    out = r(np.stack([_img(9), _img(9)]), ["p", "q"])
    x = _unit([2.0, 1.0])
    cos = lambda v: _dot(x, _unit(v))  # noqa: E731
    assert float(out["dino_similarity"][0]) == pytest.approx(max(cos([1, 0]), cos([0, 1])), abs=1e-6)
    assert float(out["dino_similarity/mean"][0]) == pytest.approx((cos([1, 0]) + cos([0, 1])) / 2, abs=1e-6)
    assert float(out["dino_similarity"][1]) == pytest.approx(cos([1, 1]), abs=1e-6)


def test_backbone_matches_dinov2model_and_leaves_the_global_rng_alone():
    from transformers import Dinov2Model

    state = torch.get_rng_state()
    bb = DinoBackbone(tiny=True, seed=3)
    assert torch.equal(torch.get_rng_state(), state)
    rng = np.random.default_rng(1)
    imgs = rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)  # the tiny config's 32 px: no resize
    x = (imgs.astype(np.float64) / 255.0 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    pix = torch.tensor(x.transpose(0, 3, 1, 2), dtype=torch.float32)
    assert torch.allclose(bb.preprocess(imgs), pix, atol=1e-6)
    torch.manual_seed(3)
    ref = Dinov2Model(tiny_dinov2_config()).eval()
    with torch.no_grad():
        h = ref(pixel_values=pix).last_hidden_state
    cls, patches = bb.tokens(imgs)
    assert torch.allclose(cls, h[:, 0], atol=1e-5) and torch.allclose(patches, h[:, 1:], atol=1e-5)
    assert patches.shape == (2, 64, 32)
    # batched forwards give the same tokens
    bb.batch_size = 1
    assert torch.allclose(bb.tokens(imgs)[1], patches, atol=1e-6)
    # other sizes are resized to the model's input (bicubic)
    big = np.repeat(np.repeat(imgs, 2, axis=1), 2, axis=2)
    assert bb.preprocess(big).shape == (2, 3, 32, 32)


def test_local_folder_loads_and_bad_folders_are_named(tmp_path):
    bb = DinoBackbone(tiny=True, seed=5)
    bb.model.save_pretrained(tmp_path / "dino")
    loaded = DinoBackbone(model_dir=str(tmp_path / "dino"))
    imgs = np.random.default_rng(2).integers(0, 256, (1, 32, 32, 3), dtype=np.uint8)
    assert torch.equal(loaded.tokens(imgs)[0], bb.tokens(imgs)[0])
    with pytest.raises(FileNotFoundError, match="not found"):
        DinoBackbone(model_dir=str(tmp_path / "missing"))
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text("{}")
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        DinoBackbone(model_dir=str(tmp_path / "bin"))
    with pytest.raises(ValueError, match="model_dir"):
        DinoBackbone()


def test_mini_geneval_references_are_the_renderers_oracle_images():
    from mmgrpo.synthetic import t2i as bench

    refs = ReferenceImages("mini_geneval", per_prompt=3, seed=4)
    md = bench.parse_prompt("two red circles")
    got = refs.get("two red circles", {}, 32)
    assert got.shape == (3, 32, 32, 3)
    for k in range(3):
        assert np.array_equal(got[k], bench.render(md, size=32, seed=4 + k))
        assert bench.verify(got[k], md)["correct"]
    pair = refs.for_samples(["two red circles"] * 4, [{}] * 4, 32, members=[0, 1, 2, 3])
    assert np.array_equal(pair[3], got[0]) and np.array_equal(pair[1], got[1])
    with pytest.raises(Exception, match="not a Mini-GenEval prompt"):
        refs.get("a photo of a dog", {}, 32)
    small = ReferenceImages("mini_geneval", per_prompt=1, cache_size=1)  # bounded memory: the last prompt only
    small.get("a red circle", {}, 32)
    small.get("two red circles", {}, 32)
    assert list(small._cache.data) == [("two red circles", 32)]


def test_metadata_references_and_registry(tmp_path):
    from PIL import Image

    p = tmp_path / "r.png"
    Image.fromarray(_img(77, 16)).save(p)
    refs = ReferenceImages("metadata", per_prompt=2)
    got = refs.get("x", {"reference_images": [str(p)]}, 8)
    assert got.shape == (1, 8, 8, 3) and int(got[0, 0, 0, 0]) == 77
    with pytest.raises(Exception, match="reference_images"):
        refs.get("y", {}, 8)
    r = build_reward("adv_dino", tiny=True, head_hidden=8)
    assert isinstance(r, AdversarialDinoReward)
    assert isinstance(build_reward("dino_similarity", tiny=True), DinoSimilarityReward)
