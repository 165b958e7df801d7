"""Golden tiny runs of every flow preset, recorded once from the pre-refactor trainer (issue 15) and replayed by
test_golden_presets.py: per-epoch losses / rewards / advantage statistics and a checksum of the trained LoRA.

Regenerate (only when a behaviour change is intended and explained):
    python -m tests.flow_grpo._golden_runs  (writes tests/flow_grpo/fixtures/golden_presets.json)"""
import json
import math
from pathlib import Path

import torch

FIXTURE = Path(__file__).parent / "fixtures" / "golden_presets.json"

# (case name, preset, extra overrides); win_rate and per_reward are reward modes on top of a preset
CASES = [
    ("flow", "flow", {"optim.kl_coef": 0.01}),
    ("dance", "dance", {}),
    ("fast", "fast", {}),
    ("mix", "mix", {"sample.window_shift_every": 1}),
    ("mix_flash", "mix_flash", {"sample.window_shift_every": 1}),
    ("tp_grpo", "tp_grpo", {}),
    ("g2rpo", "g2rpo", {}),
    ("win_rate", "fast", {"reward.mode": "win_rate"}),
    ("per_reward", "flow", {"reward.mode": "per_reward", "reward.weights": "{block: 1.0, brightness: 2.0}"}),
]
PREFIXES = ("reward/", "adv/", "train/", "ratio/", "step_reward/", "tp/", "steps/")
KEYS = ("grad_norm", "nfe_per_trajectory", "actual_batch_size", "lr")


def _recorded(m: dict) -> dict:
    return {k: float(v) for k, v in m.items() if isinstance(v, (int, float)) and not k.startswith("reward/calls")
            and (k in KEYS or k.startswith(PREFIXES))}


def lora_checksum(named_params, before: dict) -> list[float]:
    """Three float64 sums of the trained change (p - p_initial) over the trainable tensors (in name order): sum, sum
    of squares, and a position-weighted sum (so a permutation or sign error shows)."""
    s = s2 = sw = 0.0
    for n, p in sorted(named_params, key=lambda t: t[0]):
        x = (p.detach().double() - before[n]).reshape(-1)
        w = torch.arange(1, x.numel() + 1, dtype=torch.float64) / x.numel()
        s += float(x.sum())
        s2 += float((x * x).sum())
        sw += float((x * w).sum())
    return [s, s2, sw]


def run_case(name: str, preset: str, extra: dict, out) -> dict:
    from .conftest import block_reward, brightness_reward, make_trainer

    ov = {"run.num_epochs": 2, "data.group_size": 3, "sample.batch_size": 3, **extra}
    rewards = {"block": block_reward}
    if "per_reward" in name:
        rewards = {"block": block_reward, "brightness": brightness_reward}
    tr = make_trainer("sd3", preset, out, rewards=rewards, **ov)
    before = {n: p.detach().double().clone() for n, p in tr.named_params}
    losses: list[float] = []
    backward = tr.accelerator.backward

    def record(loss, **kw):  # every micro-batch loss, in order (the trainer logs no loss of its own)
        losses.append(float(loss.detach()))
        return backward(loss, **kw)

    tr.accelerator.backward = record
    import flow_grpo.train.trainer as T

    metrics_of = T.epoch_metrics

    def epoch_metrics(*a, **k):  # once per epoch, after its updates: the epoch's loss sum joins its metrics
        m = metrics_of(*a, **k)
        m["train/loss_sum"] = sum(losses)
        losses.clear()
        return m

    T.epoch_metrics = epoch_metrics
    try:
        hist = tr.train()
        return {"epochs": [_recorded(h) for h in hist], "lora": lora_checksum(tr.named_params, before)}
    finally:
        T.epoch_metrics = metrics_of
        tr.close()


def main() -> None:
    import tempfile

    torch.set_num_threads(1)
    res = {}
    for name, preset, extra in CASES:
        with tempfile.TemporaryDirectory() as d:
            res[name] = run_case(name, preset, extra, Path(d) / name)
        print(name, res[name]["epochs"][-1].get("train/loss"), res[name]["lora"])
    FIXTURE.write_text(json.dumps(res, indent=1, sort_keys=True, allow_nan=True) + "\n")


def rel_close(a: float, b: float, rel: float = 1e-6) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


if __name__ == "__main__":
    main()
