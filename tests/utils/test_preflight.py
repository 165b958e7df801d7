"""mmgrpo.utils.preflight: the startup line says what an accelerate config the device cannot honour falls back to;
the rollout watch; the planner reads depth-truncated folders (issue 32 items 7, 9)."""
import types

import pytest

from mmgrpo.engine.errors import ConfigError
from mmgrpo.utils import memory_plan as mp
from mmgrpo.utils import preflight as pf


def _acc(dist="NO", device="cpu", n=1):
    import torch

    return types.SimpleNamespace(distributed_type=f"DistributedType.{dist}", num_processes=n,
                                 device=torch.device(device), is_main_process=True)


def test_fsdp_config_on_cpu_and_fp16_on_cpu_say_what_they_fall_back_to(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    line = pf.startup_line("flow_grpo train", _acc(), weights_dtype="bfloat16", mixed_precision="fp16")
    assert line.startswith("flow_grpo train: device cpu, 1 process, no distribution, FSDP off, weights bfloat16, "
                           "autocast none")
    assert "asks for FSDP, but on cpu this run uses no distribution: every process holds the whole model" in line
    assert "mixed_precision=bf16 is replaced by run.mixed_precision=fp16" in line
    assert "run.mixed_precision=fp16 has no effect on CPU" in line


def test_an_honoured_config_has_no_notes(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    line = pf.startup_line("mmgrpo train", _acc("FSDP", "cpu", 2), weights_dtype="bfloat16", attn="sdpa", lora=False,
                           mixed_precision="bf16")
    assert line == ("mmgrpo train: device cpu, 2 processes, FSDP2 (sharded), weights bfloat16, autocast bf16, "
                    "attention sdpa, full fine-tune")


def test_flash_attention_on_cpu_and_unknown_backends_are_refused():
    with pytest.raises(ConfigError, match="model.attn_implementation=flash_attention_2 needs the flash-attn"):
        pf.check_attn_implementation("flash_attention_2", "model.attn_implementation", "cpu")
    with pytest.raises(ConfigError, match="'sdp' is not an attention implementation"):
        pf.check_attn_implementation("sdp", "model.attn_implementation", "cuda")
    pf.check_attn_implementation("sdpa", "model.attn_implementation", "cpu")


def test_rollout_watch_logs_progress_and_stops_on_a_signal(caplog, monkeypatch):
    sig = types.SimpleNamespace(requested=False, name="SIGTERM")
    w = pf.RolloutWatch(lambda: sig, every_s=0.0)
    w.every_s = 1e-9
    with caplog.at_level("INFO", logger="mmgrpo.preflight"):
        assert w(8, 6) is False
    assert "tokens generated in the last" in caplog.text and "6 rows still decoding" in caplog.text
    sig.requested = True
    assert w(6, 6) is True
    assert pf.RolloutWatch(lambda: None)(3, 3) is False


def test_plan_reads_a_depth_truncated_folder(tmp_path, capsys):
    """`mmgrpo plan` used to refuse the folders scripts/rehearse_real_scale.py builds (their depth is not the
    released one): now it plans the released widths at the folder's depth."""
    from mmgrpo.vlm.cli import main
    from mmgrpo.vlm.memory_plan import vlm_config

    d = tmp_path / "m"
    d.mkdir()
    vlm_config(mp.MODELS["qwen2.5-vl-7b"], 2).to_json_file(str(d / "config.json"))
    rc = main(["plan", f"model.path={d}", "model.lora.enabled=true", "--gpu-gb", "80"])
    out = capsys.readouterr().out
    assert rc == 0 and "qwen2.5-vl-7b" in out and "truncated to 2 layers" in out
    printed = float(next(ln for ln in out.splitlines() if ln.strip().startswith("total")).split()[1])
    from mmgrpo.utils.config import load_config
    from mmgrpo.vlm.config import TrainConfig

    c = load_config(TrainConfig, None, [])
    kw = dict(full=False, rows=c.run.micro_batch_size, prompt_tokens=1024,
              completion_len=c.rollout.max_new_tokens, gpu_gb=80)
    from mmgrpo.vlm.memory_plan import counts

    spec, r = mp.MODELS["qwen2.5-vl-7b"], c.model.lora.rank
    at2 = mp.plan("qwen2.5-vl-7b", n=counts(spec, 2, r), **kw)["total"]
    at28 = mp.plan("qwen2.5-vl-7b", n=counts(spec, None, r), **kw)["total"]
    assert printed == pytest.approx(at2 / mp.GiB, abs=0.006) and at2 < at28  # the folder's depth, not the release's


def test_plan_explains_a_width_it_does_not_know(tmp_path, capsys):
    from mmgrpo.vlm.cli import main
    from mmgrpo.vlm.models.tiny import save_tiny_model

    d = save_tiny_model(tmp_path / "tiny", "qwen2_5_vl")
    assert main(["plan", f"model.path={d}"]) == 2
    assert "no measured activation figures" in capsys.readouterr().err
