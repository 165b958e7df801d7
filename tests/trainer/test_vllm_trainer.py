"""The trainer with rollout.backend=vllm over the fake vLLM engine (tests/models/test_vllm_backend.py): one weight
push per training step carrying the updated weights, and TRL's truncated IS weights in the loss."""
import importlib.util
import pathlib

import pytest
import torch

from mmgrpo.vlm.data.batch import micro_batches
from mmgrpo.vlm.train.trainer import GRPOTrainer
from mmgrpo.vlm.train import steps


def _fakes():
    path = pathlib.Path(__file__).parents[1] / "models" / "test_vllm_backend.py"
    spec = importlib.util.spec_from_file_location("_vllm_fakes", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _backend(tok):
    """The colocate wiring (LLMWeightSyncClient over the LLM) with the fake LLM and the fake transfer engine."""
    from mmgrpo.vlm.models.vllm_backend import LLMWeightSyncClient, LocalEngine, VLLMRolloutBackend, WeightPusher

    f = _fakes()
    llm = f.FakeLLM(eos=tok.convert_tokens_to_ids("<|im_end|>"), vocab=(40, 41, 42, 43))
    pusher = WeightPusher(LLMWeightSyncClient(llm), f.FakeTransfer, llm.reset_prefix_cache,
                          source_factory=f.ModelSource)
    # check_prompts off: the fake does not run Qwen's processor to expand the vision placeholders
    return VLLMRolloutBackend(LocalEngine(llm, f.FakeSamplingParams), tok, pusher, check_prompts=False), llm


def test_vllm_backend_in_the_trainer_pushes_each_step_and_weights_the_loss(tmp_path, tiny_dirs, th):
    # the fake engine's log-probs are made up (not the policy's): the step-0 on-policy check would stop the run
    # (tests/trainer/test_onpolicy_check.py checks that); this test is about the weight push and the IS weights
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "rollout.backend=vllm", "rollout.vllm_is_cap=2.0",
                      "rollout.onpolicy_check=false")
    from mmgrpo.vlm.models.tiny import build_tiny_tokenizer

    be, llm = _backend(build_tiny_tokenizer())
    tr = GRPOTrainer(cfg, samples=th.video_samples(2), reward_fn=th.text_reward, backend=be)
    be.tokenizer = tr.tok
    tr.state.stream = tr.new_stream()
    # the requests carry the clip's frames + metadata
    rb = steps.collect(tr, 0)
    (_, prompts, sps), = [c for c in llm.calls if c[0] == "generate"]
    assert len(prompts) == 8 and all("video" in p["multi_modal_data"] for p in prompts)
    assert len({s.seed for s in sps}) == 8 and all(s.logprobs == 0 for s in sps)
    # IS weights = min(exp(old - engine), cap) on every completion token, by hand from the batch's own log-probs
    steps.precompute(tr, rb, micro_batches(rb.group_ids, cfg.run.micro_batch_size))
    m = rb.completion_mask.bool()
    want = torch.ones_like(rb.old_logp)
    want[m] = torch.minimum(torch.exp(rb.old_logp[m] - rb.rollout_logp[m]), torch.tensor(2.0))
    assert rb.token_weights is not None and torch.allclose(rb.token_weights, want, atol=1e-6)
    assert rb.rollout_logp[m].max() < 0 and rb.info["rollout/is_weight_max"] <= 2.0

    # two training steps: one push each, after the update, carrying the trainer's current weights
    tr2 = GRPOTrainer(cfg, samples=th.video_samples(2), reward_fn=th.text_reward, backend=_backend(tr.tok)[0])
    be2 = tr2.backend
    tr2.state.stream = tr2.new_stream()
    for step in range(2):
        met = tr2.train(steps=1)[-1]
        assert be2.pusher.pushes == step + 1
        sent = be2.pusher.transfer.sent[-1]
        cur = {n: p.detach() for n, p in tr2.model.named_parameters() if p.requires_grad}
        assert set(sent) == set(cur) and all(torch.equal(sent[n], cur[n]) for n in cur)
        assert "rollout/is_weight_mean" in met and 0 < met["rollout/is_weight_mean"] <= 2.0
    calls = [c[0] for c in be2.engine.llm.calls if c[0] != "generate"]
    assert calls == ["init_weight_transfer_engine"] + ["start_weight_update", "update_weights",
                                                        "finish_weight_update", "reset_prefix_cache"] * 2


def test_vllm_refuses_tgrpo_before_loading(tmp_path, th):
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.utils.config import load_config

    with pytest.raises(ValueError, match="methods.t_grpo.enabled needs rollout.backend=hf"):
        load_config(TrainConfig, None, ["rollout.backend=vllm", "methods.t_grpo.enabled=true"])
    with pytest.raises(ValueError, match="vllm_is_cap"):
        load_config(TrainConfig, None, ["rollout.vllm_is_cap=-1"])
