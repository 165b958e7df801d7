"""The Video-R1 OCR and Visual-RFT multi-box rewards are reachable from the trainer's reward.weights."""
import math


def test_one_trainer_step_with_multibox_rewards(tmp_path, tiny_dirs, th):
    from mmgrpo.vlm.models.tiny import synthetic_image
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    samples = [{"id": "r0", "task": "rec", "query": "the red box", "image": synthetic_image(0, 56, 56),
                "boxes": [[2, 2, 30, 30], [30, 30, 50, 50]], "image_size": [56, 56]}]
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=2", "data.task=rec",  # 1 step: not the end
                      "reward.weights={box_iou_multi: 1.0, box_confidence: 0.5}", "run.prompts_per_device=1",
                      # the project's REC prompt asks for one [x1, y1, x2, y2]; the Visual-RFT rewards want a scored
                      # JSON list: the start-of-run check rightly refuses that pair (it is tested in tests/test_check.py)
                      "data.check_samples=0")
    tr = GRPOTrainer(cfg, samples=samples)
    tr.train(steps=1)[-1]
    rb = tr.state.batch
    for n in ("box_iou_multi", "box_confidence"):
        vals = rb.rewards[n].tolist()
        assert len(vals) == 4 and all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in vals)


def test_ocr_reward_through_the_trainers_reward_builder(th, tmp_path):
    """The trainer's reward construction accepts reward.weights={ocr_wer: 1}; a full step needs a free-text task
    (the mcq prompt and JSONL schema require options), which the canonical schema does not have yet."""
    from mmgrpo.vlm.rewards.registry import build_rewards

    cfg = th.make_cfg(tmp_path, "unused", "data.task=mcq", "reward.weights={ocr_wer: 1.0}")
    fn, acc_fn = build_rewards(cfg.reward, "mcq", "qwen2_5_vl", tokenizer=None, prompt_mode="no_think")
    assert acc_fn is None  # accuracy_key=auto -> ocr_wer, already weighted
    out = fn(["<answer>OPEN 24 DAYS</answer>"], [{"id": "o0", "task": "mcq", "answer": "OPEN 24 HOURS"}])
    assert abs(out["ocr_wer"].item() - 2 / 3) < 1e-6 and abs(out["total"].item() - 2 / 3) < 1e-6
