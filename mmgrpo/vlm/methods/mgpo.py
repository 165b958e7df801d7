r"""MGPO, multi-turn grounding-based policy optimisation (High-Resolution Visual Reasoning via Multi-Turn
Grounding-Based RL; github.com/EvolvingLMMs-Lab/MGPO, training code in the verl fork xinyu1205/verl, branch
``mgpo``, read at 994efbe611): the model first writes the box of the region that answers the question, the region is cropped from the
full-resolution image and fed back in a second turn, and the model answers; the only reward is the binary answer
accuracy, the loss covers the model's turns only.

Two call formats (``tools.call_format``):

* ``mgpo`` -- **the release** (facts read from ``verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py``, the
  training script and ``hf_dataset.py``; no code copied). With ``data.prompt_template=mgpo`` (the release's system
  prompt and post prompt, :mod:`mmgrpo.vlm.data.templates`) the first turn is asked for the coordinates in JSON. In
  it, the first fenced block ``````json\n[...]\n`````` whose list holds an item with an integer ``bbox_2d`` of 4 and
  a string ``label`` is the crop request (:func:`release_json_box`); the turn is **cut after that block**
  (:func:`release_cut`; the rollout keeps the sampled tokens up to the one that completes the block and closes the
  turn with ``<|im_end|>``). The box (pixels of the model-input image) is **valid** when x1 < x2, y1 < y2, x1, y1
  >= 0, x2 <= W, y2 <= H, both sides > 28 and the aspect ratio < 100 (:func:`release_box_valid`); then the tool
  ``mgpo_crop`` cuts ``int(x / W * W_src)`` ... from the source image (the whole source if a side is >= 150 times
  the other) and resizes it to 200,704 .. 1,003,520 pixels with nearest-neighbour resampling (:func:`release_resize`,
  the release's ``process_image``), and the second turn is :data:`RELEASE_SUB_IMAGE`; otherwise (no block, invalid
  box) the first view's image is shown again with :data:`RELEASE_ORI_IMAGE` (a counted failure here; the release
  counts nothing). The second turn always follows, whatever the first wrote (two generations per rollout); it
  answers in ``\boxed{}``, read by ``reward.parse_mode=mgpo`` (the last ``\boxed{}``, mathruler-normalised letter);
* ``mgpo_plain`` -- our earlier reading from the paper's summary, kept as the switch back: any ``[x1, y1, x2, y2]``
  (or a ``crop`` call) in the first turn is cropped by the general ``crop`` tool and shown with :data:`SECOND_TURN`;
  answers in ``<answer>``.

This module (``methods.mgpo.enabled``) checks that combination and logs the grounding statistics:
``mgpo/grounded`` (rows whose first turn gave a usable box), ``mgpo/acc_grounded`` / ``mgpo/acc_ungrounded``
(accuracy of those rows and of the others).
"""
from __future__ import annotations

import json
import math
import re

import torch

from mmgrpo.vlm.methods.base import VLMMethod
from mmgrpo.vlm.tools.base import ToolError, ToolResult
from mmgrpo.vlm.tools.parse import CallFormat, ToolCall, _box_frame_text, parse_tool_calls

__all__ = ["grounding_box", "mgpo_calls", "mgpo_instruction", "MGPO_FORMAT", "SECOND_TURN", "MGPO",
           "release_json_box", "release_cut", "release_box_valid", "release_resize", "release_calls",
           "mgpo_crop", "RELEASE_SUB_IMAGE", "RELEASE_ORI_IMAGE", "MGPO_RELEASE_FORMAT"]

_NUM = r"\s*(-?\d+(?:\.\d+)?)\s*"
_BOX = re.compile(r"\[" + ",".join([_NUM] * 4) + r"\]")
SECOND_TURN = ("This is the region you selected, cropped from the full-resolution image. Answer the question "
               "inside <answer> </answer> tags.")


def grounding_box(text: str) -> list[float] | None:
    """The first ``[x1, y1, x2, y2]`` of four numbers in ``text`` (None if there is none)."""
    m = _BOX.search(text)
    return [float(x) for x in m.groups()] if m else None


def mgpo_calls(text: str, turn: int) -> list[ToolCall]:
    """Turn 1: a ``crop`` tool call if written, else the first box as a crop call, else one failed call; later
    turns: none (they answer)."""
    if turn != 1:
        return []
    calls = [c for c in parse_tool_calls(text) if c.error or c.name == "crop"]
    if calls:
        return calls[:1]
    box = grounding_box(text)
    if box is None:
        return [ToolCall(error="no bounding box [x1, y1, x2, y2] in the first turn; answer from the full image")]
    return [ToolCall(name="crop", arguments={"bbox_2d": box})]


def mgpo_instruction(tool_names, family: str) -> str:
    return ("Answer in two turns. First turn: only the bounding box [x1, y1, x2, y2] of the region of the image "
            f"that holds the answer ({_box_frame_text(family)}). That region is then cropped from the "
            "full-resolution image and shown to you. Second turn: the answer inside <answer> </answer> tags.")


MGPO_FORMAT = CallFormat(mgpo_calls, mgpo_instruction, SECOND_TURN)

# ------------------------------------------------------------------------------------------------------ the release
# rollout.sub_image_token_prompt / ori_image_token_prompt of run_qwen2_5_vl-7b_mgpo.sh: a user turn, the image between
# the two texts; {question} {choices} are the sample's (mmgrpo.vlm.data.templates.mgpo_question_choices)
RELEASE_SUB_IMAGE = ("Based on the provided coordinates, return the sub-image:\n",
                     "\nQuestion: {question} {choices}Carefully analyze both the original image and the enlarged "
                     "sub-image to solve the question step by step. If the sub-image does not provide sufficient "
                     "information, refer to the original image to find the solution. Present your reasoning clearly, "
                     "and provide the final answer (A, B, C, D, or E) enclosed within \\boxed{{}}.")
RELEASE_ORI_IMAGE = ("Not providing correct coordinates or invalid coordinate values, return the original image:\n",
                     "\nQuestion: {question} {choices}Carefully analyze the original image to solve the question step "
                     "by step. Present your reasoning clearly, and provide the final answer (A, B, C, D, or E) "
                     "enclosed within \\boxed{{}}.")
RELEASE_MIN_PIXELS, RELEASE_MAX_PIXELS = 200704, 1003520  # rollout.min_pixels / max_pixels (256*28*28, 1280*28*28)
_JSON_FENCE = re.compile(r"```json\n([\s\S]*?)\n```")


def _release_match(text: str):
    """(end of the block, bbox) of the first qualifying fenced JSON block, or (None, None)."""
    for m in _JSON_FENCE.finditer(text):
        try:
            data = json.loads(m.group(1).strip())
        except json.JSONDecodeError:
            continue
        if not (isinstance(data, list) and data and all(isinstance(x, dict) for x in data)):
            continue
        for x in data:
            b = x.get("bbox_2d")
            if (isinstance(b, list) and len(b) == 4 and all(isinstance(v, int) and not isinstance(v, bool) for v in b)
                    and isinstance(x.get("label"), str)):
                return m.end(), list(b)
    return None, None


def release_json_box(text: str) -> list[int] | None:
    """The release's crop request: in the first ```json fenced block (newline after the fence and before the closing
    one) that parses to a non-empty list of objects, the first object with ``bbox_2d`` = 4 integers and a string
    ``label``; later blocks are tried when one does not qualify. None if there is none."""
    return _release_match(text)[1]


def release_cut(text: str, turn: int) -> int | None:
    """Where the release cuts the first turn: the end of the qualifying block (None: no cut)."""
    return _release_match(text)[0] if turn == 1 else None


def release_box_valid(box, width: int, height: int) -> bool:
    """The release's validity test of a box in pixels of the model-input image (``width`` x ``height`` = the image
    grid x 14)."""
    if box is None:
        return False
    x1, y1, x2, y2 = (int(v) for v in box)
    return (x1 < x2 and y1 < y2 and x1 >= 0 and y1 >= 0 and x2 <= width and y2 <= height
            and (x2 - x1) > 28 and (y2 - y1) > 28 and max((x2 - x1) / (y2 - y1), (y2 - y1) / (x2 - x1)) < 100)


def release_resize(im, max_pixels: int = RELEASE_MAX_PIXELS, min_pixels: int = RELEASE_MIN_PIXELS):
    """The release's ``process_image``: scale by sqrt(max / area) if over ``max_pixels``, then by sqrt(min / area) if
    under ``min_pixels``, sides truncated to int, nearest-neighbour; RGB."""
    from PIL import Image

    if im.width * im.height > max_pixels:
        f = math.sqrt(max_pixels / (im.width * im.height))
        im = im.resize((int(im.width * f), int(im.height * f)), resample=Image.Resampling.NEAREST)
    if im.width * im.height < min_pixels:
        f = math.sqrt(min_pixels / (im.width * im.height))
        im = im.resize((int(im.width * f), int(im.height * f)), resample=Image.Resampling.NEAREST)
    return im if im.mode == "RGB" else im.convert("RGB")


def release_calls(text: str, turn: int) -> list[ToolCall]:
    """Turn 1: always one ``mgpo_crop`` call (its ``bbox_2d`` None when there is no qualifying block: the tool then
    returns the original image); later turns: none (the second turn is the answer)."""
    if turn != 1:
        return []
    return [ToolCall(name="mgpo_crop", arguments={"bbox_2d": release_json_box(text)})]


def _release_content(texts: tuple[str, str], ctx) -> list[dict]:
    from mmgrpo.vlm.data.templates import mgpo_question_choices

    q, c = mgpo_question_choices(ctx.sample)
    return [{"type": "text", "text": texts[0]}, {"type": "image"},
            {"type": "text", "text": texts[1].format(question=q, choices=c)}]


def mgpo_crop(ctx, args: dict) -> ToolResult:
    """The release's crop (tool ``mgpo_crop``): a valid box -> the region of the source image, resized by
    :func:`release_resize`, with :data:`RELEASE_SUB_IMAGE`; otherwise the first view's image again with
    :data:`RELEASE_ORI_IMAGE` (``ok=False``)."""
    if not ctx.images:
        raise ToolError("this sample has no image to crop")
    src = ctx.images[0]
    W, H = (ctx.resized_sizes[0] if ctx.resized_sizes else src.size)
    box = args.get("bbox_2d")
    if not release_box_valid(box, W, H):
        return ToolResult(text=f"invalid or missing coordinates {box!r}: the original image is shown again",
                          images=[src], ok=False, content=_release_content(RELEASE_ORI_IMAGE, ctx))
    x1, y1, x2, y2 = (int(v) for v in box)
    ow, oh = src.size
    x1o, x2o = int(x1 / W * ow), int(x2 / W * ow)
    y1o, y2o = int(y1 / H * oh), int(y2 / H * oh)
    w, h = x2o - x1o, y2o - y1o
    sub = src if (w >= h * 150 or h >= w * 150) else src.crop((x1o, y1o, x2o, y2o))
    return ToolResult(text=f"crop [{x1o}, {y1o}, {x2o}, {y2o}] of the source image", images=[release_resize(sub)],
                      content=_release_content(RELEASE_SUB_IMAGE, ctx))


MGPO_RELEASE_FORMAT = CallFormat(release_calls, lambda tool_names, family: "", cut=release_cut)


class MGPO(VLMMethod):
    """``methods.mgpo.enabled``: checks the MGPO setting (tools on, call format ``mgpo`` with the ``mgpo_crop`` tool,
    the ``mgpo`` prompt template, no answer pattern, or ``mgpo_plain`` with ``crop``; two turns) and logs the grounding
    statistics; the rollout and loss are the tool rollout's."""

    name = "mgpo"

    @classmethod
    def check(cls, cfg) -> None:
        if not cfg.methods.mgpo.enabled:
            return
        t = cfg.tools
        tool = {"mgpo": "mgpo_crop", "mgpo_plain": "crop"}.get(t.call_format)
        if not t.enabled or tool is None or tool not in t.names or t.max_turns < 2:
            raise ValueError("methods.mgpo needs tools.enabled=true, tools.call_format=mgpo (the release; tool "
                             "'mgpo_crop') or mgpo_plain (tool 'crop') with its tool in tools.names, and "
                             f"tools.max_turns >= 2 (got enabled={t.enabled}, call_format={t.call_format!r}, "
                             f"names={list(t.names)}, max_turns={t.max_turns})")
        if t.call_format == "mgpo":
            tmpl = getattr(cfg.data, "prompt_template", "mmgrpo")
            if tmpl != "mgpo" or t.answer_pattern:
                raise ValueError("tools.call_format=mgpo (the release's two-turn template) needs "
                                 "data.prompt_template=mgpo (its first-turn prompt) and tools.answer_pattern='' (the "
                                 f"second turn always follows); got data.prompt_template={tmpl!r}, "
                                 f"tools.answer_pattern={t.answer_pattern!r}")

    def end_of_step(self, rb, metrics: dict) -> None:
        if not rb.n or "tools/tool_calls" not in rb.rewards:
            return
        onp = ~rb.is_offpolicy
        grounded = (rb.rewards["tools/tool_calls"] > 0) & (rb.rewards["tools/tool_failures"] == 0)
        metrics["mgpo/grounded"] = float(grounded[onp].float().mean())
        acc = torch.nan_to_num(self.run.accuracy(rb.texts, rb.samples, rb.rewards).float(), nan=0.0)
        for name, sel in (("acc_grounded", grounded & onp), ("acc_ungrounded", ~grounded & onp)):
            if sel.any():
                metrics[f"mgpo/{name}"] = float(acc[sel].mean())
