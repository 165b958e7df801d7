"""scripts/build_tiny_vlm.py on the grounding benchmark (version 2): boundary-noisy / coarse SFT labels."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from mmgrpo.vlm.data.schema import Sample

REPO = Path(__file__).resolve().parents[1]


def _builder():
    spec = importlib.util.spec_from_file_location("build_tiny_vlm_g", REPO / "scripts" / "build_tiny_vlm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _s(a, b, d=10.0):
    return Sample.from_dict({"id": "x", "task": "tvg", "video": "v.mp4", "duration": d, "query": "q",
                             "spans": [[a, b]]})


def test_label_round_widens_to_the_grid_by_hand():
    b = _builder()
    out = b.noisy_labels([_s(1.3, 2.6), _s(2.0, 2.5), _s(9.1, 9.8, d=9.8)], 0.0, 0, round_to=0.5)
    assert [o.spans[0] for o in out] == [[1.0, 3.0], [2.0, 2.5], [9.0, 9.8]]  # exact multiples stay; end capped


def test_label_noise_is_bounded_fixed_per_seed_and_keeps_spans_valid():
    b = _builder()
    xs = [_s(3.0, 4.5) for _ in range(200)]
    o1, o2 = b.noisy_labels(xs, 0.5, 3), b.noisy_labels(xs, 0.5, 3)
    st = np.array([o.spans[0] for o in o1])
    assert np.array_equal(st, np.array([o.spans[0] for o in o2]))
    assert np.all(np.abs(st - [3.0, 4.5]) <= 0.5 + 1e-12) and np.all(st[:, 1] - st[:, 0] >= 0.25)
    assert st[:, 0].std() > 0.2 and xs[0].spans[0] == [3.0, 4.5]  # really noisy; inputs untouched
    edge = b.noisy_labels([_s(0.0, 0.4, d=0.6)] * 50, 0.5, 1)
    for o in edge:
        a, e = o.spans[0]
        assert 0.0 <= a and e <= 0.6 and e - a >= 0.25 - 1e-12


def test_fingerprint_covers_the_grounding_generator_only_when_asked(monkeypatch):
    from mmgrpo.vlm.synthetic import grounding as g2

    b = _builder()
    f1, f2 = b.fingerprint(), b.fingerprint("grounding")
    assert "synthetic_grounding" not in f1 and {k: f2[k] for k in f1} == f1
    monkeypatch.setattr(g2, "EVENT_SECONDS", (1.0, 3.0))
    assert b.fingerprint("grounding")["synthetic_grounding"] != f2["synthetic_grounding"]


def test_query_position_and_events_reach_the_report_and_the_trainer_overrides(tmp_path):
    b = _builder()
    args = b.parse_args(["--query-position", "before", "--events", "2", "3", "--benchmark", "grounding"])
    assert args.events == [2, 3]
    from mmgrpo.vlm.sft import VideoSettings

    ov = b.trainer_overrides(VideoSettings(), args)
    assert "data.query_position=before" in ov
    assert "data.query_position=after" in b.trainer_overrides(VideoSettings(), b.parse_args([]))
    (tmp_path / "info.json").write_text('{"n_events": [2, 3], "clock": "light", "checks": {}}')
    assert b._read_info(tmp_path) == {"n_events": [2, 3], "clock": "light", "checks": {}}
    assert b._read_info(tmp_path / "none") == {}


def _v(video, a, b, d=12.0):
    return Sample.from_dict({"id": f"{video}_{a}", "task": "tvg", "video": video, "duration": d, "query": "q",
                             "spans": [[a, b]]})


def test_first_event_labels_point_at_the_earliest_event_of_the_same_video_by_hand():
    b = _builder()
    # video A: events at 5-6, 1-2.5, 8-9 (earliest 1-2.5); video B: a tie at start 3: the shorter one (3-4) wins
    xs = [_v("A", 5.0, 6.0), _v("A", 1.0, 2.5), _v("A", 8.0, 9.0), _v("B", 3.0, 5.0), _v("B", 3.0, 4.0)]
    every = b.first_event_labels(xs, 1.0, 0)
    assert [o.spans[0] for o in every] == [[1.0, 2.5]] * 3 + [[3.0, 4.0]] * 2
    assert [o.query for o in every] == [x.query for x in xs] and xs[0].spans[0] == [5.0, 6.0]  # inputs untouched
    assert [o.spans[0] for o in b.first_event_labels(xs, 0.0, 0)] == [x.spans[0] for x in xs]
    with pytest.raises(ValueError, match="rate"):
        b.first_event_labels(xs, 1.5, 0)


def test_first_event_labels_change_the_requested_share_fixed_per_seed():
    b = _builder()
    xs = [s for k in range(300) for s in (_v(f"v{k}", 1.0, 2.0), _v(f"v{k}", 6.0, 7.5))]  # the 2nd query is later
    o1, o2 = b.first_event_labels(xs, 0.4, 5), b.first_event_labels(xs, 0.4, 5)
    assert [o.spans for o in o1] == [o.spans for o in o2]
    later = [o for x, o in zip(xs, o1) if x.spans[0][0] == 6.0]
    moved = np.mean([o.spans[0] == [1.0, 2.0] for o in later])
    assert abs(moved - 0.4) < 0.08  # binomial sd at n = 300: 0.028
    assert all(o.spans[0] == [1.0, 2.0] for x, o in zip(xs, o1) if x.spans[0][0] == 1.0)
    assert [o.spans for o in b.first_event_labels(xs, 0.4, 6)] != [o.spans for o in o1]
