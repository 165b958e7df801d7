"""Validation during training (mmgrpo.vlm.monitor.validation): each point of the curve equals an independent
eval/generate_vlm.py evaluation of the checkpoint saved at that step; validation does not change training; the
config switch chooses the best checkpoint on validation only."""
import json
import sys
from pathlib import Path

import pytest
import torch

from mmgrpo.vlm.config import TrainConfig
from mmgrpo.vlm.train.trainer import GRPOTrainer
from mmgrpo.utils.config import load_config

ROOT = Path(__file__).resolve().parents[2]

PIX = ["data.video_min_pixels=3136", "data.video_max_pixels=3136", "data.video_total_pixels=50176"]


@pytest.fixture(scope="module")
def tvg_data(tmp_path_factory):
    from mmgrpo.vlm.synthetic.tvg import generate

    return generate(tmp_path_factory.mktemp("val_tvg"), n_train=2, n_eval=2, seed=0)


def _cfg(tmp_path, model, data, *extra):
    return load_config(TrainConfig, None, [
        f"model.path={model}", "model.dtype=float32", "model.lora.enabled=true", "model.lora.rank=4", "data.task=tvg",
        "data.prompt_mode=no_think", f"data.train_file={data['train']}", *PIX, "rollout.group_size=3",
        "rollout.max_new_tokens=8", "run.max_steps=2", "run.prompts_per_device=1", "optim.lr=0.05",
        "reward.weights={iou: 1.0}", f"run.output_dir={tmp_path / 'run'}", "run.tensorboard=false",
        "run.resume_from=none", "run.progress_bar=false",
        # the random tiny policy never writes a parsable span: no reward signal; these tests are about validation
        "run.allow_no_reward_signal=true", *extra])


def test_curve_points_equal_an_independent_eval_of_the_saved_checkpoints(tmp_path, tiny_dirs, tvg_data, th):
    sys.path.insert(0, str(ROOT))
    from eval import generate_vlm
    from mmgrpo.vlm.rewards.format import well_formed
    from mmgrpo.vlm.sft import score_tvg_outputs

    model = tiny_dirs("qwen2_5_vl")
    val = ["validation.every=1", f"validation.file={tvg_data['eval']}", "validation.batch_size=2",
           "run.save_every=1", "optim.lr=0.2", "run.max_steps=1"]
    # a reward that varies within groups (the IoU of a random model is 0 everywhere: nothing would train)
    tr = GRPOTrainer(_cfg(tmp_path, model, tvg_data, *val), reward_fn=th.text_reward)
    hist = tr.train()
    vdir = tmp_path / "run" / "validation"
    curve = [json.loads(x) for x in (vdir / "curve.jsonl").read_text().splitlines()]
    assert [r["step"] for r in curve] == [0, 1] and (vdir / "curve.png").is_file()
    assert all("val/mIoU" in h for h in hist)  # also in the step's metrics row (what run.best_metric reads)
    logged = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "val/mIoU" in r] == [0, 1]

    anns = [json.loads(x) for x in Path(tvg_data["eval"]).read_text().splitlines() if x.strip()]
    ckpts = {0: None, 1: tmp_path / "run" / "checkpoints" / "step-00000001"}
    outputs = {}
    for step, ck in ckpts.items():
        out = tmp_path / f"eval{step}"
        # the evaluator with the same inputs and batches; unmerged adapter = the trainer's own computation
        generate_vlm.main([f"model={model}", f"out_dir={out}", f"data.annotations={tvg_data['eval']}",
                           "data.task=tvg", "data.prompt_mode=no_think", *PIX, "decoding.max_new_tokens=8",
                           "decoding.batch_size=2", "merge_adapter=false", "dtype=float32", "progress=false",
                           "hash_weights=none"]
                          + ([f"adapter={ck / 'adapter'}"] if ck else []))
        preds = {r["id"]: r["output"] for r in map(json.loads, (out / "predictions.jsonl").read_text().splitlines())}
        mine = [json.loads(x) for x in (vdir / f"step-{step:08d}.jsonl").read_text().splitlines()]
        assert [r["id"] for r in mine] == [a["id"] for a in anns]
        assert [r["output"] for r in mine] == [preds[a["id"]] for a in anns], step
        texts = [preds[a["id"]] for a in anns]
        outputs[step] = texts
        ref = score_tvg_outputs(texts, anns)
        point = curve[step]
        for k in ("mIoU", "R1@0.5", "parse_rate"):
            assert abs(point[f"val/{k}"] - ref[k]) < 1e-9, (step, k)
        wf = [well_formed(t, "tvg", mode="no_think") for t in texts]  # the evaluator's share, recomputed here
        assert point["val/well_formed"] == pytest.approx(100 * sum(wf) / len(wf))
        assert point["val/well_formed"] == pytest.approx(json.loads((out / "metrics.json").read_text())
                                                         ["generation"]["well_formed_rate"])
        # the reward of the validation outputs, computed here from the evaluator's outputs
        assert abs(point["val/reward/total"] - float(th.text_reward(texts, anns)["total"].mean())) < 1e-6
    assert outputs[0] != outputs[1]  # training changed the greedy outputs: the points are not trivially equal


def test_validation_does_not_change_training(tmp_path, tiny_dirs, tvg_data):
    model = tiny_dirs("qwen2_5_vl")
    plain = GRPOTrainer(_cfg(tmp_path / "a", model, tvg_data, "run.save_every=0"))
    plain.train()
    checked = GRPOTrainer(_cfg(tmp_path / "b", model, tvg_data, "run.save_every=0", "validation.every=1",
                               f"validation.file={tvg_data['eval']}"))
    checked.train()
    a, b = plain.policy.trainable_state_dict(), checked.policy.trainable_state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # same process: bitwise


def test_select_best_chooses_on_validation_only(tmp_path, tvg_data):
    base = [f"data.train_file={tvg_data['train']}", "data.task=tvg", "reward.weights={iou: 1.0}"]
    cfg = load_config(TrainConfig, None, base + ["validation.every=5", f"validation.file={tvg_data['eval']}",
                                                 "validation.select_best=true"])
    assert cfg.run.best_metric == "val/mIoU" and cfg.run.best_mode == "max"
    off = load_config(TrainConfig, None, base)
    assert off.run.best_metric == "" and off.validation.every == 0  # default: checkpoints as before
    with pytest.raises(ValueError, match="another metric"):
        load_config(TrainConfig, None, base + ["validation.every=5", f"validation.file={tvg_data['eval']}",
                                               "validation.select_best=true", "run.best_metric=reward/total/mean"])
    with pytest.raises(ValueError, match="go together"):
        load_config(TrainConfig, None, base + ["validation.every=5"])


def test_select_best_keeps_the_best_validation_checkpoint(tmp_path, tiny_dirs, tvg_data, monkeypatch):
    """Checkpoints at every validation step; the one kept as best is the step with the highest val/mIoU, even
    when it is neither the last nor among the run.keep_last most recent ones."""
    from mmgrpo.vlm.monitor import validation

    scores = iter([10.0, 50.0, 20.0, 30.0, 40.0])  # steps 0..4: step 1 is the best
    monkeypatch.setattr(validation.Validator, "score",
                        lambda self, tr, texts, rs: {"val/mIoU": next(scores), "val/n": float(len(texts))})
    tr = GRPOTrainer(_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), tvg_data, "run.max_steps=4", "run.save_every=0",
                          "run.keep_last=1", "validation.every=1", f"validation.file={tvg_data['eval']}",
                          "validation.select_best=true", "rollout.max_new_tokens=2"))
    tr.train()
    kept = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*"))
    assert kept == ["step-00000001", "step-00000004"], kept
    assert tr.ckpt.best_checkpoint().name == "step-00000001"


def test_unreadable_validation_video_scores_as_an_empty_answer(tmp_path, tiny_dirs, tvg_data):
    """data.on_missing_media=skip: a validation sample whose video is gone stays in the set (IoU 0, counted), so
    every point of the curve is over the same samples."""
    anns = [json.loads(x) for x in Path(tvg_data["eval"]).read_text().splitlines() if x.strip()]
    anns[0] = {**anns[0], "id": "gone", "video": "videos/missing.mp4"}
    vf = Path(tvg_data["eval"]).parent / "val_missing.jsonl"
    vf.write_text("".join(json.dumps(a) + "\n" for a in anns))
    args = ["validation.every=1", f"validation.file={vf}", "run.max_steps=1", "run.save_every=0",
            "rollout.max_new_tokens=2", "data.on_missing_media=skip"]
    tr = GRPOTrainer(_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), tvg_data, *args))
    tr.train()
    rows = [json.loads(x) for x in (tmp_path / "run" / "validation" / "step-00000000.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [a["id"] for a in anns] and rows[0]["output"] == ""
    curve = [json.loads(x) for x in (tmp_path / "run" / "validation" / "curve.jsonl").read_text().splitlines()]
    assert all(r["val/media_errors"] == 1.0 and r["val/n"] == len(anns) for r in curve)


def test_missing_validation_file_fails_before_the_model_loads(tmp_path, tvg_data):
    model = tmp_path / "not_a_loadable_model"  # passes the pre-load folder check, cannot load
    model.mkdir()
    (model / "config.json").write_text("{}")
    cfg = _cfg(tmp_path, model, tvg_data, "validation.every=1", f"validation.file={tmp_path / 'nope.jsonl'}",
               "run.memory_check=off")
    with pytest.raises(Exception, match="nope.jsonl"):  # not the model path: the validation file is read first
        GRPOTrainer(cfg)
