"""The look-again benchmark (:mod:`mmgrpo.synthetic.look_again`) on the VLM side: prompts with and without the
crop tool, tool traces for SFT, and the scoring of (possibly two-turn) outputs.

The tool-call format is Qwen2.5-VL's (Hermes, as in the released chat template): the assistant writes

    <tool_call>
    {"name": "crop", "arguments": {"bbox_2d": [x1, y1, x2, y2]}}
    </tool_call>

with the box in the **model's box frame** (Qwen2.5-VL: pixels of the image as the model sees it, here the 56 x 56
view), and the result comes back as a ``tool`` message rendered ``<|im_start|>user\\n<tool_response>\\n<image>
\\n</tool_response><|im_end|>`` (:data:`TOOL_CHAT_TEMPLATE`). The crop is taken from the full-resolution source at
``box * meta.scale`` and resized to the view's size (:func:`run_crop`).

Two prompts per sample (:func:`first_messages`): ``tools=True`` adds the tool to the system turn; ``tools=False`` is
a plain prompt (short system turns: the tiny model pays for every prompt token). The answer is ``<answer>LETTER</answer>`` in both.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Sequence

from mmgrpo.synthetic import look_again as bench

TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
SYSTEM_PLAIN = "Answer inside <answer> </answer> tags."
SYSTEM_TOOLS = ("The image is small. To see a region at full resolution, call crop_source once: <tool_call>\n"
                "{\"name\": \"crop_source\", \"arguments\": {\"bbox_2d\": [x1, y1, x2, y2]}}\n</tool_call> "
                "(image pixels). Answer inside <answer> </answer> tags.")

# Qwen ChatML (mmgrpo.vlm.models.tiny.CHAT_TEMPLATE) plus the released Qwen2.5 rendering of tool messages: a
# ``tool`` turn is a user turn wrapped in <tool_response> tags (consecutive tool messages share one user turn).
TOOL_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- if message['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- endif -%}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for content in message['content'] -%}"
    "{%- if content['type'] == 'image' or 'image' in content or 'image_url' in content -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif content['type'] == 'video' or 'video' in content -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in content -%}"
    "{{- content['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- if message['role'] == 'tool' -%}"
    "{{- '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)

_CALL_RE = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)
_ANSWER_RE = re.compile(r"<answer>\s*([A-Za-z])\s*</answer>")


def load_split(path: str) -> list[dict]:
    """The JSONL rows of a split with ``image`` and ``meta.source`` made absolute (relative to the file)."""
    base = os.path.dirname(os.path.abspath(path))
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                r["image"] = os.path.join(base, r["image"])
                r["meta"] = dict(r["meta"], source=os.path.join(base, r["meta"]["source"]))
                rows.append(r)
    return rows


def question_text(sample: dict) -> str:
    opts = "\n".join(f"({bench.LETTERS[i]}) {o}" for i, o in enumerate(sample["options"]))
    return f"{sample['query']}\nOptions:\n{opts}\nAnswer with the option's letter from the given choices."


def first_messages(sample: dict, tools: bool, image: Any = None) -> list[dict]:
    """System + user turn (the view, then the question); ``image`` replaces the path (a PIL image; ``False`` = no
    image at all: the no-image baseline)."""
    content = [] if image is False else [{"type": "image", "image": sample["image"] if image is None else image}]
    content.append({"type": "text", "text": question_text(sample)})
    return [{"role": "system", "content": SYSTEM_TOOLS if tools else SYSTEM_PLAIN},
            {"role": "user", "content": content}]


def tool_call_text(box: Sequence[int]) -> str:
    from mmgrpo.vlm.tools import format_tool_call

    return format_tool_call(TOOL_NAME, {"bbox_2d": [int(v) for v in box]})


def answer_text(letter: str) -> str:
    return f"<answer>{letter}</answer>"


def parse_tool_call(text: str) -> tuple[list[int] | None, str]:
    """(box, status) of the first tool call in ``text``: status ``ok`` | ``none`` (no call) | ``bad_json`` |
    ``bad_args`` (not a crop with 4 numbers)."""
    m = _CALL_RE.search(text or "")
    if m is None:
        return None, "none" if "<tool_call>" not in (text or "") else "bad_json"
    try:
        obj = json.loads(m.group(1))
    except json.JSONDecodeError:
        return None, "bad_json"
    box = obj.get("arguments", {}).get("bbox_2d") if isinstance(obj, dict) else None
    if obj.get("name") != TOOL_NAME or not (isinstance(box, list) and len(box) == 4
                                         and all(isinstance(v, (int, float)) for v in box)):
        return None, "bad_args"
    return [int(round(v)) for v in box], "ok"


def parse_letter(text: str) -> str | None:
    m = _ANSWER_RE.search(text or "")
    return m.group(1).upper() if m else None


def tool_context(sample: dict, options: Any = None):
    """The :class:`mmgrpo.vlm.tools.ToolContext` of a sample for :func:`crop_source`: the full-resolution source
    as the image to crop, the view's size as the model-input size (the box frame: view pixels x ``meta.scale``)."""
    from PIL import Image

    from mmgrpo.vlm.tools import ToolContext, ToolsConfig

    src = Image.open(sample["meta"]["source"]).convert("RGB")
    return ToolContext(sample=sample, images=[src], family="qwen2_5_vl", resized_sizes=[tuple(sample["image_size"])],
                       image_factor=28, options=options if options is not None else ToolsConfig())


def crop_source(ctx, args: dict):
    """Tool ``crop_source``: the built-in ``crop`` (:func:`mmgrpo.vlm.tools.builtin.crop`: box in the model's frame,
    clamped, cut from the source, resized to the first view's token budget) applied to the sample's full-resolution
    source file ``meta.source`` instead of the prompt image (which here is the downsampled view)."""
    import dataclasses

    from mmgrpo.vlm.tools.builtin import crop

    sample = ctx.sample if isinstance(ctx.sample, dict) else ctx.sample.to_dict()
    if not ctx.images or ctx.images[0].size != tuple(sample["meta"]["source_size"]):
        ctx = dataclasses.replace(ctx, images=tool_context(sample).images,
                                  resized_sizes=[tuple(sample["image_size"])])
    return crop(ctx, args)


def _register() -> None:
    from mmgrpo.vlm.tools import TOOLS, register_tool

    if TOOL_NAME not in TOOLS:
        register_tool(TOOL_NAME, crop_source)


TOOL_NAME = "crop_source"
_register()


def run_crop(sample: dict, box_view: Sequence[int], ctx: Any = None):
    """Call the tool on ``box_view`` (view pixels): the ToolResult (``ok=False`` with the error text for a bad
    box, never an exception)."""
    from mmgrpo.vlm.tools import call_tool

    return call_tool(TOOL_NAME, ctx or tool_context(sample), {"bbox_2d": [int(v) for v in box_view]})


def trace_messages(sample: dict, box_view: Sequence[int] | None = None) -> tuple[list[dict], list]:
    """The full tool trace of ``sample`` (the cell box unless ``box_view``): messages and the two images (view,
    crop) in placeholder order."""
    from PIL import Image

    box = list(box_view) if box_view is not None else sample["meta"]["cell_box_view"]
    view = Image.open(sample["image"]).convert("RGB")
    res = run_crop(sample, box)
    if not res.ok:
        raise ValueError(f"sample {sample['id']}: {res.text}")
    crop = res.images[0]
    msgs = first_messages(sample, tools=True, image=view)
    msgs += [{"role": "assistant", "content": tool_call_text(box)},
             {"role": "tool", "content": [{"type": "image", "image": crop}]}]
    return msgs, [view, crop]


def score(letters: Sequence[str | None], samples: Sequence[dict]) -> float:
    """Accuracy (percent) of the parsed letters against the samples' answers (unparsed = wrong)."""
    if not samples:
        return float("nan")
    return 100.0 * sum(a is not None and a == s["answer"] for a, s in zip(letters, samples)) / len(samples)


# ------------------------------------------------------------------------------------------------------------
# examples and greedy evaluation (single-turn generations chained by hand; the GRPO demo's rollouts are the VLM
# loop's multi-turn engine)
# ------------------------------------------------------------------------------------------------------------
def example(processor, messages: list[dict], images: list, target: str | None = None, sample: dict | None = None):
    """An :class:`mmgrpo.vlm.sft.SFTExample` of ``messages`` (+ generation prompt) with ``images`` in placeholder
    order; ``target`` = the assistant text to learn (``None``: a prompt for generation only)."""
    import torch

    from mmgrpo.vlm.sft import SFTExample

    tok = processor.tokenizer
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    out = processor(text=[text], images=images or None, return_tensors="pt")
    prompt = {k: v for k, v in dict(out).items() if isinstance(v, torch.Tensor)}
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    ids = (tok(target, add_special_tokens=False)["input_ids"] if target else []) + [int(eot)]
    return SFTExample(sample=sample or {}, prompt=prompt, answer_ids=torch.tensor(ids, dtype=torch.long),
                      prompt_text=text, answer_text=target or "")


def first_turn_example(processor, sample: dict, tools: bool, target: str | None = None, image: Any = None):
    from PIL import Image

    if image is None:
        image = Image.open(sample["image"]).convert("RGB")
    msgs = first_messages(sample, tools, image=image)
    return example(processor, msgs, [] if image is False else [image], target, sample)


def trace_examples(processor, sample: dict, box_view: Sequence[int] | None = None) -> list:
    """The two SFT examples of a tool trace: (first turn -> the tool call), (trace with the crop -> the answer)."""
    msgs, images = trace_messages(sample, box_view)
    box = list(box_view) if box_view is not None else sample["meta"]["cell_box_view"]
    return [example(processor, msgs[:2], images[:1], tool_call_text(box), sample),
            example(processor, msgs, images, answer_text(sample["answer"]), sample)]


def greedy_texts(model, processor, examples: Sequence, max_new_tokens: int = 40, batch_size: int = 32) -> list[str]:
    from mmgrpo.vlm.sft import generate_greedy

    if not examples:
        return []
    return generate_greedy(model, processor, examples, batch_size=batch_size, max_new_tokens=max_new_tokens)["texts"]


def evaluate(model, processor, samples: Sequence[dict], batch_size: int = 32) -> dict:
    """Greedy accuracies (percent) on ``samples``:

    * ``tools``: the tool prompt; a first turn that calls crop gets the crop and a second turn; the answer is the
      last turn's letter. Also ``call_rate``, ``cell_hit_rate`` (the box covers the object), ``acc_called`` /
      ``acc_not_called`` (accuracy on the samples where the tool was / was not called) and ``tool_errors``;
    * ``gold_crop``: second turn after the trace with the true cell's crop (reading alone);
    * ``plain``: the plain prompt (one turn); ``no_image``: the plain prompt without the image.
    """
    import torch

    res: dict[str, Any] = {"n": len(samples)}
    with torch.no_grad():
        t1 = greedy_texts(model, processor, [first_turn_example(processor, s, True) for s in samples],
                          batch_size=batch_size)
        calls = [parse_tool_call(t) for t in t1]
        second, idx, errors = [], [], 0
        for i, (s, (box, st)) in enumerate(zip(samples, calls)):
            if st != "ok":
                continue
            try:
                msgs, images = trace_messages(s, box)
            except ValueError:
                errors += 1
                continue
            msgs[2]["content"] = t1[i]  # the assistant turn: the model's own call text
            second.append(example(processor, msgs, images, None, s))
            idx.append(i)
        t2 = greedy_texts(model, processor, second, batch_size=batch_size)
        final = [parse_letter(t) for t in t1]
        for i, t in zip(idx, t2):
            final[i] = parse_letter(t)
        called = [st == "ok" for _, st in calls]
        hits = []
        for s, (box, st) in zip(samples, calls):
            ob = [v // int(s["meta"]["scale"]) for v in s["meta"]["object_box_source"]]
            hits.append(st == "ok" and box[0] <= ob[0] and box[1] <= ob[1] and box[2] >= ob[2] and box[3] >= ob[3])
        gold = greedy_texts(model, processor, [example(processor, *trace_messages(s), None, s) for s in samples],
                            batch_size=batch_size)
        plain = greedy_texts(model, processor, [first_turn_example(processor, s, False) for s in samples],
                             batch_size=batch_size)
        blind = greedy_texts(model, processor, [first_turn_example(processor, s, False, image=False)
                                                for s in samples], batch_size=batch_size)
    sub = lambda flag: [s for s, c in zip(samples, called) if c == flag]  # noqa: E731
    subl = lambda flag: [a for a, c in zip(final, called) if c == flag]  # noqa: E731
    res.update(tools=score(final, samples), call_rate=100.0 * sum(called) / max(1, len(samples)),
               cell_hit_rate=100.0 * sum(hits) / max(1, len(samples)),
               acc_called=score(subl(True), sub(True)), acc_not_called=score(subl(False), sub(False)),
               tool_errors=errors, gold_crop=score([parse_letter(t) for t in gold], samples),
               plain=score([parse_letter(t) for t in plain], samples),
               no_image=score([parse_letter(t) for t in blind], samples))
    res["examples"] = [{"id": s["id"], "answer": s["answer"], "turn1": a, "turn2": t2[idx.index(i)] if i in idx else None}
                       for i, (s, a) in enumerate(zip(samples[:6], t1[:6]))]
    return res
