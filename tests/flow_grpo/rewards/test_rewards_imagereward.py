"""ImageReward on a tiny checkpoint written with the RELEASE's parameter names (blip.visual_encoder.blocks.i.attn.qkv,
blip.text_encoder.encoder.layer.i.crossattention..., mlp.layers.k), scored against a forward pass written here
by hand from the release's ViT / med-BERT definitions (functional torch on the released names), so both the
name mapping and the HF BLIP classes are checked."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flow_grpo.rewards import build_reward
from flow_grpo.rewards.imagereward import IMAGEREWARD_MEAN, IMAGEREWARD_STD, ImageRewardReward

VW, VDEPTH, VHEADS, PATCH, IMG = 32, 2, 2, 8, 32  # tiny ViT (width 32 -> pass vit_heads=2)
TW, TDEPTH, THEADS, TFF = 24, 2, 2, 48  # tiny med-BERT
WORDS = ["a", "red", "cube", "on", "the", "table", "two", "cats", "photo", "of", "##s"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
PROMPTS = ["a red cube on the table", "two cats", "a photo of the cats on a red table"]


def _release_state_dict(seed=0):
    g = torch.Generator().manual_seed(seed)

    def w(*shape, s=0.2):
        return torch.randn(*shape, generator=g) * s

    def ln(d):
        return 1.0 + w(d, s=0.1), w(d, s=0.1)

    sd = {}
    v = "blip.visual_encoder."
    sd[v + "cls_token"] = w(1, 1, VW)
    sd[v + "pos_embed"] = w(1, (IMG // PATCH) ** 2 + 1, VW)
    sd[v + "patch_embed.proj.weight"], sd[v + "patch_embed.proj.bias"] = w(VW, 3, PATCH, PATCH, s=0.05), w(VW)
    for i in range(VDEPTH):
        b = f"{v}blocks.{i}."
        for n in ("norm1", "norm2"):
            sd[b + n + ".weight"], sd[b + n + ".bias"] = ln(VW)
        sd[b + "attn.qkv.weight"], sd[b + "attn.qkv.bias"] = w(3 * VW, VW), w(3 * VW)
        sd[b + "attn.proj.weight"], sd[b + "attn.proj.bias"] = w(VW, VW), w(VW)
        sd[b + "mlp.fc1.weight"], sd[b + "mlp.fc1.bias"] = w(4 * VW, VW), w(4 * VW)
        sd[b + "mlp.fc2.weight"], sd[b + "mlp.fc2.bias"] = w(VW, 4 * VW), w(VW)
    sd[v + "norm.weight"], sd[v + "norm.bias"] = ln(VW)
    t = "blip.text_encoder."
    sd[t + "embeddings.word_embeddings.weight"] = w(len(VOCAB) + 2, TW)
    sd[t + "embeddings.position_embeddings.weight"] = w(40, TW)
    sd[t + "embeddings.LayerNorm.weight"], sd[t + "embeddings.LayerNorm.bias"] = ln(TW)
    sd[t + "embeddings.position_ids"] = torch.arange(40)[None]  # persistent buffer in old transformers
    for i in range(TDEPTH):
        b = f"{t}encoder.layer.{i}."
        for a, kv in (("attention.", TW), ("crossattention.", VW)):
            sd[b + a + "self.query.weight"], sd[b + a + "self.query.bias"] = w(TW, TW), w(TW)
            sd[b + a + "self.key.weight"], sd[b + a + "self.key.bias"] = w(TW, kv), w(TW)
            sd[b + a + "self.value.weight"], sd[b + a + "self.value.bias"] = w(TW, kv), w(TW)
            sd[b + a + "output.dense.weight"], sd[b + a + "output.dense.bias"] = w(TW, TW), w(TW)
            sd[b + a + "output.LayerNorm.weight"], sd[b + a + "output.LayerNorm.bias"] = ln(TW)
        sd[b + "intermediate.dense.weight"], sd[b + "intermediate.dense.bias"] = w(TFF, TW), w(TFF)
        sd[b + "output.dense.weight"], sd[b + "output.dense.bias"] = w(TW, TFF), w(TW)
        sd[b + "output.LayerNorm.weight"], sd[b + "output.LayerNorm.bias"] = ln(TW)
    sd["blip.vision_proj.weight"], sd["blip.text_proj.weight"] = w(16, VW), w(16, TW)  # unused by the score
    for k, (o, i) in zip((0, 2, 4, 6, 7), ((1024, TW), (128, 1024), (64, 128), (16, 64), (1, 16))):
        sd[f"mlp.layers.{k}.weight"], sd[f"mlp.layers.{k}.bias"] = w(o, i, s=i ** -0.5), w(o, s=0.1)
    return sd


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ImageReward")
    sd = _release_state_dict()
    torch.save(sd, d / "ImageReward.pt")
    (d / "med_config.json").write_text(json.dumps(dict(
        architectures=["BertModel"], attention_probs_dropout_prob=0.1, hidden_act="gelu", hidden_dropout_prob=0.1,
        hidden_size=TW, initializer_range=0.02, intermediate_size=TFF, layer_norm_eps=1e-12,
        max_position_embeddings=40, model_type="bert", num_attention_heads=THEADS, num_hidden_layers=TDEPTH,
        pad_token_id=0, type_vocab_size=2, vocab_size=len(VOCAB) + 2, encoder_width=TW, add_cross_attention=True)))
    tok = d / "bert-base-uncased"
    tok.mkdir()
    (tok / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return d, sd


def _ref_pixels(img_u8, size=IMG):
    """torchvision Resize(size) on PIL (short side -> size, long side int(size * long / short)), bicubic;
    CenterCrop offsets int(round((H - size) / 2)); ToTensor; OpenAI mean/std."""
    from PIL import Image

    h, w = img_u8.shape[:2]
    nh, nw = (size, int(size * w / h)) if h <= w else (int(size * h / w), size)
    a = np.asarray(Image.fromarray(img_u8).resize((nw, nh), Image.BICUBIC), dtype=np.float32) / 255.0
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    a = torch.from_numpy(a[top:top + size, left:left + size].transpose(2, 0, 1).copy())
    mean = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(3, 1, 1)
    std = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(3, 1, 1)
    return (a - mean) / std


def _ref_vit(sd, x):
    v = "blip.visual_encoder."
    x = F.conv2d(x, sd[v + "patch_embed.proj.weight"], sd[v + "patch_embed.proj.bias"], stride=PATCH)
    x = x.flatten(2).transpose(1, 2)
    x = torch.cat([sd[v + "cls_token"].expand(x.shape[0], -1, -1), x], 1) + sd[v + "pos_embed"]
    B, N, D = x.shape
    for i in range(VDEPTH):
        b = f"{v}blocks.{i}."
        h = F.layer_norm(x, (D,), sd[b + "norm1.weight"], sd[b + "norm1.bias"], eps=1e-6)
        qkv = F.linear(h, sd[b + "attn.qkv.weight"], sd[b + "attn.qkv.bias"])
        q, k, vv = qkv.reshape(B, N, 3, VHEADS, D // VHEADS).permute(2, 0, 3, 1, 4)
        a = ((q @ k.transpose(-2, -1)) * (D // VHEADS) ** -0.5).softmax(-1) @ vv
        x = x + F.linear(a.transpose(1, 2).reshape(B, N, D), sd[b + "attn.proj.weight"], sd[b + "attn.proj.bias"])
        h = F.layer_norm(x, (D,), sd[b + "norm2.weight"], sd[b + "norm2.bias"], eps=1e-6)
        h = F.linear(F.gelu(F.linear(h, sd[b + "mlp.fc1.weight"], sd[b + "mlp.fc1.bias"])),
                     sd[b + "mlp.fc2.weight"], sd[b + "mlp.fc2.bias"])
        x = x + h
    return F.layer_norm(x, (D,), sd[v + "norm.weight"], sd[v + "norm.bias"], eps=1e-6)


def _ref_bert(sd, ids, mask, img):
    t = "blip.text_encoder."

    def lin(x, p):
        return F.linear(x, sd[p + ".weight"], sd[p + ".bias"])

    def lnorm(x, p):
        return F.layer_norm(x, (TW,), sd[p + ".weight"], sd[p + ".bias"], eps=1e-12)

    def attention(p, x, kv, kv_mask):
        B, L, _ = x.shape

        def heads(y):
            return y.reshape(B, y.shape[1], THEADS, TW // THEADS).transpose(1, 2)

        q, k, v = heads(lin(x, p + "self.query")), heads(lin(kv, p + "self.key")), heads(lin(kv, p + "self.value"))
        s = q @ k.transpose(-2, -1) / (TW // THEADS) ** 0.5 + (1.0 - kv_mask[:, None, None, :].float()) * -10000.0
        ctx = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, TW)
        return lnorm(lin(ctx, p + "output.dense") + x, p + "output.LayerNorm")

    L = ids.shape[1]
    x = sd[t + "embeddings.word_embeddings.weight"][ids] + sd[t + "embeddings.position_embeddings.weight"][:L]
    x = lnorm(x, t + "embeddings.LayerNorm")
    ones = torch.ones(img.shape[:2])
    for i in range(TDEPTH):
        b = f"{t}encoder.layer.{i}."
        x = attention(b + "attention.", x, x, mask)
        x = attention(b + "crossattention.", x, img, ones)
        x = lnorm(lin(F.gelu(lin(x, b + "intermediate.dense")), b + "output.dense") + x, b + "output.LayerNorm")
    return x


def test_imagereward_matches_hand_written_release_forward(release_dir):
    d, sd = release_dir
    r = build_reward("imagereward", checkpoint=str(d / "ImageReward.pt"), tokenizer_path=str(d / "bert-base-uncased"),
                     vit_heads=VHEADS, batch_size=2)
    imgs = np.random.default_rng(0).integers(0, 256, (3, 37, 50, 3), dtype=np.uint8)  # odd crop margin (11)
    got = r(imgs, PROMPTS)["imagereward"]
    assert got.shape == (3,)
    # preprocessing and tokenisation, by hand
    x = torch.stack([_ref_pixels(a) for a in imgs])
    torch.testing.assert_close(r.preprocess(imgs), x, atol=1e-6, rtol=0)
    tok = r.tokenize(PROMPTS)
    ids = {w: i for i, w in enumerate(VOCAB)}
    first = [ids["[CLS]"]] + [ids[w] for w in PROMPTS[0].split()] + [ids["[SEP]"]]
    assert tok["input_ids"].shape == (3, 35)
    assert tok["input_ids"][0].tolist() == first + [0] * (35 - len(first))
    assert tok["attention_mask"][0].tolist() == [1] * len(first) + [0] * (35 - len(first))
    assert len(r.tokenizer) == len(VOCAB) + 2  # + [DEC], [ENC] as the release
    with torch.no_grad():
        h = _ref_bert(sd, tok["input_ids"], tok["attention_mask"], _ref_vit(sd, x))[:, 0]
        for k in (0, 2, 4, 6, 7):
            h = F.linear(h, sd[f"mlp.layers.{k}.weight"], sd[f"mlp.layers.{k}.bias"])
    ref = (h[:, 0] - IMAGEREWARD_MEAN) / IMAGEREWARD_STD
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    assert float(ref.std()) > 1e-3  # the check is not vacuous: images/prompts change the score


def test_imagereward_clear_errors(tmp_path, release_dir):
    d, sd = release_dir
    tok = str(d / "bert-base-uncased")
    with pytest.raises(FileNotFoundError, match="ImageReward.pt"):
        ImageRewardReward(str(tmp_path / "ImageReward.pt"), tokenizer_path=tok)
    with pytest.raises(FileNotFoundError, match="med_config.json"):
        ImageRewardReward(str(d / "ImageReward.pt"), med_config=str(tmp_path / "med_config.json"), tokenizer_path=tok)
    with pytest.raises(FileNotFoundError, match="vocab.txt"):
        ImageRewardReward(str(d / "ImageReward.pt"), tokenizer_path=str(tmp_path), vit_heads=VHEADS)
    broken = dict(sd)
    del broken["blip.text_encoder.encoder.layer.1.crossattention.self.key.weight"]
    torch.save(broken, tmp_path / "ImageReward.pt")
    (tmp_path / "med_config.json").write_text((d / "med_config.json").read_text())
    with pytest.raises(ValueError, match=r"ImageReward.pt.*missing keys.*crossattention\.self\.key"):
        ImageRewardReward(str(tmp_path / "ImageReward.pt"), tokenizer_path=tok, vit_heads=VHEADS)
