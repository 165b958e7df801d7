"""Supervised fine-tuning (SFT) of a Qwen-VL model on canonical samples: cross-entropy on the answer tokens only.

Used to build the demo's small base VLM (``scripts/build_tiny_vlm.py``), but nothing here is demo-specific: any
canonical sample (``mmgrpo.vlm.data`` schema; video, image or text-only) with a ground-truth answer works, with any
Qwen2/2.5/3-VL processor.

Pipeline (the same contract the GRPO trainer uses, so the SFT model is trained on exactly the prompts it is later
sampled on)::

    sample --build_messages--> chat messages --chat template (add_generation_prompt)--> prompt text
    video  --load_video--> VideoClip --build_video_inputs(processor, clip, text)--> prompt item (batch dim 1)
    sample --format_ground_truth_answer--> answer text --tokenizer--> answer ids + <|im_end|>

Batch layout (``collate_sft``), B rows, prompt P_i tokens, answer T_i tokens (incl. the end-of-turn token):

* ``padding_side="left"``: ``[pad.. | prompt_i | answer_i | pad..]`` -- prompts left-padded to max P, answers
  right-padded to max T.  This is the rollout/log-prob layout of :mod:`mmgrpo.vlm.models.rollout`
  (``collate_prompts`` + ``join_prompt_completion``), so SFT and GRPO see identical inputs.
* ``padding_side="right"``: ``[prompt_i | answer_i | pad..]`` -- the usual SFT layout.

``labels`` has the row's token id at answer positions and ``IGNORE_INDEX`` (-100) everywhere else (system/user
turns, the video placeholder tokens, the assistant header, padding).  The loss is the token mean over the batch:

    L = - sum_{b,t: labels[b,t] != -100} log p(labels[b,t] | tokens[b,<t]) / #{answer tokens in the batch}

Position ids are derived by the model from ``attention_mask`` (Qwen-VL ``get_rope_index``), so padding on either
side leaves every row's loss unchanged (tested).
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from mmgrpo.utils.schedule import LRFactor

IGNORE_INDEX = -100
TEXT_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids")
CAT_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


# ------------------------------------------------------------------------------------------------------------
# samples -> examples
# ------------------------------------------------------------------------------------------------------------
def _get(sample: Any, key: str, default: Any = None) -> Any:
    if isinstance(sample, Mapping):
        return sample.get(key, default)
    return getattr(sample, key, default)


def sample_dict(sample: Any) -> dict:
    """Canonical dict of a sample (``Sample`` dataclass or mapping); what the reward functions take."""
    if isinstance(sample, Mapping):
        return dict(sample)
    if hasattr(sample, "to_dict"):
        return sample.to_dict()
    if dataclasses.is_dataclass(sample):
        return dataclasses.asdict(sample)
    return dict(vars(sample))


@dataclass
class VideoSettings:
    """Frame sampling / pixel budget passed to :func:`mmgrpo.video.load_video` (qwen-vl-utils rules).

    Keep these identical between SFT, GRPO and evaluation: the model learns the time axis of *these* frames.
    """

    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 16
    min_pixels: int | None = 4 * 28 * 28
    max_pixels: int | None = 16 * 28 * 28
    total_pixels: float | None = None

    def load_kwargs(self) -> dict:
        return dict(fps=self.fps, min_frames=self.min_frames, max_frames=self.max_frames,
                    min_pixels=self.min_pixels, max_pixels=self.max_pixels, total_pixels=self.total_pixels)


@dataclass
class SFTExample:
    """One training example.

    prompt: processor output for the prompt alone (tensors with batch dim 1: ``input_ids`` (1, P), its pixel
        tensors, ``second_per_grid_ts`` ...), i.e. a rollout *prompt item*.
    answer_ids: (T,) int64, the answer's tokens followed by the end-of-turn token.
    """

    sample: Any
    prompt: dict
    answer_ids: Any
    prompt_text: str
    answer_text: str
    clip: Any = None

    @property
    def id(self) -> str:
        return str(_get(self.sample, "id", "<no id>"))


def _prompt_fns(mode: str, answer_format: str) -> tuple[Callable, Callable]:
    """(messages_fn, answer_fn) from :mod:`mmgrpo.vlm.data.prompts` (the templates the trainer uses), with the same
    mode and answer format for the prompt and the target (their own defaults differ: think vs no_think)."""
    from mmgrpo.vlm.data import prompts

    kw: dict[str, Any] = {"mode": mode, "answer_format": answer_format}
    return (lambda s: prompts.build_messages(s, **kw)), (lambda s: prompts.format_ground_truth_answer(s, **kw))


def _patch_factor(processor) -> int:
    vp = getattr(processor, "video_processor", None) or processor.image_processor
    return int(vp.patch_size) * int(vp.merge_size)


def _family_of(processor) -> str:
    """The first registered family whose adapter names this processor class (families that share a processor, as
    Qwen3-VL and Qwen3-VL-MoE do, share its video time contract: all the SFT inputs need)."""
    from mmgrpo.vlm.models.adapters import ADAPTERS

    name = type(processor).__name__
    for family, adapter in ADAPTERS.items():
        if adapter.processor_class_name == name:
            return family
    raise ValueError(f"cannot tell the model family of processor {name}; pass model_family=")


def prepare_example(
    sample: Any,
    processor: Any,
    *,
    model_family: str | None = None,
    video: VideoSettings | None = None,
    mode: str = "no_think",
    answer_format: str = "seconds",
    messages_fn: Callable[[Any], list] | None = None,
    answer_fn: Callable[[Any], str] | None = None,
    frames: Any = None,
    video_fps: float | None = None,
    clip_cache: dict | None = None,
) -> SFTExample:
    """Build one :class:`SFTExample` from a canonical sample.

    ``mode`` / ``answer_format`` select the :mod:`mmgrpo.vlm.data.prompts` templates for both the prompt and the target
    unless ``messages_fn`` / ``answer_fn`` are given.  The prompt goes through ``build_messages`` -> chat template
    -> ``load_video`` -> ``build_video_inputs`` (video samples), the processor with ``images=`` (image samples) or
    the tokenizer alone (text).  ``frames`` (a (T, H, W, 3) array / list of frames at ``video_fps``) replaces
    reading ``sample.video`` from disk (tests).
    ``clip_cache`` (a dict) memoises decoded clips by (path, video_start, video_end): several queries on one video
    decode it once.

    Raises ValueError naming the sample id when the answer is empty or contains special tokens.
    """
    import torch

    sid = str(_get(sample, "id", "<no id>"))
    if messages_fn is None or answer_fn is None:
        m, a = _prompt_fns(mode, answer_format)
        messages_fn = messages_fn or m
        answer_fn = answer_fn or a
    family = model_family or _family_of(processor)
    tok = processor.tokenizer
    text = processor.apply_chat_template(messages_fn(sample), add_generation_prompt=True, tokenize=False)
    clip = key = None
    if frames is not None or _get(sample, "video") is not None:
        from mmgrpo.video import build_video_inputs, load_video
        from mmgrpo.vlm.models.adapters import get_adapter

        vs = video or VideoSettings()
        src = frames if frames is not None else _get(sample, "video")
        kw = vs.load_kwargs()
        if frames is not None and video_fps is not None:
            kw["video_fps"] = float(video_fps)
        key = None
        if clip_cache is not None and frames is None:
            key = (os.fspath(src), _get(sample, "video_start"), _get(sample, "video_end"))
            clip = clip_cache.get(key)
        if clip is None:
            clip = load_video(src, image_factor=_patch_factor(processor), video_start=_get(sample, "video_start"),
                              video_end=_get(sample, "video_end"), **kw)
            if key is not None:
                clip_cache[key] = clip
        out = build_video_inputs(processor, clip, text, family, video_time=get_adapter(family).video_time)
    elif _get(sample, "image") is not None:
        from PIL import Image

        img = _get(sample, "image")
        img = Image.open(img).convert("RGB") if isinstance(img, (str, os.PathLike)) else img
        out = processor(text=[text], images=[img], return_tensors="pt")
    else:
        out = processor(text=[text], return_tensors="pt")
    prompt = {k: v for k, v in dict(out).items() if isinstance(v, torch.Tensor)}
    if key is not None and "pixel_values_videos" in prompt:
        # several queries of one video: keep one copy of its pixels (the processor output depends on the clip
        # only; checked, not assumed), so an SFT set of N queries on N/3 videos holds N/3 pixel tensors
        pk = ("pixel_values_videos",) + key
        cached = clip_cache.get(pk)
        if cached is not None and torch.equal(cached, prompt["pixel_values_videos"]):
            prompt["pixel_values_videos"] = cached
        else:
            clip_cache[pk] = prompt["pixel_values_videos"]

    answer = answer_fn(sample)
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError(f"sample {sid!r}: empty ground-truth answer {answer!r}")
    specials = [t for t in tok.all_special_tokens if t and t in answer]
    if specials:
        raise ValueError(f"sample {sid!r}: answer text contains special token(s) {specials}: {answer!r}")
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    if eot is None or eot == tok.unk_token_id:
        eot = tok.eos_token_id
    ids = tok(answer, add_special_tokens=False)["input_ids"] + [int(eot)]
    return SFTExample(sample=sample, prompt=prompt, answer_ids=torch.tensor(ids, dtype=torch.long),
                      prompt_text=text, answer_text=answer, clip=clip)


def prepare_examples(samples: Sequence[Any], processor: Any, **kwargs: Any) -> list[SFTExample]:
    """:func:`prepare_example` for each sample; each distinct video is decoded once (keep the list to train for
    several epochs)."""
    kwargs.setdefault("clip_cache", {})
    return [prepare_example(s, processor, **kwargs) for s in samples]


# ------------------------------------------------------------------------------------------------------------
# batching and loss
# ------------------------------------------------------------------------------------------------------------
def collate_sft(examples: Sequence[SFTExample], pad_token_id: int, padding_side: str = "left"):
    """(batch, labels) for ``model(**batch)``; see the module docstring for the two layouts.

    batch: ``input_ids`` / ``attention_mask`` / ``mm_token_type_ids`` (B, L) and the vision tensors concatenated
    in row order (the order the model assigns videos/images to placeholders).  labels: (B, L) int64.
    """
    import torch

    if not examples:
        raise ValueError("collate_sft: no examples")
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    P = max(int(e.prompt["input_ids"].shape[-1]) for e in examples)
    T = max(int(e.answer_ids.shape[0]) for e in examples)
    has_mm = "mm_token_type_ids" in examples[0].prompt
    ids_rows, am_rows, mm_rows, lab_rows = [], [], [], []
    for e in examples:
        p = e.prompt["input_ids"].reshape(-1)
        a = e.answer_ids.reshape(-1).to(p.dtype)
        mm = e.prompt["mm_token_type_ids"].reshape(-1) if has_mm else None
        seq = torch.cat([p, a])
        lab = torch.cat([torch.full_like(p, IGNORE_INDEX), a])
        mmseq = torch.cat([mm, mm.new_zeros(a.shape)]) if has_mm else None
        if padding_side == "left":
            lp, rp = P - p.shape[0], T - a.shape[0]
        else:
            lp, rp = 0, (P + T) - seq.shape[0]

        def pad(x, val):
            return torch.cat([x.new_full((lp,), val), x, x.new_full((rp,), val)])

        ids_rows.append(pad(seq, pad_token_id))
        am_rows.append(pad(torch.ones_like(seq), 0))
        lab_rows.append(pad(lab, IGNORE_INDEX))
        if has_mm:
            mm_rows.append(pad(mmseq, 0))
    batch: dict[str, Any] = {"input_ids": torch.stack(ids_rows), "attention_mask": torch.stack(am_rows)}
    if has_mm:
        batch["mm_token_type_ids"] = torch.stack(mm_rows)
    for key in CAT_KEYS:
        vals = [e.prompt[key] for e in examples if key in e.prompt and e.prompt[key] is not None]
        if vals:
            batch[key] = torch.cat([v.reshape(-1) if v.dim() == 0 else v for v in vals], dim=0)
    return batch, torch.stack(lab_rows)


def token_nll(model, batch: dict, labels, chunk_size: int = 0):
    """Per-token negative log-likelihood (B, L-1) of ``labels[:, 1:]`` (0 where ignored) and the mask (B, L-1).

    ``chunk_size`` > 0: the output head runs on the answer positions only, that many at a time
    (``mmgrpo.vlm.models.chunked``; same values and gradients, no (B, L, V) logits); 0 = full logits."""
    import torch.nn.functional as F

    if chunk_size > 0:
        from mmgrpo.vlm.models.chunked import capture_head_inputs, chunkable_head, chunked_token_logprobs

        head = chunkable_head(model)
        if head is not None:
            with capture_head_inputs(model) as store:
                model(**batch, use_cache=False)
            tgt = labels[:, 1:].to(store[-1].device)
            mask = tgt != IGNORE_INDEX
            lp = chunked_token_logprobs(store[-1][:, :-1], head.weight, tgt.clamp_min(0), head.bias,
                                        chunk_size=chunk_size, mask=mask)
            return -lp, mask
    out = model(**batch, use_cache=False)
    logits = out.logits[:, :-1].float()
    tgt = labels[:, 1:]
    mask = tgt != IGNORE_INDEX
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1).clamp_min(0), reduction="none")
    nll = nll.view(tgt.shape) * mask
    return nll, mask


def sft_loss(model, batch: dict, labels, chunk_size: int = 0):
    """(loss, n_tokens): token-mean cross-entropy over the answer tokens of the batch (``chunk_size``: see
    ``token_nll``)."""
    nll, mask = token_nll(model, batch, labels, chunk_size)
    n = int(mask.sum())
    if n == 0:
        raise ValueError("sft_loss: the batch has no answer tokens (all labels are IGNORE_INDEX)")
    return nll.sum() / n, n


def per_example_loss(model, batch: dict, labels, chunk_size: int = 0):
    """(B,) mean answer-token NLL of each row."""
    nll, mask = token_nll(model, batch, labels, chunk_size)
    return nll.sum(1) / mask.sum(1).clamp_min(1)


# ------------------------------------------------------------------------------------------------------------
# training
# ------------------------------------------------------------------------------------------------------------
@dataclass
class SFTConfig:
    steps: int = 300
    batch_size: int = 16
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decays lr -> lr * min_lr_ratio over `steps`
    warmup_steps: int = 20
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.98)
    max_grad_norm: float = 1.0
    train_vision: bool = True  # a randomly initialised vision tower must learn too
    padding_side: str = "left"
    seed: int = 0
    max_seconds: float = 0.0  # wall-clock guard (0 = off); if hit, training stops early and says so
    log_every: int = 10
    logprob_chunk_size: int = 256  # answer tokens per chunk of the output head (mmgrpo.vlm.models.chunked); 0 = full


def lr_at(step: int, cfg: SFTConfig) -> float:
    """Linear warmup over ``warmup_steps`` (step 0 -> lr / warmup), then cosine from ``lr`` to ``lr * min_lr_ratio``
    at ``steps`` (:class:`mmgrpo.utils.schedule.LRFactor`)."""
    return cfg.lr * LRFactor("cosine", cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio)(step)


def batch_order(n: int, steps: int, batch_size: int, seed: int) -> list[list[int]]:
    """Index lists for ``steps`` batches: epochs of seeded permutations, concatenated (no example repeats within
    an epoch; a batch may straddle two epochs)."""
    import torch

    if n == 0:
        raise ValueError("no training examples")
    g = torch.Generator().manual_seed(int(seed))
    need = steps * batch_size
    flat: list[int] = []
    while len(flat) < need:
        flat.extend(torch.randperm(n, generator=g).tolist())
    return [flat[i * batch_size:(i + 1) * batch_size] for i in range(steps)]


def train_sft(model, examples: Sequence[SFTExample], cfg: SFTConfig, pad_token_id: int,
              log: Callable[[dict], None] | None = None) -> dict:
    """Full fine-tuning with AdamW for ``cfg.steps`` steps (the stopping rule: no held-out data is looked at).

    Returns ``{"history": [{step, loss, lr, tokens, seconds}], "steps_done", "seconds", "stopped_by"}``, where
    ``stopped_by`` is ``"steps"`` or ``"max_seconds"``.  The model is left in eval mode.
    """
    import torch

    if not cfg.train_vision:
        for n, p in model.named_parameters():
            if "visual" in n.split("."):
                p.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=cfg.betas)
    order = batch_order(len(examples), cfg.steps, cfg.batch_size, cfg.seed)
    model.train()
    history: list[dict] = []
    t0 = time.perf_counter()
    stopped_by = "steps"
    for step, idx in enumerate(order):
        if cfg.max_seconds and time.perf_counter() - t0 > cfg.max_seconds:
            stopped_by = "max_seconds"
            break
        lr = lr_at(step, cfg)
        for gr in opt.param_groups:
            gr["lr"] = lr
        batch, labels = collate_sft([examples[i] for i in idx], pad_token_id, cfg.padding_side)
        loss, ntok = sft_loss(model, batch, labels, cfg.logprob_chunk_size)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        rec = {"step": step + 1, "loss": float(loss.detach()), "lr": lr, "tokens": ntok,
               "seconds": time.perf_counter() - t0}
        history.append(rec)
        if log is not None and (step % max(1, cfg.log_every) == 0 or step == len(order) - 1):
            log(rec)
    model.eval()
    return {"history": history, "steps_done": len(history), "seconds": time.perf_counter() - t0,
            "stopped_by": stopped_by}


def pretrain_vision_tags(model, items: Sequence[tuple[dict, Any]], n_classes: int, *, steps: int,
                         batch_size: int = 8, lr: float = 2e-3, seed: int = 0, max_seconds: float = 0.0,
                         log: Callable[[dict], None] | None = None) -> dict:
    """Pre-train a Qwen-VL vision tower to name what each temporal block of a video shows (a tagging loss).

    Why: SFT on grounding alone trains a random vision tower only through the answer's few tokens, and the tiny
    demo base ended up with visual tokens that tell *that* an object is there but not *which* (a linear probe of
    its merged visual tokens recovered the event colour at 42 % against 28 % chance, raw pixels at 100 %,
    ``docs/demo_models.md``), so no query could be bound to an event.  Real Qwen-VL towers are pre-trained on
    image-text data before any grounding; this is the tiny stand-in.

    ``items``: ``(prompt, tags)`` per video, ``prompt`` with ``pixel_values_videos`` and ``video_grid_thw`` (one
    video, as :class:`SFTExample.prompt`), ``tags`` a (T, n_classes) 0/1 array, T = the grid's temporal size.
    A linear head (discarded afterwards) maps every merged visual token to class logits; a block's logit is the
    max over its spatial tokens (an object sits in one token); loss = binary cross-entropy with ``tags``, mean
    over blocks and classes, present pairs weighted by (absent / present) of their class over ``items`` (<= 100).  AdamW, constant ``lr``, gradient norm clipped at 1; only the vision tower (and the
    head) change.  Returns ``{"history": [{step, loss, recall, false_pos, seconds}], "steps_done", "seconds", "stopped_by"}``
    (``recall`` / ``false_pos``: shares of present / absent (block, class) pairs with a positive logit).
    """
    import torch
    import torch.nn.functional as F

    inner = getattr(model, "model", model)
    visual = inner.visual
    out_dim = int(getattr(visual.config, "out_hidden_size", 0) or model.config.text_config.hidden_size)
    g = torch.Generator().manual_seed(int(seed))
    head = torch.nn.Linear(out_dim, n_classes)
    with torch.no_grad():
        head.weight.normal_(0.0, out_dim ** -0.5, generator=g)
        head.bias.fill_(-2.0)  # most (block, class) pairs are absent
    # present (block, class) pairs are rare (2-3 objects among n_classes per block): weight them up so that the
    # loss is not won by predicting "nothing" everywhere
    y_all = torch.cat([torch.as_tensor(t, dtype=torch.float32).reshape(-1, n_classes) for _, t in items])
    n_pos = y_all.sum(0).clamp(min=1.0)
    pos_weight = ((y_all.shape[0] - n_pos) / n_pos).clamp(max=100.0)
    params = list(visual.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    visual.train()
    history: list[dict] = []
    t0 = time.perf_counter()
    stopped_by = "steps"
    for step, idx in enumerate(batch_order(len(items), steps, batch_size, seed)):
        if max_seconds and time.perf_counter() - t0 > max_seconds:
            stopped_by = "max_seconds"
            break
        pv = torch.cat([items[i][0]["pixel_values_videos"] for i in idx])
        grid = torch.cat([items[i][0]["video_grid_thw"] for i in idx])
        feats = inner.get_video_features(pv, grid).pooler_output
        losses, hit, pos, false, neg = [], 0, 0, 0, 0
        for f, i, thw in zip(feats, idx, grid.tolist()):
            t = int(thw[0])
            logits = head(f).view(t, -1, n_classes).amax(1)  # (T, C)
            y = torch.as_tensor(items[i][1], dtype=logits.dtype).view(t, n_classes)
            losses.append(F.binary_cross_entropy_with_logits(logits, y, pos_weight=pos_weight))
            on = logits.detach() > 0
            hit, pos = hit + int((on & (y > 0)).sum()), pos + int((y > 0).sum())
            false, neg = false + int((on & (y == 0)).sum()), neg + int((y == 0).sum())
        loss = torch.stack(losses).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        rec = {"step": step + 1, "loss": float(loss.detach()), "recall": hit / max(pos, 1),
               "false_pos": false / max(neg, 1),
               "seconds": time.perf_counter() - t0}
        history.append(rec)
        if log is not None and (step % 25 == 0 or step == steps - 1):
            log(rec)
    visual.eval()
    return {"history": history, "steps_done": len(history), "seconds": time.perf_counter() - t0,
            "stopped_by": stopped_by}


# ------------------------------------------------------------------------------------------------------------
# greedy generation and TVG evaluation
# ------------------------------------------------------------------------------------------------------------
def generate_greedy(model, processor, examples: Sequence[SFTExample], batch_size: int = 32,
                    max_new_tokens: int = 24) -> dict:
    """Greedy completions through the GRPO rollout backend (same batching, suppressed vision tokens).

    Returns ``{"texts", "lengths" (tokens incl. EOS), "truncated", "seconds", "tokens_per_s"}``.
    """
    from mmgrpo.vlm.models.adapters import vision_token_ids
    from mmgrpo.vlm.models.rollout import HFRolloutBackend, SamplingParams

    backend = HFRolloutBackend(model, processor, suppress_token_ids=vision_token_ids(processor.tokenizer),
                               max_batch_size=batch_size)
    t0 = time.perf_counter()
    out = backend.generate([e.prompt for e in examples], 1, SamplingParams(max_new_tokens=max_new_tokens,
                                                                           greedy=True))
    dt = time.perf_counter() - t0
    lengths = out.lengths.tolist()
    return {"texts": list(out.texts), "lengths": lengths, "truncated": out.truncated.tolist(), "seconds": dt,
            "tokens_per_s": sum(lengths) / dt if dt > 0 else float("nan")}


def score_tvg_outputs(texts: Sequence[str], samples: Sequence[Any], parse_mode: str = "lenient") -> dict:
    """TVG metrics with the training reward's parser (``mmgrpo.vlm.rewards.tasks``, strict: an ``<answer>`` block is
    required), or a release's (``parse_mode``, e.g. ``time_r1_eval``: Time-R1's evaluation, whose R1@θ counts
    IoU > θ).  Unparsed outputs count as IoU 0.  Percentages: ``mIoU``, ``R1@0.3/0.5/0.7``, ``parse_rate``."""
    from mmgrpo.vlm.rewards.tasks import ParseConfig, prepare_temporal, span_iou

    if len(texts) != len(samples):
        raise ValueError(f"{len(texts)} outputs for {len(samples)} samples")
    pc = ParseConfig(parse_mode=parse_mode)
    ious, ok = [], 0
    for t, s in zip(texts, samples):
        tp = prepare_temporal(t, sample_dict(s), pc)
        ok += tp.pred is not None
        ious.append(span_iou(tp))
    n = max(1, len(ious))
    res = {"n": len(ious), "mIoU": 100.0 * sum(ious) / n, "parse_rate": 100.0 * ok / n}
    above = (lambda i, th: i > th) if parse_mode == "time_r1_eval" else (lambda i, th: i >= th)
    for th in (0.3, 0.5, 0.7):
        res[f"R1@{th}"] = 100.0 * sum(above(i, th) for i in ious) / n
    res["ious"] = ious
    return res


def query_swap_probe(texts: Sequence[str], samples: Sequence[Any], parse_mode: str = "lenient") -> dict:
    """Does the model read the query?  For videos with >= 2 queries, the mIoU of each prediction against its own
    query's span (``own``) and against the span of the *next* query on the same video (``other``), in percent.

    A model that ignores the query and the video content (it only predicts a typical span for a video of that
    length) scores ``own ~= other``; grounding shows as ``own > other``.  ``n`` = predictions compared; outputs are
    read with ``parse_mode`` (:func:`score_tvg_outputs`)."""
    if len(texts) != len(samples):
        raise ValueError(f"{len(texts)} outputs for {len(samples)} samples")
    by: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        by.setdefault(str(_get(s, "video")), []).append(i)
    own_t, own_s, oth_s = [], [], []
    for idx in by.values():
        if len(idx) < 2:
            continue
        for k, i in enumerate(idx):
            own_t.append(texts[i])
            own_s.append(samples[i])
            oth_s.append(samples[idx[(k + 1) % len(idx)]])
    if not own_t:
        return {"n": 0, "own_mIoU": None, "other_mIoU": None}
    own = score_tvg_outputs(own_t, own_s, parse_mode)["mIoU"]
    other = score_tvg_outputs(own_t, oth_s, parse_mode)["mIoU"]
    return {"n": len(own_t), "own_mIoU": own, "other_mIoU": other}


def event_probe(texts: Sequence[str], samples: Sequence[Any], min_iou: float = 0.1,
                parse_mode: str = "lenient") -> dict:
    """Which event does each prediction land on, and how far off are its boundaries?  The events of a video are
    the spans of all its queries (every event of the synthetic grounding benchmark has one).  A prediction *lands*
    on the event of its video it overlaps most (IoU >= ``min_iou``); it *hits* when that event is its own query's.

    Returns percentages ``hit`` (lands on the queried event), ``chance`` (mean of 1 / #events: picking an event of
    the video at random), ``landed`` (lands on some event), ``first`` (lands on the video's earliest event), and, over
    the hits, the mean signed boundary offsets ``start_offset`` / ``end_offset`` (seconds, prediction - truth: a
    systematic lag shows as both > 0) and ``hit_mIoU``; ``width`` = mean predicted span length (s) of parsed
    outputs.  A gain in mIoU with ``hit`` unchanged is boundary precision on events the model already chose; a
    gain in ``hit`` is choosing the queried event more often.  Split by the queried event's place: ``hit_earliest``
    (over the queries about the video's earliest event), ``hit_later`` (over the others) and ``later_on_earliest``
    (share of the later-event queries that land on the earliest event: a bias toward the first event shows here,
    not in ``hit``); None when a class is empty. Outputs are read with ``parse_mode`` (:func:`score_tvg_outputs`)."""
    from mmgrpo.vlm.rewards.tasks import ParseConfig, prepare_temporal
    from mmgrpo.vlm.rewards.temporal import temporal_iou

    if len(texts) != len(samples):
        raise ValueError(f"{len(texts)} outputs for {len(samples)} samples")
    events: dict[str, list] = {}
    for s in samples:
        events.setdefault(str(_get(s, "video")), []).append(tuple(_get(s, "spans")[0]))
    n = len(samples)
    hit = landed = first = 0
    d_start, d_end, hit_iou, widths, chance = [], [], [], [], []
    by_place = {True: [0, 0], False: [0, 0]}  # queried event is the earliest -> [hits, queries]
    later_first = 0
    for t, s in zip(texts, samples):
        evs = sorted(set(events[str(_get(s, "video"))]))
        chance.append(1.0 / len(evs))
        gt = tuple(_get(s, "spans")[0])
        place = by_place[evs[0] == gt]
        place[1] += 1
        tp = prepare_temporal(t, sample_dict(s), ParseConfig(parse_mode=parse_mode))
        if tp.pred is None:
            continue
        p = tuple(tp.pred)
        widths.append(p[1] - p[0])
        ious = [temporal_iou(p, e) for e in evs]
        j = max(range(len(evs)), key=lambda k: ious[k])
        if ious[j] < min_iou:
            continue
        landed += 1
        first += j == 0
        later_first += j == 0 and evs[0] != gt
        if evs[j] == gt:
            hit += 1
            place[0] += 1
            d_start.append(p[0] - gt[0])
            d_end.append(p[1] - gt[1])
            hit_iou.append(ious[j])

    def mean(xs):
        return None if not xs else float(sum(xs) / len(xs))

    pct = lambda k: 100.0 * k / max(1, n)  # noqa: E731
    pct_of = lambda k, m: None if m == 0 else 100.0 * k / m  # noqa: E731
    return {"n": n, "hit": pct(hit), "chance": 100.0 * (mean(chance) or 0.0), "landed": pct(landed),
            "first": pct(first), "start_offset": mean(d_start), "end_offset": mean(d_end),
            "hit_mIoU": None if not hit_iou else 100.0 * mean(hit_iou), "width": mean(widths),
            "hit_earliest": pct_of(*by_place[True]), "hit_later": pct_of(*by_place[False]),
            "later_on_earliest": pct_of(later_first, by_place[False][1])}


def evaluate_tvg(model, processor, examples: Sequence[SFTExample], batch_size: int = 32,
                 max_new_tokens: int = 24) -> dict:
    """Greedy decoding + :func:`score_tvg_outputs` + :func:`query_swap_probe` (``query_swap``); adds
    ``tokens_per_s`` (generated tokens incl. EOS / wall time incl. prefill), ``seconds`` and the raw ``texts``."""
    gen = generate_greedy(model, processor, examples, batch_size, max_new_tokens)
    res = score_tvg_outputs(gen["texts"], [e.sample for e in examples])
    res["query_swap"] = query_swap_probe(gen["texts"], [e.sample for e in examples])
    res.update(texts=gen["texts"], tokens_per_s=gen["tokens_per_s"], seconds=gen["seconds"],
               truncated_rate=100.0 * sum(gen["truncated"]) / max(1, len(examples)))
    return res


__all__ = [
    "IGNORE_INDEX", "VideoSettings", "SFTExample", "SFTConfig", "sample_dict", "prepare_example",
    "prepare_examples", "collate_sft", "token_nll", "sft_loss", "per_example_loss", "lr_at", "batch_order",
    "train_sft", "generate_greedy", "score_tvg_outputs", "query_swap_probe", "event_probe", "evaluate_tvg",
]
