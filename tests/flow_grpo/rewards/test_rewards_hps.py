"""HPSv2 on a tiny open_clip model saved in the release's checkpoint layout ({"state_dict": ...} .pt file).

The reference preprocessing is written by hand from the release's description (ToTensor, letterbox resize of the
longest side with bicubic + antialias, zero pad centred, OpenAI mean/std) with torch.nn.functional, not with the
module's own helper."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

open_clip = pytest.importorskip("open_clip")

from flow_grpo.rewards import build_reward  # noqa: E402
from flow_grpo.rewards.hps import HPSv2Reward  # noqa: E402

TINY = dict(embed_dim=32, vision_cfg=dict(image_size=32, layers=1, width=32, patch_size=8, head_width=16),
            text_cfg=dict(context_length=77, vocab_size=49408, width=32, heads=2, layers=1))
PROMPTS = ["a red cube", "two cats on a sofa", "a watercolour of a lighthouse at night"]
MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(3, 1, 1)
STD = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(3, 1, 1)


@pytest.fixture(scope="module")
def hps_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("hps")
    cfg = d / "hps-tiny.json"
    cfg.write_text(json.dumps(TINY))
    torch.manual_seed(0)
    model = open_clip.CLIP(**TINY).eval()
    ckpt = d / "HPS_v2.1_compressed.pt"
    torch.save({"state_dict": model.state_dict()}, ckpt)
    return model, str(ckpt), str(cfg)


def _reference_pixels(img_u8, size=32):
    x = torch.from_numpy(img_u8).permute(2, 0, 1).float() / 255.0
    h, w = x.shape[1:]
    s = size / max(h, w)
    nh, nw = int(round(h * s)), int(round(w * s))
    x = F.interpolate(x[None], size=(nh, nw), mode="bicubic", align_corners=False, antialias=True)[0]
    top, left = (size - nh) // 2, (size - nw) // 2
    out = torch.zeros(3, size, size)
    out[:, top:top + nh, left:left + nw] = x
    return (out - MEAN) / STD


def test_hpsv2_preprocessing_is_the_release_letterbox():
    img = np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)  # landscape: pads top/bottom
    from flow_grpo.rewards.hps import hps_preprocess

    got = hps_preprocess(img, 32)
    ref = _reference_pixels(img)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    # 40x56 -> 23x32 (round(22.86)); 9 padded rows split 4 top / 5 bottom, black before normalising
    assert torch.allclose(got[:, :4], ((0 - MEAN) / STD).expand(3, 4, 32))
    assert torch.allclose(got[:, -5:], ((0 - MEAN) / STD).expand(3, 5, 32))
    assert not torch.allclose(got[:, 4], ((0 - MEAN) / STD)[:, 0].expand(3, 32))


def test_hpsv2_loads_release_checkpoint_and_scores_cosine(hps_files):
    model, ckpt, cfg = hps_files
    imgs = np.random.default_rng(1).integers(0, 256, (3, 48, 48, 3), dtype=np.uint8)
    r = build_reward("hpsv2", checkpoint=ckpt, model_name="hps-tiny", model_config=cfg, batch_size=2)
    got = r(imgs, PROMPTS)["hpsv2"]
    assert got.shape == (3,)
    x = torch.stack([_reference_pixels(a) for a in imgs])
    with torch.no_grad():
        out = model(x, open_clip.tokenize(PROMPTS))  # open_clip's forward normalises both features
    fi, ft = (out["image_features"], out["text_features"]) if isinstance(out, dict) else out[:2]
    torch.testing.assert_close(got, torch.diagonal(fi @ ft.T).float(), atol=1e-5, rtol=1e-5)
    assert got.abs().max() <= 1.0


def test_hpsv2_clear_errors_for_missing_or_wrong_checkpoint(tmp_path, hps_files):
    _, _, cfg = hps_files
    with pytest.raises(FileNotFoundError, match="HPS_v2.1_compressed.pt"):
        HPSv2Reward(str(tmp_path / "nope.pt"), model_name="hps-tiny", model_config=cfg)
    bad = tmp_path / "bad.pt"
    torch.save({"state_dict": {"visual.proj": torch.zeros(2)}}, bad)
    with pytest.raises(ValueError, match="bad.pt.*missing keys"):
        HPSv2Reward(str(bad), model_name="hps-tiny", model_config=cfg)


class _NotAWeight:  # a pickled object that weights_only loading must refuse
    pass


def test_checkpoint_with_arbitrary_objects_is_refused(tmp_path, hps_files):
    _, _, cfg = hps_files
    bad = tmp_path / "HPS_v2_compressed.pt"
    torch.save({"state_dict": {}, "extra": _NotAWeight()}, bad)
    with pytest.raises(ValueError, match="never runs code"):
        HPSv2Reward(str(bad), model_name="hps-tiny", model_config=cfg)
