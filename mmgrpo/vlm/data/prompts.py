"""The project's own prompt template (``data.prompt_template=mmgrpo``): system prompts per reasoning mode, user
prompts per task, ground-truth answers.  The released recipes' templates are in :mod:`mmgrpo.vlm.data.templates`.

Modes:
  * ``think``    -- reason inside ``<think>…</think>``, then the answer inside ``<answer>…</answer>``.
  * ``no_think`` -- only ``<answer>…</answer>``.
  * ``hybrid``   -- TempSamp-R1's hybrid chain of thought: one model serves both; it may think first when it
    helps, and must always end with ``<answer>…</answer>``.

Answer formats for time spans: ``seconds`` -> ``"12.54 to 17.83"`` (two decimals, VideoChat-R1 / TempSamp-R1) and
``json`` -> ``{"start_time": 12.54, "end_time": 17.83}`` (Temporal-R1; numbers, not quoted strings).

Times in answers are **relative to the clip start** when the sample has ``video_start`` (that is what the model's
time axis encodes; the reward adds ``video_start`` back, ``clip_relative=True`` in :mod:`mmgrpo.vlm.rewards`).

Per-task answer contents: tvg -> one span; mcq -> the option letter; gqa -> the letter and the evidence span(s)
inside the answer block as ``<answer>(C) <glue>3.00 to 7.50</glue></answer>``; rec -> ``[x1, y1, x2, y2]`` in the
box frame the model family writes (``abs`` original pixels, ``qwen2_5_vl``/``resized_abs`` pixels of the resized
model input, ``qwen2_vl``/``qwen3_vl``/``norm1000`` a 0-1000 grid, ``norm1``); qa -> free text (the question as
written; a release's own qa prompt is in :mod:`mmgrpo.vlm.data.templates`).
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from mmgrpo.vlm.rewards.box import resolve_box_frame

from .schema import LETTERS, Sample

MODES = ("think", "no_think", "hybrid")
ANSWER_FORMATS = ("seconds", "json")
QUERY_POSITIONS = ("after", "before")  # the text item after (default) or before the video/image item

SYSTEM_PROMPTS = {
    "think": (
        "You are a helpful assistant that watches videos and images carefully. First think about the question "
        "step by step inside <think> </think> tags, then give the final answer inside <answer> </answer> tags, "
        "i.e. <think> reasoning here </think><answer> answer here </answer>."
    ),
    "no_think": (
        "You are a helpful assistant that watches videos and images carefully. Give only the final answer inside "
        "<answer> </answer> tags, with no reasoning, i.e. <answer> answer here </answer>."
    ),
    "hybrid": (
        "You are a helpful assistant that watches videos and images carefully. If the question needs reasoning, "
        "first think step by step inside <think> </think> tags; otherwise answer directly. Always give the final "
        "answer inside <answer> </answer> tags."
    ),
}

_SPAN_INSTRUCTIONS = {
    "seconds": ('the start and end times in seconds with two decimals, as "start to end", '
                'for example "12.54 to 17.83"'),
    "json": ('the start and end times in seconds as JSON, for example '
             '{"start_time": 12.54, "end_time": 17.83}'),
}

_BOX_FRAME_TEXT = {
    "abs": "in pixel coordinates of the original image",
    "resized_abs": "in pixel coordinates of the image as you see it",
    "norm1000": "in coordinates normalised to a 0-1000 grid",
    "norm1": "in coordinates normalised to [0, 1]",
}


def _check(mode: str, answer_format: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format must be one of {ANSWER_FORMATS}, got {answer_format!r}")


def _as_sample(sample: Sample | Mapping[str, Any]) -> Sample:
    return sample if isinstance(sample, Sample) else Sample.from_dict(dict(sample))


def system_prompt(mode: str = "think") -> str:
    _check(mode, "seconds")
    return SYSTEM_PROMPTS[mode]


def format_options(options: Sequence[str]) -> str:
    """``["red", "blue"]`` -> ``"(A) red\\n(B) blue"``."""
    return "\n".join(f"({LETTERS[i]}) {o}" for i, o in enumerate(options))


def user_prompt(sample: Sample | Mapping[str, Any], answer_format: str = "seconds", *,
                include_duration: bool = False, box_frame: str = "abs") -> str:
    """Task text for one sample (the media placeholder is added by :func:`build_messages`)."""
    s = _as_sample(sample)
    _check("think", answer_format)
    span_txt = _SPAN_INSTRUCTIONS[answer_format]
    dur = ""
    if include_duration and s.duration is not None:
        lo = s.video_start or 0.0
        hi = s.video_end if s.video_end is not None else s.duration
        dur = f"The video is {hi - lo:.2f} seconds long. "
    if s.task == "tvg":
        q = s.query.strip()
        if (s.meta or {}).get("query_is_prompt"):  # the whole release prompt (convert.py tempsamp --query-from
            return q                               # problem): shown as is, not wrapped in a second instruction
        return (f'{dur}To accurately pinpoint the event "{q}" in the video, determine the precise time period '
                f"of the event. Output {span_txt}.")
    if s.task == "mcq":
        return (f"{s.query.strip()}\nOptions:\n{format_options(s.options)}\n"
                f"Answer with the option's letter from the given choices.")
    if s.task == "gqa":
        example = "12.54 to 17.83" if answer_format == "seconds" else '{"start_time": 12.54, "end_time": 17.83}'
        return (f"{dur}{s.query.strip()}\nOptions:\n{format_options(s.options)}\n"
                f"Answer with the option's letter, then give the time period of the video that supports the "
                f"answer inside <glue> </glue> tags within the answer: {span_txt}. "
                f"For example: <answer>(B) <glue>{example}</glue></answer>")
    if s.task == "qa":  # open-answer question: shown as written (the system turn asks for the <answer> block)
        return s.query.strip()
    if s.task == "rec":
        frame = resolve_box_frame(box_frame)  # a frame, or a model family's (its adapter's box_frame)
        return (f'Locate "{s.query.strip()}" in the image. Output its bounding box as [x1, y1, x2, y2] '
                f"{_BOX_FRAME_TEXT[frame]}.")
    raise ValueError(f"unknown task {s.task!r}")


def build_messages(sample: Sample | Mapping[str, Any], mode: str = "think", answer_format: str = "seconds", *,
                   include_duration: bool = False, box_frame: str = "abs", media_kwargs: Mapping | None = None,
                   system: bool = True, query_position: str = "after") -> list[dict]:
    """Qwen chat messages for one sample: a system turn (``system_prompt(mode)``) and a user turn whose content is
    ``[{"type": "video", "video": path, (video_start, video_end)}, {"type": "text", "text": ...}]`` (``"image"``
    for image samples).  ``media_kwargs`` (e.g. ``fps``, ``max_pixels``) are merged into the media item, as
    qwen-vl-utils reads them.  Render with ``processor.apply_chat_template(messages, add_generation_prompt=True)``.

    ``query_position="before"`` puts the text item *before* the media item (default ``"after"``, the Qwen-VL
    model cards' order; the releases differ: Video-R1, VLM-R1 and TempSamp-R1 put the media first, Time-R1's
    training prompt and VideoChat-R1 the text first -- their own templates are in
    :mod:`mmgrpo.vlm.data.templates`).  With causal attention, text before the video lets every video token attend
    to the query; the tiny demo models need that to pick the queried event among several
    (``docs/demo_models.md``).  Use the same order for SFT, GRPO rollouts and evaluation.
    """
    s = _as_sample(sample)
    _check(mode, answer_format)
    if s.video is not None:
        item: dict[str, Any] = {"type": "video", "video": s.video}
        if s.video_start is not None:
            item["video_start"] = s.video_start
        if s.video_end is not None:
            item["video_end"] = s.video_end
    elif s.image is not None:
        item = {"type": "image", "image": s.image}
    else:
        raise ValueError(f"sample {s.id!r} has neither video nor image")
    if media_kwargs:
        item.update(media_kwargs)
    text = user_prompt(s, answer_format, include_duration=include_duration, box_frame=box_frame)
    msgs: list[dict] = []
    if system:
        msgs.append({"role": "system", "content": SYSTEM_PROMPTS[mode]})
    if query_position not in QUERY_POSITIONS:
        raise ValueError(f"query_position must be one of {QUERY_POSITIONS}, got {query_position!r}")
    content = [item, {"type": "text", "text": text}]
    msgs.append({"role": "user", "content": content[::-1] if query_position == "before" else content})
    return msgs


def format_span(start: float, end: float, answer_format: str = "seconds") -> str:
    """``"12.54 to 17.83"`` or ``{"start_time": 12.54, "end_time": 17.83}`` (two decimals)."""
    _check("think", answer_format)
    if answer_format == "seconds":
        return f"{start:.2f} to {end:.2f}"
    return json.dumps({"start_time": round(float(start), 2), "end_time": round(float(end), 2)})


def _box_in_frame(box: Sequence[float], frame: str, image_size: Sequence[int],
                  resized_size: Sequence[int] | None) -> list[float]:
    kind = resolve_box_frame(frame)
    w, h = image_size
    if kind == "abs":
        sx, sy = 1.0, 1.0
    elif kind == "norm1000":
        sx, sy = 1000.0 / w, 1000.0 / h
    elif kind == "norm1":
        sx, sy = 1.0 / w, 1.0 / h
    else:
        if resized_size is None:
            raise ValueError(f"box_frame {frame!r} needs resized_size=(W_r, H_r) of the model-input image")
        sx, sy = resized_size[0] / w, resized_size[1] / h
    x1, y1, x2, y2 = box
    return [x1 * sx, y1 * sy, x2 * sx, y2 * sy]


def format_ground_truth_answer(sample: Sample | Mapping[str, Any], mode: str = "no_think",
                               answer_format: str = "seconds", *, clip_relative: bool = True,
                               think_text: str = "", box_frame: str = "abs",
                               resized_size: Sequence[int] | None = None) -> str:
    """The ground truth written as a completion (TempSamp-R1 off-policy member; SFT targets).

    tvg: first span; mcq: the letter; gqa: letter + all evidence spans in ``<glue>``; rec: first box in
    ``box_frame`` (``resized_size`` needed for ``qwen2_5_vl`` / ``resized_abs``), integers for pixel frames.
    ``think``: ``<think>{think_text}</think>`` first (empty by default: no invented reasoning, but the strict format
    still holds); ``no_think`` and ``hybrid``: the answer block only.  Spans are relative to ``video_start`` when
    ``clip_relative`` (the reward's default convention).
    """
    s = _as_sample(sample)
    _check(mode, answer_format)
    off = (s.video_start or 0.0) if clip_relative else 0.0

    def span_txt(sp):
        return format_span(sp[0] - off, sp[1] - off, answer_format)

    if s.task == "tvg":
        if not s.spans:
            raise ValueError(f"sample {s.id!r}: no spans")
        ans = span_txt(s.spans[0])
    elif s.task == "mcq":
        if s.answer is None:
            raise ValueError(f"sample {s.id!r}: no answer")
        ans = s.answer
    elif s.task == "gqa":
        if s.answer is None or not s.spans:
            raise ValueError(f"sample {s.id!r}: gqa needs answer and spans")
        if answer_format == "seconds":
            glue = ", ".join(span_txt(sp) for sp in s.spans)
        else:
            glue = json.dumps([{"start_time": round(sp[0] - off, 2), "end_time": round(sp[1] - off, 2)}
                               for sp in s.spans]) if len(s.spans) > 1 else span_txt(s.spans[0])
        # "(C) <glue>..</glue>": a bare "C <glue>" is not read as a letter by the tolerant choice parser
        ans = f"({s.answer}) <glue>{glue}</glue>"
    elif s.task == "rec":
        if not s.boxes or s.image_size is None:
            raise ValueError(f"sample {s.id!r}: rec needs boxes and image_size")
        b = _box_in_frame(s.boxes[0], box_frame, s.image_size, resized_size)
        kind = resolve_box_frame(box_frame)
        if kind == "norm1":
            ans = "[" + ", ".join(f"{v:.4f}" for v in b) + "]"
        else:
            ans = "[" + ", ".join(str(int(round(v))) for v in b) + "]"
    elif s.task == "qa":
        if s.answer is None:
            raise ValueError(f"sample {s.id!r}: no answer")
        ans = s.answer
    else:
        raise ValueError(f"unknown task {s.task!r}")
    out = f"<answer>{ans}</answer>"
    if mode == "think":
        out = f"<think>{think_text}</think><answer>{ans}</answer>"
    return out
