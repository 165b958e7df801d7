"""Method-comparison driver: statistics by hand, and every method's command is built (dry run)."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))


def test_summary_and_seed_noise_by_hand():
    import compare_methods as cm

    s = cm.summarize([40.0, 42.0, None, 44.0])
    assert s == {"mean": 42.0, "std": 2.0, "n": 3}
    ref = cm.summarize([30.0, 32.0, 34.0])  # mean 32, std 2 -> se of the difference sqrt(4/3 + 4/3) = 1.633
    assert cm.beyond_noise(s, ref) is True          # 10 > 2 * 1.633
    close = cm.summarize([33.0, 35.0, 37.0])        # 3 < 3.266
    assert cm.beyond_noise(close, ref) is False
    assert cm.beyond_noise(cm.summarize([50.0]), ref) is None  # one seed: undefined


def test_vlm_dry_run_lists_every_method_with_the_budget(tmp_path):
    import compare_methods as cm

    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "compare_methods.py"), "vlm", "--dry-run",
                           "--seeds", "0,1", "--budget", "7", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    cmds = (tmp_path / "commands.sh").read_text().splitlines()
    train = [c for c in cmds if "mmgrpo.cli train" in c]
    assert len(train) == 2 * len(cm.VLM_METHODS)
    assert all("run.max_train_seconds=7.0" in c and "run.budget_clock=cpu" in c for c in train)
    assert sum("tempsamp.enabled=true" in c for c in train) == 2  # only the TempSamp-R1 runs, not the demo's
    for name, overrides in cm.VLM_METHODS.items():
        assert sum(f"/{name}/seed1/run" in c for c in train) == 1
        for o in overrides:
            assert any(o in c and f"/{name}/" in c for c in train), (name, o)


def test_smooth_is_a_trailing_mean():
    import compare_methods as cm

    assert cm.smooth([(1, 0.0), (2, 1.0), (3, 2.0), (4, 3.0)], window=2) == [(1, 0.0), (2, 0.5), (3, 1.5), (4, 2.5)]


def test_flow_method_command_strips_only_its_own_preset_keys():
    """A preset key (e.g. nft's sample.cfg) is taken out of the shared demo command only for that preset's runs:
    the other methods keep the demo's value (with one global strip, adding the nft row turned CFG on for all)."""
    import compare_methods as cm
    from flow_grpo.config import METHOD_PRESETS, load_train_config

    s = {"train_cmd": ["python", "train", "sample.cfg=false", "sample.guidance_scale=1.0", "optim.adv_scale=group",
                       "optim.lr=1e-3"],
         "preset_keys": {k: set(v) for k, v in METHOD_PRESETS.items()}}
    fast = cm.method_cmd(s, ["method=fast"])
    assert "sample.cfg=false" in fast and "optim.adv_scale=group" not in fast and "optim.lr=1e-3" in fast
    nft = cm.method_cmd(s, ["method=nft"])
    assert "sample.cfg=false" not in nft and "optim.lr=1e-3" in nft
    for name in ("vgpo", "nft", "branch_grpo", "b2_diffurl"):  # the new rows parse into valid configs
        load_train_config(None, [o for o in cm.FLOW_METHODS[name]])
