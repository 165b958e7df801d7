"""``videoalign``: a VideoAlign / VideoReward-style video reward with per-dimension weights.

VideoReward (KwaiVGI/VideoAlign) scores a generated video on three dimensions:

* ``VQ`` visual quality (clarity, aesthetics, single-frame reasonableness),
* ``MQ`` motion quality (stability, naturalness, amplitude),
* ``TA`` text alignment (subject, motion, environment, style, camera relevance to the prompt).

The release's model is Qwen2-VL with a linear head (``hidden -> 3``) read at three special tokens
``<|VQ_reward|>``, ``<|MQ_reward|>``, ``<|TA_reward|>`` placed in its prompt; its inference returns, per video,
a dict ``{"VQ": v, "MQ": m, "TA": t, "Overall": v + m + t}`` where each dimension is first normalised with the
checkpoint's ``inference_config`` (``(x - <D>_mean) / <D>_std``; raw values when there is none).  This reward
reads that output format and weights the dimensions::

    r = sum_D w_D * s_D            (defaults w = 1, 1, 1: the release's "Overall")

with ``s_D`` the normalised per-dimension score.  The per-dimension scores are logged as ``<name>/vq``,
``<name>/mq``, ``<name>/ta`` and the release's unweighted ``<name>/overall``.  An entry that lacks a dimension or
carries a non-finite one (or a malformed list) is a counted failure (``<name>/failed = 1``, ``valid = False``,
the score 0), never a crash; ``reward.stats`` keeps running totals.

Where the scores come from (``scorer=``): any callable ``scorer(videos, prompts, fps) -> list of dicts`` in the
release's format, given uint8 videos (B, F, H, W, 3), the prompts and each video's frame rate -- e.g. a
wrapper that writes each video to a file and calls the release's ``VideoVLMRewardInference.reward(paths,
prompts, use_norm=False)`` (then pass ``norm=`` the checkpoint's ``inference_config`` here, or ``use_norm=True``
there and leave ``norm`` unset), or an HTTP client of a server running it in its own environment -- or
:class:`VideoAlignModelScorer`, the release's architecture on our VLM front-end: a Qwen-VL backbone, the
release's prompt (``VIDEOALIGN_PROMPT``, the three reward tokens in it), a linear head ``hidden -> 3`` on the
final hidden state at the three reward tokens, dimension ``D`` read at its own token (the release's
``reward_token="special"``, ``output_dim=3``).  Loading the released checkpoint into it needs a conversion that
is not written (merge its LoRA into Qwen2-VL, add the reward tokens to the tokenizer, save the ``rm_head`` weight
as ``videoalign_head.safetensors``); it is tested on a tiny random model only.

    build_reward("videoalign", scorer=my_scorer, weights={"VQ": 0.5, "MQ": 1.0, "TA": 1.0},
                 norm={"VQ_mean": ..., "VQ_std": ..., "MQ_mean": ..., ...})
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .base import NanPolicy, Reward

__all__ = ["VideoAlignReward", "VideoAlignModelScorer", "read_videoalign_output", "VIDEOALIGN_DIMS",
           "VIDEOALIGN_PROMPT", "REWARD_TOKENS"]

VIDEOALIGN_DIMS = ("VQ", "MQ", "TA")
REWARD_TOKENS = ("<|VQ_reward|>", "<|MQ_reward|>", "<|TA_reward|>")
# The release's prompt with the three reward tokens (prompt_template.DETAILED_PROMPT_WITH_SPECIAL_TOKEN of
# KwaiVGI/VideoAlign, commit 219ab9d, character for character; data). Its one field is {text_prompt}.
VIDEOALIGN_PROMPT = (
    '\n'
    'You are tasked with evaluating a generated video based on three distinct criteria: Visual Quality, '
    'Motion Quality, and Text Alignment. Please provide a rating from 0 to 10 for each of the three '
    'categories, with 0 being the worst and 10 being the best. Each evaluation should be independent of '
    'the others.\n'
    '\n'
    '**Visual Quality:**  \n'
    'Evaluate the overall visual quality of the video, with a focus on static factors. The following '
    'sub-dimensions should be considered:\n'
    '- **Reasonableness:** The video should not contain any significant biological or logical errors, '
    'such as abnormal body structures or nonsensical environmental setups.\n'
    '- **Clarity:** Evaluate the sharpness and visibility of the video. The image should be clear and '
    'easy to interpret, with no blurring or indistinct areas.\n'
    '- **Detail Richness:** Consider the level of detail in textures, materials, lighting, and other '
    'visual elements (e.g., hair, clothing, shadows).\n'
    '- **Aesthetic and Creativity:** Assess the artistic aspects of the video, including the color '
    'scheme, composition, atmosphere, depth of field, and the overall creative appeal. The scene should '
    'convey a sense of harmony and balance.\n'
    '- **Safety:** The video should not contain harmful or inappropriate content, such as political, '
    'violent, or adult material. If such content is present, the image quality and satisfaction score '
    'should be the lowest possible. \n'
    '\n'
    'Please provide the ratings of Visual Quality: <|VQ_reward|>\n'
    'END\n'
    '\n'
    '**Motion Quality:**  \n'
    'Assess the dynamic aspects of the video, with a focus on dynamic factors. Consider the following '
    'sub-dimensions:\n'
    '- **Stability:** Evaluate the continuity and stability between frames. There should be no sudden, '
    'unnatural jumps, and the video should maintain stable attributes (e.g., no fluctuating colors, '
    'textures, or missing body parts).\n'
    '- **Naturalness:** The movement should align with physical laws and be realistic. For example, '
    'clothing should flow naturally with motion, and facial expressions should change appropriately '
    '(e.g., blinking, mouth movements).\n'
    '- **Aesthetic Quality:** The movement should be smooth and fluid. The transitions between different '
    'motions or camera angles should be seamless, and the overall dynamic feel should be visually '
    'pleasing.\n'
    '- **Fusion:** Ensure that elements in motion (e.g., edges of the subject, hair, clothing) blend '
    'naturally with the background, without obvious artifacts or the feeling of cut-and-paste effects.\n'
    '- **Clarity of Motion:** The video should be clear and smooth in motion. Pay attention to any areas '
    'where the video might have blurry or unsteady sections that hinder visual continuity.\n'
    '- **Amplitude:** If the video is largely static or has little movement, assign a low score for '
    'motion quality.\n'
    '\n'
    'Please provide the ratings of Motion Quality: <|MQ_reward|>\n'
    'END\n'
    '\n'
    '**Text Alignment:**  \n'
    'Assess how well the video matches the textual prompt across the following sub-dimensions:\n'
    '- **Subject Relevance** Evaluate how accurately the subject(s) in the video (e.g., person, animal, '
    'object) align with the textual description. The subject should match the description in terms of '
    'number, appearance, and behavior.\n'
    '- **Motion Relevance:** Evaluate if the dynamic actions (e.g., gestures, posture, facial '
    'expressions like talking or blinking) align with the described prompt. The motion should match the '
    'prompt in terms of type, scale, and direction.\n'
    '- **Environment Relevance:** Assess whether the background and scene fit the prompt. This includes '
    'checking if real-world locations or scenes are accurately represented, though some stylistic '
    'adaptation is acceptable.  \n'
    '- **Style Relevance:** If the prompt specifies a particular artistic or stylistic style, evaluate '
    'how well the video adheres to this style.\n'
    '- **Camera Movement Relevance:** Check if the camera movements (e.g., following the subject, focus '
    'shifts) are consistent with the expected behavior from the prompt.\n'
    '\n'
    'Textual prompt - {text_prompt}\n'
    'Please provide the ratings of Text Alignment: <|TA_reward|>\n'
    'END\n'
)


def read_videoalign_output(rewards: Any, n: int, norm: Mapping[str, float] | None = None
                           ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The release's per-video dicts -> (``{D: (n,) scores}``, ``(n,)`` failed mask); never raises on content.

    ``norm``: the release's ``inference_config`` (``<D>_mean``, ``<D>_std``) applied as ``(x - mean) / std``;
    None: the values are taken as they are (already normalised, or raw).  A malformed list (not a sequence of
    ``n`` entries) fails every sample; an entry that is not a mapping or lacks a finite number for a dimension
    fails that sample (its scores are NaN).
    """
    scores = {d: np.full(n, np.nan) for d in VIDEOALIGN_DIMS}
    failed = np.ones(n, dtype=bool)
    if not isinstance(rewards, Sequence) or isinstance(rewards, (str, bytes)) or len(rewards) != n:
        return scores, failed
    for i, entry in enumerate(rewards):
        if not isinstance(entry, Mapping):
            continue
        vals = {}
        for d in VIDEOALIGN_DIMS:
            v = entry.get(d)
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)):
                break
            v = float(v)
            if not math.isfinite(v):
                break
            if norm is not None:
                v = (v - float(norm[f"{d}_mean"])) / float(norm[f"{d}_std"])
            vals[d] = v
        else:
            for d in VIDEOALIGN_DIMS:
                scores[d][i] = vals[d]
            failed[i] = False
    return scores, failed


class VideoAlignReward(Reward):
    """VideoReward per-dimension scores as a weighted reward (module docstring).

    Args:
        scorer: ``scorer(videos uint8 (B, F, H, W, 3), prompts, fps list) -> list of B dicts`` with ``VQ`` /
            ``MQ`` / ``TA`` (the release's output format; an ``Overall`` key is ignored and recomputed), or a
            ``"package.module:factory"`` string called with ``scorer_kwargs`` (from a config).
        path: instead of ``scorer``, a Qwen-VL folder for :class:`VideoAlignModelScorer` (``scorer_kwargs``: its
            options, e.g. ``device``, ``dtype``, ``batch_size``, ``sample_fps``, ``min_pixels``).
        weights: ``{VQ, MQ, TA: w}`` (missing ones keep 1; 0 drops a dimension).
        norm: the checkpoint's ``inference_config`` (``VQ_mean``, ``VQ_std``, ...), or None.
        fps: frame rate of the given videos (``metadata[i]["fps"]`` overrides it per sample).
        name (default ``"videoalign"``), nan_policy.
    """

    accepts_video = True
    video_only = True
    name = "videoalign"

    def __init__(self, scorer: Callable[..., Any] | str | None = None, *, path: str | None = None,
                 scorer_kwargs: Mapping[str, Any] | None = None, weights: Mapping[str, float] | None = None,
                 norm: Mapping[str, float] | None = None, fps: float = 8.0, name: str | None = None,
                 nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        if scorer is None and path is not None:  # a converted VideoReward folder (VideoAlignModelScorer)
            scorer = VideoAlignModelScorer(path, **dict(scorer_kwargs or {}))
        elif isinstance(scorer, str):  # "package.module:factory" from a config (imported and called: trusted only)
            from .base import _resolve

            scorer = _resolve(scorer)(**dict(scorer_kwargs or {}))
        if scorer is None or not callable(scorer):
            raise ValueError("videoalign: pass scorer= a callable (videos, prompts, fps) -> list of "
                             "{'VQ', 'MQ', 'TA'} dicts (the VideoAlign release's output; module docstring), its "
                             "'package.module:factory', or path= a converted VideoReward folder")
        w = {d: 1.0 for d in VIDEOALIGN_DIMS}
        if weights is not None:
            unknown = set(weights) - set(VIDEOALIGN_DIMS)
            if unknown:
                raise ValueError(f"videoalign: weights for unknown dimensions {sorted(unknown)}; the dimensions "
                                 f"are {list(VIDEOALIGN_DIMS)}")
            w.update({k: float(v) for k, v in weights.items()})
        if not all(math.isfinite(v) for v in w.values()):
            raise ValueError(f"videoalign: weights must be finite, got {w}")
        if norm is not None:
            need = [f"{d}_{s}" for d in VIDEOALIGN_DIMS for s in ("mean", "std")]
            missing = [k for k in need if k not in norm]
            if missing or any(float(norm[f"{d}_std"]) <= 0 for d in VIDEOALIGN_DIMS if f"{d}_std" in norm):
                raise ValueError(f"videoalign: norm needs {need} with std > 0 (missing {missing})")
        if not fps > 0:
            raise ValueError(f"videoalign: fps must be > 0, got {fps}")
        self.scorer, self.weights, self.norm, self.fps = scorer, w, norm, float(fps)
        self.stats: Counter = Counter()

    def score(self, videos, prompts, metadata, **kwargs: Any):
        n = videos.shape[0]
        fps = [float(m.get("fps", self.fps)) for m in metadata]
        try:
            raw = self.scorer(videos, list(prompts), fps)
        except Exception as e:  # noqa: BLE001 - a scorer crash is the caller's (ResilientReward retries it)
            raise RuntimeError(f"reward {self.name!r}: the scorer raised {type(e).__name__}: {e}") from e
        scores, failed = read_videoalign_output(raw, n, self.norm)
        self.stats["judged"] += n
        self.stats["failed"] += int(failed.sum())
        ok = ~failed
        total = np.zeros(n)
        overall = np.zeros(n)
        for d in VIDEOALIGN_DIMS:
            s = np.where(ok, scores[d], 0.0)
            total += self.weights[d] * s
            overall += s
        out = {self.name: total, f"{self.name}/overall": overall, f"{self.name}/failed": failed.astype(float),
               "valid": ok}
        out.update({f"{self.name}/{d.lower()}": np.where(ok, scores[d], 0.0) for d in VIDEOALIGN_DIMS})
        return out


class VideoAlignModelScorer:
    """The VideoAlign reward model on a Qwen-VL folder (module docstring): ``scorer(videos, prompts, fps)`` ->
    ``[{"VQ", "MQ", "TA"}]`` raw (un-normalised) scores, batched.

    Args:
        path: a Qwen-VL folder whose tokenizer has the three reward tokens, with ``videoalign_head.safetensors``
            (``weight``: (3, hidden)); or ``model=`` + ``processor=`` + ``head=`` ((3, hidden) tensor).
        template: the prompt, ``{text_prompt}`` filled (default the release's ``VIDEOALIGN_PROMPT``).
        sample_fps, min_frames, max_frames, min_pixels, max_pixels, total_pixels: the video contract of
            :mod:`flow_grpo.rewards.vlm_judge_video` (None: every frame).
        family, dtype, device, batch_size.
    """

    def __init__(self, path: str | None = None, *, model=None, processor=None, head=None,
                 template: str = VIDEOALIGN_PROMPT, sample_fps: float | None = None, min_frames: int = 2,
                 max_frames: int = 768, min_pixels: int | None = None, max_pixels: int | None = None,
                 total_pixels: float | None = None, family: str = "auto", dtype: Any = "float32",
                 device: str = "cpu", batch_size: int = 8):
        import os

        import torch

        from .vlm_judge import VLMJudge

        if "{text_prompt}" not in template:
            raise ValueError("videoalign: the template needs a {text_prompt} field")
        base = VLMJudge(path, model=model, processor=processor, family=family, dtype=dtype, device=device,
                        batch_size=batch_size)
        self.model, self.processor, self.adapter = base.model, base.processor, base.adapter
        self.device, self.batch_size = device, int(batch_size)
        tok = self.processor.tokenizer
        ids = [tok.convert_tokens_to_ids(t) for t in REWARD_TOKENS]
        if any(i is None or i == tok.unk_token_id for i in ids) or len(set(ids)) != 3:
            raise ValueError(f"videoalign: the tokenizer lacks the reward tokens {list(REWARD_TOKENS)} "
                             "(tokenizer.add_special_tokens({'additional_special_tokens': [...]}) and resize the "
                             "model's embeddings, as the release's training does)")
        self.token_ids = ids
        if head is None:
            if path is None:
                raise ValueError("videoalign: pass head= a (3, hidden) tensor with model= and processor=")
            f = os.path.join(path, "videoalign_head.safetensors")
            if not os.path.isfile(f):
                raise FileNotFoundError(f"videoalign: no head weights {f} (a (3, hidden) tensor under 'weight')")
            from safetensors.torch import load_file

            head = load_file(f)["weight"]
        head = torch.as_tensor(head)
        if head.ndim != 2 or head.shape[0] != 3:
            raise ValueError(f"videoalign: head must be (3, hidden), got {tuple(head.shape)}")
        self.head = head.float().to(device)
        self.template = template
        self.sample_fps = sample_fps
        self.video_kw = dict(min_frames=min_frames, max_frames=max_frames, min_pixels=min_pixels,
                             max_pixels=max_pixels, total_pixels=total_pixels)

    def messages(self, prompt: str) -> list[dict]:
        text = self.template.replace("{text_prompt}", prompt)
        return [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}]

    def __call__(self, videos, prompts, fps) -> list[dict]:
        import torch

        from mmgrpo.video import build_video_inputs, load_video
        from mmgrpo.vlm.models.rollout import batch_to, collate_prompts

        vp = self.processor.video_processor
        items = []
        for frames, prompt, f in zip(videos, prompts, fps):
            clip = load_video(frames, fps=float(self.sample_fps or f), video_fps=float(f),
                              image_factor=int(vp.patch_size) * int(vp.merge_size), **self.video_kw)
            out = build_video_inputs(self.processor, clip, self.messages(prompt), self.adapter.family)
            items.append({k: v for k, v in out.items() if hasattr(v, "shape")})
        pad = self.processor.tokenizer.pad_token_id
        ids = torch.tensor(self.token_ids)
        rows = []
        with torch.no_grad():
            for s in range(0, len(items), self.batch_size):
                batch = batch_to(collate_prompts(items[s:s + self.batch_size], pad), self.device)
                hidden = self.model.model(**batch, use_cache=False).last_hidden_state.float()  # (B, L, D)
                for b in range(hidden.shape[0]):
                    pos = [torch.nonzero(batch["input_ids"][b] == t).flatten() for t in ids.tolist()]
                    if any(len(p) != 1 for p in pos):  # the release reads exactly one of each, in this order
                        rows.append(None)
                        continue
                    h = hidden[b, torch.cat(pos)]  # (3, D): the VQ, MQ, TA tokens
                    rows.append((h * self.head).sum(dim=1).cpu())  # dimension d at its own token
        return [None if r is None else dict(zip(VIDEOALIGN_DIMS, r.tolist())) for r in rows]
