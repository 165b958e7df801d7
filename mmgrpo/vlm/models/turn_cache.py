"""Later turns of a multi-turn rollout continue from the KV cache of the earlier ones (HF backend).

A row's next prompt (:class:`mmgrpo.vlm.tools.rollout.MultiTurnBackend`) is its whole conversation so far: the first
prompt, its sampled turns and the tool turns. Without this module the HF backend prefills all of it again at every
turn. With it, the backend keeps each row's cache after sampling a turn (:func:`row_states`: the key/value columns
of the row's real tokens, left padding and post-EOS steps dropped) and the next turn only prefills what is new
(:func:`continue_sample`):

* the cached token ids are compared with the new prompt's; the longest common prefix is reused (a turn cut short by
  a call format -- MGPO's release -- or any other change simply shortens it), backed off to the start of a vision
  block, and of the first block of a medium, so an image or video (a Qwen3-VL video is one block per frame) is
  never split between cache and prefill (:func:`reusable_prefix`, :func:`split_media`);
* the rest (the last sampled token, which the decode loop never fed, the tool turn with its new images / frames, the
  generation prompt) is prefilled on top of the row's cache, with the new media only and with the MRoPE positions
  the model computes for the whole conversation (sliced to the new part), one row at a time;
* the rows are then stacked into one left-padded cache (room for the new tokens) and decoded together by the same
  loop as the first turn (:func:`mmgrpo.vlm.models.rollout.decode_loop`).

:func:`continue_generate` is the HF backend's ``generate`` for such a turn (the first turn keeps the caches with
``generate(..., keep_state=True)``); :class:`mmgrpo.vlm.tools.rollout.MultiTurnBackend` calls it when
``tools.reuse_kv`` is on and the backend ``supports_turn_cache``.

Exactness: the same tokens and sampling log-probs as prefilling the whole conversation, up to float rounding of a
different batch layout (``tests/tools/test_turn_cache.py``); the trainer recomputes the log-probs either way.
"""
from __future__ import annotations

from typing import Sequence

import torch

from mmgrpo.vlm.models.rollout import (RolloutOutput, RowState, _decode_step, _eos_ids, _generation_modules,
                                       _output_cache, _preallocated_layer_class, output_from_chunks,
                                       decode_loop, explicit_decoding, row_states)

__all__ = ["reusable_prefix", "split_media", "continue_sample", "continue_generate", "RowState", "row_states"]


def reusable_prefix(cached: torch.Tensor, full: torch.Tensor, vstart: int, vend: int) -> int:
    """How many leading tokens of ``full`` (L,) the cache of ``cached`` can serve: their common prefix, at most
    L - 1 (the last position is prefilled for its logits), backed off to the start of a vision block
    (``vstart`` ... ``vend``) that would be split."""
    n = min(int(cached.numel()), int(full.numel()) - 1)
    if n <= 0:
        return 0
    diff = (cached[:n] != full[:n]).nonzero()
    c = int(diff[0]) if diff.numel() else n
    starts = (full == vstart).nonzero().flatten().tolist()
    ends = (full == vend).nonzero().flatten().tolist()
    for s in starts:
        e = next((x for x in ends if x > s), int(full.numel()))
        if s < c <= e:  # the block [s, e] would be split (its end token is part of the block)
            c = s
            break
    return c


_MEDIA = (("image_grid_thw", "pixel_values"), ("video_grid_thw", "pixel_values_videos"))


def split_media(item: dict, full: torch.Tensor, c: int, pads: Sequence[int | None], vstart: int) -> tuple[int, dict]:
    """(c', media) : ``c`` moved back (if needed) so that no image / video has tokens on both sides of it -- a
    Qwen3-VL video is several vision blocks, one per frame -- and the media tensors of ``item`` whose tokens all lie
    after ``c'`` (token order; ``pads`` = the image and video pad ids)."""
    while True:
        moved, spans = False, {}
        for pad, (grid_key, _) in zip(pads, _MEDIA):
            grids = item.get(grid_key)
            if grids is None or pad is None:
                continue
            where = (full == pad).nonzero().flatten()
            if not where.numel():
                continue
            per = grids.prod(-1)
            toks = (per // (int(per.sum()) // int(where.numel()))).tolist()  # tokens per medium (patches / merge**2)
            ends = torch.tensor(toks).cumsum(0).tolist()
            before = int((where < c).sum())
            k = sum(1 for e in ends if e <= before)  # media wholly before c
            start = ends[k - 1] if k else 0
            if before > start:  # medium k is split: back c off to the vision block holding its first token
                first = int(where[start])
                blocks = (full[:first] == vstart).nonzero().flatten()
                c, moved = (int(blocks[-1]) if blocks.numel() else 0), True
                break
            spans[grid_key] = (k, sum(int(x) for x in per[:k]))
        if not moved:
            break
    out = {}
    for grid_key, pix_key in _MEDIA:
        if grid_key not in spans or spans[grid_key][0] >= item[grid_key].shape[0]:
            continue
        k, rows = spans[grid_key]
        out[grid_key] = item[grid_key][k:]
        out[pix_key] = item[pix_key][rows:]
        if grid_key == "video_grid_thw" and item.get("second_per_grid_ts") is not None:
            out["second_per_grid_ts"] = item["second_per_grid_ts"].reshape(-1)[k:]
    return c, out


@torch.no_grad()
def continue_sample(gm, items: Sequence[dict], states: Sequence[RowState], params, seeds: Sequence[int],
                    eos_ids: Sequence[int], pad_id: int, tokenizer, suppress_token_ids=None, step_hook=None,
                    lean: bool | None = None, device=None):
    """One turn for each row (``items[r]``: its whole conversation, batch dim 1, unpadded) from its cache
    ``states[r]``. Returns (ids (N, T), sampling log-probs (N, T), new states, reused (N,), prefilled (N,))."""
    from transformers.cache_utils import DynamicCache

    tok = tokenizer
    vstart, vend = tok.convert_tokens_to_ids("<|vision_start|>"), tok.convert_tokens_to_ids("<|vision_end|>")
    image_pad, video_pad = tok.convert_tokens_to_ids("<|image_pad|>"), tok.convert_tokens_to_ids("<|video_pad|>")
    device = device or next(gm.parameters()).device
    N = len(items)
    logits, caches, positions, fulls, reused, prefilled = [], [], [], [], [], []
    mm_dtype = None
    for item, st in zip(items, states):
        full = item["input_ids"].reshape(-1)
        c, media = split_media(item, full, reusable_prefix(st.ids, full, vstart, vend), (image_pad, video_pad), vstart)
        kw = {"attention_mask": torch.ones(1, full.numel(), dtype=torch.long)}
        for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts", "mm_token_type_ids"):
            if item.get(k) is not None:
                kw[k] = item[k]
        kw = {k: v.to(device) for k, v in kw.items()}
        pos = gm._prepare_position_ids_for_generation(full[None].to(device), dict(kw))
        fwd = {"input_ids": full[c:][None].to(device), "attention_mask": kw["attention_mask"],
               "position_ids": pos[..., c:]}
        if item.get("mm_token_type_ids") is not None:
            mm = item["mm_token_type_ids"].reshape(-1)
            fwd["mm_token_type_ids"] = mm[c:][None].to(device)
            mm_dtype = mm.dtype
        fwd.update({k: v.to(device) for k, v in media.items()})
        cache = DynamicCache(ddp_cache_data=[(k[:, :, :c], v[:, :, :c]) for k, v in st.kv]) if c else None
        out = gm(**fwd, cache=cache, use_cache=True, logits_to_keep=1)
        logits.append(out.logits[:, -1].float())
        caches.append(_output_cache(out))
        positions.append(pos[..., -1:])
        fulls.append(full)
        reused.append(c)
        prefilled.append(int(full.numel()) - c)
    # stack the rows into one left-padded cache with room for the new tokens, as the first turn's decode has
    L = [int(f.numel()) for f in fulls]
    Lmax, extra = max(L), params.max_new_tokens
    cls = _preallocated_layer_class()
    layers = []
    for li in range(len(caches[0].layers)):
        k0 = caches[0].layers[li].keys
        H, D = k0.shape[1], k0.shape[-1]
        kb = k0.new_zeros((N, H, Lmax + extra, D))
        vb = caches[0].layers[li].values.new_zeros((N, H, Lmax + extra, caches[0].layers[li].values.shape[-1]))
        for r, cch in enumerate(caches):
            kb[r, :, Lmax - L[r]:Lmax] = cch.layers[li].keys[0]
            vb[r, :, Lmax - L[r]:Lmax] = cch.layers[li].values[0]
        lay = cls()
        lay._k, lay._v, lay._len = kb, vb, Lmax
        lay.keys, lay.values = kb[:, :, :Lmax], vb[:, :, :Lmax]
        lay.device, lay.is_initialized = kb.device, True
        layers.append(lay)
    batch_cache = caches[0]
    batch_cache.layers = layers
    am_buf = torch.ones((N, Lmax + extra), dtype=torch.long, device=device)
    ids_pad = torch.full((N, Lmax), pad_id, dtype=torch.long)
    for r in range(N):
        am_buf[r, :Lmax - L[r]] = 0
        ids_pad[r, Lmax - L[r]:] = fulls[r]
    pos = torch.cat(positions, dim=positions[0].dim() - 2)
    decode = _decode_step(gm, mm_dtype, lean=lean)
    ids, lps = decode_loop(decode, torch.cat(logits), batch_cache, am_buf, Lmax, pos, params, seeds, eos_ids, pad_id,
                           suppress_token_ids, step_hook)
    new = row_states(batch_cache, am_buf[:, :Lmax], ids_pad.to(device), ids, eos_ids)
    return ids, lps, new, torch.tensor(reused), torch.tensor(prefilled)


@torch.no_grad()
def continue_generate(backend, prompts: Sequence[dict], states: Sequence[RowState], params,
                      seeds: Sequence[int] | None = None) -> RolloutOutput:
    """:meth:`HFRolloutBackend.generate` for one generation of each prompt, continued from ``states`` (the rows'
    caches of their earlier turns): a ``RolloutOutput`` with the new ``kv_states``, ``reused_tokens`` and
    ``prefill_tokens``; chunks of ``backend.max_batch_size`` rows."""
    if len(states) != len(prompts) or not backend.supports_turn_cache:
        raise ValueError("continue_generate: one cache per prompt, and a backend with shared-prefix sampling")
    model = getattr(backend.model, "module", backend.model)
    gm = _generation_modules(model)[0]
    N = len(prompts)
    seeds = list(seeds) if seeds is not None else torch.randint(0, 2**62, (N,)).tolist()
    pad, eos = backend.tokenizer.pad_token_id, _eos_ids(model, backend.tokenizer)
    device = backend.device or next(model.parameters()).device
    was_training = model.training
    model.eval()
    ids_c, lp_c, new, reused, prefilled = [], [], [], [], []
    try:
        for s in range(0, N, backend.max_batch_size):
            e = s + backend.max_batch_size
            with explicit_decoding(model, "HFRolloutBackend"):
                ids, lp, st, ru, pf = continue_sample(gm, prompts[s:e], states[s:e], params, seeds[s:e], eos, pad,
                                                      backend.tokenizer, backend.suppress_token_ids,
                                                      backend.step_hook, device=device)
            ids_c.append(ids.cpu())
            lp_c.append(lp.cpu())
            new.extend(st)
            reused.append(ru)
            prefilled.append(pf)
    finally:
        model.train(was_training)
    return output_from_chunks(ids_c, lp_c, pad, eos, backend.tokenizer, prompt_index=torch.arange(N), kv_states=new,
                              reused_tokens=torch.cat(reused), prefill_tokens=torch.cat(prefilled))
