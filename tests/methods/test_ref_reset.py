"""ProRL reference reset: the optimizer reset gives a first Adam step again (against a fresh AdamW), the trainer's
reference becomes the policy every `every` updates (full fine-tuning) and is checkpointed; LoRA is refused."""
import pytest
import torch

from mmgrpo.vlm.methods.ref_reset import reset_optimizer_state_
from mmgrpo.vlm.train.trainer import GRPOTrainer


def test_optimizer_reset_equals_a_fresh_adamw():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(3))
    q = torch.nn.Parameter(p.detach().clone())
    opt = torch.optim.AdamW([p], lr=0.1)
    for _ in range(3):
        p.grad = torch.randn(3)
        opt.step()
    assert reset_optimizer_state_(opt) == 1
    q.data.copy_(p.data)
    fresh = torch.optim.AdamW([q], lr=0.1)
    g = torch.randn(3)
    p.grad, q.grad = g.clone(), g.clone()
    opt.step()
    fresh.step()
    torch.testing.assert_close(p.data, q.data)


def test_trainer_resets_the_reference(tmp_path, tiny_dirs, th):
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=2", "algo.kl_coef=0.1",
                      "methods.ref_reset.enabled=true", "methods.ref_reset.every=2")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    ref0 = {k: v.detach().clone() for k, v in tr.policy.ref_model.named_parameters()}
    hist = tr.train()
    assert [h["ref_reset/resets"] for h in hist] == [0.0, 1.0]
    pol = th.trainable(tr)
    ref = dict(tr.policy.ref_model.named_parameters())
    changed = [k for k in pol if not torch.equal(pol[k], ref0[k])]
    assert changed and all(torch.equal(ref[k].detach(), pol[k]) for k in pol)
    sd = tr.methods[0].state_dict()
    assert sd["resets"] == 1 and set(sd["reference"]) == set(pol)


def test_refuses_lora_and_no_kl(tmp_path, tiny_dirs, th):
    from mmgrpo.vlm.methods import check_config

    with pytest.raises(ValueError, match="kl_coef"):
        check_config(th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.ref_reset.enabled=true"))
    with pytest.raises(ValueError, match="LoRA"):
        check_config(th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.ref_reset.enabled=true",
                                 "algo.kl_coef=0.1", "model.lora.enabled=true"))
