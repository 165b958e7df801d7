"""CLIP score (open_clip), aesthetic MLP and HF CLIP preference scorers on tiny random models (no hub)."""
import json

import numpy as np
import pytest
import torch

open_clip = pytest.importorskip("open_clip")

from flow_grpo.rewards import build_reward  # noqa: E402
from flow_grpo.rewards.clip import (  # noqa: E402
    AestheticReward,
    CLIPScoreReward,
    build_aesthetic_mlp,
    hf_clip_tokenizer_from_open_clip,
)

TINY = dict(embed_dim=64, vision_cfg=dict(image_size=64, layers=2, width=64, patch_size=16, head_width=32),
            text_cfg=dict(context_length=77, vocab_size=49408, width=64, heads=2, layers=2))
PROMPTS = ["two red circles", "a blue square on the left of a green triangle", "a photo of a cat"]


@pytest.fixture(scope="module")
def tiny_clip():
    torch.manual_seed(0)
    return open_clip.CLIP(**TINY).eval()


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(0).integers(0, 256, (3, 40, 56, 3), dtype=np.uint8)


def _reference_cos(model, images, prompts):
    """Independent path: open_clip's own forward (which normalises internally) on its PIL transform."""
    from PIL import Image

    pre = open_clip.image_transform(64, is_train=False)
    x = torch.stack([pre(Image.fromarray(a)) for a in images])
    with torch.no_grad():
        out = model(x, open_clip.tokenize(prompts))
    img_f, txt_f = (out["image_features"], out["text_features"]) if isinstance(out, dict) else out[:2]
    return (img_f * txt_f).sum(-1)


def test_clip_score_equals_open_clip_forward_cosine(tiny_clip, images):
    r = CLIPScoreReward(model=tiny_clip)
    got = r(images, PROMPTS)["clip_score"]
    ref = _reference_cos(tiny_clip, images, PROMPTS)
    torch.testing.assert_close(got, ref.float(), atol=1e-5, rtol=1e-5)
    assert got.abs().max() <= 1.0 + 1e-6
    hessel = CLIPScoreReward(model=tiny_clip, scale=2.5, clamp_min=0.0)(images, PROMPTS)["clip_score"]
    torch.testing.assert_close(hessel, 2.5 * ref.clamp(min=0).float(), atol=1e-5, rtol=1e-5)
    # batching must not change the scores
    small = CLIPScoreReward(model=tiny_clip, batch_size=1)(images, PROMPTS)["clip_score"]
    torch.testing.assert_close(small, got, atol=1e-5, rtol=1e-5)


def test_clip_score_loads_local_weights_by_name(tmp_path, tiny_clip, images):
    cfg = tmp_path / "tiny-test-clip.json"
    cfg.write_text(json.dumps(TINY))
    weights = tmp_path / "tiny.pt"
    torch.save(tiny_clip.state_dict(), weights)
    r = build_reward("clip_score", model_name="tiny-test-clip", pretrained=str(weights), model_config=str(cfg))
    ref = _reference_cos(tiny_clip, images, PROMPTS)
    torch.testing.assert_close(r(images, PROMPTS)["clip_score"], ref.float(), atol=1e-5, rtol=1e-5)
    with pytest.raises(FileNotFoundError):
        CLIPScoreReward("tiny-test-clip", pretrained=str(tmp_path / "missing.pt"), model_config=str(cfg))


def test_aesthetic_mlp_matches_hand_written_affine_chain(tmp_path, tiny_clip, images):
    torch.manual_seed(1)
    mlp = build_aesthetic_mlp(64)
    sd = {k: v.clone() for k, v in mlp.state_dict().items()}
    assert sorted({k.split(".")[1] for k in sd}) == ["0", "2", "4", "6", "7"]  # released layout
    path = tmp_path / "aesthetic.pth"
    torch.save(sd, path)
    r = build_reward("aesthetic", mlp_path=str(path), model=tiny_clip)
    got = r(images, PROMPTS)["aesthetic"]
    # independent: normalised features through five affine maps (dropout is identity at eval, no activations)
    from PIL import Image

    pre = open_clip.image_transform(64, is_train=False)
    with torch.no_grad():
        f = tiny_clip.encode_image(torch.stack([pre(Image.fromarray(a)) for a in images]))
    h = f / f.norm(dim=-1, keepdim=True)
    for i in (0, 2, 4, 6, 7):
        h = h @ sd[f"layers.{i}.weight"].T + sd[f"layers.{i}.bias"]
    torch.testing.assert_close(got, h[:, 0], atol=1e-5, rtol=1e-5)
    torch.save(build_aesthetic_mlp(32).state_dict(), tmp_path / "wrong.pth")
    with pytest.raises(ValueError, match="expects 32-d"):
        AestheticReward(str(tmp_path / "wrong.pth"), model=tiny_clip)


def test_hf_tokenizer_from_open_clip_bpe_matches_open_clip_ids():
    tok = hf_clip_tokenizer_from_open_clip()
    assert len(tok) == 49408
    ids = tok(PROMPTS, padding="max_length", max_length=77, return_tensors="pt").input_ids
    oc = open_clip.tokenize(PROMPTS)
    mask = oc != 0  # open_clip pads with 0, HF with <|endoftext|>
    assert torch.equal(ids[mask], oc[mask])
    assert (ids[~mask] == 49407).all()


@pytest.fixture(scope="module")
def hf_clip_dir(tmp_path_factory):
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    d = tmp_path_factory.mktemp("hfclip")
    tok = hf_clip_tokenizer_from_open_clip()
    ip = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    CLIPProcessor(image_processor=ip, tokenizer=tok).save_pretrained(d)
    torch.manual_seed(2)
    cfg = CLIPConfig(
        text_config=dict(vocab_size=49408, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=77, projection_dim=16),
        vision_config=dict(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, projection_dim=16),
        projection_dim=16)
    CLIPModel(cfg).eval().save_pretrained(d)
    return str(d)


def test_pickscore_and_hps_from_local_hf_folder(hf_clip_dir, images):
    from transformers import CLIPModel, CLIPProcessor

    model, proc = CLIPModel.from_pretrained(hf_clip_dir).eval(), CLIPProcessor.from_pretrained(hf_clip_dir)
    with torch.no_grad():
        inp = proc(text=PROMPTS, images=list(images), return_tensors="pt", padding=True)
        logits = model(**inp).logits_per_image  # (N_img, N_txt) = exp(logit_scale) * cos
    diag = torch.diagonal(logits).float()
    ls = model.logit_scale.exp().float()
    ps = build_reward("pickscore", path=hf_clip_dir)(images, PROMPTS)
    torch.testing.assert_close(ps["pickscore"], diag / 26.0, atol=1e-5, rtol=1e-5)
    hp = build_reward("hps", model=model, processor=proc)(images, PROMPTS)  # same weights; saves a reload
    torch.testing.assert_close(hp["hps"], diag / ls, atol=1e-5, rtol=1e-5)
    with pytest.raises(FileNotFoundError):
        build_reward("pickscore", path=hf_clip_dir + "_missing")
