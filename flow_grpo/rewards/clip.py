"""CLIP-based rewards: CLIP score (open_clip), LAION aesthetic MLP, PickScore/HPS-style preference scorers (HF).

All weights are local: ``pretrained`` / ``mlp_path`` / ``model_path`` / ``processor_path`` are files or folders
on disk (no hub access).

* CLIP score: ``r = scale * max(cos(f_I, f_T), clamp_min)`` with ``f_I = E_img(x)``,
  ``f_T = E_txt(prefix + prompt)``.  Raw cosine by default.  Hessel et al.'s CLIPScore (jmhessel/clipscore) is
  the ``clipscore_hessel`` preset: ``scale=2.5, clamp_min=0, prefix="A photo depicts "``, OpenAI ViT-B/32.
  Image preprocessing = open_clip's eval transform = the release's: PIL bicubic resize of the shortest side to
  224, centre crop 224, RGB, ToTensor, OpenAI mean/std.  OpenAI weights need the QuickGELU architecture:
  ``model_name="ViT-B-32-quickgelu"`` with an open_clip state dict of the OpenAI weights (a local file does not
  tell open_clip it is OpenAI's, so plain ``"ViT-B-32"`` would silently use GELU).
  (Flow-GRPO's ``clipscore`` reward is a different scorer: HF ``openai/clip-vit-large-patch14``,
  ``logits_per_image / 30 = 100 cos / 30``, with a *bilinear* tensor resize of the [0, 1] image; use
  ``clip_preference`` with ``use_logit_scale=True, scale=1/30, image_backend="torchvision"`` for it -- its
  resize is bicubic there, the remaining difference.)
* Aesthetic (LAION "improved aesthetic predictor"): ``r = MLP(f_I / ||f_I||)`` where
  ``MLP = Linear(d,1024) Drop Linear(1024,128) Drop Linear(128,64) Drop Linear(64,16) Linear(16,1)`` (no
  activations, as released; parameter names ``layers.{0,2,4,6,7}`` match the released ``.pth``).
* CLIP preference (PickScore / HPS style), HF ``CLIPModel`` + CLIP processor, two separate folders:
  ``r = scale * (exp(logit_scale) if use_logit_scale else 1) * cos(f_I, f_T)``.
  PickScore: ``use_logit_scale=True, scale=1/26`` (Flow-GRPO's scaling); HPS-style: raw cosine.
  (The official HPSv2 weights are an open_clip ViT-H-14 checkpoint with its own letterbox preprocessing: the
  ``hpsv2`` reward, :mod:`flow_grpo.rewards.hps`.)
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
    "clipscore_hessel",
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
    """``r = scale * max(cos(E_img(x), E_txt(prefix + prompt)), clamp_min)`` with open_clip.

    Args: ``model_name`` (open_clip config), ``pretrained`` (local weights file), or a ready ``model``
    (+ optional ``preprocess``/``tokenizer``); ``model_config`` (JSON for custom architectures);
    ``scale``/``clamp_min``/``prefix`` (``2.5``/``0.0``/``"A photo depicts "`` give Hessel's CLIPScore, see
    :func:`clipscore_hessel`); ``device``; ``batch_size``.
    """

    name = "clip_score"

    def __init__(self, model_name: str = "ViT-B-32", pretrained: str | None = None, *, model=None, preprocess=None,
                 tokenizer=None, model_config: str | None = None, scale: float = 1.0,
                 clamp_min: float | None = None, prefix: str = "", device: str = "cpu", batch_size: int = 32,
                 name: str | None = None, nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        self.clip = _OpenCLIP(model_name, pretrained, model, preprocess, tokenizer, device, model_config, batch_size)
        self.scale = float(scale)
        self.clamp_min = clamp_min
        self.prefix = str(prefix)

    def score(self, images, prompts, metadata, **kwargs: Any):
        texts = [self.prefix + p for p in prompts]
        cos = (self.clip.image_features(images) * self.clip.text_features(texts)).sum(dim=-1)
        if self.clamp_min is not None:
            cos = cos.clamp(min=self.clamp_min)
        return self.scale * cos


def clipscore_hessel(pretrained: str | None = None, **kwargs: Any) -> CLIPScoreReward:
    """Hessel et al. (2021) CLIPScore as jmhessel/clipscore computes it: ``2.5 * max(cos, 0)`` with the caption
    prefixed by ``"A photo depicts "``, OpenAI ViT-B/32 (open_clip ``ViT-B-32-quickgelu``; ``pretrained`` = a
    local open_clip state dict of the OpenAI weights), images resized (bicubic, shortest side) + centre-cropped
    to 224 and normalised with the OpenAI mean/std."""
    kwargs.setdefault("model_name", "ViT-B-32-quickgelu")
    kwargs.setdefault("scale", 2.5)
    kwargs.setdefault("clamp_min", 0.0)
    kwargs.setdefault("prefix", "A photo depicts ")
    kwargs.setdefault("name", "clipscore_hessel")
    return CLIPScoreReward(pretrained=pretrained, **kwargs)


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


def _require_hf_folder(path: str, what: str, need: Sequence[Sequence[str]]) -> None:
    """``path`` must be a folder holding, for each group in ``need``, at least one of the files named."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{what} folder not found: {path}")
    for group in need:
        if not any(os.path.isfile(os.path.join(path, f)) for f in group):
            raise FileNotFoundError(f"{what} folder {path} lacks {' or '.join(group)}")


_HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
               "pytorch_model.bin.index.json")
_HF_TOKENIZER = ("tokenizer.json", "vocab.json")


def _pooled(out):
    """transformers 5 returns an output object from ``get_*_features`` (projected features = pooler_output)."""
    return out if hasattr(out, "dim") else out.pooler_output


class CLIPPreferenceReward(Reward):
    """PickScore/HPS-style scorer: a HF ``CLIPModel`` (``model_path``) + a CLIP processor (``processor_path``).

    ``r = scale * (exp(logit_scale) if use_logit_scale else 1) * cos(f_I, f_T)``, features = the projection
    heads' outputs, L2-normalised.  Prompts: ``padding=True, truncation=True, max_length=77``.

    Two folders, never merged (the PickScore release loads its processor from the CLIP-H repo and its model from
    the PickScore repo): ``processor_path`` needs ``preprocessor_config.json`` + tokenizer files, ``model_path``
    needs ``config.json`` + weights.  ``path=`` sets both (one folder holding everything).
    ``image_backend="pil"`` (default) is the PIL processor the releases ran (transformers 4.x: PIL bicubic resize
    of the shortest side on uint8, centre crop with floor offsets, rescale 1/255, normalise);
    ``"torchvision"`` is transformers 5's default fast processor (results differ by resampling details).
    """

    name = "clip_preference"

    def __init__(self, path: str | None = None, *, model_path: str | None = None, processor_path: str | None = None,
                 model=None, processor=None, image_backend: str = "pil", use_logit_scale: bool = False,
                 scale: float = 1.0, device: str = "cpu", batch_size: int = 32, name: str | None = None,
                 nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        if image_backend not in ("pil", "torchvision"):
            raise ValueError(f"image_backend must be 'pil' or 'torchvision', got {image_backend!r}")
        model_path = model_path or path
        processor_path = processor_path or path
        if model is None:
            if model_path is None:
                raise ValueError(f"{type(self).__name__}: pass model_path= (a local CLIPModel folder) or model=")
            _require_hf_folder(model_path, f"{self.name} model", [("config.json",), _HF_WEIGHTS])
            from transformers import CLIPModel

            model = CLIPModel.from_pretrained(model_path)
        if processor is not None:
            self.tokenizer, self.image_processor = processor.tokenizer, processor.image_processor
        else:
            if processor_path is None:
                raise ValueError(f"{type(self).__name__}: pass processor_path= (a local CLIP processor folder, "
                                 "e.g. laion/CLIP-ViT-H-14-laion2B-s32B-b79K for PickScore) or processor=")
            _require_hf_folder(processor_path, f"{self.name} processor",
                               [("preprocessor_config.json", "processor_config.json"), _HF_TOKENIZER])
            from transformers import AutoTokenizer, CLIPImageProcessor, CLIPImageProcessorPil

            ip_cls = CLIPImageProcessorPil if image_backend == "pil" else CLIPImageProcessor
            self.image_processor = ip_cls.from_pretrained(processor_path)
            self.tokenizer = AutoTokenizer.from_pretrained(processor_path)
        self.model = model.to(device).eval()
        self.use_logit_scale = bool(use_logit_scale)
        self.scale = float(scale)
        self.device = device
        self.batch_size = int(batch_size)

    def _features(self, images: np.ndarray, prompts: Sequence[str]):
        """L2-normalised (image, text) features, (N, D) each, float32 on CPU."""
        import torch
        import torch.nn.functional as F
        from PIL import Image

        fi, ft = [], []
        with torch.no_grad():
            for s in range(0, images.shape[0], self.batch_size):
                pix = self.image_processor(images=[Image.fromarray(a) for a in images[s:s + self.batch_size]],
                                           return_tensors="pt")["pixel_values"]
                txt = self.tokenizer(list(prompts[s:s + self.batch_size]), padding=True, truncation=True,
                                     max_length=77, return_tensors="pt")
                fi.append(_pooled(self.model.get_image_features(pixel_values=pix.to(self.device))).float())
                ft.append(_pooled(self.model.get_text_features(input_ids=txt["input_ids"].to(self.device),
                                                               attention_mask=txt["attention_mask"].to(self.device)
                                                               )).float())
        return F.normalize(torch.cat(fi), dim=-1).cpu(), F.normalize(torch.cat(ft), dim=-1).cpu()

    def logits(self, images: np.ndarray, prompts: Sequence[str]):
        """``exp(logit_scale) * cos(f_I, f_T)`` per pair, (N,): the release's PickScore before any scaling."""
        fi, ft = self._features(images, prompts)
        return self.model.logit_scale.exp().float().cpu() * (fi * ft).sum(dim=-1)

    def score(self, images, prompts, metadata, **kwargs: Any):
        fi, ft = self._features(images, prompts)
        cos = (fi * ft).sum(dim=-1)
        if self.use_logit_scale:
            cos = self.model.logit_scale.exp().float().cpu() * cos
        return self.scale * cos

    def preference_probs(self, images, prompt: str):
        """The release's ``calc_probs``: ``softmax_i(exp(logit_scale) * cos(f_I_i, f_T))`` over N images of one
        prompt, (N,) summing to 1 (a preference distribution; the training reward is :meth:`score`)."""
        import torch

        from ..media import to_uint8_nhwc

        imgs = to_uint8_nhwc(images)
        return torch.softmax(self.logits(imgs, [prompt] * imgs.shape[0]), dim=0)

    def compare(self, images_a, images_b, prompts, metadata=None):
        """Pairwise scorer (:class:`~flow_grpo.rewards.base.PairwiseScorer`): ``P(a > b)`` = the release's
        two-image softmax ``= sigmoid(l_a - l_b)`` with ``l = exp(logit_scale) * cos``; (M,) in [0, 1]."""
        import torch

        m = images_a.shape[0]
        lg = self.logits(np.concatenate([images_a, images_b]), list(prompts) * 2)
        return torch.sigmoid(lg[:m] - lg[m:])


def pickscore(model_path: str | None = None, processor_path: str | None = None, **kwargs: Any
              ) -> CLIPPreferenceReward:
    """PickScore (Kirstain et al. 2023): ``r = exp(logit_scale) * cos(f_I, f_T) / 26`` (Flow-GRPO's 1/26).

    Local layout: two folders, as the release loads them, always given as these two settings (the one convention
    of the code and docs; ``flow_grpo make-tiny-reward DIR pickscore`` writes a tiny random pair)::

        reward.kwargs='{pickscore: {model_path: /models/PickScore_v1,                      # config.json, weights
                                    processor_path: /models/CLIP-ViT-H-14-laion2B-s32B-b79K}}'  # processor, tokenizer

    The release's own ``calc_probs`` is a softmax over the images of one prompt (``preference_probs``); its
    raw score (``logits``) is ``exp(logit_scale) * cos`` (logit_scale ~ 4.6, so raw ~ 18-23); ``scale=1`` gives
    it unscaled.  ``compare`` is the two-image softmax, a pairwise judge for Pref-GRPO's win rate.
    """
    if "path" in kwargs:
        raise ValueError("pickscore takes model_path= (the PickScore_v1 folder) and processor_path= (the "
                         "CLIP-ViT-H-14-laion2B-s32B-b79K folder), the release's two folders; not path=")
    kwargs.setdefault("name", "pickscore")
    kwargs.setdefault("use_logit_scale", True)
    kwargs.setdefault("scale", 1.0 / 26.0)
    return CLIPPreferenceReward(model_path=model_path, processor_path=processor_path, **kwargs)


pickscore.required_settings = ("model_path", "processor_path")  # checked before any model loads (config files)


def hps(path: str | None = None, **kwargs: Any) -> CLIPPreferenceReward:
    """HPS-style raw cosine ``r = cos(f_I, f_T)`` from a HF CLIPModel folder (NOT the official HPSv2 weights,
    which are an open_clip checkpoint: use the ``hpsv2`` reward, :mod:`flow_grpo.rewards.hps`)."""
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

