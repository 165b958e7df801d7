"""HPSv2 / HPSv2.1 (Human Preference Score v2, Wu et al. 2023) from a local checkpoint, as the release scores.

Formula (release ``hpsv2/img_score.py``): ``r = cos(f_I, f_T)`` = the diagonal of ``image_features @ text_features.T``
where both features come out of the open_clip ``ViT-H-14`` forward, which L2-normalises them.  No logit scale,
no offset: scores are raw cosines (typically ~0.2-0.35 for real generations).

Preprocessing (the release builds its model with ``light_augmentation=True``, so its *val* transform is
``ResizeMaxSize``, a letterbox -- not open_clip's usual resize-shortest + centre-crop):

1. convert to RGB, ``ToTensor`` (float in [0, 1], C x H x W) -- the resize runs on the float tensor, not on PIL;
2. ``scale = S / max(H, W)`` (S = 224, the model's ``visual.image_size``); if ``scale != 1``: resize to
   ``(round(H * scale), round(W * scale))`` with bicubic interpolation (torchvision tensor resize, antialias as
   torchvision >= 0.17 does by default), then zero-pad to S x S: left/top ``pad // 2``, right/bottom the rest;
3. normalise with the OpenAI CLIP mean/std ``(0.48145466, 0.4578275, 0.40821073)`` /
   ``(0.26862954, 0.26130258, 0.27577711)`` (ViT-H-14 ``laion2B-s32B-b79K`` has no own mean/std).

Text: open_clip's ``ViT-H-14`` tokenizer (CLIP BPE, context 77, truncation keeps ``<end_of_text>`` last).

Deliberate deviations (documented, each with its switch):

* The release skips the padding when ``scale == 1`` (longest side already 224): a non-square image then reaches
  the ViT unpadded and the release crashes; we pad in that case too (square images are unaffected).
* The release runs under CUDA fp16 autocast; we score in the model's dtype (fp32 by default).
  ``antialias=False`` reproduces torchvision < 0.17 (the tensor resize then had no antialiasing).

Expected local files (the release downloads them from the hub; here they are local paths)::

    /models/HPSv2/HPS_v2.1_compressed.pt   # or HPS_v2_compressed.pt (HPSv2.0); a dict with "state_dict"
                                           # holding the full open_clip ViT-H-14 CLIP weights (image + text)

The architecture is open_clip's ``ViT-H-14`` config (shipped with open_clip; no pretrained download is needed:
all weights come from the HPS checkpoint).  ``model_name`` + ``model_config`` select another open_clip
architecture (tests use a tiny one).
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from ._weights import load_strict, load_torch_state_dict, require_file
from .base import NanPolicy, Reward

__all__ = ["HPSv2Reward", "hps_preprocess", "load_hps_checkpoint", "OPENAI_CLIP_MEAN", "OPENAI_CLIP_STD"]

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HPS_FILES = {"v2.0": "HPS_v2_compressed.pt", "v2.1": "HPS_v2.1_compressed.pt"}


def hps_preprocess(image_u8: np.ndarray, size: int, antialias: bool = True, pad_when_unscaled: bool = True):
    """One uint8 (H, W, 3) image -> the release's val tensor (3, size, size), float32 (see module docstring)."""
    import torch
    import torch.nn.functional as F
    import torchvision.transforms.functional as TF
    from torchvision.transforms import InterpolationMode

    x = torch.from_numpy(np.ascontiguousarray(image_u8)).permute(2, 0, 1).float().div(255.0)  # ToTensor
    h, w = int(x.shape[1]), int(x.shape[2])
    scale = size / float(max(h, w))
    if scale != 1.0:
        h, w = round(h * scale), round(w * scale)  # Python round, as the release
        x = TF.resize(x, [h, w], interpolation=InterpolationMode.BICUBIC, antialias=antialias)
    if scale != 1.0 or pad_when_unscaled:
        ph, pw = size - h, size - w
        x = F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2), value=0.0)  # black, before normalising
    mean = torch.tensor(OPENAI_CLIP_MEAN).view(3, 1, 1)
    std = torch.tensor(OPENAI_CLIP_STD).view(3, 1, 1)
    return (x - mean) / std


def _check_hps_file(checkpoint: str) -> None:
    require_file(checkpoint, f"HPSv2 checkpoint (the release file {HPS_FILES['v2.1']} or {HPS_FILES['v2.0']} "
                             "from the xswu/HPSv2 hub repo, downloaded locally)")


def load_hps_checkpoint(model, checkpoint: str) -> None:
    """Load an HPS ``.pt`` (``{"state_dict": ...}`` or a bare state dict) into an open_clip model, strictly.

    ``torch.load(weights_only=True)``: nothing in the file runs code.  Raises naming the file on a missing file,
    and listing missing / unexpected / wrongly shaped keys on an architecture mismatch.
    """
    _check_hps_file(checkpoint)
    sd = load_torch_state_dict(checkpoint, "HPSv2 checkpoint")
    if sd and all(k.startswith("module.") for k in sd):  # a DDP-saved checkpoint
        sd = {k[len("module."):]: v for k, v in sd.items()}
    load_strict(model, sd, checkpoint, "is model_name right (HPSv2 = open_clip ViT-H-14)?")


class HPSv2Reward(Reward):
    """HPSv2 / HPSv2.1: ``r = cos(E_img(x), E_txt(prompt))`` of open_clip ViT-H-14 + the HPS checkpoint.

    Args:
        checkpoint: local HPS checkpoint file (``HPS_v2.1_compressed.pt`` for HPSv2.1, ``HPS_v2_compressed.pt``
            for HPSv2.0); required unless ``model`` is given.
        model_name: open_clip architecture (``"ViT-H-14"``, as the release).
        model_config: optional open_clip config JSON (file stem = ``model_name``) for custom architectures.
        model / tokenizer: a ready open_clip model (+ tokenizer) instead of loading (weights as they are).
        antialias: bicubic resize with antialiasing (torchvision >= 0.17 default; False = older torchvision).
        pad_when_unscaled: pad non-square images whose longest side already equals the input size (the release
            does not, and then fails; see module docstring).
        device, batch_size, name (default ``"hpsv2"``), nan_policy.
    """

    name = "hpsv2"

    def __init__(self, checkpoint: str | None = None, *, model_name: str = "ViT-H-14",
                 model_config: str | None = None, model=None, tokenizer=None, antialias: bool = True,
                 pad_when_unscaled: bool = True, device: str = "cpu", batch_size: int = 16,
                 name: str | None = None, nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        import open_clip

        if model is None:
            if checkpoint is None:
                raise ValueError("HPSv2Reward needs checkpoint= (local HPS_v2.1_compressed.pt) or model=")
            _check_hps_file(checkpoint)  # fail before building a 1B-parameter model
            if model_config is not None:
                stem = os.path.splitext(os.path.basename(model_config))[0]
                if stem != model_name:
                    raise ValueError(f"model_config file stem {stem!r} must equal model_name {model_name!r}")
                open_clip.add_model_config(model_config)
            model = open_clip.create_model(model_name, pretrained=None, device="cpu")
            load_hps_checkpoint(model, checkpoint)
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer or open_clip.get_tokenizer(model_name)
        size = self.model.visual.image_size
        self.image_size = int(size[0] if isinstance(size, (tuple, list)) else size)
        self.antialias = bool(antialias)
        self.pad_when_unscaled = bool(pad_when_unscaled)
        self.device = device
        self.batch_size = int(batch_size)

    def preprocess(self, images: np.ndarray):
        """(N, H, W, 3) uint8 -> (N, 3, S, S) float32, the release's val transform."""
        import torch

        return torch.stack([hps_preprocess(im, self.image_size, self.antialias, self.pad_when_unscaled)
                            for im in images])

    def score(self, images, prompts, metadata, **kwargs: Any):
        import torch
        import torch.nn.functional as F

        out = []
        dtype = next(self.model.parameters()).dtype
        with torch.no_grad():
            for s in range(0, images.shape[0], self.batch_size):
                x = self.preprocess(images[s:s + self.batch_size]).to(self.device, dtype)
                t = self.tokenizer(list(prompts[s:s + self.batch_size])).to(self.device)
                fi = F.normalize(self.model.encode_image(x).float(), dim=-1)
                ft = F.normalize(self.model.encode_text(t).float(), dim=-1)
                out.append((fi * ft).sum(dim=-1).cpu())
        return torch.cat(out)
