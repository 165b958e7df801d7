"""The final export holds the weights the optimizer trained; the EMA is written beside them, and export.json says
which is which (issue 32 item 1: a run shorter than ema.update_every used to export its initial LoRA)."""
import json

import torch
from safetensors.torch import load_file

from mmgrpo.utils.export import EXPORT_MANIFEST

from .conftest import make_trainer


def _norms(tensors) -> list[float]:
    return sorted(round(float(t.detach().float().norm()), 5) for t in tensors)


def _lora_file(d):
    return load_file(next(p for p in d.iterdir() if p.suffix == ".safetensors"))


def test_short_run_exports_trained_weights_not_the_unupdated_ema(tmp_path, caplog):
    # the release's EMA (every 8 optimizer steps) on a run of 1 epoch x 1 update: the EMA is never updated
    tr = make_trainer("flux", "fast", tmp_path, **{"ema.update_every": 8, "ema.decay": 0.9})
    with caplog.at_level("INFO", logger="flow_grpo.trainer"):
        tr.train()
    tr.close()
    assert tr.state.counters["applied_steps"] >= 1 and tr.ema.num_updates == 0
    final = tmp_path / "lora_final"
    sd = _lora_file(final)
    b = [v for k, v in sd.items() if "lora_B" in k]
    assert b and any(bool(v.abs().max() > 0) for v in b)  # the initial LoRA has every B matrix 0
    assert _norms(sd.values()) == _norms(p for _, p in tr.named_params)  # exactly the trained tensors
    assert json.loads((final / EXPORT_MANIFEST).read_text())["weights"] == "trained"
    assert not (tmp_path / "lora_final_ema").exists()
    text = caplog.text
    assert "= the trained weights" in text and "no EMA export: the EMA was never updated" in text


def test_ema_is_exported_beside_the_trained_weights(tmp_path):
    tr = make_trainer("flux", "fast", tmp_path, **{"run.num_epochs": 2, "ema.update_every": 1, "ema.decay": 0.5})
    tr.train()
    tr.close()
    assert tr.ema.num_updates >= 2
    trained, ema = _lora_file(tmp_path / "lora_final"), _lora_file(tmp_path / "lora_final_ema")
    assert trained.keys() == ema.keys()
    assert _norms(trained.values()) == _norms(p for _, p in tr.named_params)
    assert _norms(ema.values()) == _norms(tr.ema.shadow)
    assert any(not torch.equal(trained[k], ema[k]) for k in trained)
    m = json.loads((tmp_path / "lora_final_ema" / EXPORT_MANIFEST).read_text())
    assert m["weights"] == "ema" and m["ema_updates"] == tr.ema.num_updates and m["ema_decay"] == 0.5
    # the checkpoint's LoRA folders follow the same rule
    ck = sorted((tmp_path / "checkpoints").glob("epoch-*"))[-1]
    assert _norms(_lora_file(ck / "lora").values()) == _norms(trained.values())
    assert _norms(_lora_file(ck / "lora_ema").values()) == _norms(ema.values())
