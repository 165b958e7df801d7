"""DanceGRPO best-of-n as a train-mask method (flow_grpo.methods.best_of_n): a hand-computed golden case, the
split-group case through a two-"process" gather, option errors, and a tiny trainer run end to end."""
from types import SimpleNamespace

import pytest
import torch

from flow_grpo.methods.base import CreditInputs
from flow_grpo.methods.best_of_n import BestOfN, best_of_n_mask


def _cfg(n, drop_zero=False):
    return SimpleNamespace(optim=SimpleNamespace(best_of_n=n, drop_zero_adv=drop_zero))


def _inputs(gids, mask, gather=None):
    n = len(gids)
    kw = {} if gather is None else {"gather": gather}
    return CreditInputs(rewards={}, group_ids=torch.tensor(gids), valid=torch.ones(n, dtype=torch.bool),
                        train_mask=mask, step_indices=torch.arange(mask.shape[1]), sigmas=torch.zeros(mask.shape[1]),
                        **kw)


def test_keeps_top_and_bottom_half_of_each_group_by_hand():
    # group 0: advantages (per sample, equal over its 2 steps) 0.5, -1.2, 2.0, 0.1, -0.3, 1.0 -> n=4 keeps the two
    # highest (2.0 #2, 1.0 #5) and the two lowest (-1.2 #1, -0.3 #4); group 1 has 3 candidates <= 4: all kept;
    # sample 9 (no trained step: invalid) is no candidate and stays untrained.
    a = torch.tensor([0.5, -1.2, 2.0, 0.1, -0.3, 1.0, 0.7, -0.7, 0.0, 3.0])
    adv = a.unsqueeze(1).expand(10, 2).clone()
    mask = torch.ones(10, 2, dtype=torch.bool)
    mask[9] = False
    gids = [0, 0, 0, 0, 0, 0, 1, 1, 1, 1]
    got = best_of_n_mask(_cfg(4), adv, mask, _inputs(gids, mask))
    assert got[:, 0].tolist() == [False, True, True, False, True, True, True, True, True, False]
    assert torch.equal(got[:, 0], got[:, 1])
    # n=2: one of each end; per-step credits rank by the mean over the trained steps
    adv2 = torch.tensor([[1.0, -3.0], [0.0, 0.0], [2.0, 2.0], [-0.5, -0.5]])  # means -1, 0, 2, -0.5
    m2 = torch.ones(4, 2, dtype=torch.bool)
    got2 = best_of_n_mask(_cfg(2), adv2, m2, _inputs([7, 7, 7, 7], m2))
    assert got2[:, 0].tolist() == [True, False, True, False]


def test_ranks_a_group_split_across_processes_on_the_gathered_batch():
    # the 6 samples of group 0 live on two "processes" (rows 0-2 here, 3-5 there); gather returns all rows and
    # the slice of ours; ranking must use all six: here the global top (2.0) is on the other process.
    other_adv, other_gid = torch.tensor([2.0, -5.0, 0.2]), torch.tensor([0, 0, 0])
    ours = torch.tensor([1.0, 0.0, -1.0])

    def gather(ts):
        key, has, gid = ts
        return [torch.cat([key, other_adv.double()]), torch.cat([has, torch.ones(3, dtype=torch.bool)]),
                torch.cat([gid, other_gid])], slice(0, 3)

    mask = torch.ones(3, 1, dtype=torch.bool)
    got = best_of_n_mask(_cfg(2), ours.unsqueeze(1), mask, _inputs([0, 0, 0], mask, gather))
    assert got[:, 0].tolist() == [False, False, False]  # top 2.0 and bottom -5.0 are both on the other process
    got4 = best_of_n_mask(_cfg(4), ours.unsqueeze(1), mask, _inputs([0, 0, 0], mask, gather))
    assert got4[:, 0].tolist() == [True, False, True]  # top two 2.0, 1.0; bottom two -5.0, -1.0


@pytest.mark.parametrize("n", [3, -2])
def test_refuses_odd_or_negative_n(n):
    with pytest.raises(ValueError, match="optim.best_of_n"):
        BestOfN.check(_cfg(n))


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_tiny_trainer_trains_only_the_extremes_of_each_group(kind, tmp_path, monkeypatch):
    from ..conftest import make_trainer

    tr = make_trainer(kind, "flow", tmp_path, **{"optim.best_of_n": 2, "data.group_size": 4,
                                                  "sample.batch_size": 8, "sample.cfg": "false"})
    try:
        import flow_grpo.train.steps as S

        seen = {}
        orig = S.advantages

        def adv_fn(run, traj):
            seen["adv"], st = orig(run, traj)
            return seen["adv"], st

        monkeypatch.setattr(S, "advantages", adv_fn)
        m = tr.train()[-1]
        last = tr.state.last_traj
        trained = last.train_mask.any(1)
        a = seen["adv"][:, 0]
        assert m["actual_batch_size"] == 4.0 and int(trained.sum()) == 4  # 2 of 4 in each of the 2 groups
        for g in last.group_ids.unique():
            idx = torch.nonzero(last.group_ids == g).flatten()
            want = {int(idx[a[idx].argmax()]), int(idx[a[idx].argmin()])}
            assert set(torch.nonzero(trained[idx]).flatten().add(idx[0]).tolist()) == want
    finally:
        tr.close()
    with pytest.raises(ValueError, match="optim.best_of_n"):
        make_trainer("sd3", "flow", tmp_path / "bad", **{"optim.best_of_n": 3})
