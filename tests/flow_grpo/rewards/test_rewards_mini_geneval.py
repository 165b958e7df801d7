"""The registered ``mini_geneval`` reward wraps the benchmark's verifier (strict + partial)."""
import numpy as np
import pytest
import torch

from flow_grpo.rewards import MultiReward, RewardError, build_reward
from flow_grpo.rewards.mini_geneval import load_synthetic_t2i

S = load_synthetic_t2i()


def test_mini_geneval_reward_strict_and_partial():
    metas = [S.parse_prompt(p) for p in ("two red circles", "a blue square on the left of a green triangle",
                                         "a yellow circle")]
    good = [S.render(m, 64, seed=i) for i, m in enumerate(metas)]
    blank = np.full((64, 64, 3), 255, np.uint8)
    # wrong: render the prompt with swapped relation for sample 1, and a red circle instead of yellow for 2
    swapped = S.render(S.parse_prompt("a blue square on the right of a green triangle"), 64, seed=1)
    wrong_color = S.render(S.parse_prompt("a red circle"), 64, seed=2)
    imgs = np.stack([good[0], good[1], good[2], blank, swapped, wrong_color])
    md = metas + [metas[0], metas[1], metas[2]]
    prompts = [m["prompt"] for m in md]
    out = build_reward("mini_geneval")(imgs, prompts, md)
    assert out["mini_geneval"].tolist() == [1, 1, 1, 0, 0, 0]
    assert out["mini_geneval/strict"].tolist() == [1, 1, 1, 0, 0, 0]
    # partial scores by hand: blank 0; wrong relation 2/3; wrong colour (0.5 class-only credit) / (1 + 1 extra)
    np.testing.assert_allclose(out["mini_geneval/partial"].numpy(), [1, 1, 1, 0, 2 / 3, 0.25], rtol=1e-6)
    partial = build_reward("mini_geneval", mode="partial")(imgs, prompts, md)
    assert torch.equal(partial["mini_geneval"], out["mini_geneval/partial"])
    # float NCHW input in [0, 1] gives the same result
    f = torch.from_numpy(imgs).permute(0, 3, 1, 2).float() / 255
    assert torch.equal(build_reward("mini_geneval")(f, prompts, md)["mini_geneval"], out["mini_geneval"])


def test_mini_geneval_prompt_lookup_and_errors():
    r = build_reward("mini_geneval")
    img = S.render(S.parse_prompt("three green squares"), 48, seed=0)[None]
    assert r(img, ["three green squares"])["mini_geneval"].tolist() == [1.0]  # metadata from the grammar
    with pytest.raises(RewardError, match="sample 0 .*not a Mini-GenEval prompt"):
        r(img, ["a photo of a dog"])
    with pytest.raises(RewardError, match=r"sample 0: include\[0\].class"):
        r(img, ["x"], [{"include": [{"class": "dog", "count": 1}]}])


def test_mini_geneval_in_multi_reward():
    m = S.parse_prompt("a red circle")
    img = S.render(m, 64, seed=0)[None]
    out = MultiReward({"mini_geneval": 1.0, "jpeg_compressibility": 0.1},
                      reward_kwargs={"mini_geneval": {"mode": "partial"}})(img, [m["prompt"]], [m])
    assert out["total"].item() == pytest.approx(1.0 + 0.1 * out["jpeg_compressibility"].item(), rel=1e-6)
