"""CLIP-based rewards: CLIP score (open_clip), LAION aesthetic MLP, PickScore/HPS-style preference scorers (HF).

All weights are local: ``pretrained`` / ``mlp_path`` / ``path`` are files or folders on disk (no hub access).

* CLIP score: ``r = scale * max(cos(f_I, f_T), clamp_min)`` with ``f_I = E_img(x)``, ``f_T = E_txt(prompt)``.
  Raw cosine by default; Hessel et al.'s CLIPScore is ``scale=2.5, clamp_min=0``.
* Aesthetic (LAION "improved aesthetic predictor"): ``r = MLP(f_I / ||f_I||)`` where
  ``MLP = Linear(d,1024) Drop Linear(1024,128) Drop Linear(128,64) Drop Linear(64,16) Linear(16,1)`` (no
  activations, as released; parameter names ``layers.{0,2,4,6,7}`` match the released ``.pth``).
* CLIP preference (PickScore / HPS style), HF ``CLIPModel``:
  ``r = scale * (exp(logit_scale) if use_logit_scale else 1) * cos(f_I, f_T)``.
  PickScore: ``use_logit_scale=True, scale=1/26`` (Flow-GRPO's scaling); HPS-style: raw cosine.
  (The official HPSv2 weights are an open_clip ViT-H-14 checkpoint: load them with ``clip_score``,
  ``model_name="ViT-H-14", pretrained=<file>``; HPS = raw cosine.)
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import NanPolicy, Reward

__all__ = [
    "load_open_clip",
    "CLIPScoreReward",
    "AestheticReward",
    "build_aesthetic_mlp",
    "CLIPPreferenceReward",
    "pickscore",
    "hps",
    "hf_clip_tokenizer_from_open_clip",
]


def _looks_like_path(p: str) -> bool:
    return os.sep in p or p.endswith((".pt", ".pth", ".bin", ".safetensors", ".ckpt"))


def load_open_clip(model_name: str, pretrained: str | None = None, device: str = "cpu",
                   model_config: str | None = None):
    """Build ``(model, preprocess, tokenizer)`` with open_clip from local weights.

    ``model_config``: optional path to an open_clip model-config JSON (registered under its file stem, which
    must equal ``model_name``) for architectures open_clip does not ship (e.g. tiny test models).
    ``pretrained``: a local checkpoint file, or None for random weights.
    """
    import open_clip

    if model_config is not None:
        stem = os.path.splitext(os.path.basename(model_config))[0]
        if stem != model_name:
            raise ValueError(f"model_config file stem {stem!r} must equal model_name {model_name!r}")
        open_clip.add_model_config(model_config)
    if pretrained is not None and _looks_like_path(pretrained) and not os.path.isfile(pretrained):
        raise FileNotFoundError(f"open_clip weights not found: {pretrained}")
    model, _, preprocess = open_clip.create_model_and_transforms(model_name, pretrained=pretrained, device=device)
    tokenizer = open_clip.get_tokenizer(model_name)
    return model.eval(), preprocess, tokenizer


class _OpenCLIP:
    """Holds an open_clip model + PIL preprocess + tokenizer; encodes uint8 NHWC images and prompts."""

    def __init__(self, model_name: str = "ViT-B-32", pretrained: str | None = None, model=None, preprocess=None,
                 tokenizer=None, device: str = "cpu", model_config: str | None = None, batch_size: int = 32):
        if model is None:
            model, preprocess_loaded, tokenizer_loaded = load_open_clip(model_name, pretrained, device, model_config)
            preprocess = preprocess or preprocess_loaded
            tokenizer = tokenizer or tokenizer_loaded
        else:
            import open_clip

            if preprocess is None:
                # Same transform open_clip would build: resize shortest side + centre crop + CLIP mean/std.
                size = model.visual.image_size
                preprocess = open_clip.image_transform(size[0] if isinstance(size, (tuple, list)) else size,
                                                       is_train=False)
            if tokenizer is None:
                tokenizer = open_clip.get_tokenizer(model_name)
        self.model = model.to(device).eval()
        self.preprocess = preprocess
        self.tokenizer = tokenizer
        self.device = device
        self.batch_size = int(batch_size)

    def image_features(self, images: np.ndarray):
        """L2-normalised image features (N, D) float32."""
        import torch
        import torch.nn.functional as F
        from PIL import Image

        feats = []
        with torch.no_grad():
            for s in range(0, images.shape[0], self.batch_size):
                x = torch.stack([self.preprocess(Image.fromarray(im)) for im in images[s:s + self.batch_size]])
                feats.append(self.model.encode_image(x.to(self.device)).float())
        return F.normalize(torch.cat(feats), dim=-1).cpu()

    def text_features(self, prompts: Sequence[str]):
        import torch
        import torch.nn.functional as F

        feats = []
        with torch.no_grad():
            for s in range(0, len(prompts), self.batch_size):
                t = self.tokenizer(list(prompts[s:s + self.batch_size]))
                feats.append(self.model.encode_text(t.to(self.device)).float())
        return F.normalize(torch.cat(feats), dim=-1).cpu()


class CLIPScoreReward(Reward):
    """``r = scale * max(cos(E_img(x), E_txt(prompt)), clamp_min)`` with open_clip.

    Args: ``model_name`` (open_clip config), ``pretrained`` (local weights file), or a ready ``model``
    (+ optional ``preprocess``/``tokenizer``); ``model_config`` (JSON for custom architectures);
    ``scale``/``clamp_min`` (``2.5``/``0.0`` gives Hessel's CLIPScore); ``device``; ``batch_size``.
    """

    name = "clip_score"

    def __init__(self, model_name: str = "ViT-B-32", pretrained: str | None = None, *, model=None, preprocess=None,
                 tokenizer=None, model_config: str | None = None, scale: float = 1.0,
                 clamp_min: float | None = None, device: str = "cpu", batch_size: int = 32,
                 name: str | None = None, nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        self.clip = _OpenCLIP(model_name, pretrained, model, preprocess, tokenizer, device, model_config, batch_size)
        self.scale = float(scale)
        self.clamp_min = clamp_min

    def score(self, images, prompts, metadata, **kwargs: Any):
        cos = (self.clip.image_features(images) * self.clip.text_features(prompts)).sum(dim=-1)
        if self.clamp_min is not None:
            cos = cos.clamp(min=self.clamp_min)
        return self.scale * cos


def build_aesthetic_mlp(input_dim: int = 768):
    """The LAION improved-aesthetic-predictor head (see module docstring); parameter names match the release."""
    import torch.nn as nn

    class AestheticMLP(nn.Module):
        def __init__(self, d: int):
            super().__init__()
            self.input_dim = d
            self.layers = nn.Sequential(
                nn.Linear(d, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
                nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1))

        def forward(self, x):
            return self.layers(x)

    return AestheticMLP(input_dim)


def _load_state_dict(path: str) -> dict:
    import torch

    if not os.path.isfile(path):
        raise FileNotFoundError(f"weights not found: {path}")
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    sd = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    return sd


class AestheticReward(Reward):
    """``r = MLP(f_I / ||f_I||)`` on open_clip image features (LAION aesthetic predictor v2 layout).

    ``mlp_path``: local ``.pth``/``.safetensors`` state dict of the head, or pass ``mlp`` (a module).
    The CLIP backbone is given as for :class:`CLIPScoreReward` (the released head expects ViT-L-14, d=768).
    """

    name = "aesthetic"

    def __init__(self, mlp_path: str | None = None, model_name: str = "ViT-L-14", pretrained: str | None = None, *,
                 mlp=None, model=None, preprocess=None, model_config: str | None = None, device: str = "cpu",
                 batch_size: int = 32, name: str | None = None, nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        self.clip = _OpenCLIP(model_name, pretrained, model, preprocess, _no_tokenizer, device, model_config,
                              batch_size)
        embed_dim = getattr(self.clip.model.visual, "output_dim", None)
        if mlp is None:
            if mlp_path is None:
                raise ValueError("AestheticReward needs mlp_path (local weights) or mlp")
            sd = _load_state_dict(mlp_path)
            w0 = sd.get("layers.0.weight")
            if w0 is None:
                raise ValueError(f"{mlp_path}: not an aesthetic-MLP state dict (no 'layers.0.weight'; "
                                 f"keys {sorted(sd)[:6]})")
            mlp = build_aesthetic_mlp(int(w0.shape[1]))
            mlp.load_state_dict(sd)
        self.mlp = mlp.to(device).eval()
        d_in = getattr(self.mlp, "input_dim", None)
        if d_in is not None and embed_dim is not None and d_in != embed_dim:
            raise ValueError(f"aesthetic MLP expects {d_in}-d features but the CLIP model gives {embed_dim}-d")
        self.device = device

    def score(self, images, prompts, metadata, **kwargs: Any):
        import torch

        f = self.clip.image_features(images)
        with torch.no_grad():
            return self.mlp(f.to(self.device)).float().reshape(-1).cpu()


def _no_tokenizer(texts):  # aesthetic score never tokenises; avoids building one
    raise RuntimeError("the aesthetic reward does not encode text")


class CLIPPreferenceReward(Reward):
    """PickScore/HPS-style scorer from a local HF folder holding ``CLIPModel`` + ``CLIPProcessor``.

    ``r = scale * (exp(logit_scale) if use_logit_scale else 1) * cos(f_I, f_T)`` (features from the
    projection heads, L2-normalised).  Prompts are truncated to the tokenizer's max length (77 for CLIP).
    """

    name = "clip_preference"

    def __init__(self, path: str | None = None, *, model=None, processor=None, use_logit_scale: bool = False,
                 scale: float = 1.0, device: str = "cpu", batch_size: int = 32, name: str | None = None,
                 nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        if model is None or processor is None:
            if path is None:
                raise ValueError(f"{type(self).__name__}: pass path= (a local CLIPModel folder) or model+processor")
            if not os.path.isdir(path):
                raise FileNotFoundError(f"CLIP checkpoint folder not found: {path}")
            from transformers import CLIPModel, CLIPProcessor

            model = model or CLIPModel.from_pretrained(path)
            processor = processor or CLIPProcessor.from_pretrained(path)
        self.model = model.to(device).eval()
        self.processor = processor
        self.use_logit_scale = bool(use_logit_scale)
        self.scale = float(scale)
        self.device = device
        self.batch_size = int(batch_size)

    def score(self, images, prompts, metadata, **kwargs: Any):
        import torch

        res = []
        with torch.no_grad():
            for s in range(0, images.shape[0], self.batch_size):
                inp = self.processor(text=list(prompts[s:s + self.batch_size]),
                                     images=list(images[s:s + self.batch_size]),
                                     return_tensors="pt", padding=True, truncation=True, max_length=77)
                inp = {k: v.to(self.device) for k, v in inp.items()}
                out = self.model(**inp)
                img = torch.nn.functional.normalize(out.image_embeds.float(), dim=-1)
                txt = torch.nn.functional.normalize(out.text_embeds.float(), dim=-1)
                cos = (img * txt).sum(dim=-1)
                if self.use_logit_scale:
                    cos = self.model.logit_scale.exp().float() * cos
                res.append(self.scale * cos.cpu())
        return torch.cat(res)


def pickscore(path: str | None = None, **kwargs: Any) -> CLIPPreferenceReward:
    """PickScore: ``r = exp(logit_scale) * cos / 26`` (Flow-GRPO's 1/26 scaling)."""
    kwargs.setdefault("name", "pickscore")
    kwargs.setdefault("use_logit_scale", True)
    kwargs.setdefault("scale", 1.0 / 26.0)
    return CLIPPreferenceReward(path, **kwargs)


def hps(path: str | None = None, **kwargs: Any) -> CLIPPreferenceReward:
    """HPS-style: ``r = cos(f_I, f_T)`` from a HF CLIPModel folder."""
    kwargs.setdefault("name", "hps")
    kwargs.setdefault("use_logit_scale", False)
    return CLIPPreferenceReward(path, **kwargs)


def hf_clip_tokenizer_from_open_clip(**kwargs: Any):
    """A HF ``CLIPTokenizer`` built offline from open_clip's shipped CLIP BPE (vocab 49408).

    Token ids equal open_clip's; the only difference is padding (HF pads with ``<|endoftext|>`` = 49407,
    open_clip with 0).
    """
    import open_clip
    from transformers import CLIPTokenizer

    st = open_clip.tokenizer.SimpleTokenizer()
    vocab = dict(st.encoder)
    # open_clip names the specials <start_of_text>/<end_of_text>; HF CLIP uses <|startoftext|>/<|endoftext|>.
    for old, new in (("<start_of_text>", "<|startoftext|>"), ("<end_of_text>", "<|endoftext|>")):
        if old in vocab:
            vocab[new] = vocab.pop(old)
    merges = [m for m, _ in sorted(st.bpe_ranks.items(), key=lambda kv: kv[1])]
    return CLIPTokenizer(vocab=vocab, merges=merges, **kwargs)

