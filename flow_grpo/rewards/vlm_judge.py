"""A VLM judge reward on mmgrpo's own Qwen-VL front-end: pointwise scores and pairwise preferences.

The judge is any Qwen2-VL / Qwen2.5-VL / Qwen3-VL checkpoint folder (e.g. a UnifiedReward-style fine-tune or a
plain instruct model), loaded with the family adapters of :mod:`mmgrpo.vlm.models.adapters`; prompts are built with
:func:`mmgrpo.vlm.models.inputs.build_prompt_item` and left-padded into one batch by
:func:`mmgrpo.vlm.models.rollout.collate_prompts` -- the same path the VLM trainer's rollouts use.  No text is
generated: the score is read from the next-token distribution after the chat template's generation prompt
(one forward pass per batch, deterministic, no parsing failures).

Modes (``mode=``)
-----------------
``"yes_no"`` (pointwise, default)::

    <|im_start|>system\\nYou are a helpful assistant.<|im_end|>
    <|im_start|>user\\n<image>Prompt: {prompt}\\n{question}<|im_end|>
    <|im_start|>assistant\\n
    question = "Does this image match the prompt and is it of high quality? Answer Yes or No."
    r = p(Yes) / (p(Yes) + p(No))                                  in [0, 1]

``"scale"`` (pointwise): ``question`` asks for a rating ``1..K`` (``scale_max=K <= 9``, one digit token each)::

    q_k = p(k) / sum_j p(j);   r = (sum_k k q_k - 1) / (K - 1)     in [0, 1]   (expected rating, rescaled)

Pairwise (:class:`VLMPairwiseJudge`, for Pref-GRPO's win rate via ``vlm_judge_pairwise``)::

    <|im_start|>user\\nImage 1: <image>\\nImage 2: <image>\\nPrompt: {prompt}\\n{question}<|im_end|>
    question = "Which image matches the prompt better and is of higher quality? Answer 1 or 2."
    P(a > b) = p(1) / (p(1) + p(2))

``p(t)`` is the softmax of the last position's logits over the whole vocabulary, evaluated at the *first* token
of each answer string (``answers=`` overrides them; their first tokens must differ).  The diagnostic
``<name>/answer_mass`` = the summed probability of the candidate answers: a judge that puts little mass there
is not following the format (its score is then mostly noise).  ``question``/``template`` are overridable; the
``{prompt}`` field is the generation prompt.

In process: ``build_reward("vlm_judge", path="/models/Qwen2.5-VL-7B-Instruct", device="cuda", dtype="bf16")``.
Behind the remote server (its own process / GPU / environment)::

    python -m flow_grpo.rewards.server --reward vlm_judge --port 18087 \\
        --reward-kwargs '{"path": "/models/UnifiedReward-qwen-7b", "device": "cuda", "dtype": "bf16"}'
    python -m flow_grpo.rewards.server --reward vlm_judge_pairwise --port 18088 \\
        --reward-kwargs '{"path": "/models/UnifiedReward-qwen-7b", "symmetric": true}'

The pairwise reward needs each sample's group: ``metadata[i]["group_id"]`` (sent by the remote client with the
metadata) or the ``group_ids=`` call kwarg in process.

Expected local layout: a Hugging Face Qwen-VL folder (``config.json`` with ``model_type`` in qwen2_vl /
qwen2_5_vl / qwen3_vl, weights, tokenizer files with a chat template, ``preprocessor_config.json``).
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from .base import NanPolicy, PairwisePreferenceReward, Reward

__all__ = ["VLMJudge", "VLMJudgeReward", "VLMPairwiseJudge", "vlm_judge_pairwise", "load_judge"]

QUESTION_YES_NO = "Does this image match the prompt and is it of high quality? Answer Yes or No."
QUESTION_SCALE = ("Rate how well this image matches the prompt and its overall quality on a scale from 1 to {k}. "
                  "Answer with a single digit.")
QUESTION_PAIR = "Which image matches the prompt better and is of higher quality? Answer 1 or 2."
TEMPLATE_POINT = "Prompt: {prompt}\n{question}"
TEMPLATE_PAIR = "Prompt: {prompt}\n{question}"


def load_judge(path: str, family: str = "auto", dtype: Any = "float32", device: str = "cpu",
               attn_implementation: str | None = "sdpa"):
    """``(model, processor, adapter)`` from a local Qwen-VL folder, in eval mode (nothing trainable)."""
    from transformers import AutoProcessor

    from mmgrpo.vlm.models.adapters import _dtype, detect_family, get_adapter

    if not os.path.isdir(path):
        raise FileNotFoundError(f"VLM judge folder not found: {path}")
    fam = detect_family(path) if family == "auto" else family  # names config.json when it is missing
    adapter = get_adapter(fam)
    processor = AutoProcessor.from_pretrained(path)
    kwargs: dict[str, Any] = {"dtype": _dtype(dtype)}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    model = adapter.model_class().from_pretrained(path, **kwargs)
    return model.to(device).eval().requires_grad_(False), processor, adapter


class VLMJudge:
    """Holds the judge model and turns (messages, images) batches into answer probabilities."""

    def __init__(self, path: str | None = None, *, model=None, processor=None, family: str = "auto",
                 dtype: Any = "float32", device: str = "cpu", batch_size: int = 8,
                 attn_implementation: str | None = "sdpa"):
        from mmgrpo.vlm.models.adapters import detect_family, get_adapter

        if model is None or processor is None:
            if path is None:
                raise ValueError("VLM judge: pass path= (a local Qwen-VL folder) or model= and processor=")
            model, processor, adapter = load_judge(path, family, dtype, device, attn_implementation)
        else:
            fam = family if family != "auto" else getattr(model.config, "model_type", "")
            adapter = get_adapter(fam if fam else detect_family(path))
            model = model.to(device).eval()
        processor.tokenizer.padding_side = "left"  # the last position is every row's next token
        self.model, self.processor, self.adapter = model, processor, adapter
        self.device = device
        self.batch_size = int(batch_size)

    def answer_ids(self, answers: Sequence[str]) -> list[int]:
        """First token id of each answer; they must be distinct (else the judge cannot tell them apart)."""
        tok = self.processor.tokenizer
        ids = []
        for a in answers:
            enc = tok.encode(a, add_special_tokens=False)
            if not enc:
                raise ValueError(f"VLM judge: answer {a!r} encodes to no token")
            ids.append(int(enc[0]))
        if len(set(ids)) != len(ids):
            raise ValueError(f"VLM judge: answers {list(answers)} share a first token ({ids}); choose answers "
                             "whose first tokens differ")
        return ids

    def answer_probs(self, conversations: Sequence[list[dict]], images: Sequence[Sequence[Any]],
                     answer_ids: Sequence[int]):
        """(B, A) full-vocabulary probabilities of the answer tokens at the next position, in batches."""
        import torch

        from mmgrpo.vlm.models.inputs import build_prompt_item
        from mmgrpo.vlm.models.rollout import batch_to, collate_prompts

        pad = self.processor.tokenizer.pad_token_id
        out = []
        with torch.no_grad():
            for s in range(0, len(conversations), self.batch_size):
                items = [build_prompt_item(self.processor, self.adapter, msgs, images=list(ims))
                         for msgs, ims in zip(conversations[s:s + self.batch_size], images[s:s + self.batch_size])]
                batch = batch_to(collate_prompts(items, pad), self.device)
                logits = self.model(**batch, use_cache=False, logits_to_keep=1).logits[:, -1].float()
                out.append(torch.softmax(logits, dim=-1)[:, list(answer_ids)].cpu())
        return torch.cat(out)


def _pil(images: np.ndarray, size: int | None):
    from PIL import Image

    ims = [Image.fromarray(a) for a in images]
    return [im.resize((size, size), Image.BICUBIC) for im in ims] if size else ims


class VLMJudgeReward(Reward):
    """Pointwise VLM judge (``mode="yes_no"`` or ``"scale"``); formulas and prompt format in the module docstring.

    Args:
        path: local Qwen-VL folder, or ``model=`` + ``processor=`` (e.g. ``mmgrpo.vlm.models.tiny.build_tiny_model``).
        mode: ``"yes_no"`` -> ``p(Yes)/(p(Yes)+p(No))``; ``"scale"`` -> rescaled expected rating 1..``scale_max``.
        question / template: the instruction and the user-text layout (``{prompt}``, ``{question}`` fields).
        answers: override the answer strings (yes_no: ``("Yes", "No")``; scale: ``"1".."K"``).
        image_size: resize images to a square of this size first (Flow-GRPO's UnifiedReward client uses 512);
            None keeps them (the processor's min/max pixels then decide the token count).
        family, dtype, device, batch_size, name (default ``"vlm_judge"``), nan_policy.
    """

    name = "vlm_judge"

    def __init__(self, path: str | None = None, *, model=None, processor=None, mode: str = "yes_no",
                 question: str | None = None, template: str = TEMPLATE_POINT,
                 answers: Sequence[str] | None = None, scale_max: int = 5, image_size: int | None = None,
                 family: str = "auto", dtype: Any = "float32", device: str = "cpu", batch_size: int = 8,
                 name: str | None = None, nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        if mode not in ("yes_no", "scale"):
            raise ValueError(f"mode must be 'yes_no' or 'scale', got {mode!r}")
        if mode == "scale" and not 2 <= int(scale_max) <= 9:
            raise ValueError(f"scale_max must be in 2..9 (one digit token per rating), got {scale_max}")
        self.judge = VLMJudge(path, model=model, processor=processor, family=family, dtype=dtype, device=device,
                              batch_size=batch_size)
        self.mode = mode
        self.scale_max = int(scale_max)
        default_answers = ("Yes", "No") if mode == "yes_no" else tuple(str(k) for k in range(1, self.scale_max + 1))
        self.answers = tuple(answers) if answers is not None else default_answers
        if len(self.answers) != len(default_answers):
            raise ValueError(f"mode {mode!r} needs {len(default_answers)} answers, got {self.answers}")
        self.answer_ids = self.judge.answer_ids(self.answers)
        self.question = question if question is not None else (
            QUESTION_YES_NO if mode == "yes_no" else QUESTION_SCALE.format(k=self.scale_max))
        self.template = template
        self.image_size = image_size

    def messages(self, prompt: str) -> list[dict]:
        """The chat for one image (the image item comes first, then the text)."""
        text = self.template.format(prompt=prompt, question=self.question)
        return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]

    def score(self, images, prompts, metadata, **kwargs: Any):
        ims = _pil(images, self.image_size)
        p = self.judge.answer_probs([self.messages(q) for q in prompts], [[im] for im in ims], self.answer_ids)
        return self.scores_from_probs(p)

    def scores_from_probs(self, p):
        """(N, answers) probabilities of the answer tokens -> {name: score, name/answer_mass: mass}: renormalised
        over the answer tokens; yes_no = P(yes), rating = expected rating mapped to [0, 1]."""
        import torch

        mass = p.sum(dim=1)
        q = p / mass.clamp_min(1e-30)[:, None]
        if self.mode == "yes_no":
            r = q[:, 0]
        else:
            k = torch.arange(1, self.scale_max + 1, dtype=q.dtype)
            r = ((q * k).sum(dim=1) - 1.0) / (self.scale_max - 1)
        return {self.name: r, f"{self.name}/answer_mass": mass}


class VLMPairwiseJudge:
    """Pairwise scorer (:class:`~flow_grpo.rewards.base.PairwiseScorer`): ``P(a > b) = p(1) / (p(1) + p(2))``
    with image a shown as "Image 1" and b as "Image 2" (prompt format in the module docstring).  Use
    ``PairwisePreferenceReward(..., symmetric=True)`` to average out the judge's position bias."""

    accepts_video = False  # two images per prompt; PairwisePreferenceReward refuses videos with a clear error

    def __init__(self, path: str | None = None, *, model=None, processor=None, question: str = QUESTION_PAIR,
                 template: str = TEMPLATE_PAIR, answers: Sequence[str] = ("1", "2"), image_size: int | None = None,
                 family: str = "auto", dtype: Any = "float32", device: str = "cpu", batch_size: int = 8):
        self.judge = VLMJudge(path, model=model, processor=processor, family=family, dtype=dtype, device=device,
                              batch_size=batch_size)
        if len(answers) != 2:
            raise ValueError(f"pairwise judge needs two answers (image 1, image 2), got {answers}")
        self.answer_ids = self.judge.answer_ids(answers)
        self.question, self.template, self.image_size = question, template, image_size

    def messages(self, prompt: str) -> list[dict]:
        text = self.template.format(prompt=prompt, question=self.question)
        return [{"role": "user", "content": [
            {"type": "text", "text": "Image 1: "}, {"type": "image"},
            {"type": "text", "text": "\nImage 2: "}, {"type": "image"},
            {"type": "text", "text": "\n" + text}]}]

    def __call__(self, images_a, images_b, prompts, metadata=None):
        a, b = _pil(np.asarray(images_a), self.image_size), _pil(np.asarray(images_b), self.image_size)
        p = self.judge.answer_probs([self.messages(q) for q in prompts], list(zip(a, b)), self.answer_ids)
        return p[:, 0] / p.sum(dim=1).clamp_min(1e-30)


def vlm_judge_pairwise(path: str | None = None, *, symmetric: bool = True, hard: bool = True,
                       name: str = "vlm_pref_win_rate", nan_policy: NanPolicy = "raise",
                       **judge_kwargs: Any) -> PairwisePreferenceReward:
    """Pref-GRPO win rate with the VLM pairwise judge: ``r_i = 1/(G-1) sum_{j in group} w_ij`` (see
    :class:`~flow_grpo.rewards.base.PairwisePreferenceReward`); ``symmetric=True`` judges both orders."""
    return PairwisePreferenceReward(VLMPairwiseJudge(path, **judge_kwargs), name=name, symmetric=symmetric,
                                    hard=hard, nan_policy=nan_policy)
