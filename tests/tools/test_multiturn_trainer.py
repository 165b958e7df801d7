"""Multi-turn tool rollouts inside the GRPO trainer (tiny Qwen2.5-VL, HF backend): rows carry their tool media and a
loss mask over policy tokens, the step-0 on-policy check passes over both turns, tool counts are logged, and a
resumed run ends on the same weights bit for bit."""
import torch

from mmgrpo.vlm.train import steps
from mmgrpo.vlm.train.trainer import GRPOTrainer

CALL = '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [0, 0, 28, 28]}}</tool_call>'
FIRST = [CALL, "<answer>B</answer>", "look " + CALL, '<tool_call>{"name": "crop"}</tool_call>']


def trainer(c, forced, kit):
    tr = GRPOTrainer(c, samples=kit.samples(3), reward_fn=kit.reward)
    tr.backend.inner = forced(tr.backend.inner, tr.policy, FIRST)
    return tr


def test_multiturn_step_masks_tool_turns_and_trains(tmp_path, tiny_dir, forced, kit):
    tr = trainer(kit.cfg(tmp_path, tiny_dir, "algo.kl_coef=0.05"), forced, kit)
    assert tr.logprob_impl == "naive"  # rows of a group have their own items
    tr.state.stream = tr.new_stream()
    rb = steps.collect(tr, 0)
    calls = rb.rewards["tools/tool_calls"]
    assert calls.tolist() == [1.0, 0.0, 1.0, 1.0] * 2  # the 4th: a call without arguments, a counted failure
    assert rb.rewards["tools/tool_failures"].tolist() == [0.0, 0.0, 0.0, 1.0] * 2
    assert rb.rewards["tools/turns"].tolist() == [2.0, 1.0, 2.0, 2.0] * 2
    tool_rows = (calls > 0) & (rb.rewards["tools/tool_failures"] == 0)
    assert (rb.loss_mask < rb.completion_mask).any(1).tolist() == (rb.rewards["tools/turns"] > 1).tolist()
    # a tool row's item holds the prompt image and the crop
    assert all(rb.items[i]["image_grid_thw"].shape[0] == (2 if tool_rows[i] else 1) for i in range(rb.n))
    hist = tr.train()
    assert tr.onpolicy.stats["passed"] == 1.0 and tr.onpolicy.stats["max_abs"] < 1e-4
    assert hist[-1]["reward/tools/tool_calls/mean"] == 0.75 and hist[-1]["train/grad_norm"] > 0


def test_multiturn_resume_is_bitwise(tmp_path, tiny_dir, forced, kit):
    straight = trainer(kit.cfg(tmp_path / "a", tiny_dir), forced, kit)
    straight.train()
    first = trainer(kit.cfg(tmp_path / "b", tiny_dir, "run.max_steps=1"), forced, kit)
    first.train()
    resumed = trainer(kit.cfg(tmp_path / "b", tiny_dir, "run.resume_from=auto"), forced, kit)
    resumed.train()
    assert resumed.state.step == 2
    a, b = straight.policy.trainable_state_dict(), resumed.policy.trainable_state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_validation_decodes_through_the_tool_loop(tmp_path, tiny_dir, forced, kit):
    import json

    rows = []
    for i, s in enumerate(kit.samples(2)):
        s["image"].save(tmp_path / f"v{i}.png")
        rows.append({**s, "id": f"v{i}", "image": f"v{i}.png"})
    (tmp_path / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = kit.cfg(tmp_path, tiny_dir, f"validation.file={tmp_path / 'val.jsonl'}", "validation.every=1",
                f"data.media_root={tmp_path}")
    tr = GRPOTrainer(c, samples=kit.samples(3), reward_fn=kit.reward)
    seen = []

    class Spy:  # records what validation asks the backend for: greedy, through the tool loop
        def __init__(self, inner):
            self.inner = inner

        def generate(self, prompts, g, params, seeds=None, raw_prompts=None):
            seen.append(params.greedy)
            return self.inner.generate(prompts, g, params, seeds=seeds, raw_prompts=raw_prompts)

    tr.backend.inner = Spy(tr.backend.inner)
    texts, _ = tr.validator.decode(tr.task, tr.policy, tr.backend, tr.generation_context)
    assert len(texts) == 2 and seen and all(seen)


def test_vllm_backend_with_tools_in_the_trainer(tmp_path, tiny_dir, forced, kit):
    """rollout.backend=vllm over the fake engine (tests/models/test_vllm_backend.py): later turns go to the engine
    as the whole conversation with the crop among its images; the IS weights and the loss cover policy tokens only.
    The engine's log-probs are made up, so the step-0 check is off (as in tests/trainer/test_vllm_trainer.py)."""
    import importlib.util
    import pathlib

    from mmgrpo.vlm.models.vllm_backend import LocalEngine, VLLMRolloutBackend
    from mmgrpo.vlm.tools.rollout import MultiTurnBackend
    from mmgrpo.vlm.data.batch import micro_batches

    path = pathlib.Path(__file__).parents[1] / "models" / "test_vllm_backend.py"
    spec = importlib.util.spec_from_file_location("_vllm_fakes_tools", path)
    f = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(f)
    c = kit.cfg(tmp_path, tiny_dir, "rollout.backend=vllm", "rollout.vllm_is_cap=2.0", "rollout.onpolicy_check=false")
    tr = GRPOTrainer(c, samples=kit.samples(3), reward_fn=kit.reward, backend=object())  # the engine: set below
    llm = f.FakeLLM(eos=tr.tok.convert_tokens_to_ids("<|im_end|>"), vocab=(40, 41, 42, 43))
    vllm = VLLMRolloutBackend(LocalEngine(llm, f.FakeSamplingParams), tr.tok, check_prompts=False)
    tr.backend = MultiTurnBackend(forced(vllm, tr.policy, FIRST), tr.policy.processor, c.tools, tr.policy.family)
    tr.state.stream = tr.new_stream()
    rb = steps.collect(tr, 0)
    (_, prompts, _), = [x for x in llm.calls if x[0] == "generate"]  # one engine call: the second turns
    assert len(prompts) == 6 and sorted(len(p["multi_modal_data"]["image"]) for p in prompts) == [1, 1] + [2] * 4
    steps.precompute(tr, rb, micro_batches(rb.group_ids, c.run.micro_batch_size))
    tool_tok = (rb.completion_mask > 0) & (rb.loss_mask == 0)
    assert tool_tok.any() and bool((rb.token_weights[tool_tok] == 1).all())  # no IS weight on tool turns
    assert tr.train(steps=1)[-1]["train/grad_norm"] > 0
