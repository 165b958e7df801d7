"""scripts/demo_judge.py: the arms' trainer settings and the row's 2-SE screen, by hand (no model is built)."""
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import demo_judge  # noqa: E402


def test_arms_differ_only_in_the_reward(tmp_path):
    v, j, r = (demo_judge.arm_reward(a, tmp_path) for a in demo_judge.ARMS)
    assert json.loads(v["reward.weights"]) == {"mmgrpo.synthetic.caption:verifier_reward": 1.0}
    assert j["reward.weights"] == r["reward.weights"] == "{judge: 1.0}"
    kj, kr = json.loads(j["reward.kwargs"])["judge"], json.loads(r["reward.kwargs"])["judge"]
    assert kj.pop("model") == str(tmp_path / "judge") and kr.pop("model") == str(tmp_path / "judge_random")
    assert kj == kr == demo_judge.JUDGE_KW


def test_report_screen_by_hand(tmp_path):
    (tmp_path / "build_report.json").write_text(json.dumps({"base_val_accuracy": 25.0}))
    acc = {"verifier": [50.0, 52.0, 54.0], "judge": [49.0, 51.0, 53.0], "judge_random": [25.0, 26.0, 27.0]}
    for arm, xs in acc.items():
        for seed, x in enumerate(xs):
            d = tmp_path / "runs" / "heldout" / arm / f"seed{seed}"
            d.mkdir(parents=True)
            (d / "result.json").write_text(json.dumps({"arm": arm, "seed": seed, "accuracy": x, "steps": 10}))

    class A:
        out, eval_split = str(tmp_path), "heldout"

    text = demo_judge.report(A)
    # judge: -1.0, SE = sqrt(4/3 + 4/3) = 1.633 -> 2 SE 3.3: within noise; random: -26.0, 2 SE 2.6 (s = 1 and 2)
    assert "| judge | 51.0 ± 2.0 (n=3) | -1.0 | no (2 SE 3.3) |" in text
    assert "| judge_random | 26.0 ± 1.0 (n=3) | -26.0 | **yes (worse)** (2 SE 2.6) |" in text
