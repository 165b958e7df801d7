"""scripts/demo_t2v.py: the report's numbers and direction probe come from the eval records as counted by hand."""
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]


def _demo():
    spec = importlib.util.spec_from_file_location("demo_t2v", ROOT / "scripts" / "demo_t2v.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ev(strict, partial, recs, per_check):
    return {"strict": strict, "partial": partial, "n": len(recs), "per_check": per_check,
            "samples": [{"asked": a, "drawn": d} for a, d in recs]}


def test_direction_table_and_report(tmp_path):
    d = _demo()
    before = _ev(0.25, 0.7, [("left", "right"), ("left", "left"), ("up", "none"), ("up", "up")],
                 {"color": 1.0, "direction": 0.5})
    after = _ev(0.5, 0.9, [("left", "left"), ("left", "left"), ("up", "up"), ("up", "up")],
                {"color": 1.0, "direction": 1.0})
    assert d.direction_table(before) == {"left": {"right": 1, "left": 1}, "up": {"none": 1, "up": 1}}
    args = SimpleNamespace(seed=3, base="B", eval_split="heldout", epochs=5, groups=4, group_size=8, lr=1e-3,
                           reward_mode="partial", grpo=[], smoke=False, per_prompt=2)
    res = d.report(tmp_path, args, {"tags": ["motion"], "num_frames": 5, "size": 32}, before, after,
                   {"grpo": 1.0}, 2.0)
    assert abs(res["strict_delta"] - 25.0) < 1e-9 and res["met"] is True  # +25 points >= +15
    assert json.loads((tmp_path / "report.json").read_text())["direction_after"] == {"left": {"left": 2},
                                                                                    "up": {"up": 2}}
    md = (tmp_path / "report.md").read_text()
    assert "| left | 1 -> 2 | 1 -> 0 |" in md and "+25.0 (target +15: met)" in md
    assert "| check `direction` passed (%) | 50.0 | 100.0 | +50.0 |" in md
    res = d.report(tmp_path, args, {}, after, before, {}, 1.0)
    assert res["met"] is False and "NOT met" in (tmp_path / "report.md").read_text()
