"""Multi-turn tool rollouts: the policy generates, its tool calls run, each result is appended as a tool turn and
generation continues, until an answer or a budget. A :class:`~mmgrpo.vlm.models.rollout.RolloutBackend` that wraps
another one (HF generate or vLLM), so the trainer's step, the validation and ``eval/generate_vlm.py`` call it as
they call any backend.

One rollout row, in tokens (P = the first prompt, shared by the group)::

    [prompt P] [policy turn 1 ... <|im_end|>] [\\n<|im_start|>user\\n<tool_response>\\n<image>...</tool_response>
    <|im_end|>\\n<|im_start|>assistant\\n] [policy turn 2 ... <|im_end|>] ...

* **Token-exact**: the sequence is the concatenation of token ids -- the prompt item's ids, each policy turn's
  sampled ids (never decoded and re-tokenised), and each tool turn's ids from the processor. The tool turn's text is
  what the processor's chat template renders after an assistant message (:class:`ToolTurnRenderer`), its media go
  through the processor's image path / the video contract (:func:`mmgrpo.video.build_video_inputs`), so MRoPE
  positions of the new media are computed by the model from ``mm_token_type_ids`` and the grids, as for the first
  turn.
* **Training row** (``RolloutOutput.items[r]``, ``completion_ids``, ``loss_mask``): the prompt item whose pixel
  tensors are extended with every tool turn's media (in token order), the completion = everything after the prompt,
  ``completion_mask`` = every real token (attention), ``loss_mask`` = the policy's sampled tokens only (tool-turn
  and template tokens are 0); ``logprobs`` are the engine's for policy tokens and 0 elsewhere.
  :func:`mmgrpo.vlm.models.rollout.compute_token_logprobs` marks the completion's vision tokens in
  ``mm_token_type_ids``, so the trainer's forward places the new media where the rollout did.
* **Budgets** (``tools.*``): ``max_turns`` assistant turns, ``max_tool_calls`` calls (calls beyond are refused and
  counted), ``max_visual_tokens`` vision tokens added by tool turns (media beyond are refused and counted),
  ``max_total_tokens`` tokens after the prompt (each turn generates at most what is left, and at most
  ``rollout.max_new_tokens``). A turn that answers (``tools.answer_pattern``) or makes no call ends the rollout;
  a turn cut by its token limit (no EOS) ends it as truncated.
* **Seeds**: turn 0 samples row r with ``seeds[r]`` (a rollout whose first turn answers is the single-turn sample,
  token for token); turn k >= 1 with ``sample_seed(seeds[r], k)``. Everything is a function of (weights, seeds,
  sample), so a resumed run samples the same trajectories.
* **Prefix sharing**: the first turn goes to the wrapped backend as one prompt with G generations (the HF backend
  prefills it once); later turns are one prompt per row (their histories differ). With the HF backend
  (``tools.reuse_kv``) each row continues from its cache of the earlier turns and prefills only the new tokens
  (:mod:`mmgrpo.vlm.models.turn_cache`); other backends prefill the whole conversation. ``turn_info`` counts the
  later turns' ``later_prefill_tokens`` and ``later_reused_tokens``.
* Per row ``RolloutOutput.turn_info[r]``: turns, tool calls, failed calls, vision tokens added, policy and tool
  tokens, the policy turns' texts and the tool names called. ``texts[r]`` is the LAST policy turn (the answer: what
  the rewards and the evaluation's scorer read, so single-turn answer / format rewards apply unchanged; the earlier
  turns are in ``turn_info[r]["turn_texts"]``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from mmgrpo.utils.seeding import sample_seed
from mmgrpo.vlm.models.adapters import get_adapter
from mmgrpo.vlm.models.rollout import CAT_KEYS, RolloutBackend, RolloutOutput, SamplingParams
from mmgrpo.vlm.tools.base import ToolContext, ToolResult, call_tool
from mmgrpo.vlm.tools.parse import get_call_format

__all__ = ["ToolTurnRenderer", "MultiTurnBackend", "ScriptedTurns", "encode_turn", "tool_context", "turn_spans"]

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>"
_MARK = "\u2063mmgrpo-turn-end\u2063"  # an assistant content no template alters


def turn_spans(loss_mask_row: torch.Tensor) -> list[tuple[int, int]]:
    """[start, end) of each run of 1s in a row's loss mask: one policy turn each (tool turns are the 0 runs)."""
    m = loss_mask_row.long().tolist() + [0]
    out, start = [], None
    for t, v in enumerate(m):
        if v and start is None:
            start = t
        elif not v and start is not None:
            out.append((start, t))
            start = None
    return out


class ToolTurnRenderer:
    """The text of a tool turn as the processor's chat template renders it, from the end of the assistant's
    end-of-turn token to the next assistant generation prompt.

    Found by rendering ``[user, assistant(MARK)]`` and ``[user, assistant(MARK), tool turn]`` (with the generation
    prompt) and taking the difference; the text between MARK and the end of the first rendering must start with
    the end-of-turn token the policy samples (``<|im_end|>``), which the policy turn already holds. ``role``:
    ``user`` renders the results as a user turn with one ``<tool_response>`` block per call (the Qwen2.5 text
    template's rendering of tool messages); ``tool`` hands ``{"role": "tool"}`` messages to the template (one per
    call); ``auto`` picks ``tool`` if the template has a tool branch."""

    def __init__(self, processor, role: str = "auto"):
        self.processor = processor
        tmpl = getattr(processor, "chat_template", None) or getattr(getattr(processor, "tokenizer", None),
                                                                    "chat_template", None) or ""
        if role == "auto":
            role = "tool" if ("'tool'" in tmpl or '"tool"' in tmpl) else "user"
        if role not in ("tool", "user"):
            raise ValueError(f"tools.tool_role must be auto, tool or user, got {role!r}")
        self.role = role
        base = [{"role": "user", "content": [{"type": "text", "text": "q"}]},
                {"role": "assistant", "content": [{"type": "text", "text": _MARK}]}]
        first = self._render(base, False)
        after = first[first.rindex(_MARK) + len(_MARK):]
        self.eot = after.rstrip("\n")  # the end-of-turn token text (<|im_end|>)
        self._base, self._first, self._glue = base, first, after[len(self.eot):]

    def _render(self, msgs, gen: bool) -> str:
        return self.processor.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)

    def messages(self, results: Sequence[ToolResult]) -> list[dict]:
        def media(r):
            return [{"type": "image"} for _ in r.images] + [{"type": "video"} for _ in r.clips]

        if len(results) == 1 and results[0].content is not None:  # a fixed template's own user turn (MGPO's)
            return [{"role": "user", "content": list(results[0].content)}]
        if self.role == "tool":
            return [{"role": "tool", "content": media(r) + [{"type": "text", "text": r.text}]} for r in results]
        content = []
        for i, r in enumerate(results):
            content.append({"type": "text", "text": ("\n" if i else "") + "<tool_response>\n"})
            content += media(r)
            content.append({"type": "text", "text": r.text + "\n</tool_response>"})
        return [{"role": "user", "content": content}]

    def text(self, results: Sequence[ToolResult]) -> str:
        """The tool turn's text after the policy's end-of-turn token (placeholders: one per image / video)."""
        full = self._render(self._base + self.messages(results), True)
        if not full.startswith(self._first):
            raise ValueError("the chat template renders an earlier turn differently once a tool turn follows; "
                             "multi-turn rollouts need a template whose turns are appended (ChatML)")
        return self._glue + full[len(self._first):]


def _placeholder_pieces(text: str) -> list[str]:
    """``text`` cut after every ``<|vision_end|>`` (a special token: tokenisation never crosses it), so each piece
    holds at most one media placeholder."""
    out, rest = [], text
    while "<|vision_end|>" in rest:
        i = rest.index("<|vision_end|>") + len("<|vision_end|>")
        out.append(rest[:i])
        rest = rest[i:]
    if rest:
        out.append(rest)
    return out


def encode_turn(processor, text: str, images: Sequence = (), clips: Sequence = (), family: str = "qwen2_5_vl",
                image_kwargs: dict | None = None) -> dict[str, torch.Tensor]:
    """Token ids (L,), ``mm_token_type_ids`` (L,) and the media tensors of one tool turn's text, its images
    through the processor's image path and its clips through the video contract (piece by piece, one medium
    each; ``build_video_inputs`` checks every clip's time axis)."""
    from mmgrpo.video.processor import build_video_inputs

    video_time = get_adapter(family).video_time
    imgs, vids = list(images), list(clips)
    ids, mm, media = [], [], {k: [] for k in CAT_KEYS}
    for piece in _placeholder_pieces(text):
        if IMAGE_PLACEHOLDER in piece:
            out = processor(text=[piece], images=[imgs.pop(0)], return_tensors="pt", **(image_kwargs or {}))
        elif VIDEO_PLACEHOLDER in piece:
            out = build_video_inputs(processor, vids.pop(0), piece, family, video_time=video_time)
        else:
            out = processor(text=[piece], return_tensors="pt")
        x = out["input_ids"].reshape(-1)
        ids.append(x)
        t = out.get("mm_token_type_ids")
        mm.append(t.reshape(-1).to(x.dtype) if t is not None else torch.zeros_like(x))
        for k in CAT_KEYS:
            if out.get(k) is not None:
                media[k].append(torch.as_tensor(out[k]))
    if imgs or vids:
        raise ValueError(f"tool turn text has fewer placeholders than media ({len(imgs)} images, {len(vids)} "
                         "videos left)")
    res = {"input_ids": torch.cat(ids), "mm_token_type_ids": torch.cat(mm)}
    res.update({k: torch.cat(v) for k, v in media.items() if v})
    return res


def tool_context(raw: dict, item: dict, family: str, image_factor: int, options) -> ToolContext:
    """The :class:`ToolContext` of one prompt: its raw media (``raw_prompts`` entry) and model-input image sizes
    (from ``image_grid_thw``: W_r = grid_w * patch)."""
    patch = image_factor // 2
    sizes = []
    if "image_grid_thw" in item:
        sizes = [(int(g[2]) * patch, int(g[1]) * patch) for g in item["image_grid_thw"]]
    return ToolContext(sample=raw.get("sample"), images=list(raw.get("images") or []), clip=raw.get("clip"),
                       family=family, resized_sizes=sizes, image_factor=image_factor, options=options)


@dataclass
class _Row:
    """One trajectory being built."""

    prompt: int  # index of its prompt
    seed: int | None
    segs: list = field(default_factory=list)  # dicts: ids (L,), mm (L,), policy (bool), lp (L,), media {key: T}
    images: list = field(default_factory=list)  # tool images (PIL), token order (for engines with own processor)
    clips: list = field(default_factory=list)
    info: dict = field(default_factory=lambda: {"turns": 0, "tool_calls": 0, "tool_failures": 0,
                                                "visual_tokens": 0, "policy_tokens": 0, "tool_tokens": 0,
                                                "tools_called": [], "turn_texts": [], "stop": ""})
    done: bool = False
    truncated: bool = False
    kv: Any = None  # the HF backend's cache of this row's conversation so far (mmgrpo.vlm.models.turn_cache)

    @property
    def length(self) -> int:
        return sum(int(s["ids"].numel()) for s in self.segs)


class MultiTurnBackend(RolloutBackend):
    """Multi-turn tool rollouts around ``inner`` (see the module docstring).

    ``raw_prompts`` are required: per prompt ``{"sample", "images" (full-resolution PIL), "clip"}`` -- the facts
    the tools read. ``options``: a :class:`~mmgrpo.vlm.tools.config.ToolsConfig`; ``family``: the model family
    (box frame, video contract); ``image_kwargs``: the run's image pixel bounds (``TaskAdapter.image_size_kwargs``).
    """

    def __init__(self, inner: RolloutBackend, processor, options, family: str = "qwen2_5_vl",
                 image_kwargs: dict | None = None, eos_ids: Sequence[int] | None = None):
        self.inner, self.processor, self.options, self.family = inner, processor, options, family
        if hasattr(options, "import_modules"):
            options.import_modules()  # tools.modules (user tools registered on import), as the config check does
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.image_kwargs = dict(image_kwargs or {})
        self.renderer = ToolTurnRenderer(processor, options.tool_role)
        ip = processor.image_processor
        self.image_factor = int(ip.patch_size) * int(getattr(ip, "merge_size", 2))
        self.eot_id = self.tokenizer.convert_tokens_to_ids(self.renderer.eot)
        self.vision_ids = {i for i in (self.tokenizer.convert_tokens_to_ids(t) for t in ("<|image_pad|>",
                                                                                          "<|video_pad|>"))
                           if i is not None}
        self.allowed = list(options.names)
        self.format = get_call_format(options.call_format)
        instr = options.instruction
        if instr == "auto":
            instr = self.format.instruction(self.allowed, family)
        self.instruction = "" if instr in ("", "none") else instr

    def with_prefix(self, item: dict) -> dict:
        """The prompt item with ``tools.generation_prefix`` tokens appended after its generation prompt (template
        tokens: part of the prompt); the item itself when there is none."""
        pre = self.options.generation_prefix
        if not pre:
            return item
        ids = item["input_ids"].reshape(-1)
        ins = torch.tensor(self.tokenizer(pre, add_special_tokens=False)["input_ids"], dtype=ids.dtype)
        out = dict(item)
        for key in ("input_ids", "attention_mask", "mm_token_type_ids"):
            if key in item:
                x = item[key].reshape(-1)
                fill = ins if key == "input_ids" else torch.full_like(ins, int(key == "attention_mask"))
                out[key] = torch.cat([x, fill.to(x.dtype)])[None]
        return out

    def with_instruction(self, item: dict) -> dict:
        """The prompt item with ``"\n" + instruction`` tokens inserted before the end of its last user turn (the
        last end-of-turn token); the item itself when there is no instruction."""
        if not self.instruction:
            return item
        ids = item["input_ids"].reshape(-1)
        ends = (ids == self.eot_id).nonzero().flatten()
        if not ends.numel():
            raise ValueError("tools.instruction: the prompt has no end-of-turn token to insert the instruction before")
        k = int(ends[-1])
        ins = torch.tensor(self.tokenizer("\n" + self.instruction, add_special_tokens=False)["input_ids"],
                           dtype=ids.dtype)
        out = dict(item)
        for key in ("input_ids", "attention_mask", "mm_token_type_ids"):
            if key in item:
                x = item[key].reshape(-1)
                fill = ins if key == "input_ids" else torch.full_like(ins, int(key == "attention_mask"))
                out[key] = torch.cat([x[:k], fill.to(x.dtype), x[k:]])[None]
        return out

    def __getattr__(self, name):  # step_hook, model, ... of the wrapped backend
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def sync_weights(self, model) -> None:
        self.inner.sync_weights(model)

    # ------------------------------------------------------------------------------------------- generate
    def generate(self, prompts, num_generations, params, seeds=None, raw_prompts=None) -> RolloutOutput:
        if raw_prompts is None or len(raw_prompts) != len(prompts):
            raise ValueError("multi-turn rollouts need raw_prompts (sample, images, clip) for every prompt")
        G, o = int(num_generations), self.options
        budget = o.max_total_tokens or o.max_turns * params.max_new_tokens
        ctxs = [tool_context(rp, it, self.family, self.image_factor, o) for rp, it in zip(raw_prompts, prompts)]
        prompts = [self.with_prefix(self.with_instruction(it)) for it in prompts]
        rows = [_Row(i, None if seeds is None else int(seeds[i * G + g])) for i in range(len(prompts))
                for g in range(G)]
        reuse = bool(getattr(o, "reuse_kv", False)) and bool(getattr(self.inner, "supports_turn_cache", False))
        kw = {"keep_state": True} if reuse and o.max_turns > 1 else {}
        first = self.inner.generate(prompts, G, params, seeds=seeds, raw_prompts=raw_prompts, **kw)
        self._take(rows, list(range(len(rows))), first)
        for turn in range(1, o.max_turns + 1):
            live = [r for r, row in enumerate(rows) if not row.done]
            for r in live:
                self._act(rows[r], ctxs[rows[r].prompt], turn, budget)
            live = [r for r in live if not rows[r].done]
            if not live:
                break
            # each row generates at most what its own budget leaves: one call per distinct limit
            limit = {r: max(1, min(params.max_new_tokens, budget - rows[r].length)) for r in live}
            for n in sorted(set(limit.values()), reverse=True):
                part = [r for r in live if limit[r] == n]
                items = [self._item(prompts[rows[r].prompt], rows[r]) for r in part]
                raws = [self._raw(raw_prompts[rows[r].prompt], rows[r]) for r in part]
                for r, raw in zip(part, raws):  # which prompt and turn this row is at (ScriptedTurns reads them)
                    raw["prompt_index"], raw["turn"] = rows[r].prompt, rows[r].info["turns"]
                rs = None if seeds is None else [sample_seed(rows[r].seed, turn) for r in part]
                sp = dataclasses.replace(params, max_new_tokens=n)
                if reuse and all(rows[r].kv is not None for r in part):  # continue from the rows' caches
                    from mmgrpo.vlm.models.turn_cache import continue_generate

                    out = continue_generate(self.inner, items, [rows[r].kv for r in part], sp, rs)
                else:  # prefill whole (and keep the caches when the backend can)
                    kw = {"keep_state": True} if reuse else {}
                    out = self.inner.generate(items, 1, sp, seeds=rs, raw_prompts=raws, **kw)
                for j, r in enumerate(part):  # prefill accounting of the later turns
                    n_item = int(items[j]["input_ids"].numel())
                    ru = int(out.reused_tokens[j]) if out.reused_tokens is not None else 0
                    rows[r].info["later_prefill_tokens"] = rows[r].info.get("later_prefill_tokens", 0) + n_item - ru
                    rows[r].info["later_reused_tokens"] = rows[r].info.get("later_reused_tokens", 0) + ru
                self._take(rows, part, out)
        for row in rows:
            row.kv = None
        return self._output(prompts, rows, G)

    def _take(self, rows: list[_Row], which: list[int], out: RolloutOutput) -> None:
        """Append each sampled turn (ids up to and including EOS) as a policy segment (and keep the row's cache
        when the backend returned one)."""
        for j, r in enumerate(which):
            row = rows[r]
            row.kv = out.kv_states[j] if out.kv_states is not None else None
            n = int(out.completion_mask[j].sum())
            ids = out.completion_ids[j, :n].clone()
            lp = (out.logprobs[j, :n].float().clone() if out.logprobs is not None else torch.zeros(n))
            row.segs.append({"ids": ids, "mm": torch.zeros_like(ids), "policy": True, "lp": lp, "media": {}})
            row.info["turns"] += 1
            row.info["policy_tokens"] += n
            row.info["turn_texts"].append(out.texts[j])
            if bool(out.truncated[j]) or n == 0:
                row.done, row.truncated, row.info["stop"] = True, True, "turn_token_limit"
            elif int(ids[-1]) != self.eot_id:
                row.done, row.info["stop"] = True, "eos"  # ended by another EOS (e.g. <|endoftext|>): no turn follows
            if row.done:
                row.kv = None

    def _act(self, row: _Row, ctx: ToolContext, turn: int, budget: int) -> None:
        """Run the last policy turn's tool calls and append the tool turn, or end the row."""
        o = self.options
        text = row.info["turn_texts"][-1]
        if self.format.cut is not None:
            self._cut(row, self.format.cut(text, turn))
        calls = self.format.parse(text, turn)
        if o.answer_pattern and o.answer_pattern in text:
            row.done, row.info["stop"] = True, "answer"
            return
        if not calls:
            row.done, row.info["stop"] = True, "no_call"
            return
        if turn >= o.max_turns:
            row.done, row.info["stop"] = True, "max_turns"
            return
        results = []
        for c in calls:
            if c.error:  # malformed block: a failed call, not counted against the call budget
                res = ToolResult(text=f"Error: {c.error}", ok=False)
            elif row.info["tool_calls"] >= o.max_tool_calls:
                res = ToolResult(text=f"Error: tool call budget of {o.max_tool_calls} calls is used up; answer now",
                                 ok=False, name=c.name)
            else:
                row.info["tool_calls"] += 1
                row.info["tools_called"].append(c.name)
                res = call_tool(c.name, ctx, c.arguments, self.allowed)
            row.info["tool_failures"] += int(not res.ok)
            results.append(res)
        seg = self._encode(results)
        n_vis = int(torch.isin(seg["input_ids"], torch.tensor(sorted(self.vision_ids))).sum())
        while o.max_visual_tokens and row.info["visual_tokens"] + n_vis > o.max_visual_tokens:
            with_media = [i for i, r in enumerate(results) if r.images or r.clips]
            if not with_media:
                break
            k = with_media[-1]  # refuse the last media first
            results[k] = ToolResult(text=f"Error: the visual token budget of {o.max_visual_tokens} tokens per "
                                         "rollout is used up", ok=False, name=results[k].name)
            row.info["tool_failures"] += 1
            seg = self._encode(results)
            n_vis = int(torch.isin(seg["input_ids"], torch.tensor(sorted(self.vision_ids))).sum())
        n = int(seg["input_ids"].numel())
        if row.length + n >= budget:  # no room for the tool turn and a token of answer
            row.done, row.info["stop"] = True, "token_budget"
            return
        row.segs.append({"ids": seg["input_ids"], "mm": seg["mm_token_type_ids"], "policy": False,
                         "lp": torch.zeros(n), "media": {k: seg[k] for k in CAT_KEYS if k in seg}})
        row.images += [im for r in results for im in r.images]
        row.clips += [c for r in results for c in r.clips]
        row.info["visual_tokens"] += n_vis
        row.info["tool_tokens"] += n

    def _cut(self, row: _Row, end: int | None) -> None:
        """End the last policy turn at character ``end`` of its text: keep the sampled tokens up to the first one
        whose decoded prefix reaches ``end`` (never re-tokenised) and close the turn with the end-of-turn token,
        a template token (loss 0: it was not sampled there). Nothing happens when the turn already ends there."""
        seg = row.segs[-1]
        ids, text = seg["ids"], row.info["turn_texts"][-1]
        if end is None or end >= len(text.rstrip()):
            return
        lo, hi = 1, int(ids.numel())  # smallest k with len(decode(ids[:k])) >= end (decoded length grows with k)
        while lo < hi:
            k = (lo + hi) // 2
            if len(self.tokenizer.decode(ids[:k].tolist())) >= end:
                hi = k
            else:
                lo = k + 1
        if lo >= int(ids.numel()) - 1:
            return
        kept = ids[:lo]
        row.info["policy_tokens"] -= int(ids.numel()) - lo
        row.info["turn_texts"][-1] = self.tokenizer.decode(kept.tolist())
        row.segs[-1] = dict(seg, ids=kept, mm=seg["mm"][:lo], lp=seg["lp"][:lo])
        eot = torch.tensor([self.eot_id], dtype=ids.dtype)
        row.segs.append({"ids": eot, "mm": torch.zeros_like(eot), "policy": False, "lp": torch.zeros(1), "media": {}})
        row.info["tool_tokens"] += 1
        row.info["cut_tokens"] = row.info.get("cut_tokens", 0) + int(ids.numel()) - lo

    def _encode(self, results: list[ToolResult]) -> dict:
        if self.format.result_suffix and results[-1].ok:  # the fixed template's text follows a served call
            results = results[:-1] + [dataclasses.replace(results[-1], text=results[-1].text + "\n"
                                                          + self.format.result_suffix)]
        text = self.renderer.text(results) + self.options.generation_prefix
        return encode_turn(self.processor, text, [im for r in results for im in r.images],
                           [c for r in results for c in r.clips], self.family, self.image_kwargs)

    # ------------------------------------------------------------------------------------------- items
    @staticmethod
    def _media(prompt_item: dict, row: _Row) -> dict:
        out = {}
        for k in CAT_KEYS:
            vals = ([prompt_item[k]] if prompt_item.get(k) is not None else []) + \
                   [s["media"][k] for s in row.segs if k in s["media"]]
            if vals:
                out[k] = torch.cat([v.reshape(-1) if v.dim() == 0 else v for v in vals])
        return out

    def _item(self, prompt_item: dict, row: _Row) -> dict:
        """The whole conversation so far as one prompt item (batch dim 1): the next turn's prompt."""
        p_ids = prompt_item["input_ids"].reshape(-1)
        ids = torch.cat([p_ids] + [s["ids"].to(p_ids.dtype) for s in row.segs])
        item = {"input_ids": ids[None], "attention_mask": torch.ones_like(ids)[None]}
        if "mm_token_type_ids" in prompt_item:
            pm = prompt_item["mm_token_type_ids"].reshape(-1)
            item["mm_token_type_ids"] = torch.cat([pm] + [s["mm"].to(pm.dtype) for s in row.segs])[None]
        item.update(self._media(prompt_item, row))
        return item

    @staticmethod
    def _raw(raw: dict, row: _Row) -> dict:
        out = dict(raw)
        out["images"] = list(raw.get("images") or []) + row.images
        clips = ([raw["clip"]] if raw.get("clip") is not None else []) + row.clips
        out["clips"] = clips
        return out

    def _output(self, prompts, rows: list[_Row], G: int) -> RolloutOutput:
        pad = self.tokenizer.pad_token_id
        T = max(1, max(r.length for r in rows))
        N = len(rows)
        ids = torch.full((N, T), pad, dtype=torch.long)
        mask = torch.zeros(N, T, dtype=torch.long)
        loss = torch.zeros(N, T, dtype=torch.long)
        lps = torch.zeros(N, T)
        items, texts, infos = [], [], []
        for r, row in enumerate(rows):
            t = 0
            for s in row.segs:
                n = int(s["ids"].numel())
                ids[r, t:t + n] = s["ids"]
                mask[r, t:t + n] = 1
                loss[r, t:t + n] = int(s["policy"])
                lps[r, t:t + n] = s["lp"]
                t += n
            items.append({**prompts[row.prompt], **self._media(prompts[row.prompt], row)})
            texts.append(row.info["turn_texts"][-1])
            infos.append(row.info)
        return RolloutOutput(completion_ids=ids, completion_mask=mask, texts=texts,
                             truncated=torch.tensor([r.truncated for r in rows]), logprobs=lps * loss,
                             prompt_index=torch.tensor([r.prompt for r in rows]), loss_mask=loss, items=items,
                             turn_info=infos)



class ScriptedTurns(RolloutBackend):
    """A backend that "samples" written turns: the first call returns ``turns[i][0]`` for every generation of prompt
    i, a later call ``turns[i][k]`` for a row of prompt i at its turn k (``raw_prompts[j]["prompt_index"]`` /
    ``["turn"]``, which :class:`MultiTurnBackend` passes), each tokenised + the end-of-turn token, no log-probs.
    Wrapped in :class:`MultiTurnBackend` it turns written tool traces into training rows -- the tools really run, the
    tool turns come from the processor, ``loss_mask`` covers the written turns: e.g. SFT targets for a cold start on
    tool use, or trajectories for a test. A trace shorter than the rollout repeats its last turn."""

    def __init__(self, tokenizer, turns: Sequence[Sequence[str]], eot: str = "<|im_end|>"):
        self.tokenizer, self.turns = tokenizer, [list(t) for t in turns]
        self.eot_id = tokenizer.convert_tokens_to_ids(eot)
        if any(not t for t in self.turns):
            raise ValueError("ScriptedTurns: every trace needs at least one turn")

    def generate(self, prompts, num_generations, params, seeds=None, raw_prompts=None) -> RolloutOutput:
        G = int(num_generations)
        rps = list(raw_prompts or [{}] * len(prompts))
        picks = [(rp.get("prompt_index", i), rp.get("turn", 0)) for i, rp in enumerate(rps) for _ in range(G)]
        texts = [self.turns[i][min(k, len(self.turns[i]) - 1)] for i, k in picks]
        seqs = [self.tokenizer(t, add_special_tokens=False)["input_ids"] + [self.eot_id] for t in texts]
        T = max(map(len, seqs))
        ids = torch.full((len(seqs), T), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros(len(seqs), T, dtype=torch.long)
        for r, x in enumerate(seqs):
            ids[r, :len(x)], mask[r, :len(x)] = torch.tensor(x), 1
        return RolloutOutput(ids, mask, texts, torch.zeros(len(seqs), dtype=torch.bool), None,
                             torch.arange(len(prompts)).repeat_interleave(G))
