"""GenEval's official scorer (djghosh13/geneval ``evaluation/evaluate_images.py``) as a reward, for the server.

The official protocol (Mask2Former Swin-S detector from mmdet 2.x + a CLIP ViT-L-14 colour classifier) is heavy to
install and conflicts with this project's environment, so it runs behind the remote reward server, in GenEval's
own environment (its ``environment.yml``: mmdet/mmcv-full, open_clip, clip_benchmark; a CUDA GPU -- the script
asserts it at import)::

    # in the GenEval environment, with this repo on PYTHONPATH
    python -m flow_grpo.rewards.server --reward geneval_official --port 18085 --reward-kwargs \\
      '{"geneval_dir": "/src/geneval", "detector_path": "/models/geneval",
        "clip_pretrained": "/models/clip/ViT-L-14.pt"}'
    # in the training environment
    reward: remote (url http://127.0.0.1:18085, name geneval), metadata = the GenEval metadata lines

The script is used unchanged: it is imported from the checkout, the module globals its ``__main__`` block sets
(detector, CLIP model / transform / tokenizer, class names, thresholds, ``args.options``) are set the same way,
and each image is written as a PNG and scored by its ``evaluate_image(path, metadata)``.

Reward: ``1.0`` if GenEval judges the image correct (every ``include`` clause -- class count, colour, relative
position -- holds and no ``exclude`` clause fires), else ``0.0``: GenEval's per-image "correct", Flow-GRPO's
``only_strict=True`` training reward.  ``metadata[i]`` must be the prompt's GenEval metadata (``tag``,
``include``, optional ``exclude``; ``prompt`` defaults to the prompt string).  The CPU stand-in with the same
clause semantics is ``mini_geneval``.

Options (the script's ``--options``; defaults as the script): ``threshold`` 0.3, ``counting_threshold`` 0.9,
``max_objects`` 16, ``max_overlap`` 1.0, ``position_threshold`` 0.1, ``bgcolor`` "#999", ``crop`` "1".

Expected local files::

    /src/geneval/evaluation/evaluate_images.py, object_names.txt          # a checkout of djghosh13/geneval
    /models/geneval/mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.pth     # evaluation/download_models.sh
    CLIP ViT-L-14 OpenAI weights: clip_pretrained = a local file, or "openai" when open_clip's cache has them
"""
from __future__ import annotations

import importlib.util
import os
import tempfile
from types import SimpleNamespace
from typing import Any

from ._weights import require_file
from .base import NanPolicy, Reward, RewardError

__all__ = ["GenEvalOfficialReward", "DEFAULT_OPTIONS"]

DEFAULT_OPTIONS = {"threshold": "0.3", "counting_threshold": "0.9", "max_objects": "16", "max_overlap": "1.0",
                   "position_threshold": "0.1", "bgcolor": "#999", "crop": "1"}
DETECTOR = "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco"


def _import_script(path: str):
    spec = importlib.util.spec_from_file_location("geneval_evaluate_images", path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except (ImportError, AssertionError) as e:
        raise ImportError(f"cannot import GenEval's scorer {path}: {type(e).__name__}: {e}. It needs GenEval's "
                          "environment (mmdet 2.x + mmcv-full, open_clip, clip_benchmark) and a CUDA GPU; run this "
                          "reward behind `python -m flow_grpo.rewards.server` in that environment") from e
    return mod


class GenEvalOfficialReward(Reward):
    """GenEval's official per-image correctness (see module docstring).

    Args:
        geneval_dir: a checkout of djghosh13/geneval.
        detector_path: folder holding ``<detector_name>.pth``.
        detector_config: mmdet config (default: the Mask2Former config inside mmdet, as the script).
        detector_name: checkpoint stem (the script's ``model`` option).
        clip_arch / clip_pretrained: the colour classifier (``ViT-L-14`` / ``"openai"`` as the script).
        options: overrides of :data:`DEFAULT_OPTIONS`.
        name (default ``"geneval"``), nan_policy.
    """

    name = "geneval"

    def __init__(self, geneval_dir: str, detector_path: str, *, detector_config: str | None = None,
                 detector_name: str = DETECTOR, clip_arch: str = "ViT-L-14", clip_pretrained: str = "openai",
                 options: dict | None = None, name: str | None = None, nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        script = os.path.join(geneval_dir, "evaluation", "evaluate_images.py")
        names = os.path.join(geneval_dir, "evaluation", "object_names.txt")
        ckpt = os.path.join(detector_path, f"{detector_name}.pth")
        require_file(script, "GenEval scorer evaluation/evaluate_images.py (a checkout of djghosh13/geneval)")
        require_file(names, "GenEval evaluation/object_names.txt")
        require_file(ckpt, "GenEval detector checkpoint (GenEval's evaluation/download_models.sh)")
        unknown = set(options or {}) - set(DEFAULT_OPTIONS)
        if unknown:
            raise ValueError(f"unknown GenEval options {sorted(unknown)}; known: {sorted(DEFAULT_OPTIONS)}")
        opts = {**DEFAULT_OPTIONS, "model": detector_name, "clip_model": clip_arch,
                **{k: str(v) for k, v in (options or {}).items()}}
        mod = _import_script(script)
        # exactly what the script's __main__ / load_models() put in its module namespace
        cfg = detector_config or os.path.join(os.path.dirname(mod.mmdet.__file__),
                                              f"../configs/mask2former/{DETECTOR}.py")
        mod.args = SimpleNamespace(options=opts)
        mod.object_detector = mod.init_detector(cfg, ckpt, device=mod.DEVICE)
        mod.clip_model, _, mod.transform = mod.open_clip.create_model_and_transforms(
            clip_arch, pretrained=clip_pretrained, device=mod.DEVICE)
        mod.tokenizer = mod.open_clip.get_tokenizer(clip_arch)
        with open(names) as f:
            mod.classnames = [line.strip() for line in f]
        mod.THRESHOLD = float(opts["threshold"])
        mod.COUNTING_THRESHOLD = float(opts["counting_threshold"])
        mod.MAX_OBJECTS = int(opts["max_objects"])
        mod.NMS_THRESHOLD = float(opts["max_overlap"])
        mod.POSITION_THRESHOLD = float(opts["position_threshold"])
        self.module = mod

    def score(self, images, prompts, metadata, **kwargs: Any):
        from PIL import Image

        bad = [i for i, m in enumerate(metadata) if "tag" not in m or "include" not in m]
        if bad:
            raise RewardError(f"reward {self.name!r}: metadata of samples {bad[:8]} lacks GenEval's 'tag'/'include' "
                              "(pass the prompt's line of evaluation_metadata.jsonl)", self.name, bad)
        correct = []
        with tempfile.TemporaryDirectory() as d:
            for i, (im, md) in enumerate(zip(images, metadata)):
                path = os.path.join(d, f"{i:05d}.png")  # the script reads files (PNG: lossless)
                Image.fromarray(im).save(path)
                md = {"prompt": prompts[i], **md}
                correct.append(float(bool(self.module.evaluate_image(path, md)["correct"])))
        return correct
