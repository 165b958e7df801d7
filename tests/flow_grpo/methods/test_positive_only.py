"""Positive-only training (flow_grpo.methods.positive_only): the mask by hand, and a tiny trainer run in which only
the samples with a positive advantage are trained (and the update still happens)."""
import torch

from flow_grpo.methods.positive_only import positive_mask


def test_mask_by_hand():
    # per-step advantages of 4 samples over 3 trained steps; sample 3 has no trained step
    adv = torch.tensor([[0.5, 0.5, 0.5], [-1.0, -1.0, -1.0], [0.0, 0.0, 0.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[True, True, False], [True, True, True], [True, False, True], [False, False, False]])
    got = positive_mask(adv, mask)
    assert got.tolist() == [[True, True, False], [False, False, False], [False, False, False],
                            [False, False, False]]
    # per-step credits: positive at one trained step is enough; a positive value on an untrained step is not
    adv2 = torch.tensor([[-0.2, 0.3], [0.4, -0.1]])
    mask2 = torch.tensor([[True, True], [False, True]])
    assert positive_mask(adv2, mask2).tolist() == [[True, True], [False, False]]


def test_tiny_trainer_trains_only_positive_samples(tmp_path, monkeypatch):
    from ..conftest import make_trainer

    tr = make_trainer("sd3", "flow", tmp_path, **{"methods.positive_only.enabled": "true", "data.group_size": 4,
                                                  "sample.batch_size": 8, "sample.cfg": "false"})
    try:
        import flow_grpo.train.steps as S

        assert [m.name for m in tr.methods][-1] == "positive_only"
        seen = {}
        orig = S.advantages

        def adv_fn(run, traj):
            seen["adv"], st = orig(run, traj)
            return seen["adv"], st

        monkeypatch.setattr(S, "advantages", adv_fn)
        before = [p.detach().clone() for p in tr.params]
        m = tr.train()[-1]
        trained = tr.state.last_traj.train_mask.any(1)
        positive = (seen["adv"] > 0).any(1)
        assert torch.equal(trained, positive) and 0 < int(trained.sum()) < len(trained)
        assert m["positive_only/kept_frac"] == float(positive.float().mean())
        assert m["actual_batch_size"] == float(positive.sum())
        assert any(not torch.equal(a, p) for a, p in zip(before, tr.params))  # the update was applied
    finally:
        tr.close()
