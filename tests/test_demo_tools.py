"""The look-again demo's pipeline, end to end at smoke size: a smoke base (random weights, 3 SFT steps), the data,
the premise probe, the base evaluation through the multi-turn engine, GRPO with and without the tool for 2 steps
each through GRPOTrainer, the evaluation after, metrics.json / report.md / the trajectory image."""
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # the one end-to-end check of the demo (base build, both GRPO conditions through the trainer)
def test_demo_tools_smoke(tmp_path):
    sys.path.insert(0, str(REPO))
    from scripts import build_look_again_base, demo_tools

    build_look_again_base.main(["--out", str(tmp_path / "base"), "--smoke"])
    assert demo_tools.main(["--out", str(tmp_path / "demo"), "--smoke", "--base", str(tmp_path / "base")]) == 0
    m = json.loads((tmp_path / "demo" / "metrics.json").read_text())
    assert m["probe"]["view_answer_free"] == 100.0 and m["probe"]["crop_oracle_acc"] == 100.0
    run = m["runs"]["0"] if "0" in m["runs"] else m["runs"][0]
    assert set(run) == {"tools", "plain"}
    for cond in ("tools", "plain"):
        assert {"tools", "plain", "no_image", "call_rate", "acc_called"} <= set(run[cond]["after"])
    assert "tools.enabled=true" in (tmp_path / "demo" / "seed0" / "tools" / "command.txt").read_text()
    assert "tools.enabled=false" in (tmp_path / "demo" / "seed0" / "plain" / "command.txt").read_text()
    assert (tmp_path / "demo" / "trajectories_seed0.png").stat().st_size > 0
    assert "Premise probe" in (tmp_path / "demo" / "report.md").read_text()
    # one report from per-seed folders (the seeds run side by side)
    assert demo_tools.main(["--out", str(tmp_path / "merged"), "--merge", str(tmp_path / "demo")]) == 0
    merged = json.loads((tmp_path / "merged" / "metrics.json").read_text())
    assert merged["runs"] == m["runs"] and merged["probe"] == m["probe"]
    assert (tmp_path / "merged" / "trajectories_seed0.png").exists()
