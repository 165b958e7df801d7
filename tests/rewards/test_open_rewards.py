"""Open rewards of ``mmgrpo train`` (mmgrpo.vlm.rewards.open / judge): user rewards by import path, the judge's
template and never-raising parser (values by hand), and both in the tiny trainer."""
import math
import types

import pytest
import torch

from mmgrpo.vlm.rewards.judge import JudgeReward, judge_fields, parse_score
from mmgrpo.vlm.rewards.registry import build_rewards

USER_MODULE = '''
def make(scale=1.0):
    def reward(completions, samples):
        return [scale * len(c) for c in completions]
    return reward

def make_dict():
    return lambda completions, samples: {"score": [1.0] * len(completions), "chars": [len(c) for c in completions]}
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_h38.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards_h38"


def _rc(weights, kwargs=None, accuracy_key="auto"):
    return types.SimpleNamespace(weights=weights, kwargs=kwargs or {}, options={}, parse_mode="lenient",
                                 accuracy_key=accuracy_key)


@pytest.mark.parametrize("reply, want", [
    ("Score: 7", 0.7), ("score=10", 1.0), ("SCORE : 0", 0.0), ("I think 5.", 0.5), ("Score: 2.5 out of 10", 0.25),
    ("Score: 11", None), ("Score: -1", None), ("no number", None), ("", None), (None, None), (3, None),
])
def test_parse_score_by_hand_never_raises(reply, want):
    got = parse_score(reply, 10)
    assert got == (pytest.approx(want) if want is not None else None)


def test_parse_score_strict_needs_the_score_line():
    assert parse_score("I think 5.", 10, lenient=False) is None
    assert parse_score("blah Score: 4 and 9", 10, lenient=False) == pytest.approx(0.4)


def test_judge_template_fields_batches_and_counts_failures():
    calls = []

    def gen(prompts):
        calls.append(len(prompts))
        return ["Score: 8" if "Paris" in p else "dunno" for p in prompts]

    j = JudgeReward(generate=gen, template="Q={query} R={reference} A={answer} /{scale}", batch_size=2,
                    on_parse_failure=0.0)
    samples = [{"query": "capital?", "answer": "Paris"}] * 3
    comps = ["<think>x</think><answer>Paris</answer>", "Lyon", "<answer>Rome</answer>"]
    assert j.prompts(comps, samples)[0] == "Q=capital? R=Paris A=Paris /10"
    out = j(comps, samples)
    # every prompt holds the reference "Paris", so all three replies parse: 8/10
    assert out["score"] == [0.8, 0.8, 0.8] and calls == [2, 1] and j.parse_failures == 0
    j2 = JudgeReward(generate=gen, template="A={answer}", on_parse_failure=float("nan"))
    out = j2(comps, samples)
    assert out["score"][0] == 0.8 and math.isnan(out["score"][1]) and out["judge/parse_failed"] == [0., 1., 1.]
    assert j2.parse_failures == 2 and j2.replies == 3
    assert judge_fields(None, {})["answer"] == ""


def test_judge_refuses_a_bad_template_and_a_missing_model():
    with pytest.raises(ValueError, match="template"):
        JudgeReward(generate=lambda p: p, template="{question}")
    with pytest.raises(ValueError, match="reward.kwargs.judge.model"):
        JudgeReward()


def test_user_reward_by_import_path_adds_to_total(user_module):
    fn, _ = build_rewards(_rc({"format_loose": 0.5, f"{user_module}:make": 2.0},
                              {f"{user_module}:make": {"scale": 0.1}}), "mcq", "qwen2_5_vl", None)
    samples = [{"id": "a", "task": "mcq", "options": ["x", "y"], "answer": "A"}] * 2
    out = fn(["<answer>A</answer>", "abcd"], samples)
    # user reward = 0.1 * len; format_loose = 1 for a closed answer block
    torch.testing.assert_close(out[f"{user_module}:make"], torch.tensor([1.8, 0.4]))
    torch.testing.assert_close(out["total"], torch.tensor([0.5 * 1 + 2 * 1.8, 0.5 * 0 + 2 * 0.4]))
    assert out["parse_failed"].tolist() == [False, True]
    fn, _ = build_rewards(_rc({f"{user_module}:make_dict": 1.0}), "mcq", "qwen2_5_vl", None)
    out = fn(["ab", "abc"], samples)
    assert out["total"].tolist() == [1.0, 1.0] and out[f"{user_module}:make_dict/chars"].tolist() == [2.0, 3.0]


def test_bad_import_paths_and_kwargs_name_the_setting(user_module):
    with pytest.raises(ValueError, match="no attribute"):
        build_rewards(_rc({f"{user_module}:nope": 1.0}), "mcq", "qwen2_5_vl", None)
    with pytest.raises(ValueError, match="cannot import"):
        build_rewards(_rc({"no_such_mod_h38:f": 1.0}), "mcq", "qwen2_5_vl", None)
    with pytest.raises(ValueError, match="reward.kwargs"):
        build_rewards(_rc({f"{user_module}:make": 1.0}, {"judge": {}}), "mcq", "qwen2_5_vl", None)


def test_help_says_an_import_path_runs_user_code():
    from mmgrpo.vlm.config import RewardConfig
    import dataclasses

    h = {f.name: f.metadata["help"] for f in dataclasses.fields(RewardConfig)}
    assert "IMPORTS AND RUNS THAT CODE" in h["weights"] and "package.module:factory" in h["weights"]

