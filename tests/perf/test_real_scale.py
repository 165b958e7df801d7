"""Real-scale rehearsal (issue 17 item 2), CI-sized: ``scripts/rehearse_real_scale.py`` end to end (sharded
``save_pretrained`` of random bf16 weights, ``load_policy``, one GRPO step of ``GRPOTrainer`` with LoRA and
gradient checkpointing on an 8-frame video, JSON with the measured and predicted peaks).

Even one layer of the smallest released model (Qwen2.5-VL-3B: 151,936 x 2048 embedding, 1280-wide ViT) takes ~90 s
here, so the test runs the same code path with every width divided by 16 (``qwen2.5-vl-3b/16``: real vocabulary,
token ids, MRoPE sections, ViT layout and processor; 4 completion tokens)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.extended  # slow script/benchmark check: bash scripts/test.sh --full
@pytest.mark.slow
def test_rehearsal_smallest_case(tmp_path):
    out = tmp_path / "r.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "rehearse_real_scale.py"), "--model",
                           "qwen2.5-vl-3b/16", "--layers", "1", "--max-new-tokens", "4", "--max-shard-size", "20MB",
                           "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=300)
    r = json.loads(out.read_text())
    assert proc.returncode == 0, r.get("error", proc.stderr[-2000:])
    assert r["step_ok"] and r["step"]["updates"] == 1
    assert r["model"] == "qwen2.5-vl-3b/16" and r["layers"] == 1
    assert len(r["build"]["shards"]) >= 2 and r["step"]["prompt_tokens"] > 8 * 16  # 8 frames reached the LLM
    assert r["measured_peak_bytes"] > 0 and r["predicted_peak_bytes"] > 0
    for k in ("ddp_lora_gib", "fsdp2_full_gib", "zero3_full_gib"):
        assert r["full_depth"][k] > 0


@pytest.mark.extended  # slow script/benchmark check: bash scripts/test.sh --full
@pytest.mark.slow
def test_build_only_writes_a_loadable_folder_and_refuses_a_used_one(tmp_path):
    """``--build-only DIR`` (issue 32 item 11, the CPU rehearsal's model folder; docs/experiments.md): the model at
    the spec's widths with its depth cut, the real tokenizer and processor, nothing else; a second build into the
    same folder is refused. The CI variant (widths / 16, ~20 s here) runs the same code as ``qwen2.5-vl-7b``."""
    from transformers import AutoConfig, AutoProcessor

    from mmgrpo.utils.memory_plan import MODELS

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    d = tmp_path / "m"
    cmd = [sys.executable, str(REPO / "scripts" / "rehearse_real_scale.py"), "--model", "qwen2.5-vl-3b/16",
           "--layers", "1", "--max-shard-size", "20MB", "--build-only", str(d)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["folder"] == str(d) and out["layers"] == 1 and len(out["shards"]) >= 2
    assert f"use model.path={d}" in proc.stderr and "1/16 of the real width" in proc.stderr
    cfg = AutoConfig.from_pretrained(d)
    real = MODELS["qwen2.5-vl-3b"]
    assert cfg.text_config.hidden_size == real["text"]["hidden_size"] // 16 and cfg.text_config.num_hidden_layers == 1
    assert cfg.text_config.vocab_size == 151936 and cfg.vision_config.depth == 1  # the real vocabulary, ViT cut too
    proc_ = AutoProcessor.from_pretrained(d)
    assert proc_.tokenizer.convert_tokens_to_ids("<|video_pad|>") == cfg.video_token_id
    assert not (d / ".build.json").exists()
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 2 and "the folder exists and is not empty" in again.stderr
