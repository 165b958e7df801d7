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
    judge = tr.scorer.reward_fn.open["judge"]
    r0, f0 = judge.replies, judge.parse_failures  # the start-of-run check scored the ground truths
    hist = tr.train()
    rb = tr.state.batch
    lens = torch.tensor([0.01 * len(t) for t in rb.texts])
    torch.testing.assert_close(rb.rewards[f"{user_module}:make"], lens)
    torch.testing.assert_close(rb.rewards["total"], rb.rewards["judge"] + lens)
    assert judge.replies - r0 == rb.n and judge.parse_failures - f0 == int(rb.rewards["judge/parse_failed"].sum())
    assert "reward/judge/parse_failed/mean" in hist[-1]


def test_tiny_trainer_with_the_remote_reward(tmp_path, tiny_dirs, th):
    """``reward.weights={remote: 1}``: the step's rewards are those the text-reward server computes on the step's
    completions (a length reward behind mmgrpo.vlm.rewards.server on 127.0.0.1), its diagnostics logged."""
    import threading

    from mmgrpo.vlm.rewards.server import make_text_server
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    def served(completions, samples):
        return {"score": [0.01 * len(c or "") for c in completions], "short": [float(len(c or "") < 5)
                                                                               for c in completions]}

    srv = make_text_server(served, "len", "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        d = tiny_dirs("qwen2_5_vl")
        url = f"http://127.0.0.1:{srv.server_address[1]}/score"
        cfg = th.make_cfg(tmp_path, d, "run.max_steps=1", "data.task=mcq", "reward.weights={remote: 1.0}",
                          f"reward.kwargs={{remote: {{url: '{url}', timeout: 30}}}}")
        tr = GRPOTrainer(cfg, samples=th.image_samples(2))
        hist = tr.train()
        rb = tr.state.batch
        torch.testing.assert_close(rb.rewards["remote"], torch.tensor([0.01 * len(t) for t in rb.texts]))
        assert "reward/remote/short/mean" in hist[-1]
        assert srv.stats["scored_rows"] >= rb.n and not any(k.startswith("failed") for k in srv.stats)
    finally:
        srv.shutdown()
        srv.server_close()
