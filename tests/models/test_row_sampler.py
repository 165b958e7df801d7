"""``multinomial_rows`` (issue #42): per-row seeded sampling in one batched argmax, bit for bit the tokens of
``torch.multinomial(probs[i], 1, generator=g_i)`` row by row (the sampler's previous code), with the generators
left in the same states, so a row's seed keeps giving the same completion."""
from __future__ import annotations

import pytest
import torch

from mmgrpo.vlm.models.rollout import _PerRowSampler, multinomial_rows


def _gens(seeds):
    out = []
    for s in seeds:
        g = torch.Generator()
        g.manual_seed(s)
        out.append(g)
    return out


@pytest.mark.parametrize("V", [7, 320, 151_936])
def test_equals_torch_multinomial_row_by_row(V):
    n = 16
    seeds = [1000 + 17 * i for i in range(n)]
    ga, gb = _gens(seeds), _gens(seeds)
    g = torch.Generator().manual_seed(V)
    for step in range(4):  # the generators advance alike: later steps agree too
        logits = torch.randn(n, V, generator=g) * 3
        if step % 2:  # exact zeros (what top-k / suppression leave) are never drawn
            logits[:, : V // 2] = float("-inf")
        probs = torch.softmax(logits, -1)
        want = torch.cat([torch.multinomial(probs[i], 1, generator=ga[i]) for i in range(n)])
        got = multinomial_rows(probs, gb)
        assert got.dtype == torch.int64 and got.shape == (n,)
        assert torch.equal(got, want)
        if step % 2:
            assert bool((got >= V // 2).all())
    assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(ga, gb))


def test_sampler_draws_the_distribution():
    """Independent of torch's implementation: 4,000 rows from one 3-way distribution, frequencies within 4 sigma."""
    p = torch.tensor([0.2, 0.5, 0.3])
    draws = multinomial_rows(p.expand(4000, 3).contiguous(), _gens(range(4000)))
    freq = torch.bincount(draws, minlength=3).float() / 4000
    assert torch.allclose(freq, p, atol=4 * (0.25 / 4000) ** 0.5)


@pytest.mark.parametrize("bad", ["nan", "inf", "negative", "zero_row"])
def test_invalid_probabilities_raise(bad):
    p = torch.full((2, 5), 0.2)
    if bad == "nan":
        p[1, 2] = float("nan")
    elif bad == "inf":
        p[0, 0] = float("inf")
    elif bad == "negative":
        p[1, 1] = -0.1
    else:
        p[1] = 0.0
    with pytest.raises(RuntimeError, match="probability tensor"):
        multinomial_rows(p, _gens([0, 1]))
    with pytest.raises(ValueError, match="n generators"):
        multinomial_rows(torch.full((3, 5), 0.2), _gens([0, 1]))


@pytest.mark.parametrize("top_k,top_p,temperature", [(0, 1.0, 1.0), (5, 1.0, 0.7), (0, 0.9, 1.3), (20, 0.8, 1.0)])
def test_per_row_sampler_unchanged(top_k, top_p, temperature):
    """``_PerRowSampler.sample`` = the previous per-row multinomial on the same processed distribution, and
    ``sample_scaled`` on pre-divided scores is the same call."""
    n, V = 6, 320
    scores = torch.randn(n, V, generator=torch.Generator().manual_seed(3)) * 2
    seeds = list(range(50, 50 + n))
    s1, s2, s3 = (_PerRowSampler(seeds, temperature, top_p, top_k) for _ in range(3))
    x = scores / temperature
    if top_k:
        kth = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p < 1.0:
        sx, si = torch.sort(x, dim=-1, descending=True)
        drop = torch.softmax(sx, -1).cumsum(-1) - torch.softmax(sx, -1) >= top_p
        x = x.scatter(-1, si, sx.masked_fill(drop, float("-inf")))
    probs = torch.softmax(x, -1)
    want = torch.cat([torch.multinomial(probs[i], 1, generator=s1.gens[i]) for i in range(n)])
    assert torch.equal(s2.sample(scores), want)
    assert torch.equal(s3.sample_scaled(scores / temperature), want)
