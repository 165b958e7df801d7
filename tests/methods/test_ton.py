"""TON: the think / skip classification and its format reward on hand-written completions, the per-mode statistics
by hand, and the trainer logging them (a base that never thinks: think ratio 0)."""
import pytest
import torch

from mmgrpo.vlm.methods.ton import mode_stats, thought_mode, ton_format
from mmgrpo.vlm.train.trainer import GRPOTrainer


@pytest.mark.parametrize("text,mode,fmt", [
    ("<think>the ball moves at 3 s</think><answer>3 to 5</answer>", "think", 1.0),
    ("<think>\n\n</think><answer>3 to 5</answer>", "skip", 1.0),
    ("<think></think> <answer>3 to 5</answer>", "skip", 1.0),
    ("<answer>3 to 5</answer>", "skip", 1.0),
    ("3 to 5", "skip", 0.0),
    ("<think>x</think>", "think", 0.0),
    ("<answer>3 to 5</answer><think>late</think>", "think", 0.0),
    ("<think>a</think><answer><answer>1</answer>", "think", 0.0),
])
def test_mode_and_format(text, mode, fmt):
    assert thought_mode(text) == mode
    assert ton_format(text) == fmt


def test_direct_answer_is_malformed_without_direct_is_skip():
    assert ton_format("<answer>3 to 5</answer>", direct_is_skip=False) == 0.0
    assert ton_format("<think> </think><answer>3 to 5</answer>", direct_is_skip=False) == 1.0


def test_mode_stats_by_hand():
    m = mode_stats(["think", "skip", "think", "skip"], torch.tensor([10, 2, 20, 4]), torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert m == {"ton/think_ratio": 0.5, "ton/length_think": 15.0, "ton/acc_think": 0.5, "ton/length_skip": 3.0,
                 "ton/acc_skip": 0.5}
    assert mode_stats(["skip"], torch.tensor([3]), torch.tensor([1.0]))["ton/length_think"] == -1.0


def test_trainer_logs_the_split_and_adds_the_format(tmp_path, tiny_dirs, th):
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "reward.accuracy_key=acc",
                      "methods.ton.enabled=true", "methods.ton.format_weight=0.25", "methods.ton.threshold=0.5")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    hist = tr.train()
    rb = tr.state.batch
    fmt = torch.tensor([ton_format(t) for t in rb.texts])
    torch.testing.assert_close(rb.rewards["total"], rb.rewards["acc"] + 0.25 * fmt)
    modes = [thought_mode(t) for t in rb.texts]
    want = mode_stats(modes, rb.completion_mask.sum(1), (rb.rewards["acc"] >= 0.5).float())
    for k, v in want.items():
        assert hist[-1][k] == pytest.approx(v)
