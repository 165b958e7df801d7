"""Temporal rewards: hand-computed values and hypothesis properties."""
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mmgrpo.vlm.rewards.parsing import Span
from mmgrpo.vlm.rewards.temporal import (
    boundary_iou,
    clamp_span,
    gaussian_boundary_reward,
    interval_iop,
    merge_intervals,
    multi_interval_iop,
    multi_interval_iou,
    temporal_iou,
    threshold_reward,
)

PROP = settings(max_examples=80, deadline=None)


def test_iou_hand_values():
    assert temporal_iou((10, 20), (15, 25)) == pytest.approx(5 / 15)
    assert temporal_iou((10, 20), (12, 18)) == pytest.approx(6 / 10)
    assert temporal_iou((0, 10), (20, 30)) == 0.0
    assert temporal_iou((0, 10), (10, 20)) == 0.0  # touching
    assert temporal_iou((20, 10), (10, 20)) == 1.0  # reversed prediction swapped
    assert temporal_iou(Span(10, 20), [10, 20]) == 1.0


def test_iou_clamps_to_duration():
    # [25, 40] → [25, 30] against [20, 30]: 5 / 10
    assert temporal_iou((25, 40), (20, 30), duration=30) == pytest.approx(0.5)
    assert temporal_iou((-5, 10), (0, 20), duration=30) == pytest.approx(10 / 20)
    assert clamp_span((40, -3), 0, 30) == (0.0, 30.0)


def test_zero_union_is_not_an_exploit():
    assert temporal_iou((5, 5), (5, 5)) == 0.0
    # both spans past the end collapse to [D, D]: must NOT score 1
    assert temporal_iou((40, 50), (35, 45), duration=30) == 0.0
    assert temporal_iou((15, 15), (10, 20)) == 0.0  # a point inside the GT has zero measure
    assert multi_interval_iou([(3, 3)], [(3, 3)]) == 0.0
    assert interval_iop((15, 15), (10, 20)) == 0.0


def test_boundary_and_gaussian_hand_values():
    # Time-R1: tIoU · (1 − |Δs|/D)(1 − |Δe|/D) = (1/3)(0.95)(0.95)
    assert boundary_iou((10, 20), (15, 25), duration=100) == pytest.approx((1 / 3) * 0.95 * 0.95)
    assert boundary_iou((10, 20), (10, 20), duration=100) == 1.0
    # exp(−(25 + 25) / (2 · 0.1² · 100²)) = exp(−0.25)
    assert gaussian_boundary_reward((10, 20), (15, 25), duration=100, sigma=0.1) == pytest.approx(math.exp(-0.25))
    assert gaussian_boundary_reward((0, 10), (50, 60), duration=100, sigma=0.2) == pytest.approx(
        math.exp(-(2500 + 2500) / (2 * 0.04 * 10000))
    )
    # clamping before the penalty: [90, 150] → [90, 100]
    assert boundary_iou((90, 150), (90, 100), duration=100) == 1.0


def test_multi_interval_and_iop_hand_values():
    p = [(0, 10), (5, 15), (30, 40)]  # merges to [0, 15] ∪ [30, 40], |P| = 25
    g = [(10, 20), (35, 50)]  # |G| = 25, intersection [10, 15] ∪ [35, 40] = 10
    assert merge_intervals(p) == [(0, 15), (30, 40)]
    assert multi_interval_iou(p, g) == pytest.approx(10 / 40)
    assert multi_interval_iop(p, g) == pytest.approx(10 / 25)
    assert interval_iop((10, 20), (15, 40)) == pytest.approx(0.5)
    assert merge_intervals([(5, 6), (1, 2), (2, 3), (4, 4)]) == [(1, 3), (5, 6)]  # touching merged, point dropped


def test_threshold_reward():
    assert threshold_reward(0.5) == pytest.approx(2 / 3)
    assert threshold_reward(0.7, (0.7,)) == 1.0
    assert threshold_reward(0.69, (0.7,)) == 0.0


@pytest.mark.parametrize(
    "fn",
    [
        lambda: temporal_iou((0, float("nan")), (0, 1)),
        lambda: temporal_iou((0, 1), (0, float("inf"))),
        lambda: temporal_iou((0, 1), (0, 1), duration=0),
        lambda: boundary_iou((0, 1), (0, 1), duration=float("nan")),
        lambda: gaussian_boundary_reward((0, 1), (0, 1), duration=10, sigma=0),
        lambda: temporal_iou((0, 1, 2), (0, 1)),
        lambda: temporal_iou(("a", 1), (0, 1)),
        lambda: threshold_reward(float("nan")),
    ],
)
def test_bad_inputs_raise(fn):
    with pytest.raises(ValueError):
        fn()


# ---------------------------------------------------------------------------------------------------------------
# properties (spans on a 0.01 s grid, like 2-decimal timestamps)
# ---------------------------------------------------------------------------------------------------------------

t = st.integers(0, 100_000).map(lambda k: k / 100)
spans = st.tuples(t, t)


@PROP
@given(p=spans, g=spans)
def test_iou_range_symmetry_order(p, g):
    v = temporal_iou(p, g)
    assert 0.0 <= v <= 1.0
    assert v == temporal_iou(g, p)
    assert v == temporal_iou(p[::-1], g) == temporal_iou(p, g[::-1])
    assert multi_interval_iou([p], [g]) == pytest.approx(v)
    assert interval_iop(p, g) >= v - 1e-12  # |P| ≤ |P ∪ G|
    assert boundary_iou(p, g, duration=1000.0) <= v + 1e-12


@PROP
@given(p=spans, g=spans)
def test_iou_is_one_iff_equal_non_degenerate(p, g):
    one = temporal_iou(p, g) == 1.0
    assert one == (sorted(p) == sorted(g) and p[0] != p[1])
    gauss_one = gaussian_boundary_reward(p, g, duration=1000.0) == 1.0
    assert gauss_one == (sorted(p) == sorted(g))


@PROP
@given(p=spans, g=spans, d=st.integers(1, 2000).map(float))
def test_clamping_is_a_noop_for_spans_inside(p, g, d):
    assume(max(p) <= d and max(g) <= d)
    assert temporal_iou(p, g, duration=d) == temporal_iou(p, g)


@PROP
@given(p=spans, g=spans, d=st.integers(1, 2000).map(float))
def test_clamped_iou_equals_iou_of_clamped_spans(p, g, d):
    assert temporal_iou(p, g, duration=d) == temporal_iou(clamp_span(p, 0, d), clamp_span(g, 0, d))
    for fn in (boundary_iou, gaussian_boundary_reward):
        assert 0.0 <= fn(p, g, duration=d) <= 1.0


@PROP
@given(g=spans, a=t, b=t, c=t, e=t)
def test_iou_monotone_as_prediction_shrinks_toward_gt(g, a, b, c, e):
    """For nested predictions P ⊇ P' ⊇ G: IoU(P', G) ≥ IoU(P, G)."""
    gs, ge = sorted(g)
    s1, s2 = sorted((min(a, gs), min(b, gs)))  # s1 ≤ s2 ≤ gs
    e2, e1 = sorted((max(c, ge), max(e, ge)))  # ge ≤ e2 ≤ e1
    assert temporal_iou((s2, e2), (gs, ge)) >= temporal_iou((s1, e1), (gs, ge))
    assert boundary_iou((s2, e2), (gs, ge), duration=2000.0) >= boundary_iou((s1, e1), (gs, ge), duration=2000.0)
    assert gaussian_boundary_reward((s2, e2), (gs, ge), duration=2000.0) >= gaussian_boundary_reward(
        (s1, e1), (gs, ge), duration=2000.0
    )


@PROP
@given(p=spans, g=spans, shift=st.integers(-500, 500).map(float))
def test_iou_translation_invariant(p, g, shift):
    moved = temporal_iou((p[0] + shift, p[1] + shift), (g[0] + shift, g[1] + shift))
    assert moved == pytest.approx(temporal_iou(p, g), abs=1e-9)


@PROP
@given(ps=st.lists(spans, max_size=6), gs=st.lists(spans, max_size=6))
def test_multi_interval_properties(ps, gs):
    m = merge_intervals(ps)
    assert all(a < b for a, b in m) and all(m[i][1] < m[i + 1][0] for i in range(len(m) - 1))
    assert sum(b - a for a, b in m) <= sum(abs(b - a) for a, b in ps) + 1e-9
    v = multi_interval_iou(ps, gs)
    assert 0.0 <= v <= 1.0 and v == pytest.approx(multi_interval_iou(gs, ps))
    assert 0.0 <= multi_interval_iop(ps, gs) <= 1.0
    # order and duplication of the predicted intervals do not matter
    assert multi_interval_iou(list(reversed(ps)) + ps, gs) == pytest.approx(v)
