"""The think-or-not benchmark (:mod:`mmgrpo.synthetic.think_or_not`) on the VLM side: SFT targets with TON's thought
dropout, prompts with a forced mode, and greedy evaluation per question kind and mode.

* **Prompts**: the trainer's own (``data.task=mcq``, ``data.prompt_mode=hybrid``: "think first when it helps, else
  answer directly"), so SFT, GRPO and evaluation see the same tokens.
* **Targets** (:func:`target_text`): ``<think>THOUGHT</think><answer>L</answer>`` or, skipping,
  TON's empty thought ``<think>\\n\\n</think><answer>L</answer>``.
* **Thought dropout** (:func:`sft_examples`, TON's SFT stage): each training example's thought is replaced by the
  empty one with probability ``dropout``, independently of its kind (0: the usual always-think cold start).
* **Evaluation** (:func:`evaluate`): greedy, per kind: free (the model chooses; ``think_ratio``, mean completion
  length, accuracy), forced think (the prompt ends with ``<think>`` and newline tokens are suppressed, so the thought
  cannot be the empty one) and forced skip (the prompt ends with the empty thought).
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Sequence

from mmgrpo.synthetic import think_or_not as bench

SKIP_THOUGHT = "<think>\n\n</think>"
_ANSWER_RE = re.compile(r"<answer>\s*([A-Za-z])\s*</answer>", re.I)


def load_split(path: str) -> list[dict]:
    """The JSONL rows of a split with ``image`` made absolute (relative to the file)."""
    base = os.path.dirname(os.path.abspath(path))
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    for r in rows:
        r["image"] = os.path.join(base, r["image"])
    return rows


def target_text(sample: dict, think: bool) -> str:
    t = f"<think>{sample['meta']['thought']}</think>" if think else SKIP_THOUGHT
    return f"{t}<answer>{sample['answer']}</answer>"


def parse_letter(text: str) -> str | None:
    m = _ANSWER_RE.findall(text or "")
    return m[-1].upper() if m else None


def task_adapter(processor, **data_kw):
    """The trainer's :class:`~mmgrpo.vlm.data.task.TaskAdapter` (``data.task=mcq``, ``data.prompt_mode=hybrid``)."""
    from mmgrpo.vlm.config import DataConfig
    from mmgrpo.vlm.data.task import TaskAdapter
    from mmgrpo.vlm.models.adapters import get_adapter

    return TaskAdapter(processor, get_adapter("qwen2_5_vl"),
                       DataConfig(**{"task": "mcq", "prompt_mode": "hybrid", **data_kw}))


def prepare(ta, sample: dict, prefix: str = ""):
    """(prompt item, prompt text) of ``sample``; ``prefix`` is appended to the assistant turn (a forced mode)."""
    import torch

    from mmgrpo.vlm.data.schema import Sample

    pp = ta.prepare(Sample.from_dict(sample))
    item = dict(pp.item)
    if prefix:
        ids = torch.tensor(ta.processor.tokenizer(prefix, add_special_tokens=False)["input_ids"], dtype=torch.long)
        item["input_ids"] = torch.cat([item["input_ids"].reshape(-1), ids])[None]
        item["attention_mask"] = torch.ones_like(item["input_ids"])
        item["mm_token_type_ids"] = torch.cat([item["mm_token_type_ids"].reshape(-1), torch.zeros_like(ids)])[None]
    return item, pp.text + prefix


def dropped(n: int, dropout: float, seed: int = 0) -> list[bool]:
    """TON's thought dropout for ``n`` examples: independent draws, True (drop the thought) with probability
    ``dropout``; deterministic in ``seed``."""
    import numpy as np

    if not 0.0 <= dropout <= 1.0:
        raise ValueError(f"think_or_not: thought dropout must be in [0, 1], got {dropout}")
    return (np.random.default_rng([int(seed), 7]).random(n) < dropout).tolist()


def sft_examples(ta, samples: Sequence[dict], dropout: float, seed: int = 0) -> list:
    """One SFT example per sample; its thought dropped (TON's empty thought) as :func:`dropped` draws."""
    import torch

    from mmgrpo.vlm.sft import SFTExample

    drop = dropped(len(samples), dropout, seed)
    tok = ta.processor.tokenizer
    eos = int(tok.convert_tokens_to_ids("<|im_end|>"))
    out = []
    for s, d in zip(samples, drop):
        item, text = prepare(ta, s)
        t = target_text(s, think=not d)
        ids = tok(t, add_special_tokens=False)["input_ids"] + [eos]
        out.append(SFTExample(sample=s, prompt=item, answer_ids=torch.tensor(ids, dtype=torch.long), prompt_text=text,
                              answer_text=t))
    return out


def newline_token_ids(tok) -> list[int]:
    """Ids of every token whose text holds a newline. The empty thought starts ``<think>\n``; no thought or answer
    of this benchmark holds one, so suppressing these after a forced ``<think>`` forces a non-empty thought."""
    return [i for t, i in tok.get_vocab().items() if "\n" in tok.convert_tokens_to_string([t])]


def _generate(model, proc, items: list, max_new_tokens: int, batch_size: int, no_newline: bool = False):
    from mmgrpo.vlm.models.adapters import vision_token_ids
    from mmgrpo.vlm.models.rollout import HFRolloutBackend, SamplingParams

    suppress = list(vision_token_ids(proc.tokenizer)) + (newline_token_ids(proc.tokenizer) if no_newline else [])
    backend = HFRolloutBackend(model, proc, suppress_token_ids=suppress, max_batch_size=batch_size)
    return backend.generate(items, 1, SamplingParams(max_new_tokens=max_new_tokens, greedy=True))


def evaluate(model, processor, samples: Sequence[dict], ta: Any = None, batch_size: int = 32,
             max_new_tokens: int = 24, forced: bool = True) -> dict:
    """Greedy, per kind (``direct`` / ``partner``) and overall: ``acc`` (percent), ``think_ratio`` (share of
    completions with a non-empty thought, :func:`mmgrpo.vlm.methods.ton.thought_mode`), ``length`` (mean tokens,
    end token included), ``think_tokens`` (mean tokens per completion spent in thinking completions: length times
    the think indicator); with ``forced``, ``acc_forced_think`` / ``acc_forced_skip``."""
    import torch

    from mmgrpo.vlm.methods.ton import thought_mode

    ta = ta or task_adapter(processor)
    samples = list(samples)
    with torch.no_grad():
        free = _generate(model, processor, [prepare(ta, s)[0] for s in samples], max_new_tokens, batch_size)
        runs = {"": (list(free.texts), free.lengths.tolist())}
        if forced:
            for name, prefix in (("forced_think", "<think>"), ("forced_skip", SKIP_THOUGHT)):
                o = _generate(model, processor, [prepare(ta, s, prefix)[0] for s in samples], max_new_tokens,
                              batch_size, no_newline=name == "forced_think")
                runs[name] = (list(o.texts), o.lengths.tolist())
    res: dict[str, Any] = {"n": len(samples)}
    texts, lengths = runs[""]
    for kind in ("all",) + bench.KINDS:
        idx = [i for i, s in enumerate(samples) if kind == "all" or s["meta"]["kind"] == kind]
        if not idx:
            continue
        n = len(idx)
        thinks = [thought_mode(texts[i]) == "think" for i in idx]
        r = {"n": n, "acc": 100.0 * sum(parse_letter(texts[i]) == samples[i]["answer"] for i in idx) / n,
             "think_ratio": sum(thinks) / n, "length": sum(lengths[i] for i in idx) / n,
             "think_tokens": sum(lengths[i] for i, t in zip(idx, thinks) if t) / n}
        for name in ("forced_think", "forced_skip"):
            if name in runs:
                r[f"acc_{name}"] = 100.0 * sum(parse_letter(runs[name][0][i]) == samples[i]["answer"]
                                               for i in idx) / n
        res[kind] = r
    res["examples"] = [{"id": s["id"], "kind": s["meta"]["kind"], "answer": s["answer"], "text": t}
                       for s, t in list(zip(samples, texts))[:6]]
    return res
