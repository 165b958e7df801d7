"""Multi-turn tool rollouts inside the GRPO trainer (tiny Qwen2.5-VL, HF backend): rows carry their tool media and a
loss mask over policy tokens, the step-0 on-policy check passes over both turns, tool counts are logged, and a
resumed run ends on the same weights bit for bit."""
import torch

from mmgrpo.utils.config import load_config
from mmgrpo.vlm.config import TrainConfig
from mmgrpo.vlm.models.tiny import synthetic_image
from mmgrpo.vlm.train import steps
from mmgrpo.vlm.train.prompts import make_stream
from mmgrpo.vlm.train.trainer import GRPOTrainer

CALL = '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [0, 0, 28, 28]}}</tool_call>'
FIRST = [CALL, "<answer>B</answer>", "look " + CALL, '<tool_call>{"name": "crop"}</tool_call>']


def samples(n):
    return [{"id": f"i{i}", "task": "mcq", "query": "which colour?", "image": synthetic_image(i, 56, 56),
             "options": ["red", "green", "blue"], "answer": "B"} for i in range(n)]


def reward(texts, samples):
    acc = torch.tensor([float(sum(map(ord, t)) % 7) / 6.0 for t in texts])
    return {"acc": acc, "total": acc.clone(), "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}


def cfg(tmp_path, model_dir, *over):
    base = [f"model.path={model_dir}", "model.dtype=float32", "data.task=mcq", "data.prompt_mode=no_think",
            "data.image_min_pixels=3136", "data.image_max_pixels=3136", "rollout.group_size=4",
            "rollout.max_new_tokens=6", "run.max_steps=2", "run.prompts_per_device=2", "run.micro_batch_size=8",
            "optim.lr=0.01", "optim.weight_decay=0", "optim.max_grad_norm=0", f"run.output_dir={tmp_path / 'run'}",
            "run.tensorboard=false", "run.save_every=0", "run.resume_from=none", "tools.enabled=true",
            "tools.names=[crop]", "tools.max_turns=2", "tools.max_total_tokens=200", "tools.crop_pixels=3136"]
    return load_config(TrainConfig, None, base + list(over))


def trainer(c, forced):
    tr = GRPOTrainer(c, samples=samples(3), reward_fn=reward)
    tr.backend.inner = forced(tr.backend.inner, tr.policy, FIRST)
    return tr


def test_multiturn_step_masks_tool_turns_and_trains(tmp_path, tiny_dir, forced):
    tr = trainer(cfg(tmp_path, tiny_dir, "algo.kl_coef=0.05"), forced)
    assert tr.logprob_impl == "naive"  # rows of a group have their own items
    tr.state.stream = make_stream(tr)
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
    assert tr.onpolicy_stats["passed"] == 1.0 and tr.onpolicy_stats["max_abs"] < 1e-4
    assert hist[-1]["reward/tools/tool_calls/mean"] == 0.75 and hist[-1]["train/grad_norm"] > 0


def test_multiturn_resume_is_bitwise(tmp_path, tiny_dir, forced):
    straight = trainer(cfg(tmp_path / "a", tiny_dir), forced)
    straight.train()
    first = trainer(cfg(tmp_path / "b", tiny_dir, "run.max_steps=1"), forced)
    first.train()
    resumed = trainer(cfg(tmp_path / "b", tiny_dir, "run.resume_from=auto"), forced)
    resumed.train()
    assert resumed.state.step == 2
    a, b = straight.policy.trainable_state_dict(), resumed.policy.trainable_state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
