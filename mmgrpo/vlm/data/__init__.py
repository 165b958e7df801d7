"""Data layer: the canonical JSONL schema, its loader, converters from public formats and prompt templates.

Public API (stable)::

    from mmgrpo.vlm.data import Sample, DataError, TASKS, load_jsonl, write_jsonl, LoadReport
    from mmgrpo.vlm.data import build_messages, format_ground_truth_answer, system_prompt, user_prompt

    Sample(id, task, query, video=None, image=None, duration=None, spans=[], options=None, answer=None,
           boxes=None, image_size=None, video_start=None, video_end=None, meta={})
        .validate(swap_reversed=False) -> Sample       # raises DataError(field=...) on the first problem
        .to_dict() / Sample.from_dict(d)

    samples, report = load_jsonl(path, root=None, on_error="raise" | "skip", check_media=True,
                                 swap_reversed=False, resolve_paths=True)
        # DataError names file:line, id and field; "skip" counts problems in report.counts and logs them;
        # missing media files are all found in one pass before anything is returned.
    write_jsonl(samples, path) -> int

    build_messages(sample, mode="think" | "no_think" | "hybrid", answer_format="seconds" | "json",
                   include_duration=False, box_frame="abs", media_kwargs=None, system=True) -> list[dict]
    format_ground_truth_answer(sample, mode="no_think", answer_format="seconds", clip_relative=True,
                               think_text="", box_frame="abs", resized_size=None) -> str

Schema (:mod:`mmgrpo.vlm.data.schema`): times are seconds of absolute video time, boxes original-image pixels
[x1, y1, x2, y2], ``image_size`` = [width, height]; tasks tvg / mcq / gqa / rec / qa (open answers).
Converters (:mod:`mmgrpo.vlm.data.converters`, CLI ``python data/convert.py FORMAT IN OUT``): Charades-STA,
ActivityNet-style dense captions, Time-R1 / TVGBench, NExT-GQA, Video-R1 (five problem types), RefCOCO-style REC.
Prompt templates by name (the project's and the releases', ``data.prompt_template``):
:mod:`mmgrpo.vlm.data.templates`.
What a training step reads, with explicit arguments: the seeded, resumable prompt stream
(:mod:`mmgrpo.vlm.data.stream`), this process's prompts of a step, prepared and prefetched
(:mod:`mmgrpo.vlm.data.feed`), the rollout batch and its micro-batches (:mod:`mmgrpo.vlm.data.batch`), and the
checkpoint codec of prompts that methods keep across steps (:mod:`mmgrpo.vlm.data.buffer_state`).
Synthetic benchmark (:mod:`mmgrpo.vlm.synthetic.tvg`, CLI ``python data/synthetic_tvg.py``): generated mp4s with
exactly known event spans.  Mini-GenEval (:mod:`mmgrpo.synthetic.t2i`, CLI ``python data/synthetic_t2i.py``):
synthetic text-to-image prompts with a programmatic verifier (the ``mini_geneval`` reward of ``flow_grpo``).
"""
from .jsonl import LoadReport, load_jsonl, resolve_media, write_jsonl
from .prompts import (
    ANSWER_FORMATS,
    MODES,
    SYSTEM_PROMPTS,
    build_messages,
    format_ground_truth_answer,
    format_span,
    system_prompt,
    user_prompt,
)
from .schema import LETTERS, TASKS, DataError, Sample

__all__ = [
    "Sample", "DataError", "TASKS", "LETTERS", "load_jsonl", "write_jsonl", "LoadReport", "resolve_media",
    "build_messages", "format_ground_truth_answer", "format_span", "system_prompt", "user_prompt", "MODES",
    "ANSWER_FORMATS", "SYSTEM_PROMPTS",
]
