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
