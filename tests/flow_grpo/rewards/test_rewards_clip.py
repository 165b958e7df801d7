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


def test_clipscore_hessel_preset_prefixes_the_caption(tiny_clip, images):
    r = build_reward("clipscore_hessel", model=tiny_clip)
    got = r(images, PROMPTS)["clipscore_hessel"]
    ref = _reference_cos(tiny_clip, images, ["A photo depicts " + p for p in PROMPTS])
    torch.testing.assert_close(got, 2.5 * ref.clamp(min=0).float(), atol=1e-5, rtol=1e-5)
    assert r.prefix == "A photo depicts "
    # the release's image transform, by hand: PIL bicubic resize of the shortest side, CenterCrop with
    # int(round(margin / 2)) offsets, ToTensor, OpenAI mean/std
    from PIL import Image

    img = np.random.default_rng(5).integers(0, 256, (37, 50, 3), dtype=np.uint8)
    a = np.asarray(Image.fromarray(img).resize((int(64 * 50 / 37), 64), Image.BICUBIC), np.float32) / 255.0
    left = int(round((a.shape[1] - 64) / 2.0))
    a = (a[:, left:left + 64] - np.array([0.48145466, 0.4578275, 0.40821073], np.float32)) / np.array(
        [0.26862954, 0.26130258, 0.27577711], np.float32)
    torch.testing.assert_close(r.clip.preprocess(Image.fromarray(img)), torch.from_numpy(a.transpose(2, 0, 1).copy()),
                               atol=1e-5, rtol=0)


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
    ps = build_reward("pickscore", model_path=hf_clip_dir, processor_path=hf_clip_dir, image_backend="torchvision")(images, PROMPTS)
    torch.testing.assert_close(ps["pickscore"], diag / 26.0, atol=1e-5, rtol=1e-5)
    hp = build_reward("hps", model=model, processor=proc)(images, PROMPTS)  # same weights; saves a reload
    torch.testing.assert_close(hp["hps"], diag / ls, atol=1e-5, rtol=1e-5)
    with pytest.raises(FileNotFoundError):
        build_reward("pickscore", model_path=hf_clip_dir + "_missing", processor_path=hf_clip_dir)
    with pytest.raises(ValueError, match="model_path= .* and processor_path="):  # one convention: two folders
        build_reward("pickscore", path=hf_clip_dir)


# ---------------------------------------------------------------- PickScore: two folders, the release's PIL path
@pytest.fixture(scope="module")
def pickscore_dirs(tmp_path_factory, hf_clip_dir):
    """The release layout: a CLIP-H processor folder and a separate PickScore model folder (no merging)."""
    from transformers import CLIPImageProcessorPil, CLIPModel

    root = tmp_path_factory.mktemp("pick")
    proc_dir, model_dir = root / "CLIP-ViT-H-14-laion2B-s32B-b79K", root / "PickScore_v1"
    hf_clip_tokenizer_from_open_clip().save_pretrained(proc_dir)
    CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(proc_dir)
    CLIPModel.from_pretrained(hf_clip_dir).save_pretrained(model_dir)  # weights only: no processor files here
    return str(proc_dir), str(model_dir)


def _pil_clip_pixels(img_u8, size=32):
    """transformers-4.x CLIPImageProcessor by hand: PIL bicubic resize of the shortest side to ``size`` (long side
    int(size * long / short)), centre crop with floor offsets, x / 255, (x - mean) / std, CHW."""
    from PIL import Image

    h, w = img_u8.shape[:2]
    nh, nw = (size, int(size * w / h)) if h <= w else (int(size * h / w), size)
    a = np.asarray(Image.fromarray(img_u8).resize((nw, nh), Image.BICUBIC), dtype=np.float32)
    top, left = (nh - size) // 2, (nw - size) // 2
    a = a[top:top + size, left:left + size] / 255.0
    mean = np.array([0.48145466, 0.4578275, 0.40821073], np.float32)
    std = np.array([0.26862954, 0.26130258, 0.27577711], np.float32)
    return torch.from_numpy(((a - mean) / std).transpose(2, 0, 1).copy())


def test_pickscore_two_folders_release_preprocessing_and_formula(pickscore_dirs):
    from transformers import CLIPModel

    proc_dir, model_dir = pickscore_dirs
    imgs = np.random.default_rng(3).integers(0, 256, (3, 45, 61, 3), dtype=np.uint8)  # odd crop margin (11)
    r = build_reward("pickscore", processor_path=proc_dir, model_path=model_dir, batch_size=2)
    got = r(imgs, PROMPTS)["pickscore"]
    from PIL import Image

    pix = r.image_processor(images=[Image.fromarray(a) for a in imgs], return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(pix, torch.stack([_pil_clip_pixels(a) for a in imgs]), atol=1e-5, rtol=0)
    tall = np.ascontiguousarray(imgs[0].transpose(1, 0, 2))  # portrait: the other resize branch
    pix_tall = r.image_processor(images=[Image.fromarray(tall)], return_tensors="pt")["pixel_values"][0]
    torch.testing.assert_close(pix_tall, _pil_clip_pixels(tall), atol=1e-5, rtol=0)
    model = CLIPModel.from_pretrained(model_dir).eval()
    tok = hf_clip_tokenizer_from_open_clip()
    with torch.no_grad():
        fi = model.vision_model(pixel_values=torch.stack([_pil_clip_pixels(a) for a in imgs])).pooler_output
        fi = model.visual_projection(fi)
        t = tok(PROMPTS, padding=True, truncation=True, max_length=77, return_tensors="pt")
        ft = model.text_projection(model.text_model(**t).pooler_output)
    cos = (fi / fi.norm(dim=-1, keepdim=True) * ft / ft.norm(dim=-1, keepdim=True)).sum(-1)
    logits = model.logit_scale.exp() * cos
    torch.testing.assert_close(got, logits / 26.0, atol=1e-5, rtol=1e-5)
    # the release's calc_probs (softmax over the images of one prompt) and the two-image pairwise judge
    same = [PROMPTS[0]] * 3
    with torch.no_grad():
        t0 = tok(same[:1], padding=True, return_tensors="pt")
        f0 = model.text_projection(model.text_model(**t0).pooler_output)
    l0 = model.logit_scale.exp() * (fi / fi.norm(dim=-1, keepdim=True) @ (f0 / f0.norm(dim=-1, keepdim=True)).T)[:, 0]
    torch.testing.assert_close(r.preference_probs(imgs, PROMPTS[0]), torch.softmax(l0, 0), atol=1e-5, rtol=1e-5)
    p = r.compare(imgs[:2], imgs[1:], same[:2])
    torch.testing.assert_close(p, torch.stack([torch.softmax(l0[[0, 1]], 0)[0], torch.softmax(l0[[1, 2]], 0)[0]]),
                               atol=1e-5, rtol=1e-5)


def test_pickscore_missing_files_are_named(tmp_path, pickscore_dirs):
    proc_dir, model_dir = pickscore_dirs
    with pytest.raises(FileNotFoundError, match="preprocessor_config.json"):
        build_reward("pickscore", processor_path=model_dir, model_path=model_dir)  # model folder has no processor
    with pytest.raises(FileNotFoundError, match="config.json"):
        build_reward("pickscore", processor_path=proc_dir, model_path=proc_dir)
    with pytest.raises(FileNotFoundError, match="folder not found"):
        build_reward("pickscore", processor_path=proc_dir, model_path=str(tmp_path / "nope"))
