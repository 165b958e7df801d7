"""TON's comparison on the think-or-not task, end to end at smoke size: both smoke bases (random weights, 3 SFT
steps, thought dropout 0 and 0.5), their evaluation per kind and forced mode, GRPO and TON through GRPOTrainer for
a budget of 1 CPU second each, the evaluation after, results.json / results.md."""
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.extended  # end to end: two base builds and two arms through the trainer (the parts have default tests)
def test_compare_ton_smoke(tmp_path):
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "scripts"))
    from scripts import compare_ton

    assert compare_ton.main(["--out", str(tmp_path), "--smoke", "--seeds", "0", "--budget", "1"]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    rep = json.loads((tmp_path / "bases" / "dropout" / "base_report.json").read_text())
    assert rep["args"]["dropout"] == 0.5 and rep["args"]["smoke"]
    assert set(res["before"]) == {"think", "dropout"}
    assert sorted(r["arm"] for r in res["runs"]) == ["grpo", "ton"]
    for r in res["runs"]:
        assert {"acc", "think_ratio", "think_tokens", "acc_forced_think", "acc_forced_skip"} <= set(r["after"]["partner"])
    cmd = {a: (tmp_path / a / "seed0" / "command.txt").read_text() for a in ("grpo", "ton")}
    assert "methods.ton.format_weight=0 " in cmd["grpo"] and "methods.ton.format_weight=0.1 " in cmd["ton"]
    assert "bases/think " in cmd["grpo"] + " " and "bases/dropout" in cmd["ton"]
    assert "| ton |" in (tmp_path / "results.md").read_text()
