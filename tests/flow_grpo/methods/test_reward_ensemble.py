"""Reward-model ensembles (flow_grpo.methods.reward_ensemble): in a tiny trainer run the training reward is the
worst case / the uncertainty-weighted mean of the members, standardised with the first batch's statistics,
recomputed here by hand from the members' scores."""
import pytest
import torch


def _run(tmp_path, monkeypatch, mode):
    import flow_grpo.train.steps as S

    from ..conftest import block_reward, brightness_reward, make_trainer

    tr = make_trainer("sd3", "flow", tmp_path, rewards={"block": block_reward, "brightness": brightness_reward}, **{
        "reward.weights": "{block: 1.0, brightness: 0.0}", "methods.reward_ensemble.members": "[block, brightness]",
        "methods.reward_ensemble.mode": mode, "methods.reward_ensemble.lam": 0.5,
        "methods.reward_ensemble.normalize": "true", "sample.cfg": "false"})
    seen = {}
    orig = S.advantages

    def adv_fn(run, traj):
        seen.update({k: v.clone() for k, v in traj.rewards.items()})
        return orig(run, traj)

    monkeypatch.setattr(S, "advantages", adv_fn)
    try:
        tr.train()
        return seen, next(m for m in tr.methods if m.name == "reward_ensemble").norm
    finally:
        tr.close()


@pytest.mark.parametrize("mode", ["worst_case", "uncertainty"])
def test_tiny_trainer_ensemble_reward(tmp_path, monkeypatch, mode):
    r, norm = _run(tmp_path, monkeypatch, mode)
    a, b = r["block"].double(), r["brightness"].double()
    za = (a - a.mean()) / a.std(unbiased=False)  # the first batch's population statistics
    zb = (b - b.mean()) / b.std(unbiased=False)
    assert norm["block"][0] == pytest.approx(float(a.mean()))
    if mode == "worst_case":
        want = torch.minimum(za, zb)
    else:  # mean - 0.5 * population variance of the two members = (za + zb) / 2 - 0.5 * ((za - zb) / 2)^2
        want = (za + zb) / 2 - 0.5 * ((za - zb) / 2) ** 2
    assert torch.allclose(r["total"].double(), want, atol=1e-5)
    assert torch.allclose(r["proxy_total"].double(), a, atol=1e-6)  # the weighted total it replaced


def test_members_must_be_scored(tmp_path):
    from flow_grpo.config import load_train_config
    from flow_grpo.methods import check_config

    from ..conftest import train_overrides

    cfg = load_train_config(None, train_overrides("sd3", "flow", tmp_path, **{
        "reward.weights": "{block: 1.0}", "methods.reward_ensemble.members": "[block, other]"}))
    with pytest.raises(ValueError, match="other"):
        check_config(cfg)
