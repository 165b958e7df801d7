"""The flow method registry (flow_grpo.methods): lookups, the outcome / TP-GRPO credits against hand-computed
values, a credit added at run time driving a tiny trainer (no recipe edit needed), the recipe naming no method and
never probing one for a hook, and the options that moved into ``methods`` failing with their new name."""
import ast
import pathlib

import pytest
import torch

from flow_grpo.config import TrainConfig, load_train_config
from flow_grpo.methods import (GENERIC_PLANS, REGISTRY, MethodSpec, credit_method, credit_names, credit_of,
                               enabled_names, plan_names)
from flow_grpo.methods.base import AdvOptions, CreditInputs, CreditOutput, FlowMethod
from mmgrpo.engine.method import Method

RECIPE = [pathlib.Path(__file__).parents[3] / "flow_grpo" / f"{m}.py"
          for m in ("train/trainer", "train/steps", "build", "checkpoint", "evaluation", "epoch_metrics", "sampler")]


def _inputs(rewards, gids, mask, opts, step_rewards=None):
    n = len(gids)
    return CreditInputs(rewards={"total": torch.tensor(rewards)}, group_ids=torch.tensor(gids),
                        valid=torch.ones(n, dtype=torch.bool), train_mask=mask,
                        step_indices=torch.arange(mask.shape[1]), sigmas=torch.zeros(mask.shape[1]), opts=opts,
                        step_rewards=step_rewards)


def _cfg(*overrides):
    return load_train_config(None, list(overrides))


def test_lookups():
    assert {"outcome", "per_reward", "tp_grpo", "g2rpo", "nft", "branch_grpo", "b2_diffurl"} <= set(credit_names())
    assert plan_names()[:4] == list(GENERIC_PLANS) == ["all", "fraction", "window", "single"]
    assert {"tree", "b2", "nft"} <= set(plan_names())
    assert credit_of(_cfg("reward.mode=per_reward")) == "per_reward" and credit_of(_cfg("sample.credit=tp_grpo")) \
        == "tp_grpo"
    assert enabled_names(_cfg("method=b2")) == ["drop_zero_adv", "b2_diffurl"]
    names = [s.name for s in REGISTRY]
    assert len(set(names)) == len(names)
    from flow_grpo.methods import _load

    for s in REGISTRY:
        cls = _load(s.target)
        assert issubclass(cls, FlowMethod) and issubclass(cls, Method) and cls.name == s.name and s.help
    from flow_grpo.config import SamplingConfig

    with pytest.raises(ValueError, match="sample.credit='nope': expected one of outcome"):
        credit_method(TrainConfig(sample=SamplingConfig(credit="nope")))


def test_outcome_credit_by_hand():
    # group 0 rewards 1, 2, 3: mean 2, Bessel std 1 -> A = -1, 0, 1 (eps 0); group 1: 10, 10, 13: mean 11, std
    # sqrt(3) -> A = -1/sqrt3, -1/sqrt3, 2/sqrt3. Every trained step of a sample gets its advantage.
    mask = torch.ones(6, 2, dtype=torch.bool)
    est = credit_method(_cfg()).advantage_estimator()
    out = est(_inputs([1.0, 2, 3, 10, 10, 13], [0, 0, 0, 1, 1, 1], mask, AdvOptions("group", 5.0, 0.0, True)))
    r3 = 3 ** 0.5
    want = torch.tensor([-1.0, 0.0, 1.0, -1 / r3, -1 / r3, 2 / r3])
    assert torch.allclose(out.advantages, want.unsqueeze(1).expand(6, 2), atol=1e-6)


def test_tp_grpo_credit_scatters_window_steps_to_their_columns():
    # one group of 2, window of n=1 step at column 1 (sample 0) and column 0 (sample 1); R = [R_0, R_1]:
    # sample 0 rises 0 -> 1, sample 1 stays 0 -> 0 (no turning point: delta 0), so the per-step rewards are the
    # plain differences 1 and 0 -> group z-scores (population std 0.5, eps 1e-4): +-0.5/0.5001
    mask = torch.tensor([[False, True], [True, False]])
    R = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    est = credit_method(_cfg("sample.credit=tp_grpo")).advantage_estimator()
    out = est(_inputs([1.0, 0.0], [0, 0], mask, AdvOptions("group", 5.0, 1e-4, False), step_rewards=R))
    a = 0.5 / 0.5001
    assert torch.allclose(out.advantages, torch.tensor([[0.0, a], [-a, 0.0]]), atol=1e-6)


class RankSign(FlowMethod):
    """Test-only credit: +1 above the group mean, -1 below."""

    name = "test_rank_sign"
    seen: dict = {}

    def advantage_estimator(self):
        def rank_sign(inp: CreditInputs) -> CreditOutput:
            r, g = inp.rewards["total"], inp.group_ids
            med = torch.stack([r[g == x].mean() for x in g])
            self.seen["called"] = True
            return CreditOutput(torch.sign(r - med).unsqueeze(1).expand_as(inp.train_mask).clone(),
                                {"adv/custom": 1.0})

        return rank_sign


def test_a_credit_added_at_run_time_trains_through_the_unchanged_recipe(tmp_path, monkeypatch):
    import flow_grpo.methods as fm

    from ..conftest import make_trainer

    monkeypatch.setattr(fm, "REGISTRY", fm.REGISTRY + (MethodSpec("test_rank_sign", RankSign, "test", credit=True),))
    tr = make_trainer("sd3", "fast", tmp_path, **{"sample.credit": "test_rank_sign", "sample.cfg": "false"})
    try:
        m = tr.train()[-1]
    finally:
        tr.close()
    assert RankSign.seen["called"] and m["adv/custom"] == 1.0 and m["adv/mean_abs"] == 1.0
    assert m["steps/applied"] == 1.0


@pytest.mark.parametrize("path", RECIPE, ids=lambda p: p.name)
def test_the_recipe_names_no_method_and_probes_no_hook(path):
    """No method name in the code of the recipe (docstrings and messages may give examples); no ``hasattr`` /
    ``getattr`` with a default on a method (every hook exists on every method)."""
    tree = ast.parse(path.read_text())
    words = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    words |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names = {s.name for s in REGISTRY} - {"outcome"}  # "outcome" is also the name of the sampler's default
    assert not words & names, sorted(words & names)
    loops = [n for n in ast.walk(tree)
             if isinstance(n, (ast.For, ast.comprehension)) and "methods" in ast.unparse(n.iter)]
    bound = {x.id for n in loops for x in ast.walk(n.target) if isinstance(x, ast.Name)} | {"credit", "method"}
    probes = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
              and (n.func.id == "hasattr" or (n.func.id == "getattr" and len(n.args) == 3))
              and isinstance(n.args[0], ast.Name) and n.args[0].id in bound]
    assert not probes, f"{path.name}: a method probed with hasattr / getattr at lines {probes}"


@pytest.mark.parametrize("old,new", [("sample.nft_beta=0.5", "methods.nft.beta"),
                                     ("sample.tree_branching=3", "methods.branch_grpo.branching"),
                                     ("sample.b2_history=2", "methods.b2_diffurl.history"),
                                     ("sample.vgpo_tau=0.2", "methods.vgpo.tau"),
                                     ("sample.granularities=[1,3]", "methods.g2rpo.granularities")])
def test_a_moved_option_is_an_error_naming_its_new_place(old, new):
    with pytest.raises(ValueError, match=f"'{old.split('=')[0]}' moved: it is now '{new}'"):
        _cfg(old)


def test_a_plan_of_a_method_needs_its_credit():
    from flow_grpo.config import SamplingConfig
    from flow_grpo.methods.plans import make_step_plan

    with pytest.raises(ValueError, match="step_mode=tree is the sampling plan of branch_grpo: set "
                                         "sample.credit=branch_grpo"):
        make_step_plan(SamplingConfig(step_mode="tree"), [0, 1], members=[0, 1])
    from flow_grpo.methods import check_config

    with pytest.raises(ValueError, match="sample.step_mode='nope'"):
        check_config(_cfg("sample.step_mode=nope"))
