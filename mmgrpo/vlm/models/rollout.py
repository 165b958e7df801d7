"""Rollouts (sampling G completions per prompt) and the token log-prob function shared by trainer and rollout.

Layout conventions (used everywhere in mmgrpo):
  * a *prompt item* is the processor output for ONE prompt (``input_ids`` of shape (1, P_i), plus its pixel
    tensors); ``collate_prompts`` left-pads a list of them into a batch (B, P);
  * completions are right-padded: ``completion_ids`` (N, T) with ``completion_mask`` (N, T), 1 up to and
    including the first EOS;
  * G generations of prompt i occupy rows i*G .. i*G+G-1 (``group_ids`` = row // G).

``compute_token_logprobs`` is the ONE function that turns (prompt batch, completions) into per-token
log-probs; the trainer uses it for the current policy, the old policy and the reference, with identical
padding, so an on-policy ratio is exactly 1.
"""
from __future__ import annotations

import abc
import contextlib
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

TEXT_KEYS = ("input_ids", "attention_mask", "mm_token_type_ids")
CAT_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


# ----------------------------------------------------------------------------------------------------------
# batching
# ----------------------------------------------------------------------------------------------------------
def collate_prompts(items: Sequence[dict], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Left-pad per-prompt processor outputs into one batch.

    Text keys (``input_ids``, ``attention_mask``, ``mm_token_type_ids``): (1, P_i) -> (B, max P_i), left padded
    (pad id / 0 / 0).  Vision keys are concatenated along dim 0 in item order, which is the order the model
    assigns images/videos to placeholder tokens (row-major over the batch).
    """
    if not items:
        raise ValueError("collate_prompts: empty list of prompt items")
    P = max(int(it["input_ids"].shape[-1]) for it in items)
    out: dict[str, Any] = {}
    for key in TEXT_KEYS:
        if key not in items[0]:
            continue
        pad = pad_token_id if key == "input_ids" else 0
        rows = []
        for it in items:
            x = it[key].reshape(-1)
            rows.append(torch.cat([x.new_full((P - x.shape[0],), pad), x]))
        out[key] = torch.stack(rows)
    for key in CAT_KEYS:
        vals = [it[key] for it in items if key in it and it[key] is not None]
        if vals:
            out[key] = torch.cat([v.reshape(-1) if v.dim() == 0 else v for v in vals], dim=0)
    return out


def batch_to(batch: dict, device) -> dict:
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}


def vision_token_types(model) -> dict[int, int]:
    """``{image_token_id: 1, video_token_id: 2}`` of a Qwen-VL model (its ``mm_token_type_ids`` codes); {} for a
    model without them."""
    cfg = getattr(getattr(model, "module", model), "config", None)
    out = {}
    for key, code in (("image_token_id", 1), ("video_token_id", 2)):
        v = getattr(cfg, key, None)
        if isinstance(v, int):
            out[v] = code
    return out


def join_prompt_completion(prompt_batch: dict, completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                           vision_types: dict[int, int] | None = None) -> dict[str, torch.Tensor]:
    """Model inputs for (left-padded prompt) ++ (right-padded completion); (N, P+T).

    ``mm_token_type_ids`` of the completion: 0, except vision tokens (``vision_types``: token id -> type code) at
    real positions -- a multi-turn completion holds tool turns with images / frames (the policy's own tokens never
    are vision tokens: the backends suppress them)."""
    if completion_ids.shape != completion_mask.shape:
        raise ValueError(f"completion_ids {tuple(completion_ids.shape)} vs mask {tuple(completion_mask.shape)}")
    N = completion_ids.shape[0]
    if prompt_batch["input_ids"].shape[0] != N:
        raise ValueError(f"prompt batch has {prompt_batch['input_ids'].shape[0]} rows, completions {N}")
    full = dict(prompt_batch)
    full["input_ids"] = torch.cat([prompt_batch["input_ids"], completion_ids.to(prompt_batch["input_ids"])], 1)
    am = prompt_batch["attention_mask"]
    full["attention_mask"] = torch.cat([am, completion_mask.to(am.dtype)], 1)
    if "mm_token_type_ids" in prompt_batch:
        mm = prompt_batch["mm_token_type_ids"]
        cmm = mm.new_zeros(completion_ids.shape)
        for tid, code in (vision_types or {}).items():
            cmm = cmm.masked_fill((completion_ids.to(mm.device) == tid) & (completion_mask.to(mm.device) > 0), code)
        full["mm_token_type_ids"] = torch.cat([mm, cmm], 1)
    return full


def _suppress(logits: torch.Tensor, suppress_token_ids: Sequence[int] | None) -> torch.Tensor:
    if suppress_token_ids:
        logits = logits.clone()
        logits[..., list(suppress_token_ids)] = float("-inf")
    return logits


def token_logprobs_from_logits(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0,
                               suppress_token_ids: Sequence[int] | None = None) -> torch.Tensor:
    """log softmax(logits / temperature)[ids] with suppressed tokens removed from the support.

    logits (..., V) float, ids (...) int64 -> (...) float32.  The policy whose log-probs we compute is the
    *sampling* distribution: temperature-scaled, vision tokens suppressed (top-p / top-k truncation is a
    sampling heuristic and is NOT part of it, as in TRL).
    """
    x = logits.float() / float(temperature)
    x = _suppress(x, suppress_token_ids)
    return torch.gather(x, -1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(x, dim=-1)


def compute_token_logprobs(
    model,
    batch: dict[str, torch.Tensor],
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    suppress_token_ids: Sequence[int] | None = None,
    return_logits: bool = False,
    chunk_size: int = 0,
):
    """Per-token log-probs of ``completion_ids`` under ``model`` given the left-padded prompt ``batch``.

    batch: collated prompt inputs with N rows (P columns); completion_ids/mask: (N, T).
    Returns logp (N, T) float32 with 0 where mask == 0; with ``return_logits`` also the temperature-scaled,
    vision-suppressed logits (N, T, V) (for entropy / TW-GRPO token weights).
    Only the last T+1 positions go through the LM head (``logits_to_keep``), so memory is O(N*T*V).
    ``chunk_size`` > 0: the head is applied to that many tokens at a time (``mmgrpo.vlm.models.chunked``; same
    numbers and gradients, O(chunk_size*V) logits memory); ``return_logits`` then returns a
    ``chunked.HeadInputs`` (hidden states + head) instead of the logits.  Falls back to the full logits for a
    model whose output head is not a plain ``nn.Linear``.
    """
    vt = vision_token_types(model)
    full = join_prompt_completion(batch, completion_ids, completion_mask, vt)
    T = completion_ids.shape[1]
    # a tool turn's vision tokens (multi-turn rollouts: <|vision_start|>, <|image_pad|>, ...) are suppressed for the
    # policy: log-prob -inf, never in the loss; set to 0 by masked_fill so no -inf * 0 = NaN reaches values or
    # gradients
    never = sorted(set(vt) | {int(t) for t in (suppress_token_ids or ())})
    vis = torch.isin(completion_ids, torch.tensor(never, device=completion_ids.device)) if never else None
    if chunk_size > 0:
        from .chunked import capture_head_inputs, chunkable_head, head_inputs

        if chunkable_head(model) is not None:
            with capture_head_inputs(model) as store:
                model(**full, use_cache=False, logits_to_keep=T + 1)
            head = head_inputs(model, store[-1][:, :T], temperature, suppress_token_ids, chunk_size)
            lp = head.token_logprobs(completion_ids, completion_mask * (~vis if vis is not None else 1))
            lp = lp.masked_fill(vis.to(lp.device), 0.0) if vis is not None else lp
            return (lp, head) if return_logits else lp
    out = model(**full, use_cache=False, logits_to_keep=T + 1)
    logits = out.logits[:, :T]  # position P-1+t predicts completion token t
    lp = token_logprobs_from_logits(logits, completion_ids, temperature, suppress_token_ids)
    if vis is not None:
        lp = lp.masked_fill(vis.to(lp.device), 0.0)
    lp = lp * completion_mask.to(lp.dtype)
    if return_logits:
        return lp, _suppress(logits.float() / float(temperature), suppress_token_ids)
    return lp


# ----------------------------------------------------------------------------------------------------------
# sampling
# ----------------------------------------------------------------------------------------------------------
@dataclass
class SamplingParams:
    max_new_tokens: int = field(default=256, metadata={"help": "max completion length (tokens)"})
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature (also used in log-probs)"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass (sampling only: the loss scores the "
                                                        "untruncated policy, as TRL does; keep 1.0 for on-policy)"})
    top_k: int = field(default=0, metadata={"help": "top-k sampling, 0 = off (sampling only, like top_p)"})
    greedy: bool = field(default=False, metadata={"help": "argmax decoding (evaluation)"})

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.greedy and self.temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class RolloutOutput:
    """G completions for each of B prompts, rows ordered prompt-major (row = i*G + g)."""

    completion_ids: torch.Tensor  # (N, T) int64, right padded with pad id
    completion_mask: torch.Tensor  # (N, T) int64, 1 up to and including the first EOS
    texts: list[str]  # decoded completions (special tokens skipped)
    truncated: torch.Tensor  # (N,) bool: no EOS within max_new_tokens
    logprobs: torch.Tensor | None = None  # (N, T) float32 sampling log-probs (0 where masked), if available
    prompt_index: torch.Tensor | None = None  # (N,) int64: which input prompt each row belongs to
    # multi-turn rollouts (mmgrpo.vlm.tools.rollout): the tokens the loss sees (policy turns; tool turns are 0),
    # each row's prompt item with the tool turns' media appended, and per-row turn / tool-call counts
    loss_mask: torch.Tensor | None = None  # (N, T) int64, None = completion_mask
    items: list[dict] | None = None
    turn_info: list[dict] | None = None
    # HF backend, multi-turn (mmgrpo.vlm.models.turn_cache): each row's cache for its next turn, and per row the
    # prompt tokens served from an earlier turn's cache / prefilled in this call (continue_generate)
    kv_states: list | None = None
    reused_tokens: torch.Tensor | None = None
    prefill_tokens: torch.Tensor | None = None

    @property
    def lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(1)


class RolloutBackend(abc.ABC):
    """Interface: sample ``num_generations`` completions for each prompt.

    ``prompts`` are per-prompt processor outputs (see ``collate_prompts``); ``raw_prompts`` (optional) carry the
    un-processed media for engines that run their own processor (vLLM): ``images`` (PIL) and ``clip`` (the
    ``VideoClip``, whose fps / frame indices fix the time axis).  ``seeds`` gives
    one integer per output row; a row's sample then depends only on its seed and its logits, not on batch
    composition (up to float non-associativity of batched matmuls).
    """

    @abc.abstractmethod
    def generate(self, prompts: Sequence[dict], num_generations: int, params: SamplingParams,
                 seeds: Sequence[int] | None = None, raw_prompts: Sequence[dict] | None = None) -> RolloutOutput:
        ...

    def sync_weights(self, model) -> None:  # noqa: B027 - HF backend shares the module; nothing to do
        """Push the trainer's current weights into the engine (no-op when the engine IS the trained module)."""


class _PerRowSampler:
    """LogitsProcessor that samples each row with its own ``torch.Generator`` and returns a one-hot mask.

    Used with greedy ``generate`` so the argmax picks the sampled token.  Temperature / top-k / top-p are
    applied here on the already-processed scores (vision tokens suppressed by ``suppress_tokens``).
    """

    def __init__(self, seeds: Sequence[int], temperature: float, top_p: float, top_k: int):
        self.gens = []
        for s in seeds:
            g = torch.Generator(device="cpu")
            g.manual_seed(int(s) & 0xFFFF_FFFF_FFFF_FFFF)
            self.gens.append(g)
        self.temperature, self.top_p, self.top_k = temperature, top_p, top_k

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        choice = self.sample(scores).unsqueeze(-1)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter(-1, choice.to(scores.device), 0.0)

    def sample(self, scores: torch.Tensor) -> torch.Tensor:
        """One token per row (n,) int64 on CPU, drawn from row i's generator (advances it by one draw)."""
        return self.sample_scaled(scores.float() / self.temperature)

    def sample_scaled(self, x: torch.Tensor) -> torch.Tensor:
        """``sample`` on scores already divided by the temperature (n, V) float32: the shared-prefix decode loop
        scales once and takes its log-probs from the same tensor."""
        if self.top_k and self.top_k > 0:
            kth = torch.topk(x, min(self.top_k, x.shape[-1]), dim=-1).values[..., -1:]
            x = x.masked_fill(x < kth, float("-inf"))
        if self.top_p < 1.0:
            sx, si = torch.sort(x, dim=-1, descending=True)
            cum = torch.softmax(sx, -1).cumsum(-1)
            drop = cum - torch.softmax(sx, -1) >= self.top_p  # keep the smallest prefix with mass >= top_p
            x = x.scatter(-1, si, sx.masked_fill(drop, float("-inf")))
        return multinomial_rows(torch.softmax(x, dim=-1).cpu(), self.gens)


def multinomial_rows(probs: torch.Tensor, generators: Sequence[torch.Generator]) -> torch.Tensor:
    """One draw per row of ``probs`` (n, V) float, row i from ``generators[i]``: bit for bit the tokens of
    ``torch.multinomial(probs[i], 1, generator=generators[i])`` for each i, and the generators end in the same
    states, in one batched division and argmax.

    For a single sample torch's multinomial draws ``q = empty_like(p).exponential_(1, generator)`` and returns
    ``argmax(p / q)`` (the Gumbel-max trick: ATen's fast path for one sample, CPU and CUDA alike).  Here each row's
    q is drawn from its own generator into one row of an (n, V) buffer -- the same draws in the same order -- so
    what goes is the per-row call's fixed cost (dispatch, allocation, and a validity check that syncs twice):
    ~17 us a row on CPU, 16 rows x every decoded token.  The validity check runs once for all rows.  Exactness
    against ``torch.multinomial``: ``tests/models/test_row_sampler.py`` (a torch release that changes the fast
    path fails it)."""
    if probs.dim() != 2 or probs.shape[0] != len(generators):
        raise ValueError(f"need (n, V) probabilities and n generators, got {tuple(probs.shape)} and {len(generators)}")
    ok = (probs.amax() < float("inf")) & (probs.amin() >= 0) & (probs.sum(-1) > 0).all()
    if not bool(ok):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0, or a row sums to 0")
    q = torch.empty_like(probs)
    for row, g in zip(q, generators):
        row.exponential_(1, generator=g)
    return torch.argmax(probs / q, dim=-1)


# Fields of a GenerationConfig that change which token ``generate`` picks, with their neutral value (None = the
# processor is off).  A checkpoint's generation_config.json may set any of them (the released Qwen2.5-VL Instruct
# configs set repetition_penalty 1.05, temperature 0.1, top_p 0.001, top_k 1); ``generate`` fills every field our
# config leaves None from the checkpoint's, so they must be switched off explicitly.
NEUTRAL_DECODING_FIELDS: dict[str, Any] = {
    "repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0, "min_length": 0, "min_new_tokens": 0, "guidance_scale": 1.0,
    "renormalize_logits": False, "remove_invalid_values": False, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
    "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "min_p": None, "top_h": None,
    "sequence_bias": None, "bad_words_ids": None, "forced_bos_token_id": None, "forced_eos_token_id": None,
    "exponential_decay_length_penalty": None, "begin_suppress_tokens": None, "watermarking_config": None,
    "do_sample": False, "num_beams": 1, "num_beam_groups": 1, "penalty_alpha": None, "dola_layers": None,
    "prompt_lookup_num_tokens": None, "assistant_early_exit": None, "stop_strings": None,
    "low_memory": None, "suppress_tokens": None,
}
_WARPER_FIELDS = ("temperature", "top_k", "top_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "min_p", "top_h")
_WARNED_OVERRIDES: set = set()


def checkpoint_decoding_overrides(generation_config) -> dict[str, Any]:
    """The checkpoint generation-config fields that would shape decoding (value != neutral) and that our
    explicit decoding settings override: ``{field: checkpoint value}``.  ``suppress_tokens`` is excluded (the
    loader puts the vision tokens there and the backends pass them explicitly)."""
    if generation_config is None:
        return {}
    out = {}
    for k, neutral in NEUTRAL_DECODING_FIELDS.items():
        if k == "suppress_tokens":
            continue
        v = getattr(generation_config, k, None)
        if v is not None and v != neutral:
            out[k] = v
    return out


def _generation_modules(model) -> list:
    """Every module whose ``generate`` reads ``self.generation_config`` (the HF model under peft / DDP)."""
    from transformers import GenerationMixin

    mods = [m for m in model.modules() if isinstance(m, GenerationMixin) and hasattr(m, "generation_config")]
    return mods or [model]


@contextlib.contextmanager
def explicit_decoding(model, what: str = "rollout"):
    """Run ``model.generate`` with NONE of the checkpoint's decoding settings.

    ``generate`` merges ``model.generation_config`` into the config it is given wherever a field is None, so a
    released checkpoint's ``repetition_penalty`` (1.05 for Qwen2.5-VL Instruct) would silently reshape every
    sampled token while the loss scores the unpenalised policy.  Inside this context each generation module's
    config is a fresh ``GenerationConfig`` keeping only the special-token ids, so the only decoding settings are
    the ones passed explicitly.  Overridden checkpoint fields are warned about once per distinct set.
    """
    from transformers import GenerationConfig

    mods = _generation_modules(model)
    saved = [m.generation_config for m in mods]
    over = checkpoint_decoding_overrides(saved[0])
    key = (what, tuple(sorted((k, repr(v)) for k, v in over.items())))
    # do_sample alone changes nothing here (``_PerRowSampler`` samples; warpers are off): record, don't warn
    if set(over) - {"do_sample"} and key not in _WARNED_OVERRIDES:
        _WARNED_OVERRIDES.add(key)
        warnings.warn(f"{what}: the checkpoint's generation_config sets {over}; ignored -- decoding uses only the "
                      "run's explicit settings (for training: the policy the loss scores)",
                      stacklevel=3)
    try:
        for m, gc in zip(mods, saved):
            keep = {k: getattr(gc, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id",
                                                      "decoder_start_token_id")}
            m.generation_config = GenerationConfig(**{k: v for k, v in keep.items() if v is not None})
        yield over
    finally:
        for m, gc in zip(mods, saved):
            m.generation_config = gc


def decoding_generation_config(**kwargs):
    """A ``GenerationConfig`` with every distribution-shaping field set to its neutral value, then ``kwargs``."""
    from transformers import GenerationConfig

    # warpers (temperature, top-k/p, ...) only act with do_sample=True, which we never use (``_PerRowSampler``
    # samples); setting them with do_sample=False only makes transformers warn
    # min_length / min_new_tokens: both set makes transformers warn; inside ``explicit_decoding`` they are off
    fields = {k: v for k, v in NEUTRAL_DECODING_FIELDS.items()
              if v is not None and k not in _WARPER_FIELDS + ("min_length", "min_new_tokens")}
    fields.update(kwargs)
    return GenerationConfig(**fields)


def _eos_ids(model, tokenizer) -> list[int]:
    eos = model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos.append(tokenizer.eos_token_id)
    return eos


def completion_mask_from_ids(ids: torch.Tensor, eos_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(mask, truncated): mask 1 up to and including the first EOS; truncated = no EOS in the row."""
    is_eos = torch.isin(ids, torch.tensor(list(eos_ids), device=ids.device))
    first = torch.where(is_eos.any(1), is_eos.int().argmax(1), torch.full_like(ids[:, 0], ids.shape[1]))
    pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
    mask = (pos <= first.unsqueeze(1)).long()
    return mask, ~is_eos.any(1)


def greedy_generate(policy, items: Sequence[dict], max_new_tokens: int) -> tuple[list[str], list[int], list[bool]]:
    """Greedy decoding of left-padded prompt items: the token choices of ``HFRolloutBackend`` with
    ``greedy=True`` (same collation, EOS / pad ids, suppressed vision tokens) without keeping the per-step logits,
    which cost B x T x V floats (gigabytes for a 152k vocabulary and 1024 tokens).  Returns (texts, number of
    completion tokens incl. EOS, truncated).  Used by ``eval/generate_vlm.py`` and by the trainer's validation
    (``mmgrpo.vlm.monitor.validation``), so a validation point and an evaluation of the same weights decode alike."""
    model, tok = policy.model, policy.tokenizer
    pad = tok.pad_token_id
    eos = _eos_ids(model, tok)
    device = next(model.parameters()).device
    batch = batch_to(collate_prompts(list(items), pad), device)
    # plain argmax: the checkpoint's generation_config (e.g. Qwen2.5-VL's repetition_penalty 1.05) is NOT merged
    # in; settings.json / metrics.json record the ignored fields under decoding.checkpoint_fields_ignored
    gc = decoding_generation_config(max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad,
                                    suppress_tokens=list(policy.suppress_token_ids) or None, use_cache=True)
    with torch.no_grad(), explicit_decoding(model, "eval greedy decoding"):
        out = model.generate(**batch, generation_config=gc)
    ids = out[:, batch["input_ids"].shape[1]:].cpu()
    mask, truncated = completion_mask_from_ids(ids, eos)
    texts = tok.batch_decode(ids.masked_fill(mask == 0, pad), skip_special_tokens=True)
    return texts, mask.sum(1).tolist(), truncated.tolist()


def output_from_chunks(ids_chunks, lp_chunks, pad: int, eos, tokenizer, **fields) -> RolloutOutput:
    """Decoded chunks (``[rows, T_i]`` token ids and their log-probs) -> one :class:`RolloutOutput`: right-padded to the
    longest, masked after each row's first EOS (ids -> ``pad``, log-probs -> 0), decoded; ``fields`` are the output's
    other fields (prompt index, KV states, counters)."""
    T = max(x.shape[1] for x in ids_chunks)
    ids = torch.cat([torch.nn.functional.pad(x, (0, T - x.shape[1]), value=pad) for x in ids_chunks])
    lps = torch.cat([torch.nn.functional.pad(x, (0, T - x.shape[1]), value=0.0) for x in lp_chunks])
    mask, truncated = completion_mask_from_ids(ids, eos)
    ids = ids.masked_fill(mask == 0, pad)
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    return RolloutOutput(completion_ids=ids, completion_mask=mask, texts=texts, truncated=truncated,
                         logprobs=lps * mask, **fields)


class HFRolloutBackend(RolloutBackend):
    """KV-cached sampling with the HF model, left padding, several prompts per call, G per prompt.

    Two equivalent paths (``shared_prefix``):

    * shared prefix (default): each prompt is prefilled ONCE (vision tower + prompt tokens), its KV cache, its
      last logits and its position ids (MRoPE for Qwen-VL) are repeated G times, and the G completions are
      decoded token by token (``shared_prefix_sample``).  ``max_batch_size`` then counts decoded rows: a chunk
      holds ``max(1, max_batch_size // G)`` prompts.
    * repeated: ``model.generate`` on the prompt repeated G times (pixel tensors included), in chunks of
      ``max_batch_size`` rows -- G vision-tower passes and G prefills per prompt.

    Both sample row r from its own ``torch.Generator`` seeded with ``seeds[r]`` with the same logits processing
    (vision tokens suppressed, then temperature / top-k / top-p), stop at EOS the same way and return the
    sampling log-probs recomputed from the raw step logits with the same formula as ``compute_token_logprobs``.
    The only difference is the batch shape of the prefill (B prompts instead of B*G rows), i.e. float rounding:
    same seeds give the same tokens unless a draw falls within rounding of a bucket edge, and log-probs agree to
    ~1e-6 (``tests/models/test_shared_prefix_rollout.py``).  The checkpoint's ``generation_config`` decoding fields
    (repetition penalty, top-k/p, ...) are applied by neither path (see ``explicit_decoding``): the sampled
    distribution is exactly the policy the loss scores.
    """

    #: optional ``hook(new_tokens, rows_left) -> stop`` called after every decoding step (progress lines; True
    #: ends decoding early, e.g. on SIGTERM: the completions are then cut short and the caller discards them)
    step_hook = None

    @property
    def supports_turn_cache(self) -> bool:
        """``generate(..., keep_state=True)`` returns each row's cache, which
        :func:`mmgrpo.vlm.models.turn_cache.continue_generate` continues from: the shared-prefix path only."""
        return self.shared_prefix

    def __init__(self, model, processor, suppress_token_ids: Sequence[int] | None = None,
                 max_batch_size: int = 64, device=None, shared_prefix: bool = True):
        self.model = model
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.suppress_token_ids = list(suppress_token_ids or [])
        self.max_batch_size = max_batch_size
        self.device = device
        self.shared_prefix = bool(shared_prefix)

    @torch.no_grad()
    def generate(self, prompts, num_generations, params, seeds=None, raw_prompts=None,
                 keep_state: bool = False) -> RolloutOutput:
        """``keep_state`` (shared-prefix path): also return each row's cache (``RolloutOutput.kv_states``), for
        :func:`mmgrpo.vlm.models.turn_cache.continue_generate` to continue a later turn from."""
        model = getattr(self.model, "module", self.model)  # unwrap DDP
        G = int(num_generations)
        prompt_index = torch.arange(len(prompts)).repeat_interleave(G)
        N = len(prompts) * G
        if seeds is None:
            seeds = torch.randint(0, 2**62, (N,)).tolist()
        if len(seeds) != N:
            raise ValueError(f"need one seed per row: got {len(seeds)} seeds for {N} rows")
        seeds = list(seeds)
        pad = self.tokenizer.pad_token_id
        eos = _eos_ids(model, self.tokenizer)
        device = self.device or next(model.parameters()).device
        was_training = model.training
        model.eval()
        states = [] if keep_state else None
        try:
            if self.shared_prefix:
                ids_chunks, lp_chunks = self._shared_chunks(model, list(prompts), G, params, seeds, pad, eos, device,
                                                            states)
            else:
                ids_chunks, lp_chunks = self._repeated_chunks(model, list(prompts), G, params, seeds, pad, eos, device)
        finally:
            model.train(was_training)
        return output_from_chunks(ids_chunks, lp_chunks, pad, eos, self.tokenizer, prompt_index=prompt_index,
                                  kv_states=states)

    def _shared_chunks(self, model, prompts, G, params, seeds, pad, eos, device, states=None):
        gm = _generation_modules(model)[0]  # the HF model itself (under peft: the LoRA-injected base model)
        per_chunk = max(1, self.max_batch_size // G)
        ids_chunks, lp_chunks = [], []
        for s in range(0, len(prompts), per_chunk):
            chunk = prompts[s:s + per_chunk]
            batch = batch_to(collate_prompts(chunk, pad), device)
            with explicit_decoding(model, "HFRolloutBackend"):  # only for its warning: we never call generate
                ids, lp = shared_prefix_sample(gm, batch, G, params, seeds[s * G:(s + len(chunk)) * G], eos, pad,
                                               self.suppress_token_ids, step_hook=self.step_hook, keep_state=states)
            ids_chunks.append(ids.cpu())
            lp_chunks.append(lp.cpu())
        return ids_chunks, lp_chunks

    def _repeated_chunks(self, model, prompts, G, params, seeds, pad, eos, device):
        from transformers import LogitsProcessorList

        rows = [p for p in prompts for _ in range(G)]
        ids_chunks, lp_chunks = [], []
        for s in range(0, len(rows), self.max_batch_size):
            chunk = rows[s:s + self.max_batch_size]
            batch = batch_to(collate_prompts(chunk, pad), device)
            gc = decoding_generation_config(
                max_new_tokens=params.max_new_tokens, eos_token_id=eos, pad_token_id=pad,
                suppress_tokens=self.suppress_token_ids or None,
                output_logits=True, return_dict_in_generate=True, use_cache=True,
            )
            procs = LogitsProcessorList()
            if not params.greedy:
                procs.append(_PerRowSampler(seeds[s:s + len(chunk)], params.temperature, params.top_p,
                                            params.top_k))
            stop = [_HookCriteria(self.step_hook)] if self.step_hook is not None else None
            with explicit_decoding(model, "HFRolloutBackend"):
                out = model.generate(**batch, generation_config=gc, logits_processor=procs, stopping_criteria=stop)
            P = batch["input_ids"].shape[1]
            ids = out.sequences[:, P:]
            logits = torch.stack(out.logits, 1)  # (n, T, V) raw logits
            temp = 1.0 if params.greedy else params.temperature
            lp = token_logprobs_from_logits(logits, ids, temp, self.suppress_token_ids)
            ids_chunks.append(ids.cpu())
            lp_chunks.append(lp.cpu())
        return ids_chunks, lp_chunks


def _output_cache(out):
    cache = getattr(out, "cache", None)  # transformers >= 5.x name
    return cache if cache is not None else getattr(out, "past_key_values", None)


_PREALLOCATED_LAYER = None


def _preallocated_layer_class():
    global _PREALLOCATED_LAYER
    if _PREALLOCATED_LAYER is not None:
        return _PREALLOCATED_LAYER
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        """A ``DynamicLayer`` whose keys/values live in a buffer with room for ``extra`` more tokens: ``update``
        writes the new tokens in place and returns views, instead of ``torch.cat``-copying the whole (G-times
        repeated, ~1k-token) cache at every decoded token.  Same values and mask sizes as ``DynamicLayer``."""

        def fill(self, keys: torch.Tensor, values: torch.Tensor, G: int, extra: int):
            B, H, L, _ = keys.shape
            self._k = keys.new_empty((B * G, H, L + extra, keys.shape[-1]))
            self._v = values.new_empty((B * G, H, L + extra, values.shape[-1]))
            # row i -> rows i*G .. i*G+G-1 (repeat_interleave), written straight into the buffer
            self._k.view(B, G, H, L + extra, -1)[:, :, :, :L] = keys[:, None]
            self._v.view(B, G, H, L + extra, -1)[:, :, :, :L] = values[:, None]
            self._len = L
            self.keys, self.values = self._k[:, :, :L], self._v[:, :, :L]
            self.device, self.is_initialized = keys.device, True
            return self

        def update(self, key_states, value_states, *args, **kwargs):
            n = key_states.shape[-2]
            if self._len + n > self._k.shape[2]:  # more tokens than planned: grow by concatenation
                return super().update(key_states, value_states, *args, **kwargs)
            self._k[:, :, self._len:self._len + n] = key_states
            self._v[:, :, self._len:self._len + n] = value_states
            self._len += n
            self.keys, self.values = self._k[:, :, :self._len], self._v[:, :, :self._len]
            return self.keys, self.values

    _PREALLOCATED_LAYER = PreallocatedLayer
    return PreallocatedLayer


def _repeat_cache(cache, G: int, extra: int = 0) -> None:
    """Repeat every cached key/value G times along the batch (row i -> rows i*G .. i*G+G-1), in place; plain
    ``DynamicLayer``s get room for ``extra`` decoded tokens (other layer kinds: ``batch_repeat_interleave``)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    if extra > 0 and layers and all(type(layer) is DynamicLayer and layer.is_initialized for layer in layers):
        cls = _preallocated_layer_class()
        cache.layers = [cls().fill(layer.keys, layer.values, G, extra) for layer in layers]
        return
    if hasattr(cache, "batch_repeat_interleave"):
        cache.batch_repeat_interleave(G)
        return
    raise TypeError(f"shared-prefix rollout: cannot expand a {type(cache).__name__} cache "
                    "(use rollout.shared_prefix=false)")


#: HF classes whose decode step is ``lm_head(model.language_model(...))`` and nothing else once the prompt is cached
#: (no logit scaling, no per-step vision input): ``_decode_step`` may call those two parts directly.  Checked
#: against the full forward for each family by ``tests/models/test_shared_prefix_rollout.py``.
_LEAN_DECODE_CLASSES = ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
                        "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration")


def _decode_step(gm, mm_dtype: torch.dtype | None = None, lean: bool | None = None):
    """``step(ids (N, 1), attention_mask (N, L), position_ids, cache) -> logits (N, V) float32`` for one decoded
    token (``mm_dtype``: the prompt had ``mm_token_type_ids``; the full forward then gets the step's, zeros, as
    ``generate`` passes them).

    For the Qwen-VL classes (``_LEAN_DECODE_CLASSES``) it runs ``gm.lm_head(gm.model.language_model(...))``: what
    ``gm(...)`` computes for a text-only step with given position ids (the multimodal wrapper then only embeds the
    tokens, passes the arguments through and builds two more output objects), without the two wrapper calls --
    on a tiny model on CPU, where the per-token Python overhead dominates, about a sixth of the decode step.
    Anything else (another model class, FSDP2-sharded modules whose root hook must gather the head and the
    embeddings, ``lean=False``) takes the full forward."""
    if lean is None:
        lean = type(gm).__name__ in _LEAN_DECODE_CLASSES and not _fsdp_managed(gm)
    inner = getattr(getattr(gm, "model", None), "language_model", None)
    head = getattr(gm, "lm_head", None)
    if lean and inner is not None and head is not None:
        def step(ids, am, pos, cache):
            h = inner(input_ids=ids, attention_mask=am, position_ids=pos, cache=cache, use_cache=True)
            return head(h.last_hidden_state[:, -1:]).float()[:, -1]
        return step

    def full(ids, am, pos, cache):
        kw = dict(input_ids=ids, attention_mask=am, position_ids=pos, cache=cache, use_cache=True)
        if mm_dtype is not None:
            kw["mm_token_type_ids"] = torch.zeros(ids.shape, dtype=mm_dtype, device=ids.device)
        return gm(**kw).logits[:, -1].float()
    return full


def _fsdp_managed(model) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without distributed
        return False
    return any(isinstance(m, FSDPModule) for m in model.modules())


class _HookCriteria:
    """``model.generate`` stopping criterion calling a backend's ``step_hook`` once per decoding step."""

    def __init__(self, hook):
        self.hook = hook

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        n = input_ids.shape[0]
        stop = bool(self.hook(n, n))
        return torch.full((n,), stop, dtype=torch.bool, device=input_ids.device)


@torch.no_grad()
def shared_prefix_sample(gm, batch: dict, G: int, params: SamplingParams, seeds: Sequence[int],
                         eos_ids: Sequence[int], pad_id: int, suppress_token_ids: Sequence[int] | None = None,
                         step_hook=None, lean: bool | None = None,
                         keep_state: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample G completions for each of the B left-padded prompts in ``batch`` with ONE prefill per prompt.

    gm: the HF generation model (``GenerationMixin``).  Returns (ids (B*G, T) with pad after the first EOS,
    sampling log-probs (B*G, T) float32), rows prompt-major; T <= max_new_tokens (stops when every row is done).

    What ``generate`` does for the repeated batch, done once per prompt and then expanded:

    * position ids come from the model's own ``_prepare_position_ids_for_generation`` (for Qwen-VL: text
      positions stacked on the 3 MRoPE rows, vision tokens at their (t, h, w) grid positions, padding ignored).
      The trap: a decoded token's MRoPE position is NOT its index in the sequence but the prompt's last position
      + 1 (``rope_deltas`` != 0 after a video); the G copies inherit the prompt's positions by
      ``repeat_interleave`` and every decode step adds 1 to each row, as ``generate`` does;
    * the prefill runs the vision tower and the prompt once (``logits_to_keep=1``), its ``DynamicCache`` is
      repeated G times along the batch into buffers with room for the new tokens (no per-token ``torch.cat`` of
      the whole cache: 1.3x faster decoding at 1k prompt tokens), the attention mask and positions likewise;
    * each decode step runs ``_decode_step`` (for Qwen-VL: the language model and the head, without the
      multimodal wrapper, whose work is done once the prompt is cached; ``lean=False``: the full forward);
    * each step: raw fp32 logits -> vision tokens suppressed -> ``_PerRowSampler`` (temperature, top-k, top-p,
      row r's generator) or argmax when greedy; finished rows get ``pad_id``; a row finishes at its first EOS.
    """
    B = batch["input_ids"].shape[0]
    N = B * G
    if len(seeds) != N and not params.greedy:
        raise ValueError(f"need one seed per row: got {len(seeds)} for {B} prompts x G={G}")
    kwargs = {k: v for k, v in batch.items() if k != "input_ids"}
    pos = gm._prepare_position_ids_for_generation(batch["input_ids"], dict(kwargs))
    out = gm(**batch, position_ids=pos, use_cache=True, logits_to_keep=1)
    cache = _output_cache(out)
    _repeat_cache(cache, G, params.max_new_tokens)
    logits = out.logits[:, -1].float().repeat_interleave(G, 0)  # (N, V): the G copies start identically
    pos = pos.repeat_interleave(G, dim=pos.dim() - 2)[..., -1:]  # (.., N, 1): each row's last prompt position
    # the attention mask grows by one column per token: a buffer with room for all of them, read through views
    P = batch["attention_mask"].shape[1]
    am_buf = batch["attention_mask"].new_ones((N, P + params.max_new_tokens))
    am_buf[:, :P] = batch["attention_mask"].repeat_interleave(G, 0)
    mm = batch.get("mm_token_type_ids")
    decode = _decode_step(gm, None if mm is None else mm.dtype, lean=lean)
    ids, lps = decode_loop(decode, logits, cache, am_buf, P, pos, params, seeds, eos_ids, pad_id, suppress_token_ids,
                           step_hook)
    if keep_state is not None:  # per-row caches for the next turn (mmgrpo.vlm.models.turn_cache)
        keep_state.extend(row_states(cache, am_buf[:, :P], batch["input_ids"].repeat_interleave(G, 0), ids, eos_ids))
    return ids, lps


@dataclass
class RowState:
    """One row's cache after a turn: ``ids`` (L,) the token ids it holds (the conversation so far but its last
    sampled token), ``kv`` per layer (keys, values), each (1, H, L, D), on the model's device."""

    ids: torch.Tensor
    kv: list


def row_states(cache, prompt_mask: torch.Tensor, prompt_ids: torch.Tensor, toks: torch.Tensor,
               eos_ids: Sequence[int]) -> list[RowState]:
    """Each row's :class:`RowState` after a decode loop: the real prompt columns (``prompt_mask`` (N, P) = 1) and
    the decoded tokens the loop fed (all but the last step's), cut at the row's first EOS (included when fed)."""
    N, P = prompt_mask.shape
    fed = toks.shape[1] - 1
    n = completion_mask_from_ids(toks.cpu(), eos_ids)[0].sum(1)
    out = []
    for r in range(N):
        keep = prompt_mask[r].bool()
        m = min(int(n[r]), fed)
        cols = torch.cat([keep.nonzero().flatten(), P + torch.arange(m, device=keep.device)])
        ids = torch.cat([prompt_ids[r][keep].cpu(), toks[r, :m].cpu()])
        kv = [(lay.keys[r:r + 1, :, cols].clone(), lay.values[r:r + 1, :, cols].clone()) for lay in cache.layers]
        out.append(RowState(ids, kv))
    return out


def decode_loop(decode, logits, cache, am_buf, P: int, pos, params: SamplingParams, seeds, eos_ids, pad_id: int,
                suppress_token_ids=None, step_hook=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The token-by-token sampling after a prefill: ``logits`` (N, V) of each row's last prompt position, the
    ``cache`` holding the prompts (P columns of ``am_buf``, which has room for the new tokens), ``pos`` each row's
    last prompt position; returns (ids (N, T), sampling log-probs (N, T)). Shared by the one-prefill group rollout
    and the continued later turns (:mod:`mmgrpo.vlm.models.turn_cache`)."""
    N = logits.shape[0]
    sampler = None if params.greedy else _PerRowSampler(seeds, params.temperature, params.top_p, params.top_k)
    temp = 1.0 if params.greedy else params.temperature
    device = logits.device
    eos_t = torch.tensor(list(eos_ids), device=device)
    unfinished = torch.ones(N, dtype=torch.bool, device=device)
    # the suppressed ids as a boolean row: one masked_fill per token (the values of _suppress's clone + index put)
    blocked = None
    if suppress_token_ids:
        blocked = torch.zeros(logits.shape[-1], dtype=torch.bool, device=device)
        blocked[list(suppress_token_ids)] = True
    pad_t = torch.tensor(pad_id, device=device)
    toks, lps = [], []
    for t in range(params.max_new_tokens):
        # suppressed and scaled once: the sampler draws from it and the log-probs are read from it, the values of
        # token_logprobs_from_logits(logits, nxt, temp, suppress_token_ids) bit for bit (x / 1.0 == x)
        x = logits if blocked is None else logits.masked_fill(blocked, float("-inf"))
        if temp != 1.0:
            x = x / temp
        nxt = x.argmax(-1) if sampler is None else sampler.sample_scaled(x).to(device)
        nxt = torch.where(unfinished, nxt, pad_t)
        toks.append(nxt)
        lps.append(x.gather(-1, nxt[:, None]).squeeze(-1) - torch.logsumexp(x, dim=-1))
        n_new = int(unfinished.sum()) if step_hook is not None else 0
        unfinished = unfinished & ~torch.isin(nxt, eos_t)
        if step_hook is not None and step_hook(n_new, int(unfinished.sum())):
            break  # e.g. SIGTERM: the caller discards these cut-short completions
        if not bool(unfinished.any()) or t == params.max_new_tokens - 1:
            break
        pos = pos + 1
        logits = decode(nxt[:, None], am_buf[:, :P + t + 1], pos, cache)
    return torch.stack(toks, 1), torch.stack(lps, 1)


def rollout_from_token_lists(token_ids: Sequence[Sequence[int]], logprobs: Sequence[Sequence[float]] | None,
                             tokenizer, eos_ids: Sequence[int], num_prompts: int, num_generations: int,
                             max_new_tokens: int) -> RolloutOutput:
    """Right-pad per-row token lists (an engine's output) into a ``RolloutOutput``.

    A row is truncated when it has no EOS (engines stop at EOS and may or may not include it; a row shorter
    than ``max_new_tokens`` without EOS ended for another reason and is NOT flagged as truncated)."""
    pad = tokenizer.pad_token_id
    T = max(1, max((len(t) for t in token_ids), default=1))
    ids = torch.full((len(token_ids), T), pad, dtype=torch.long)
    lps = torch.zeros(len(token_ids), T)
    for r, toks in enumerate(token_ids):
        ids[r, :len(toks)] = torch.tensor(list(toks), dtype=torch.long)
        if logprobs is not None and logprobs[r] is not None:
            lps[r, :len(logprobs[r])] = torch.tensor(list(logprobs[r]), dtype=torch.float32)
    lens = torch.tensor([len(t) for t in token_ids])
    mask, no_eos = completion_mask_from_ids(ids, eos_ids)
    mask = mask * (torch.arange(T).unsqueeze(0) < lens.unsqueeze(1)).long()
    truncated = no_eos & (lens >= max_new_tokens)
    ids = ids.masked_fill(mask == 0, pad)
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    return RolloutOutput(ids, mask, texts, truncated, lps * mask,
                         torch.arange(num_prompts).repeat_interleave(num_generations))


def make_seeds(base_seed: int, step: int, global_indices: Sequence[int], num_generations: int) -> list[int]:
    """Deterministic per-row sampling seeds from (seed, step, global sample index, generation index).

    Independent of the number of processes: a sample's seeds depend on its global dataset index only.
    """
    from mmgrpo.utils.seeding import sample_seed

    return [sample_seed(base_seed, step, int(gi), g) for gi in global_indices for g in range(num_generations)]


__all__ = [
    "collate_prompts", "join_prompt_completion", "vision_token_types", "compute_token_logprobs",
    "token_logprobs_from_logits",
    "SamplingParams", "RolloutOutput", "RolloutBackend", "HFRolloutBackend",
    "shared_prefix_sample", "decode_loop", "RowState", "row_states", "multinomial_rows",
    "completion_mask_from_ids", "make_seeds", "batch_to", "rollout_from_token_lists",
    "NEUTRAL_DECODING_FIELDS", "checkpoint_decoding_overrides", "explicit_decoding", "decoding_generation_config",
    "greedy_generate",
]

