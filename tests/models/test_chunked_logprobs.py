"""Chunked log-probs / entropy (mmgrpo.vlm.models.chunked) and TW-GRPO weights (mmgrpo.vlm.methods.tw_grpo) against the full-logits computation.

The reference is ``torch.distributions.Categorical`` on the full (N, T, V) logits, written here independently of
the chunked kernel (its analytic backward is checked against autograd through Categorical)."""
from __future__ import annotations

import pytest
import torch
from torch.distributions import Categorical

from mmgrpo.vlm.methods.tw_grpo import chunked_tw_token_weights
from mmgrpo.vlm.models.chunked import chunked_token_logprobs


def _ref(hidden, weight, bias, ids, temperature=1.0, suppress=(), dtype=torch.float32):
    """Full logits -> Categorical.  Suppressed ids are removed from the support by dropping their columns
    (Categorical's entropy has a nan gradient at -inf logits); targets are re-indexed into the kept columns."""
    logits = torch.nn.functional.linear(hidden, weight, bias).to(dtype) / temperature
    keep = torch.ones(logits.shape[-1], dtype=torch.bool)
    keep[list(suppress)] = False
    assert keep[ids].all(), "a suppressed target has log-prob -inf"
    new_index = torch.cumsum(keep.long(), 0) - 1
    d = Categorical(logits=logits[..., keep])
    return d.log_prob(new_index[ids]), d.entropy()


def _leaves(N=3, T=5, H=16, V=97, dtype=torch.float64, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(N, T, H, generator=g) * 2).to(dtype).requires_grad_()
    w = (torch.randn(V, H, generator=g) * 0.5).to(dtype).requires_grad_()
    b = (torch.randn(V, generator=g)).to(dtype).requires_grad_() if bias else None
    ids = torch.randint(0, V, (N, T), generator=g)
    return h, w, b, ids


def _grads(out, leaves, seed=1):
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(out.shape, generator=g, dtype=out.dtype)
    return torch.autograd.grad((out * c).sum(), [x for x in leaves if x is not None], retain_graph=True)


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("chunk", [1, 4, 7, 1000])
@pytest.mark.parametrize("temperature,suppress", [(1.0, ()), (0.7, (3, 50, 96))])
def test_logprobs_entropy_and_grads_equal_full(chunk, temperature, suppress):
    h, w, b, ids = _leaves(dtype=torch.float32)
    ids[0, 0] = 4  # not suppressed
    lp, ent = chunked_token_logprobs(h, w, ids, b, temperature, suppress, chunk, return_entropy=True)
    rlp, rent = _ref(h, w, b, ids, temperature, suppress)
    assert lp.dtype == ent.dtype == torch.float32 and lp.shape == ids.shape
    assert torch.allclose(lp, rlp, atol=1e-6, rtol=1e-6)
    # entropy sums V fp32 terms: the two summation orders differ by up to ~2e-6 here, and each is within 2e-6
    # of the float64 value (checked in test_entropy_float64_truth)
    assert torch.allclose(ent, rent, atol=3e-6, rtol=0)
    for out, ref in ((lp, rlp), (ent, rent), (lp + 0.3 * ent, rlp + 0.3 * rent)):
        for a, r in zip(_grads(out, (h, w, b)), _grads(ref, (h, w, b))):
            assert _rel(a, r) <= 1e-5


def test_entropy_float64_truth():
    """Against Categorical in float64 (logits computed in float64, then rounded to fp32 as the kernel does)."""
    h, w, b, ids = _leaves(dtype=torch.float64, T=6, V=300)
    lp, ent = chunked_token_logprobs(h, w, ids, b, 1.3, (5,), 4, return_entropy=True)
    rlp, rent = _ref(h, w, b, ids, 1.3, (5,), dtype=torch.float64)
    assert torch.allclose(lp.double(), rlp, atol=2e-6, rtol=1e-6)
    assert torch.allclose(ent.double(), rent, atol=2e-6, rtol=1e-6)
    assert ent.dtype == lp.dtype == torch.float32


def test_mask_skips_rows_and_gives_zero():
    h, w, b, ids = _leaves(dtype=torch.float32)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    lp = chunked_token_logprobs(h, w, ids, b, 1.0, (), 3, mask=mask)
    rlp, _ = _ref(h, w, b, ids)
    assert torch.allclose(lp, rlp * mask, atol=1e-6)
    assert (lp[mask == 0] == 0).all()
    for a, r in zip(_grads(lp, (h, w, b)), _grads(rlp * mask, (h, w, b))):
        assert _rel(a, r) <= 1e-5


def test_bf16_inputs_accumulate_in_fp32():
    """bf16 hidden / weight: logits rounded to bf16 as the model's lm_head gives them, softmax in fp32."""
    h, w, _, ids = _leaves(dtype=torch.bfloat16, bias=False, V=257, H=32)
    lp, ent = chunked_token_logprobs(h, w, ids, None, 0.9, (), 4, return_entropy=True)
    assert lp.dtype == torch.float32
    rlp, rent = _ref(h, w, None, ids, 0.9)  # F.linear in bf16 -> .float(): the full trainer path
    assert torch.allclose(lp, rlp, atol=1e-6, rtol=1e-6) and torch.allclose(ent, rent, atol=1e-6, rtol=1e-6)
    ga = _grads(lp, (h, w))
    gr = _grads(rlp, (h, w))
    assert all(a.dtype == torch.bfloat16 for a in ga)
    for a, r in zip(ga, gr):  # chunked accumulates d weight in fp32; the reference sums inside one bf16 matmul
        assert _rel(a.float(), r.float()) <= 1e-2


def test_no_grad_inputs_and_frozen_head():
    h, w, b, ids = _leaves(dtype=torch.float32)
    w.requires_grad_(False)
    lp = chunked_token_logprobs(h, w, ids, None, chunk_size=2)
    (gh,) = torch.autograd.grad(lp.sum(), [h])
    rlp, _ = _ref(h, w, None, ids)
    (rh,) = torch.autograd.grad(rlp.sum(), [h])
    assert _rel(gh, rh) <= 1e-5
    with torch.no_grad():
        assert torch.allclose(chunked_token_logprobs(h, w, ids, chunk_size=3), rlp.detach(), atol=1e-6)


def test_bad_inputs():
    h, w, b, ids = _leaves()
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_token_logprobs(h, w, ids, chunk_size=0)
    with pytest.raises(ValueError, match="weight"):
        chunked_token_logprobs(h, w[:, :3], ids)
    with pytest.raises(ValueError, match="mask"):
        chunked_token_logprobs(h, w, ids, mask=torch.ones(2, 2))


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_tw_weights_equal_full(chunk):
    from mmgrpo.vlm.methods.tw_grpo import tw_token_weights

    h, w, b, _ = _leaves(N=6, T=7, dtype=torch.float32)
    mask = torch.ones(6, 7, dtype=torch.long)
    mask[0, 4:] = 0
    mask[4, 2:] = 0
    mask[5, 1:] = 0
    gid = torch.tensor([0, 0, 0, 1, 1, 1])
    sup = (2, 9)
    logits = torch.nn.functional.linear(h, w, b).detach() / 0.8
    logits[..., list(sup)] = float("-inf")
    ref = tw_token_weights(torch.log_softmax(logits, -1), mask, gid, 1.7, 11.0)
    got = chunked_tw_token_weights(h.detach(), w.detach(), mask, gid, 1.7, 11.0, b.detach(), 0.8, sup, chunk)
    assert torch.allclose(got, ref, atol=1e-6)
    assert not torch.allclose(ref, torch.ones_like(ref))  # the weights are not trivially 1
