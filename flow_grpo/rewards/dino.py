r"""DINOv2 rewards of Adv-GRPO ("The Image as Its Own Reward", Mao et al. 2025; release showlab/Adv-GRPO).

Both rewards read the features of a frozen ``transformers.Dinov2Model`` (:class:`DinoBackbone`): images in [0, 1]
resized to ``image_size`` (bicubic, ``F.interpolate``, as the release's reward code) and normalised with the
ImageNet mean/std; :math:`c(x)` = the CLS token and :math:`P(x)` = the patch tokens of the last layer after the
final layer norm (``pooler_output`` / ``last_hidden_state[:, 1:]``; timm's ``vit_base_patch14_dinov2`` that the
release loads gives the same tokens). Weights: ``model_dir`` = a local ``from_pretrained`` folder (config.json +
safetensors; nothing is downloaded), or ``tiny=True`` = a small random ``Dinov2Config`` for tests and the CPU
comparison (seeded, built without touching the global RNG).

``dino_similarity`` (:class:`DinoSimilarityReward`, the "DINO feature reward"):

.. math:: r(x) = \max_{j} \cos\big(c(x), c(\mathrm{ref}_j)\big)

over the reference images :math:`\mathrm{ref}_j` of the sample's own prompt. The form is the release's
``image_similarity_score`` (L2-normalised CLS features, nearest reference: a sample is rewarded for matching *one*
reference, not the average of all, which would pull it toward a blurred mean); the release takes the max over the
references of the whole batch, which is the same thing in its training loop (one prompt per batch) and here is
restricted to the prompt explicitly.

``adv_dino`` (:class:`AdversarialDinoReward`, the adversarial reward model): a trainable MLP head
:math:`h` (Linear(D, 512), GELU, Linear(512, 1), the release's ``DINOHead``) on the frozen features,

.. math:: r(x) = w_{cls}\,h(\hat c(x)) + (1-w_{cls})\,\mathrm{mean}_p\,h(\hat P_p(x)),
   \qquad \hat v = v/(\lVert v\rVert+10^{-6})

(the release's ``dino_patch_cotrain_score``, ``cls_weight`` 0.7), trained against the policy by
:func:`discriminator_loss` (reference images positive, the policy's samples negative; hinge loss). The update
itself (optimizer, schedule, checkpoint) is :mod:`flow_grpo.methods.adv_grpo`.

Deviations from the release (deliberate, each with its switch back):

* reward patches: the release averages the head over 64 patches drawn at random per call (``torch.randint``, the
  global RNG); here the mean over *all* patches (its expectation), so a reward does not depend on which reward
  thread ran first. ``reward_patches=64`` draws 64 per image, seeded by the image bytes (same image, same draw).
* training features: the release's ``train_dino`` feeds the head the *unnormalised* DINO tokens while its reward
  feeds it L2-normalised ones; here both are normalised (the head is trained on what it scores).
  ``train_on_raw_features=True`` restores the release.
* the head runs in float32 (the release: bfloat16 on GPU; rounding only).
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from typing import Any, Optional

import numpy as np

from .base import NanPolicy, Reward, RewardError

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "tiny_dinov2_config", "DinoBackbone", "ReferenceImages",
           "DinoSimilarityReward", "AdversarialDinoReward", "hinge_loss", "discriminator_loss"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_EPS = 1e-6  # the release's feature-normalisation epsilon


def tiny_dinov2_config(image_size: int = 32, patch_size: int = 4, hidden_size: int = 32, layers: int = 2,
                       heads: int = 2):
    """A small random ``Dinov2Config`` (tests, the CPU comparison): 32 px, 4 px patches (64 patch tokens)."""
    from transformers import Dinov2Config

    return Dinov2Config(hidden_size=hidden_size, num_hidden_layers=layers, num_attention_heads=heads, mlp_ratio=2,
                        image_size=image_size, patch_size=patch_size)


class DinoBackbone:
    """A frozen ``Dinov2Model`` giving (CLS, patch tokens) of uint8 NHWC images (see the module docstring).

    ``model_dir``: a local folder (``Dinov2Model.from_pretrained``; needs config.json and model.safetensors,
    pickled ``.bin`` weights are refused: loading weights never runs code). ``tiny=True``: a random
    :func:`tiny_dinov2_config` model, initialised from ``seed``. ``image_size``: input resolution (default the
    model config's, 518 for the released DINOv2 weights as in the release). ``device``: where it runs (e.g. cuda;
    float32), ``batch_size`` images per forward."""

    def __init__(self, model_dir: str = "", tiny: bool = False, image_size: Optional[int] = None, seed: int = 0,
                 device: str = "cpu", config: Any = None, batch_size: int = 32):
        import torch
        from transformers import Dinov2Model

        if model_dir:
            if not os.path.isdir(model_dir):
                raise FileNotFoundError(f"DINOv2 model folder not found: {model_dir}")
            for f in ("config.json", "model.safetensors"):
                if not os.path.isfile(os.path.join(model_dir, f)):
                    raise FileNotFoundError(f"DINOv2 model folder {model_dir} lacks {f} (a Dinov2Model saved with "
                                            "save_pretrained; pickled .bin weights are not loaded)")
            model = Dinov2Model.from_pretrained(model_dir, local_files_only=True, use_safetensors=True)
        elif tiny or config is not None:
            with torch.random.fork_rng(devices=[]):  # the run's global RNG stream is left untouched
                torch.manual_seed(int(seed))
                model = Dinov2Model(config if config is not None else tiny_dinov2_config())
        else:
            raise ValueError("DINOv2 reward: pass model_dir= (a local Dinov2Model folder, e.g. facebook/dinov2-base "
                             "downloaded beforehand) or tiny=true (random weights, tests only)")
        self.model = model.eval().to(device).float()
        self.model.requires_grad_(False)
        self.device = device
        self.image_size = int(image_size or self.model.config.image_size)
        self.batch_size = max(1, int(batch_size))
        self.dim = int(self.model.config.hidden_size)

    def preprocess(self, images_u8: np.ndarray):
        """uint8 (N, H, W, 3) -> float (N, 3, S, S): [0, 1], bicubic resize to ``image_size``, ImageNet norm."""
        import torch
        import torch.nn.functional as F

        x = torch.from_numpy(np.ascontiguousarray(images_u8)).to(self.device).float().div(255.0).permute(0, 3, 1, 2)
        if x.shape[-2:] != (self.image_size, self.image_size):
            x = F.interpolate(x, size=(self.image_size, self.image_size), mode="bicubic", align_corners=False)
        mean = torch.tensor(IMAGENET_MEAN, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(IMAGENET_STD, device=x.device).view(1, 3, 1, 1)
        return (x - mean) / std

    def tokens(self, images_u8: np.ndarray):
        """(CLS (N, D), patches (N, P, D)) float32, no gradient (the backbone is frozen); ``batch_size`` images per
        forward (a whole epoch's images at 518 px would not fit at once)."""
        import torch

        outs = []
        with torch.no_grad():
            for i in range(0, len(images_u8), self.batch_size):
                outs.append(self.model(pixel_values=self.preprocess(images_u8[i:i + self.batch_size]))
                            .last_hidden_state.float())
        h = torch.cat(outs)
        return h[:, 0], h[:, 1:]


def l2_normalize(x):
    """``x / (||x|| + 1e-6)`` along the last axis (the release's normalisation)."""
    return x / (x.norm(dim=-1, keepdim=True) + _EPS)


class _LRU:
    """A small least-recently-used cache: ``get(key, make)``."""

    def __init__(self, size: int):
        from collections import OrderedDict

        self.size, self.data = max(1, int(size)), OrderedDict()

    def get(self, key, make):
        if key in self.data:
            self.data.move_to_end(key)
            return self.data[key]
        value = self.data[key] = make()
        if len(self.data) > self.size:
            self.data.popitem(last=False)
        return value


class ReferenceImages:
    """The reference ("real") images of each prompt, ``per_prompt`` of them.

    ``source="mini_geneval"``: the Mini-GenEval renderer's oracle images (:func:`mmgrpo.synthetic.t2i.render`
    of the prompt's metadata, or of the parsed prompt), seeds ``seed .. seed + per_prompt - 1``, at the size of the
    images they are compared with. ``source="metadata"``: image files named by the prompt's metadata entry
    ``reference_images`` (a list of paths; a JSONL prompt file line ``{"prompt": ..., "reference_images": [...]}``),
    resized (bicubic) to the compared images' size. The last ``cache_size`` prompts are kept in memory (a large prompt
    set's references at 512 px would not fit)."""

    def __init__(self, source: str = "mini_geneval", per_prompt: int = 8, seed: int = 0, cache_size: int = 256):
        if source not in ("mini_geneval", "metadata"):
            raise ValueError(f"reference source must be 'mini_geneval' or 'metadata', got {source!r}")
        if per_prompt < 1:
            raise ValueError(f"references per prompt must be >= 1, got {per_prompt}")
        self.source, self.per_prompt, self.seed = source, int(per_prompt), int(seed)
        self._cache = _LRU(cache_size)

    def get(self, prompt: str, metadata: Mapping[str, Any], size: int) -> np.ndarray:
        """uint8 (per_prompt, size, size, 3) references of ``prompt``."""
        return self._cache.get((prompt, int(size)), lambda: self._load(prompt, metadata or {}, int(size)))

    def _load(self, prompt: str, md: Mapping[str, Any], size: int) -> np.ndarray:
        if self.source == "mini_geneval":
            from mmgrpo.synthetic import t2i as bench

            spec = md if "include" in md else bench.parse_prompt(prompt)
            if spec is None:
                raise RewardError(f"reference images: prompt {prompt!r} has no 'include' metadata and is not a "
                                  "Mini-GenEval prompt (use references='metadata' for your own images)")
            return np.stack([bench.render(spec, size=size, seed=self.seed + k) for k in range(self.per_prompt)])
        paths = md.get("reference_images")
        if not paths:
            raise RewardError(f"reference images: prompt {prompt!r} has no 'reference_images' list in its metadata")
        from PIL import Image

        imgs = []
        for p in list(paths)[: self.per_prompt]:
            if not os.path.isfile(p):
                raise RewardError(f"reference image of prompt {prompt!r} not found: {p}")
            with Image.open(p) as im:
                imgs.append(np.asarray(im.convert("RGB").resize((size, size), Image.BICUBIC), dtype=np.uint8))
        return np.stack(imgs)

    def for_samples(self, prompts: Sequence[str], metadata: Sequence[Mapping[str, Any]], size: int,
                    members: Optional[Sequence[int]] = None) -> np.ndarray:
        """One reference per sample (uint8 (N, size, size, 3)): sample i gets reference ``members[i] % per_prompt``
        of its prompt (its index in its group; default i), so a group is paired with distinct references as the
        release pairs a prompt's generated images with its reference list."""
        idx = list(range(len(prompts))) if members is None else [int(m) for m in members]
        return np.stack([self.get(p, m, size)[k % self.per_prompt] for p, m, k in zip(prompts, metadata, idx)])


def _square_size(images: np.ndarray) -> int:
    if images.shape[1] != images.shape[2]:
        raise ValueError(f"DINO rewards need square images, got {images.shape[2]}x{images.shape[1]}")
    return int(images.shape[1])


class DinoSimilarityReward(Reward):
    """``max_j cos(c(x), c(ref_j))`` over the prompt's references (module docstring). Outputs ``{name: r,
    name/mean: mean_j cos}`` (the mean is logged only)."""

    name = "dino_similarity"

    def __init__(self, model_dir: str = "", tiny: bool = False, image_size: Optional[int] = None, seed: int = 0,
                 references: str = "mini_geneval", refs_per_prompt: int = 8, ref_seed: int = 0, device: str = "cpu",
                 backbone: Optional[DinoBackbone] = None, name: Optional[str] = None, nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        self.backbone = backbone or DinoBackbone(model_dir, tiny, image_size, seed, device)
        self.refs = ReferenceImages(references, refs_per_prompt, ref_seed)
        self._ref_cls = _LRU(4096)

    def _ref_features(self, prompt: str, md: Mapping[str, Any], size: int):
        # frozen backbone, fixed references: the features of a prompt's references are computed once (while cached)
        return self._ref_cls.get((prompt, size),
                                 lambda: l2_normalize(self.backbone.tokens(self.refs.get(prompt, md, size))[0]))

    def score(self, images, prompts, metadata, **kwargs):
        size = _square_size(images)
        c = l2_normalize(self.backbone.tokens(images)[0])
        best, mean = np.zeros(len(prompts)), np.zeros(len(prompts))
        for i, (p, m) in enumerate(zip(prompts, metadata)):
            cos = self._ref_features(p, m, size) @ c[i]
            best[i], mean[i] = float(cos.max()), float(cos.mean())
        return {self.name: best, f"{self.name}/mean": mean}


def hinge_loss(logits_real, logits_fake):
    r"""The release's discriminator hinge loss :math:`\tfrac12[\mathrm{mean}\,\mathrm{relu}(1-D_{real})
    + \mathrm{mean}\,\mathrm{relu}(1+D_{fake})]` (logits of any shape, averaged over all entries)."""
    import torch.nn.functional as F

    return 0.5 * (F.relu(1.0 - logits_real).mean() + F.relu(1.0 + logits_fake).mean())


def _head(dim: int, hidden: int):
    import torch.nn as nn

    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, 1))


def sample_patches(patches, n: int, generator):
    """(B, n, D): ``n`` patch tokens per image drawn uniformly with replacement (the release's ``torch.randint``)."""
    import torch

    B, N, D = patches.shape
    idx = torch.randint(0, N, (B, n), generator=generator).to(patches.device)
    return torch.gather(patches, 1, idx.unsqueeze(-1).expand(-1, -1, D))


def discriminator_loss(head, cls_real, patch_real, cls_fake, patch_fake, patch_weight: float = 0.3,
                       n_patches: int = 64, generator=None, normalize: bool = True) -> tuple[Any, dict]:
    r"""The release's ``train_dino`` (patch variant) on given features:
    :math:`L = \mathrm{hinge}(h(c_r), h(c_f)) + \lambda\,\mathrm{hinge}(h(p_r), h(p_f))` with ``n_patches``
    random patch tokens per image (the real and fake draws independent, from ``generator``), λ = ``patch_weight``
    (0 = CLS only, the release's first variant). ``normalize``: L2-normalise the tokens first (see the module
    docstring). Returns (loss, stats: d_loss, accuracy on the CLS logits as the release's ``acc``, mean logits)."""
    import torch

    f = l2_normalize if normalize else (lambda t: t)
    lr_cls = head(f(cls_real)).squeeze(-1)
    lf_cls = head(f(cls_fake)).squeeze(-1)
    loss = hinge_loss(lr_cls, lf_cls)
    if patch_weight:
        n = min(int(n_patches), patch_real.shape[1])
        pr = sample_patches(patch_real, n, generator)
        pf = sample_patches(patch_fake, n, generator)
        loss = loss + patch_weight * hinge_loss(head(f(pr)).squeeze(-1), head(f(pf)).squeeze(-1))
    with torch.no_grad():
        acc = 0.5 * (float((lr_cls > 0).float().mean()) + float((lf_cls < 0).float().mean()))
        stats = {"adv_grpo/d_loss": float(loss.detach()), "adv_grpo/d_acc": acc,
                 "adv_grpo/d_logit_real": float(lr_cls.mean()),
                 "adv_grpo/d_logit_fake": float(lf_cls.mean())}
    return loss, stats


class AdversarialDinoReward(Reward):
    """The adversarial reward model (module docstring): frozen DINOv2 + a trainable head. Outputs
    ``{name: r, name/cls: h(c), name/patch: mean_p h(p)}``.

    Keys: ``model_dir`` / ``tiny`` / ``image_size`` / ``seed`` (backbone, :class:`DinoBackbone`), ``head_hidden``
    (512), ``head_seed`` (head init, without touching the global RNG), ``cls_weight`` (0.7), ``reward_patches`` (0 =
    all patches; k > 0 = k per image, seeded by the image bytes), ``references`` / ``refs_per_prompt`` / ``ref_seed``
    (the positives, :class:`ReferenceImages`; 8 per prompt as the release's reference set). The head is updated by
    :class:`flow_grpo.methods.adv_grpo.AdvGRPO` (``sample.credit=adv_grpo``), never by scoring."""

    name = "adv_dino"

    def __init__(self, model_dir: str = "", tiny: bool = False, image_size: Optional[int] = None, seed: int = 0,
                 head_hidden: int = 512, head_seed: int = 0, cls_weight: float = 0.7, reward_patches: int = 0,
                 references: str = "mini_geneval", refs_per_prompt: int = 8, ref_seed: int = 0, device: str = "cpu",
                 backbone: Optional[DinoBackbone] = None, name: Optional[str] = None, nan_policy: NanPolicy = "raise"):
        import torch

        super().__init__(name=name, nan_policy=nan_policy)
        if not 0.0 <= cls_weight <= 1.0:
            raise ValueError(f"adv_dino: cls_weight must be in [0, 1], got {cls_weight}")
        if reward_patches < 0:
            raise ValueError(f"adv_dino: reward_patches must be >= 0 (0 = all patches), got {reward_patches}")
        self.backbone = backbone or DinoBackbone(model_dir, tiny, image_size, seed, device)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(head_seed))
            self.head = _head(self.backbone.dim, int(head_hidden)).to(device)
        self.cls_weight, self.reward_patches = float(cls_weight), int(reward_patches)
        self.refs = ReferenceImages(references, refs_per_prompt, ref_seed)

    def _patch_scores(self, images, patches):
        import torch

        if not self.reward_patches:
            return self.head(l2_normalize(patches)).squeeze(-1).mean(dim=1)
        out = []
        for img, p in zip(images, patches):  # a draw per image seeded by its bytes: order-independent
            g = torch.Generator().manual_seed(int.from_bytes(hashlib.sha256(img.tobytes()).digest()[:8], "little"))
            out.append(self.head(l2_normalize(sample_patches(p[None], self.reward_patches, g))).mean())
        return torch.stack(out)

    def score(self, images, prompts, metadata, **kwargs):
        import torch

        _square_size(images)
        cls, patches = self.backbone.tokens(images)
        with torch.no_grad():
            s_cls = self.head(l2_normalize(cls)).squeeze(-1)
            s_patch = self._patch_scores(images, patches)
        r = self.cls_weight * s_cls + (1.0 - self.cls_weight) * s_patch
        return {self.name: r.cpu().numpy(), f"{self.name}/cls": s_cls.cpu().numpy(),
                f"{self.name}/patch": s_patch.cpu().numpy()}
