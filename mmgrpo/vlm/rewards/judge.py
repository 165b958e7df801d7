r"""A model-based judge reward for free-form answers (open-ended video QA, captioning): ``reward.weights.judge``.

A local LLM / VLM folder (any Hugging Face causal LM, or a Qwen-VL checkpoint used text-only) reads one prompt per
completion, built from a template that is data (``template`` string or ``template_file``)::

    {query}       the sample's question (``sample["query"]``)
    {reference}   the sample's reference answer (``sample["answer"]``; "" when the sample has none)
    {answer}      the completion's <answer> block (the whole completion when it has none)
    {completion}  the whole completion

and answers greedily (``max_new_tokens``, batched ``batch_size`` prompts at a time, left-padded). The reply is read
by :func:`parse_score`, which never raises: the first ``Score: x`` (case-insensitive, ``:`` or ``=``; else the
first bare number of the reply when ``lenient``) with ``0 <= x <= scale`` gives the reward ``x / scale`` in [0, 1];
anything else is a *parse failure*: the reward is ``on_parse_failure`` (default 0.0; ``nan`` drops the row through
``reward.on_nonfinite``), the row's ``judge/parse_failed`` diagnostic is 1 and :attr:`JudgeReward.parse_failures`
counts it (logged per step as ``reward/judge/parse_failed``, the failed share of the step's rows).

Options (``reward.kwargs.judge.<option>``): ``model`` (the folder; required unless a ``generate`` callable is given
in Python), ``template`` / ``template_file``, ``scale`` (10), ``batch_size`` (8), ``max_new_tokens`` (16),
``lenient`` (True), ``on_parse_failure`` (0.0), ``device`` ("cpu"), ``dtype`` ("float32"), ``chat`` (True: wrap
the prompt in the tokenizer's chat template when it has one).

Cost: one greedy generation per completion (G x prompts per step), on the trainer's process. For a judge in
another process (its own GPU, its own environment), serve it with ``python -m mmgrpo.vlm.rewards.server --reward
judge --reward-kwargs '{"model": ...}'`` and weight the ``remote`` open reward (:mod:`mmgrpo.vlm.rewards.remote`).

Loading runs no code from the folder: ``trust_remote_code`` is off, files are local only, and the weights must be
safetensors (a pickled ``pytorch_model.bin`` is refused with an error naming the folder).
"""
from __future__ import annotations

import math
import re
import threading
from typing import Any, Callable, Mapping, Optional, Sequence

from .parsing import extract_block

__all__ = ["DEFAULT_TEMPLATE", "JudgeReward", "parse_score", "judge_fields"]

DEFAULT_TEMPLATE = (
    "You grade an answer to a question about a video or an image.\n"
    "Question: {query}\n"
    "Reference answer: {reference}\n"
    "Candidate answer: {answer}\n"
    "How well does the candidate answer match the reference? Reply with one line 'Score: N' where N is an integer "
    "from 0 (wrong) to {scale} (fully correct).")

_SCORE = re.compile(r"score\s*[:=]\s*([-+]?\d+(?:\.\d+)?)", re.IGNORECASE)
_NUMBER = re.compile(r"(?<![\w.])([-+]?\d+(?:\.\d+)?)")


def parse_score(reply: Any, scale: float, lenient: bool = True) -> Optional[float]:
    """The judge's score in [0, 1] (``x / scale``), or None when ``reply`` holds no valid score. Never raises."""
    try:
        if not isinstance(reply, str) or not reply:
            return None
        m = _SCORE.search(reply) or (_NUMBER.search(reply) if lenient else None)
        if m is None:
            return None
        x = float(m.group(1))
        if not math.isfinite(x) or x < 0 or x > scale:
            return None
        return x / scale
    except Exception:  # noqa: BLE001 - a reply is data: nothing in it may stop the run
        return None


def judge_fields(completion: Optional[str], sample: Mapping[str, Any]) -> dict[str, str]:
    """The template's fields for one completion (see the module docstring)."""
    text = completion or ""
    block = extract_block(text, "answer")
    ref = sample.get("answer")
    return {"query": str(sample.get("query") or ""), "reference": "" if ref is None else str(ref),
            "answer": (block if block is not None else text).strip(), "completion": text}


class JudgeReward:
    """``reward(completions, samples) -> {"score": (N,) floats, "judge/parse_failed": (N,) 0/1}`` (the user-reward
    signature of :mod:`mmgrpo.vlm.rewards.open`). ``generate(prompts: list[str]) -> list[str]`` replaces the model
    (tests, a remote endpoint); otherwise ``model`` is loaded with transformers."""

    def __init__(self, model: Optional[str] = None, *, generate: Optional[Callable[[list[str]], list[str]]] = None,
                 template: Optional[str] = None, template_file: Optional[str] = None, scale: float = 10,
                 batch_size: int = 8, max_new_tokens: int = 16, lenient: bool = True,
                 on_parse_failure: float | str = 0.0, device: str = "cpu", dtype: str = "float32", chat: bool = True):
        where = "reward.kwargs.judge"
        if template is not None and template_file is not None:
            raise ValueError(f"{where}: give template or template_file, not both")
        if template_file is not None:
            try:
                with open(template_file, encoding="utf-8") as f:
                    template = f.read()
            except OSError as e:
                raise ValueError(f"{where}.template_file: cannot read {template_file!r}: {e}") from e
        self.template = DEFAULT_TEMPLATE if template is None else str(template)
        try:  # a typo in a field name fails now, not at the first step
            self.template.format(query="q", reference="r", answer="a", completion="c", scale=scale)
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"{where}.template: {e!r}; the fields are {{query}}, {{reference}}, {{answer}}, "
                             "{completion}, {scale} (write {{ and }} for literal braces)") from e
        if not (float(scale) > 0):
            raise ValueError(f"{where}.scale must be > 0, got {scale!r}")
        if int(batch_size) < 1 or int(max_new_tokens) < 1:
            raise ValueError(f"{where}: batch_size and max_new_tokens must be >= 1")
        self.scale, self.batch_size, self.max_new_tokens = float(scale), int(batch_size), int(max_new_tokens)
        self.lenient, self.chat = bool(lenient), bool(chat)
        self.on_parse_failure = float(on_parse_failure)  # "nan" -> nan
        self.parse_failures = 0  # replies without a valid score (all calls)
        self.replies = 0
        self._lock = threading.Lock()
        if generate is None:
            if not model:
                raise ValueError(f"{where}.model: the judge's model folder is required (reward.kwargs.judge.model="
                                 "/path/to/judge)")
            generate = _TransformersJudge(model, device, dtype, self.max_new_tokens, self.chat)
        self.generate = generate

    def prompts(self, completions: Sequence[Optional[str]], samples: Sequence[Mapping[str, Any]]) -> list[str]:
        return [self.template.format(scale=_fmt(self.scale), **judge_fields(c, s))
                for c, s in zip(completions, samples)]

    def __call__(self, completions: Sequence[Optional[str]], samples: Sequence[Mapping[str, Any]]) -> dict:
        prompts = self.prompts(completions, samples)
        replies: list[str] = []
        for i in range(0, len(prompts), self.batch_size):
            chunk = prompts[i:i + self.batch_size]
            out = list(self.generate(chunk))
            if len(out) != len(chunk):
                raise ValueError(f"judge returned {len(out)} replies for {len(chunk)} prompts")
            replies += out
        scores, failed = [], []
        for r in replies:
            s = parse_score(r, self.scale, self.lenient)
            failed.append(s is None)
            scores.append(self.on_parse_failure if s is None else s)
        with self._lock:
            self.parse_failures += sum(failed)
            self.replies += len(replies)
        return {"score": scores, "judge/parse_failed": [float(f) for f in failed]}


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


class _TransformersJudge:
    """Greedy batched generation with a local transformers folder (causal LM, or an image-text-to-text model used
    with text only)."""

    def __init__(self, path: str, device: str, dtype: str, max_new_tokens: int, chat: bool):
        import os

        import torch
        from transformers import AutoTokenizer

        if not os.path.isdir(path):
            raise ValueError(f"reward.kwargs.judge.model: {path!r} is not a folder")
        self.torch = torch
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
        tok.padding_side = "left"
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        self.tok, self.device, self.max_new_tokens = tok, device, max_new_tokens
        self.chat = chat and getattr(tok, "chat_template", None) is not None
        td = {"float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
              "fp16": torch.float16, "float16": torch.float16}[dtype]
        self.model = _load_model(path, td).to(device).eval()

    def __call__(self, prompts: list[str]) -> list[str]:
        torch, tok = self.torch, self.tok
        if self.chat:
            prompts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                               add_generation_prompt=True) for p in prompts]
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=not self.chat).to(self.device)
        with torch.no_grad():
            out = self.model.generate(**enc, max_new_tokens=self.max_new_tokens, do_sample=False,
                                      pad_token_id=tok.pad_token_id)
        return tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)


SAFE_LOAD = {"trust_remote_code": False, "local_files_only": True, "use_safetensors": True}


def _load_model(path: str, dtype: Any) -> Any:
    """The folder's model, loaded without running code from it (:data:`SAFE_LOAD`)."""
    import glob
    import os

    import transformers

    if not glob.glob(os.path.join(path, "*.safetensors")):
        raise ValueError(f"reward.kwargs.judge.model: {path!r} holds no .safetensors weights; pickled weights "
                         "(pytorch_model.bin) are not loaded, since unpickling can run code (convert them with "
                         "save_pretrained(safe_serialization=True))")
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **SAFE_LOAD)
    except ValueError:  # a VLM config (e.g. Qwen2.5-VL) is not a causal-LM one
        for name in ("AutoModelForImageTextToText", "AutoModelForVision2Seq"):
            cls = getattr(transformers, name, None)
            if cls is not None:
                try:
                    return cls.from_pretrained(path, dtype=dtype, **SAFE_LOAD)
                except ValueError:
                    continue
        raise
