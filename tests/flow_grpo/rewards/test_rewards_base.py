"""Reward interface: image conversion, registry, NaN policy, MultiReward, pairwise win rate, async runner."""
import threading
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from flow_grpo.rewards import (
    FunctionReward,
    MultiReward,
    PairwisePreferenceReward,
    Reward,
    RewardError,
    ScoreComparator,
    available_rewards,
    build_reward,
    register_reward,
    win_rate,
)
from flow_grpo.media import to_uint8_nhwc
from flow_grpo.rewards.async_runner import AsyncRewardRunner


def _imgs(n=3, h=5, w=4, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=(n, h, w, 3), dtype=np.uint8)


# ---------------------------------------------------------------- conversion
def test_uint8_numpy_and_torch_nhwc_pass_through_as_copies():
    x = _imgs()
    for inp in (x, torch.from_numpy(x)):
        out = to_uint8_nhwc(inp)
        assert out.dtype == np.uint8 and out.shape == (3, 5, 4, 3)
        np.testing.assert_array_equal(out, x)
    out[0, 0, 0, 0] ^= 0xFF  # the result must not alias the caller's buffer
    assert out[0, 0, 0, 0] != x[0, 0, 0, 0]


def test_float_nchw_converts_with_rounding():
    x = _imgs()
    f = torch.from_numpy(x).permute(0, 3, 1, 2).double() / 255.0  # exact inverse -> exact round trip
    np.testing.assert_array_equal(to_uint8_nhwc(f), x)
    np.testing.assert_array_equal(to_uint8_nhwc(f.float().numpy()), x)
    # hand values: 0.5*255 = 127.5 -> 128 (round half to even), 0.2*255 = 51, 0.999*255 = 254.7 -> 255
    v = torch.tensor([0.0, 0.5, 0.2, 0.999]).reshape(1, 1, 2, 2).expand(1, 3, 2, 2)
    got = to_uint8_nhwc(v)[0, :, :, 0].flatten().tolist()
    assert got == [0, 128, 51, 255]


def test_float_out_of_range_and_nan_are_errors():
    with pytest.raises(ValueError, match=r"\[-1, 1\]"):
        to_uint8_nhwc(torch.full((1, 3, 2, 2), -0.5))
    x = torch.zeros(2, 3, 2, 2)
    x[1, 0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"samples \[1\]"):
        to_uint8_nhwc(x)


def test_pil_list_and_layout_errors():
    x = _imgs(2)
    pil = [Image.fromarray(a) for a in x]
    np.testing.assert_array_equal(to_uint8_nhwc(pil), x)
    np.testing.assert_array_equal(to_uint8_nhwc([p.convert("L") for p in pil])[..., 0],
                                  np.stack([np.asarray(p.convert("L")) for p in pil]))
    with pytest.raises(ValueError, match="differs"):
        to_uint8_nhwc([pil[0], pil[1].resize((7, 7))])
    with pytest.raises(ValueError, match="NCHW"):
        to_uint8_nhwc(np.zeros((2, 3, 8, 8), np.uint8))
    with pytest.raises(ValueError, match="4-d"):
        to_uint8_nhwc(np.zeros((8, 8, 3), np.uint8))


# ---------------------------------------------------------------- registry and checks
def test_registry_lists_builtins_and_builds_by_import_path():
    names = available_rewards()
    for n in ("jpeg_compressibility", "jpeg_incompressibility", "clip_score", "aesthetic", "pickscore", "hps",
              "ocr", "remote", "mini_geneval"):
        assert n in names
    r = build_reward("flow_grpo.rewards.toy:Brightness")
    assert r.name == "brightness"
    with pytest.raises(KeyError, match="unknown reward"):
        build_reward("no_such_reward")


def test_register_custom_reward_and_duplicate_guard():
    @register_reward("_test_const")
    def _factory(value=1.0, **kw):
        return FunctionReward(lambda im, p, m: np.full(im.shape[0], value), name="_test_const", **kw)

    out = build_reward("_test_const", value=2.5)(_imgs(2), ["a", "b"])
    assert out["_test_const"].dtype == torch.float32
    assert out["_test_const"].tolist() == [2.5, 2.5]
    with pytest.raises(KeyError, match="already registered"):
        register_reward("_test_const", _factory)


def test_nonfinite_raises_naming_reward_and_indices():
    r = FunctionReward(lambda im, p, m: np.array([1.0, np.nan, 0.0, np.inf]), name="bad")
    with pytest.raises(RewardError) as ei:
        r(_imgs(4), list("abcd"))
    assert "'bad'" in str(ei.value) and "[1, 3]" in str(ei.value)
    assert ei.value.reward == "bad" and ei.value.indices == [1, 3]


def test_nonfinite_drop_returns_valid_mask_and_keeps_values_nonfinite():
    r = FunctionReward(lambda im, p, m: {"bad": np.array([1.0, np.nan, 0.0]), "bad/aux": np.array([0, 0, -np.inf])},
                       name="bad", nan_policy="drop")
    out = r(_imgs(3), list("abc"))
    assert out["valid"].dtype == torch.bool and out["valid"].tolist() == [True, False, False]
    assert torch.isnan(out["bad"][1]) and out["bad"][0] == 1.0


def test_wrong_shape_and_length_errors():
    with pytest.raises(RewardError, match=r"shape \(2,\), expected \(3,\)"):
        FunctionReward(lambda im, p, m: np.zeros(2), name="short")(_imgs(3), list("abc"))
    with pytest.raises(ValueError, match="2 prompts for 3 images"):
        FunctionReward(lambda im, p, m: np.zeros(3), name="x")(_imgs(3), ["a", "b"])
    with pytest.raises(ValueError, match="1 metadata entries for 3"):
        FunctionReward(lambda im, p, m: np.zeros(3), name="x")(_imgs(3), list("abc"), [{}])


# ---------------------------------------------------------------- MultiReward
def _const(name, vals, **kw):
    return FunctionReward(lambda im, p, m: {name: np.asarray(vals, float), f"{name}/aux": np.zeros(len(vals))},
                          name=name, **kw)


def test_multi_reward_weighted_sum_by_hand():
    a, b = _const("a", [1.0, 2.0, 3.0]), _const("b", [10.0, 0.0, -10.0])
    m = MultiReward({"a": 0.5, "b": 2.0}, rewards={"a": a, "b": b})
    out = m(_imgs(3), list("xyz"))
    assert out["total"].tolist() == [20.5, 1.0, -18.5]  # 0.5*a + 2*b
    assert set(out) == {"a", "a/aux", "b", "b/aux", "total"}
    comps = m.components(out)
    assert set(comps) == {"a", "b"} and comps["b"].tolist() == [10.0, 0.0, -10.0]
    assert MultiReward({"a": 1.0}, mode="per_reward", rewards={"a": a}).mode == "per_reward"


def test_multi_reward_builds_from_registry_and_converts_once():
    seen = []
    probe = FunctionReward(lambda im, p, m: seen.append((type(im), im.dtype)) or np.zeros(im.shape[0]),
                           name="probe")
    m = MultiReward({"brightness": 1.0, "probe": 0.0}, rewards={"probe": probe})
    x = torch.rand(2, 3, 4, 4)
    out = m(x, ["a", "b"])
    assert seen == [(np.ndarray, np.uint8)]
    expected = to_uint8_nhwc(x).reshape(2, -1).astype(np.float64).mean(1) / 255.0
    np.testing.assert_allclose(out["brightness"].numpy(), expected, rtol=1e-6)


def test_multi_reward_nan_policy():
    a = _const("a", [1.0, 1.0, 1.0])
    b = _const("b", [0.0, np.nan, 0.0], nan_policy="drop")
    with pytest.raises(RewardError, match=r"'b'.*\[1\]"):
        MultiReward({"a": 1.0, "b": 1.0}, rewards={"a": a, "b": b})(_imgs(3), list("xyz"))
    out = MultiReward({"a": 1.0, "b": 1.0}, rewards={"a": a, "b": b}, nan_policy="drop")(_imgs(3), list("xyz"))
    assert out["valid"].tolist() == [True, False, True]
    assert out["total"][0] == 1.0 and torch.isnan(out["total"][1])


def test_multi_reward_key_collision():
    a1, a2 = _const("a", [1.0]), FunctionReward(lambda im, p, m: {"c": [0.0], "a/aux": [0.0]}, name="c")
    with pytest.raises(RewardError, match="more than one reward"):
        MultiReward({"a": 1.0, "c": 1.0}, rewards={"a": a1, "c": a2})(_imgs(1), ["x"])


# ---------------------------------------------------------------- pairwise preference
def test_win_rate_by_hand():
    # group 0 = {0,1,2}: 0 beats 1 and 2; 1 ties 2.  group 1 = {3,4}: 4 beats 3.  sample 5 alone.
    pref = torch.zeros(6, 6)
    pref[0, 1] = pref[0, 2] = 1.0
    pref[1, 2] = pref[2, 1] = 0.5
    pref[4, 3] = 1.0
    gid = torch.tensor([0, 0, 0, 1, 1, 2])
    r = win_rate(pref, gid)
    assert r.tolist() == [1.0, 0.25, 0.25, 0.0, 1.0, 0.5]


def test_pairwise_reward_matches_sorted_rank_formula():
    # A pointwise score with ties; the win rate must equal (#strictly lower + 0.5 #equal others) / (G-1).
    scores = np.array([3.0, 1.0, 3.0, 2.0, 5.0, 5.0, 0.0])
    gids = [7, 7, 7, 7, 9, 9, 9]
    point = FunctionReward(lambda im, p, m: scores[im[:, 0, 0, 0].astype(int)], name="s")
    imgs = np.zeros((7, 2, 2, 3), np.uint8)
    imgs[:, 0, 0, 0] = np.arange(7)
    calls = []

    class Counting(ScoreComparator):
        def __call__(self, a, b, p, m):
            calls.append(a.shape[0])
            return super().__call__(a, b, p, m)

    r = PairwisePreferenceReward(Counting(point), symmetric=False)
    out = r(imgs, ["p"] * 7, group_ids=gids)["pref_win_rate"]
    exp = []
    for i in range(7):
        others = [j for j in range(7) if j != i and gids[j] == gids[i]]
        exp.append(sum(1.0 if scores[i] > scores[j] else 0.5 if scores[i] == scores[j] else 0.0
                       for j in others) / len(others))
    np.testing.assert_allclose(out.numpy(), exp)
    assert calls == [6 + 3]  # one batched call over the C(4,2) + C(3,2) unordered same-group pairs
    # group ids from metadata give the same answer; symmetric judging of a consistent judge changes nothing
    md = [{"group_id": g} for g in gids]
    out2 = PairwisePreferenceReward(ScoreComparator(point), symmetric=True)(imgs, ["p"] * 7, md)
    np.testing.assert_allclose(out2["pref_win_rate"].numpy(), exp)


def test_pairwise_symmetric_cancels_position_bias_and_errors():
    # A judge that always prefers the first image: hard, non-symmetric -> index order decides;
    # symmetric -> c(i,j) = 1, c(j,i) = 1 -> w = (1 + 1 - 1)/2 = 0.5 for every pair.
    always_first = lambda a, b, p, m: np.ones(a.shape[0])  # noqa: E731
    imgs = _imgs(3)
    r = PairwisePreferenceReward(always_first)(imgs, list("abc"), group_ids=[0, 0, 0])["pref_win_rate"]
    assert r.tolist() == [1.0, 0.5, 0.0]
    r = PairwisePreferenceReward(always_first, symmetric=True)(imgs, list("abc"), group_ids=[0, 0, 0])
    assert r["pref_win_rate"].tolist() == [0.5, 0.5, 0.5]
    with pytest.raises(RewardError, match="group_id"):
        PairwisePreferenceReward(always_first)(imgs, list("abc"))
    bad = lambda a, b, p, m: np.array([np.nan] * a.shape[0])  # noqa: E731
    with pytest.raises(RewardError, match=r"pairs \[\(0, 1\)"):
        PairwisePreferenceReward(bad)(imgs, list("abc"), group_ids=[0, 0, 1])


def test_pairwise_reward_groups_non_integer_ids_by_equality():
    # Group ids from metadata may be floats (JSON numbers): still grouped by equality (the shared core function
    # takes integer ids; the reward maps its ids to 0..G-1 first). Judge: the first image always wins.
    always_first = lambda a, b, p, m: np.ones(a.shape[0])  # noqa: E731
    md = [{"group_id": g} for g in (2.0, 7.5, 2.0, 7.5, 2.0)]
    r = PairwisePreferenceReward(always_first)(_imgs(5), list("abcde"), md)["pref_win_rate"]
    assert r.tolist() == [1.0, 1.0, 0.5, 0.0, 0.0]  # group {0, 2, 4}: 2/2, 1/2, 0/2; group {1, 3}: 1/1, 0/1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=2, max_size=9), st.data())
def test_win_rates_of_a_full_group_average_to_half(scores, data):
    # Property: in every group of size >= 2, sum_i r_i = (G choose 2) / (G - 1) = G / 2 exactly.
    n = len(scores)
    gids = data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    pref = torch.tensor([[1.0 if a > b else 0.5 if a == b else 0.0 for b in scores] for a in scores])
    r = win_rate(pref, torch.tensor(gids))
    for g in set(gids):
        idx = [i for i in range(n) if gids[i] == g]
        if len(idx) >= 2:
            assert abs(float(r[idx].sum()) - len(idx) / 2) < 1e-5
        else:
            assert float(r[idx[0]]) == 0.5


# ---------------------------------------------------------------- async runner
class _Sleepy(Reward):
    name = "sleepy"

    def __init__(self, delay):
        super().__init__()
        self.delay = delay
        self.spans = []
        self._lock = threading.Lock()

    def score(self, images, prompts, metadata, **kw):
        t0 = time.perf_counter()
        time.sleep(self.delay)
        with self._lock:
            self.spans.append((t0, time.perf_counter()))
        return images.reshape(images.shape[0], -1).mean(1)


def test_async_runner_overlaps_calls_and_snapshots_inputs():
    r = _Sleepy(0.5)
    x = _imgs(2)
    expected = x.reshape(2, -1).mean(1)
    with AsyncRewardRunner(r, max_workers=2) as runner:
        t0 = time.perf_counter()
        f1 = runner.submit(x, ["a", "b"])
        x[:] = 0  # caller overwrites its buffer while the reward runs: the result must not change
        f2 = runner.submit(torch.from_numpy(x), ["a", "b"])
        submit_time = time.perf_counter() - t0
        o1, o2 = f1.result(timeout=5), f2.result(timeout=5)
        total = time.perf_counter() - t0
    assert submit_time < 0.3  # submit does not block on the reward
    (s1, e1), (s2, e2) = sorted(r.spans)
    assert s2 < e1  # the two calls ran at the same time
    assert total < 0.9  # sequential would take >= 2 x 0.5 s
    np.testing.assert_allclose(o1["sleepy"].numpy(), expected, rtol=1e-6)
    assert o2["sleepy"].tolist() == [0.0, 0.0]


def test_async_runner_propagates_errors():
    bad = FunctionReward(lambda im, p, m: np.full(im.shape[0], np.nan), name="bad")
    with AsyncRewardRunner(bad) as runner:
        fut = runner.submit(_imgs(2), ["a", "b"])
        with pytest.raises(RewardError, match="'bad'"):
            fut.result(timeout=5)


def test_pairwise_scorer_may_flag_failed_judgements():
    """A scorer returning {"pref", "failed"}: the given preferences are used (a failed one as the tie it gives) and
    <name>/judge_failures counts, per sample, the failed judgements among its pairs (both orders when symmetric)."""
    import numpy as np
    import pytest

    from flow_grpo.rewards import PairwisePreferenceReward, RewardError

    imgs = np.stack([np.full((4, 4, 3), v, dtype=np.uint8) for v in (10, 20, 30)])

    def scorer(a, b, prompts, md):  # pairs (0,1), (0,2), (1,2) in order; the pair with image 20 first fails
        pref = np.where(a[:, 0, 0, 0] > b[:, 0, 0, 0], 1.0, 0.0)
        failed = a[:, 0, 0, 0] == 20
        return {"pref": np.where(failed, 0.5, pref), "failed": failed}

    out = PairwisePreferenceReward(scorer, symmetric=False)(imgs, ["p"] * 3, [{"group_id": 0}] * 3)
    # (0,1): 1 wins; (0,2): 2 wins; (1,2): judged with image 20 first, failed -> the tie 0.5 (kept by hard=True)
    # win rates: 0 -> 0/2; 1 -> (1 + 0.5)/2; 2 -> (1 + 0.5)/2
    np.testing.assert_allclose(out["pref_win_rate"].numpy(), [0.0 / 2, (1.0 + 0.5) / 2, (1.0 + 0.5) / 2])
    assert out["pref_win_rate/judge_failures"].tolist() == [0, 1, 1]
    sym = PairwisePreferenceReward(scorer, symmetric=True)(imgs, ["p"] * 3, [{"group_id": 0}] * 3)
    assert sym["pref_win_rate/judge_failures"].tolist() == [1, 2, 1]  # (1,0) and (1,2) fail in the reversed order
    with pytest.raises(RewardError, match="'pref'"):
        PairwisePreferenceReward(lambda *a: {"p": [0.5]})(imgs[:2], ["p"] * 2, [{"group_id": 0}] * 2)
    with pytest.raises(RewardError, match="failure flags"):
        PairwisePreferenceReward(lambda *a: {"pref": [0.5], "failed": [True, False]})(
            imgs[:2], ["p"] * 2, [{"group_id": 0}] * 2)
