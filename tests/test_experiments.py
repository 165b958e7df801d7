"""The per-paper experiment recipes and scripts (configs/{flow,vlm}/*.yaml, scripts/experiments/*.sh; issue #19).

Fast checks: every recipe loads into its trainer's config (a renamed or removed key fails here), every script pairs
one recipe with an accelerate config and an eval config that exist, a missing environment variable or reward is a
clear error, and the real-run command is the documented `accelerate launch`. Slow checks: one flow and one VLM
experiment run end to end in smoke mode (CPU, tiny models, synthetic data, 2 steps, then the paired eval);
`bash scripts/experiments/smoke_all.sh` runs all of them.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXP = REPO / "scripts" / "experiments"
SCRIPTS = sorted(p for p in EXP.glob("*.sh") if not p.name.startswith("_") and p.name != "smoke_all.sh")
# configs/demo/ holds the CPU demo's settings (scripts/demo.py, tested in tests/test_demo.py), not trainer recipes
RECIPES = sorted(p for p in (REPO / "configs").glob("*/*.yaml") if p.parent.name != "demo")
sys.path.insert(0, str(EXP))
import smoke  # noqa: E402  (scripts/experiments/smoke.py)


def _env(**kw):
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_DIR", "DATA_DIR", "OUT_DIR", "NUM_GPUS", "SMOKE")}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHON=sys.executable, **kw)
    return env


def _bash(script, env, *args, timeout=60):
    return subprocess.run(["bash", str(script), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _train_call(script: Path) -> tuple[str, str, str]:
    """(kind, recipe, accelerate config name) of a script's `train` line."""
    m = re.search(r"^train (vlm|flow) (\S+\.yaml) (\S+)", script.read_text(), re.M)
    assert m, f"{script.name}: no `train KIND RECIPE ACCEL` line"
    return m.group(1), m.group(2), m.group(3)


# ------------------------------------------------------------------------------------------------ fast
@pytest.mark.parametrize("path", RECIPES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_recipe_loads_into_its_trainer_config(path):
    kind = path.parent.name
    assert kind in ("flow", "vlm"), f"unexpected recipe folder {path.parent}"
    cfg = smoke.load_recipe(kind, str(path))
    if kind == "flow":  # a preset-based recipe: the preset must exist and the recipe must stay loadable with it
        assert cfg.method, f"{path.name}: flow recipes name their method preset"
    assert cfg.reward.weights, f"{path.name}: no reward"


def test_every_script_pairs_an_existing_recipe_accelerate_config_and_eval_config():
    used = set()
    for script in SCRIPTS:
        kind, recipe, accel = _train_call(script)
        assert (REPO / recipe).is_file() and recipe.startswith(f"configs/{kind}/"), f"{script.name}: {recipe}"
        assert (REPO / "scripts" / "accelerate_configs" / f"{accel}.yaml").is_file(), f"{script.name}: {accel}"
        evals = re.findall(r"^evaluate (eval/\S+\.py) --config (eval/configs/\S+\.yaml)", script.read_text(), re.M)
        assert evals, f"{script.name}: no paired `evaluate` line"
        for prog, conf in evals:
            assert (REPO / prog).is_file() and (REPO / conf).is_file(), f"{script.name}: {prog} {conf}"
        used.add(recipe)
    assert {str(p.relative_to(REPO)) for p in RECIPES} == used, "every recipe has exactly one script"


def test_help_shows_the_script_header_and_the_shared_usage():
    r = _bash(EXP / "vlm_r1_refcoco.sh", _env(), "--help")
    assert r.returncode == 0
    assert r.stdout.startswith("VLM-R1 REC on RefCOCO") and "SMOKE=1" in r.stdout and "DRY_RUN=1" in r.stdout


def test_missing_environment_variables_are_named():
    r = _bash(EXP / "flow_grpo_sd35_geneval.sh", _env(OUT_DIR="/tmp/x"))
    assert r.returncode == 2
    assert "set MODEL_DIR DATA_DIR NUM_GPUS" in r.stderr and "SMOKE=1" in r.stderr


def test_real_run_prints_the_accelerate_command_and_its_eval(tmp_path):
    r = _bash(EXP / "flow_grpo_sd35_geneval.sh",
              _env(MODEL_DIR=str(tmp_path), DATA_DIR=str(tmp_path), OUT_DIR=str(tmp_path / "run"), NUM_GPUS="8",
                   DRY_RUN="1"), "run.num_epochs=3", "--", "max_prompts=5")
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("[flow_grpo_sd35_geneval] $ ")]
    assert lines[0].split("$ ", 1)[1].startswith(
        "accelerate launch --config_file scripts/accelerate_configs/multi_gpu.yaml --num_processes 8 -m flow_grpo.cli "
        f"train --config configs/flow/flow_grpo_sd35_geneval.yaml run.output_dir={tmp_path / 'run'} "
        f"model.pipeline_dir={tmp_path} ")
    assert lines[0].endswith(" run.num_epochs=3")  # the script's own arguments come last (they win)
    assert "eval/generate_t2i.py --config eval/configs/mini_geneval.yaml" in lines[1]
    assert f"lora={tmp_path / 'run'}/lora_final" in lines[1] and lines[1].endswith(" max_prompts=5")


def test_a_reward_missing_from_this_checkout_stops_before_launch(tmp_path):
    r = _bash(EXP / "pref_grpo_flux.sh",
              _env(MODEL_DIR=str(tmp_path), DATA_DIR=str(tmp_path), OUT_DIR=str(tmp_path / "run"), NUM_GPUS="8",
                   DRY_RUN="1"), "reward.pairwise_scorer=no_such_pkg_xyz.judge:make")
    assert r.returncode == 2
    assert "needs pairwise judge 'no_such_pkg_xyz.judge:make'" in r.stderr
    assert "accelerate launch" not in r.stderr


def test_missing_rewards_lists_unknown_names_only():
    from flow_grpo.config import load_train_config
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.utils.config import load_config

    cfg = load_train_config(None, ["reward.weights={mini_geneval: 1.0, no_such_reward: 1.0}"])
    assert smoke.missing_rewards("flow", cfg) == ["reward 'no_such_reward' (flow_grpo.rewards registry)"]
    vcfg = load_config(TrainConfig, None, ["reward.weights={iou: 1.0, no_such_reward: 1.0}"])
    assert smoke.missing_rewards("vlm", vcfg) == ["reward 'no_such_reward' (mmgrpo.vlm.rewards.registry.REWARDS)"]


def test_export_vlm_writes_the_trained_tensors_over_the_base(tmp_path):
    import torch
    from safetensors.torch import load_file

    import export_vlm  # scripts/experiments/export_vlm.py

    base = smoke.TINY_VLM
    ref = load_file(str(base / "model.safetensors"))
    name = "model.language_model.layers.0.self_attn.q_proj.weight"
    key = next(k for k in ref if k.endswith("layers.0.self_attn.q_proj.weight"))  # the file's naming of it
    trained = {name: torch.full_like(ref[key], 0.25)}
    ck = tmp_path / "run" / "checkpoints" / "step-00000002"
    ck.mkdir(parents=True)
    torch.save(trained, ck / "policy.pt")
    out = export_vlm.export(str(tmp_path / "run"), str(base), str(tmp_path / "final"))
    got = load_file(str(out / "model.safetensors"))
    assert torch.equal(got[key], trained[name])
    changed = [k for k in ref if k != key and not torch.equal(got[k], ref[k])]
    assert changed == [] and set(got) == set(ref)
    for f in ("config.json", "tokenizer.json", "chat_template.jinja", "processor_config.json"):
        assert (out / f).is_file(), f


def test_export_vlm_rejects_tensors_the_base_does_not_have(tmp_path):
    import torch

    import export_vlm

    ck = tmp_path / "checkpoints" / "step-00000001"
    ck.mkdir(parents=True)
    torch.save({"not.a.parameter": torch.zeros(1)}, ck / "policy.pt")
    with pytest.raises(ValueError, match="not.a.parameter"):
        export_vlm.export(str(tmp_path), str(smoke.TINY_VLM), str(tmp_path / "final"))


def _bf16_base(tmp_path):
    """The tiny VLM saved in bf16 (the released checkpoints' dtype)."""
    import torch

    from mmgrpo.vlm.models.adapters import detect_family, get_adapter

    m = get_adapter(detect_family(str(smoke.TINY_VLM))).model_class().from_pretrained(str(smoke.TINY_VLM),
                                                                                        dtype=torch.bfloat16)
    base = tmp_path / "base_bf16"
    m.save_pretrained(base)
    for f in smoke.TINY_VLM.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and not (base / f.name).exists():
            (base / f.name).write_bytes(f.read_bytes())
    return base


def test_export_vlm_says_when_it_casts_fp32_trained_tensors_and_keeps_them_on_request(tmp_path, capsys):
    """A run trained in fp32 on a bf16 base: the export casts the trained tensors to bf16 (said, with the largest
    change), or keeps them exactly with --keep-fp32 (issue 32 item 5)."""
    import json

    import torch
    from safetensors.torch import load_file

    import export_vlm

    base = _bf16_base(tmp_path)
    ref = load_file(str(base / "model.safetensors"))
    key = next(k for k in ref if k.endswith("layers.0.self_attn.q_proj.weight"))
    name = "model.language_model.layers.0.self_attn.q_proj.weight"
    trained = {name: torch.full(ref[key].shape, 1.0 + 2 ** -12, dtype=torch.float32)}  # not a bf16 number
    ck = tmp_path / "run" / "checkpoints" / "step-00000003"
    ck.mkdir(parents=True)
    torch.save(trained, ck / "policy.pt")
    assert export_vlm.main([str(tmp_path / "run"), str(base), str(tmp_path / "final")]) == 0
    err = capsys.readouterr().err
    assert "1 of the 1 trained tensors cast float32 -> bfloat16" in err and "--keep-fp32" in err
    info = json.loads((tmp_path / "final" / "export.json").read_text())
    assert info["kind"] == "full" and info["dtype"] == "bfloat16" and info["step"] == 3
    assert info["casts"]["float32 -> bfloat16"]["max_abs_change"] == pytest.approx(2 ** -12)
    assert export_vlm.main([str(tmp_path / "run"), str(base), str(tmp_path / "final32"), "--keep-fp32"]) == 0
    got = load_file(str(tmp_path / "final32" / "model.safetensors"))
    assert torch.equal(got[key], trained[name])  # exactly the trained values
    other = next(k for k in ref if k != key and ref[k].is_floating_point())
    assert got[other].dtype == torch.float32 and torch.equal(got[other], ref[other].float())
    assert "cast" not in capsys.readouterr().err


def test_export_vlm_exports_a_lora_checkpoint_as_an_adapter_folder_the_eval_loads(tmp_path):
    """model.lora.enabled=true runs export like full ones (issue 32 item 10): OUT_DIR is the peft adapter with
    adapter_config.json pointing at the base, which eval/generate_vlm.py takes as model=OUT_DIR."""
    import json

    import export_vlm
    from eval.generate_vlm import resolve_model

    ad = tmp_path / "run" / "checkpoints" / "step-00000002" / "adapter"
    ad.mkdir(parents=True)
    (ad / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "elsewhere", "r": 4}))
    (ad / "adapter_model.safetensors").write_bytes(b"weights")
    out = export_vlm.export(str(tmp_path / "run"), str(smoke.TINY_VLM), str(tmp_path / "final"))
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == str(smoke.TINY_VLM.resolve()) and cfg["r"] == 4
    assert (out / "adapter_model.safetensors").read_bytes() == b"weights"
    assert json.loads((out / "export.json").read_text())["kind"] == "lora"
    base, adapter = resolve_model(str(out))
    assert Path(base) == smoke.TINY_VLM.resolve() and Path(adapter) == out


WAN_RECIPES = ["dance_grpo_wan_t2v", "flow_grpo_wan_t2v"]


@pytest.mark.parametrize("name", WAN_RECIPES)
def test_wan_recipes_smoke_on_the_tiny_wan_with_a_per_frame_reward(name, tmp_path, monkeypatch):
    """Wan T2V recipes (issue #22): smoke mode swaps in the tiny Wan folder, 5 frames at 32 px, and a cheap
    per-frame reward for training and eval; the recipe's method settings are kept; smoke_all lists them."""
    monkeypatch.setenv("SMOKE_DATA", str(tmp_path / "data"))
    cfg = smoke.load_recipe("flow", str(REPO / "configs" / "flow" / f"{name}.yaml"))
    assert cfg.model.kind == "wan" and cfg.sample.num_frames > 1 and (cfg.sample.num_frames - 1) % 4 == 0
    assert set(cfg.reward.weights) == {"video_per_frame"}
    tr = smoke.flow_train(cfg, tmp_path / "run")
    assert "model.kind=wan" in tr and "sample.num_frames=5" in tr and "sample.height=32" in tr
    assert tr[-2:] == ["reward.weights={video_per_frame: 1.0}", f"reward.kwargs={{video_per_frame: {smoke.SMOKE_VIDEO_REWARD}}}"]
    assert (tmp_path / "data" / "tiny_wan" / "model_index.json").is_file()
    if cfg.optim.best_of_n:
        assert "optim.best_of_n=2" in tr
    ev = smoke.flow_eval(cfg, tmp_path / "run")
    assert "rewards=[video_per_frame]" in ev and "num_frames=5" in ev and "rewards=[mini_geneval]" not in ev
    loaded = smoke.load_recipe("flow", str(REPO / "configs" / "flow" / f"{name}.yaml"), tr)
    assert loaded.sample.noise_level == cfg.sample.noise_level and loaded.method == cfg.method
    assert name in [p.stem for p in SCRIPTS]  # smoke_all.sh runs every script of this folder


@pytest.mark.extended  # slow script/benchmark check: bash scripts/test.sh --full
def test_smoke_overrides_are_the_only_stdout_when_the_tiny_models_are_built(tmp_path):
    """Building the tiny FLUX / Wan folders the first time printed blank lines to stdout (native code), which the
    scripts passed to the trainer as empty overrides ('' is not of the form key=value)."""
    for recipe in ("pref_grpo_flux", "flow_grpo_wan_t2v"):
        r = subprocess.run([sys.executable, str(EXP / "smoke.py"), "train", "flow", f"configs/flow/{recipe}.yaml",
                            str(tmp_path / "run")], cwd=REPO, env=_env(SMOKE_DATA=str(tmp_path / "data")),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        lines = r.stdout.splitlines()
        assert lines and all("=" in ln for ln in lines), lines[:5]


def test_wan_real_run_prints_fsdp_launch_and_a_video_eval(tmp_path):
    r = _bash(EXP / "dance_grpo_wan_t2v.sh",
              _env(MODEL_DIR=str(tmp_path), DATA_DIR=str(tmp_path), OUT_DIR=str(tmp_path / "run"), NUM_GPUS="32",
                   DRY_RUN="1"))
    assert r.returncode == 0, r.stderr
    lines = [ln.split("$ ", 1)[1] for ln in r.stderr.splitlines() if ln.startswith("[dance_grpo_wan_t2v] $ ")]
    assert lines[0].startswith("accelerate launch --config_file scripts/accelerate_configs/fsdp.yaml --num_processes 32")
    ev = next(ln for ln in lines if "eval/generate_t2i.py" in ln)  # then the base eval and the comparison
    assert "num_frames=53" in ev and "rewards=\\[video_per_frame\\]" in ev


# ------------------------------------------------------------------------------------------------ smoke (slow)
@pytest.mark.parametrize("name", ["flow_grpo_sd35_geneval", "vlm_r1_refcoco"])
def test_smoke_mode_trains_and_evaluates(name, tmp_path):
    """The fastest flow and VLM experiments, end to end on CPU (about 30 s each; all: smoke_all.sh)."""
    out = tmp_path / name
    r = _bash(EXP / f"{name}.sh", _env(SMOKE="1", OUT_DIR=str(out), SMOKE_DATA=str(tmp_path / "data")),
              timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    # the recipe's method settings reached the trainer: its saved config is the recipe plus the smoke swaps
    saved = (out / "config.yaml").read_text()
    if name.startswith("flow"):
        assert "method: flow" in saved and "kl_coef: 0.04" in saved and (out / "lora_final").is_dir()
        ev = out / "eval_geneval"
    else:
        assert "parse_mode: vlm_r1" in saved and (out / "final" / "config.json").is_file()
        ev = out / "eval_refcoco"
    # the trained weights, the base, and the comparison (issue 32 item 12: the base evaluation used to be manual)
    assert (ev / "metrics.json").is_file() and (ev.parent / f"{ev.name}_base" / "metrics.json").is_file()
    cmp = (ev.parent / f"{ev.name}_compare.md").read_text()
    assert "| metric | base | trained | Δ trained |" in cmp


def test_each_vlm_paired_eval_renders_the_release_prompt_and_scores_with_its_rules():
    """Issue #33 / #32 item 5: the paired evaluation shows the model its recipe's release prompt (Time-R1: its
    evaluation rendering) and a recipe trained with TempSamp-R1's parsing is scored with it, not Time-R1's."""
    for script in SCRIPTS:
        kind, recipe, _ = _train_call(script)
        if kind != "vlm":
            continue
        cfg = smoke.load_recipe("vlm", str(REPO / recipe))
        ev = script.read_text().split("evaluate eval/generate_vlm.py", 1)[1]
        tmpl = cfg.data.prompt_template
        want = {"time_r1_v1": "time_r1_eval"}.get(tmpl, tmpl)
        if want == "mmgrpo":
            assert "data.prompt_template=" not in ev, script.name
        else:
            assert f"data.prompt_template={want} " in ev or f"data.prompt_template={want}\n" in ev, script.name
        if cfg.reward.parse_mode == "tempsamp_r1":
            assert "score.official_mode=tempsamp_r1" in ev, script.name


def test_smoke_lora_vlm_run_exports_and_evaluates_like_a_full_one(tmp_path):
    """model.lora.enabled=true used to stop the script at export_vlm (issue 32 item 10): now OUT_DIR/final is the
    adapter (on the base) and the same evaluate line scores it. Time-R1 (TVG): the tiny model's spans give a reward
    signal, so the run is held to the no-signal guard too."""
    out = tmp_path / "time_r1_lora"
    r = _bash(EXP / "time_r1_charades.sh", _env(SMOKE="1", OUT_DIR=str(out), SMOKE_DATA=str(tmp_path / "data")),
              "model.lora.enabled=true", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "allow_no_reward_signal" not in r.stderr
    assert (out / "final" / "adapter_config.json").is_file() and (out / "eval_charades" / "metrics.json").is_file()



def test_a_typo_in_a_training_override_names_the_key_before_anything_runs(tmp_path):
    """It used to end in a smoke.py traceback followed by 'the recipe names rewards this checkout lacks'
    (issue 32 item 8)."""
    env = _env(MODEL_DIR=str(tmp_path), DATA_DIR=str(tmp_path), OUT_DIR=str(tmp_path / "run"), NUM_GPUS="1",
               DRY_RUN="1")
    r = _bash(EXP / "time_r1_charades.sh", env, "rollout.group_szie=4")
    assert r.returncode == 2, r.stderr
    assert "unknown config key 'rollout.group_szie'" in r.stderr and "rollout.group_size" in r.stderr
    assert "a training override is wrong" in r.stderr and "Traceback" not in r.stderr
    assert "accelerate launch" not in r.stderr and "rewards this checkout" not in r.stderr


def test_dry_run_validates_the_evaluation_overrides(tmp_path):
    env = _env(MODEL_DIR=str(tmp_path), DATA_DIR=str(tmp_path), OUT_DIR=str(tmp_path / "run"), NUM_GPUS="1",
               DRY_RUN="1")
    r = _bash(EXP / "time_r1_charades.sh", env, "--", "decoding.max_new_token=64")
    assert r.returncode == 2, r.stderr
    assert "unknown config key 'decoding.max_new_token'" in r.stderr and "decoding.max_new_tokens" in r.stderr
    assert "an evaluation override (after --) is wrong" in r.stderr
    ok = _bash(EXP / "time_r1_charades.sh", env, "--", "decoding.max_new_tokens=64")
    assert ok.returncode == 0, ok.stderr


def test_dry_run_of_a_pickscore_recipe_notes_the_missing_folders_and_a_real_run_stops(tmp_path):
    env = _env(MODEL_DIR=str(tmp_path), DATA_DIR=str(tmp_path), OUT_DIR=str(tmp_path / "run"), NUM_GPUS="1")
    r = _bash(EXP / "flow_grpo_sd35_pickscore.sh", {**env, "DRY_RUN": "1"})
    assert r.returncode == 0 and "reward.kwargs.pickscore.model_path is required" in r.stderr
    r = _bash(EXP / "flow_grpo_sd35_pickscore.sh", {**env, "ACCELERATE": "false"})
    assert r.returncode == 2 and "a reward setting is missing or wrong" in r.stderr
