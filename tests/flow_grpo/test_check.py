"""``flow_grpo check`` (issue #33 item 6): the tokens it prints are the ids the text encoders receive (hooked on the
trainer's adapter), truncation at the configured length, the sigma schedule of the trainer's adapter from a folder
read without weights, and the epoch-0 step plan the trainer's own rollout uses."""
from flow_grpo.train import steps
import json

import pytest
import torch

from flow_grpo.check import build_light_adapter, run_check
from flow_grpo.cli import main
from flow_grpo.config import load_train_config

LONG = ("an astronaut riding a horse on the moon with many many many many words that go on and on and on and on "
        "past the limit of tokens surely")


def _cfg(tmp_path, *extra):
    p = tmp_path / "prompts.txt"
    p.write_text(f"a photo of a cat\n{LONG}\na red apple\n")
    return load_train_config(None, ["model.tiny=flux", "method=fast", f"data.train_path={p}", "data.group_size=3",
                                    "data.groups_per_epoch=2", "sample.height=64", "sample.width=64",
                                    "model.max_sequence_length=12", "sample.cfg=false",
                                    f"run.output_dir={tmp_path / 'run'}", *extra])


def test_tokens_are_what_the_encoders_receive_and_truncation(tmp_path):
    cfg = _cfg(tmp_path)
    r = run_check(cfg, num_prompts=3)
    ad = build_light_adapter(cfg)  # a real (tiny) adapter: encode through it and hook the encoders' inputs
    seen = {}
    for name in ("text_encoder", "text_encoder_2"):
        getattr(ad.pipe, name).register_forward_pre_hook(
            lambda m, a, kw, name=name: seen.__setitem__(name, (a[0] if a else kw["input_ids"])[0].tolist()),
            with_kwargs=True)
    for rec in r["text_encoders"]:
        ad.encode_prompts([rec["prompt"]])
        for e, enc in zip(rec["encoders"], ("text_encoder", "text_encoder_2")):
            tok = getattr(ad.pipe, e["tokenizer"])
            got = seen[enc]
            assert len(got) == e["max_length"]  # padded to max_length, as the encoder gets it
            assert tok.convert_ids_to_tokens(got[:e["count"]]) == e["tokens"]
            assert all(i == tok.pad_token_id for i in got[e["count"]:])
    t5 = {i: rec["encoders"][1] for i, rec in enumerate(r["text_encoders"])}
    assert t5[1]["truncated"] and t5[1]["max_length"] == 12 and not t5[0]["truncated"]
    # the long prompt's kept + dropped tokens are its untruncated tokens (the tokenizer's end token, if any, kept)
    assert t5[1]["count"] == 12 and t5[1]["untruncated_count"] == 12 + t5[1]["dropped_tokens"]
    assert t5[1]["dropped_text"].replace(" ", "") in LONG.replace(" ", "") and t5[1]["dropped_text"]
    assert r["prompts"]["truncated_by_some_encoder"] == 1


def test_folder_is_read_without_weights_and_sigmas_match_the_trainer_adapter(tmp_path):
    from flow_grpo.models import load_adapter
    from flow_grpo.models.tiny import build_tiny_flux_pipeline

    folder = tmp_path / "flux"
    build_tiny_flux_pipeline(0).save_pretrained(folder)
    cfg = _cfg(tmp_path, "model.tiny=", f"model.pipeline_dir={folder}", "sample.shift=2.5")
    light = build_light_adapter(cfg)
    assert all(p.is_meta for p in light.transformer.parameters())  # no weight was read
    r = run_check(cfg, num_prompts=2)
    full = load_adapter(str(folder), max_sequence_length=12)
    full.set_shift(2.5)
    assert r["sigmas"]["values"] == [round(float(x), 6) for x in full.sigmas(10, 64, 64)]
    # shift 2.5 by hand on the folder scheduler's grid: sigma' = s sigma / (1 + (s - 1) sigma)
    base = torch.linspace(1.0, 0.1, 10)
    assert r["sigmas"]["values"][:10] == pytest.approx((2.5 * base / (1 + 1.5 * base)).tolist(), abs=1e-5)
    tiny = run_check(_cfg(tmp_path), num_prompts=2)
    assert [e["tokens"] for e in r["text_encoders"][1]["encoders"]] == \
        [e["tokens"] for e in tiny["text_encoders"][1]["encoders"]]


def test_first_epoch_plan_is_the_trainers_rollout_plan(tmp_path):
    from flow_grpo.train.trainer import FlowGRPOTrainer

    cfg = _cfg(tmp_path, "run.tensorboard=false", "ema.enabled=false", "reward.async_workers=0",
               "run.progress_bar=false")
    r = run_check(cfg)
    groups = r["first_epoch"]["groups"]
    assert len(groups) == 2
    for g in groups:  # fast: one window of 3 steps per group inside [0, 5)
        (smp,) = g["samples"]
        assert smp["sde"] == smp["trained"] and len(smp["sde"]) == 3 and 0 <= smp["sde"][0] <= 2
        assert smp["sde"] == list(range(smp["sde"][0], smp["sde"][0] + 3))
    tr = FlowGRPOTrainer(cfg, reward_fn={"b": lambda images, prompts, metadata: torch.zeros(len(prompts))})
    traj, _ = steps.rollout(tr, 0)
    for i in range(6):
        g = groups[i // 3]
        assert traj.prompts[i] == g["prompt"]
        assert traj.sde_mask[i].nonzero().flatten().tolist() == g["samples"][0]["sde"]
    tr.close()


def test_cli_prints_and_writes_json_and_refuses_bad_input(tmp_path, capsys):
    cfg_args = ["model.tiny=flux", "method=fast", f"data.prompts=[{LONG}]", "model.max_sequence_length=8",
                "sample.height=64", "sample.width=64"]
    out = tmp_path / "r.json"
    assert main(["check", "--num-prompts", "1", "--json", str(out), *cfg_args]) == 0
    text = capsys.readouterr().out
    assert "TRUNCATED" in text and "sigma schedule" in text and "step plan of epoch 0" in text
    assert json.loads(out.read_text())["text_encoders"][0]["encoders"][1]["truncated"]
    assert main(["check", *cfg_args[:2], "--num-prompts", "1", *cfg_args[2:]]) == 0  # options between overrides
    assert "TRUNCATED" in capsys.readouterr().out
    assert main(["check", "model.tiny=", "model.pipeline_dir=", "data.prompts=[a]"]) == 2
    assert "pipeline_dir" in capsys.readouterr().err
    assert main(["check", "data.prompts=[a]", f"model.pipeline_dir={tmp_path}"]) == 2  # no model_index.json
