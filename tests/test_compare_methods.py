"""Method-comparison driver: statistics by hand, and every method's command is built (dry run)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

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
    train = [c for c in cmds if "mmgrpo.vlm.cli train" in c]
    assert len(train) == 2 * len(cm.method_recipes("vlm"))
    assert all("run.max_train_seconds=7.0" in c and "run.budget_clock=cpu" in c for c in train)
    assert not any("methods.tempsamp_r1.enabled" in c for c in train)  # the demo's TempSamp-R1 switch is left to the recipes
    for name, recipe in cm.method_recipes("vlm").items():
        assert sum(f"/{name}/seed1/run" in c for c in train) == 1
        assert all(f"train --config {recipe} " in c for c in train if f"/{name}/" in c)


def test_smooth_is_a_trailing_mean():
    import compare_methods as cm

    assert cm.smooth([(1, 0.0), (2, 1.0), (3, 2.0), (4, 3.0)], window=2) == [(1, 0.0), (2, 0.5), (3, 1.5), (4, 2.5)]


# The method switches as they were before they moved to configs/compare/*/<method>.yaml (appended after the demo's
# overrides): the recipes must resolve to the very same configs.
OLD_VLM_METHODS = {
    "grpo": [],
    "dr_grpo": ["algo.adv_scale=none", "algo.agg=seq_mean_token_sum_norm"],
    "dapo": ["algo.clip_high=0.28", "algo.filter_zero_std=true"],
    "tempsamp_r1": ["methods.tempsamp_r1.enabled=true"],
    "reg_grpo": ["algo.loss_type=reg"],
    "t_grpo": ["methods.t_grpo.enabled=true"],
    # added with their recipes (issue #21): no earlier list; the same check that recipe == switches
    "seed_grpo": ["methods.seed_grpo.enabled=true"],
    "dapo_overlong": ["methods.dapo_overlong.enabled=true"],
    "entropy_top20": ["methods.entropy.enabled=true", "methods.entropy.top_quantile=0.2"],
    "gdpo": ["methods.gdpo.enabled=true"],
    "difficulty_aug": ["methods.difficulty_aug.enabled=true"],
    "hybrid_cot": ["methods.hybrid_cot.enabled=true"],
    "ngrpo": ["methods.ngrpo.enabled=true", "methods.ngrpo.max_reward=1.1"],  # IoU + 0.1 format (issue #41)
    # issue #38: loss / ratio / KL variants (the ratio variants with two updates per rollout) and length control
    "grpo_mu2": ["algo.num_iterations=2"],
    "cispo": ["algo.num_iterations=2", "methods.cispo.enabled=true"],
    "sapo": ["algo.num_iterations=2", "methods.sapo.enabled=true"],
    "dhpo": ["algo.num_iterations=2", "methods.dhpo.enabled=true"],
    "dcpo": ["methods.dcpo.enabled=true"],
    "balanced_agg": ["methods.balanced_agg.enabled=true"],
    "bnpo": ["methods.bnpo.enabled=true", "methods.bnpo.max_reward=1.1"],
    "grpo_kl": ["algo.kl_coef=0.04"],
    "kl_schedule": ["algo.kl_coef=0.04", "methods.kl_schedule.enabled=true", "methods.kl_schedule.start=0.0",
                    "methods.kl_schedule.steps=60"],
    "grpo_lambda": ["methods.grpo_lambda.enabled=true", "methods.grpo_lambda.threshold=0.5"],
    "drpo": ["methods.drpo.enabled=true", "methods.drpo.threshold=0.5"],
    "ton": ["methods.ton.enabled=true", "methods.ton.format_weight=0.1", "methods.ton.threshold=0.5"],
    # issue #38: curricula and replay, SFT + RL hybrids
    "pass_rate_filter": ["methods.pass_rate_filter.enabled=true", "methods.pass_rate_filter.low=0.01",
                         "methods.pass_rate_filter.high=0.99", "methods.pass_rate_filter.correct_threshold=0.5",
                         "methods.pass_rate_filter.max_rounds=2"],
    "prompt_replay": ["methods.prompt_replay.enabled=true", "methods.prompt_replay.fraction=0.25",
                      "methods.prompt_replay.correct_threshold=0.5"],
    "sample_buffer": ["methods.sample_buffer.enabled=true"],
    "iou_curriculum": ["methods.iou_curriculum.enabled=true", "methods.iou_curriculum.thresholds=[0.3,0.5,0.7]",
                       "methods.iou_curriculum.mode=binary", "methods.iou_curriculum.window=5",
                       "methods.iou_curriculum.advance_at=0.6"],
    "luffy": ["methods.luffy.enabled=true", "methods.luffy.gamma=0.1"],
    "chord": ["methods.chord.enabled=true", "methods.chord.mu_peak=0.5", "methods.chord.mu_valley=0.05",
              "methods.chord.warmup_steps=0", "methods.chord.decay_steps=60"],
    "relift": ["methods.relift.enabled=true", "methods.relift.hard_threshold=0.0",
               "methods.relift.correct_threshold=0.5", "methods.relift.sft_batch=2", "methods.relift.sft_coef=0.5"],
}
OLD_FLOW_METHODS = {
    "flow_grpo_sde": ["method=flow"],
    "flow_grpo_cps": ["method=flow", "sample.sde_kind=cps", "sample.noise_level=0.8"],
    "dance_grpo": ["method=dance"],
    "dance_best_of_n": ["method=dance", "optim.best_of_n=4"],
    "fast_window": ["method=fast"],
    "mix_window": ["method=mix"],
    "mix_flash": ["method=mix_flash"],
    "tp_grpo": ["method=tp_grpo"],
    "g2rpo": ["method=g2rpo"],
    # added with their recipes (issue 20): the same check that recipe and override list agree
    "vgpo": ["method=vgpo"],
    "nft": ["method=nft"],
    "branch_grpo": ["method=branch_grpo", "methods.branch_grpo.split_points=[0,3,6]"],
    "b2_diffurl": ["method=b2", "methods.b2_diffurl.split_left=3", "methods.b2_diffurl.split_right=10", "methods.b2_diffurl.num_stages=8",
                   "methods.b2_diffurl.epochs_per_stage=4"],
    "adv_grpo": ["method=adv_grpo", "reward.weights={mini_geneval: 1.0, adv_dino: 1.0}",
                 "reward.kwargs={mini_geneval: {mode: partial}, adv_dino: {tiny: true}}",
                 "methods.adv_grpo.schedule=interleave", "methods.adv_grpo.every=1", "methods.adv_grpo.lr=1e-3",
                 "methods.adv_grpo.steps=5"],
    "pref_grpo": ["method=flow", "reward.mode=win_rate", "reward.win_rate_weight=1.0", "reward.pointwise_weight=0.0"],
}


def _train_argv(frontend, tmp_path):
    """{method: argv after 'train'} of every training command of a dry run (one seed)."""
    import shlex

    subprocess.run([sys.executable, str(REPO / "scripts" / "compare_methods.py"), frontend, "--dry-run", "--seeds",
                    "0", "--budget", "7", "--out", str(tmp_path)], check=True, capture_output=True, timeout=120,
                   cwd=REPO)
    out = {}
    for line in (tmp_path / "commands.sh").read_text().splitlines():
        argv = shlex.split(line)
        if "train" in argv and ("mmgrpo.vlm.cli" in argv or "flow_grpo.cli" in argv):
            name = next(a for a in argv if a.startswith("run.output_dir=")).split("/")[-3]
            out[name] = argv[argv.index("train") + 1:]
    return out


@pytest.mark.parametrize("frontend", ["vlm", "flow"])
def test_recipes_resolve_to_the_configs_of_the_old_override_lists(frontend, tmp_path, monkeypatch):
    """Config values (dataclass equality) of each method's training command: recipe (``--config``) versus the old
    override list appended to the demo's overrides."""
    import compare_methods as cm

    from flow_grpo.config import load_train_config
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.utils.config import load_config

    old = {"vlm": OLD_VLM_METHODS, "flow": OLD_FLOW_METHODS}[frontend]
    load = (lambda y, ov: load_config(TrainConfig, y, ov)) if frontend == "vlm" else load_train_config
    monkeypatch.chdir(REPO)  # recipe paths are relative to the repository, as the commands run there
    argvs = _train_argv(frontend, tmp_path)
    assert set(argvs) == set(old) == set(cm.method_recipes(frontend))
    assert list(cm.method_recipes(frontend))[0] == list(old)[0]  # the reference stays first
    for name, argv in argvs.items():
        assert argv[0] == "--config"
        recipe, overrides = argv[1], argv[2:]
        assert not set(old[name]) & set(overrides)
        new_cfg = load(recipe, overrides)
        old_cfg = load(None, overrides + old[name])
        assert new_cfg == old_cfg, name
    assert len({repr(load(argv[1], argv[2:])) for argv in argvs.values()}) == len(argvs)  # all methods differ


def test_flow_method_command_strips_only_its_own_preset_keys(tmp_path, monkeypatch):
    """A preset key (nft's sample.cfg) leaves the shared demo command only for that preset's runs: the other methods
    keep the demo's value (one global strip turned CFG on for every method once the nft preset existed)."""
    argvs = _train_argv("flow", tmp_path)
    assert "sample.cfg=false" in argvs["fast_window"] and "sample.cfg=false" in argvs["flow_grpo_sde"]
    assert not any(a.startswith("sample.cfg=") for a in argvs["nft"])
    from flow_grpo.config import load_train_config

    monkeypatch.chdir(REPO)
    assert load_train_config(argvs["nft"][1], argvs["nft"][2:]).sample.cfg is False


def test_flow_recipe_keys_leave_only_that_methods_command(tmp_path, monkeypatch):
    """adv_grpo's recipe sets reward.weights (it adds its reward model): only its own command loses the demo's
    reward.weights / reward.kwargs; every other method keeps the demo's mini_geneval reward."""
    from flow_grpo.config import load_train_config

    argvs = _train_argv("flow", tmp_path)
    monkeypatch.chdir(REPO)
    for name, argv in argvs.items():
        cfg = load_train_config(argv[1], argv[2:])
        want = {"mini_geneval": 1.0, "adv_dino": 1.0} if name == "adv_grpo" else {"mini_geneval": 1.0}
        assert cfg.reward.weights == want and cfg.reward.kwargs["mini_geneval"] == {"mode": "partial"}, name
    assert not any(a.startswith("reward.") for a in argvs["adv_grpo"][2:])


def test_full_finetune_recipe_folder_strips_the_demo_lora_and_method_switch(tmp_path, monkeypatch):
    """``--recipes configs/compare/vlm_full``: its recipes decide LoRA / lr / KL (the demo's values leave these runs),
    the demo's own method switch (TempSamp-R1) still leaves them, and the evaluation reads the exported full model."""
    import shlex

    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.utils.config import load_config

    subprocess.run([sys.executable, str(REPO / "scripts" / "compare_methods.py"), "vlm", "--dry-run", "--seeds", "0",
                    "--budget", "7", "--out", str(tmp_path), "--recipes", "configs/compare/vlm_full"], check=True,
                   capture_output=True, timeout=120, cwd=REPO)
    cmds = [shlex.split(c) for c in (tmp_path / "commands.sh").read_text().splitlines()]
    train = {next(a for a in c if a.startswith("run.output_dir=")).split("/")[-3]: c[c.index("train") + 1:]
             for c in cmds if "mmgrpo.vlm.cli" in c and "train" in c}
    assert set(train) == {"grpo", "ref_reset", "ref_sync"}
    monkeypatch.chdir(REPO)
    for name, argv in train.items():
        assert not any(a.split("=")[0] in {"methods.tempsamp_r1.enabled", "model.lora.enabled", "optim.lr"} for a in argv)
        cfg = load_config(TrainConfig, argv[1], argv[2:])
        assert (cfg.model.lora.enabled, cfg.optim.lr, cfg.algo.kl_coef, cfg.methods.tempsamp_r1.enabled) == (False, 1e-4, 0.04,
                                                                                                   False)
        assert cfg.methods.ref_sync.enabled is (name == "ref_sync")
        assert cfg.methods.ref_reset.enabled is (name == "ref_reset")
    evals = [c for c in cmds if "eval/generate_vlm.py" in c and any("/seed0/eval" in a for a in c)]
    assert len(evals) == 3 and all(f"model={tmp_path}/{n}/seed0/model" in c for n, c in
                                   zip(("grpo", "ref_reset", "ref_sync"), evals))
    assert not any(a.startswith("adapter=") for c in evals for a in c)


def test_export_full_model_writes_the_checkpoint_weights(tmp_path):
    """A full fine-tune's checkpoint (policy.pt: the trained tensors) becomes a model folder holding exactly those
    weights; the frozen ones (vision tower) are the base's."""
    import compare_methods as cm
    import torch

    from mmgrpo.vlm.models.adapters import load_policy
    from mmgrpo.utils.checkpoint import CheckpointManager

    base = REPO / "data" / "checkpoints" / "tiny_vlm"
    pol = load_policy(str(base), dtype="float32")
    sd = pol.trainable_state_dict()
    name = next(k for k in sd if k.endswith("mlp.down_proj.weight"))
    sd[name] = sd[name] + 0.5  # a trained weight that differs from the base
    ckpt = CheckpointManager(tmp_path / "checkpoints").save(3, {"policy": sd})
    cm.export_full_model(base, ckpt, tmp_path / "model")
    got = load_policy(str(tmp_path / "model"), dtype="float32").model.state_dict()
    ref = pol.model.state_dict()
    assert torch.equal(got[name], ref[name] + 0.5)
    assert all(torch.equal(got[k], v) for k, v in ref.items() if k != name)


def test_validation_draw_is_the_bases_own_benchmark():
    """--eval-split validation regenerates the base's benchmark (the demo's generator arguments: version 2 for the
    grounding base), at the benchmark's seed + the demo's validation offset; it drew version 1 before."""
    import compare_methods as cm
    import demo

    recipe = demo.load_recipes().tvg
    rep = json.loads((REPO / recipe.base / "sft_report.json").read_text())
    cmd = cm.validation_data_cmd(recipe, rep, Path("/tmp/val"), 100)
    assert cmd[1:] == [recipe.benchmark_script, "/tmp/val", "--n-train", "1", "--n-eval", "100", "--seed",
                       str(rep["data"]["info"]["seed"] + 1000), "--version", "2", "--clock", "light", "--events", "2",
                       "3"]
    demo.check_benchmark_args(rep, cmd[cmd.index("--seed") + 2:])  # the demo's own guard accepts it


def test_probe_table_by_hand(tmp_path):
    """Per-run grounding probes from a run's predictions, and their means over seeds in the table."""
    import compare_methods as cm
    import demo

    # one video, two queries (events [0, 2] and [4, 6])
    anns = {"a0": {"id": "a0", "task": "tvg", "query": "red", "video": "a.mp4", "duration": 10.0, "spans": [[0.0, 2.0]]},
            "a1": {"id": "a1", "task": "tvg", "query": "blue", "video": "a.mp4", "duration": 10.0,
                   "spans": [[4.0, 6.0]]}}

    def probes(out0: str, out1: str) -> dict:
        f = tmp_path / "predictions.jsonl"
        f.write_text(json.dumps({"id": "a0", "output": out0}) + "\n" + json.dumps({"id": "a1", "output": out1}) + "\n")
        return demo.prediction_probes(anns, f)

    late = probes("<answer>1.00 to 3.00</answer>", "<answer>5.00 to 7.00</answer>")  # both 1 s late: IoU 1/3 each
    assert late["events"]["hit"] == 100.0 and late["events"]["start_offset"] == 1.0 == late["events"]["end_offset"]
    assert abs(late["query_swap"]["own_mIoU"] - 100 / 3) < 1e-6 and late["query_swap"]["other_mIoU"] == 0.0
    swapped = probes("<answer>4.00 to 6.00</answer>", "<answer>0.00 to 2.00</answer>")  # each on the other's event
    assert swapped["events"]["hit"] == 0.0 and swapped["query_swap"]["other_mIoU"] == 100.0
    assert demo.prediction_probes(anns, tmp_path / "missing.jsonl") is None

    # the collapse of issue #41: Time-R1's evaluation reads the last "A to B" ("00 to 3.00"), the lenient parser the
    # first; the probes follow the parse mode they are given
    garbage = probes("<answer>1.00 to 3.00.00.00 to 3.00", "<answer>5.00 to 7.00</answer>")
    strict = demo.probes_of(*demo.predicted_samples(anns, tmp_path / "predictions.jsonl"), parse_mode="time_r1_eval")
    assert garbage["query_swap"]["own_mIoU"] == pytest.approx(100 / 3)  # lenient: (1/3 + 1/3) / 2
    assert strict["query_swap"]["own_mIoU"] == pytest.approx(100 * (2 / 3 + 1 / 3) / 2)  # [0, 3] vs [0, 2]: 2/3

    rows = [{"method": "grpo", "seed": 0, "R1@0.5": 10.0, "base_R1@0.5": 5.0, "probes": late, "well_formed": 100.0,
             "lenient_mIoU": 20.0},
            {"method": "grpo", "seed": 1, "R1@0.5": 20.0, "base_R1@0.5": 5.0, "probes": swapped, "well_formed": 50.0,
             "lenient_mIoU": 30.0},
            {"method": "x", "seed": 0, "R1@0.5": 30.0, "base_R1@0.5": 5.0, "probes": None}]
    lines = cm.probe_table(rows, ["grpo", "x"], base=late, base_shape={"well_formed": 100.0, "lenient": {"mIoU": 5.0}})
    # a0 asks about the earliest event [0, 2], a1 about the later [4, 6]: late hits both; swapped puts a1 on [0, 2]
    assert lines[3] == "| start | 5.0 | 100.0 | 5.0 | 33.3 | 0.0 | 100.0 | +1.00 | +1.00 | 100.0 | 100.0 | 0.0 |"
    # own (33.3 + 0) / 2, other (0 + 100) / 2, hit (100 + 0) / 2; offsets only from the seed with hits
    assert lines[4] == "| grpo | 15.0 | 75.0 | 25.0 | 16.7 | 50.0 | 50.0 | +1.00 | +1.00 | 50.0 | 50.0 | 50.0 |"
    assert lines[5] == "| x | 30.0 | - | - | - | - | - | - | - | - | - | - |"
    assert cm.probe_table([{"method": "x", "probes": None}], ["x"], base=None) == []


def test_vlm_steps_is_the_last_step_not_the_row_count():
    """The TVG runs log a step-0 validation row (no training step) and validation rows merged into training rows;
    3 optimizer steps, 4 rows."""
    import compare_methods as cm

    hist = [{"step": 0, "val/mIoU": 21.4}, {"step": 1, "reward/iou/mean": 0.1},
            {"step": 2, "reward/iou/mean": 0.2, "val/mIoU": 25.0}, {"step": 3, "reward/iou/mean": 0.3}]
    assert cm.vlm_steps(hist) == 3 and len(hist) == 4
    assert cm.vlm_steps([]) == 0


def test_ngrpo_recipe_max_reward_is_the_demos_largest_total(tmp_path, monkeypatch):
    """NGRPO's virtual sample sits at methods.ngrpo.max_reward and a reward above it is an error: the comparison
    recipe must match the demo's reward weights (issue #41 added 0.1 x format to IoU: with 1.0 every NGRPO run
    stopped at its first perfect answer)."""
    import compare_methods as cm

    from mmgrpo.utils.config import load_config
    from mmgrpo.vlm.config import TrainConfig

    monkeypatch.chdir(REPO)
    argv = _train_argv("vlm", tmp_path)["ngrpo"]
    cfg = load_config(TrainConfig, argv[1], argv[2:])
    largest = sum(w for w in cfg.reward.weights.values() if w > 0)  # every reward of the demo is in [0, 1]
    assert cfg.reward.weights == {"iou": 1.0, "format": 0.1}
    assert cfg.methods.ngrpo.max_reward == pytest.approx(largest) == pytest.approx(1.1)
    assert "ngrpo" in cm.method_recipes("vlm")
