"""PAR (flow_grpo.methods.par): in a tiny trainer run the training reward is sigmoid((r - r_ref) / tau), r_ref the
mean reward of the prompt's first group; recomputed by hand."""
import math

import torch


def test_tiny_trainer_par_reward(tmp_path, monkeypatch):
    import flow_grpo.train.steps as S

    from ..conftest import block_reward, make_trainer

    tr = make_trainer("sd3", "flow", tmp_path, rewards={"block": block_reward}, **{
        "methods.par.enabled": "true", "methods.par.tau": 0.01, "data.group_size": 4, "run.num_epochs": 2,
        "sample.cfg": "false"})
    seen = []
    orig = S.advantages

    def adv_fn(run, traj):
        seen.append(({k: v.clone() for k, v in traj.rewards.items()}, list(traj.prompts)))
        return orig(run, traj)

    monkeypatch.setattr(S, "advantages", adv_fn)
    try:
        tr.train()
        ref = {}
        for rewards, prompts in seen:
            r = rewards["proxy_total"].double()
            for p in dict.fromkeys(prompts):  # a prompt's first group gives its reference
                if p not in ref:
                    idx = [i for i, q in enumerate(prompts) if q == p]
                    ref[p] = sum(float(r[i]) for i in idx) / len(idx)
            want = [1 / (1 + math.exp(-(float(r[i]) - ref[p]) / 0.01)) for i, p in enumerate(prompts)]
            assert torch.allclose(rewards["total"].double(), torch.tensor(want, dtype=torch.float64), atol=1e-6)
        par = next(m for m in tr.methods if m.name == "par")
        assert len(par.state_dict()["ref"]) == len(ref)
    finally:
        tr.close()
