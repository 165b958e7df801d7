"""Evaluation inside training: periodic + final, deterministic ODE images from fixed per-prompt seeds with the EMA
weights, reward means per component, PNG grid, tensorboard/JSONL, reward curves, best checkpoint kept."""
import json

import pytest
import torch

from flow_grpo.sampler import generate_images
from mmgrpo.utils.checkpoint import CheckpointManager
from mmgrpo.utils.seeding import sample_seed

from .conftest import block_reward, brightness_reward, make_trainer


def test_eval_periodic_and_final_with_ema_fixed_seeds_grid_curves_best(tmp_path):
    prompts = ["a red cube", "a cat", "a tree"]
    tr = make_trainer("flux", "fast", tmp_path, rewards={"block": block_reward, "brightness": brightness_reward},
                      **{"reward.weights": "{block: 1.0, brightness: 0.5}", "run.num_epochs": 3,
                         "run.eval_every": 2, "data.eval_prompts": "[" + ", ".join(prompts) + "]",
                         "data.eval_num_prompts": 3, "sample.eval_num_steps": 3, "run.keep_last": 1,
                         "run.save_every": 1, "run.reward_curves": "true"})
    hist = tr.train()
    # eval at epoch 2 (every 2) and at the end (epoch 3), not at epoch 1
    assert [("eval/reward/total/mean" in h) for h in hist] == [False, True, True]
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [("eval/reward/block/mean" in r) for r in rows] == [False, True, True]
    last = hist[-1]
    # recompute the final eval independently: EMA weights, seed of prompt i = sample_seed(seed, 5, i), 3 ODE steps
    seeds = [sample_seed(tr.cfg.run.seed, 5, i) for i in range(3)]
    with tr.ema.swapped_in():
        imgs = generate_images(tr.adapter, prompts, seeds, tr.cfg.sample, num_steps=3)
    b, br = block_reward(imgs, prompts, None)["block"], brightness_reward(imgs, prompts, None)["brightness"]
    assert last["eval/reward/block/mean"] == pytest.approx(float(b.mean()), abs=1e-6)
    assert last["eval/reward/brightness/mean"] == pytest.approx(float(br.mean()), abs=1e-6)
    assert last["eval/reward/total/mean"] == pytest.approx(float((b + 0.5 * br).mean()), abs=1e-6)
    assert not torch.equal(imgs, generate_images(tr.adapter, prompts, seeds, tr.cfg.sample, num_steps=3))  # EMA != raw
    e1, e2 = tr.evaluate(), tr.evaluate()  # fixed seeds: the same weights give the same eval
    e1.pop("time/eval_s"), e2.pop("time/eval_s")
    assert e1 == e2 and e1["eval/reward/total/mean"] == last["eval/reward/total/mean"]
    # grids, curves
    assert (tmp_path / "samples" / "eval_epoch_00002.png").is_file()
    assert (tmp_path / "samples" / "eval_epoch_00003.png").is_file()
    assert not (tmp_path / "samples" / "eval_epoch_00001.png").exists()
    assert (tmp_path / "reward_curves.png").stat().st_size > 1000
    # keep_last=1 plus the best eval checkpoint
    mgr = CheckpointManager(tmp_path / "checkpoints", prefix="epoch")
    kept = [s for s, _ in mgr.list_checkpoints()]
    best_epoch = 2 if hist[1]["eval/reward/total/mean"] >= hist[2]["eval/reward/total/mean"] else 3
    assert kept == sorted({3, best_epoch})
    best = json.loads((mgr.best_checkpoint() / "manifest.json").read_text())["metric"]
    assert best == pytest.approx(max(hist[1]["eval/reward/total/mean"], hist[2]["eval/reward/total/mean"]))
    assert (tmp_path / "lora_final" / "pytorch_lora_weights.safetensors").is_file()


def test_eval_every_needs_prompts(tmp_path):
    with pytest.raises(ValueError, match="eval prompts"):
        make_trainer("flux", "fast", tmp_path, **{"run.eval_every": 1})
