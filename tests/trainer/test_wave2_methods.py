"""Wave-2 VLM methods on the tiny trainer: each hook's effect, checked against values computed here."""
import math

import pytest
import torch

from mmgrpo.vlm.data.batch import micro_batches
from mmgrpo.vlm.train.trainer import GRPOTrainer
from mmgrpo.vlm.train import steps

from .test_trainer_loop import make_cfg, run, sane, trainable


def two_rewards(texts, samples):
    """Two components that vary independently within a group."""
    a = torch.tensor([float(sum(map(ord, t)) % 7) / 6.0 for t in texts])
    b = torch.tensor([float(len(t) % 3) / 2.0 for t in texts])
    return {"acc": a, "fmt": b, "total": a + b, "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}


def test_dapo_overlong_penalty_in_total(tmp_path, tiny_dirs, th):
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.dapo_overlong.enabled=true",
                   "methods.dapo_overlong.cache_len=4", "data.task=mcq")
    tr = GRPOTrainer(cfg, samples=th.image_samples(3), reward_fn=th.text_reward)
    hist, change = run(tr)
    rb = tr.state.batch
    L = rb.completion_mask.sum(1).double()  # max_len 6, cache 4: free up to 2 tokens, -1 at 6
    want = torch.where(L <= 2, torch.zeros_like(L), (2 - L) / 4)
    torch.testing.assert_close(rb.rewards["overlong"].double(), want)
    torch.testing.assert_close(rb.rewards["total"], rb.rewards["acc"] + rb.rewards["overlong"])
    assert (rb.rewards["overlong"][rb.truncated] == -1).all()
    assert change > 0 and "overlong/penalty_mean" in hist[-1]
    sane(hist[-1])


def test_seed_grpo_scales_advantages(tmp_path, tiny_dirs, th):
    # unparseable answers each in their own cluster: every group has SE = log G, so every advantage is (1 - alpha)
    # times the plain GRPO one
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.seed_grpo.enabled=true", "methods.seed_grpo.alpha=0.5",
                   "methods.seed_grpo.unparsed=own", "data.task=mcq")
    tr = GRPOTrainer(cfg, samples=th.image_samples(3), reward_fn=th.text_reward)
    hist, change = run(tr)
    rb = tr.state.batch
    r = rb.rewards["total"].double()
    plain = torch.zeros_like(r)
    for g in rb.group_ids.unique():
        s = rb.group_ids == g
        if r[s].max() > r[s].min():
            plain[s] = (r[s] - r[s].mean()) / (r[s].std() + 1e-4)
    torch.testing.assert_close(rb.advantages.double(), 0.5 * plain, atol=1e-6, rtol=1e-5)
    assert hist[-1]["seed/weight_mean"] == pytest.approx(0.5)
    assert hist[-1]["seed/entropy_mean"] == pytest.approx(math.log(4))


def test_gdpo_normalises_each_reward(tmp_path, tiny_dirs, th):
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.gdpo.enabled=true", "reward.weights={acc: 1.0, fmt: 2.0}",
                   "data.task=mcq", "algo.adv_eps=0.0001")
    tr = GRPOTrainer(cfg, samples=th.image_samples(3), reward_fn=two_rewards)
    hist, change = run(tr)
    rb = tr.state.batch
    summed = torch.zeros(rb.n, dtype=torch.float64)
    for key, w in (("acc", 1.0), ("fmt", 2.0)):
        x = rb.rewards[key].double()
        for g in rb.group_ids.unique():
            s = rb.group_ids == g
            if x[s].max() > x[s].min():
                summed[s] += w * (x[s] - x[s].mean()) / (x[s].std() + 1e-4)
    want = (summed - summed.mean()) / (summed.std() + 1e-4)
    torch.testing.assert_close(rb.advantages.double(), want.float().double(), atol=1e-5, rtol=1e-5)
    assert change > 0
    sane(hist[-1])


def test_entropy_logged_and_masked_tokens_get_no_gradient(tmp_path, tiny_dirs, th):
    from mmgrpo.vlm.methods.base import LossInputs, grpo_loss
    from mmgrpo.vlm.models.rollout import batch_to, collate_prompts, compute_token_logprobs

    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.entropy.enabled=true",
                   "methods.entropy.top_quantile=0.5", "data.task=mcq", "run.logprob_impl=naive")
    tr = GRPOTrainer(cfg, samples=th.image_samples(3), reward_fn=th.text_reward)
    tr.state.stream = tr.new_stream()
    rb = steps.collect(tr, 0)
    mbs = micro_batches(rb.group_ids, 8)
    steps.precompute(tr, rb, mbs)
    mask = rb.completion_mask.bool()
    # entropy vs the full logits of the same forward, independently through torch.distributions
    idx = mbs[0]
    T = max(1, int(rb.completion_mask[idx].sum(1).max()))
    batch = batch_to(collate_prompts([rb.items[i] for i in idx.tolist()], tr.pad_id), tr.device)
    ids, m = rb.completion_ids[idx, :T], rb.completion_mask[idx, :T]
    with torch.no_grad():
        _, logits = compute_token_logprobs(tr.model, batch, ids, m, tr.sampling.temperature,
                                           tr.policy.suppress_token_ids, return_logits=True)
    ref = torch.distributions.Categorical(logits=logits.float()).entropy() * m
    torch.testing.assert_close(rb.entropy[:, :T], ref.cpu(), atol=1e-4, rtol=1e-4)
    w = rb.token_weights[mask]
    assert set(w.unique().tolist()) <= {0.0, 1.0} and 0.5 <= float(w.mean()) < 1.0
    # the trainer's loss with these weights: a masked token gets exactly zero gradient
    tr.model.train()
    lp = tr.logprobs.rows(tr.model, rb, mbs[0]).float()
    lp.retain_grad()
    out = grpo_loss(LossInputs(lp, rb.old_logp[:, :T], rb.advantages, rb.completion_mask[:, :T],
                               token_weights=rb.token_weights[:, :T], algo=tr.cfg.algo))
    out.loss.backward()
    g = lp.grad
    kept = rb.token_weights[:, :T] > 0
    assert (g[mask[:, :T] & ~kept] == 0).all()
    assert (g[mask[:, :T] & kept & (rb.advantages[:, None] != 0)] != 0).any()
    hist, change = run(tr, 1)
    assert {"entropy/mean", "entropy/kept_frac"} <= set(hist[-1]) and change > 0


def test_entropy_with_shared_prefix_logprobs_matches_naive(tmp_path, tiny_dirs, th):
    ents = []
    for impl in ("naive", "prefix_group"):
        cfg = make_cfg(tmp_path / impl, tiny_dirs("qwen2_5_vl"), "methods.entropy.enabled=true", "data.task=mcq",
                       f"run.logprob_impl={impl}")
        tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
        tr.state.stream = tr.new_stream()
        rb = steps.collect(tr, 0)
        steps.precompute(tr, rb, micro_batches(rb.group_ids, 8))
        ents.append(rb.entropy)
    torch.testing.assert_close(ents[0], ents[1], atol=1e-4, rtol=1e-4)
    assert ents[0].abs().sum() > 0


def test_hybrid_cot_modes_and_format(tmp_path, tiny_dirs, th):
    from mmgrpo.vlm.data.prompts import SYSTEM_PROMPTS
    from mmgrpo.vlm.methods.hybrid_cot import mode_format_reward

    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.hybrid_cot.enabled=true", "data.prompt_mode=think",
                   "methods.hybrid_cot.think_fraction=0.5", "reward.weights={mcq: 1.0, format: 0.5}",
                   "data.task=mcq")
    tr = GRPOTrainer(cfg, samples=th.image_samples(4))
    hist, change = run(tr, 1)
    rb = tr.state.batch
    meth = next(m for m in tr.methods if m.name == "hybrid_cot")
    modes = [meth.modes[g] for g in rb.group_ids.tolist()]
    assert sorted(set(modes)) == ["no_think", "think"] and modes.count("think") == 4  # one of 2 groups
    for i, md in enumerate(modes):  # the prompt really asked for that mode
        assert SYSTEM_PROMPTS[md] in tr.task.processor.tokenizer.decode(rb.items[i]["input_ids"][0])
        assert rb.rewards["format"][i].item() == mode_format_reward(rb.texts[i], md)
    torch.testing.assert_close(rb.rewards["total"], rb.rewards["mcq"] + 0.5 * rb.rewards["format"])
    assert hist[-1]["hybrid/think_prob"] == 0.5


def test_difficulty_aug_perturbs_easy_and_hints_hard(tmp_path, tiny_dirs, th):
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.difficulty_aug.enabled=true",
                   "reward.weights={iou: 1.0}", "run.max_steps=3")  # the 2 steps below do not end the run
    tr = GRPOTrainer(cfg, samples=th.video_samples(2, frames=8))  # 4 s clips, event at 0.5-1.5 s
    meth = next(m for m in tr.methods if m.name == "difficulty_aug")
    meth.window.push(torch.tensor([0.5]))
    meth.last_mean.update({"v0": 1.0, "v1": 0.0})  # v0 easy (+0.5), v1 hard (-0.5): strength 1
    tr.state.stream = tr.new_stream()
    preps = tr.feed.prepare(tr.feed.draw(tr.state.stream), tr.samples, tr.state.counters)
    out = meth.before_rollout(0, list(preps))
    by_id = {pp.sample["id"]: (old, pp) for (_, old, _), (_, pp, _) in zip(preps, out)}
    old, new = by_id["v0"]
    changed = (new.clip.frames != old.clip.frames).flatten(1).any(1)
    assert changed.all() and not torch.equal(new.item["pixel_values_videos"], old.item["pixel_values_videos"])
    assert new.clip.timestamps == old.clip.timestamps  # the time axis is untouched
    old, new = by_id["v1"]
    hint = new.text.split("Hint: the event happens between ")[1].split(" seconds.")[0].split(" and ")
    lo, hi = float(hint[0]), float(hint[1])  # a window of half the clip holding the event
    assert hi - lo == pytest.approx(2.0, abs=0.01) and lo <= 0.5 and hi >= 1.5 and "Hint" not in old.text
    assert torch.equal(new.item["pixel_values_videos"], old.item["pixel_values_videos"])
    hist, change = run(tr, 2)  # trains end to end and records the groups' difficulty
    assert set(meth.last_mean) == {"v0", "v1"} and len(meth.window.means) == 3
    sd = meth.state_dict()
    meth.load_state_dict(sd)
    assert meth.state_dict() == sd


def test_ref_sync_mixes_reference_and_checkpoints_it(tmp_path, tiny_dirs, th):
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.ref_sync.enabled=true", "methods.ref_sync.sync_steps=2",
                   "methods.ref_sync.mixup_alpha=0.25", "algo.kl_coef=0.05", "data.task=mcq")
    tr = GRPOTrainer(cfg, samples=th.image_samples(3), reward_fn=th.text_reward)
    ref0 = {n: p.detach().clone() for n, p in tr.policy.ref_model.named_parameters()}
    names = set(trainable(tr))
    run(tr, 1)
    assert all(torch.equal(p, ref0[n]) for n, p in tr.policy.ref_model.named_parameters())  # update 1: no sync
    hist, _ = run(tr, 1)
    pol = trainable(tr)
    for n, p in tr.policy.ref_model.named_parameters():
        want = 0.25 * pol[n] + 0.75 * ref0[n] if n in names else ref0[n]
        torch.testing.assert_close(p.detach(), want, atol=1e-6, rtol=0)
    assert hist[-1]["ref_sync/syncs"] == 1.0
    meth = next(m for m in tr.methods if m.name == "ref_sync")
    sd = meth.state_dict()
    with torch.no_grad():
        for p in tr.policy.ref_model.parameters():
            p.zero_()
    meth.load_state_dict(sd)
    for n, p in tr.policy.ref_model.named_parameters():
        if n in names:
            torch.testing.assert_close(p.detach(), sd["reference"][n])


def test_ref_sync_refuses_without_kl(tmp_path, tiny_dirs, th):
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.ref_sync.enabled=true")
    with pytest.raises(ValueError, match="kl_coef"):
        GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)


def test_ref_sync_reference_survives_resume(tmp_path, tiny_dirs, th):
    over = ["methods.ref_sync.enabled=true", "methods.ref_sync.sync_steps=1", "algo.kl_coef=0.05", "data.task=mcq"]
    tr = GRPOTrainer(make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), *over), samples=th.image_samples(3),
                     reward_fn=th.text_reward)
    run(tr, 1)
    tr.save()
    ref1 = {n: p.detach().clone() for n, p in tr.policy.ref_model.named_parameters()}
    tr2 = GRPOTrainer(make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), *over, "run.resume_from=auto"),
                      samples=th.image_samples(3), reward_fn=th.text_reward)
    assert tr2._start()
    for n, p in tr2.policy.ref_model.named_parameters():
        assert torch.equal(p, ref1[n]), n
    assert next(m for m in tr2.methods if m.name == "ref_sync").syncs == 1


def test_gdpo_refuses_a_second_estimator(tmp_path, th):
    for extra in (["methods.ngrpo.enabled=true"], ["methods.tempsamp_r1.enabled=true"]):
        cfg = make_cfg(tmp_path, tmp_path / "no-model", "methods.gdpo.enabled=true", *extra)
        with pytest.raises(ValueError, match="gdpo"):
            GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)


def test_difficulty_aug_adds_noise_to_easy_images(tmp_path, tiny_dirs, th):
    cfg = make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "methods.difficulty_aug.enabled=true", "data.task=mcq")
    tr = GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)
    meth = next(m for m in tr.methods if m.name == "difficulty_aug")
    meth.window.push(torch.tensor([0.5]))
    meth.last_mean.update({"i0": 1.0, "i1": 0.5})  # i0 easy; i1 at the mean: unchanged
    tr.state.stream = tr.new_stream()
    preps = tr.feed.prepare(tr.feed.draw(tr.state.stream), tr.samples, tr.state.counters)
    out = meth.before_rollout(0, list(preps))
    for (_, old, _), (_, new, _) in zip(preps, out):
        same = torch.equal(new.item["pixel_values"], old.item["pixel_values"])
        assert same == (old.sample["id"] == "i1")
        assert new.images[0].size == old.images[0].size


def test_seed_grpo_refuses_a_task_without_clustering(tmp_path, th):
    cfg = make_cfg(tmp_path, tmp_path / "no-model", "methods.seed_grpo.enabled=true", "data.task=ocr")
    with pytest.raises(ValueError, match="seed_grpo"):
        GRPOTrainer(cfg, samples=th.image_samples(2), reward_fn=th.text_reward)


def test_disabled_methods_accept_any_config():
    """check_config runs for every registered method: a disabled wave-2 method must not refuse anything."""
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.vlm.methods import check_config
    from mmgrpo.utils.config import load_config

    cfg = load_config(TrainConfig, None, ["data.task=ocr", "data.prompt_mode=hybrid", "methods.tempsamp_r1.enabled=true",
                                          "methods.ngrpo.enabled=true", "methods.tempsamp_r1.mode=shape"])
    check_config(cfg)
