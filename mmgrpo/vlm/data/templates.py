"""Prompt templates by name: the project's own (``mmgrpo``) and the released recipes' (``data.prompt_template``).

A checkpoint trained on a release's prompt (a Time-R1 checkpoint, Video-R1's SFT model) starts RL on the text it
was trained with only when the recipe renders that text exactly: system turn or none, the order of the media and
text items, the instruction, the option lines, and the case and punctuation of the query.  Each template below is
data: the release's strings (facts read from its code, never its code), where they come from (repository, file,
commit), and a few switches saying how a canonical :class:`~mmgrpo.vlm.data.schema.Sample` fills them.

* ``system=None`` means the release sends no system turn; Qwen2-VL / Qwen2.5-VL chat templates then write their
  default ``You are a helpful assistant.`` system turn (that is what the release's model saw too).
* ``text_first`` puts the text item before the media item (Time-R1's training prompt, VideoChat-R1).
* ``problem``: several releases take the whole user text (or its question part) from their data files; a sample
  converted from such a file keeps it verbatim in ``meta["problem"]`` and the template uses it as is; otherwise it
  is rebuilt from the canonical fields with the release data's pattern (named in the template's ``notes``).
* ``answer``: how the ground truth is written in the format the prompt asks for (``ground_truth(...)``): the
  TempSamp-R1 off-policy member, SFT targets and ``mmgrpo check``'s "does the ground truth get the maximum reward".

The project template ``mmgrpo`` is :func:`mmgrpo.vlm.data.prompts.build_messages` unchanged (the synthetic
benchmarks and the demo use it; its rendered text is pinned byte for byte by ``tests/data/test_templates.py``).

>>> msgs = render_messages(sample, "time_r1_v1")                   # Qwen chat messages
>>> processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
>>> ground_truth(sample, "tempsamp_r1")                            # '<answer> 98.00 to 103.00 </answer>'
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from .schema import LETTERS, Sample

PROJECT = "mmgrpo"


@dataclass(frozen=True)
class Source:
    """Where a template's strings come from: ``repo`` at ``commit``, file ``path``, the names in it (``what``)."""

    repo: str
    path: str
    commit: str
    what: str

    def __str__(self) -> str:
        return f"{self.repo} {self.path} ({self.what}) @ {self.commit[:10]}"


@dataclass(frozen=True)
class ReleaseTemplate:
    """One release's prompt for one task (see the module docstring for the fields' meaning)."""

    name: str
    tasks: tuple[str, ...]
    mode: str  # "think" | "no_think": what the instruction asks for (the ground truth follows it)
    system: Optional[str]
    text_first: bool
    text: str  # str.format fields: {event} {question} {options} {problem}
    answer: str  # ground-truth writer: see ground_truth()
    sources: tuple[Source, ...]
    query: str = "keep"  # "keep" | "lower_no_period" (strip, lower-case, drop one final ".")
    options: str = ""  # "paren_repr" | "dot_lines" | "paren_lines"
    type_suffix: Mapping[str, str] = field(default_factory=dict)  # Video-R1: problem type -> instruction suffix
    problem: str = ""  # rebuilt "problem" when meta["problem"] is absent (str.format fields as ``text``)
    problem_clean: str = "raw"  # meta["problem"] as the release reads it: raw | drop_image | trim_drop_video
    ensure_period: bool = False  # MGPO: the problem gets a final "." unless it ends with . ? ! or .'
    notes: str = ""


# ---------------------------------------------------------------------------------------------------- sources
_TIME_R1 = "xiaomi-research/time-r1"
_TIME_R1_AT = "7f2b5944a0c35993da80634a459d5a48a3a5431e"
_VIDEOCHAT = "OpenGVLab/VideoChat-R1"
_VIDEOCHAT_AT = "73b2ea9ac83ad5c0bcd893bffd1cbb2e7c167068"
_VIDEO_R1 = "tulerfeng/Video-R1"
_VIDEO_R1_AT = "59d65c347e44efa71be27abf9d89b4a2bb7d1c05"
_VLM_R1 = "om-ai-lab/VLM-R1"
_VLM_R1_AT = "90052f478646e38bc67363862f699b7afca6b337"
_TEMPSAMP = "ZhangZikun6666/TempSamp-R1"
_TEMPSAMP_AT = "55a92280a93474d694e215bbb4705d0a1f2efc04"
_RTS = "Ziyang412/Video-RTS"
_RTS_AT = "432fb5e96d436e934b6bff4d9a6b4a8d74657e59"
_TW = "longmalongma/TW-GRPO"
_TW_AT = "aa529ffca7ae408e4f3df7ba71cb0dc58544c6b7"
_MGPO = "xinyu1205/verl"  # branch mgpo, linked from EvolvingLMMs-Lab/MGPO's README
_MGPO_AT = "994efbe611e89e5ba153d32c2461a58f45e72e24"

# ---------------------------------------------------------------------------------------------------- strings
# Time-R1 / VideoChat-R1 temporal grounding (the two releases share the first and last paragraphs)
_TG_FIRST = 'To accurately pinpoint the event "{event}" in the video, determine the precise time period of the event.'
_TG_ANSWER = ('provide the start and end times (in seconds, precise to two decimal places) in the format "start time '
              'to end time" within the <answer> </answer> tags. For example: "12.54 to 17.83".')
TIME_R1_V1 = (_TG_FIRST + "\n\nOutput your thought process within the <think> </think> tags, including analysis with "
              "either specific time ranges (xx.xx to xx.xx) in <timestep> </timestep> tags.\n\nThen, " + _TG_ANSWER)
TIME_R1_V2 = _TG_FIRST + "\n\nP" + _TG_ANSWER[1:]
VIDEOCHAT_R1_TG = (_TG_FIRST + "\n\nOutput your thought process within the <think> </think> tags, including analysis "
                   "with either specific timestamps (xx.xx) or time ranges (xx.xx to xx.xx) in <timestep> </timestep> "
                   "tags.\n\nThen, " + _TG_ANSWER)
VIDEOCHAT_R1_GQA = (
    'Answer the question: "{question}" according to the content of the video. Select the answer from :{options}.\n\n'
    "Output your thought process within the <think> </think> tags, including analysis with either specific "
    "timestamps (xx.xx) or time ranges (xx.xx to xx.xx) in <timestep> </timestep> tags.\n\n"
    "Then, provide your answer within the <answer> </answer> tags, output the corresponding letter of the option. "
    "At the same time, in the <glue> </glue> tags, present the precise time period in seconds of the video clips on "
    "which you base your answer to this question in the format of [(s1, e1), (s2, e2), ...]. For example: "
    "<answer>A</answer><glue>[(5.2, 10.4)]</glue>.\n")
# TempSamp-R1 re-implementation: the user text is the data file's "problem" (TimeLens), passed through verbatim
TEMPSAMP_R1 = ('To accurately pinpoint the event "{event}" in the video, determine the precise time period of the event. '
               'Provide the start and end times (in seconds, precise to two decimal places) in the format "start time '
               'to end time" within <answer> </answer> tags. For example: <answer> 12.5 to 17.8 </answer>.')
# Video-R1: QUESTION_TEMPLATE + TYPE_TEMPLATE[problem_type]
VIDEO_R1_QUESTION = (
    "{problem}\n"
    "Please think about this question as if you were a human pondering deeply. Engage in an internal dialogue using "
    "expressions such as 'let me think', 'wait', 'Hmm', 'oh, I see', 'let's break it down', etc, or other natural "
    "language thought expressions It's encouraged to include self-reflection or verification in the reasoning "
    "process. Provide your detailed reasoning between the <think> </think> tags, and then give your final answer "
    "between the <answer> </answer> tags.")
VIDEO_R1_TYPES = {
    "multiple choice": " Please provide only the single option letter (e.g., A, B, C, D, etc.) within the <answer> "
                       "</answer> tags.",
    "numerical": " Please provide the numerical value (e.g., 42 or 3.14) within the <answer> </answer> tags.",
    "OCR": " Please transcribe text from the image/video clearly and provide your text answer within the <answer> "
           "</answer> tags.",
    "free-form": " Please provide your text answer within the <answer> </answer> tags.",
    "regression": " Please provide the numerical value (e.g., 42 or 3.14) within the <answer> </answer> tags.",
}
VIDEO_R1_PROBLEM_TYPES = tuple(VIDEO_R1_TYPES)
# VLM-R1 REC (Qwen module, task "rec"): the question is the data file's "problem"
VLM_R1_REC = ("{problem} First output the thinking process in <think> </think> tags and then output the final answer "
              "in <answer> </answer> tags. Output the final answer in JSON format.")
VLM_R1_REC_PROBLEM = "Please provide the bounding box coordinate of the region this sentence describes: {question}."
# Video-RTS: the system-style sentence and the question in one user text (no separator after "</answer>")
VIDEO_RTS = ("A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
             "assistant first thinks about the reasoning process in the mind and then provides the user with the "
             "answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> "
             "tags, respectively, i.e., <think> reasoning process here </think><answer> answer here </answer>"
             "{problem}\n Please provide only the single option letter (e.g., A, B, C, D, etc.) within the <answer> "
             "</answer> tags.")
# TW-GRPO, question_type "mixed" (its training script's setting)
TW_GRPO_MIXED = ("{problem}  Output the thinking process in <think> </think> and final answer (letters separated by , "
                 "if multiple) in <answer> </answer> tags.")

# MGPO (examples/grpo_trainer/run_qwen2_5_vl-7b_mgpo.sh): data.system_prompt and data.post_prompt; the user text is
# ensure_period(prompt) + " " + post_prompt (verl/utils/dataset/hf_dataset.py make_conversation). The two second-turn
# texts (rollout.sub_image_token_prompt / ori_image_token_prompt) are in mmgrpo.vlm.methods.mgpo.
MGPO_SYSTEM = ("You are a helpful assistant. Given an image and one question. First, identify the coordinates of the "
               "key image area relevant to solving the problem. Append the coordinates in JSON format at the end of "
               "your response and stop. This will trigger cropping of the corresponding area in the original image "
               "and enlarge it for improved clarity. Once the enlarged image is available, provide the final answer "
               "(A, B, C, D, or E) enclosed within \\boxed{}.")
MGPO_POST_PROMPT = "Out the coordinates of the key image area relevant to the problem in JSON format."

TEMPLATES: dict[str, ReleaseTemplate] = {}


def _add(t: ReleaseTemplate) -> None:
    TEMPLATES[t.name] = t


_add(ReleaseTemplate(
    "time_r1_v1", ("tvg",), "think", None, True, TIME_R1_V1, "think_span", query="lower_no_period",
    sources=(Source(_TIME_R1, "src/time_r1/rl/timer1_trainer_ft.py", _TIME_R1_AT,
                    "QUESTION_TEMPLATE_TG_v1, make_conversation_video: no system turn, text then video"),
             Source(_TIME_R1, "finetune.py", _TIME_R1_AT, "load_json_dataset: sentence strip().lower(), final '.' "
                                                          "dropped"),
             Source(_TIME_R1, "scripts/finetune/run_charades.sh", _TIME_R1_AT, "--prompt_type v1")),
    notes="Time-R1 fine-tuning on Charades / ActivityNet (the post-training trainer timer1_trainer.py uses the same "
          "v1 text). Its evaluation (src/vllm_inference) renders differently: system 'You are a helpful assistant.', "
          "video first."))
_add(ReleaseTemplate(
    "time_r1_eval", ("tvg",), "think", "You are a helpful assistant.", False, TIME_R1_V1, "think_span",
    sources=(Source(_TIME_R1, "src/vllm_inference/data/config.py", _TIME_R1_AT, "DEFAULT_TG_PROMPT['r1'] (the v1 "
                                                                               "text)"),
             Source(_TIME_R1, "src/vllm_inference/data/__init__.py", _TIME_R1_AT,
                    "TemporalGroundingDataset._preprocess: system 'You are a helpful assistant.', video then text"),
             Source(_TIME_R1, "src/vllm_inference/data/data_loader.py", _TIME_R1_AT, "load_charades: sentence "
                                                                                    "strip() only")),
    notes="Time-R1's evaluation prompt (the v1 text, the video first, the query as written)."))
_add(ReleaseTemplate(
    "time_r1_v2", ("tvg",), "no_think", None, True, TIME_R1_V2, "span", query="lower_no_period",
    sources=(Source(_TIME_R1, "src/time_r1/rl/timer1_trainer_ft.py", _TIME_R1_AT,
                    "QUESTION_TEMPLATE_TG_v2 (--prompt_type v2)"),),
    notes="Time-R1's direct-answer variant."))
_add(ReleaseTemplate(
    "videochat_r1_tg", ("tvg",), "think", None, True, VIDEOCHAT_R1_TG, "think_span", query="lower_no_period",
    sources=(Source(_VIDEOCHAT, "src/open_r1/trainer/grpo_trainer_video_tg.py", _VIDEOCHAT_AT,
                    "QUESTION_TEMPLATE, make_conversation_video (system turn commented out)"),
             Source(_VIDEOCHAT, "src/open_r1/grpo_tg.py", _VIDEOCHAT_AT, "sentence strip().lower(), final '.' "
                                                                         "dropped"))))
_add(ReleaseTemplate(
    "videochat_r1_gqa", ("gqa",), "think", None, True, VIDEOCHAT_R1_GQA, "videochat_gqa", options="paren_repr",
    sources=(Source(_VIDEOCHAT, "src/open_r1/trainer/grpo_trainer_video_gqa.py", _VIDEOCHAT_AT,
                    "QUESTION_TEMPLATE with [QUESTION] = question, [OPTION] = str(options) (the Python list, options "
                    "written '(A) ...'); no system turn; text then video"),
             Source(_VIDEOCHAT, "src/open_r1/grpo_gqa.py", _VIDEOCHAT_AT,
                    "format_reward: <think>..</think> <answer>..</answer> <glue>[(s, e), ...]</glue>")),
    notes="NExT-GQA. The answer letter goes in <answer>, the evidence in <glue> *after* it."))
_add(ReleaseTemplate(
    "tempsamp_r1", ("tvg",), "no_think", None, False, "{problem}", "tempsamp_span", problem=TEMPSAMP_R1,
    problem_clean="trim_drop_video",
    sources=(Source(_TEMPSAMP, "scripts/timelens/format_prompt/timelens.jinja", _TEMPSAMP_AT,
                    "the data's problem passed through, trimmed"),
             Source(_TEMPSAMP, "verl/utils/dataset.py", _TEMPSAMP_AT,
                    "_build_messages: split on <video> (video item first), no system turn"),
             Source(_TEMPSAMP, "data/timelens_grpo_train.jsonl", _TEMPSAMP_AT, "the problem text pattern"),
             Source(_TEMPSAMP, "scripts/timelens/timelens_reward.py", _TEMPSAMP_AT,
                    "build_gt_response: '<answer> {start:.2f} to {end:.2f} </answer>'")),
    notes="The public re-implementation (the official HVision-NKU code is not released). Samples converted with "
          "`convert.py tempsamp` keep the data's problem in meta.problem and use it verbatim; others (Charades, "
          "ActivityNet) get the same instruction around the query as written (no lower-casing)."))
_add(ReleaseTemplate(
    "video_r1", ("mcq", "qa"), "think", None, False, VIDEO_R1_QUESTION, "think_answer", options="dot_lines",
    type_suffix=VIDEO_R1_TYPES,
    sources=(Source(_VIDEO_R1, "src/r1-v/src/open_r1/grpo.py", _VIDEO_R1_AT,
                    "QUESTION_TEMPLATE, TYPE_TEMPLATE, make_conversation_image_and_video: no system turn, media then "
                    "text; multiple choice: problem + 'Options:\\n' + each option + '\\n'"),),
    notes="The options are written 'A. x' as in Video-R1-260k (the canonical schema stores them without the letter). "
          "Note the release's own text: 'Options:' follows the problem without a newline, and 'expressions It's' has "
          "no full stop."))
_add(ReleaseTemplate(
    "vlm_r1_rec", ("rec",), "think", None, False, VLM_R1_REC, "vlm_r1_box", problem=VLM_R1_REC_PROBLEM,
    problem_clean="drop_image",
    sources=(Source(_VLM_R1, "src/open-r1-multimodal/src/open_r1/vlm_modules/qwen_module.py", _VLM_R1_AT,
                    "get_question_template('rec')"),
             Source(_VLM_R1, "src/open-r1-multimodal/src/open_r1/grpo_jsonl.py", _VLM_R1_AT,
                    "make_conversation_from_jsonl: image(s) then text, no system turn; problem = the human turn "
                    "without <image>")),
    notes="The question is the data's problem ('Please provide the bounding box coordinate of the region this "
          "sentence describes: EXPRESSION.' in VLM-R1's RefCOCO files); kept in meta.problem by `convert.py refcoco`, "
          "rebuilt from the expression otherwise. The answer is asked for as JSON: the VLM-R1 format reward needs "
          "the box inside braces."))
_add(ReleaseTemplate(
    "video_rts", ("mcq",), "think", None, False, VIDEO_RTS, "think_answer", options="dot_lines",
    problem="{question}\nOptions:\n{options}",
    sources=(Source(_RTS, "src/training_files/grpo.py", _RTS_AT,
                    "QUESTION_TEMPLATE ('our training prompt'), make_conversation_video: no system turn, video "
                    "then text"),),
    notes="The release's data hold the options inside the problem text; a sample without meta.problem gets "
          "'QUESTION\\nOptions:\\nA. x\\nB. y' (chose: Video-R1's option style, the code base Video-RTS builds on)."))
_add(ReleaseTemplate(
    "tw_grpo_mixed", ("mcq", "gqa"), "think", None, False, TW_GRPO_MIXED, "think_answer", options="paren_lines",
    problem="{question}\n{options}",
    sources=(Source(_TW, "src/open_r1/grpo.py", _TW_AT,
                    "QUESTION_TEMPLATE for question_type 'mixed' (scripts/tw-grpo.sh), make_conversation_video: no "
                    "system turn, video then text"),),
    notes="The release's data hold the options inside the problem text; a sample without meta.problem gets "
          "'QUESTION\\n(A) x\\n(B) y' (chose)."))

_add(ReleaseTemplate(
    "mgpo", ("mcq",), "no_think", MGPO_SYSTEM, False, "{problem} " + MGPO_POST_PROMPT, "boxed",
    options="paren_lines", problem="{question}\n{options}", problem_clean="drop_image", ensure_period=True,
    sources=(Source(_MGPO, "examples/grpo_trainer/run_qwen2_5_vl-7b_mgpo.sh", _MGPO_AT,
                    "data.system_prompt, data.post_prompt"),
             Source(_MGPO, "verl/utils/dataset/hf_dataset.py", _MGPO_AT,
                    "make_conversation: system turn, user = ensure_period(prompt) + ' ' + post_prompt; '<image>' in "
                    "the prompt becomes the image")),
    notes="MGPO's first turn (V* / MME-RealWorld multiple choice). The release's data (HF xinyu1205/"
          "mme_realworld_train_21690) hold the user prompt with its '<image>' tag, the question and the choices as "
          "fields; they are not readable here. A sample converted from them keeps the prompt in meta.problem (a "
          "leading '<image>' is dropped: the image goes first), the question and choices in meta.question / "
          "meta.choices (the second turn's {question} {choices}); otherwise the problem is rebuilt as "
          "'QUESTION\\n(A) x\\n(B) y' and the choices as '(A) x\\n(B) y\\n' (chose). The answer goes in \\boxed{}."))


def mgpo_question_choices(sample: Sample | Mapping[str, Any]) -> tuple[str, str]:
    """The ``{question}`` and ``{choices}`` of MGPO's second-turn text: ``meta.question`` / ``meta.choices`` as the
    release data hold them, else the query and one ``(A) x`` line per option, each ended by a newline (chose)."""
    s = _as_sample(sample)
    meta = s.meta or {}
    q = meta.get("question") if isinstance(meta.get("question"), str) else s.query.strip()
    c = meta.get("choices")
    if not isinstance(c, str):
        c = "".join(f"({LETTERS[i]}) {o}\n" for i, o in enumerate(s.options or []))
    return q, c


# ---------------------------------------------------------------------------------------------------- lookup
def template_names() -> list[str]:
    return [PROJECT, *TEMPLATES]


def get_template(name: str) -> Optional[ReleaseTemplate]:
    """The release template ``name``; None for the project's own (``mmgrpo``); ValueError listing the names."""
    if name == PROJECT:
        return None
    if name not in TEMPLATES:
        raise ValueError(f"unknown prompt template {name!r}; choose one of {template_names()}")
    return TEMPLATES[name]


def check_template(name: str, task: str, mode: Optional[str] = None) -> None:
    """Raise (naming the setting) when template ``name`` cannot render ``task`` or asks for another prompt mode."""
    t = get_template(name)
    if t is None:
        return
    if task not in t.tasks:
        ok = [n for n, x in TEMPLATES.items() if task in x.tasks]
        raise ValueError(f"data.prompt_template={name} renders tasks {list(t.tasks)}, not data.task={task!r} "
                         f"(templates for {task}: {[PROJECT] + ok})")
    if mode is not None and mode != t.mode:
        raise ValueError(f"data.prompt_template={name} asks for {t.mode} answers (its release's instruction), but "
                         f"data.prompt_mode={mode}: set data.prompt_mode={t.mode}")


# ---------------------------------------------------------------------------------------------------- rendering
def _as_sample(sample: Sample | Mapping[str, Any]) -> Sample:
    return sample if isinstance(sample, Sample) else Sample.from_dict(dict(sample))


def problem_type(sample: Sample | Mapping[str, Any]) -> str:
    """Video-R1's problem type of a sample: "multiple choice" for mcq, ``meta.problem_type`` for qa."""
    s = _as_sample(sample)
    if s.task == "qa":
        return str((s.meta or {}).get("problem_type", ""))
    return "multiple choice"


def _query(t: ReleaseTemplate, q: str) -> str:
    q = q.strip()
    if t.query == "lower_no_period":
        q = q.lower()
        if q.endswith("."):
            q = q[:-1]
    return q


def _options(t: ReleaseTemplate, opts: Optional[Sequence[str]]) -> str:
    opts = list(opts or [])
    if t.options == "paren_repr":  # VideoChat-R1 substitutes str() of its "(A) x" option list
        return str([f"({LETTERS[i]}) {o}" for i, o in enumerate(opts)])
    if t.options == "dot_lines":
        return "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(opts))
    if t.options == "paren_lines":
        return "\n".join(f"({LETTERS[i]}) {o}" for i, o in enumerate(opts))
    return ""


def user_text(sample: Sample | Mapping[str, Any], template: str | ReleaseTemplate) -> str:
    """The user-turn text of ``sample`` under a release template (the media item is added by
    :func:`render_messages`)."""
    t = template if isinstance(template, ReleaseTemplate) else get_template(template)
    if t is None:
        raise ValueError("user_text renders release templates; the project template is prompts.user_prompt")
    s = _as_sample(sample)
    if s.task not in t.tasks:
        raise ValueError(f"prompt template {t.name} renders tasks {list(t.tasks)}, not {s.task!r} (sample {s.id!r})")
    q = _query(t, s.query)
    fields = {"event": q, "question": q, "options": _options(t, s.options)}
    if t.name == "video_r1":
        ptype = problem_type(s)
        if ptype not in t.type_suffix:
            raise ValueError(f"sample {s.id!r}: Video-R1 problem type {ptype!r} unknown; one of {list(t.type_suffix)}")
        problem = _meta_problem(t, s)
        if problem is None:
            problem = s.query
        if s.task == "mcq":
            problem += "Options:\n" + "".join(f"{LETTERS[i]}. {o}\n" for i, o in enumerate(s.options or []))
        return t.text.format(problem=problem) + t.type_suffix[ptype]
    if "{problem}" in t.text:
        problem = _meta_problem(t, s)
        problem = (t.problem or "{question}").format(**fields) if problem is None else problem
        if t.ensure_period and not problem.endswith((".", "?", "!", ".'")):
            problem += "."
        fields["problem"] = problem
    return t.text.format(**fields)


def _meta_problem(t: ReleaseTemplate, s: Sample) -> Optional[str]:
    """The release data's own text in ``meta["problem"]``, as the release passes it on; None when absent."""
    p = (s.meta or {}).get("problem")
    if not isinstance(p, str) or not p.strip():
        return None
    if t.problem_clean == "drop_image":  # VLM-R1: human turn .replace('<image>', '')
        return p.replace("<image>", "")
    if t.problem_clean == "trim_drop_video":  # TempSamp-R1: jinja trim, then the text after the <video> item
        p = p.strip()
        if "<video>" in p:
            if not p.startswith("<video>") or p.count("<video>") > 1:
                raise ValueError(f"sample {s.id!r}: meta.problem must start with one <video> placeholder (the "
                                 f"release then puts the video first), got {p[:60]!r}...")
            p = p[len("<video>"):]
        return p
    return p


def render_messages(sample: Sample | Mapping[str, Any], template: str = PROJECT, *, mode: str = "think",
                    answer_format: str = "seconds", box_frame: str = "abs", query_position: str = "after",
                    media_kwargs: Mapping | None = None, hint: str = "") -> list[dict]:
    """Qwen chat messages of ``sample`` under ``template``.

    ``mmgrpo``: :func:`mmgrpo.vlm.data.prompts.build_messages` (``mode``, ``answer_format``, ``box_frame``,
    ``query_position`` apply).  A release template fixes all of these itself.  ``hint`` is appended to the user
    text as ``"\\nHint: ..."`` (methods that add reasoning hints); ``media_kwargs`` go into the media item."""
    s = _as_sample(sample)
    t = get_template(template)
    if t is None:
        from .prompts import build_messages

        msgs = build_messages(s, mode=mode, answer_format=answer_format, box_frame=box_frame,
                              media_kwargs=media_kwargs, query_position=query_position)
    else:
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
        text = {"type": "text", "text": user_text(s, t)}
        msgs = [] if t.system is None else [{"role": "system", "content": t.system}]
        msgs.append({"role": "user", "content": [text, item] if t.text_first else [item, text]})
    if hint:
        content = msgs[-1]["content"]
        k = next(i for i, c in enumerate(content) if c.get("type") == "text")
        content[k] = dict(content[k], text=f"{content[k]['text']}\nHint: {hint}")
    return msgs


def template_mode(template: str, default: str) -> str:
    t = get_template(template)
    return default if t is None else t.mode


# ---------------------------------------------------------------------------------------------------- answers
def _span(sample: Sample, clip_relative: bool) -> tuple[float, float]:
    if not sample.spans:
        raise ValueError(f"sample {sample.id!r}: no spans")
    off = (sample.video_start or 0.0) if clip_relative else 0.0
    s, e = sample.spans[0]
    return s - off, e - off


def ground_truth(sample: Sample | Mapping[str, Any], template: str = PROJECT, *, mode: str = "no_think",
                 answer_format: str = "seconds", clip_relative: bool = True, think_text: str = "",
                 box_frame: str = "abs", resized_size: Sequence[int] | None = None) -> str:
    """The ground truth written as a completion in the format ``template``'s prompt asks for.

    ``mmgrpo``: :func:`~mmgrpo.vlm.data.prompts.format_ground_truth_answer` (``mode``, ``answer_format``,
    ``box_frame``, ``resized_size`` apply).  Release templates (``think_text`` fills an empty think block):

    * ``think_span`` / ``span``: ``<think></think><answer>12.54 to 17.83</answer>`` / ``<answer>12.54 to 17.83</answer>``
    * ``tempsamp_span``: ``<answer> 12.54 to 17.83 </answer>`` (TempSamp-R1's ``build_gt_response``, spaces inside)
    * ``videochat_gqa``: ``<think></think><answer>C</answer><glue>[(3.0, 7.5)]</glue>`` (all evidence spans)
    * ``think_answer``: ``<think></think><answer>X</answer>``, X = the option letter (mcq) or the reference answer
      as written (qa: number or text)
    * ``vlm_r1_box``: ``<think></think><answer>{"bbox_2d": [x1, y1, x2, y2]}</answer>``, integers in ``box_frame``
    * ``boxed``: ``\\boxed{X}``, X = the option letter (MGPO's answer turn)
    """
    from .prompts import _box_in_frame, format_ground_truth_answer

    s = _as_sample(sample)
    t = get_template(template)
    if t is None:
        return format_ground_truth_answer(s, mode=mode, answer_format=answer_format, clip_relative=clip_relative,
                                          think_text=think_text, box_frame=box_frame, resized_size=resized_size)
    think = f"<think>{think_text}</think>"
    if t.answer in ("think_span", "span", "tempsamp_span"):
        a, b = _span(s, clip_relative)
        if t.answer == "tempsamp_span":
            return f"<answer> {a:.2f} to {b:.2f} </answer>"
        ans = f"<answer>{a:.2f} to {b:.2f}</answer>"
        return think + ans if t.answer == "think_span" else ans
    if t.answer == "videochat_gqa":
        if s.answer is None or not s.spans:
            raise ValueError(f"sample {s.id!r}: gqa needs answer and spans")
        off = (s.video_start or 0.0) if clip_relative else 0.0
        glue = ", ".join(f"({a - off:.2f}, {b - off:.2f})" for a, b in s.spans)
        return f"{think}<answer>{s.answer}</answer><glue>[{glue}]</glue>"
    if t.answer == "boxed":
        if s.answer is None:
            raise ValueError(f"sample {s.id!r}: no answer")
        return f"\\boxed{{{s.answer}}}"
    if t.answer == "think_answer":
        if s.answer is None:
            raise ValueError(f"sample {s.id!r}: no answer")
        return f"{think}<answer>{s.answer}</answer>"
    if t.answer == "vlm_r1_box":
        if not s.boxes or s.image_size is None:
            raise ValueError(f"sample {s.id!r}: rec needs boxes and image_size")
        b = _box_in_frame(s.boxes[0], box_frame, s.image_size, resized_size)
        return think + "<answer>" + json.dumps({"bbox_2d": [int(round(v)) for v in b]}) + "</answer>"
    raise ValueError(f"template {t.name}: unknown answer writer {t.answer!r}")


def describe(name: str) -> str:
    """One line per source, for docs and ``mmgrpo check``."""
    t = get_template(name)
    if t is None:
        return "mmgrpo: the project's own prompt (mmgrpo.vlm.data.prompts)"
    return "; ".join(str(x) for x in t.sources)
