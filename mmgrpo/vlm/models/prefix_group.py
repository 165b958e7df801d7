"""Shared-prefix group forward (the Prefix Grouper idea): encode a prompt ONCE for its G completions.

In GRPO every prompt is scored with G completions.  The naive path (``rollout.compute_token_logprobs``) repeats
the prompt G times: G vision-tower runs and G forwards over the (long, video) prefix.  Here, per prompt,

1. **prefix forward** (with grad): vision tower + LLM over the P prompt tokens, once.  It yields every layer's
   keys/values K_l, V_l of shape (1, h_kv, P, d) and the logits of the last prompt position (which predict
   completion token 0);
2. **suffix forward** (with grad): the G completions (G, T-1) attend to [K_l, V_l] expanded G times along the
   batch (``Tensor.expand``: a view; the copy happens inside ``torch.cat`` in the cache update), plus causally to
   themselves.  Their logits at positions 0..T-2 predict completion tokens 1..T-1.

Autograd sees one prefix sub-graph whose outputs are consumed G times, so the backward of ``expand`` *sums* the
G suffixes' gradients into the prefix keys/values and from there into every parameter that computed them
(LLM layers, LoRA matrices, the vision tower if trainable) -- the same total as the naive path's G separate
prefix copies, up to float summation order.  Nothing is detached: the two cache-layer types (``_cache_classes``,
subclasses of transformers' ``DynamicLayer``) hold the autograd-tracked K/V, and the suffix's update is a
``torch.cat``.  Both are safe to recompute, so (non-reentrant) gradient checkpointing works too.

Cost per group (P tokens of prefix, T of completion): naive G(P+T) tokens through the LLM, G vision passes and
G(P+T)^2 attention; grouped P + G(T-1) tokens, one vision pass and P^2 + G(T-1)(P+T) attention.

Positions (MRoPE).  The 3-D rope index is computed by the model's own ``get_rope_index`` on
[prompt ++ T text tokens] -- exactly the call the naive full forward makes -- and split into the prefix's
(3, B, P) and the suffix's (3, B, T) parts, so whatever rule a family uses for text after vision (Qwen2/2.5-VL:
continue after the last prompt token) is reproduced, not re-implemented.  Text-only prompts (no grid) get
``arange(P+T)`` like the model's own fallback.

Masks.  Prefix: the prompt's own ``attention_mask`` (left padding excluded from attention, as in the naive path)
with the usual causal mask.  Suffix: [prompt mask ++ completion mask], causal over the completion part; every
suffix query sees its whole prefix.

Tested families (``VERIFIED_FAMILIES``): Qwen2.5-VL, Qwen2-VL, Qwen3-VL and Qwen3-VL-MoE
(``tests/models/test_prefix_group.py``: log-probs within 1e-5 and gradients within 1e-4 relative of the naive path,
fp32 CPU, images and videos, LoRA and full fine-tuning incl. the vision tower; Qwen3-VL's deepstack features only
touch prefix positions; the MoE routes each token by its own hidden state, so a suffix token meets the same
experts).  The trainer uses this path by default for these families (``run.logprob_impl=prefix_group``) and falls
back, logged, otherwise.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Sequence

import torch

from .rollout import _suppress, token_logprobs_from_logits

# exactness checked in tests/models/test_prefix_group.py
VERIFIED_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")


# ----------------------------------------------------------------------------------------------------- helpers
def _unwrap(model):
    """The transformers ``*ForConditionalGeneration`` under DDP / peft wrappers."""
    m = getattr(model, "module", model)  # DDP / accelerate
    if hasattr(m, "get_base_model"):  # peft
        m = m.get_base_model()
    return m


_WARNED: set = set()


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        import logging

        logging.getLogger("mmgrpo.models").warning(msg)


def supports_grouping(model) -> bool:
    """True for the Qwen-VL families (an inner model with ``get_rope_index``) -- what ``grouped_token_logprobs``
    handles."""
    try:
        _rope_owner(model)
        return True
    except TypeError:
        return False


def _rope_owner(model):
    base = _unwrap(model)
    for cand in (getattr(base, "model", None), base):
        if cand is not None and hasattr(cand, "get_rope_index"):
            return cand
    raise TypeError(f"{type(base).__name__} has no get_rope_index: grouped_token_logprobs supports the Qwen-VL "
                    "families (MRoPE); use rollout.compute_token_logprobs for other models")


def group_position_ids(model, prompt_inputs: dict, T: int) -> torch.Tensor:
    """(3, B, P+T) position ids of [prompt ++ T text tokens], as the naive full forward computes them.

    ``prompt_inputs``: collated prompt batch (B, P), possibly left padded.  Completion tokens are text
    (``mm_token_type_ids`` 0).  Padded prompt columns get position 0 (they are masked out of attention).
    """
    ids = prompt_inputs["input_ids"]
    B, P = ids.shape
    am = prompt_inputs.get("attention_mask")
    has_grid = prompt_inputs.get("image_grid_thw") is not None or prompt_inputs.get("video_grid_thw") is not None
    if not has_grid or prompt_inputs.get("mm_token_type_ids") is None:
        # the model's own fallback without a grid: 1-D positions 0..P+T-1 (padding included), same on 3 axes
        return torch.arange(P + T, device=ids.device).view(1, 1, -1).expand(3, B, -1)
    owner = _rope_owner(model)
    full_ids = torch.cat([ids, ids.new_zeros(B, T)], 1)  # token values of the suffix do not matter: text
    mm = prompt_inputs["mm_token_type_ids"]
    full_mm = torch.cat([mm, mm.new_zeros(B, T)], 1)
    full_am = None if am is None else torch.cat([am, am.new_ones(B, T)], 1)
    kw = dict(mm_token_type_ids=full_mm, image_grid_thw=prompt_inputs.get("image_grid_thw"),
              video_grid_thw=prompt_inputs.get("video_grid_thw"), attention_mask=full_am)
    params = inspect.signature(owner.get_rope_index).parameters
    if "second_per_grid_ts" in params:
        kw["second_per_grid_ts"] = prompt_inputs.get("second_per_grid_ts")
    pos, _ = owner.get_rope_index(full_ids, **kw)
    return pos


def _check_right_padded(mask: torch.Tensor) -> None:
    # a hole in the mask would give the naive path different (compacted) positions than ours
    if mask.shape[1] > 1 and bool((mask[:, 1:] > mask[:, :-1]).any()):
        bad = int((mask[:, 1:] > mask[:, :-1]).any(1).nonzero()[0])
        raise ValueError(f"completion_mask row {bad} is not right-padded (a 0 before a 1): {mask[bad].tolist()}")


def _expand_rows(t: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """(B, ...) -> (sum(sizes), ...): row b repeated sizes[b] times.  B == 1 uses a view (no copy)."""
    if t.shape[0] == 1:
        return t.expand(sizes[0], *t.shape[1:])
    return t.repeat_interleave(torch.as_tensor(sizes, device=t.device), dim=0)


@functools.lru_cache(maxsize=None)
def _cache_classes():
    """Two KV-cache layer types (subclasses of transformers' ``DynamicLayer``, so masks / lengths work as usual).

    * ``Capture``: the prefix forward's cache.  The first ``update`` stores (K, V) as they are (no copy, no
      detach) and returns them; a second call (the recompute of a checkpointed layer during backward) returns the
      recomputed (K, V) without touching the stored ones, so recomputation sees exactly what the first pass saw.
    * ``Prefix``: the suffix forward's cache.  Holds the G-expanded prefix (K, V) and returns
      ``cat([prefix, new])`` WITHOUT storing, i.e. a pure function of its inputs (safe to recompute; and one copy
      of the expanded prefix per layer instead of DynamicCache's two).
    """
    from transformers.cache_utils import DynamicLayer

    class Capture(DynamicLayer):
        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.dtype, self.device = key_states.dtype, key_states.device
                self.keys, self.values = key_states, value_states
                self.is_initialized = True
            return key_states, value_states

    class Prefix(DynamicLayer):
        def __init__(self, keys, values):
            super().__init__()
            self.dtype, self.device = keys.dtype, keys.device
            self.keys, self.values = keys, values
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            return torch.cat([self.keys, key_states], -2), torch.cat([self.values, value_states], -2)

    return Capture, Prefix


def _num_cache_layers(model) -> int:
    cfg = _unwrap(model).config
    text = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    return int(text.num_hidden_layers)


class _allow_checkpoint_with_cache:
    """Let checkpointed decoder layers keep our cache (transformers drops ``past_key_values`` under gradient
    checkpointing because its DynamicCache would be appended to twice; ours are recompute-safe, see
    ``_cache_classes``).  Only non-reentrant checkpointing keeps the autograd link of the captured prefix K/V."""

    def __init__(self, model):
        self.layers = [m for m in _unwrap(model).modules()
                       if getattr(m, "gradient_checkpointing", False) and hasattr(m, "_can_checkpoint_with_cache")]
        for m in self.layers:
            fn = getattr(m, "_gradient_checkpointing_func", None)
            if getattr(fn, "keywords", {}).get("use_reentrant", False):
                raise ValueError("grouped_token_logprobs needs non-reentrant gradient checkpointing "
                                 "(gradient_checkpointing_kwargs={'use_reentrant': False}); reentrant "
                                 "checkpointing would cut the gradient from the completions to the shared prefix")

    def __enter__(self):
        for m in self.layers:
            m._can_checkpoint_with_cache = True  # instance attribute shadows the class default

    def __exit__(self, *exc):
        for m in self.layers:
            del m._can_checkpoint_with_cache


# ----------------------------------------------------------------------------------------------------- main API
def grouped_token_logprobs(
    model,
    prompt_inputs: dict[str, torch.Tensor],
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    temperature: float = 1.0,
    suppress_token_ids: Sequence[int] | None = None,
    return_logits: bool = False,
    group_sizes: Sequence[int] | None = None,
    chunk_size: int = 0,
):
    """Per-token log-probs of G completions per prompt, with each prompt (vision + text prefix) encoded once.

    Drop-in for ``compute_token_logprobs`` when rows come in groups sharing a prompt: same numbers (fp32:
    within ~1e-6), same gradients (within float summation order), far less compute for long prefixes.

    Args:
      model: a Qwen2-VL / Qwen2.5-VL / Qwen3-VL ``*ForConditionalGeneration``, optionally
        wrapped by peft (LoRA) and/or DDP.  Attention implementation must accept a KV cache (sdpa, eager, flash).
      prompt_inputs: processor output of ONE prompt ((1, P) ``input_ids``, ``attention_mask``,
        ``mm_token_type_ids`` and its ``pixel_values[_videos]`` / ``*_grid_thw`` / ``second_per_grid_ts``), or a
        ``collate_prompts`` batch of B different prompts (left padded; several groups in one call).
        Left padding is fine: pad columns are excluded from attention and from the rope index exactly as in the
        naive path (the last column must be a real token, which left padding guarantees; right-padded prompts are
        rejected).
      completion_ids, completion_mask: (N, T) right-padded completions (mask 1 up to and including EOS).
        Rows are group-major: rows ``sum(group_sizes[:b]) ..`` belong to prompt b.
      group_sizes: completions per prompt (default: N // B each, N must be divisible by B).
      temperature, suppress_token_ids: the sampling distribution, as in ``compute_token_logprobs``.
      chunk_size: > 0 applies the output head ``chunk_size`` tokens at a time (``mmgrpo.vlm.models.chunked``), as in
        ``compute_token_logprobs``; ``return_logits`` then returns a ``chunked.HeadInputs``.

    Returns:
      logp (N, T) float32, 0 where the mask is 0; with ``return_logits`` also the temperature-scaled,
      suppressed logits (N, T, V).

    Limits and notes:
      * the prompt must be an exact prefix of every row of its group (no per-row prompt edits);
      * the G-expanded prefix keys/values are materialised once per layer inside the suffix attention
        (O(N P h_kv d) per layer -- what the naive path stores anyway), activations are O(P + N T) instead of
        O(N (P + T));
      * gradient checkpointing (non-reentrant, transformers' default) works: the caches used here are safe to
        recompute; reentrant checkpointing is refused (it would silently cut the prefix gradient);
      * the module is called twice per backward (prefix, then suffix).  mmgrpo's trainer all-reduces gradients
        itself and never wraps the policy in DDP; with a DDP-wrapped model call this on ``model.module`` inside
        ``model.no_sync()`` and reduce gradients yourself;
      * only the Qwen-VL families (a ``get_rope_index`` on the inner model) are supported; others raise
        ``TypeError`` (``grouped_rows_token_logprobs`` falls back to the naive path for them).
    """
    if completion_ids.shape != completion_mask.shape or completion_ids.dim() != 2:
        raise ValueError(f"completion_ids {tuple(completion_ids.shape)} and completion_mask "
                         f"{tuple(completion_mask.shape)} must be the same (N, T)")
    ids = prompt_inputs["input_ids"]
    if ids.dim() != 2:
        raise ValueError(f"prompt input_ids must be (B, P), got {tuple(ids.shape)}")
    B, P = ids.shape
    N, T = completion_ids.shape
    if T < 1:
        raise ValueError("completions must have at least one column")
    if group_sizes is None:
        if N % B:
            raise ValueError(f"{N} completion rows cannot be split evenly over {B} prompts; pass group_sizes")
        group_sizes = [N // B] * B
    group_sizes = [int(g) for g in group_sizes]
    if len(group_sizes) != B or sum(group_sizes) != N or min(group_sizes) < 1:
        raise ValueError(f"group_sizes {group_sizes} must have {B} positive entries summing to {N}")
    am = prompt_inputs.get("attention_mask")
    if am is None:
        am = torch.ones_like(ids)
    if not bool(am[:, -1].all()):
        raise ValueError("prompt batch must be left padded (its last column is padding in some row)")
    _check_right_padded(completion_mask)

    pos = group_position_ids(model, dict(prompt_inputs, attention_mask=am), T)  # (3, B, P+T)
    fwd = {k: v for k, v in prompt_inputs.items() if k not in ("input_ids", "attention_mask", "position_ids")}
    Capture, Prefix = _cache_classes()
    from transformers.cache_utils import Cache

    capture = Cache(layers=[Capture() for _ in range(_num_cache_layers(model))])
    chunked = None
    if chunk_size > 0:
        from . import chunked

        if chunked.chunkable_head(model) is None:
            chunked = None
    with _allow_checkpoint_with_cache(model), \
            (chunked.capture_head_inputs(model) if chunked else contextlib.nullcontext([])) as heads:
        # with chunking, ``heads`` receives the hidden states the head would see and ``.logits`` are empty
        out = model(input_ids=ids, attention_mask=am, position_ids=pos[:, :, :P], past_key_values=capture,
                    use_cache=True, logits_to_keep=1, **fwd)
        first = _expand_rows(heads[-1][:, -1:] if chunked else out.logits[:, -1:], group_sizes)
        # first (N, 1, V) logits (or (N, 1, H) hidden states): predicts completion token 0
        if T == 1:
            logits = first
        else:
            if not all(layer.is_initialized for layer in capture.layers):
                raise RuntimeError("the prefix forward did not write every layer's keys/values into the cache")
            cache = Cache(layers=[Prefix(_expand_rows(layer.keys, group_sizes), _expand_rows(layer.values, group_sizes))
                                  for layer in capture.layers])
            s_ids = completion_ids[:, :T - 1].to(ids.device)
            s_am = torch.cat([_expand_rows(am, group_sizes), completion_mask[:, :T - 1].to(am)], 1)
            s_pos = _expand_rows(pos[:, :, P:P + T - 1].transpose(0, 1), group_sizes).transpose(0, 1)
            s_out = model(input_ids=s_ids, attention_mask=s_am, position_ids=s_pos, past_key_values=cache,
                          use_cache=True)
            logits = torch.cat([first, heads[-1] if chunked else s_out.logits], 1)  # (N, T, V) or (N, T, H)
    if chunked:
        head = chunked.head_inputs(model, logits, temperature, suppress_token_ids, chunk_size)
        lp = head.token_logprobs(completion_ids.to(logits.device), completion_mask.to(logits.device))
        return (lp, head) if return_logits else lp
    lp = token_logprobs_from_logits(logits, completion_ids.to(logits.device), temperature, suppress_token_ids)
    lp = lp * completion_mask.to(lp)
    if return_logits:
        return lp, _suppress(logits.float() / float(temperature), suppress_token_ids)
    return lp


def _same_prompt(a: dict, b: dict) -> bool:
    if a is b:
        return True
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor):
            if not isinstance(y, torch.Tensor) or x.shape != y.shape or not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


def grouped_rows_token_logprobs(
    model,
    row_items: Sequence[dict],
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    pad_token_id: int,
    temperature: float = 1.0,
    suppress_token_ids: Sequence[int] | None = None,
    return_logits: bool = False,
    device=None,
    fallback: bool = True,
    chunk_size: int = 0,
):
    """Trainer-facing form: one prompt item per row (as in ``RolloutBatch.items``), rows of a group contiguous.

    Consecutive rows whose items are the same object (or equal tensors) form a group; the unique prompts are
    collated (left padded) and scored with ONE ``grouped_token_logprobs`` call.  Equivalent to
    ``compute_token_logprobs(model, collate_prompts(row_items, pad_token_id), ...)``, which is also what runs
    (``fallback=True``, warned once) for a model without shared-prefix support.  Intended use in the trainer's
    ``_logp``: ``grouped_rows_token_logprobs(model, [rb.items[i] for i in idx], ids, mask, pad_id, temperature,
    suppress_token_ids, return_logits, device=device)``.
    """
    from .rollout import batch_to, collate_prompts, compute_token_logprobs

    if len(row_items) != completion_ids.shape[0]:
        raise ValueError(f"{len(row_items)} row items for {completion_ids.shape[0]} completion rows")
    uniq, sizes = [], []
    for it in row_items:
        if uniq and _same_prompt(uniq[-1], it):
            sizes[-1] += 1
        else:
            uniq.append(it)
            sizes.append(1)
    if device is not None:
        completion_ids, completion_mask = completion_ids.to(device), completion_mask.to(device)
    if not supports_grouping(model):
        if fallback:
            _warn_once(f"{type(_unwrap(model)).__name__}: no shared-prefix support, using the naive log-prob path")
            batch = collate_prompts(list(row_items), pad_token_id)
            batch = batch_to(batch, device) if device is not None else batch
            return compute_token_logprobs(model, batch, completion_ids, completion_mask, temperature,
                                          suppress_token_ids, return_logits, chunk_size=chunk_size)
        _rope_owner(model)  # raises the explanatory TypeError
    batch = collate_prompts(uniq, pad_token_id)
    if device is not None:
        batch = batch_to(batch, device)
    return grouped_token_logprobs(model, batch, completion_ids, completion_mask, temperature, suppress_token_ids,
                                  return_logits, group_sizes=sizes, chunk_size=chunk_size)


__all__ = ["grouped_token_logprobs", "grouped_rows_token_logprobs", "group_position_ids", "supports_grouping",
           "VERIFIED_FAMILIES"]
