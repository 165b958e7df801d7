"""Memory planner (issue 17 item 3): parameter counts of the released configs against hand counts / published totals,
the per-component arithmetic against hand-computed bytes, the ``plan`` subcommands' exit codes."""
import pytest

from flow_grpo import memory_plan as fmp
from mmgrpo.utils import memory_plan as mp
from mmgrpo.vlm import memory_plan as vmp

GiB = 1024 ** 3


def test_qwen2_5_vl_7b_counts_match_hand_count_and_release():
    n = vmp.counts(mp.MODELS["qwen2.5-vl-7b"])
    h, kv, inter = 3584, 4 * 128, 18944
    # q/k/v have biases, o_proj and the MLP do not (Qwen2); two RMSNorm weights
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * inter + 2 * h
    assert n["per_layer"] == layer
    assert n["all"] == 8_292_166_656  # safetensors index total_size 16,584,333,312 bytes / 2 (bf16)
    assert n["layers"] == 28 and n["vocab"] == 152064
    # LoRA r=16 on the 7 projections of the 28 LLM layers (vision excluded)
    per = 16 * ((h + h) + 2 * (h + kv) + (h + h) + 2 * (h + inter) + (inter + h))
    assert n["lora"] == 28 * per


def test_flux_transformer_count_matches_release():
    n = fmp.counts(mp.MODELS["flux.1-dev"])
    assert n["full"] == 11_901_408_320  # FLUX.1-dev transformer (the released "12B")
    assert n["layers"] == 19 + 38 and n["hidden"] == 3072


def test_truncated_layouts_keep_a_full_attention_block():
    assert vmp._truncate([7, 15, 23, 31], 2) == [1]
    assert vmp._truncate([7, 15, 23, 31], 16) == [7, 15]
    cfg = vmp.vlm_config(mp.MODELS["qwen2.5-vl-7b"], 3)
    assert cfg.vision_config.depth == 3 and cfg.vision_config.fullatt_block_indexes == [2]
    assert cfg.text_config.num_hidden_layers == 3 and cfg.text_config.hidden_size == 3584


def _n(P=1000, T=100):
    return {"all": P, "full": T, "lora": T, "layers": 2, "per_layer": 10, "hidden": 8, "vocab": 50, "kv": 4}


def test_plan_full_finetune_bytes_by_hand():
    p = mp.plan("qwen2.5-vl-7b", full=True, rows=2, prompt_tokens=3, completion_len=5, gpu=False,
                activation={"a_layer": 1.0, "a_fixed": 2.0}, n=_n())
    assert p["weights"] == 2000  # bf16
    assert p["grads"] == 200  # bf16 grads of the 100 trained parameters
    assert p["optimizer"] == 800  # two fp32 AdamW moments
    assert p["master_weights"] == 800  # fp32 masters + their fp32 grads during step()
    assert p["optimizer_step"] == 400  # foreach AdamW's fp32 temporary of every trained tensor
    assert p["logits"] == 2 * 5 * 50 * 10
    assert p["activations"] == 2 * (3 + 5) * (2 * 1.0 + 2.0)
    assert p["rollout_engine"] == 2 * 4 * 2 * (3 + 5)
    assert p["total"] == sum(v for k, v in p.items() if k != "total")


def test_plan_full_finetune_without_masters_and_with_a_reference_copy():
    """AdamW on bf16 weights keeps bf16 moments (torch.optim.AdamW's state is zeros_like(param)); a full fine-tune
    with KL keeps a frozen bf16 copy of the whole model (load_policy need_reference)."""
    p = mp.plan("qwen2.5-vl-7b", full=True, rows=2, prompt_tokens=3, completion_len=5, gpu=False,
                activation={"a_layer": 1.0, "a_fixed": 2.0}, n=_n(), fp32_master_weights=False, reference=True)
    assert p["optimizer"] == 100 * 2 * 2  # two bf16 moments
    assert p["master_weights"] == 0 and p["optimizer_step"] == 100 * 2  # one bf16 temporary per trained weight
    assert p["reference"] == 1000 * 2  # every parameter (vision tower too), bf16
    lora = mp.plan("qwen2.5-vl-7b", full=False, gpu=False, n=_n(), reference=True)
    assert "reference" not in lora  # the reference of a LoRA run is the base model with the adapter off
    import torch

    w = torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))
    opt = torch.optim.AdamW([w])
    w.grad = torch.ones_like(w)
    opt.step()
    assert all(v.dtype == torch.bfloat16 for v in opt.state[w].values() if v.ndim)  # what the 4 bytes assume


def test_plan_sharding_and_lora():
    full = mp.plan("qwen2.5-vl-7b", full=True, world=4, strategy="zero3", gpu=False, n=_n(),
                   activation={"a_layer": 0, "a_fixed": 0}, completion_len=1)
    assert full["weights"] == 1000 * 2 / 4 + 10 * 2  # shard + one gathered layer
    assert full["optimizer"] == 800 / 4 and full["grads"] == 200 / 4
    lora = mp.plan("qwen2.5-vl-7b", full=False, world=4, strategy="ddp", gpu=False, n=_n(),
                   activation={"a_layer": 0, "a_fixed": 0}, completion_len=1)
    assert lora["weights"] == 2000 and lora["lora_weights"] == 400 and lora["optimizer"] == 800
    chunked = mp.plan("qwen2.5-vl-7b", gpu=False, n=_n(), completion_len=256, logprob_chunk=64, rows=1)
    assert chunked["logits"] == 64 * 50 * 10


def test_plan_cli_exit_codes(capsys):
    from mmgrpo.vlm.cli import main

    assert main(["plan", "--model", "qwen2.5-vl-7b", "--gpu-gb", "80", "model.lora.enabled=true"]) == 0
    assert "fits: yes" in capsys.readouterr().out
    assert main(["plan", "--model", "qwen2.5-vl-7b", "--gpu-gb", "24", "model.lora.enabled=false"]) == 1
    assert "fits: NO" in capsys.readouterr().out


def test_flow_plan_cli(capsys):
    from flow_grpo.cli import main

    assert main(["plan", "--model", "sd3.5-medium", "--gpu-gb", "80", "sample.batch_size=2"]) == 0
    out = capsys.readouterr().out
    assert "sd3.5-medium" in out and "fits: yes" in out
    assert main(["plan", "--model", "qwen2.5-vl-7b"]) == 2


def _fake_rehearsal(tmp_path, name, layers, act):
    """A rehearsal result whose measured peak is the planner's static part plus ``act`` bytes per activation token
    per layer (``a_fixed`` = 0): what a real run would give if the model were exactly linear in depth."""
    import json

    from mmgrpo.utils.memory_plan import MODELS, plan_rehearsal, rehearsal_tokens

    spec = MODELS[name]
    n = (vmp if spec["type"] == "vlm" else fmp).counts(spec, layers)
    step = {"prompt_tokens": 371, "completion_len": 16}
    static = plan_rehearsal(spec, n, False, step, activation={"a_layer": 0.0, "a_fixed": 0.0})["total"]
    measured = static + act * rehearsal_tokens(spec, step) * n["layers"]
    p = tmp_path / f"{name}_{layers}.json"
    p.write_text(json.dumps({"model": name, "layers": layers, "mode": "lora", "step_ok": True,
                             "measured_peak_bytes": measured, "step": step}))
    return str(p)


def test_fit_recovers_constants_for_cfg_models(tmp_path):
    """The fit must divide by the rows x tokens the plan multiplies by. The SD3 rehearsal runs CFG (8 rows, not 4);
    dividing by 4 rows doubled the fitted constants and gave +66 % in-sample error on SD3.5-medium."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "rehearse", Path(__file__).resolve().parents[2] / "scripts" / "rehearse_real_scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in ("sd3.5-medium", "flux.1-dev", "qwen2.5-vl-7b"):
        paths = [_fake_rehearsal(tmp_path, name, n, 1000.0) for n in (1, 2, 3)]
        res = mod.fit(paths)[name]
        assert abs(res["activation"]["a_layer"] - 1000.0) < 1.0, (name, res["activation"])
        assert abs(res["activation"]["a_fixed"]) < 1.0, (name, res["activation"])
        assert all(abs(r["error"]) < 1e-4 for r in res["runs"].values()), (name, res["runs"])


def test_wan_14b_rows_by_hand(capsys):
    """Wan2.1-T2V-14B / Wan2.2-T2V-A14B at 480x832x81: a block's parameters counted by hand, the video tokens, the
    activation term (measured constants, divided by the sequence-parallel size) and the plan command's row."""
    from flow_grpo.cli import main

    n = fmp.counts(mp.MODELS["wan2.1-t2v-14b"])
    h, ffn = 5120, 13824
    attn = 4 * (h * h + h) + 2 * h  # q, k, v, out (+ biases), RMS norms of q and k across heads
    block = 2 * attn + (h * ffn + ffn) + (ffn * h + h) + 2 * h + 6 * h  # self + cross attention, FFN, norm2, table
    assert n["per_layer"] == block == 351_394_304 and n["layers"] == 40
    assert n["encoders"] == 5_680_910_336  # UMT5-XXL encoder
    n2 = fmp.counts(mp.MODELS["wan2.2-t2v-a14b"])
    assert n2["full"] == 2 * n["full"] and n2["lora"] == 2 * n["lora"] and n2["layers"] == 40
    tokens = mp.flow_tokens(mp.MODELS["wan2.1-t2v-14b"], 480, 832, 81)
    assert tokens == 21 * 30 * 52  # (81 - 1) / 4 + 1 latent frames of 60 x 104, 2 x 2 patches
    a = mp.activation_for("wan2.1-t2v-14b")
    assert a[1] == "measured" and a[0] is mp.activation_for("wan2.2-t2v-a14b")[0]
    for sp in (1, 4):
        p = mp.plan("wan2.1-t2v-14b", world=8, rows=2, flow_tokens=tokens, n=n, sequence_parallel=sp, gpu=False)
        assert p["activations"] == pytest.approx(2 * tokens / sp * (40 * a[0]["a_layer"] + a[0]["a_fixed"]))
    # FSDP2 on 8 x 80 GB, one video per micro-batch with CFG's two passes in the loss: 2 x 32,760 tokens of
    # activations per device do not fit; with sequence parallelism over 2 processes they do
    fsdp = dict(world=8, strategy="fsdp2", rows=2, flow_tokens=tokens, n=n, gpu_gb=80)
    assert not mp.plan("wan2.1-t2v-14b", **fsdp)["fits"] and mp.plan("wan2.1-t2v-14b", sequence_parallel=2, **fsdp)["fits"]
    assert main(["plan", "--model", "wan2.1-t2v-14b", "--world", "8", "--strategy", "fsdp2", "sample.height=480",
                 "sample.width=832", "sample.num_frames=81", "sample.batch_size=1", "sample.cfg=true",
                 "run.sequence_parallel=2"]) == 0
    assert "activations measured" in capsys.readouterr().out
