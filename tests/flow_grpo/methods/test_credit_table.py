"""The flow credit table (flow_grpo.methods): lookups, the outcome / TP-GRPO rows against hand-computed values,
the plan table, and a credit registered at run time driving a tiny trainer (no trainer edit needed)."""
import pytest
import torch

from flow_grpo.methods import CREDITS, PLANS, AdvOptions, Credit, CreditInputs, CreditOutput, credit_name, get_credit


def _inputs(rewards, gids, mask, opts, step_rewards=None):
    n = len(gids)
    return CreditInputs(rewards={"total": torch.tensor(rewards)}, group_ids=torch.tensor(gids),
                        valid=torch.ones(n, dtype=torch.bool), train_mask=mask,
                        step_indices=torch.arange(mask.shape[1]), sigmas=torch.zeros(mask.shape[1]), opts=opts,
                        step_rewards=step_rewards)


def test_lookups():
    assert {"outcome", "per_reward", "tp_grpo", "g2rpo"} <= set(CREDITS)
    assert list(PLANS)[:4] == ["all", "fraction", "window", "single"]
    assert credit_name("outcome", "per_reward") == "per_reward" and credit_name("tp_grpo", "weighted_sum") == "tp_grpo"
    with pytest.raises(ValueError, match="unknown credit 'nope': outcome"):
        get_credit("nope")
    with pytest.raises(ValueError, match="registered twice"):
        from flow_grpo.methods import register_credit
        register_credit(Credit("outcome", lambda inp: None))


def test_outcome_row_by_hand():
    # group 0 rewards 1, 2, 3: mean 2, Bessel std 1 -> A = -1, 0, 1 (eps 0); group 1: 10, 10, 13: mean 11, std
    # sqrt(3) -> A = -1/sqrt3, -1/sqrt3, 2/sqrt3. Every trained step of a sample gets its advantage.
    mask = torch.ones(6, 2, dtype=torch.bool)
    out = get_credit("outcome").advantages(_inputs([1.0, 2, 3, 10, 10, 13], [0, 0, 0, 1, 1, 1], mask,
                                                   AdvOptions("group", 5.0, 0.0, True)))
    r3 = 3 ** 0.5
    want = torch.tensor([-1.0, 0.0, 1.0, -1 / r3, -1 / r3, 2 / r3])
    assert torch.allclose(out.advantages, want.unsqueeze(1).expand(6, 2), atol=1e-6)


def test_tp_grpo_row_scatters_window_steps_to_their_columns():
    # one group of 2, window of n=1 step at column 1 (sample 0) and column 0 (sample 1); R = [R_0, R_1]:
    # sample 0 rises 0 -> 1, sample 1 stays 0 -> 0 (no turning point: delta 0), so the per-step rewards are the
    # plain differences 1 and 0 -> group z-scores (population std 0.5, eps 1e-4): +-0.5/0.5001
    mask = torch.tensor([[False, True], [True, False]])
    R = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    out = get_credit("tp_grpo").advantages(_inputs([1.0, 0.0], [0, 0], mask, AdvOptions("group", 5.0, 1e-4, False),
                                                   step_rewards=R))
    a = 0.5 / 0.5001
    assert torch.allclose(out.advantages, torch.tensor([[0.0, a], [-a, 0.0]]), atol=1e-6)


def test_a_credit_registered_at_run_time_trains_through_the_unchanged_trainer(tmp_path):
    from ..conftest import make_trainer

    seen = {}

    def rank_sign(inp: CreditInputs) -> CreditOutput:  # +1 above the group mean, -1 below (test-only credit)
        r, g = inp.rewards["total"], inp.group_ids
        med = torch.stack([r[g == x].mean() for x in g])
        seen["called"] = True
        return CreditOutput(torch.sign(r - med).unsqueeze(1).expand_as(inp.train_mask).clone(), {"adv/custom": 1.0})

    CREDITS["test_rank_sign"] = Credit("test_rank_sign", rank_sign)
    try:
        tr = make_trainer("sd3", "fast", tmp_path, **{"sample.credit": "test_rank_sign", "sample.cfg": "false"})
        try:
            m = tr.train()[-1]
        finally:
            tr.close()
    finally:
        del CREDITS["test_rank_sign"]
    assert seen["called"] and m["adv/custom"] == 1.0 and m["adv/mean_abs"] == 1.0 and m["steps/applied"] == 1.0
