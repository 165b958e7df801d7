"""bf16 on CPU (issue 17 item 4): the tiny SD3 / FLUX pipelines in bf16 train a few steps; the transformer computes in
bf16 while log-probs, advantages and the loss stay fp32; the first on-policy ratio is 1; LoRA adapters are fp32;
full fine-tuning updates bf16 weights through fp32 masters, which survive a checkpoint; an SDE step's log-prob from
a bf16 velocity is the fp32 Gaussian log-density of the upcast tensors.

Ratio tolerance: 0 on CPU. The old log-probs (rollout) and the new ones (first update, weights unchanged) come from
the same model call on the same rollout chunk (``Trajectories.chunks``), the same latents and the same cached prompt
embeddings, so the same kernels run on the same inputs; CPU kernels are deterministic. A CUDA backend that picks a
different attention kernel for the no-grad rollout forward and the grad forward would break exactness; its
deviation is then of the order of the bf16 rounding of the velocity, measured in ``test_bf16_velocity_floor``.
"""
from flow_grpo.train import steps
import math

import pytest
import torch

from .conftest import H, W, block_reward, train_overrides

BF16 = torch.bfloat16


def _bf16_adapter(kind):
    """The tiny pipeline wholly in bf16 (as ``load_adapter(dtype=bfloat16)`` loads a checkpoint: VAE and text
    encoders included)."""
    from flow_grpo.models import adapter_from_pipeline
    from flow_grpo.models.tiny import build_tiny_flux_pipeline, build_tiny_sd3_pipeline

    pipe = build_tiny_sd3_pipeline(0) if kind == "sd3" else build_tiny_flux_pipeline(0)
    pipe.to(BF16)
    return adapter_from_pipeline(pipe, max_sequence_length=16, dtype=BF16)


class _Recorder:
    """Wraps the loss pieces of the recipe's column loss (``flow_grpo.train.steps.column_loss`` imports them from
    ``mmgrpo.core.losses`` per call) to record dtypes, ratios and losses of each micro-batch."""

    def __init__(self, monkeypatch):
        import mmgrpo.core.losses as L

        self.calls = []
        real_lr, real_sur, real_agg = L.log_ratio, L.clipped_surrogate, L.aggregate_loss

        def log_ratio(logp, old_logp, mask, *a, **kw):
            out = real_lr(logp, old_logp, mask, *a, **kw)
            self.calls.append({"logp": logp.dtype, "old": old_logp.dtype, "log_ratio": out.detach()[mask.bool()]})
            return out

        def clipped_surrogate(lr, advantages, *a, **kw):
            self.calls[-1]["adv"] = advantages.dtype
            return real_sur(lr, advantages, *a, **kw)

        def aggregate_loss(*a, **kw):
            out = real_agg(*a, **kw)
            self.calls[-1].update(loss=out.dtype, loss_value=float(out.detach()))
            return out

        monkeypatch.setattr(L, "log_ratio", log_ratio)
        monkeypatch.setattr(L, "clipped_surrogate", clipped_surrogate)
        monkeypatch.setattr(L, "aggregate_loss", aggregate_loss)


def _trainer(kind, method, out, **extra):
    from flow_grpo.config import load_train_config
    from flow_grpo.train.trainer import FlowGRPOTrainer

    cfg = load_train_config(None, train_overrides(kind, method, out, **{"model.dtype": "bfloat16", **extra}))
    return FlowGRPOTrainer(cfg, adapter=_bf16_adapter(kind), reward_fn={"block": block_reward})


@pytest.mark.parametrize("kind,method,extra", [("sd3", "flow", {"optim.kl_coef": 0.01}), ("flux", "fast", {})])
def test_bf16_lora_steps(kind, method, extra, tmp_path, monkeypatch):
    rec = _Recorder(monkeypatch)
    tr = _trainer(kind, method, tmp_path, **extra)
    outs = []
    tr.adapter.transformer.register_forward_hook(lambda m, a, o: outs.append(o[0].dtype))
    before = {n: p.detach().clone() for n, p in tr.named_params}
    tr.train()
    # weights: the base transformer, text encoders and VAE stay bf16; the LoRA adapters are fp32 (trained)
    base = {p.dtype for n, p in tr.adapter.transformer.named_parameters() if "lora_" not in n}
    assert base == {BF16}
    assert {p.dtype for _, p in tr.named_params} == {torch.float32}
    assert all("lora_" in n for n, _ in tr.named_params)
    for mod in tr.adapter._frozen_modules():
        assert {p.dtype for p in mod.parameters()} == {BF16}
    assert set(outs) == {BF16}  # every transformer forward ran in bf16 (nothing upcast the model)
    changed = [n for n, p in tr.named_params if not torch.equal(p.detach(), before[n])]
    assert len(changed) > len(before) // 2
    # log-probs, advantages and the loss are fp32 and finite
    traj = tr.state.last_traj
    assert traj.log_probs.dtype == torch.float32 and traj.latents.dtype == torch.float32
    adv, _ = steps.advantages(tr, traj)
    assert adv.dtype == torch.float32
    assert rec.calls and all(c["logp"] == c["old"] == c["adv"] == c["loss"] == torch.float32 for c in rec.calls)
    assert all(math.isfinite(c["loss_value"]) for c in rec.calls)
    # one update per epoch: every call is the first inner step -> ratio exactly 1 (see the module docstring)
    lr = torch.cat([c["log_ratio"] for c in rec.calls])
    assert lr.numel() > 0 and float(lr.abs().max()) == 0.0


def test_bf16_full_finetune_fp32_masters_and_checkpoint(tmp_path, monkeypatch):
    from mmgrpo.utils.master_weights import MasterWeightAdamW

    rec = _Recorder(monkeypatch)
    # eval every epoch: the fp32 EMA is swapped into the bf16 weights and swapped out again
    extra = {"model.lora.enabled": "false", "optim.lr": 1e-3, "run.save_every": 1, "run.num_epochs": 2,
             "run.eval_every": 1, "data.eval_prompts": "[a red cube]"}
    tr = _trainer("flux", "fast", tmp_path, **extra)
    before = {n: p.detach().clone() for n, p in tr.named_params}
    hist = tr.train()
    assert all(math.isfinite(m["eval/reward/total/mean"]) for m in hist)
    assert {p.dtype for _, p in tr.named_params} == {BF16}
    opt = tr.optimizer.optimizer  # accelerate's wrapper around ours
    assert isinstance(opt, MasterWeightAdamW)
    assert all(m.dtype == torch.float32 for m in opt.masters)
    for p, m in zip(opt.model_params, opt.masters):
        assert torch.equal(p.detach(), m.to(BF16))  # the bf16 weights are the rounded masters
    n_changed = sum(int((p.detach() != before[n]).sum()) for n, p in tr.named_params)
    assert n_changed > 0.5 * sum(p.numel() for _, p in tr.named_params)
    assert all(math.isfinite(c["loss_value"]) for c in rec.calls) and rec.calls
    assert all(s.dtype == torch.float32 for s in tr.ema.shadow)  # EMA of bf16 weights is kept in fp32
    # resume (a new trainer on the same output dir) restores the bf16 weights and the fp32 masters bit for bit
    tr.close()
    tr2 = _trainer("flux", "fast", tmp_path, **{**extra, "run.resume_from": "auto"})
    assert tr2.resume() is not None
    opt2 = tr2.optimizer.optimizer
    for (n, p), p2 in zip(tr.named_params, [p for _, p in tr2.named_params]):
        assert p2.dtype == BF16 and torch.equal(p.detach(), p2.detach()), n
    for m, m2 in zip(opt.masters, opt2.masters):
        assert torch.equal(m, m2)
    for s, s2 in zip(tr.ema.shadow, tr2.ema.shadow):
        assert torch.equal(s, s2)
    tr2.close()


def _flow_reference_logprob(v, x, x_next, sigma, sigma_next, a, dtype=torch.float64):
    """Flow-GRPO's SDE step written out with torch.distributions (independent of flow_grpo.sde), evaluated in
    ``dtype``: float64 = the reference; bfloat16 = what a downcast log-density would give."""
    v, x, x_next = v.to(dtype), x.to(dtype), x_next.to(dtype)
    s, sn = float(sigma), float(sigma_next)
    dt = sn - s
    g = a * math.sqrt(s / ((1 - sn) if s >= 1.0 else (1 - s)))
    mean = x + dt * (v + g * g / (2 * s) * (x + (1 - s) * v))
    lp = torch.distributions.Normal(mean, torch.tensor(g * math.sqrt(-dt), dtype=dtype)).log_prob(x_next)
    return lp.flatten(1).mean(1).double()


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_sde_logprob_from_bf16_velocity_is_the_fp32_gaussian(kind):
    from flow_grpo.config import SamplingConfig
    from flow_grpo.sampler import sample_trajectories, score_column
    ad = _bf16_adapter(kind)
    cfg = SamplingConfig(num_steps=4, height=H, width=W, batch_size=2, sde_kind="flow", noise_level=0.7,
                         step_mode="all", cfg=kind == "sd3", guidance_scale=4.5 if kind == "sd3" else 3.5)
    traj = sample_trajectories(ad, ["a cat", "a dog"], cfg, [1, 2], [3, 4], [5, 6], [0, 0])
    for col in range(traj.train_mask.shape[1]):
        with torch.no_grad():
            out, v = score_column(ad, traj, traj.chunks[0], col, return_velocity=True)
        assert v.dtype == torch.float32 and out.log_prob.dtype == torch.float32
        x, x_next = traj.latents[:, col], traj.next_latents[:, col]
        ref = _flow_reference_logprob(v, x, x_next, traj.sigmas[col], traj.sigmas_next[col], 0.7)
        # fp32 evaluation of O(1) per-element terms averaged: agrees with float64 to ~1e-6
        torch.testing.assert_close(out.log_prob.double(), ref, atol=2e-5, rtol=1e-6)
        # the rollout stored the same number (same chunk, same kernels)
        assert torch.equal(out.log_prob, traj.log_probs[:, col])
        # the tolerance has teeth: the same Gaussian evaluated in bf16 arithmetic misses the reference by far more
        lp16 = _flow_reference_logprob(v, x, x_next, traj.sigmas[col], traj.sigmas_next[col], 0.7, dtype=BF16)
        assert float((lp16 - ref).abs().max()) > 1e-3


def test_bf16_velocity_floor():
    """The bf16 "noise floor" of the tiny FLUX transformer: its bf16 velocity vs the fp32 velocity of the same
    (bf16-valued) weights. Nonzero (the model really computes in bf16), small against the velocity scale."""
    from flow_grpo.models import adapter_from_pipeline
    from flow_grpo.models.tiny import build_tiny_flux_pipeline

    ad16 = _bf16_adapter("flux")
    pipe32 = build_tiny_flux_pipeline(0)
    pipe32.to(BF16).to(torch.float32)  # the same bf16-rounded values, computed in fp32
    ad32 = adapter_from_pipeline(pipe32, max_sequence_length=16, dtype=torch.float32)
    x = ad16.initial_noise([1, 2], H, W)
    ad16.set_resolution(H, W)
    ad32.set_resolution(H, W)
    with torch.no_grad():
        v16 = ad16.predict_velocity(x, 0.7, ad16.encode_prompts(["a cat", "a dog"]), 3.5)
        v32 = ad32.predict_velocity(x, 0.7, ad32.encode_prompts(["a cat", "a dog"]), 3.5)
    rel = float((v16 - v32).abs().max() / v32.abs().max())
    assert 0 < rel < 2 ** -4, rel
