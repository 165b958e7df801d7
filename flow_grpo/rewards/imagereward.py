"""ImageReward (Xu et al. 2023, THUDM/ImageReward) from its released checkpoint, built with transformers' BLIP.

Architecture (release ``ImageReward.py`` + ``models/BLIP``): BLIP's ViT-L/16 image encoder (224 px, width 1024,
24 blocks, 16 heads, LayerNorm eps 1e-6, final norm) and BLIP's "med" BERT text encoder (bert-base sizes from
``med_config.json``, cross-attention to the image tokens in every layer, no pooler), then the MLP head
``Linear(768,1024) Drop Linear(1024,128) Drop Linear(128,64) Drop Linear(64,16) Linear(16,1)`` (no activations).
transformers' ``BlipVisionModel`` and ``BlipTextModel`` are the same computations (the HF BLIP port); the
released parameter names are mapped onto them (:func:`release_to_hf_keys`):

    blip.visual_encoder.{cls_token, pos_embed, patch_embed.proj}  -> embeddings.{class_embedding,
                                                                     position_embedding, patch_embedding}
    blip.visual_encoder.blocks.i.{norm1, attn.qkv, attn.proj, norm2, mlp.fc1, mlp.fc2}
                                   -> encoder.layers.i.{layer_norm1, self_attn.qkv, self_attn.projection,
                                                        layer_norm2, mlp.fc1, mlp.fc2}
    blip.visual_encoder.norm       -> post_layernorm
    blip.text_encoder.*            -> the same BERT names (embeddings.*, encoder.layer.i.{attention,
                                      crossattention, intermediate, output}.*)
    mlp.layers.{0,2,4,6,7}         -> the head;  blip.{vision_proj, text_proj} are unused by the score.

Score (release ``ImageReward.score`` / ``inference_rank``, the path Flow-GRPO calls)::

    tokens = BertTokenizer(prompt, padding="max_length", truncation=True, max_length=35)   # [CLS] first
    e_I    = ViT(preprocess(image))                                  # all tokens, (1 + 196, 1024)
    h      = TextEncoder(tokens, attention_mask, encoder_hidden_states=e_I, encoder_attention_mask=1)
    r      = (MLP(h[:, 0]) - 0.16717362830052426) / 1.0333394966054072

Preprocessing: ``Resize(224, bicubic)`` of the shortest side on the PIL image, ``CenterCrop(224)``, RGB,
``ToTensor``, OpenAI CLIP mean/std -- torchvision's transforms, as the release.
Tokenizer: ``bert-base-uncased`` plus the two specials the release adds (``[DEC]`` as bos, ``[ENC]``), giving
the 30524-token vocabulary of ``med_config.json``.

Expected local files::

    /models/ImageReward/ImageReward.pt      # THUDM/ImageReward hub repo (a plain state dict)
    /models/ImageReward/med_config.json     # same repo (default: next to the checkpoint)
    /models/bert-base-uncased/vocab.txt     # the BERT tokenizer folder (+ tokenizer_config.json if present)

The release loads with ``strict=False`` (missing keys stay random); here every key the score uses must be
present with the right shape, or loading fails naming the file and the keys.  The ViT head count is not stored
in the weights: ``vit_heads`` defaults to ``width // 64`` (ViT-L: 16, ViT-B: 12, as BLIP).
"""
from __future__ import annotations

import json
import os
import re
from typing import Any

import numpy as np

from ._weights import load_strict, load_torch_state_dict, require_file
from .base import NanPolicy, Reward

__all__ = ["ImageRewardReward", "release_to_hf_keys", "IMAGEREWARD_MEAN", "IMAGEREWARD_STD"]

IMAGEREWARD_MEAN = 0.16717362830052426
IMAGEREWARD_STD = 1.0333394966054072
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
MAX_TEXT_LEN = 35

_VIT_RENAMES = [  # (release suffix regex, HF name); applied to keys under blip.visual_encoder.
    (r"^cls_token$", "embeddings.class_embedding"),
    (r"^pos_embed$", "embeddings.position_embedding"),
    (r"^patch_embed\.proj\.(weight|bias)$", r"embeddings.patch_embedding.\1"),
    (r"^blocks\.(\d+)\.norm1\.", r"encoder.layers.\1.layer_norm1."),
    (r"^blocks\.(\d+)\.norm2\.", r"encoder.layers.\1.layer_norm2."),
    (r"^blocks\.(\d+)\.attn\.qkv\.", r"encoder.layers.\1.self_attn.qkv."),
    (r"^blocks\.(\d+)\.attn\.proj\.", r"encoder.layers.\1.self_attn.projection."),
    (r"^blocks\.(\d+)\.mlp\.(fc1|fc2)\.", r"encoder.layers.\1.mlp.\2."),
    (r"^norm\.(weight|bias)$", r"post_layernorm.\1"),
]


def release_to_hf_keys(sd: dict) -> tuple[dict, dict, dict, list[str]]:
    """Split a released ImageReward state dict into (vision, text, mlp) dicts with HF names; also return the
    keys not used by the score (projections, buffers) -- and any unknown ViT key unchanged, so that a strict
    load reports it."""
    vision, text, mlp, unused = {}, {}, {}, []
    for k, v in sd.items():
        if k.startswith("blip.visual_encoder."):
            sub = k[len("blip.visual_encoder."):]
            for pat, rep in _VIT_RENAMES:
                if re.search(pat, sub):
                    sub = re.sub(pat, rep, sub)
                    break
            vision[sub] = v
        elif k.startswith("blip.text_encoder."):
            sub = k[len("blip.text_encoder."):]
            if sub == "embeddings.position_ids":  # a buffer (arange), persistent in old transformers
                unused.append(k)
                continue
            text[sub] = v
        elif k.startswith("mlp."):
            mlp[k[len("mlp."):]] = v
        else:
            unused.append(k)
    return vision, text, mlp, unused


def _vision_config(vision: dict, path: str, vit_heads: int | None):
    from transformers import BlipVisionConfig

    try:
        pos = vision["embeddings.position_embedding"]
        patch = vision["embeddings.patch_embedding.weight"]
        fc1 = vision["encoder.layers.0.mlp.fc1.weight"]
    except KeyError as e:
        raise ValueError(f"{path}: not an ImageReward checkpoint (no blip.visual_encoder weight {e})") from None
    width, p = int(patch.shape[0]), int(patch.shape[-1])
    grid = int(round((pos.shape[1] - 1) ** 0.5))
    if grid * grid != pos.shape[1] - 1:
        raise ValueError(f"{path}: pos_embed has {pos.shape[1] - 1} patch positions, not a square grid")
    depth = 1 + max(int(m.group(1)) for k in vision if (m := re.match(r"encoder\.layers\.(\d+)\.", k)))
    heads = int(vit_heads) if vit_heads else width // 64
    if heads < 1 or width % heads:
        raise ValueError(f"vit_heads={heads} does not divide the ViT width {width}")
    return BlipVisionConfig(hidden_size=width, intermediate_size=int(fc1.shape[0]), num_hidden_layers=depth,
                            num_attention_heads=heads, image_size=grid * p, patch_size=p, layer_norm_eps=1e-6,
                            hidden_act="gelu", attention_dropout=0.0)


def _text_config(med_config: str, encoder_width: int):
    from transformers import BlipTextConfig

    require_file(med_config, "ImageReward med_config.json (from the THUDM/ImageReward hub repo)")
    with open(med_config) as f:
        mc = json.load(f)
    need = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    missing = [k for k in need if k not in mc]
    if missing:
        raise ValueError(f"{med_config}: missing fields {missing}")
    if not mc.get("add_cross_attention", False):
        raise ValueError(f"{med_config}: add_cross_attention must be true (ImageReward's text encoder "
                         "cross-attends to the image in every layer)")
    return BlipTextConfig(
        vocab_size=mc["vocab_size"], hidden_size=mc["hidden_size"], intermediate_size=mc["intermediate_size"],
        num_hidden_layers=mc["num_hidden_layers"], num_attention_heads=mc["num_attention_heads"],
        max_position_embeddings=mc.get("max_position_embeddings", 512),
        layer_norm_eps=mc.get("layer_norm_eps", 1e-12), hidden_act=mc.get("hidden_act", "gelu"),
        pad_token_id=mc.get("pad_token_id", 0), encoder_hidden_size=encoder_width,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        is_decoder=True,  # builds the cross-attention modules; forward runs bidirectionally (is_decoder=False)
        bos_token_id=None, eos_token_id=None, sep_token_id=None)


def load_imagereward_tokenizer(tokenizer_path: str):
    """``bert-base-uncased`` from a local folder + the release's ``[DEC]`` (bos) and ``[ENC]`` specials."""
    from transformers import BertTokenizer

    require_file(os.path.join(tokenizer_path, "vocab.txt"), "ImageReward tokenizer vocab.txt (bert-base-uncased)")
    tok = BertTokenizer.from_pretrained(tokenizer_path)
    tok.add_special_tokens({"bos_token": "[DEC]"})
    tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    return tok


class ImageRewardReward(Reward):
    """ImageReward: ``r = (MLP(BLIP_text(prompt | ViT(x))[CLS]) - mean) / std`` (see module docstring).

    Args:
        checkpoint: local ``ImageReward.pt``.
        med_config: local ``med_config.json`` (default: next to the checkpoint).
        tokenizer_path: local ``bert-base-uncased`` tokenizer folder (``vocab.txt``).
        vit_heads: ViT attention heads (default ``width // 64``).
        device, batch_size, name (default ``"imagereward"``), nan_policy.
    """

    name = "imagereward"

    def __init__(self, checkpoint: str | None = None, med_config: str | None = None,
                 tokenizer_path: str | None = None, *, vit_heads: int | None = None, device: str = "cpu",
                 batch_size: int = 16, name: str | None = None, nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        import torch
        from transformers import BlipTextModel, BlipVisionModel

        from .clip import build_aesthetic_mlp

        if checkpoint is None or tokenizer_path is None:
            raise ValueError("ImageRewardReward needs checkpoint= (local ImageReward.pt) and tokenizer_path= "
                             "(local bert-base-uncased folder)")
        med_config = med_config or os.path.join(os.path.dirname(os.path.abspath(checkpoint)), "med_config.json")
        # every file is checked before the (1.7 GB) checkpoint is read
        require_file(checkpoint, "ImageReward checkpoint (ImageReward.pt from THUDM/ImageReward)")
        require_file(med_config, "ImageReward med_config.json (from the THUDM/ImageReward hub repo)")
        require_file(os.path.join(tokenizer_path, "vocab.txt"), "ImageReward tokenizer vocab.txt (bert-base-uncased)")
        sd = load_torch_state_dict(checkpoint, "ImageReward checkpoint (ImageReward.pt from THUDM/ImageReward)")
        vision_sd, text_sd, mlp_sd, _ = release_to_hf_keys(sd)
        vcfg = _vision_config(vision_sd, checkpoint, vit_heads)
        tcfg = _text_config(med_config, vcfg.hidden_size)
        self.vision = BlipVisionModel(vcfg)
        self.text = BlipTextModel(tcfg, add_pooling_layer=False)
        self.mlp = build_aesthetic_mlp(tcfg.hidden_size)
        hint = f"(med_config {med_config}; ViT heads {vcfg.num_attention_heads})"
        load_strict(self.vision, vision_sd, checkpoint, "blip.visual_encoder " + hint)
        load_strict(self.text, text_sd, checkpoint, "blip.text_encoder " + hint)
        load_strict(self.mlp, mlp_sd, checkpoint, "mlp head")
        self.tokenizer = load_imagereward_tokenizer(tokenizer_path)
        if len(self.tokenizer) > tcfg.vocab_size:
            raise ValueError(f"tokenizer {tokenizer_path} has {len(self.tokenizer)} tokens (with [DEC], [ENC]) but "
                             f"{med_config} says vocab_size={tcfg.vocab_size}")
        for m in (self.vision, self.text, self.mlp):
            m.to(device).eval()
        self.image_size = int(vcfg.image_size)
        self.device = device
        self.batch_size = int(batch_size)
        del torch

    def preprocess(self, images: np.ndarray):
        """(N, H, W, 3) uint8 -> (N, 3, S, S): the release's torchvision transform (see module docstring)."""
        import torch
        from PIL import Image
        from torchvision.transforms import CenterCrop, Compose, InterpolationMode, Normalize, Resize, ToTensor

        tf = Compose([Resize(self.image_size, interpolation=InterpolationMode.BICUBIC), CenterCrop(self.image_size),
                      ToTensor(), Normalize(OPENAI_CLIP_MEAN, OPENAI_CLIP_STD)])
        return torch.stack([tf(Image.fromarray(a).convert("RGB")) for a in images])

    def tokenize(self, prompts):
        return self.tokenizer(list(prompts), padding="max_length", truncation=True, max_length=MAX_TEXT_LEN,
                              return_tensors="pt")

    def score(self, images, prompts, metadata, **kwargs: Any):
        import torch

        out = []
        with torch.no_grad():
            for s in range(0, images.shape[0], self.batch_size):
                x = self.preprocess(images[s:s + self.batch_size]).to(self.device)
                t = self.tokenize(prompts[s:s + self.batch_size])
                e_img = self.vision(pixel_values=x).last_hidden_state
                h = self.text(input_ids=t["input_ids"].to(self.device),
                              attention_mask=t["attention_mask"].to(self.device),
                              encoder_hidden_states=e_img,
                              encoder_attention_mask=torch.ones(e_img.shape[:2], dtype=torch.long,
                                                                device=self.device)).last_hidden_state
                r = self.mlp(h[:, 0].float()).reshape(-1)
                out.append(((r - IMAGEREWARD_MEAN) / IMAGEREWARD_STD).cpu())
        return torch.cat(out)
