"""Shared-prefix group forward == naive per-row forward: log-probs (1e-5) and gradients (1e-4 relative), fp32 CPU.

Reference = ``rollout.compute_token_logprobs`` on the prompt repeated G times (itself tested against an unpadded
float64 recomputation in test_rollout_logprobs.py).  Cases: one image prompt, one video prompt, and both in one
call (left-padded prompts, two groups); G=3, completions of unequal lengths; LoRA (random B so every LoRA matrix
gets a gradient) and full fine-tuning with a trainable vision tower; gradient checkpointing.
"""
import pytest
import torch

from mmgrpo.vlm.models.adapters import LoraSpec, load_policy
from mmgrpo.vlm.models.inputs import build_prompt_item
from mmgrpo.vlm.models.prefix_group import (group_position_ids, grouped_rows_token_logprobs,
                                        grouped_token_logprobs)
from mmgrpo.vlm.models.rollout import collate_prompts, compute_token_logprobs
from mmgrpo.vlm.models.tiny import synthetic_frames, synthetic_image

G, T = 3, 7
LENS = [7, 3, 5, 1, 6, 7]  # per row; rows 0-2 group 0, rows 3-5 group 1 (right padding)
TEMP = 0.9


def _msg(kind, q):
    return [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": q}]}]


def _items(pol):
    return {
        "image": build_prompt_item(pol.processor, pol.adapter, _msg("image", "what is shown here?"),
                                   images=[synthetic_image(0, 84, 112)]),
        "video": build_prompt_item(pol.processor, pol.adapter, _msg("video", "when does it open?"),
                                   video=synthetic_frames(1, 6), sample_fps=2.0),
    }


def _completions(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(20, 250, (n, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(LENS[:n])[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


def _policy(tiny_dirs, family, mode, **kw):
    if mode == "lora":
        pol = load_policy(tiny_dirs(family), lora=LoraSpec(r=4, alpha=8), **kw)
        with torch.no_grad():  # peft initialises B = 0, which would leave every lora_A gradient at 0
            gen = torch.Generator().manual_seed(1)
            for n, p in pol.model.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    else:
        pol = load_policy(tiny_dirs(family), freeze_vision=False, **kw)
    return pol


def _loss_and_grads(pol, fn, batch, ids, mask):
    m = pol.model
    m.zero_grad(set_to_none=True)
    lp = fn(m, batch, ids, mask, TEMP, pol.suppress_token_ids)
    w = torch.linspace(-1.0, 1.0, lp.numel()).view_as(lp)  # token-dependent weights: no cancellation by symmetry
    (lp * w).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
    return lp.detach(), grads


def _compare(pol, prompt_items):
    n = G * len(prompt_items)
    ids, mask = _completions(n)
    naive_batch = collate_prompts([it for it in prompt_items for _ in range(G)], pol.tokenizer.pad_token_id)
    group_batch = collate_prompts(prompt_items, pol.tokenizer.pad_token_id)
    a, ga = _loss_and_grads(pol, compute_token_logprobs, naive_batch, ids, mask)
    b, gb = _loss_and_grads(pol, grouped_token_logprobs, group_batch, ids, mask)
    assert b.shape == (n, T) and torch.equal(b == 0, a == 0)
    torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
    assert (b[mask == 0] == 0).all()
    trainable = {nm for nm, p in pol.model.named_parameters() if p.requires_grad}
    assert set(ga) == set(gb) == trainable
    worst = 0.0
    for nm in ga:
        scale = float(ga[nm].abs().max())
        if scale == 0.0:  # e.g. embedding rows of unused tokens are not in ga; whole-zero tensors must agree
            assert float(gb[nm].abs().max()) == 0.0, nm
            continue
        worst = max(worst, float((ga[nm] - gb[nm]).abs().max()) / scale)
    assert worst <= 1e-4, worst
    return ga


@pytest.mark.parametrize("family,mode", [("qwen2_5_vl", "lora"), ("qwen2_5_vl", "full"), ("qwen2_vl", "lora"),
                                         ("qwen2_vl", "full"), ("qwen3_vl", "full"), ("qwen3_vl_moe", "full")])
def test_grouped_equals_naive_logprobs_and_grads(tiny_dirs, family, mode):
    pol = _policy(tiny_dirs, family, mode)
    its = _items(pol)
    for prompts in ([its["image"]], [its["video"]], [its["video"], its["image"]]):
        grads = _compare(pol, prompts)
    if mode == "lora":
        assert all("lora_" in nm for nm in grads) and len(grads) > 0
        assert all(float(g.abs().max()) > 0 for g in grads.values())
    else:  # gradient reaches the vision tower through the shared prefix's keys/values
        vis = [g for nm, g in grads.items() if ".visual." in nm]
        assert vis and all(float(g.abs().max()) > 0 for g in vis)


def test_grouped_with_gradient_checkpointing(tiny_dirs):
    """transformers drops caches in checkpointed layers; our recompute-safe caches are kept, grads still exact."""
    pol = _policy(tiny_dirs, "qwen2_5_vl", "full", gradient_checkpointing=True)
    its = _items(pol)
    _compare(pol, [its["video"], its["image"]])


def test_reentrant_checkpointing_is_refused(tiny_dirs):
    pol = load_policy(tiny_dirs("qwen2_5_vl"))
    pol.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    pol.model.train()
    its = _items(pol)
    ids, mask = _completions(G)
    with pytest.raises(ValueError, match="non-reentrant"):
        grouped_token_logprobs(pol.model, its["image"], ids, mask)


def test_work_is_shared_vision_once_and_prefix_once(tiny_dirs):
    """The vision tower sees each prompt's pixels once and the LLM P + G*(T-1) tokens (naive: G*(P+T))."""
    pol = load_policy(tiny_dirs("qwen2_5_vl"))
    its = _items(pol)
    item = its["video"]
    P = item["input_ids"].shape[1]
    seen = {"pix": 0, "tok": 0}
    base = pol.model
    h1 = base.model.visual.register_forward_pre_hook(lambda m, a: seen.__setitem__("pix", seen["pix"] + a[0].shape[0]))
    h2 = base.model.language_model.layers[0].register_forward_pre_hook(
        lambda m, a: seen.__setitem__("tok", seen["tok"] + a[0].shape[0] * a[0].shape[1]))
    ids, mask = _completions(G)
    try:
        with torch.no_grad():
            grouped_token_logprobs(base, item, ids, mask)
        assert seen == {"pix": item["pixel_values_videos"].shape[0], "tok": P + G * (T - 1)}
        seen.update(pix=0, tok=0)
        with torch.no_grad():
            compute_token_logprobs(base, collate_prompts([item] * G, 0), ids, mask)
        assert seen == {"pix": G * item["pixel_values_videos"].shape[0], "tok": G * (P + T)}
    finally:
        h1.remove()
        h2.remove()


def test_mrope_continuation_matters(tiny_dirs, monkeypatch):
    """The equality above is sensitive to the suffix's 3-D positions: plain 1-D positions P+t (what a text-only
    prefix cache would use) are far off for a video prompt, where text after the video continues from the rope
    index, not from the token count."""
    import mmgrpo.vlm.models.prefix_group as pg

    pol = load_policy(tiny_dirs("qwen2_5_vl"))
    item = _items(pol)["video"]
    P = item["input_ids"].shape[1]
    ids, mask = _completions(G)
    with torch.no_grad():
        ref = compute_token_logprobs(pol.model, collate_prompts([item] * G, 0), ids, mask)
        pos = group_position_ids(pol.model, item, T)
        assert int(pos[0, 0, P]) < P  # the video compresses positions: the suffix does NOT start at P
        assert torch.equal(pos[:, 0, P:], pos[0, 0, P] + torch.arange(T).expand(3, T))  # text: +1 on all 3 axes
        good = grouped_token_logprobs(pol.model, item, ids, mask)
        wrong = pos.clone()
        wrong[:, :, P:] = torch.arange(P, P + T)
        monkeypatch.setattr(pg, "group_position_ids", lambda *a, **k: wrong)
        bad = pg.grouped_token_logprobs(pol.model, item, ids, mask)
    torch.testing.assert_close(good, ref, atol=1e-5, rtol=0)
    assert float((bad - ref).abs().max()) > 1e-3


def test_rows_api_matches_trainer_layout_and_no_grad_logits(tiny_dirs):
    """Per-row items (as in the trainer's RolloutBatch): groups detected by identity; return_logits agrees."""
    pol = load_policy(tiny_dirs("qwen2_5_vl"))
    its = _items(pol)
    rows = [its["image"]] * G + [its["video"]] * G
    ids, mask = _completions(2 * G, seed=3)
    pad = pol.tokenizer.pad_token_id
    with torch.no_grad():
        a, la = compute_token_logprobs(pol.model, collate_prompts(rows, pad), ids, mask, TEMP,
                                       pol.suppress_token_ids, return_logits=True)
        b, lb = grouped_rows_token_logprobs(pol.model, rows, ids, mask, pad, TEMP, pol.suppress_token_ids,
                                            return_logits=True)
        # a copy of a prompt item (equal tensors, different object) is still recognised as the same prompt
        c = grouped_rows_token_logprobs(pol.model, [dict(r) for r in rows], ids, mask, pad, TEMP,
                                        pol.suppress_token_ids)
    torch.testing.assert_close(b, a, atol=1e-5, rtol=0)
    torch.testing.assert_close(c, a, atol=1e-5, rtol=0)
    assert torch.equal(torch.isfinite(la), torch.isfinite(lb))  # the same suppressed vocabulary
    keep = torch.isfinite(la) & mask.bool().unsqueeze(-1)  # logits at padded positions are never used
    torch.testing.assert_close(lb[keep], la[keep], atol=1e-4, rtol=0)


def test_single_token_completions(tiny_dirs):
    pol = load_policy(tiny_dirs("qwen2_5_vl"))
    item = _items(pol)["image"]
    ids = torch.tensor([[30], [31], [32]])
    mask = torch.ones_like(ids)
    with torch.no_grad():
        a = compute_token_logprobs(pol.model, collate_prompts([item] * 3, 0), ids, mask)
        b = grouped_token_logprobs(pol.model, item, ids, mask)
    torch.testing.assert_close(b, a, atol=1e-5, rtol=0)


def test_bad_inputs_raise_clear_errors(tiny_dirs):
    pol = load_policy(tiny_dirs("qwen2_5_vl"))
    its = _items(pol)
    ids, mask = _completions(G)
    holes = mask.clone()
    holes[0, 1] = 0
    with pytest.raises(ValueError, match="row 0 is not right-padded"):
        grouped_token_logprobs(pol.model, its["image"], ids, holes)
    right_padded = dict(its["image"])
    right_padded["input_ids"] = torch.cat([its["image"]["input_ids"], torch.zeros(1, 2, dtype=torch.long)], 1)
    right_padded["attention_mask"] = torch.cat([its["image"]["attention_mask"], torch.zeros(1, 2, dtype=torch.long)], 1)
    right_padded["mm_token_type_ids"] = torch.cat([its["image"]["mm_token_type_ids"],
                                                   torch.zeros(1, 2, dtype=torch.long)], 1)
    with pytest.raises(ValueError, match="left padded"):
        grouped_token_logprobs(pol.model, right_padded, ids, mask)
    two = collate_prompts([its["image"], its["video"]], 0)
    with pytest.raises(ValueError, match="cannot be split evenly"):
        grouped_token_logprobs(pol.model, two, ids, mask)
    with pytest.raises(ValueError, match="group_sizes"):
        grouped_token_logprobs(pol.model, two, ids, mask, group_sizes=[3, 1])


def test_unsupported_model_falls_back_to_naive_path():
    """A model without MRoPE (text-only Qwen2) is not grouped: the rows API runs the naive path, the core API
    raises a TypeError naming the limitation."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mmgrpo.vlm.models.prefix_group import supports_grouping

    torch.manual_seed(0)
    lm = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1))
    assert not supports_grouping(lm)
    item = {"input_ids": torch.tensor([[5, 6, 7, 8]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    ids = torch.tensor([[9, 10, 11], [12, 13, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    with torch.no_grad():
        a = compute_token_logprobs(lm, collate_prompts([item, item], 0), ids, mask)
        b = grouped_rows_token_logprobs(lm, [item, item], ids, mask, 0)
    assert torch.equal(a, b)
    with pytest.raises(TypeError, match="get_rope_index"):
        grouped_rows_token_logprobs(lm, [item, item], ids, mask, 0, fallback=False)
