"""bf16 on CPU (issue 17 item 4): a tiny Qwen-VL in bf16 trains a few GRPO steps (full fine-tuning and LoRA); the
model computes in bf16 (vision tower fed bf16 pixels, bf16 logits) while log-probs, advantages and the loss are
fp32; the first inner step's ratio is 1; LoRA adapters stay fp32 (peft's default on a bf16 base); bf16 weights are
updated through fp32 masters that a resume restores.

Ratio tolerance: 0 on CPU. With ``algo.num_iterations > 1`` the old log-probs (``precompute``, no grad, eval mode)
and the first update's (grad, train mode, weights not yet changed) come from the same ``compute_token_logprobs``
call on the same micro-batch (same padding, same shapes), so the same deterministic CPU kernels see the same
inputs (dropout is 0). A CUDA backend that picks different kernels for the no-grad and the grad forward (e.g. SDPA
flash vs memory-efficient) loses exactness; the deviation is then bounded by the bf16 rounding of the logits, whose
scale on this model ``test_bf16_logprob_floor`` measures (bf16 vs fp32 log-probs of the same weights).
"""
import math

import pytest
import torch

from mmgrpo.vlm.train.trainer import GRPOTrainer
from mmgrpo.vlm.train import steps

BF16 = torch.bfloat16


class _Recorder:
    """Wraps the run's policy loss (chosen at setup by ``policy_loss``) to record dtypes, first-iteration
    log-ratios and losses."""

    def __init__(self, monkeypatch):
        import mmgrpo.vlm.train.trainer as T
        from mmgrpo.vlm.methods.base import PolicyLoss

        self.calls = []
        real = T.policy_loss

        def pick(methods):
            pl = real(methods)

            def rec(li):
                out = pl.fn(li)
                m = li.mask.bool()
                self.calls.append({"dtypes": (li.logp.dtype, li.old_logp.dtype, li.advantages.dtype, out.loss.dtype),
                                   "loss": float(out.loss.detach()), "log_ratio": (li.logp.detach() - li.old_logp)[m],
                                   "ref": None if li.ref_logp is None else li.ref_logp.dtype})
                return out

            return PolicyLoss(rec, pl.share)

        monkeypatch.setattr(T, "policy_loss", pick)


def _hooks(model):
    """Output dtypes of the LM head and of the vision tower's patch embedding (what the model computes in)."""
    seen = {"lm_head": set(), "patch_embed": set()}
    for name, mod in model.named_modules():
        for key in seen:
            if name.endswith(key) and not name.endswith("base_layer"):
                mod.register_forward_hook(lambda m, a, o, k=key: seen[k].add(o.dtype))
    return seen


def _train(tr, n):
    return tr.train(steps=n)


def _check_losses_and_ratio(rec, iters):
    assert rec.calls
    assert all(c["dtypes"] == (torch.float32,) * 4 for c in rec.calls)  # log-probs, old, advantages, loss
    assert all(c["ref"] in (None, torch.float32) for c in rec.calls)
    assert all(math.isfinite(c["loss"]) for c in rec.calls)
    # one micro-batch per step: calls alternate iteration 0, 1, ..., iters-1
    first = torch.cat([c["log_ratio"] for c in rec.calls[::iters]])
    assert first.numel() > 0 and float(first.abs().max()) == 0.0  # exact: see the module docstring
    later = torch.cat([c["log_ratio"] for i, c in enumerate(rec.calls) if i % iters])
    assert float(later.abs().max()) > 0  # the weights did move between iterations


def test_bf16_full_finetune_steps_and_resume(tmp_path, tiny_dirs, th, monkeypatch):
    from mmgrpo.utils.master_weights import MasterWeightAdamW

    rec = _Recorder(monkeypatch)
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "model.dtype=bfloat16", "algo.num_iterations=2",
                      "algo.kl_coef=0.04", "optim.lr=1e-3")
    tr = GRPOTrainer(cfg, samples=th.video_samples(2) + th.image_samples(2), reward_fn=th.text_reward)
    seen = _hooks(tr.model)
    assert {p.dtype for p in tr.model.parameters()} == {BF16}
    assert isinstance(tr.optimizer, MasterWeightAdamW)
    before = th.trainable(tr)
    hist = _train(tr, 2)
    # the whole model is still bf16 and computed in bf16 (vision tower included); the loss is finite
    assert {p.dtype for p in tr.model.parameters()} == {BF16}
    assert seen == {"lm_head": {BF16}, "patch_embed": {BF16}}
    assert all(math.isfinite(m["train/loss"]) for m in hist)
    rb = tr.state.batch
    assert rb.advantages.dtype == rb.old_logp.dtype == rb.ref_logp.dtype == torch.float32
    _check_losses_and_ratio(rec, 2)
    # the bf16 weights are the rounded fp32 masters, and they moved
    after = th.trainable(tr)
    assert sum(int((after[n] != before[n]).sum()) for n in after) > 0.5 * sum(v.numel() for v in after.values())
    for p, m in zip(tr.optimizer.model_params, tr.optimizer.masters):
        assert m.dtype == torch.float32 and torch.equal(p.detach(), m.to(BF16))
    # checkpoint of bf16 weights + masters; a new trainer resumes both bit for bit (stored values)
    tr.save()
    tr2 = GRPOTrainer(th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "model.dtype=bfloat16", "algo.num_iterations=2",
                                  "algo.kl_coef=0.04", "optim.lr=1e-3", "run.resume_from=auto"),
                      samples=th.video_samples(2) + th.image_samples(2), reward_fn=th.text_reward)
    assert tr2._start()
    for n, p in tr2.model.named_parameters():
        if p.requires_grad:
            assert p.dtype == BF16 and torch.equal(p.detach(), after[n]), n
    for m, m2 in zip(tr.optimizer.masters, tr2.optimizer.masters):
        assert torch.equal(m, m2)


def test_bf16_lora_adapters_fp32(tmp_path, tiny_dirs, th, monkeypatch):
    """peft upcasts adapters to fp32 on a bf16 base (get_peft_model(autocast_adapter_dtype=True), its default, as
    TRL relies on); the base stays bf16 and the optimizer needs no masters."""
    rec = _Recorder(monkeypatch)
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "model.dtype=bfloat16", "model.lora.enabled=true",
                      "model.lora.rank=4", "model.lora.alpha=8", "algo.num_iterations=2", "algo.kl_coef=0.04")
    tr = GRPOTrainer(cfg, samples=th.video_samples(4), reward_fn=th.text_reward)
    seen = _hooks(tr.model)
    train_dt = {p.dtype for p in tr.model.parameters() if p.requires_grad}
    frozen_dt = {p.dtype for p in tr.model.parameters() if not p.requires_grad}
    assert train_dt == {torch.float32} and frozen_dt == {BF16}
    assert type(tr.optimizer) is torch.optim.AdamW
    before = th.trainable(tr)
    hist = _train(tr, 2)
    assert all(math.isfinite(m["train/loss"]) for m in hist)
    assert seen["lm_head"] == {BF16}
    after = th.trainable(tr)
    assert all(n.count("lora_") for n in after) and any(not torch.equal(after[n], before[n]) for n in after)
    assert {p.dtype for p in tr.model.parameters() if not p.requires_grad} == {BF16}
    _check_losses_and_ratio(rec, 2)


@pytest.fixture
def fresh_accelerate_state():
    """accelerate keeps one process-wide state; another mixed_precision needs it reset (before and after)."""
    from accelerate.state import AcceleratorState, GradientState

    def reset():
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()

    reset()
    yield
    reset()


def test_mixed_precision_autocast_keeps_fp32_weights_and_logprobs(tmp_path, tiny_dirs, th, monkeypatch,
                                                                   fresh_accelerate_state):
    """run.mixed_precision=bf16 on fp32 weights: matmuls in bf16 (autocast), weights fp32, log-probs / loss fp32."""
    rec = _Recorder(monkeypatch)
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.mixed_precision=bf16", "algo.num_iterations=2",
                      "run.max_steps=1")
    tr = GRPOTrainer(cfg, samples=th.video_samples(2), reward_fn=th.text_reward)
    seen = _hooks(tr.model)
    hist = _train(tr, 1)
    assert {p.dtype for p in tr.model.parameters()} == {torch.float32}
    assert type(tr.optimizer) is torch.optim.AdamW
    assert BF16 in seen["lm_head"]  # the scored forwards ran under autocast
    assert math.isfinite(hist[0]["train/loss"])
    _check_losses_and_ratio(rec, 2)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_bf16_logprob_floor(tmp_path, tiny_dirs, th, family):
    """bf16 log-probs vs fp32 log-probs of the same (bf16-valued) weights on the same rows: nonzero (the model
    really runs in bf16) and small. This is the scale of a legitimate bf16 disagreement (e.g. rollout engine vs
    trainer), against which the exact first-step ratio above is the stronger check."""
    cfg = th.make_cfg(tmp_path, tiny_dirs(family), "model.dtype=bfloat16", "rollout.max_new_tokens=8",
                      "run.logprob_impl=naive")
    tr = GRPOTrainer(cfg, samples=th.video_samples(2), reward_fn=th.text_reward)
    tr.state.stream = tr.new_stream()
    rb = steps.collect(tr, 0)
    idx = torch.arange(rb.n)
    m = rb.completion_mask.bool()
    with torch.no_grad():
        lp16 = tr.logprobs.rows(tr.model, rb, idx)
        tr.model.float()
        lp32 = tr.logprobs.rows(tr.model, rb, idx)
    assert lp16.dtype == lp32.dtype == torch.float32
    d = (lp16 - lp32)[m[:, :lp16.shape[1]]].abs()
    assert 0 < float(d.max()) < 2 ** -5, float(d.max())


def test_bf16_lora_adapter_saved_and_reloaded_in_fp32(tmp_path, tiny_dirs):
    """A saved adapter holds fp32 tensors and ``load_policy(lora_path=...)`` on a bf16 base trains them in fp32
    (``PeftModel.from_pretrained`` upcasts like ``get_peft_model``)."""
    import glob

    from safetensors.torch import load_file

    from mmgrpo.vlm.models.adapters import LoraSpec, load_policy

    pol = load_policy(tiny_dirs("qwen2_5_vl"), dtype="bfloat16",
                      lora=LoraSpec(r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"]))
    pol.save_pretrained(tmp_path / "adapter")
    (f,) = glob.glob(str(tmp_path / "adapter" / "*.safetensors"))
    assert {v.dtype for v in load_file(f).values()} == {torch.float32}
    pol2 = load_policy(tiny_dirs("qwen2_5_vl"), dtype="bfloat16", lora_path=tmp_path / "adapter")
    assert {p.dtype for p in pol2.model.parameters() if p.requires_grad} == {torch.float32}
    assert {p.dtype for p in pol2.model.parameters() if not p.requires_grad} == {BF16}
