"""Chunked output head inside the model paths: ``compute_token_logprobs`` / ``grouped_token_logprobs`` /
``grouped_rows_token_logprobs`` with ``chunk_size > 0`` give the same log-probs (1e-6), parameter gradients
(1e-5 relative) and TW-GRPO weights as the full-logits path (``chunk_size=0``, itself tested against float64
recomputations in test_rollout_logprobs.py / test_prefix_group.py), fp32 CPU, tiny Qwen2.5-VL."""
import pytest
import torch

from mmgrpo.vlm.models.adapters import LoraSpec, load_policy
from mmgrpo.vlm.methods.tw_grpo import tw_token_weights_from
from mmgrpo.vlm.models.chunked import HeadInputs, chunkable_head
from mmgrpo.vlm.models.inputs import build_prompt_item
from mmgrpo.vlm.models.prefix_group import grouped_rows_token_logprobs, grouped_token_logprobs
from mmgrpo.vlm.models.rollout import collate_prompts, compute_token_logprobs
from mmgrpo.vlm.models.tiny import synthetic_frames, synthetic_image

G, T, TEMP = 3, 6, 0.9
LENS = [6, 2, 4, 1, 5, 6]


def _items(pol):
    def msg(kind, q):
        return [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": q}]}]

    return [build_prompt_item(pol.processor, pol.adapter, msg("video", "when does it open?"),
                              video=synthetic_frames(1, 6), sample_fps=2.0),
            build_prompt_item(pol.processor, pol.adapter, msg("image", "what is shown?"),
                              images=[synthetic_image(0, 84, 112)])]


def _completions(n):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(20, 250, (n, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(LENS[:n])[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


def _run(pol, fn):
    m = pol.model
    m.zero_grad(set_to_none=True)
    lp = fn(m)
    w = torch.linspace(-1.0, 1.0, lp.numel()).view_as(lp)
    (lp * w).sum().backward()
    return lp.detach(), {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}


def _assert_same(a, ga, b, gb):
    torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-6)
    assert set(ga) == set(gb) and ga
    for nm in ga:
        scale = float(ga[nm].abs().max())
        assert float((ga[nm] - gb[nm]).abs().max()) <= 1e-5 * max(scale, 1e-12), nm


@pytest.fixture(scope="module")
def full_policy(tiny_dirs):
    return load_policy(tiny_dirs("qwen2_5_vl"), freeze_vision=False)


@pytest.mark.parametrize("chunk", [1, 5])
def test_naive_path_chunked_equals_full(full_policy, chunk):
    pol = full_policy
    assert chunkable_head(pol.model) is not None
    items = _items(pol)
    rows = [it for it in items for _ in range(G)]
    batch = collate_prompts(rows, pol.tokenizer.pad_token_id)
    ids, mask = _completions(len(rows))
    a, ga = _run(pol, lambda m: compute_token_logprobs(m, batch, ids, mask, TEMP, pol.suppress_token_ids))
    b, gb = _run(pol, lambda m: compute_token_logprobs(m, batch, ids, mask, TEMP, pol.suppress_token_ids,
                                                        chunk_size=chunk))
    _assert_same(a, ga, b, gb)
    assert any("lm_head" in n or "embed_tokens" in n for n in gb)  # the head's weight got its gradient


def test_grouped_path_chunked_equals_full(full_policy):
    pol = full_policy
    items = _items(pol)
    batch = collate_prompts(items, pol.tokenizer.pad_token_id)
    ids, mask = _completions(G * len(items))
    a, ga = _run(pol, lambda m: grouped_token_logprobs(m, batch, ids, mask, TEMP, pol.suppress_token_ids))
    b, gb = _run(pol, lambda m: grouped_token_logprobs(m, batch, ids, mask, TEMP, pol.suppress_token_ids,
                                                        chunk_size=4))
    _assert_same(a, ga, b, gb)


def test_lora_rows_api_and_tw_weights(tiny_dirs):
    """LoRA policy (frozen head), the trainer's rows API; return_logits gives HeadInputs whose TW-GRPO weights
    equal the ones from the full logits."""
    pol = load_policy(tiny_dirs("qwen2_5_vl"), lora=LoraSpec(r=4, alpha=8))
    with torch.no_grad():
        for n, p in pol.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    items = _items(pol)
    rows = [it for it in items for _ in range(G)]
    ids, mask = _completions(len(rows))
    pad = pol.tokenizer.pad_token_id
    args = (rows, ids, mask, pad, TEMP, pol.suppress_token_ids)
    a, ga = _run(pol, lambda m: grouped_rows_token_logprobs(m, *args))
    b, gb = _run(pol, lambda m: grouped_rows_token_logprobs(m, *args, chunk_size=3))
    _assert_same(a, ga, b, gb)
    gid = torch.arange(len(rows)) // G
    with torch.no_grad():
        lpa, logits = grouped_rows_token_logprobs(pol.model, *args, return_logits=True)
        lpb, head = grouped_rows_token_logprobs(pol.model, *args, return_logits=True, chunk_size=3)
    assert isinstance(head, HeadInputs) and head.hidden.shape[:2] == (len(rows), T)
    torch.testing.assert_close(lpb, lpa, atol=1e-6, rtol=1e-6)
    wa = tw_token_weights_from(logits, mask, gid, 1.7, 11.0)
    wb = tw_token_weights_from(head, mask, gid, 1.7, 11.0)
    torch.testing.assert_close(wb, wa, atol=1e-5, rtol=0)
    assert float((wa - 1).abs().max()) > 0.1
    # entropy from the captured hidden states == entropy of the full logits' distribution
    _, ent = head.token_logprobs(ids, mask, return_entropy=True)
    ref = torch.distributions.Categorical(logits=logits[..., torch.isfinite(logits[0, 0])]).entropy() * mask
    torch.testing.assert_close(ent, ref, atol=1e-5, rtol=1e-5)


def test_unchunkable_head_falls_back():
    class Wrapped(torch.nn.Module):  # e.g. a peft-wrapped head: no plain nn.Linear
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(4, 9)

    class M(torch.nn.Module):
        def get_output_embeddings(self):
            return Wrapped()

    assert chunkable_head(M()) is None
