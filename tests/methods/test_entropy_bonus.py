"""Entropy bonus (methods.entropy_bonus): the term's value vs torch.distributions, its gradient vs autograd of the
direct formula, and in a tiny trainer: coef > 0 changes the gradient by exactly -coef * grad(H-bar)."""
import pytest
import torch

from mmgrpo.vlm.methods.entropy_bonus import entropy_bonus_term
from mmgrpo.vlm.models.chunked import HeadInputs, token_entropy_with_grad


def _inputs(N=3, T=5, H=6, V=11, temp=0.7, suppress=(2, 7)):
    g = torch.Generator().manual_seed(0)
    hid = torch.randn(N, T, H, generator=g, requires_grad=True)
    W = torch.randn(V, H, generator=g, requires_grad=True)
    b = torch.randn(V, generator=g, requires_grad=True)
    mask = torch.ones(N, T)
    mask[1, 3:] = 0
    mask[2, 1:] = 0  # a one-token sequence

    def direct():  # full logits, Categorical's entropy: independent of the chunked code
        x = (hid @ W.T + b) / temp
        x = x.masked_fill(torch.zeros(V, dtype=torch.bool).index_fill(0, torch.tensor(suppress), True), -float("inf"))
        return torch.distributions.Categorical(logits=x).entropy(), x

    return HeadInputs(hid, W, b, temp, suppress, 4, torch.float32), direct, mask, (hid, W, b)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("path", ["head", "logits"])
def test_term_value_and_gradient_match_categorical(agg, path):
    head, direct, mask, params = _inputs()
    coef = 0.3
    ref_H, x = direct()
    n_tok, lens = mask.sum(), mask.sum(1)
    if agg == "token_mean":  # by hand, per aggregation (num_tokens / num_sequences as the trainer passes them)
        hbar = (ref_H * mask).sum() / n_tok
    elif agg == "seq_mean_token_mean":
        hbar = ((ref_H * mask).sum(1) / lens).sum() / 3
    else:
        hbar = (ref_H * mask).sum() / (3 * 9)
    want = -coef * hbar
    want_grads = torch.autograd.grad(want, params, retain_graph=True)

    src = head if path == "head" else x.detach().requires_grad_(True)
    ent = token_entropy_with_grad(src, mask, chunk_size=2)
    assert torch.allclose(ent, ref_H.detach() * mask, atol=1e-5)
    assert (ent[mask == 0] == 0).all()
    got = entropy_bonus_term(ent, mask, coef, dict(agg=agg, max_len=9, num_tokens=float(n_tok), num_sequences=3.0))
    assert torch.allclose(got, want, atol=1e-6)
    if path == "head":
        got_grads = torch.autograd.grad(got, params)
    else:  # gradient w.r.t. the logits, pushed through the same head by hand
        (gx,) = torch.autograd.grad(got, src)
        got_grads = torch.autograd.grad(x, params, gx)
    for g, w in zip(got_grads, want_grads):
        assert torch.isfinite(g).all()
        assert torch.allclose(g, w, atol=1e-6, rtol=1e-4)
    assert want_grads[0].abs().sum() > 0


def test_gradient_matches_finite_differences():
    g = torch.Generator().manual_seed(1)
    W, b = torch.randn(5, 3, generator=g), torch.randn(5, generator=g)
    mask = torch.tensor([[1.0, 1.0]])
    f = lambda h: token_entropy_with_grad(HeadInputs(h, W, b, 0.7, (1,), 1, torch.float32), mask).sum()
    h0 = torch.randn(1, 2, 3, generator=g, requires_grad=True)
    (grad,) = torch.autograd.grad(f(h0), h0)
    eps = 1e-2  # the chunked forward is fp32: a larger step keeps rounding (1e-7 / eps) below the O(eps^2) error
    with torch.no_grad():
        for t in range(2):
            for i in range(3):
                d = torch.zeros_like(h0)
                d[0, t, i] = eps
                fd = (f(h0 + d) - f(h0 - d)) / (2 * eps)
                assert float(grad[0, t, i]) == pytest.approx(float(fd), rel=2e-3, abs=2e-4)


def test_bad_coef_is_refused(tmp_path, th):
    with pytest.raises(ValueError, match="entropy_bonus.coef"):
        th.make_cfg(tmp_path, tmp_path / "no-model", "methods.entropy_bonus.coef=-0.001")


@pytest.mark.parametrize("chunk", [256, 0])
def test_tiny_trainer_bonus_adds_minus_coef_grad_entropy(tmp_path, tiny_dirs, th, chunk):
    import mmgrpo.vlm.train.trainer as T
    from mmgrpo.vlm.models.rollout import batch_to, collate_prompts, compute_token_logprobs
    from mmgrpo.vlm.train import steps
    from mmgrpo.vlm.data.batch import micro_batches

    c = 0.5
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "run.micro_batch_size=4",
                      f"algo.logprob_chunk_size={chunk}", f"methods.entropy_bonus.coef={c}")
    tr = T.GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    assert [m.name for m in tr.methods] == ["entropy_bonus"]
    tr.state.stream = tr.new_stream()
    rb = steps.collect(tr, 0)
    mbs = micro_batches(rb.group_ids, cfg.run.micro_batch_size)
    assert len(mbs) == 2
    steps.precompute(tr, rb, mbs)
    mask = rb.loss_mask
    assert torch.equal(mask, rb.completion_mask)
    totals = {"tokens": float(mask.sum()), "sequences": float((mask.sum(1) > 0).sum()), "rows": float(rb.n),
              "micro_batches": float(len(mbs))}
    tr.model.train()

    def grads():
        tr.model.zero_grad(set_to_none=True)
        for j, idx in enumerate(mbs):
            steps._micro_step(tr, rb, rb, idx, 1.0, j == len(mbs) - 1, totals)
        return {n: p.grad.clone() for n, p in tr.model.named_parameters() if p.grad is not None}

    g_bonus = grads()
    methods, tr.methods = tr.methods, []
    g_plain = grads()
    tr.methods = methods
    # the direct formula: token mean over the step's tokens of Categorical entropy of full logits, by autograd
    tr.model.zero_grad(set_to_none=True)
    for idx in mbs:
        T_ = max(1, int(rb.completion_mask[idx].sum(1).max()))
        batch = batch_to(collate_prompts([rb.items[i] for i in idx.tolist()], tr.pad_id), tr.device)
        ids, m = rb.completion_ids[idx, :T_], rb.completion_mask[idx, :T_]
        _, logits = compute_token_logprobs(tr.model, batch, ids, m, tr.sampling.temperature,
                                           tr.policy.suppress_token_ids, return_logits=True, chunk_size=0)
        H = torch.distributions.Categorical(logits=logits).entropy()
        ((H * m).sum() / totals["tokens"]).backward()
    g_H = {n: p.grad.clone() for n, p in tr.model.named_parameters() if p.grad is not None}
    assert set(g_bonus) == set(g_plain) <= set(g_H) or set(g_bonus) == set(g_H)
    diff_norm = 0.0
    for n, g in g_bonus.items():
        want = -c * g_H[n]
        assert torch.allclose(g - g_plain[n], want, atol=1e-6, rtol=1e-3), n
        diff_norm += float((g - g_plain[n]).norm())
    assert diff_norm > 1e-4  # the bonus did change the gradient
    m = {}
    methods[0].end_of_step(rb, m)
    assert m["entropy_bonus/entropy"] > 0


def test_train_step_logs_the_current_policy_entropy_as_the_precompute_does(tmp_path, tiny_dirs, th):
    """One step with num_iterations=1: the current policy at the update is the old policy, so the bonus's logged
    entropy (with gradient, training forward) equals methods.entropy's no-grad precompute mean."""
    import mmgrpo.vlm.train.trainer as T

    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "methods.entropy_bonus.coef=0.001",
                      "methods.entropy.enabled=true")
    tr = T.GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    assert [m.name for m in tr.methods] == ["entropy", "entropy_bonus"]
    m = tr.train(steps=1)[-1]
    assert m["entropy_bonus/entropy"] == pytest.approx(m["entropy/mean"], rel=1e-4)
    assert m["entropy_bonus/entropy"] > 0
