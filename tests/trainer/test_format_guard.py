"""The format-collapse guard (``format_guard.*``, ``mmgrpo.vlm.monitor.format_guard``) on the real trainer loop.

The policy's rollouts are scripted (an injected rollout backend, the only fake part): answers well formed for the
first steps, then the issue #41 collapse (the answer, then ``.00`` repeated until the token cap, no EOS) on a
growing share of the rows. The reward is the project's IoU reward read by the lenient parser, which pays the
collapsed answers as much as the clean ones: nothing but the guard notices."""
import logging

import pytest
import torch

from mmgrpo.engine.errors import TrainingStopped
from mmgrpo.vlm.models.rollout import RolloutBackend, RolloutOutput
from mmgrpo.vlm.train.trainer import GRPOTrainer

ANSWERS = {"tvg": "<answer>0.50 to 1.50</answer>", "mcq": "<answer>B</answer>", "rec": "<answer>[4, 6, 40, 50]</answer>"}


class DriftingPolicy(RolloutBackend):
    """Call k (one per training step) returns the task's clean answer on every row for k <= clean_steps; after that,
    on the first ``bad_share`` of each group's rows, the answer without its closing tag and with ".00" appended until
    ``max_new_tokens`` (no EOS: truncated), as in issue #41. Token ids are the tokenizer's, so the loss trains on what the texts say."""

    def __init__(self, tok, answer: str, clean_steps: int, bad_share: float = 1.0, garbage: str = ".00"):
        self.tok, self.answer, self.clean_steps, self.bad_share, self.garbage = tok, answer, clean_steps, bad_share, garbage
        self.calls = 0

    def generate(self, prompts, num_generations, params, seeds=None, raw_prompts=None):
        self.calls += 1
        G, cap = int(num_generations), params.max_new_tokens
        eos = self.tok.convert_tokens_to_ids("<|im_end|>")
        rows, trunc = [], []
        for _ in prompts:
            for g in range(G):
                bad = self.calls > self.clean_steps and g < round(self.bad_share * G)
                text = self.answer.removesuffix("</answer>") + self.garbage * cap if bad else self.answer
                ids = self.tok(text, add_special_tokens=False).input_ids
                ids = ids[:cap] if bad else ids + [eos]
                assert len(ids) <= cap, "raise rollout.max_new_tokens: the clean answer must fit"
                rows.append(ids)
                trunc.append(bad)
        T = max(map(len, rows))
        pad = self.tok.pad_token_id
        ids = torch.tensor([r + [pad] * (T - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
        texts = self.tok.batch_decode(ids.masked_fill(mask == 0, pad), skip_special_tokens=True)
        return RolloutOutput(ids, mask, texts, torch.tensor(trunc), None,
                             torch.arange(len(prompts)).repeat_interleave(G))


def rec_samples(n, size=56):
    from mmgrpo.vlm.models.tiny import synthetic_image

    return [{"id": f"r{i}", "task": "rec", "query": "the square", "image": synthetic_image(i, size, size),
             "image_size": [size, size], "boxes": [[4.0, 6.0, 40.0, 50.0]]} for i in range(n)]


def _run(tmp_path, tiny_dirs, th, task="tvg", *overrides, clean_steps=3, bad_share=1.0, steps=8):
    samples = {"tvg": th.video_samples, "mcq": th.image_samples, "rec": rec_samples}[task](2)
    weights = {"tvg": "{iou: 1.0}", "mcq": "{mcq: 1.0}", "rec": "{box_iou: 1.0}"}[task]
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), f"data.task={task}", f"reward.weights={weights}",
                      "rollout.max_new_tokens=40", f"run.max_steps={steps}", "format_guard.window=2",
                      "run.allow_no_reward_signal=true", *overrides)  # equal rewards: the guard, not learning
    tr = GRPOTrainer(cfg, samples=samples)  # the registry's reward (lenient parser), the real loop
    tr.backend = DriftingPolicy(tr.tok, ANSWERS[task], clean_steps, bad_share)
    return tr


def _rows(tr):
    import json

    return [json.loads(x) for x in (tr.run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


@pytest.mark.parametrize("task", ["tvg", "mcq", "rec"])
def test_stop_on_format_collapse(tmp_path, tiny_dirs, th, task):
    """action=stop: clean for 3 steps, collapsed from step 4: the 2-step window's mean (1 + 0) / 2 falls below 0.8 at
    step 4, the run writes a checkpoint and stops there (exit code 3 from the CLI). Without the guard it would train
    all 8 steps: the reward does not see the garbage."""
    tr = _run(tmp_path, tiny_dirs, th, task, "format_guard.action=stop")
    with pytest.raises(TrainingStopped, match=r"format collapse at step 4: only 50 % of the completions are well "
                                              r"formed.*and 50 % ran to the 40-token cap") as e:
        tr.train()
    assert e.value.checkpoint and "step-00000004" in e.value.checkpoint
    rows = _rows(tr)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["completions/well_formed"] for r in rows] == [1.0, 1.0, 1.0, 0.0]
    assert [r["completions/clipped_ratio"] for r in rows] == [0.0, 0.0, 0.0, 1.0]
    assert [r["guard/format_alarm"] for r in rows] == [0.0, 0.0, 0.0, 1.0]  # step 1: window not full yet
    assert rows[3]["completions/mean_length"] == rows[3]["completions/max_length"] == 40.0
    if task == "tvg":  # the issue's blind spot: the lenient IoU of the collapsed answers equals the clean ones'
        assert rows[3]["reward/iou/mean"] == pytest.approx(rows[2]["reward/iou/mean"])


def test_warn_once_and_keep_training(tmp_path, tiny_dirs, th, caplog):
    """action=warn (the default): one warning naming the share, the cap and a malformed example when the window
    crosses, none while it stays bad, a notice when it recovers; the run trains every step."""
    tr = _run(tmp_path, tiny_dirs, th, "tvg", clean_steps=2, steps=6)
    with caplog.at_level(logging.INFO, logger="mmgrpo.train"):
        tr.train()
    warns = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "format collapse" in r.message]
    assert len(warns) == 1 and "at step 3" in warns[0] and "'0.50 to 1.50.00.00" in warns[0].replace("<answer>", "")
    rows = _rows(tr)
    assert [r["step"] for r in rows] == list(range(1, 7))
    assert [r["guard/format_alarm"] for r in rows[1:]] == [0.0, 1.0, 1.0, 1.0, 1.0]


def test_a_minority_of_garbage_and_off(tmp_path, tiny_dirs, th):
    """A quarter of malformed rows stays above min_well_formed 0.5 (no alarm, only the metrics); action=off logs the
    metrics and never alarms, whatever the share."""
    tr = _run(tmp_path, tiny_dirs, th, "tvg", "format_guard.min_well_formed=0.5", "format_guard.max_at_cap=0.5",
              "format_guard.action=stop", bad_share=0.25, steps=5)
    tr.train()
    rows = _rows(tr)
    assert [r["completions/well_formed"] for r in rows] == [1.0, 1.0, 1.0, 0.75, 0.75]
    assert all(r["guard/format_alarm"] == 0.0 for r in rows[1:])
    tr = _run(tmp_path / "off", tiny_dirs, th, "tvg", "format_guard.action=off", steps=5)
    tr.train()
    rows = _rows(tr)
    assert rows[-1]["completions/well_formed"] == 0.0 and not any("guard/format_alarm" in r for r in rows)


def test_progress_bar_and_config_checks():
    from mmgrpo.utils.config import apply_overrides
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.vlm.monitor.format_guard import progress_fields

    assert progress_fields({"reward/total/mean": 0.25, "completions/well_formed": 0.5, "completions/mean_length": 9.25,
                            "completions/clipped_ratio": 0.125}) == {"reward": "0.250", "wf": "50%", "len": "9.2",
                                                                     "cap": "12%"}
    for bad in ("format_guard.min_well_formed=1.5", "format_guard.max_at_cap=-0.1", "format_guard.window=0"):
        with pytest.raises(ValueError, match="format_guard"):
            apply_overrides(TrainConfig(), [bad])
    with pytest.raises(ValueError):
        apply_overrides(TrainConfig(), ["format_guard.action=halt"])
