"""Pure pieces of the trainer: T-GRPO bonus, TW-GRPO weights, data selection, prompt stream, micro-batches."""
import math

import numpy as np
import pytest
import torch

from mmgrpo.train.methods import temporal_bonus, tw_token_weights
from mmgrpo.train.selection import reward_stats, select_indices
from mmgrpo.train.trainer import PromptStream, micro_batches


def test_temporal_bonus_is_per_group_by_hand():
    # group 10: ordered acc mean 0.5, shuffled 0.25 -> bonus to rows with acc > 0.1
    # group 20: ordered mean 0.25, shuffled 0.75 -> none;  group 30 (image): no shuffled rows -> none
    acc = torch.tensor([1.0, 0.0, 0.05, 0.95, 0.5, 0.0, 0.0, 0.5, 1.0])
    gid = torch.tensor([10, 10, 10, 10, 20, 20, 20, 20, 30])
    acc_s = torch.tensor([0.5, 0.0, 1.0, 0.5])
    gid_s = torch.tensor([10, 10, 20, 20])
    bonus, granted = temporal_bonus(acc, gid, acc_s, gid_s, alpha=0.3, mu=1.0, min_accuracy=0.1)
    assert bonus.tolist() == pytest.approx([0.3, 0.0, 0.0, 0.3, 0, 0, 0, 0, 0])
    assert granted.tolist() == [True, False, False]
    # the batch-mean version (Video-R1 #96) would pool: mean ordered 0.5 (groups 10+20), shuffled 0.5 -> grant both
    # mu scales the comparison: with mu = 0.3, group 20 (0.25 >= 0.225) is granted too
    bonus2, _ = temporal_bonus(acc, gid, acc_s, gid_s, alpha=0.3, mu=0.3)
    assert bonus2[4] == pytest.approx(0.3) and bonus2[5] == 0.0


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


def test_selection_criteria_by_hand():
    r = torch.tensor([[1.0, 1.0, 1.0],  # all right
                      [0.0, 0.0, 0.0],  # all wrong
                      [1.0, 0.0, 0.0],  # mean 1/3, var 2/9
                      [1.0, 1.0, 0.0],  # mean 2/3, var 2/9
                      [0.2, 0.3, 0.4]])  # mean 0.3, var 0.00667
    st = reward_stats(r)
    assert st["var"][2].item() == pytest.approx(2 / 9)
    assert select_indices(r, "nonconstant") == [2, 3, 4]
    assert select_indices(r, "variance", min_variance=0.1) == [2, 3]
    assert select_indices(r, "variance", num_keep=1) in ([2], [3])
    # gaussian around 0.3: sample 4 (mean 0.3, weight 1) and 2 (weight exp(-(1/30)^2/0.08) ~ 0.986) dominate
    picks = [tuple(select_indices(r, "gaussian", num_keep=2, mu=0.3, sigma=0.05, seed=s)) for s in range(20)]
    assert all(0 not in p and 1 not in p for p in picks)  # weights ~ exp(-98) and exp(-18)
    assert select_indices(r, "gaussian", num_keep=2, seed=3) == select_indices(r, "gaussian", num_keep=2, seed=3)
    with pytest.raises(ValueError, match="criterion"):
        select_indices(r, "bogus")


def test_prompt_stream_deterministic_resumable_and_unique():
    a = PromptStream(5, seed=1)
    first = a.take(12)
    assert [p for p, _ in first] == list(range(12))
    assert sorted(i for _, i in first[:5]) == list(range(5))  # each epoch is a permutation
    b = PromptStream(5, seed=1)
    b.take(7)
    c = PromptStream(5, seed=1)
    c.load_state_dict(b.state_dict())
    assert c.take(5) == first[7:12]
    with pytest.raises(ValueError, match="samples"):
        PromptStream(4, seed=1).load_state_dict(b.state_dict())


def test_micro_batches_keep_groups_whole():
    g = torch.tensor([5, 5, 5, 9, 9, 9, 2, 2, 2, 7, 7, 7])
    mbs = micro_batches(g, max_rows=7)
    assert [m.tolist() for m in mbs] == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    assert [m.tolist() for m in micro_batches(g, 2)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
