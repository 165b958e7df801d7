"""Step-0 on-policy check (mmgrpo.vlm.monitor.onpolicy, issue #33 item 5): the statistics by hand, a normal run that
passes with the HF and the (fake) vLLM backend, and mismatches that stop the run before any update: a rollout that
samples from another chat template (system turn) and an engine whose log-probs are not the policy's."""
import importlib.util
import math
import pathlib

import pytest
import torch

from mmgrpo.engine.errors import TrainingStopped
from mmgrpo.vlm.models.rollout import collate_prompts, compute_token_logprobs
from mmgrpo.vlm.monitor.onpolicy import ratio_statistics, tolerance
from mmgrpo.vlm.train.trainer import GRPOTrainer


def test_ratio_statistics_by_hand():
    train = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 0.0]])
    roll = torch.tensor([[-1.0, -2.5, -2.0], [-0.25, -0.5, 0.0]])
    mask = torch.tensor([[1, 1, 1], [0, 1, 0]])
    st = ratio_statistics(train, roll, mask)
    # |e^d - 1| for d = 0, 0.5, -1 (row 0) and d = 0 (row 1, token 1; token 0 and 2 masked)
    want = [0.0, math.exp(0.5) - 1, 1 - math.exp(-1.0), 0.0]
    assert st["n"] == 4 and st["sum_abs"] == pytest.approx(sum(want), rel=1e-12)
    assert st["max_abs"] == pytest.approx(math.exp(0.5) - 1, rel=1e-12)
    # first masked token of each row: row 0 token 0 (|r-1| = 0), row 1 token 1 (0)
    assert st["first_n"] == 2 and st["first_sum_abs"] == 0.0


def test_tolerance_by_dtype_and_explicit():
    assert tolerance("float32", 0.0) == ("max", 1e-3)
    assert tolerance("bfloat16", 0.0) == ("mean", 2e-2)
    assert tolerance("float16", 0.0) == ("mean", 5e-3)
    assert tolerance("bfloat16", 0.3) == ("max", 0.3)


def test_compute_dtype_follows_autocast():
    import types

    from mmgrpo.vlm.monitor.onpolicy import compute_dtype

    cfg = lambda d, mp: types.SimpleNamespace(model=types.SimpleNamespace(dtype=d), run=types.SimpleNamespace(  # noqa
        mixed_precision=mp))
    assert compute_dtype(cfg("float32", "no")) == "float32"
    assert compute_dtype(cfg("float32", "bf16")) == "bfloat16"  # autocast scores in bf16 (test_bf16.py's case)
    assert compute_dtype(cfg("bfloat16", "no")) == "bfloat16" and compute_dtype(cfg("float32", "fp16")) == "float16"


def test_config_rejects_negative_tolerance():
    from mmgrpo.utils.config import load_config
    from mmgrpo.vlm.config import TrainConfig

    with pytest.raises(ValueError, match="onpolicy_tol"):
        load_config(TrainConfig, None, ["rollout.onpolicy_tol=-1"])


def test_normal_hf_run_passes(tmp_path, tiny_dirs, th):
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1")
    tr = GRPOTrainer(cfg, samples=th.video_samples(2), reward_fn=th.text_reward)
    before = th.trainable(tr)
    tr.train()
    st = tr.onpolicy.stats
    assert st["passed"] and st["tokens"] == float(tr.state.batch.completion_mask.sum())
    assert st["max_abs"] < 1e-4  # fp32: KV-cached sampling vs the trainer's forward differ by rounding only
    assert any(not torch.equal(before[n], p) for n, p in th.trainable(tr).items())


def _rollout_with_other_template(tr, mode: str, monkeypatch) -> None:
    """The backend samples from the prompt rendered with another prompt mode (another system turn), while the
    trainer scores its own rendering: a chat-template mismatch between engine and trainer."""
    other, orig_prepare, orig_generate = {}, tr.feed.prepare, tr.backend.generate

    def prepare(drawn, samples, counters):
        preps = orig_prepare(drawn, samples, counters)
        for _, pp, _ in preps:
            other[id(pp.item)] = tr.task.rebuild(pp, mode=mode).item
        return preps

    def generate(prompts, k, params, **kw):
        return orig_generate([other.get(id(p), p) for p in prompts], k, params, **kw)

    monkeypatch.setattr(tr.feed, "prepare", prepare)
    tr.backend.generate = generate


def test_template_mismatch_stops_before_any_update(tmp_path, tiny_dirs, th, monkeypatch):
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"))
    tr = GRPOTrainer(cfg, samples=th.video_samples(2), reward_fn=th.text_reward)
    before = th.trainable(tr)
    _rollout_with_other_template(tr, "think", monkeypatch)
    with pytest.raises(TrainingStopped) as e:
        tr.train(steps=1)
    msg = str(e.value)
    assert "step-0 on-policy check failed" in msg and "max |ratio-1|" in msg
    assert msg.split("most likely first:")[1].lstrip().startswith("1. prompt")  # the template is named first
    assert "checkpoint written" not in msg and not (tmp_path / "run" / "checkpoints").exists()
    # a random tiny model's next-token distribution is flat, so the change is small, yet far above fp32 rounding
    assert tr.onpolicy.stats["max_abs"] > 1e-2 and not tr.onpolicy.stats["passed"]
    assert all(torch.equal(before[n], p) for n, p in th.trainable(tr).items())  # no update was applied


def test_switch_off_trains_despite_the_mismatch(tmp_path, tiny_dirs, th, monkeypatch):
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "rollout.onpolicy_check=false", "run.max_steps=1")
    tr = GRPOTrainer(cfg, samples=th.video_samples(2), reward_fn=th.text_reward)
    _rollout_with_other_template(tr, "think", monkeypatch)
    m = tr.train(steps=1)[-1]
    assert m["train/skipped_steps"] == 0 and tr.onpolicy.stats is None


# ------------------------------------------------------------------------------------------------ vLLM backend
def _vllm_fakes():
    path = pathlib.Path(__file__).parent / "test_vllm_trainer.py"
    spec = importlib.util.spec_from_file_location("_vllm_trainer_fakes", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _scoring_engine(tr, backend, llm) -> None:
    """Make the fake engine report the policy's own log-probs of the tokens it samples (a consistent engine): the
    backend's generate records the prompt item of each request row (prompt-major, one request per row)."""
    orig_backend, orig_llm = backend.generate, llm.generate

    def backend_generate(prompts, num_generations, params, seeds=None, raw_prompts=None):
        llm.row_items = [p for p in prompts for _ in range(int(num_generations))]
        return orig_backend(prompts, num_generations, params, seeds=seeds, raw_prompts=raw_prompts)

    def llm_generate(prompts, sampling_params=None, **kw):
        outs = orig_llm(prompts, sampling_params, **kw)
        for item, out in zip(llm.row_items, outs):
            c = out.outputs[0]
            ids = torch.tensor([c.token_ids])
            with torch.no_grad():
                lp = compute_token_logprobs(tr.model, collate_prompts([item], tr.pad_id), ids, torch.ones_like(ids),
                                            tr.sampling.temperature, tr.policy.suppress_token_ids)[0]
            c.logprobs = [{t: type(next(iter(d.values())))(float(v), 1)} for t, d, v in
                          zip(c.token_ids, c.logprobs, lp)]
        return outs

    backend.generate, llm.generate = backend_generate, llm_generate


@pytest.mark.parametrize("consistent", [True, False])
def test_vllm_backend_consistent_engine_passes_made_up_logprobs_stop(tmp_path, tiny_dirs, th, consistent):
    from mmgrpo.vlm.models.tiny import build_tiny_tokenizer

    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "rollout.backend=vllm", "run.max_steps=1")
    be, llm = _vllm_fakes()._backend(build_tiny_tokenizer())
    tr = GRPOTrainer(cfg, samples=th.video_samples(2), reward_fn=th.text_reward, backend=be)
    be.tokenizer = tr.tok
    if consistent:
        _scoring_engine(tr, be, llm)
        tr.train(steps=1)
        assert tr.onpolicy.stats["passed"] and tr.onpolicy.stats["max_abs"] < 1e-4
    else:  # the fake's log-probs -(0.25 + 0.5 k) are another distribution than the policy's
        with pytest.raises(TrainingStopped, match="on-policy check failed"):
            tr.train(steps=1)
        assert be.pusher.pushes == 0  # stopped before the update (and its weight push)
