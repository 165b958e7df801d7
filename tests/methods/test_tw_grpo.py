"""TW-GRPO token weights (mmgrpo.vlm.methods.tw_grpo) against an independent loop."""
import math

import numpy as np
import pytest
import torch

from mmgrpo.vlm.methods.tw_grpo import tw_token_weights


def _tw_reference(logprobs, mask, gids, alpha, clamp):
    lp = logprobs.double().numpy()
    m = mask.numpy().astype(bool)
    N, T, V = lp.shape
    keep = np.isfinite(lp).reshape(-1, V).any(0)
    out = np.ones((N, T))
    for g in np.unique(gids.numpy()):
        rows = np.where(gids.numpy() == g)[0]
        Tg = m[rows].sum(1).max()
        Vk = keep.sum()
        d = np.zeros(Tg)
        for t in range(Tg):
            dists = []
            for i in rows:
                dists.append(lp[i, t, keep] if m[i, t] else np.full(Vk, -math.log(Vk)))
            dists = np.stack(dists)
            mean = dists.mean(0)
            tot = 0.0
            for i in range(len(rows)):
                x = np.clip(mean - dists[i], -clamp, clamp)
                tot += (np.exp(x) - x - 1).sum()
            d[t] = tot / len(rows)
        norm = (d - d.min()) / (d.max() - d.min()) if d.max() > d.min() else np.zeros(Tg)
        out[rows, :Tg] = 1 + (alpha - 1) * norm
    return out


def test_tw_token_weights_match_independent_loop():
    torch.manual_seed(0)
    N, T, V = 6, 5, 9
    logits = torch.randn(N, T, V) * 2
    logits[..., 0] = float("-inf")  # a suppressed token column
    logprobs = torch.log_softmax(logits, -1)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0],
                         [1, 1, 1, 1, 0], [1, 0, 0, 0, 0], [1, 1, 1, 0, 0]])
    gids = torch.tensor([3, 3, 3, 8, 8, 8])
    w = tw_token_weights(logprobs, mask, gids, alpha=1.7, clamp=11.0)
    ref = _tw_reference(logprobs, mask, gids, 1.7, 11.0)
    np.testing.assert_allclose(w.numpy(), ref, rtol=1e-5, atol=1e-6)
    assert float(w.min()) >= 1.0 and float(w.max()) == pytest.approx(1.7)
    assert torch.equal(w[0, :3], w[1, :3])  # shared across the group at each position


def test_tw_token_weights_identical_group_is_one():
    lp = torch.log_softmax(torch.randn(1, 4, 7), -1).expand(3, 4, 7)
    w = tw_token_weights(lp, torch.ones(3, 4), torch.zeros(3, dtype=torch.long))
    assert torch.equal(w, torch.ones(3, 4))
