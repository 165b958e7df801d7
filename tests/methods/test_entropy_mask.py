"""Per-token entropy (chunked, vs torch.distributions) and high-entropy-token masking (quantile by hand)."""
import pytest
import torch

from mmgrpo.vlm.methods.entropy_mask import entropy_metrics, entropy_threshold, high_entropy_mask
from mmgrpo.vlm.models.chunked import HeadInputs, token_entropy_from


def _head(N=3, T=5, H=6, V=11, temp=0.7, suppress=(2, 7)):
    g = torch.Generator().manual_seed(0)
    hid = torch.randn(N, T, H, generator=g)
    W = torch.randn(V, H, generator=g)
    b = torch.randn(V, generator=g)
    head = HeadInputs(hid, W, b, temp, suppress, 4, torch.float32)
    logits = (hid @ W.T + b) / temp
    logits[..., list(suppress)] = float("-inf")
    return head, logits


def test_chunked_entropy_matches_categorical():
    head, logits = _head()
    mask = torch.ones(3, 5, dtype=torch.long)
    mask[1, 3:] = 0
    ref = torch.distributions.Categorical(logits=logits).entropy() * mask
    got_head = token_entropy_from(head, mask)
    got_full = token_entropy_from(logits, mask, chunk_size=2)
    assert torch.allclose(got_head, ref, atol=1e-5)
    assert torch.allclose(got_full, ref, atol=1e-5)
    assert (got_head[1, 3:] == 0).all()
    assert not got_head.requires_grad


def test_threshold_and_mask_by_hand():
    ent = torch.tensor([[0.1, 0.9, 0.5, 7.0], [0.3, 0.7, 0.2, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    # valid entropies sorted: 0.0 0.1 0.2 0.3 0.5 0.7 0.9 (7 values); 0.8 quantile, linear: pos 0.8*6 = 4.8
    tau = entropy_threshold(ent, mask, rho=0.2)
    assert tau.item() == pytest.approx(0.5 + 0.8 * (0.7 - 0.5))
    keep = high_entropy_mask(ent, mask, rho=0.2)
    assert keep.tolist() == [[False, True, False, False], [False, True, False, False]]  # 0.9, 0.7 >= 0.66
    # the masked 7.0 never counts; rho = 1 keeps every completion token
    assert high_entropy_mask(ent, mask, 1.0).tolist() == mask.bool().tolist()
    assert torch.isinf(entropy_threshold(ent, torch.zeros_like(mask), 0.2))
    m = entropy_metrics(ent, mask, keep)
    assert m["entropy/kept_frac"] == pytest.approx(2 / 7)
    assert m["entropy/mean"] == pytest.approx(sum([0.1, 0.9, 0.5, 0.3, 0.7, 0.2, 0.0]) / 7)
    with pytest.raises(ValueError, match="rho"):
        high_entropy_mask(ent, mask, 0.0)


def test_masked_token_gets_zero_gradient_through_policy_loss():
    # the mask enters the policy loss as token weights: masked tokens get exactly zero gradient, the normaliser still
    # counts every completion token (TRL's placement)
    from mmgrpo.vlm.config import AlgoConfig
    from mmgrpo.vlm.methods.base import LossInputs, grpo_loss

    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    ent = torch.tensor([[0.2, 1.5, 0.1]])
    mask = torch.ones(1, 3)
    keep = high_entropy_mask(ent, mask, rho=0.34)
    assert keep.tolist() == [[False, True, False]]
    out = grpo_loss(LossInputs(lp, lp.detach(), torch.tensor([1.0]), mask, token_weights=keep.float(),
                               algo=AlgoConfig()))
    out.loss.backward()
    assert lp.grad.tolist() == [[0.0, pytest.approx(-1 / 3), 0.0]]
