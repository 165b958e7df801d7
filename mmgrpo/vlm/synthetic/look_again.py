"""The look-again benchmark (:mod:`mmgrpo.synthetic.look_again`) on the VLM side: the crop tool on the
full-resolution source, the with-tools / plain variants of the data, tool traces for SFT, and greedy evaluation
through the multi-turn rollout engine (:mod:`mmgrpo.vlm.tools.rollout`).

* **Tool** ``crop_source`` (:func:`crop_source`, registered on import): the built-in ``crop`` (box in the model's
  frame -- Qwen2.5-VL: pixels of the 112 x 112 view -- cut from the source and resized to the view's token budget)
  applied to the sample's full-resolution file ``meta.source``. The built-in crop cuts from the prompt image, which
  here is the downsampled view on purpose (an exact area average, so the answer is provably not in it; a processor
  resize of the source would be bicubic and leak a little).
* **Variants** (:func:`write_variants`): ``{split}_tools.jsonl`` (the query starts with :data:`TOOL_HINT`, which
  offers the tool in the model family's own call format) and ``{split}_plain.jsonl`` (the question alone). Both go
  through the trainer's prompt path unchanged (``data.task=mcq``, ``data.prompt_mode=no_think``: the project's
  system turn, the image, the question, the options, ``<answer>LETTER</answer>``), so GRPO with tools
  (``tools.enabled=true tools.names=[crop_source]`` on the tools file) and without (the plain file) differ only in
  the tool.
* **Traces** (:func:`trace_examples`): the first turn -> the call on the object's cell; the conversation with the
  tool turn exactly as the rollout engine encodes it (:class:`~mmgrpo.vlm.tools.rollout.ToolTurnRenderer`,
  :func:`~mmgrpo.vlm.tools.rollout.encode_turn`) -> the answer.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Sequence

from mmgrpo.synthetic import look_again as bench

TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]
TOOL_HINT = ("The image is small. To see a region of it at full resolution, call crop_source once: <tool_call>\n"
             "{\"name\": \"crop_source\", \"arguments\": {\"bbox_2d\": [x1, y1, x2, y2]}}\n</tool_call> "
             "with the box in the image's pixels.")

_CALL_RE = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.S)
_ANSWER_RE = re.compile(r"<answer>\s*([A-Za-z])\s*</answer>")


def load_split(path: str) -> list[dict]:
    """The JSONL rows of a split with ``image`` made absolute (relative to the file); ``meta.source`` stays
    relative to the image's folder (:func:`source_path`)."""
    base = os.path.dirname(os.path.abspath(path))
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                r["image"] = os.path.join(base, r["image"])
                rows.append(r)
    return rows


def source_path(sample: dict) -> str:
    src = sample["meta"]["source"]
    return src if os.path.isabs(src) else os.path.join(os.path.dirname(sample["image"]), src)


def variant(sample: dict, tools: bool) -> dict:
    """The sample with the tool offered in its query (``tools=True``) or the question alone."""
    q = bench.QUESTION
    return dict(sample, query=f"{TOOL_HINT}\n{q}" if tools else q)


def write_variants(data_dir: str, splits: Sequence[str] = ("train", "val", "heldout")) -> dict:
    """``{split}_tools.jsonl`` / ``{split}_plain.jsonl`` beside ``{split}.jsonl`` (same relative paths)."""
    out = {}
    for sp in splits:
        src = os.path.join(data_dir, f"{sp}.jsonl")
        if not os.path.exists(src):
            continue
        rows = [json.loads(x) for x in open(src) if x.strip()]
        for tools in (True, False):
            path = os.path.join(data_dir, f"{sp}_{'tools' if tools else 'plain'}.jsonl")
            with open(path, "w") as f:
                for r in rows:
                    f.write(json.dumps(variant(r, tools)) + "\n")
            out[f"{sp}_{'tools' if tools else 'plain'}"] = path
    return out


def tool_call_text(box: Sequence[int]) -> str:
    from mmgrpo.vlm.tools import format_tool_call

    return format_tool_call(TOOL_NAME, {"bbox_2d": [int(v) for v in box]})


def answer_text(letter: str) -> str:
    return f"<answer>{letter}</answer>"


def parse_tool_call(text: str) -> tuple[list[int] | None, str]:
    """(box, status) of the first tool call in ``text``: status ``ok`` | ``none`` (no call) | ``bad_json`` |
    ``bad_args`` (not a crop_source call with 4 numbers)."""
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
    """The letter of the last ``<answer>X</answer>`` of ``text``."""
    m = _ANSWER_RE.findall(text or "")
    return m[-1].upper() if m else None


def tool_context(sample: dict, options: Any = None):
    """The :class:`mmgrpo.vlm.tools.ToolContext` of a sample for :func:`crop_source`: the full-resolution source
    as the image to crop, the view's size as the model-input size (the box frame: view pixels x ``meta.scale``)."""
    from PIL import Image

    from mmgrpo.vlm.tools import ToolContext, ToolsConfig

    src = Image.open(source_path(sample)).convert("RGB")
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


# ------------------------------------------------------------------------------------------------------------
# the trainer's prompt path, SFT traces, evaluation through the multi-turn engine
# ------------------------------------------------------------------------------------------------------------
def task_adapter(processor, **data_kw):
    """The trainer's :class:`~mmgrpo.vlm.data.task.TaskAdapter` for these samples (``data.task=mcq``,
    ``data.prompt_mode=no_think``, other DataConfig fields from ``data_kw``)."""
    from mmgrpo.vlm.config import DataConfig
    from mmgrpo.vlm.data.task import TaskAdapter
    from mmgrpo.vlm.models.adapters import get_adapter

    return TaskAdapter(processor, get_adapter("qwen2_5_vl"), DataConfig(**{"task": "mcq", "prompt_mode": "no_think",
                                                                          **data_kw}))


def _sample_obj(sample: dict):
    from mmgrpo.vlm.data.schema import Sample

    return Sample.from_dict(sample)


def prepare(ta, sample: dict, tools: bool):
    """The trainer's PreparedPrompt of the ``tools`` / plain variant of ``sample``."""
    return ta.prepare(_sample_obj(variant(sample, tools)))


def _example(prompt: dict, target_ids, sample: dict, text: str, target: str):
    import torch

    from mmgrpo.vlm.sft import SFTExample

    return SFTExample(sample=sample, prompt=prompt, answer_ids=torch.tensor(target_ids, dtype=torch.long),
                      prompt_text=text, answer_text=target)


def _target_ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"] + [int(tok.convert_tokens_to_ids("<|im_end|>"))]


def plain_example(ta, sample: dict):
    """SFT example: the plain prompt -> ``<answer>LETTER</answer>``."""
    pp = prepare(ta, sample, False)
    t = answer_text(sample["answer"])
    return _example(pp.item, _target_ids(ta.processor.tokenizer, t), sample, pp.text, t)


def crop_examples(ta, samples: Sequence[dict], out_dir: str) -> list:
    """Single-turn SFT examples that teach the reading of a crop alone: the crop the tool returns for the object's
    cell (written to ``out_dir``) as the prompt image, the plain question -> ``<answer>LETTER</answer>``."""
    os.makedirs(out_dir, exist_ok=True)
    exs = []
    for s in samples:
        res = run_crop(s, s["meta"]["cell_box_view"])
        if not res.ok:
            raise ValueError(f"sample {s['id']}: {res.text}")
        path = os.path.join(out_dir, f"{s['id']}_crop.png")
        res.images[0].save(path)
        exs.append(plain_example(ta, dict(s, image=path, image_size=list(res.images[0].size))))
    return exs


def trace_examples(ta, sample: dict, box_view: Sequence[int] | None = None, renderer: Any = None) -> list:
    """The two SFT examples of a tool trace: (tools prompt -> the call on ``box_view``, default the object's cell),
    (tools prompt + call + the tool turn, encoded as the rollout engine does -> the answer)."""
    import torch

    from mmgrpo.vlm.tools.rollout import ToolTurnRenderer, encode_turn

    proc, tok = ta.processor, ta.processor.tokenizer
    box = list(box_view) if box_view is not None else sample["meta"]["cell_box_view"]
    pp = prepare(ta, sample, True)
    call = tool_call_text(box)
    call_ids = _target_ids(tok, call)
    res = run_crop(sample, box)
    if not res.ok:
        raise ValueError(f"sample {sample['id']}: {res.text}")
    renderer = renderer or ToolTurnRenderer(proc, "auto")
    turn = encode_turn(proc, renderer.text([res]), res.images, (), "qwen2_5_vl", ta.image_size_kwargs())
    item = pp.item
    ids = torch.cat([item["input_ids"].reshape(-1), torch.tensor(call_ids), turn["input_ids"]])
    mm = torch.cat([item["mm_token_type_ids"].reshape(-1), torch.zeros(len(call_ids), dtype=torch.long),
                    turn["mm_token_type_ids"].to(torch.long)])
    second = {"input_ids": ids[None], "attention_mask": torch.ones_like(ids)[None], "mm_token_type_ids": mm[None]}
    for k in ("pixel_values", "image_grid_thw"):
        second[k] = torch.cat([item[k], turn[k]])
    ans = answer_text(sample["answer"])
    return [_example(item, call_ids, sample, pp.text, call),
            _example(second, _target_ids(tok, ans), sample, pp.text + call + "<|im_end|>" +
                     renderer.text([res]), ans)]


def tools_options(**kw):
    """The demo's ``tools.*``: crop_source only, one call, two assistant turns, 200 tokens after the prompt (the
    tool turn included), no instruction appended by the rollout (the tools variant's query offers the tool)."""
    from mmgrpo.vlm.tools import ToolsConfig

    return ToolsConfig(**{"enabled": True, "names": [TOOL_NAME], "max_turns": 2, "max_tool_calls": 1,
                          "max_total_tokens": 200, "instruction": "none", **kw})


def generate(model, ta, samples: Sequence[dict], tools: bool, *, image: bool = True, max_new_tokens: int = 48,
             batch_size: int = 32, greedy: bool = True, options: Any = None):
    """Rollouts of ``samples`` (one each): with ``tools`` through :class:`~mmgrpo.vlm.tools.rollout.MultiTurnBackend`
    around the HF backend (the trainer's engine), else single-turn on the plain prompt (``image=False``: the
    image's tokens removed from the prompt -- the no-image baseline). Returns the RolloutOutput."""
    from mmgrpo.vlm.models.adapters import vision_token_ids
    from mmgrpo.vlm.models.rollout import HFRolloutBackend, SamplingParams

    proc = ta.processor
    backend = HFRolloutBackend(model, proc, suppress_token_ids=vision_token_ids(proc.tokenizer),
                               max_batch_size=batch_size)
    pps = [prepare(ta, s, tools) for s in samples]
    items = [pp.item for pp in pps]
    if not image:
        items = [_without_image(proc, pp.text) for pp in pps]
    raws = [{"sample": pp.sample, "images": pp.images, "clip": None, "text": pp.text} for pp in pps]
    params = SamplingParams(max_new_tokens=max_new_tokens, greedy=greedy)
    if tools:
        from mmgrpo.vlm.tools.rollout import MultiTurnBackend

        backend = MultiTurnBackend(backend, proc, options or tools_options(), "qwen2_5_vl", ta.image_size_kwargs())
    return backend.generate(items, 1, params, raw_prompts=raws)


def _without_image(proc, text: str) -> dict:
    import torch

    t = text.replace("<|vision_start|><|image_pad|><|vision_end|>", "")
    return {k: v for k, v in dict(proc(text=[t], return_tensors="pt")).items() if isinstance(v, torch.Tensor)}


def evaluate(model, processor, samples: Sequence[dict], batch_size: int = 32, ta: Any = None,
             baselines: bool = True) -> dict:
    """Greedy accuracies (percent) on ``samples``:

    * ``tools``: the tools prompt through the multi-turn engine; ``call_rate``, ``cell_hit_rate`` (a call whose box
      covers the object), ``acc_called`` / ``acc_not_called`` (accuracy on the samples where the tool was / was not
      called), ``tool_failures``, ``turns`` (mean);
    * ``plain``: the plain prompt (one turn); ``no_image``: the plain prompt without the image (``baselines``).
    """
    import torch

    ta = ta or task_adapter(processor)
    res: dict[str, Any] = {"n": len(samples)}
    with torch.no_grad():
        out = generate(model, ta, samples, True, batch_size=batch_size)
        letters = [parse_letter(t) for t in out.texts]
        info = out.turn_info
        called = [i["tool_calls"] > 0 and i["tool_failures"] == 0 for i in info]
        hits = []
        for s, i in zip(samples, info):
            box, st = parse_tool_call(i["turn_texts"][0]) if i["turn_texts"] else (None, "none")
            ob = [v // int(s["meta"]["scale"]) for v in s["meta"]["object_box_source"]]
            hits.append(st == "ok" and box[0] <= ob[0] and box[1] <= ob[1] and box[2] >= ob[2] and box[3] >= ob[3])
        sub = lambda flag: [s for s, c in zip(samples, called) if c == flag]  # noqa: E731
        subl = lambda flag: [a for a, c in zip(letters, called) if c == flag]  # noqa: E731
        res.update(tools=score(letters, samples), call_rate=100.0 * sum(called) / max(1, len(samples)),
                   cell_hit_rate=100.0 * sum(hits) / max(1, len(samples)),
                   acc_called=score(subl(True), sub(True)), acc_not_called=score(subl(False), sub(False)),
                   tool_failures=sum(i["tool_failures"] for i in info),
                   turns=sum(i["turns"] for i in info) / max(1, len(info)))
        res["trajectories"] = [{"id": s["id"], "answer": s["answer"], "turn_texts": i["turn_texts"],
                                "tool_calls": i["tool_calls"], "tool_failures": i["tool_failures"]}
                               for s, i in zip(samples, info)]
        if baselines:
            res["plain"] = score([parse_letter(t) for t in generate(model, ta, samples, False,
                                                                    batch_size=batch_size).texts], samples)
            res["no_image"] = score([parse_letter(t) for t in generate(model, ta, samples, False, image=False,
                                                                       batch_size=batch_size).texts], samples)
    return res


def score(letters: Sequence[str | None], samples: Sequence[dict]) -> float:
    """Accuracy (percent) of the parsed letters against the samples' answers (unparsed = wrong)."""
    if not samples:
        return float("nan")
    return 100.0 * sum(a is not None and a == s["answer"] for a, s in zip(letters, samples)) / len(samples)


def crop_swap_probe(model, ta, samples: Sequence[dict], batch_size: int = 16) -> dict:
    """Does the answer come from the crop? The written trace (prompt, the call, the tool turn) is fed with the crop
    of the object's cell (``own``) or of another cell (``other``: the next cell to the right, wrapping; no object in
    it), and the model's letter after ``<answer>`` is read greedily (argmax over A-F). Percent correct per
    condition: with the answer only in the crop, ``own`` stays high and ``other`` falls to chance."""
    import dataclasses

    import torch

    from mmgrpo.vlm.sft import collate_sft

    tok = ta.processor.tokenizer
    letters = [tok(x, add_special_tokens=False)["input_ids"][0] for x in bench.LETTERS]
    res = {}
    for cond in ("own", "other"):
        right = 0
        for i in range(0, len(samples), batch_size):
            chunk, exs = samples[i:i + batch_size], []
            for s in chunk:
                box = list(s["meta"]["cell_box_view"])
                if cond == "other":
                    side, n = box[2] - box[0], s["image_size"][0]
                    box = [(box[0] + side) % n, box[1], (box[0] + side) % n + side, box[3]]
                ex = trace_examples(ta, s, box)[1]
                exs.append(dataclasses.replace(ex, answer_ids=ex.answer_ids[:1]))  # up to "<answer>"
            batch, _ = collate_sft(exs, tok.pad_token_id, "left")
            with torch.no_grad():
                logits = model(**batch, use_cache=False).logits[:, -1, letters]
            right += sum(bench.LETTERS[int(k)] == s["answer"] for k, s in zip(logits.argmax(-1), chunk))
        res[cond] = 100.0 * right / max(1, len(samples))
    return res
