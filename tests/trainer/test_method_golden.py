"""The VLM methods moved onto hooks (``mmgrpo.vlm.methods``, issue #15 item 3) train exactly as the pre-refactor
trainer did: per-step losses, rewards, advantages and a parameter checksum of a short tiny run per method,
recorded ONCE by running the original code (``python tests/trainer/test_method_golden.py --record`` at commit
bedc303, before ``mmgrpo/vlm/methods`` existed) in ``fixtures/method_golden.json``. Compared within 1e-6 relative
(CPU, fp32, one process, same layout). Not a formula check (each method's kernel has its own hand-computed
tests): a guard that moving code did not change what the loop computes."""
import json
import math
import pathlib
import sys

import pytest
import torch

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "method_golden.json"

# name -> (config overrides, sample kind); 2 steps each, G=4, 2 prompts, 6 new tokens (conftest.make_cfg)
CASES = {
    "grpo": ([], "video"),
    "tempsamp_shape": (["methods.tempsamp_r1.enabled=true", "reward.weights={acc: 1.0}", "methods.tempsamp_r1.shape_reward=acc"], "video"),
    "tempsamp_anchor": (["methods.tempsamp_r1.enabled=true", "methods.tempsamp_r1.mode=anchor"], "video"),
    "tgrpo": (["methods.t_grpo.enabled=true", "methods.t_grpo.min_accuracy=0.0"], "video"),
    "twgrpo": (["methods.tw_grpo.enabled=true"], "video"),
    "tempsamp_tw_t": (["methods.tempsamp_r1.enabled=true", "methods.tempsamp_r1.shape_reward=total", "methods.tw_grpo.enabled=true", "methods.t_grpo.enabled=true",
                       "methods.t_grpo.min_accuracy=0.0"], "video"),
    "dapo": (["algo.filter_zero_std=true", "algo.filter_max_rounds=2", "algo.clip_high=0.28", "algo.agg=token_mean"],
             "video_dead"),
    "overlong_mask": (["rollout.mask_truncated_completions=true", "rollout.max_new_tokens=24"], "video"),
    "reg_grpo": (["algo.loss_type=reg"], "video"),
    "selection_variance": (["methods.selection.enabled=true", "methods.selection.num_inferences=3", "methods.selection.criterion=variance",
                            "run.max_steps=3", "methods.selection.refilter_every_epoch=true"], "image"),
    "iter2_kl": (["algo.num_iterations=2", "algo.kl_coef=0.05"], "video"),
}


def run_case(name, tmp_path, model_dir, th):
    from mmgrpo.vlm.train.trainer import GRPOTrainer

    over, kind = CASES[name]
    cfg = th.make_cfg(tmp_path, model_dir, *over)
    samples = th.image_samples(4) if kind == "image" else th.video_samples(3)

    def reward(texts, samples):  # "video_dead": sample v1's group has constant rewards (DAPO drops and refills)
        out = th.text_reward(texts, samples)
        if kind == "video_dead":
            dead = torch.tensor([s["id"] == "v1" for s in samples])
            out["total"] = torch.where(dead, torch.zeros_like(out["total"]), out["total"])
        return out

    tr = GRPOTrainer(cfg, samples=samples, reward_fn=reward)
    hist = tr.train()
    params = sorted((n, p.detach().double()) for n, p in tr.model.named_parameters() if p.requires_grad)
    rb = tr.state.batch
    return {
        "loss": [h.get("train/loss") for h in hist],
        "reward": [h.get("reward/total/mean") for h in hist],
        "adv_abs": [h.get("advantages/abs_mean") for h in hist],
        "param_sum": float(sum(p.sum() for _, p in params)),
        "param_abs": float(sum(p.abs().sum() for _, p in params)),
        "param_sq": float(sum((p * p).sum() for _, p in params)),
        "last_adv": rb.advantages.double().tolist() if rb.advantages is not None else None,
        "last_used": rb.reward_used.double().tolist() if rb.reward_used is not None else None,
        "rounds": [h.get("data/sampling_rounds") for h in hist],
        "last_tw": (None if rb.token_weights is None else float(rb.token_weights.double().sum())),
    }


def _close(a, b, rel=1e-6):
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b))
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-9)


@pytest.mark.parametrize("name", sorted(CASES))
def test_refactored_methods_reproduce_the_original_trainer(name, tmp_path, tiny_dirs, th):
    want = json.loads(FIXTURE.read_text())[name]
    got = run_case(name, tmp_path, tiny_dirs("qwen2_5_vl"), th)
    bad = {k: (got[k], want[k]) for k in want if not _close(got[k], want[k])}
    assert not bad, bad


if __name__ == "__main__" and "--record" in sys.argv:  # run once on the pre-refactor code
    import tempfile

    torch.set_num_threads(1)
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    import conftest
    from mmgrpo.vlm.models.tiny import save_tiny_model

    import types

    th = types.SimpleNamespace(video_samples=conftest.video_samples, image_samples=conftest.image_samples,
                               text_reward=conftest.text_reward, make_cfg=conftest.make_cfg,
                               trainable=conftest.trainable)
    root = pathlib.Path(tempfile.mkdtemp())
    model_dir = save_tiny_model(root / "qwen2_5_vl", "qwen2_5_vl")
    out = {}
    for name in sorted(CASES):
        out[name] = run_case(name, root / name, model_dir, th)
        print(name, out[name]["loss"], out[name]["param_sum"], flush=True)
    FIXTURE.write_text(json.dumps(out, indent=1) + "\n")
