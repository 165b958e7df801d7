"""PaCo log-tamed aggregation (flow_grpo.methods.log_tamed): in a tiny trainer run the training reward is the
weighted sum with every component whose coefficient of variation exceeds delta replaced by log(1 + R); by hand."""
import torch


def test_tiny_trainer_log_tamed_reward(tmp_path, monkeypatch):
    import flow_grpo.train.steps as S

    from ..conftest import block_reward, make_trainer

    def spread(images, prompts, metadata):  # a component with a large coefficient of variation
        return {"spread": 10.0 * block_reward(images, prompts, metadata)["block"] ** 4}

    tr = make_trainer("sd3", "flow", tmp_path, rewards={"block": block_reward, "spread": spread}, **{
        "reward.weights": "{block: 1.0, spread: 0.5}", "methods.log_tamed.enabled": "true",
        "methods.log_tamed.delta": "mean", "sample.cfg": "false"})
    seen = {}
    orig = S.advantages

    def adv_fn(run, traj):
        seen.update({k: v.clone() for k, v in traj.rewards.items()})
        return orig(run, traj)

    monkeypatch.setattr(S, "advantages", adv_fn)
    try:
        m = tr.train()[-1]
        a, b = seen["block"].double(), seen["spread"].double()
        ha = float(a.std(unbiased=False) / a.mean())
        hb = float(b.std(unbiased=False) / b.mean())
        thr = (ha + hb) / 2
        ta = torch.log1p(a) if ha > thr else a
        tb = torch.log1p(b) if hb > thr else b
        assert hb > ha and m["log_tamed/tamed/spread"] == 1.0 and m["log_tamed/tamed/block"] == 0.0
        assert torch.allclose(seen["total"].double(), ta + 0.5 * tb, atol=1e-6)
        assert abs(m["log_tamed/cv/block"] - ha) < 1e-6
    finally:
        tr.close()
