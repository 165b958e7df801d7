"""``algo.logprob_chunk_size``: the trainer's old / reference log-probs, TW-GRPO token weights and the gradient of
its log-prob forward are the same with the chunked output head as with full logits (chunk_size=0), on both
log-prob paths (naive and prefix_group)."""
import dataclasses

import pytest
import torch

from mmgrpo.vlm.models.chunked import HeadInputs
from mmgrpo.vlm.train import steps
from mmgrpo.vlm.data.batch import micro_batches
from mmgrpo.vlm.train.trainer import GRPOTrainer


def _state(tr, rb, mbs):
    steps.precompute(tr, rb, mbs)
    tr.model.train()
    tr.model.zero_grad(set_to_none=True)
    lp = tr.logprobs.rows(tr.model, rb, mbs[0])
    (lp * torch.linspace(-1, 1, lp.numel()).view_as(lp)).sum().backward()
    grads = {n: p.grad.clone() for n, p in tr.model.named_parameters() if p.grad is not None}
    return rb.old_logp.clone(), rb.ref_logp.clone(), rb.token_weights.clone(), lp.detach(), grads


@pytest.mark.parametrize("impl", ["naive", "prefix_group"])
def test_chunked_head_matches_full_logits_in_trainer(tmp_path, tiny_dirs, th, impl):
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.tw_grpo.enabled=true", "algo.kl_coef=0.05",
                      f"run.logprob_impl={impl}", "algo.logprob_chunk_size=0")
    tr = GRPOTrainer(cfg, samples=th.video_samples(1) + th.image_samples(1), reward_fn=th.text_reward)
    tr.state.stream = tr.new_stream()
    rb = steps.collect(tr, 0)
    mbs = micro_batches(rb.group_ids, 8)
    full = _state(tr, rb, mbs)
    tr.cfg.algo.logprob_chunk_size = 3
    tr.logprobs = dataclasses.replace(tr.logprobs, chunk_size=3)  # the trainer's log-prob settings, fixed at setup
    with torch.no_grad():  # the chunked path is really taken
        assert isinstance(tr.logprobs.rows(tr.model, rb, mbs[0], return_logits=True)[1], HeadInputs)
    chunked = _state(tr, rb, mbs)
    for a, b in zip(full[:4], chunked[:4]):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-6)
    assert float((full[2] - 1).abs().max()) > 0.1  # TW-GRPO weights are not trivial
    ga, gb = full[4], chunked[4]
    assert set(ga) == set(gb) and ga
    for n in ga:
        assert float((ga[n] - gb[n]).abs().max()) <= 1e-5 * max(float(ga[n].abs().max()), 1e-12), n


def test_negative_chunk_size_is_refused(tmp_path, tiny_dirs, th):
    with pytest.raises(ValueError, match="logprob_chunk_size"):
        th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "algo.logprob_chunk_size=-1")
