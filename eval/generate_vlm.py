#!/usr/bin/env python
"""Generate predictions with a local Qwen-VL checkpoint over a canonical dataset, then score them.

    python eval/generate_vlm.py --config eval/configs/charades_sta.yaml model=PATH \
        data.annotations=charades_test.jsonl out_dir=runs/eval/charades_base [data.prompt_mode=no_think ...]

``model`` is a model folder (a base checkpoint or a LoRA-merged one), or a LoRA adapter folder (its
``adapter_config.json`` names the base), or a trainer checkpoint holding ``adapter/``; ``adapter=DIR`` applies an
adapter on top of ``model``.  ``python eval/generate_vlm.py --help`` lists every setting.

Preprocessing is the trainer's, by construction: samples are read with ``mmgrpo.vlm.data.task.load_samples``, turned
into model inputs by ``mmgrpo.vlm.data.task.TaskAdapter.prepare`` (the same prompt templates, the same
``mmgrpo.video.load_video`` + ``build_video_inputs`` frame / pixel / time-axis contract), collated with the
rollout's ``collate_prompts`` (left padding) and decoded greedily with vision tokens suppressed -- the token choices
of ``HFRolloutBackend(greedy=True)`` without its per-step logits -- or, with ``decoding.greedy=false``, sampled by
``HFRolloutBackend`` itself (per-sample seeds).  Decoding uses only the ``decoding.*`` settings: the checkpoint's
``generation_config.json`` decoding fields (Qwen2.5-VL Instruct: repetition_penalty 1.05, temperature 0.1, top_p
0.001, top_k 1) are ignored, and the ignored values are written under ``decoding`` in settings.json and
metrics.json.  The ``data.*`` defaults equal
the training defaults (fps 2, 4-768 frames, 16*28*28-768*28*28 pixels per frame, 3584*28*28 in total).

Outputs in ``out_dir``:

* ``settings.json``    every setting that changes the number, written BEFORE generation: model path + fingerprint
  (config and weights hashes, adapter), family, dtype, device, frames / fps / pixel bounds, the processor's own
  settings, prompt mode + system prompt + an example rendered prompt + a hash of all rendered prompts, answer
  format, decoding (greedy / temperature / top-p / top-k / seed / max new tokens / batch size), dataset file +
  sha256 + n, scoring options, library versions and git commit; ``fingerprint`` = hash of all of it.
* ``predictions.jsonl`` ``{"id", "output", "n_tokens", "truncated", ...}`` appended and fsynced per batch, in
  dataset order.  A restarted run skips ids already written (a torn last line is truncated first); batches are
  fixed, so an interrupted + resumed run writes the same file as an uninterrupted one.  Resuming with different
  settings is refused (``overwrite=true`` starts over).
* ``metrics.json`` / ``per_sample.jsonl``  from ``eval/score.py``'s API (+ generation statistics: truncated
  outputs, mean length, ``well_formed_rate`` = the share of outputs that are exactly the answer the prompt asks
  for, ``mmgrpo.vlm.rewards.format.well_formed``), and
  ``report.md`` / ``report.json`` (``eval/report.py``).

* ``export/``  with ``export=FORMAT[,FORMAT]``: the scored predictions in the files the benchmarks' own evaluation
  code reads -- ``lmms_eval_tvg`` / ``time_r1_tvg`` (Charades-STA, ActivityNet Captions), ``nextgqa``
  (``eval_ground.py``'s ``<split>_ground.json`` + ``<split>-res.json``), ``refcoco`` (boxes in original-image
  pixels) / ``lmms_eval_refcoco``; formats and sources in ``eval/export.py`` and ``docs/benchmarks.md``.

``max_batches=N`` stops after N generated batches without scoring (tests; a deliberate interruption).

Video-RTS (``rts.enabled=true``, sparse-to-dense test-time scaling; release Ziyang412/Video-RTS
``src/video_rts_eval.py``): per item, ``rts.num_samples`` answers are sampled with ``rts.min_frames`` frames; if they
do not all agree the frames are multiplied by ``rts.growth`` and the item is sampled again, until they agree or the
next count would exceed ``rts.max_frames``; the recorded output is the majority answer of the last round. Each
prediction row adds ``rts_frames``, ``rts_rounds``, ``rts_generate_calls``, ``rts_samples``,
``rts_completion_tokens``, ``rts_prompt_tokens`` (prompt tokens x samples, the visual-token compute) and
``rts_trace`` (per round: frames, tokens, parsed answers, agreed); ``metrics.json["generation"]["rts"]`` sums them.

Multi-turn tool use (``tools.enabled=true``, ``tools.*`` as in training; docs/tools.md): each item runs the
trainer's tool loop (:class:`mmgrpo.vlm.tools.rollout.MultiTurnBackend` around the HF backend, greedy or sampled);
``output`` is the last turn (the answer) and each prediction row adds ``turns``, ``tool_calls``, ``tool_failures``,
``visual_tokens``, ``policy_tokens`` (= ``n_tokens``), ``tool_tokens``, ``tools_called``, ``stop`` and
``turn_texts``; ``metrics.json["generation"]["tools"]`` has their means per answer.
Deviations from the release, deliberate: agreement compares parsed answers (the option letter set; tvg spans by
pairwise IoU >= ``rts.tvg_iou``, the release has no tvg) where the release compares the raw ``<answer>`` strings
("B" vs "B." disagree there); sampling uses ``decoding.temperature/top_p/top_k`` with per-(item, round, sample)
seeds, where the release varies temperature 0.7 + 0.1 k and top_p max(0.5, 0.9 − 0.1 k) across its 5 samples and
prefixes each prompt with "Sample run k:" (not reproduced: it changes the prompt the model was trained on).

Speed (docs/performance.md, "VLM evaluation harness throughput"): ``threads=1`` torch thread by default (two
threads on shared CPU cores made generation up to 24x slower), decoded clips are memoised across the queries of one
video (``clip_cache``), and ``decoding.batch_size`` prompts share one ``generate()`` call; none of these changes a
greedy prediction.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

if __package__ in (None, ""):  # executed as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval.export import EXPORT_HELP  # noqa: E402
from eval.harness import (  # noqa: E402
    ResumableJsonl,
    check_resume,
    fingerprint_dir,
    fixed_batches,
    git_info,
    library_versions,
    settings_fingerprint,
    sha256_file,
    write_json,
)
from mmgrpo.vlm.models.adapters import ADAPTERS, check_family  # noqa: E402  (no torch import)
from mmgrpo.vlm.tools.config import ToolsConfig  # noqa: E402  (no torch import)

PREDICTIONS = "predictions.jsonl"
LIBRARIES = ("torch", "transformers", "tokenizers", "peft", "accelerate", "numpy", "pillow", "decord", "av",
             "torchvision", "qwen-vl-utils")


def _h(text: str) -> dict:
    return {"help": text}


@dataclass
class VLMDataConfig:
    """Field names match ``mmgrpo.vlm.config.DataConfig`` so ``TaskAdapter`` reads this section directly."""

    annotations: str = field(default="", metadata=_h("canonical JSONL to evaluate (mmgrpo.vlm.data schema)"))
    media_root: str = field(default="",
                            metadata=_h("prefix for relative video/image paths (default: the JSONL's folder)"))
    task: Literal["tvg", "mcq", "gqa", "rec"] = field(default="tvg",
                                                      metadata=_h("task scored (every sample must have it)"))
    prompt_mode: Literal["think", "no_think", "hybrid"] = field(
        default="think", metadata=_h("prompt mode (mmgrpo.vlm.data.prompts): <think> reasoning or a direct answer"))
    answer_format: Literal["seconds", "json"] = field(default="seconds", metadata=_h("span format asked for"))
    prompt_template: str = field(default="mmgrpo", metadata=_h(
        "mmgrpo = the project's prompt, or a release's prompt reproduced exactly (mmgrpo.vlm.data.templates: "
        "time_r1_v1, tempsamp_r1, video_r1, vlm_r1_rec, videochat_r1_gqa, ...); evaluate with the prompt the model "
        "was trained with"))
    query_position: Literal["after", "before"] = field(default="after", metadata=_h(
        "prompt_template=mmgrpo: task text after (default) or before the video/image in the user turn; must match "
        "the model's training"))
    check_samples: int = field(default=2, metadata=_h(
        "before generating, check the first N samples as `mmgrpo check` does (the ground truth written as the "
        "prompt asks is scored correct by the scoring protocol, the pixel budget reaches the processor); 0 = off"))
    max_samples: int = field(default=0, metadata=_h("evaluate only the first N samples (0 = all)"))
    on_missing_media: Literal["error", "skip"] = field(
        default="error", metadata=_h("missing/undecodable media (also over max_image_pixels / max_video_frame_pixels): "
                                     "error (at load time, one error listing every such sample with file:line), or "
                                     "skip = write output null (scored 0, counted in n_media_error)"))
    media_check: Literal["header", "exists"] = field(default="header", metadata=_h(
        "check every video/image when the annotations are loaded: header (sizes, PNG checksums, video durations; "
        "no decoding) or exists (see docs/reliability.md)"))
    max_image_pixels: int = field(default=89_478_485, metadata=_h("larger images are unusable media"))
    max_video_frame_pixels: int = field(default=7680 * 4320, metadata=_h(
        "decode cap: videos whose header claims larger frames are unusable media (default 8K UHD)"))
    duration_tolerance: float = field(default=2.0, metadata=_h(
        "seconds: annotated vs video duration differing by more than max(this, duration_tolerance_frac x the "
        "video's) is a duration mismatch"))
    duration_tolerance_frac: float = field(default=0.05, metadata=_h("relative part of the duration tolerance"))
    on_duration_mismatch: Literal["warn", "skip", "error"] = field(default="warn", metadata=_h(
        "a sample whose annotated duration disagrees with its video's: warn (default: it stays scored, so the "
        "numbers stay comparable with other evaluations; counted and listed), skip (left out of the evaluation) or "
        "error"))
    media_check_workers: int = field(default=8, metadata=_h("threads of the media check at load time"))
    video_fps: float = field(default=2.0, metadata=_h("frame sampling rate (frames per second)"))
    max_frames: int = field(default=768, metadata=_h("max sampled frames per video"))
    min_frames: int = field(default=4, metadata=_h("min sampled frames per video"))
    video_min_pixels: int = field(default=16 * 28 * 28, metadata=_h("per-frame min pixels"))
    video_max_pixels: int = field(default=768 * 28 * 28, metadata=_h("per-frame max pixels"))
    video_total_pixels: float = field(default=float(3584 * 28 * 28),
                                      metadata=_h("pixel budget of the whole video (caps frames x pixels)"))
    image_min_pixels: int = field(default=0, metadata=_h("image min pixels (0 = the processor's own setting)"))
    image_max_pixels: int = field(default=0, metadata=_h("image max pixels (0 = the processor's own setting)"))


@dataclass
class DecodingConfig:
    greedy: bool = field(default=True, metadata=_h("argmax decoding (false = sample with temperature/top_p/top_k)"))
    temperature: float = field(default=1.0, metadata=_h("sampling temperature (greedy=false)"))
    top_p: float = field(default=1.0, metadata=_h("nucleus mass (greedy=false)"))
    top_k: int = field(default=0, metadata=_h("top-k, 0 = off (greedy=false)"))
    seed: int = field(default=0, metadata=_h("sampling seed; row seed = hash(seed, sample index), batch-independent"))
    max_new_tokens: int = field(default=0, metadata=_h("0 = auto: 1024 for think/hybrid prompts, 256 for no_think"))
    batch_size: int = field(default=4, metadata=_h("prompts per generate() call (left padded)"))


@dataclass
class ScoringConfig:
    by: list[str] = field(default_factory=list, metadata=_h("breakdowns, e.g. [dataset, duration_bucket]"))
    protocol: Literal["official", "lenient"] = field(
        default="official",
        metadata=_h("top-level numbers: official = the evaluation released with the benchmark / reproduced paper "
                    "(tvg Time-R1, mcq Video-R1, rec VLM-R1, gqa NExT-GQA), lenient = the project's parser; both "
                    "are always in metrics.json['protocols'] and the report"))
    official_mode: str = field(default="auto", metadata=_h(
        "release mode of the official protocol (auto = the task's default; e.g. tempsamp_r1 for tvg)"))
    fallback_to_text: bool = field(default=True, metadata=_h("lenient protocol: no <answer> block -> parse the whole text"))
    allow_unclosed: bool = field(default=True, metadata=_h("lenient protocol: accept a final <answer> without </answer>"))
    which: Literal["auto", "first", "last"] = field(default="auto", metadata=_h("lenient protocol: which span/box/number to use"))
    thresholds: list[float] = field(default_factory=list,
                                    metadata=_h("IoU thresholds (empty = tvg 0.3,0.5,0.7; gqa 0.3,0.5)"))
    numeric_rel_tol: float = field(default=0.0, metadata=_h("mcq numeric answers: relative tolerance"))
    box_frame: str = field(default="auto", metadata=_h("rec: frame of predicted boxes; auto = the model family's"))
    duration_buckets: list[float] = field(default_factory=lambda: [30.0, 60.0, 120.0, 300.0],
                                          metadata=_h("edges (s) of the duration_bucket breakdown"))
    benchmark: str = field(default="", metadata=_h(
        "also score with a benchmark's own metrics (eval/benchmarks.py: vsibench | qvhighlights | seed_bench_r1 | "
        "clevrer), written to metrics.json['benchmark']"))


@dataclass
class RTSConfig:
    """Video-RTS test-time scaling (sparse-to-dense frames), see :func:`rts_loop`."""

    enabled: bool = field(default=False, metadata=_h(
        "Video-RTS: sample num_samples answers with min_frames frames; while they disagree, multiply the frames "
        "by growth and sample again, up to max_frames (needs decoding.greedy=false; video tasks)"))
    min_frames: int = field(default=32, metadata=_h("frames of the first round (the release: 32); even"))
    max_frames: int = field(default=64, metadata=_h(
        "frame cap; the last round is the largest min_frames*growth^k <= max_frames (the release: 64 for "
        "MMVU/VideoMMMU, 128 for VideoHolmes/VideoMME/LongVideoBench)"))
    growth: int = field(default=2, metadata=_h("frame multiplier between rounds (the release doubles)"))
    num_samples: int = field(default=5, metadata=_h("sampled answers per round (the release: 5)"))
    tvg_iou: float = field(default=0.5, metadata=_h(
        "tvg agreement: every pair of sampled spans has IoU >= this (the release has no tvg; mcq/gqa agree when "
        "all letters are equal, as its 'one unique answer' rule)"))
    answer: Literal["majority", "first"] = field(default="majority", metadata=_h(
        "recorded answer of the last round: majority = most common answer (the release's reported accuracy; "
        "tvg: the span with the highest summed IoU to the others), first = the first sample"))


@dataclass
class EvalVLMConfig:
    """Generate + score a Qwen-VL checkpoint on a canonical benchmark (see the module docstring)."""

    model: str = field(default="",
                       metadata=_h("model folder, LoRA-merged folder, adapter folder or trainer checkpoint"))
    adapter: str = field(default="", metadata=_h("optional LoRA adapter folder applied on top of model"))
    merge_adapter: bool = field(default=True, metadata=_h("merge the adapter into the weights before generating"))
    family: str = field(default="auto", metadata=_h(
        f"model family: auto (config.json's model_type) | a family of mmgrpo.vlm.models.adapters.ADAPTERS: "
        f"{' | '.join(ADAPTERS)}"))
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto", metadata=_h("weights dtype; auto = bfloat16 on GPU, float32 on CPU"))
    attn_implementation: str = field(default="sdpa", metadata=_h("sdpa | flash_attention_2 | eager"))
    device: str = field(default="auto", metadata=_h("auto | cpu | cuda | cuda:N"))
    out_dir: str = field(default="", metadata=_h("run folder (predictions, settings, metrics, report)"))
    name: str = field(default="", metadata=_h("run name in reports (default: out_dir's basename)"))
    data: VLMDataConfig = field(default_factory=VLMDataConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    score: ScoringConfig = field(default_factory=ScoringConfig)
    rts: RTSConfig = field(default_factory=RTSConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    hash_weights: Literal["sampled", "full", "none"] = field(
        default="sampled", metadata=_h("weights fingerprint: sampled (size + 64 chunks per file) | full | none"))
    overwrite: bool = field(default=False, metadata=_h("delete existing predictions/metrics in out_dir first"))
    max_batches: int = field(default=0, metadata=_h("stop after N generated batches, unscored (0 = run to the end)"))
    progress: bool = field(default=True, metadata=_h("tqdm progress bar"))
    threads: int = field(default=1, metadata=_h(
        "torch intra-op CPU threads (0 = torch's default, one per core); 1 because two threads on shared cores made "
        "CPU generation up to 24x slower (docs/performance.md); does not change predictions"))
    clip_cache: int = field(default=8, metadata=_h(
        "decoded videos kept in memory (LRU; 0 = off): several queries of one video are decoded once"))
    export: list[str] = field(default_factory=list, metadata=_h(
        EXPORT_HELP + "; written to out_dir/export/"))
    export_split: str = field(default="test", metadata=_h("nextgqa export: split prefix of the file names"))

    def __post_init__(self):
        check_family(self.family, "family")  # the adapter registry is the only list of families


# ------------------------------------------------------------------------------------------------ model
def resolve_model(model: str, adapter: str = "") -> tuple[str, Optional[str]]:
    """(base folder, adapter folder or None) for the accepted checkpoint forms (see the module docstring)."""
    if not model:
        raise ValueError("model=PATH is required (a local checkpoint folder)")
    m = Path(model)
    if not m.is_dir():
        raise FileNotFoundError(f"model folder not found: {model}")
    if adapter:
        a = Path(adapter)
        if (a / "adapter" / "adapter_config.json").is_file():
            a = a / "adapter"
        if not (a / "adapter_config.json").is_file():
            raise FileNotFoundError(f"adapter={adapter}: no adapter_config.json (expected a peft LoRA folder)")
        if not (m / "config.json").is_file():
            raise FileNotFoundError(f"model={model}: no config.json (with adapter=..., model must be the base)")
        return str(m), str(a)
    if (m / "config.json").is_file():
        return str(m), None
    if not (m / "adapter_config.json").is_file() and (m / "adapter" / "adapter_config.json").is_file():
        m = m / "adapter"  # a trainer checkpoint step-XXXXXXXX/
    if (m / "adapter_config.json").is_file():
        with open(m / "adapter_config.json") as f:
            base = json.load(f).get("base_model_name_or_path") or ""
        if not base or not (Path(base) / "config.json").is_file():
            raise FileNotFoundError(f"{m}/adapter_config.json: base_model_name_or_path={base!r} is not a local model "
                                    f"folder; pass model=BASE_FOLDER adapter={m}")
        return base, str(m)
    raise FileNotFoundError(f"model={model}: neither config.json nor adapter_config.json found")


def _device(spec: str):
    import torch

    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


def _resolved_dtype(spec: str, device) -> str:
    if spec != "auto":
        return spec
    return "bfloat16" if device.type == "cuda" else "float32"


def load_eval_policy(cfg: EvalVLMConfig):
    """``Policy`` in eval mode, no gradients; an adapter is loaded with ``load_policy(lora_path=...)`` (the
    trainer's path) and merged when ``merge_adapter``."""
    from mmgrpo.vlm.models.adapters import load_policy

    base, adapter = resolve_model(cfg.model, cfg.adapter)
    device = _device(cfg.device)
    dtype = _resolved_dtype(cfg.dtype, device)
    policy = load_policy(base, cfg.family, dtype=dtype, lora_path=adapter, attn_implementation=cfg.attn_implementation
                         or None, device=device)
    if adapter is not None and cfg.merge_adapter:
        policy.model = policy.model.merge_and_unload()
        policy.lora = False
    policy.model.requires_grad_(False)
    policy.model.eval()
    return policy, base, adapter, device, dtype


# ------------------------------------------------------------------------------------------------ settings
def default_max_new_tokens(mode: str) -> int:
    """Completion budget: 1024 tokens with reasoning (think / hybrid), 256 without (no_think)."""
    return 256 if mode == "no_think" else 1024


def _processor_settings(processor) -> dict:
    out = {}
    for name in ("image_processor", "video_processor"):
        p = getattr(processor, name, None)
        if p is None:
            continue
        d = p.to_dict() if hasattr(p, "to_dict") else {}
        keep = ("size", "min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size", "do_resize",
                "image_mean", "image_std", "do_sample_frames", "fps", "cap_pixels_per_frame", "image_processor_type",
                "video_processor_type", "processor_class", "rescale_factor")
        out[name] = {k: d[k] for k in keep if k in d}
    import hashlib

    tmpl = getattr(processor, "chat_template", None) or ""
    out["chat_template_sha256"] = hashlib.sha256(str(tmpl).encode()).hexdigest()
    return out


def build_settings(cfg: EvalVLMConfig, policy, base: str, adapter: Optional[str], device, dtype: str,
                   samples: Sequence[Any], task_adapter, annotations_sha: str) -> dict:
    """Every setting that changes the number (see the module docstring); ``fingerprint`` hashes all but ``run``."""
    import hashlib

    from mmgrpo.utils.config import config_to_dict

    d = cfg.data
    texts = hashlib.sha256()
    example = None
    for s in samples:
        t = task_adapter.processor.apply_chat_template(task_adapter.messages(s), add_generation_prompt=True,
                                                       tokenize=False)
        texts.update(t.encode("utf-8") + b"\0")
        if example is None:
            example = t
    dec = cfg.decoding
    max_new = dec.max_new_tokens or default_max_new_tokens(d.prompt_mode)
    s: dict[str, Any] = {
        "kind": "vlm",
        "task": d.task,
        "model": {
            "path": str(Path(base).resolve()),
            "fingerprint": fingerprint_dir(base, cfg.hash_weights),
            "adapter": None if adapter is None else str(Path(adapter).resolve()),
            "adapter_fingerprint": None if adapter is None else fingerprint_dir(adapter, cfg.hash_weights),
            "merge_adapter": bool(cfg.merge_adapter and adapter is not None),
            "family": policy.family,
            "dtype": dtype,
            "attn_implementation": cfg.attn_implementation,
            "device": device.type,
        },
        "video": {
            "fps": d.video_fps, "min_frames": d.min_frames, "max_frames": d.max_frames,
            "min_pixels": d.video_min_pixels, "max_pixels": d.video_max_pixels, "total_pixels": d.video_total_pixels,
            "image_factor": policy.adapter.patch_size * 2,
        },
        "image": {"min_pixels": d.image_min_pixels, "max_pixels": d.image_max_pixels},
        "processor": _processor_settings(policy.processor),
        "prompt": {
            "mode": d.prompt_mode,
            "answer_format": d.answer_format,
            "box_frame": policy.family,
            "system": _system_text(d),
            "example_rendered": example,
            "all_rendered_sha256": texts.hexdigest(),
        },
        "decoding": {
            "greedy": dec.greedy,
            "temperature": None if dec.greedy else dec.temperature,
            "top_p": None if dec.greedy else dec.top_p,
            "top_k": None if dec.greedy else dec.top_k,
            "seed": None if dec.greedy else dec.seed,
            "max_new_tokens": max_new,
            "batch_size": dec.batch_size,
            "suppressed_token_ids": list(policy.suppress_token_ids),
            # decoding uses only the settings above: the checkpoint's generation_config fields listed here
            # (e.g. repetition_penalty) are ignored, so results follow this protocol, not the model card's
            "checkpoint_generation_config": "ignored",
            "checkpoint_fields_ignored": _json_safe(_checkpoint_overrides(
                getattr(policy.model, "generation_config", None))),
        },
        "data": {
            "annotations": str(Path(d.annotations).resolve()),
            "sha256": annotations_sha,
            "n": len(samples),
            "max_samples": d.max_samples,
            "media_root": d.media_root,
            "on_missing_media": d.on_missing_media,
        },
        "score": score_options(cfg, policy.family),
        "versions": library_versions(LIBRARIES),
        "code": git_info(),
        "run": {"out_dir": str(Path(cfg.out_dir).resolve()), "name": cfg.name or Path(cfg.out_dir).name,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "config": config_to_dict(cfg),
                "torch_threads": _torch_threads()},
    }
    if cfg.rts.enabled:  # only then: runs without RTS keep their fingerprint
        s["rts"] = _rts_settings(cfg.rts)
    if cfg.tools.enabled:  # likewise: the multi-turn loop's tools, budgets and call format
        s["tools"] = config_to_dict(cfg.tools)
    s["fingerprint"] = settings_fingerprint(s)
    return s


def _system_text(d) -> Optional[str]:
    """The system turn the prompt template sends (None: none, the chat template's default then applies)."""
    from mmgrpo.vlm.data import system_prompt
    from mmgrpo.vlm.data.templates import get_template

    t = get_template(getattr(d, "prompt_template", "mmgrpo"))
    return system_prompt(d.prompt_mode) if t is None else t.system


def score_options(cfg: EvalVLMConfig, family: str) -> dict:
    """Keyword options for ``eval.score.score`` (JSON-safe)."""
    sc = cfg.score
    o: dict[str, Any] = dict(fallback_to_text=sc.fallback_to_text, allow_unclosed=sc.allow_unclosed, which=sc.which,
                             by=list(sc.by), duration_buckets=list(sc.duration_buckets), protocol=sc.protocol,
                             official_mode=sc.official_mode)
    task = cfg.data.task
    if sc.official_mode not in ("auto", ""):  # a typo must fail before hours of generation, not at scoring
        from mmgrpo.vlm.rewards.protocols import check_parse_mode

        check_parse_mode(sc.official_mode, task)
    if sc.thresholds:
        o["gqa_thresholds" if task == "gqa" else "thresholds"] = list(sc.thresholds)
    if task == "mcq":
        o["numeric_rel_tol"] = sc.numeric_rel_tol
    if task == "rec":
        o["box_frame"] = family if sc.box_frame == "auto" else sc.box_frame
        if cfg.data.image_min_pixels > 0 and cfg.data.image_max_pixels > 0:
            o["min_pixels"], o["max_pixels"] = cfg.data.image_min_pixels, cfg.data.image_max_pixels
    return o


def check_reward_fn(data_cfg, score_cfg, family: str, has_qa: bool = False):
    """The accuracy reward of this evaluation's protocol (``score.protocol`` / ``score.official_mode``) for the
    start-of-run check (``mmgrpo.vlm.check``): the ground truth written as the prompt asks must score 1."""
    from mmgrpo.vlm.rewards.registry import build_reward_fn

    task = data_cfg.task
    if score_cfg.protocol == "official":
        from eval.score import OFFICIAL_MODE

        mode = OFFICIAL_MODE[task] if score_cfg.official_mode in ("auto", "") else score_cfg.official_mode
    else:
        mode = "lenient"
    from mmgrpo.vlm.data.templates import get_template

    t = get_template(getattr(data_cfg, "prompt_template", "mmgrpo"))
    asks_evidence = t is None or "<glue>" in t.text  # gqa: only prompts that ask for the evidence span
    weights = {"tvg": {"iou": 1.0}, "mcq": {"mcq": 1.0}, "gqa": {"mcq": 1.0, "iou": 1.0} if asks_evidence else
               {"mcq": 1.0}, "rec": {"box_iou": 1.0}, "qa": {"video_r1_accuracy": 1.0}}[task]
    if task == "mcq" and has_qa:  # numerical (qa) samples in the file: Video-R1's accuracy scores both kinds
        weights = {"video_r1_accuracy": 1.0}
        mode = "video_r1" if mode == "video_r1_eval" else mode  # the reward's reading of the same release
    kw: dict[str, Any] = {"parse_mode": mode}
    if task == "rec":
        kw["box_frame"] = family if getattr(score_cfg, "box_frame", "auto") == "auto" else score_cfg.box_frame
    return build_reward_fn(weights, task, **kw)


# ------------------------------------------------------------------------------------------------ generation
def set_threads(n: int) -> None:
    """``torch.set_num_threads(n)`` for n >= 1 (0 keeps torch's default).  Why: the tiny-model ops take
    microseconds, so with 2 OpenMP threads on cores shared with other processes every op waits on a busy
    sibling thread -- measured 0.57 s/query (2 threads) vs 0.024 s/query (1 thread) for generate()."""
    if n > 0:
        import torch

        torch.set_num_threads(int(n))


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _clip_key(sample: Any) -> Optional[tuple]:
    """What the decoded clip depends on besides the (run-constant) data.* settings; None = do not cache."""
    v = _sample_attr(sample, "video")
    if not isinstance(v, str):
        return None  # frame lists are already in memory
    meta = _sample_attr(sample, "meta") or {}
    vfps = _sample_attr(sample, "video_fps")
    return (v, _sample_attr(sample, "video_start"), _sample_attr(sample, "video_end"),
            vfps if vfps is not None else (meta.get("video_fps") if isinstance(meta, dict) else None))


def with_clip_cache(task_adapter, size: int):
    """``task_adapter`` whose video decoding (``_load_clip``) is memoised over the last ``size`` distinct
    (video, start, end, fps): benchmarks ask several queries per video (synthetic TVG: 204 queries, 100 videos)
    and they are adjacent in the file.  The clip is read-only downstream (the processor resizes copies), so a
    shared clip gives the same pixels; errors are not cached (every sample reports its own)."""
    if size <= 0:
        return task_adapter
    from collections import OrderedDict

    load = task_adapter._load_clip
    cache: OrderedDict = OrderedDict()
    stats = {"hits": 0, "misses": 0}

    def cached(sample: Any):
        key = _clip_key(sample)
        if key is None:
            return load(sample)
        if key in cache:
            cache.move_to_end(key)
            stats["hits"] += 1
            return cache[key]
        clip = load(sample)
        stats["misses"] += 1
        cache[key] = clip
        if len(cache) > size:
            cache.popitem(last=False)
        return clip

    task_adapter._load_clip = cached  # instance attribute: shadows the method for this adapter only
    task_adapter.clip_cache_stats = stats
    return task_adapter


def _sample_attr(s: Any, k: str) -> Any:
    return s.get(k) if isinstance(s, dict) else getattr(s, k, None)


def _load(cfg: EvalVLMConfig) -> list:
    from mmgrpo.vlm.data.task import load_samples

    d = cfg.data
    if not d.annotations:
        raise ValueError("data.annotations=FILE is required (canonical JSONL)")
    from mmgrpo.vlm.data.media import MediaScreen

    # the header check; on_missing_media=skip keeps the sample (its output is written as null, as before)
    samples = load_samples(d.annotations, d.max_samples, d.media_root, check_media=d.on_missing_media == "error",
                           screen=MediaScreen.from_config(d, drop=False))
    seen: dict[str, int] = {}
    for i, s in enumerate(samples):
        sid = str(_sample_attr(s, "id"))
        if sid in seen:
            raise ValueError(f"{d.annotations}: duplicate sample id {sid!r} (samples {seen[sid]} and {i}); "
                             "ids key the resumable predictions file")
        seen[sid] = i
        if d.task == "mcq" and _sample_attr(s, "task") == "qa":  # numerical answers next to the letters (VSI-Bench)
            from eval.score import NUMERIC_QA_TYPES

            ptype = (_sample_attr(s, "meta") or {}).get("problem_type")
            if ptype not in NUMERIC_QA_TYPES:
                raise ValueError(f"{d.annotations}: sample id={sid!r} is an open-answer (qa) sample of problem_type "
                                 f"{ptype!r}; an mcq evaluation scores only {NUMERIC_QA_TYPES} answers")
            continue
        if _sample_attr(s, "task") != d.task:
            raise ValueError(f"{d.annotations}: sample id={sid!r} has task {_sample_attr(s, 'task')!r} but "
                             f"data.task={d.task!r}")
    if not samples:
        raise ValueError(f"{d.annotations}: no samples")
    return samples


def _checkpoint_overrides(gc) -> dict:
    from mmgrpo.vlm.models.rollout import checkpoint_decoding_overrides

    return checkpoint_decoding_overrides(gc)


def _prediction_row(sample: Any, prep, text: str, n_tokens: int, truncated: bool, patch: int) -> dict:
    row: dict[str, Any] = {"id": str(_sample_attr(sample, "id")), "output": text, "n_tokens": int(n_tokens),
                           "truncated": bool(truncated)}
    if prep.clip is not None:
        row["num_frames"] = int(prep.clip.num_frames)
        row["sample_fps"] = round(float(prep.clip.sample_fps), 6)
    if "image_grid_thw" in prep.item:  # the model-input image size, the frame of Qwen2.5-VL boxes
        _, gh, gw = (int(x) for x in prep.item["image_grid_thw"][0])
        row["resized_image_size"] = [gw * patch, gh * patch]
    return row


def _json_safe(d: dict) -> dict:
    """Values JSON can hold as they are, anything else (tuple keys, config objects) as its repr."""
    out = {}
    for k, v in d.items():
        try:
            json.dumps(v, allow_nan=False)
            out[k] = v
        except (TypeError, ValueError):
            out[k] = repr(v)
    return out


def greedy_generate(policy, items: Sequence[dict], max_new_tokens: int) -> tuple[list[str], list[int], list[bool]]:
    """:func:`mmgrpo.vlm.models.rollout.greedy_generate` (one definition, shared with the trainer's validation so a
    validation point and an evaluation of the same weights decode alike); imported lazily (``--help`` stays
    torch-free)."""
    from mmgrpo.vlm.models.rollout import greedy_generate as _greedy

    return _greedy(policy, items, max_new_tokens)


# ------------------------------------------------------------------------------------------------ Video-RTS
def rts_schedule(min_frames: int, max_frames: int, growth: int) -> list[int]:
    """Frame counts of the rounds: min_frames, min_frames*growth, ... while <= max_frames (the release's loop
    ``while n <= max: ...; n *= 2``)."""
    if min_frames < 1 or max_frames < min_frames or growth < 2:
        raise ValueError(f"rts needs 1 <= min_frames <= max_frames and growth >= 2, got min_frames={min_frames} "
                         f"max_frames={max_frames} growth={growth}")
    out, n = [], min_frames
    while n <= max_frames:
        out.append(n)
        n *= growth
    return out


def _rts_settings(r: RTSConfig) -> dict:
    return {"min_frames": r.min_frames, "max_frames": r.max_frames, "growth": r.growth,
            "num_samples": r.num_samples, "tvg_iou": r.tvg_iou, "answer": r.answer,
            "schedule": rts_schedule(r.min_frames, r.max_frames, r.growth)}


def rts_answer_key(task: str, text: Optional[str]) -> Any:
    """What two sampled answers must share to agree: the letter set (mcq/gqa), the span (tvg), the box (rec).
    An unparsable answer is None, and None equals None (the release compares the extracted strings, so
    all-unparsable answers agree and stop the loop)."""
    from mmgrpo.vlm.rewards.parsing import parse_box, parse_choice, parse_span

    if task in ("mcq", "gqa"):
        p = parse_choice(text, fallback_to_text=False)
        return p.value if p.ok else None
    if task == "tvg":
        p = parse_span(text, fallback_to_text=False)
        return (p.value.start, p.value.end) if p.ok else None
    p = parse_box(text, fallback_to_text=False)
    return tuple(p.value) if p.ok else None


def _key_similarity(task: str, a: Any, b: Any) -> float:
    if a is None or b is None:
        return 1.0 if a is b else 0.0
    if task == "tvg":
        from mmgrpo.vlm.rewards.temporal import temporal_iou

        return temporal_iou(a, b)
    if task == "rec":
        from mmgrpo.vlm.rewards.box import box_iou

        return box_iou(a, b)
    return 1.0 if a == b else 0.0


def rts_agree(task: str, keys: Sequence[Any], threshold: float) -> bool:
    """mcq/gqa: all letter sets equal; tvg/rec: every pair has IoU >= threshold (None agrees only with None)."""
    if task in ("mcq", "gqa"):
        return len(set(keys)) <= 1
    def pair(a, b) -> bool:
        if a is None or b is None:
            return a is b
        return _key_similarity(task, a, b) >= threshold

    return all(pair(a, b) for i, a in enumerate(keys) for b in keys[i + 1:])


def rts_pick(task: str, keys: Sequence[Any], how: str) -> int:
    """Index of the recorded sample: the first one, or the majority answer (first sample holding the most common
    letter set, ties to the earliest; tvg/rec: the highest summed IoU to the others, ties to the earliest)."""
    if how == "first" or len(keys) == 1:
        return 0
    if task in ("mcq", "gqa"):
        from collections import Counter

        top = Counter(keys).most_common(1)[0][0]  # Counter keeps first-seen order on ties
        return list(keys).index(top)
    score = [sum(_key_similarity(task, a, b) for j, b in enumerate(keys) if j != i) for i, a in enumerate(keys)]
    return max(range(len(keys)), key=lambda i: (score[i], -i))


def rts_loop(task: str, schedule: Sequence[int], prepare, draw, *, threshold: float, answer: str = "majority"):
    """Sparse-to-dense loop for one item.

    ``prepare(n_frames) -> prep`` builds the model input with n_frames frames; ``draw(prep, round) -> (texts,
    n_tokens, truncated)`` samples the answers of one round (one generate call).  Stops at the first round whose
    answers agree (:func:`rts_agree`) or after the last frame count.  Returns ``(prep, text, n_tokens, truncated,
    accounting)`` of the recorded sample of the last round."""
    rounds = []
    for r, n in enumerate(schedule):
        prep = prepare(n)
        texts, toks, trunc = draw(prep, r)
        keys = [rts_answer_key(task, t) for t in texts]
        agreed = rts_agree(task, keys, threshold)
        n_prompt = int(prep.item["input_ids"].shape[-1]) if "input_ids" in prep.item else 0
        frames = int(prep.clip.num_frames) if getattr(prep, "clip", None) is not None else None
        rounds.append({"frames_requested": n, "frames": frames, "prompt_tokens": n_prompt,
                       "completion_tokens": int(sum(toks)), "agreed": agreed,
                       "answers": [None if k is None else list(k) for k in keys]})
        if agreed:
            break
    pick = rts_pick(task, keys, answer)
    acc = {"rts_frames": rounds[-1]["frames"], "rts_rounds": len(rounds), "rts_generate_calls": len(rounds),
           "rts_samples": len(rounds) * len(texts), "rts_agreed": rounds[-1]["agreed"],
           "rts_completion_tokens": sum(x["completion_tokens"] for x in rounds),
           # every sample re-reads its prompt (the frames' visual tokens dominate): the input compute proxy
           "rts_prompt_tokens": sum(x["prompt_tokens"] * len(texts) for x in rounds),
           "rts_trace": rounds}
    return prep, texts[pick], int(toks[pick]), bool(trunc[pick]), acc


def rts_adapters(cfg: EvalVLMConfig, policy) -> dict:
    """One TaskAdapter per frame count of the schedule (min_frames = max_frames = n; the clip cache keys on the
    video only, so each frame count has its own)."""
    import dataclasses

    from mmgrpo.vlm.data.task import TaskAdapter

    return {n: with_clip_cache(TaskAdapter(policy.processor, policy.adapter,
                                           dataclasses.replace(cfg.data, min_frames=n, max_frames=n)),
                               cfg.clip_cache)
            for n in rts_schedule(cfg.rts.min_frames, cfg.rts.max_frames, cfg.rts.growth)}


def rts_draw(backend, params, prep, seeds: Sequence[int]):
    """One round: ``len(seeds)`` sampled completions of one prompt in one generate call (tests patch this)."""
    out = backend.generate([prep.item], len(seeds), params, seeds=list(seeds))
    return list(out.texts), [int(x) for x in out.lengths.tolist()], [bool(x) for x in out.truncated]


def _rts_item(cfg: EvalVLMConfig, adapters: dict, backend, params, sample: Any, index: int):
    from mmgrpo.utils.seeding import sample_seed

    k = cfg.rts.num_samples

    def draw(prep, r):  # seeds depend on (seed, sample index, round, k) only: batch-independent
        return rts_draw(backend, params, prep, [sample_seed(cfg.decoding.seed, index, r, j) for j in range(k)])

    return rts_loop(cfg.data.task, sorted(adapters), lambda n: adapters[n].prepare(sample), draw,
                    threshold=cfg.rts.tvg_iou, answer=cfg.rts.answer)


def generate(cfg: EvalVLMConfig, policy, task_adapter, samples: Sequence[Any], writer: ResumableJsonl,
             log=None) -> dict:
    """Generate the missing predictions batch by batch (fixed batches); returns counters.

    ``interrupted`` is True when ``max_batches`` stopped the run before the end."""
    from mmgrpo.vlm.models.rollout import HFRolloutBackend, SamplingParams
    from mmgrpo.vlm.data.task import MissingMediaError
    from mmgrpo.utils.seeding import sample_seed

    dec = cfg.decoding
    params = SamplingParams(max_new_tokens=dec.max_new_tokens or default_max_new_tokens(cfg.data.prompt_mode),
                            temperature=dec.temperature, top_p=dec.top_p, top_k=dec.top_k, greedy=dec.greedy)
    backend = HFRolloutBackend(policy.model, policy.processor, policy.suppress_token_ids, max_batch_size=dec.batch_size,
                               device=next(policy.model.parameters()).device)
    if cfg.tools.enabled:  # the trainer's multi-turn tool loop (mmgrpo.vlm.tools.rollout), greedy or sampled
        from mmgrpo.vlm.tools.rollout import MultiTurnBackend

        backend = MultiTurnBackend(backend, policy.processor, cfg.tools, policy.family,
                                   task_adapter.image_size_kwargs())
    patch = policy.adapter.patch_size
    batches = fixed_batches(len(samples), dec.batch_size)
    todo = [b for b in batches if any(str(_sample_attr(samples[i], "id")) not in writer.done for i in b)]
    n_todo = sum(1 for b in todo for i in b if str(_sample_attr(samples[i], "id")) not in writer.done)
    stats = {"n_batches_generated": 0, "n_generated": 0, "n_media_error": 0, "interrupted": False,
             "n_already_done": len(writer.done), "seconds_prepare": 0.0, "seconds_generate": 0.0}
    from tqdm.auto import tqdm

    bar = tqdm(total=n_todo, desc="generate", unit="sample", disable=not cfg.progress, dynamic_ncols=True)
    adapters = rts_adapters(cfg, policy) if cfg.rts.enabled else None
    try:
        for b in todo:
            if cfg.max_batches and stats["n_batches_generated"] >= cfg.max_batches:
                stats["interrupted"] = True
                break
            if adapters is not None:  # Video-RTS: item by item (each item stops at its own frame count)
                t0 = time.perf_counter()
                rows = _rts_batch(cfg, adapters, backend, params, samples, b, writer, stats, patch, log)
                stats["seconds_generate"] += time.perf_counter() - t0
                writer.append(rows)
                stats["n_batches_generated"] += 1
                stats["n_generated"] += len(rows)
                bar.update(len(rows))
                continue
            preps: dict[int, Any] = {}
            errors: dict[int, str] = {}
            t0 = time.perf_counter()
            for i in b:  # the WHOLE batch, even items already written: the batch composition stays fixed
                try:
                    preps[i] = task_adapter.prepare(samples[i])
                except MissingMediaError as e:
                    if cfg.data.on_missing_media == "error":
                        raise
                    errors[i] = str(e)
                    if log is not None:
                        log.warning("media error, output recorded as null: %s", e)
            order = sorted(preps)
            t1 = time.perf_counter()
            texts: dict[int, tuple[str, int, bool]] = {}
            tool_rows: dict[int, dict] = {}
            if order and cfg.tools.enabled:  # multi-turn: turns, tool calls and tokens per answer in the row
                out = backend.generate([preps[i].item for i in order], 1, params,
                                       seeds=[sample_seed(dec.seed, i) for i in order],
                                       raw_prompts=[{"text": preps[i].text, "images": preps[i].images,
                                                     "clip": preps[i].clip, "sample": preps[i].sample}
                                                    for i in order])
                for j, i in enumerate(order):
                    texts[i] = (out.texts[j], int(out.turn_info[j]["policy_tokens"]), bool(out.truncated[j]))
                    tool_rows[i] = tool_fields(out.turn_info[j])
            elif order and dec.greedy:
                t, lens, trunc = greedy_generate(policy, [preps[i].item for i in order], params.max_new_tokens)
                for j, i in enumerate(order):
                    texts[i] = (t[j], int(lens[j]), bool(trunc[j]))
            elif order:  # sampling: the rollout backend's per-row seeded sampler (batch-independent)
                seeds = [sample_seed(dec.seed, i) for i in order]
                out = backend.generate([preps[i].item for i in order], 1, params, seeds=seeds)
                lens = out.lengths.tolist()
                for j, i in enumerate(order):
                    texts[i] = (out.texts[j], int(lens[j]), bool(out.truncated[j]))
            stats["seconds_prepare"] += t1 - t0
            stats["seconds_generate"] += time.perf_counter() - t1
            rows = []
            for i in b:
                sid = str(_sample_attr(samples[i], "id"))
                if sid in writer.done:
                    continue
                if i in errors:
                    rows.append({"id": sid, "output": None, "error": errors[i]})
                    stats["n_media_error"] += 1
                else:
                    t, n_tok, trunc = texts[i]
                    rows.append({**_prediction_row(samples[i], preps[i], t, n_tok, trunc, patch),
                                 **tool_rows.get(i, {})})
            writer.append(rows)
            stats["n_batches_generated"] += 1
            stats["n_generated"] += len(rows)
            bar.update(len(rows))
    finally:
        bar.close()
    stats["seconds_prepare"] = round(stats["seconds_prepare"], 3)
    stats["seconds_generate"] = round(stats["seconds_generate"], 3)
    if hasattr(task_adapter, "clip_cache_stats"):
        stats["clip_cache"] = dict(task_adapter.clip_cache_stats)
    return stats


def _rts_batch(cfg, adapters, backend, params, samples, b, writer, stats, patch, log) -> list[dict]:
    from mmgrpo.vlm.data.task import MissingMediaError

    rows = []
    for i in b:
        sid = str(_sample_attr(samples[i], "id"))
        if sid in writer.done:
            continue
        try:
            prep, text, n_tok, trunc, acc = _rts_item(cfg, adapters, backend, params, samples[i], i)
        except MissingMediaError as e:
            if cfg.data.on_missing_media == "error":
                raise
            if log is not None:
                log.warning("media error, output recorded as null: %s", e)
            rows.append({"id": sid, "output": None, "error": str(e)})
            stats["n_media_error"] += 1
            continue
        rows.append({**_prediction_row(samples[i], prep, text, n_tok, trunc, patch), **acc})
    return rows


TOOL_FIELDS = ("turns", "tool_calls", "tool_failures", "visual_tokens", "policy_tokens", "tool_tokens",
               "later_prefill_tokens", "later_reused_tokens")  # the last two: later turns' prefill / cache-served


def tool_fields(info: dict) -> dict:
    """A multi-turn prediction's accounting: turns, tool calls (failed ones too), vision / policy / tool-turn tokens,
    the tools called, why it stopped and every policy turn's text (``output`` is the last one, the answer)."""
    row = {k: int(info.get(k, 0)) for k in TOOL_FIELDS}
    row.update(tools_called=list(info["tools_called"]), stop=info["stop"], turn_texts=list(info["turn_texts"]))
    return row


def tools_summary(rows: Sequence[dict]) -> Optional[dict]:
    """Means per answer of the multi-turn fields (None without them) and the share of answers that called a tool."""
    r = [x for x in rows if x.get("output") is not None and "turns" in x]
    if not r:
        return None
    out = {f"mean_{k}": sum(x[k] for x in r) / len(r) for k in TOOL_FIELDS}
    out["n"] = len(r)
    out["fraction_with_tool_call"] = sum(x["tool_calls"] > 0 for x in r) / len(r)
    return out


def rts_summary(rows: Sequence[dict]) -> Optional[dict]:
    """Frame / compute accounting of a Video-RTS run over the predictions that have it (None if none do)."""
    r = [x for x in rows if x.get("output") is not None and "rts_rounds" in x]
    if not r:
        return None
    n = len(r)
    frames = [x["rts_frames"] for x in r if x.get("rts_frames") is not None]
    hist: dict[str, int] = {}
    for x in r:
        hist[str(x.get("rts_frames"))] = hist.get(str(x.get("rts_frames")), 0) + 1
    return {
        "n": n,
        "mean_frames": sum(frames) / len(frames) if frames else None,
        "frames_histogram": dict(sorted(hist.items())),
        "mean_rounds": sum(x["rts_rounds"] for x in r) / n,
        "total_generate_calls": sum(x["rts_generate_calls"] for x in r),
        "total_samples": sum(x["rts_samples"] for x in r),
        "total_completion_tokens": sum(x["rts_completion_tokens"] for x in r),
        "total_prompt_tokens": sum(x["rts_prompt_tokens"] for x in r),
        "fraction_agreed": sum(bool(x["rts_agreed"]) for x in r) / n,
    }


# ------------------------------------------------------------------------------------------------ scoring
def score_run(cfg: EvalVLMConfig, settings: dict, samples: Sequence[Any], out_dir: Path) -> dict:
    """Score ``predictions.jsonl`` with ``eval.score.score``; writes metrics.json and per_sample.jsonl."""
    from eval.score import read_jsonl, score

    ids = {str(_sample_attr(s, "id")) for s in samples}
    anns = [(w, r) for w, r in read_jsonl(cfg.data.annotations) if str(r.get("id")) in ids]
    preds = read_jsonl(out_dir / PREDICTIONS)
    res = score(cfg.data.task, preds, anns, **settings["score"])
    m = res.metrics
    rows = [r for _, r in preds]
    present = [r for r in rows if r.get("output") is not None]
    from mmgrpo.vlm.rewards.format import well_formed

    d = cfg.data  # exactly the answer the prompt asks for (the trainer's completions/well_formed rule)
    n_wf = sum(well_formed(r["output"], d.task, mode=d.prompt_mode, answer_format=d.answer_format) for r in present)
    gen = {
        "n_media_error": sum(1 for r in rows if r.get("error")),
        "n_truncated": sum(1 for r in present if r.get("truncated")),
        "mean_output_tokens": (sum(r.get("n_tokens", 0) for r in present) / len(present)) if present else None,
        "n_well_formed": n_wf,
        "well_formed_rate": 100.0 * n_wf / len(present) if present else None,
    }
    frames = [r["num_frames"] for r in present if "num_frames" in r]
    if frames:
        gen["mean_frames"] = sum(frames) / len(frames)
        gen["max_frames_used"] = max(frames)
    rts = rts_summary(rows)
    if rts is not None:
        gen["rts"] = rts
    tools = tools_summary(rows)
    if tools is not None:
        gen["tools"] = tools
    m["generation"] = gen
    if cfg.score.benchmark:
        from eval.benchmarks import score_benchmark

        m["benchmark"] = {"name": cfg.score.benchmark,
                          **score_benchmark(cfg.score.benchmark, [r for _, r in preds], [r for _, r in anns])}
    m["kind"] = "vlm"
    m["config"]["predictions"] = str(out_dir / PREDICTIONS)
    m["config"]["annotations"] = settings["data"]["annotations"]
    m["settings_fingerprint"] = settings["fingerprint"]
    m["decoding"] = settings["decoding"]  # the decoding protocol next to the numbers it produced
    write_json(out_dir / "metrics.json", m)
    with open(out_dir / "per_sample.jsonl", "w", encoding="utf-8") as f:
        for r in res.per_sample:
            f.write(json.dumps(r, allow_nan=False, default=str) + "\n")
    if cfg.export:
        from eval.export import export

        m["export"] = [export(fmt, res.per_sample, anns, out_dir / "export", split=cfg.export_split)
                       for fmt in cfg.export]
        write_json(out_dir / "metrics.json", m)
    return m


# ------------------------------------------------------------------------------------------------ main
def run(cfg: EvalVLMConfig) -> dict:
    """The whole pipeline; returns ``{"settings", "stats", "metrics" (None if interrupted), "out_dir"}``."""
    from mmgrpo.vlm.data.task import TaskAdapter
    from mmgrpo.utils.logging import get_logger

    log = get_logger("mmgrpo.eval")
    if not cfg.out_dir:
        raise ValueError("out_dir=DIR is required")
    if cfg.decoding.batch_size < 1:
        raise ValueError(f"decoding.batch_size must be >= 1, got {cfg.decoding.batch_size}")
    from mmgrpo.vlm.data.templates import check_template

    check_template(cfg.data.prompt_template, cfg.data.task, cfg.data.prompt_mode)
    if cfg.threads < 0 or cfg.clip_cache < 0 or cfg.data.check_samples < 0:
        raise ValueError(f"threads, clip_cache and data.check_samples must be >= 0, got {cfg.threads} / "
                         f"{cfg.clip_cache} / {cfg.data.check_samples}")
    if cfg.rts.enabled:
        if cfg.decoding.greedy:
            raise ValueError("rts.enabled=true samples several answers per round: set decoding.greedy=false "
                             "(and decoding.temperature, e.g. 0.7 as Video-RTS)")
        if cfg.data.task == "rec":
            raise ValueError("rts.enabled=true scales video frames; task 'rec' has images only")
        if cfg.rts.num_samples < 2:
            raise ValueError(f"rts.num_samples must be >= 2 to measure agreement, got {cfg.rts.num_samples}")
        rts_schedule(cfg.rts.min_frames, cfg.rts.max_frames, cfg.rts.growth)
    from eval.export import check_formats

    cfg.export = check_formats(cfg.export, cfg.data.task)  # a typo fails now, not after hours of generation
    if cfg.score.benchmark:
        from eval.benchmarks import check_benchmark

        check_benchmark(cfg.score.benchmark, cfg.data.task)
    set_threads(cfg.threads)
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.overwrite:
        for name in (PREDICTIONS, "settings.json", "metrics.json", "per_sample.jsonl", "report.md", "report.json"):
            (out_dir / name).unlink(missing_ok=True)
        import shutil

        shutil.rmtree(out_dir / "export", ignore_errors=True)
    samples = _load(cfg)
    ann_sha = sha256_file(cfg.data.annotations)
    policy, base, adapter, device, dtype = load_eval_policy(cfg)
    task_adapter = with_clip_cache(TaskAdapter(policy.processor, policy.adapter, cfg.data), cfg.clip_cache)
    from mmgrpo.vlm.check import start_of_run_check

    has_qa = any(_sample_attr(s, "task") == "qa" for s in samples)
    start_of_run_check(task_adapter, samples, check_reward_fn(cfg.data, cfg.score, policy.family, has_qa),
                       cfg.data.check_samples, log)
    settings = build_settings(cfg, policy, base, adapter, device, dtype, samples, task_adapter, ann_sha)
    check_resume(out_dir, settings, PREDICTIONS)
    write_json(out_dir / "settings.json", settings)
    writer = ResumableJsonl(out_dir / PREDICTIONS).open()
    if writer.n_truncated_bytes:
        log.warning("%s: truncated a torn last line (%d bytes) from an interrupted run", writer.path,
                    writer.n_truncated_bytes)
    unknown = writer.done - {str(_sample_attr(s, "id")) for s in samples}
    if unknown:
        raise ValueError(f"{writer.path} holds ids that are not in {cfg.data.annotations} (e.g. {sorted(unknown)[:3]})")
    if writer.done:
        log.info("resuming: %d/%d predictions already in %s", len(writer.done), len(samples), writer.path)
    t0 = time.time()
    stats = generate(cfg, policy, task_adapter, samples, writer, log)
    stats["seconds"] = round(time.time() - t0, 3)
    if stats["interrupted"]:
        log.info("stopped after %d batches (max_batches); rerun the same command to continue",
                 stats["n_batches_generated"])
        return {"settings": settings, "stats": stats, "metrics": None, "out_dir": str(out_dir)}
    metrics = score_run(cfg, settings, samples, out_dir)
    metrics["generation"]["last_invocation"] = stats
    write_json(out_dir / "metrics.json", metrics)
    from eval.report import write_report

    write_report(out_dir)
    return {"settings": settings, "stats": stats, "metrics": metrics, "out_dir": str(out_dir)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    from eval.report import run_generation_cli

    return run_generation_cli(EvalVLMConfig, run, argv, prog="eval/generate_vlm.py",
                              description="Generate predictions with a local Qwen-VL checkpoint and score them.")


if __name__ == "__main__":
    raise SystemExit(main())
