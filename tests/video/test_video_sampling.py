"""The pure frame-count / clip-range / resolution rules, against hand-computed values and as properties."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmgrpo.video.sampling import (
    clip_frame_range,
    sample_frame_indices,
    smart_nframes,
    smart_resize,
    video_max_pixels,
)


@pytest.mark.parametrize(
    "num_frames, video_fps, fps, kw, expected",
    [
        (75, 7.5, 2.0, {}, 20),            # 10 s * 2 fps
        (48, 8.0, 2.0, {}, 12),            # 6 s * 2 fps
        (48, 8.0, 0.5, {}, 4),             # 3 -> raised to min_frames 4
        (61, 29.97, 2.0, {}, 4),           # 4.07 -> floor to even 4
        (100, 10.0, 1.7, {}, 16),          # 17 -> floor to even 16
        (100, 10.0, 4.0, {"max_frames": 9}, 8),   # 40 -> max_frames floored to 8
        (3, 10.0, 2.0, {}, 2),             # shorter than min_frames: capped by the clip, floored to 2
        (27, 8.0, 1.0, {}, 4),             # clip of 27 frames: 3.375 -> 4
        (1000, 25.0, 2.0, {"min_frames": 5}, 80),
        (1000, 25.0, 0.01, {"min_frames": 5}, 6),  # min_frames rounds up to 6
        (48, 8.0, 2.0, {"nframes": 7}, 8),  # nframes rounds to the nearest even (7/2 = 3.5 -> 4 banker's)
        (48, 8.0, 2.0, {"nframes": 5}, 4),
    ],
)
def test_smart_nframes_hand_values(num_frames, video_fps, fps, kw, expected):
    assert smart_nframes(num_frames, video_fps, fps=fps, **kw) == expected


def test_smart_nframes_rejects_impossible():
    with pytest.raises(ValueError):
        smart_nframes(1, 10.0, fps=2.0)  # a single frame cannot fill a temporal patch
    with pytest.raises(ValueError):
        smart_nframes(10, 10.0, nframes=12)


@given(n=st.integers(2, 5000), vfps=st.floats(1.0, 120.0), fps=st.floats(0.05, 30.0),
       lo=st.integers(1, 16), hi=st.integers(2, 800))
@settings(max_examples=200, deadline=None)
def test_smart_nframes_properties(n, vfps, fps, lo, hi):
    k = smart_nframes(n, vfps, fps=fps, min_frames=lo, max_frames=hi)
    assert k % 2 == 0 and 2 <= k <= n
    assert k <= max(2, hi - hi % 2)
    want = n / vfps * fps
    if want >= lo + 2 and hi >= want + 2 and n >= want + 2:  # unclamped regime: within one pair of the target
        assert want - 2 < k <= want


@pytest.mark.parametrize(
    "total, vfps, start, end, expected",
    [
        (48, 8.0, None, None, (0, 47)),
        (48, 8.0, 1.0, 4.3, (8, 34)),      # ceil(8.0), floor(34.4)
        (48, 8.0, 1.01, None, (9, 47)),    # ceil(8.08)
        (48, 8.0, None, 100.0, (0, 47)),   # clamped to the video end
        (48, 8.0, -3.0, 2.0, (0, 16)),     # clamped at 0
        (75, 7.5, 1.0, 4.3, (8, 32)),      # ceil(7.5), floor(32.25)
    ],
)
def test_clip_frame_range(total, vfps, start, end, expected):
    assert clip_frame_range(total, vfps, start, end) == expected


def test_clip_frame_range_empty():
    with pytest.raises(ValueError, match="empty clip"):
        clip_frame_range(48, 8.0, 3.0, 3.05)  # ceil(24) = 24 >= floor(24.4) = 24
    with pytest.raises(ValueError, match="empty clip"):
        clip_frame_range(48, 8.0, 5.0, 2.0)


def test_sample_frame_indices_match_float64_linspace():
    # Independent: numpy float64 linspace; these grids have no exact .5 ties, so both round the same.
    for start, end, n in [(0, 74, 20), (8, 34, 4), (0, 47, 12), (3, 999, 80)]:
        ref = np.round(np.linspace(start, end, n)).astype(int).tolist()
        got = sample_frame_indices(start, end, n)
        assert got == ref
        assert got[0] == start and got[-1] == end and all(b > a for a, b in zip(got, got[1:]))


@pytest.mark.parametrize(
    "h, w, factor, lo, hi, expected",
    [
        (48, 64, 28, 4 * 784, 16 * 784, (56, 56)),     # round to multiples: 56 x 56 = 3136 in range
        (48, 96, 28, 4 * 784, 16 * 784, (56, 84)),     # 56 x 112 would be 6272 ok -> round(96/28)=3 -> 84
        (480, 640, 28, 4 * 784, 16 * 784, (84, 112)),  # too big: beta = sqrt(307200/12544)=4.949
        (20, 20, 28, 4 * 784, 16 * 784, (56, 56)),     # too small: beta = sqrt(3136/400) = 2.8 -> ceil(56/28)
        (64, 96, 32, 4 * 1024, 16 * 1024, (64, 96)),   # Qwen3-VL factor 32
    ],
)
def test_smart_resize_hand_values(h, w, factor, lo, hi, expected):
    assert smart_resize(h, w, factor, lo, hi) == expected


@given(h=st.integers(8, 2000), w=st.integers(8, 2000), f=st.sampled_from([28, 32]),
       lo_t=st.integers(1, 64), span=st.integers(0, 2000))
@settings(max_examples=300, deadline=None)
def test_smart_resize_properties(h, w, f, lo_t, span):
    if max(h, w) / min(h, w) > 200:
        return
    lo, hi = lo_t * f * f, (lo_t + span) * f * f
    rh, rw = smart_resize(h, w, f, lo, hi)
    assert rh % f == 0 and rw % f == 0 and rh >= f and rw >= f
    rounded = max(f, round(h / f) * f) * max(f, round(w / f) * f)
    if lo <= rounded <= hi:  # already inside the budget: only rounded to multiples of f
        assert (rh, rw) == (max(f, round(h / f) * f), max(f, round(w / f) * f))
    elif rounded > hi:
        beta = math.sqrt(h * w / hi)
        if min(h, w) / beta >= f:  # no side clamped at one patch
            assert rh * rw <= hi
        assert rh <= h / beta + 1e-9 or rh == f
    else:
        assert rh * rw >= lo


def test_video_max_pixels_hand_values():
    f2 = 28 * 28
    # defaults: min 128 f^2; total 128000*0.9 f^2 -> for 20 frames 11520 f^2 > 768 f^2 cap
    assert video_max_pixels(20) == (128 * f2, 768 * f2)
    # a total budget: 40 f^2 total over 4 frames -> 20 f^2 per frame (x2 for the temporal pair)
    assert video_max_pixels(4, 28, 4 * f2, 16 * f2, 40 * f2) == (4 * f2, 16 * f2)
    assert video_max_pixels(8, 28, 4 * f2, 16 * f2, 40 * f2) == (4 * f2, 10 * f2)
    # floor at 1.05 * min_pixels
    assert video_max_pixels(100, 28, 4 * f2, None, 40 * f2) == (4 * f2, int(4 * f2 * 1.05))
    with pytest.raises(ValueError):
        video_max_pixels(4, 28, 16 * f2, 4 * f2)
    assert math.isclose(video_max_pixels(2, 32)[1], 768 * 32 * 32)
