"""Rollouts and token log-probs: on-policy ratio exactly 1, left padding, batch > 1, seeds, masks."""
import pytest
import torch

from mmgrpo.core.losses import clipped_surrogate, log_ratio, ratio_metrics
from mmgrpo.vlm.models.adapters import load_policy
from mmgrpo.vlm.models.inputs import build_prompt_item
from mmgrpo.vlm.models.rollout import (HFRolloutBackend, SamplingParams, collate_prompts, completion_mask_from_ids,
                                   compute_token_logprobs, make_seeds, token_logprobs_from_logits)
from mmgrpo.vlm.models.tiny import VISION_SPECIAL_TOKENS, synthetic_frames, synthetic_image


def _items(pol):
    def m(kind, q):
        return [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": q}]}]

    return [
        build_prompt_item(pol.processor, pol.adapter, m("image", "what?"), images=[synthetic_image(0, 84, 112)]),
        build_prompt_item(pol.processor, pol.adapter, m("video", "when does the person open the door?"),
                          video=synthetic_frames(1, 6), sample_fps=2.0),
        build_prompt_item(pol.processor, pol.adapter, m("image", "a much longer question about the image here"),
                          images=[synthetic_image(1, 112, 112)]),
    ]


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen2_vl"])
def rollout(request, tiny_dirs):
    pol = load_policy(tiny_dirs(request.param))
    items = _items(pol)
    backend = HFRolloutBackend(pol.model, pol.processor, pol.suppress_token_ids, max_batch_size=4)
    params = SamplingParams(max_new_tokens=10, temperature=0.9)
    out = backend.generate(items, 3, params, seeds=list(range(9)))
    return pol, items, backend, params, out


def _independent_logprobs(pol, item, completion, temperature):
    """One unpadded sequence, full forward (no logits_to_keep), float64 log-softmax over the allowed vocab."""
    ids = torch.cat([item["input_ids"][0], completion]).unsqueeze(0)
    inp = dict(item, input_ids=ids, attention_mask=torch.ones_like(ids),
               mm_token_type_ids=torch.cat([item["mm_token_type_ids"][0], torch.zeros_like(completion)])[None])
    with torch.no_grad():
        logits = pol.model(**inp).logits[0].double() / temperature
    P = item["input_ids"].shape[1]
    allowed = torch.ones(logits.shape[-1], dtype=torch.bool)
    allowed[[pol.tokenizer.convert_tokens_to_ids(t) for t in VISION_SPECIAL_TOKENS]] = False
    lp = torch.log_softmax(logits[:, allowed], -1)
    remap = torch.cumsum(allowed.long(), 0) - 1
    return lp[P - 1:P - 1 + len(completion)].gather(1, remap[completion].unsqueeze(1)).squeeze(1)


def test_rollout_shapes_masks_and_no_vision_tokens(rollout):
    pol, items, _, params, out = rollout
    N, T = out.completion_ids.shape
    assert N == 9 and T <= params.max_new_tokens
    assert out.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    vis = [pol.tokenizer.convert_tokens_to_ids(t) for t in VISION_SPECIAL_TOKENS]
    assert not torch.isin(out.completion_ids[out.completion_mask.bool()], torch.tensor(vis)).any()
    eos = pol.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for i in range(N):  # mask ends right after the first EOS, or covers everything when truncated
        L = int(out.completion_mask[i].sum())
        if out.truncated[i]:
            assert L == T and eos not in out.completion_ids[i].tolist()
        else:
            assert out.completion_ids[i, L - 1] == eos and out.completion_mask[i, L:].sum() == 0


def test_trainer_logprobs_equal_rollout_logprobs_and_ratio_is_one(rollout):
    pol, items, _, params, out = rollout
    batch = collate_prompts([items[i] for i in out.prompt_index.tolist()], pol.tokenizer.pad_token_id)
    assert (batch["attention_mask"][:, 0] == 0).any()  # left padding is exercised
    with torch.no_grad():
        old = compute_token_logprobs(pol.model, batch, out.completion_ids, out.completion_mask,
                                     params.temperature, pol.suppress_token_ids)
    # rollout (KV-cached, step-by-step) vs trainer (one full forward): same numbers up to float rounding
    torch.testing.assert_close(old, out.logprobs, atol=2e-5, rtol=0)
    # independent recomputation per row, no padding at all, float64 softmax over the allowed vocabulary
    for i in (0, 4, 8):
        L = int(out.completion_mask[i].sum())
        ref = _independent_logprobs(pol, items[int(out.prompt_index[i])], out.completion_ids[i, :L],
                                    params.temperature)
        torch.testing.assert_close(old[i, :L].double(), ref, atol=2e-5, rtol=0)
        assert (old[i, L:] == 0).all()
    # the trainer's forward with grad enabled gives bit-identical values: on-policy ratio is exactly 1
    pol.model.train()
    logp = compute_token_logprobs(pol.model, batch, out.completion_ids, out.completion_mask,
                                  params.temperature, pol.suppress_token_ids)
    assert logp.requires_grad and torch.equal(logp.detach(), old)
    lr = log_ratio(logp, old, out.completion_mask)
    _, clip_m = clipped_surrogate(lr, torch.randn(9), out.completion_mask, clip_low=0.2)
    m = ratio_metrics(lr, out.completion_mask)
    assert m["ratio_min"] == 1.0 and m["ratio_max"] == 1.0 and clip_m["clip_frac"] == 0.0


def test_seeds_make_rows_independent_of_batch_composition(rollout):
    pol, items, backend, params, out = rollout
    again = backend.generate(items[1:2], 3, params, seeds=list(range(3, 6)))
    T = min(again.completion_ids.shape[1], out.completion_ids.shape[1])
    assert torch.equal(again.completion_ids[:, :T], out.completion_ids[3:6, :T])
    other = backend.generate(items[1:2], 3, params, seeds=[100, 101, 102])
    assert not torch.equal(other.completion_ids[:, :T], out.completion_ids[3:6, :T])


def test_greedy_is_argmax(rollout):
    pol, items, backend, _, _ = rollout
    g = backend.generate(items[:1], 2, SamplingParams(max_new_tokens=3, greedy=True))
    assert torch.equal(g.completion_ids[0], g.completion_ids[1])
    with torch.no_grad():
        logits = pol.model(**items[0]).logits[0, -1]
    logits[pol.suppress_token_ids] = float("-inf")
    assert int(g.completion_ids[0, 0]) == int(logits.argmax())


def test_token_logprobs_formula_matches_categorical():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    ids = torch.randint(3, 11, (2, 5))
    got = token_logprobs_from_logits(logits, ids, temperature=0.7, suppress_token_ids=[0, 1, 2])
    x = logits[..., 3:] / 0.7
    ref = torch.distributions.Categorical(logits=x).log_prob(ids - 3)
    torch.testing.assert_close(got, ref)


def test_completion_mask_by_hand():
    ids = torch.tensor([[5, 6, 2, 0, 0], [5, 5, 5, 5, 5], [2, 0, 0, 0, 0], [7, 9, 8, 2, 2]])
    mask, trunc = completion_mask_from_ids(ids, eos_ids=[2, 9])
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]]
    assert trunc.tolist() == [False, True, False, False]


def test_collate_left_pads_and_concatenates_vision():
    a = {"input_ids": torch.tensor([[5, 6, 7]]), "attention_mask": torch.ones(1, 3, dtype=torch.long),
         "pixel_values": torch.ones(4, 2), "image_grid_thw": torch.tensor([[1, 2, 2]])}
    b = {"input_ids": torch.tensor([[8]]), "attention_mask": torch.ones(1, 1, dtype=torch.long),
         "pixel_values": torch.zeros(8, 2), "image_grid_thw": torch.tensor([[1, 2, 4]])}
    c = collate_prompts([a, b], pad_token_id=0)
    assert c["input_ids"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert c["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert c["pixel_values"].shape == (12, 2) and c["image_grid_thw"].tolist() == [[1, 2, 2], [1, 2, 4]]


def test_make_seeds_process_independent():
    s_all = make_seeds(7, 3, [0, 1, 2, 3], 2)
    s_split = make_seeds(7, 3, [0, 1], 2) + make_seeds(7, 3, [2, 3], 2)
    assert s_all == s_split and len(set(s_all)) == 8
    assert make_seeds(7, 4, [0], 2) != s_all[:2]


def test_vllm_output_conversion():
    """An engine's per-row token lists -> RolloutOutput (requests: tests/models/test_vllm_backend.py)."""
    from mmgrpo.vlm.models.rollout import rollout_from_token_lists
    from mmgrpo.vlm.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    out = rollout_from_token_lists([[40, 41, eos], [40, 41, 42, 43, 44], [40], [eos]], [[-1.0, -2.0, -0.5], [-1.0] * 5,
                                   [-3.0], [-0.1]], tok, [eos], num_prompts=2, num_generations=2, max_new_tokens=5)
    assert out.completion_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 0, 0, 0, 0]]
    assert out.truncated.tolist() == [False, True, False, False]  # row 2 stopped early without EOS: not "max length"
    assert out.logprobs[0].tolist() == [-1.0, -2.0, -0.5, 0.0, 0.0] and out.prompt_index.tolist() == [0, 0, 1, 1]
    assert out.completion_ids[2, 1:].tolist() == [tok.pad_token_id] * 4
