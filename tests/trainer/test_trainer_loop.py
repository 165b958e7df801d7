"""End-to-end trainer steps on a tiny Qwen2.5-VL / Qwen2-VL (CPU): methods change the weights and log sane
metrics; on-policy ratio exactly 1 inside the trainer; edge cases; resume and LoRA checkpoints."""
import json
import logging
import math

import pytest
import torch

from mmgrpo.vlm.config import TrainConfig
from mmgrpo.vlm.data.task import MissingMediaError
from mmgrpo.vlm.data.batch import micro_batches
from mmgrpo.vlm.models.adapters import ADAPTERS
from mmgrpo.vlm.train import steps
from mmgrpo.vlm.train.trainer import GRPOTrainer
from mmgrpo.utils.config import load_config


def make_cfg(tmp_path, model_dir, *overrides):
    base = [f"model.path={model_dir}", "model.dtype=float32", "data.task=tvg", "data.prompt_mode=no_think",
            "data.video_min_pixels=3136", "data.video_max_pixels=3136", "data.image_min_pixels=3136",
            "data.image_max_pixels=3136", "rollout.group_size=4", "rollout.max_new_tokens=6",
            "run.max_steps=2", "run.prompts_per_device=2", "run.micro_batch_size=8", "optim.lr=0.01",
            "optim.weight_decay=0", "optim.max_grad_norm=0", f"run.output_dir={tmp_path / 'run'}",
            "run.tensorboard=false", "run.save_every=0", "run.resume_from=none"]
    return load_config(TrainConfig, None, base + list(overrides))


def trainable(tr):
    return {n: p.detach().clone() for n, p in tr.model.named_parameters() if p.requires_grad}


def max_change(tr, before):
    return max(float((p.detach() - before[n]).abs().max()) for n, p in tr.model.named_parameters() if p.requires_grad)


def run(tr, n=None):
    before = trainable(tr)
    hist = tr.train(steps=n)
    return hist, max_change(tr, before)


def sane(m):
    assert all(math.isfinite(v) for v in m.values()), {k: v for k, v in m.items() if not math.isfinite(v)}
    assert 0.0 <= m["frac_reward_zero_std"] <= 1.0
    assert 0.0 <= m["completions/clipped_ratio"] <= 1.0
    assert m["completions/mean_length"] > 0 and m["perf/tokens_per_s"] > 0
    assert m["train/grad_norm"] > 0


@pytest.mark.parametrize("impl", ["naive", "prefix_group"])
def test_plain_grpo_mixed_video_image_batch_and_ratio_one(tmp_path, tiny_dirs, th, impl):
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "algo.num_iterations=2", "algo.kl_coef=0.05",
                   f"run.logprob_impl={impl}")
    samples = th.video_samples(2) + th.image_samples(2)
    tr = GRPOTrainer(cfg, samples=samples, reward_fn=th.text_reward)
    # the trainer's old log-probs and its grad-enabled forward agree bit for bit: ratio exactly 1 on-policy
    tr.state.stream = tr.new_stream()
    rb = steps.collect(tr, 0)
    assert rb.n == 8 and rb.group_ids.tolist() == [0] * 4 + [1] * 4  # explicit integer group ids, batch of 2
    mbs = micro_batches(rb.group_ids, 8)
    steps.precompute(tr, rb, mbs)
    tr.model.train()
    lp = tr.logprobs.rows(tr.model, rb, mbs[0])
    assert lp.requires_grad and torch.equal(lp.detach(), rb.old_logp[:, :lp.shape[1]])
    # rollout (KV cache) log-probs agree with the trainer's up to float rounding
    torch.testing.assert_close(rb.old_logp * rb.completion_mask, rb.rollout_logp, atol=5e-5, rtol=0)
    # fresh LoRA-free reference == policy at step 0: KL is 0
    assert torch.equal(rb.ref_logp, rb.old_logp)
    hist, change = run(tr)
    assert change > 1e-4
    for m in hist:
        sane(m)
        assert "reward/acc/mean" in m and "train/kl" in m and "train/clip_frac" in m
        assert m["rollout/logprob_max_abs_diff"] < 5e-5
    assert hist[-1]["train/kl"] > 0  # the policy moved away from the reference
    # num_iterations=2: the second update sees ratios != 1
    assert hist[-1]["train/ratio_max"] > 1.0 or hist[-1]["train/ratio_min"] < 1.0
    rows = [json.loads(x) for x in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * cfg.run.num_completions_to_log and {"completion", "advantage", "reward/acc"} <= set(rows[0])
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics] == [1, 2]


def test_tempsamp_injects_ground_truth_and_trains(tmp_path, tiny_dirs, th):
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.tempsamp_r1.enabled=true", "reward.weights={iou: 1.0}")
    tr = GRPOTrainer(cfg, samples=th.video_samples(3))
    hist, change = run(tr)
    rb = tr.state.batch
    assert rb.n == 8 and rb.is_offpolicy.tolist() == [False, False, False, True] * 2
    gt = rb.is_offpolicy
    assert rb.texts[3] == "<answer>0.50 to 1.50</answer>"
    assert torch.all(rb.rewards["iou"][gt] == 1.0)  # the ground truth scores IoU 1 ...
    assert rb.reward_used[gt].tolist() == pytest.approx([0.8 + 0.01 * math.log(1.2)] * 2)  # ... shaped to 0.8018
    assert torch.all(rb.advantages[gt] > 0)
    # the random policy never parses: on-policy IoU 0, all failures counted
    assert hist[-1]["completions/parse_failures"] == 6 and hist[-1]["reward/iou/mean"] == 0.0
    assert hist[-1]["tempsamp/mu_group"] > hist[-1]["tempsamp/mu_onpolicy"]
    assert hist[-1]["tempsamp/groups_no_positive_onpolicy"] == 1.0
    assert change > 1e-4
    sane(hist[-1])
    # anchoring: A_gt = 1.2 * max on-policy advantage (0 here: on-policy rewards are all equal)
    tr.cfg.methods.tempsamp_r1.mode = "anchor"
    tr.estimator = steps.advantage_estimator(tr.methods)
    steps.advantages(tr, rb)
    assert torch.all(rb.advantages == 0)


def test_tgrpo_temporal_bonus_per_group(tmp_path, tiny_dirs, th):
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.t_grpo.enabled=true", "methods.t_grpo.mu=0.5",
                   "reward.accuracy_key=acc")
    tr = GRPOTrainer(cfg, samples=th.video_samples(2) + th.image_samples(1), reward_fn=th.text_reward)
    hist, change = run(tr)
    assert change > 1e-4
    m = hist[-1]
    sane(m)
    assert {"tgrpo/acc_ordered", "tgrpo/acc_shuffled", "tgrpo/bonus_group_frac"} <= set(m)
    rb = tr.state.batch
    bonus = rb.rewards["temporal"]
    assert all(v == 0.0 or v == pytest.approx(0.3) for v in bonus.tolist())
    torch.testing.assert_close(rb.rewards["total"], rb.rewards["acc"] + bonus)
    for g in rb.group_ids.unique():  # within a group, bonus only on "correct" rows and all-or-nothing per group
        sel = rb.group_ids == g
        got = bonus[sel] > 0
        correct = rb.rewards["acc"][sel] > 0.1
        assert torch.equal(got, correct) or not got.any()


@pytest.mark.parametrize("variant", ["reg", "twgrpo"])
def test_reg_grpo_and_tw_grpo_train(tmp_path, tiny_dirs, variant, th):
    extra = ["algo.loss_type=reg", "optim.max_grad_norm=1.0"] if variant == "reg" else ["methods.tw_grpo.enabled=true"]
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), *extra)
    tr = GRPOTrainer(cfg, samples=th.image_samples(3), reward_fn=th.text_reward)
    hist, change = run(tr)
    assert change > 1e-4
    sane(hist[-1])
    if variant == "twgrpo":
        w = tr.state.batch.token_weights[tr.state.batch.completion_mask.bool()]
        assert float(w.min()) >= 1.0 and float(w.max()) == pytest.approx(1.7)
        assert 1.0 < hist[-1]["twgrpo/weight_mean"] < 1.7


@pytest.mark.parametrize("family", [f for f in ADAPTERS if f != "qwen2_5_vl"])  # every other registered family
def test_other_families_plain_grpo(tmp_path, tiny_dirs, th, family):
    px = (2 * ADAPTERS[family].patch_size) ** 2 * 4  # one 2x2 grid of merged patches: 3136 (patch 14), 4096 (16)
    cfg = make_cfg(tmp_path, tiny_dirs(family), "run.max_steps=1", "algo.agg=seq_mean_token_mean",
                   f"data.video_min_pixels={px}", f"data.video_max_pixels={px}", f"data.image_min_pixels={px}",
                   f"data.image_max_pixels={px}")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2) + th.video_samples(1), reward_fn=th.text_reward)
    hist, change = run(tr)
    assert change > 1e-4
    sane(hist[-1])


def test_rec_ground_truth_box_in_resized_frame_scores_high(tmp_path, tiny_dirs, th):
    """Qwen2.5-VL boxes live in the processor-resized image: GT injection, prompt and reward must agree."""
    from mmgrpo.vlm.models.tiny import synthetic_image

    samples = [{"id": "r0", "task": "rec", "query": "the red box", "image": synthetic_image(0, 84, 112),
                "boxes": [[20, 12, 80, 60]], "image_size": [112, 84]}]
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "data.task=rec", "methods.tempsamp_r1.enabled=true",
                   "reward.weights={box_iou: 1.0}", "run.prompts_per_device=1")
    tr = GRPOTrainer(cfg, samples=samples)
    run(tr)
    rb = tr.state.batch
    gt = rb.is_offpolicy
    assert rb.rewards["box_iou"][gt].item() > 0.85, rb.texts[-1]
    assert rb.samples[0]["id"] == "r0"


def test_all_equal_rewards_zero_advantage_flagged(tmp_path, tiny_dirs, th):
    def const(texts, samples):
        return {"acc": torch.ones(len(texts)), "total": torch.ones(len(texts)),
                "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}

    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=2")  # the run is not over after 1 step
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=const)
    hist, change = run(tr, 1)
    assert hist[0]["frac_reward_zero_std"] == 1.0
    assert torch.all(tr.state.batch.advantages == 0) and tr.state.batch.zero_std.all()
    # a zero gradient: the step is skipped (counted), not taken (issue 32 item 2)
    assert hist[0]["train/skipped_steps"] == 1.0 and hist[0]["faults/zero_advantage_steps"] == 1.0
    assert math.isnan(hist[0]["train/grad_norm"]) and change == 0.0


def test_filter_zero_std_groups_refills(tmp_path, tiny_dirs, th):
    def half_const(texts, samples):  # samples i0, i2, ... always score 1: zero-variance groups
        r = torch.tensor([1.0 if int(s["id"][1:]) % 2 == 0 else float(sum(map(ord, t)) % 7) / 6
                          for t, s in zip(texts, samples)])
        return {"acc": r, "total": r, "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}

    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "algo.filter_zero_std=true",
                   "algo.filter_max_rounds=3", "data.shuffle=false")
    tr = GRPOTrainer(cfg, samples=th.image_samples(4), reward_fn=half_const)
    hist, _ = run(tr)
    rb = tr.state.batch
    assert hist[0]["data/filtered_groups"] >= 1 and hist[0]["data/sampling_rounds"] >= 2
    assert rb.group_ids.unique().numel() == 2 and not rb.zero_std.any()
    assert all(int(s["id"][1:]) % 2 == 1 for s in rb.samples)


def test_unparseable_completions_score_zero_and_are_counted(tmp_path, tiny_dirs, th):
    # registry reward on a random policy: nothing parses -> reward 0, counted; zero-variance groups flagged
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=2", "data.prompt_mode=think",
                   "reward.weights={iou: 1.0, format: 0.5}")  # the run (no reward signal: exit 4) is not over
    tr = GRPOTrainer(cfg, samples=th.video_samples(2))
    hist, _ = run(tr, 1)
    m = hist[0]
    assert m["completions/parse_failures"] == 8 and m["completions/parse_failure_rate"] == 1.0
    assert m["reward/iou/mean"] == 0.0 and m["reward/format/mean"] == 0.0 and m["frac_reward_zero_std"] == 1.0
    assert tr.state.batch.parse_failed.all()


@pytest.mark.parametrize("mask_truncated", [True, False])
def test_completions_hitting_max_length_flagged_and_optionally_masked(tmp_path, tiny_dirs, th, mask_truncated):
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "rollout.max_new_tokens=3",
                   f"rollout.mask_truncated_completions={str(mask_truncated).lower()}")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    hist, change = run(tr)
    m = hist[0]
    assert tr.state.batch.truncated.all() and m["completions/clipped_ratio"] == 1.0
    assert m["completions/max_length"] == 3
    assert tr.state.batch.advantages.abs().sum() > 0  # truncated rows still count in the group statistics
    if mask_truncated:  # every row is truncated: nothing enters the loss
        assert m["train/grad_norm"] == 0.0 and change == 0.0
    else:
        assert change > 1e-4


def test_missing_video_skipped_or_error(tmp_path, tiny_dirs, th):
    samples = th.video_samples(2)
    samples[1] = dict(samples[1], video=str(tmp_path / "nope.mp4"), meta={})
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "data.shuffle=false")
    tr = GRPOTrainer(cfg, samples=samples, reward_fn=th.text_reward)
    hist, _ = run(tr)
    assert hist[0]["data/skipped_missing_media"] == 1.0 and tr.state.batch.n == 4
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "data.shuffle=false",
                   "data.on_missing_media=error")
    tr = GRPOTrainer(cfg, samples=samples, reward_fn=th.text_reward)
    with pytest.raises(MissingMediaError, match="nope.mp4"):
        tr.train(steps=1)


def test_data_selection_keeps_varying_samples(tmp_path, tiny_dirs, th):
    def by_id(texts, samples):
        r = torch.tensor([1.0 if s["id"] == "i0" else float(sum(map(ord, t)) % 7) / 6
                          for t, s in zip(texts, samples)])
        return {"acc": r, "total": r, "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}

    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "methods.selection.enabled=true",
                   "methods.selection.num_inferences=3", "methods.selection.criterion=nonconstant")
    tr = GRPOTrainer(cfg, samples=th.image_samples(3), reward_fn=by_id)
    tr.train()
    assert tr.state.selected == [1, 2] and [s["id"] for s in tr.samples] == ["i1", "i2"]
    rows = [json.loads(x) for x in (tmp_path / "run" / "selection.jsonl").read_text().splitlines()]
    assert [r["kept"] for r in rows] == [False, True, True] and rows[0]["rewards"] == [1.0, 1.0, 1.0]


def test_resume_is_exact_and_lora_checkpoint_reloads(tmp_path, tiny_dirs, th, roundtrip):
    from mmgrpo.vlm.models.adapters import load_policy
    from mmgrpo.vlm.models.inputs import build_prompt_item
    from mmgrpo.vlm.models.tiny import synthetic_image

    args = ["model.lora.enabled=true", "model.lora.rank=4", "run.max_steps=2", "algo.kl_coef=0.1"]
    straight = GRPOTrainer(make_cfg(tmp_path / "a", tiny_dirs("qwen2_5_vl"), *args),
                           samples=th.image_samples(3), reward_fn=th.text_reward)
    straight.train()
    # same run interrupted after one step, then resumed with resume_from=auto
    first = GRPOTrainer(make_cfg(tmp_path / "b", tiny_dirs("qwen2_5_vl"), *args[:-2], "run.max_steps=1",
                                 "algo.kl_coef=0.1"), samples=th.image_samples(3), reward_fn=th.text_reward)
    first.train()
    resumed = GRPOTrainer(make_cfg(tmp_path / "b", tiny_dirs("qwen2_5_vl"), *args, "run.resume_from=auto"),
                          samples=th.image_samples(3), reward_fn=th.text_reward)
    resumed.train()
    assert resumed.state.step == 2 and resumed.state.stream.position == straight.state.stream.position
    a, b = straight.policy.trainable_state_dict(), resumed.policy.trainable_state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the saved adapter folder reloads to the same weights (bit for bit) and logits (to a tolerance: the reloaded
    # weights sit in another memory layout, see conftest.RoundTrip)
    ckpt = sorted((tmp_path / "b" / "run" / "checkpoints").glob("step-*"))[-1]
    pol = load_policy(tiny_dirs("qwen2_5_vl"), lora_path=ckpt / "adapter")
    roundtrip.same_weights(pol.model, resumed.model)
    item = build_prompt_item(pol.processor, pol.adapter, [{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "hi"}]}], images=[synthetic_image(5)])
    resumed.model.eval()
    with torch.no_grad():
        adapted = pol.model(**item).logits
        roundtrip.close(adapted, resumed.model(**item).logits, atol=roundtrip.LOGITS_ATOL)
        with pol.reference() as ref:  # adapter disabled = the base model
            base = ref(**item).logits
    assert (base - adapted).abs().max() > 100 * roundtrip.LOGITS_ATOL  # the adapter matters far beyond the tolerance


def test_grpo_increases_a_learnable_reward(tmp_path, tiny_dirs, th):
    """End-to-end sign check: rewarding ASCII letters in the completion, the mean reward rises within 10 steps."""
    def ascii_reward(texts, samples):
        r = torch.tensor([sum(c.isascii() and c.isalpha() for c in t) / max(len(t), 1) for t in texts])
        return {"ascii": r, "total": r.clone(), "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}

    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "data.task=mcq", "rollout.group_size=8",
                   "rollout.max_new_tokens=8", "optim.lr=2e-2", "optim.max_grad_norm=1.0", "run.max_steps=10",
                   "run.micro_batch_size=16")
    tr = GRPOTrainer(cfg, samples=th.image_samples(4), reward_fn=ascii_reward)
    hist, _ = run(tr)
    r = [m["reward/ascii/mean"] for m in hist]
    assert sum(r[-2:]) / 2 > sum(r[:2]) / 2 + 0.2, r


def test_prefix_group_is_the_default_with_a_logged_fallback(tmp_path, tiny_dirs, th, caplog):
    """Default run.logprob_impl=prefix_group is used for the verified families; where it is not exact or not
    supported (here: the prepared-module path) the trainer falls back to the naive path and says so."""
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1")
    assert TrainConfig().run.logprob_impl == "prefix_group"
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    assert tr.logprob_impl == "prefix_group"
    with caplog.at_level(logging.WARNING, logger="mmgrpo"):
        fb = GRPOTrainer(make_cfg(tmp_path / "fb", tiny_dirs("qwen2_5_vl"), "run.grad_sync=accelerate"),
                         samples=th.image_samples(2), reward_fn=th.text_reward)
    assert fb.logprob_impl == "naive" and "prefix_group -> naive log-prob path" in caplog.text
    hist, _ = run(fb, 1)
    assert hist[0]["perf/prefix_group"] == 0.0


def test_data_selection_refiltered_every_epoch_with_the_current_model(tmp_path, tiny_dirs, th, monkeypatch):
    """Time-R1 multi-round: at the start of epoch 1 every sample is scored again by the policy as trained so far
    and re-selected; the next epoch draws from the new set only, and a resume restores that set exactly."""
    seen_weights = []

    def phase_reward(texts, samples):  # before training i0 is 'solved' (constant); afterwards i1 is
        solved = "i0" if tr.state.step == 0 else "i1"
        r = torch.tensor([1.0 if s["id"] == solved else float(sum(map(ord, t)) % 7) / 6
                          for t, s in zip(texts, samples)])
        return {"acc": r, "total": r, "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}

    args = ["run.max_steps=2", "methods.selection.enabled=true", "methods.selection.num_inferences=3",
            "methods.selection.criterion=nonconstant", "methods.selection.refilter_every_epoch=true", "run.save_every=1"]
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), *args)
    tr = GRPOTrainer(cfg, samples=th.image_samples(3), reward_fn=phase_reward)
    w0 = trainable(tr)
    score = tr.score_samples
    tr.score_samples = lambda *a, **k: (seen_weights.append(trainable(tr)), score(*a, **k))[1]
    drawn = []
    draw = tr.feed.draw
    monkeypatch.setattr(tr.feed, "draw", lambda stream: (lambda d: (
        drawn.append([tr.samples[i]["id"] for _, i, _ in d]), d)[1])(draw(stream)))
    tr.train()
    rows = [json.loads(x) for x in (tmp_path / "run" / "selection.jsonl").read_text().splitlines()]
    assert [(r["round"], r["sample_id"], r["kept"]) for r in rows] == [
        (0, "i0", False), (0, "i1", True), (0, "i2", True), (1, "i0", True), (1, "i1", False), (1, "i2", True)]
    assert rows[3]["step"] == 1  # scored when epoch 1 began: after one update ...
    assert not all(torch.equal(seen_weights[1][k], w0[k]) for k in w0)  # ... with the weights of that moment
    assert sorted(drawn[0]) == ["i1", "i2"] and sorted(drawn[1]) == ["i0", "i2"] and tr.state.selected == [0, 2]
    # resume from the step-2 checkpoint: the round-1 selection and the stream come back
    re = GRPOTrainer(make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), *args, "run.resume_from=" + str(
        tmp_path / "run" / "checkpoints" / "step-00000002")), samples=th.image_samples(3), reward_fn=phase_reward)
    assert re._start() and re.state.selected == [0, 2]
    assert re.state.stream.state_dict() == tr.state.stream.state_dict()
    sd = tr.state.stream.state_dict()
    assert (sd["position"], sd["epoch"], sd["offset"], sd["num_samples"]) == (4, 1, 2, 2)


def test_time_budget_stops_saves_and_carries_over_resume(tmp_path, tiny_dirs, th, tick_clock):
    """run.max_train_seconds: the loop stops after the step in which the budget runs out, saves, and a resumed run
    continues the same budget (fake clock: every reading advances 1 s)."""
    from mmgrpo.utils.budget import TimeBudget

    args = ["run.max_steps=10", "run.max_train_seconds=2.5", "run.resume_from=auto"]
    tr = GRPOTrainer(make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), *args), samples=th.image_samples(3),
                     reward_fn=th.text_reward)
    tr.guard.budget = TimeBudget(2.5, clock=tick_clock)
    hist = tr.train()
    assert tr.guard.budget_stopped and tr.state.step == 3 and len(hist) == 3  # 1 s, 2 s (< 2.5), 3 s -> stop
    assert [m["perf/train_seconds"] for m in hist] == [1.0, 2.0, 3.0]
    ckpts = sorted((tmp_path / "run" / "checkpoints").glob("step-*"))
    assert ckpts and ckpts[-1].name.endswith("3")
    again = GRPOTrainer(make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), *args), samples=th.image_samples(3),
                        reward_fn=th.text_reward)
    assert again.train() == [] and again.state.step == 3 and again.guard.budget.spent == 3.0
    assert again.guard.budget_stopped


def test_strict_format_reward_with_no_think_prompt_is_refused(tmp_path, tiny_dirs, th):
    """Strict 'format' needs a <think> block that a no_think prompt forbids: a clear error, not a reward of 0."""
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "reward.weights={iou: 1.0, format: 0.5}")
    with pytest.raises(ValueError, match="format_loose"):
        GRPOTrainer(cfg, samples=th.video_samples(2))
    ok = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "reward.weights={iou: 1.0, format_loose: 0.5}")
    tr = GRPOTrainer(ok, samples=th.video_samples(2))
    out = tr.scorer.reward_fn(["<answer>0.5 to 1.5</answer>"], th.video_samples(1))
    assert float(out["format_loose"][0]) == 1.0 and float(out["iou"][0]) == 1.0
