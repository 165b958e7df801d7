"""Open rewards in the tiny trainer (unit tests: tests/rewards/test_open_rewards.py)."""
import torch

import pytest

USER_MODULE = '''
def make(scale=1.0):
    def reward(completions, samples):
        return [scale * len(c) for c in completions]
    return reward
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_h38t.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards_h38t"


def test_tiny_trainer_with_a_user_reward_and_the_judge(tmp_path, tiny_dirs, th, user_module):
    """The judge runs the tiny Qwen2.5-VL folder text-only (random weights: its replies rarely parse; failures are
    counted, never raised), next to a user reward by import path."""
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    d = tiny_dirs("qwen2_5_vl")
    cfg = th.make_cfg(tmp_path, d, "run.max_steps=1", "data.task=mcq",
                      f"reward.weights={{judge: 1.0, '{user_module}:make': 1.0}}",
                      f"reward.kwargs={{judge: {{model: '{d}', max_new_tokens: 4, batch_size: 3}}, "
                      f"'{user_module}:make': {{scale: 0.01}}}}")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2))
    judge = tr.reward_fn.open["judge"]
    r0, f0 = judge.replies, judge.parse_failures  # the start-of-run check scored the ground truths
    hist = tr.train()
    rb = tr.state.batch
    lens = torch.tensor([0.01 * len(t) for t in rb.texts])
    torch.testing.assert_close(rb.rewards[f"{user_module}:make"], lens)
    torch.testing.assert_close(rb.rewards["total"], rb.rewards["judge"] + lens)
    assert judge.replies - r0 == rb.n and judge.parse_failures - f0 == int(rb.rewards["judge/parse_failed"].sum())
    assert "reward/judge/parse_failed/mean" in hist[-1]
