"""Shared-prefix rollouts (one prefill per prompt, KV cache expanded to G rows) against the repeated path
(``model.generate`` on the prompt repeated G times) and against an independent full forward."""
import pytest
import torch

from mmgrpo.vlm.models.adapters import load_policy
from mmgrpo.vlm.models.inputs import build_prompt_item
from mmgrpo.vlm.models.rollout import HFRolloutBackend, SamplingParams
from mmgrpo.vlm.models.tiny import synthetic_frames, synthetic_image


def _msgs(kind, q):
    return [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": q}]}]


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen2_vl", "qwen3_vl"])
def case(request, tiny_dirs):
    pol = load_policy(tiny_dirs(request.param))
    items = [  # different lengths (left padding), a video (MRoPE positions != token index), an image
        build_prompt_item(pol.processor, pol.adapter, _msgs("video", "when does the person open the door?"),
                          video=synthetic_frames(1, 8), sample_fps=2.0),
        build_prompt_item(pol.processor, pol.adapter, _msgs("image", "what?"), images=[synthetic_image(0, 84, 112)]),
    ]
    return pol, items


def _backend(pol, shared, max_batch_size=4):
    return HFRolloutBackend(pol.model, pol.processor, pol.suppress_token_ids, max_batch_size=max_batch_size,
                            shared_prefix=shared)


@pytest.mark.parametrize("params", [SamplingParams(max_new_tokens=10, temperature=0.9),
                                    SamplingParams(max_new_tokens=10, temperature=0.7, top_k=20, top_p=0.8),
                                    SamplingParams(max_new_tokens=4, greedy=True)],
                         ids=["plain", "topk_topp", "greedy"])
def test_shared_prefix_same_tokens_as_repeated_generate(case, params):
    pol, items = case
    seeds = [11, 12, 13, 14, 15, 16]
    rep = _backend(pol, False).generate(items, 3, params, seeds=seeds)
    # max_batch_size 4 -> one prompt (3 rows) per shared chunk, vs 4 + 2 rows in the repeated chunks
    sh = _backend(pol, True).generate(items, 3, params, seeds=seeds)
    assert torch.equal(sh.completion_ids, rep.completion_ids)
    assert torch.equal(sh.completion_mask, rep.completion_mask)
    assert torch.equal(sh.truncated, rep.truncated) and sh.prompt_index.tolist() == rep.prompt_index.tolist()
    torch.testing.assert_close(sh.logprobs, rep.logprobs, atol=1e-5, rtol=0)
    if not params.greedy:  # the seeds matter: other seeds give other samples
        other = _backend(pol, True).generate(items, 3, params, seeds=[s + 100 for s in seeds])
        assert not torch.equal(other.completion_ids, sh.completion_ids)


def test_shared_prefix_logprobs_match_an_independent_forward(case):
    """The MRoPE trap: decoded tokens must sit at the prompt's last 3D position + 1 (not at their index).  Score
    each sampled row with one unpadded full forward (the model builds its own positions) in float64."""
    pol, items = case
    temp = 0.8
    out = _backend(pol, True, max_batch_size=64).generate(items, 2, SamplingParams(max_new_tokens=8,
                                                                                   temperature=temp),
                                                           seeds=[1, 2, 3, 4])
    for r in range(4):
        item = items[int(out.prompt_index[r])]
        L = int(out.completion_mask[r].sum())
        comp = out.completion_ids[r, :L]
        ids = torch.cat([item["input_ids"][0], comp]).unsqueeze(0)
        inp = dict(item, input_ids=ids, attention_mask=torch.ones_like(ids),
                   mm_token_type_ids=torch.cat([item["mm_token_type_ids"][0], torch.zeros_like(comp)])[None])
        with torch.no_grad():
            logits = pol.model(**inp).logits[0].double() / temp
        logits[:, pol.suppress_token_ids] = float("-inf")
        P = item["input_ids"].shape[1]
        ref = torch.log_softmax(logits, -1)[P - 1:P - 1 + L].gather(1, comp[:, None]).squeeze(1)
        torch.testing.assert_close(out.logprobs[r, :L].double(), ref, atol=2e-5, rtol=0)


def test_shared_prefix_runs_the_vision_tower_once_per_prompt(case):
    pol, items = case
    seen = []
    visual = next(m for n, m in pol.model.named_modules() if n.endswith("visual"))
    h = visual.register_forward_pre_hook(lambda mod, args, kwargs: seen.append(int(args[0].shape[0])) if args
                                         else seen.append(int(next(iter(kwargs.values())).shape[0])),
                                         with_kwargs=True)
    try:
        params = SamplingParams(max_new_tokens=2, temperature=1.0)
        _backend(pol, True, 64).generate(items, 4, params, seeds=list(range(8)))
        shared = sum(seen)
        seen.clear()
        _backend(pol, False, 64).generate(items, 4, params, seeds=list(range(8)))
        repeated = sum(seen)
    finally:
        h.remove()
    n_patches = sum(int(it["pixel_values_videos" if "pixel_values_videos" in it else "pixel_values"].shape[0])
                    for it in items)
    assert shared == n_patches and repeated == 4 * n_patches


def test_repeated_cache_buffers_equal_repeat_then_concatenate():
    """The preallocated expansion (no per-token torch.cat) holds exactly repeat_interleave(G) ++ new tokens, also
    past the planned room (it then grows by concatenation)."""
    from transformers.cache_utils import DynamicCache

    from mmgrpo.vlm.models.rollout import _repeat_cache

    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 2, 5, 4, generator=g), torch.randn(2, 2, 5, 4, generator=g)
    cache = DynamicCache()
    for layer in range(2):
        cache.update(k + layer, v - layer, layer)
    _repeat_cache(cache, 3, extra=2)
    ref_k, ref_v = k.repeat_interleave(3, 0), v.repeat_interleave(3, 0)
    for t in range(3):  # 2 planned tokens, then 1 more
        nk, nv = torch.randn(6, 2, 1, 4, generator=g), torch.randn(6, 2, 1, 4, generator=g)
        ref_k, ref_v = torch.cat([ref_k, nk], 2), torch.cat([ref_v, nv], 2)
        ok, ov = cache.update(nk, nv, 0)
        assert torch.equal(ok, ref_k) and torch.equal(ov, ref_v) and cache.get_seq_length() == 6 + t
    assert torch.equal(cache.layers[1].keys, (k + 1).repeat_interleave(3, 0))


def test_lean_decode_step_equals_the_full_forward(case):
    """Decoding through the language model and the head directly (``_decode_step``'s lean path, the default for
    the Qwen-VL classes) samples the same tokens with the same log-probs as the full multimodal forward, for each
    family (left padding, a video and an image in one batch)."""
    from mmgrpo.vlm.models.rollout import _LEAN_DECODE_CLASSES, _eos_ids, collate_prompts, shared_prefix_sample

    pol, items = case
    assert type(pol.model).__name__ in _LEAN_DECODE_CLASSES  # the default path for this family is the lean one
    tok = pol.processor.tokenizer
    batch = collate_prompts(items, tok.pad_token_id)
    params = SamplingParams(max_new_tokens=12, temperature=0.9)
    pol.model.eval()
    got = {lean: shared_prefix_sample(pol.model, batch, 3, params, list(range(6)), _eos_ids(pol.model, tok),
                                      tok.pad_token_id, pol.suppress_token_ids, lean=lean) for lean in (True, False)}
    assert torch.equal(got[True][0], got[False][0])
    torch.testing.assert_close(got[True][1], got[False][1], atol=1e-6, rtol=0)
