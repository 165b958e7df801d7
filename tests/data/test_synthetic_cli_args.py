"""The synthetic benchmarks' command lines refuse out-of-range arguments with an argparse error (exit 2, the option
named) before anything is written (issue 31, item 14): ``--version 2 --lanes 0`` and ``--events 200 300`` used to
redraw forever, ``--lanes 9`` crashed with an IndexError, negative counts silently wrote empty splits, and the t2i /
t2v value checks ended in tracebacks."""
import numpy as np
import pytest

from mmgrpo.synthetic import t2i, t2v
from mmgrpo.vlm.synthetic import cli as tvg
from mmgrpo.vlm.synthetic import grounding

CASES = [
    (tvg.main, ["--version", "2", "--lanes", "0"], "argument --lanes: must be in [1, 4], got 0"),
    (tvg.main, ["--version", "2", "--lanes", "9"], "argument --lanes: must be in [1, 4], got 9"),
    (tvg.main, ["--version", "2", "--events", "200", "300"], "argument --events: must be in [2, 9], got 200"),
    (tvg.main, ["--version", "2", "--events", "1", "3"], "argument --events: must be in [2, 9], got 1"),
    (tvg.main, ["--version", "2", "--events", "5", "3"], "--events MIN MAX: MIN must be <= MAX, got 5 3"),
    (tvg.main, ["--version", "2", "--n-val", "-3"], "argument --n-val: must be >= 0, got -3"),
    (tvg.main, ["--n-train", "-1"], "argument --n-train: must be >= 0, got -1"),
    (tvg.main, ["--n-eval", "x"], "argument --n-eval: expected an integer, got 'x'"),
    (t2i.main, ["--n", "-1"], "argument --n: must be >= 0, got -1"),
    (t2i.main, ["--size", "0"], "argument --size: must be in [24, 4096], got 0"),
    (t2i.main, ["--tags"], "--tags needs at least one tag"),
    (t2v.main, ["--n", "-2"], "argument --n: must be >= 0, got -2"),
    (t2v.main, ["--size", "8"], "argument --size: must be in [32, 1024], got 8"),
    (t2v.main, ["--frames", "0"], "argument --frames: must be in [4, 1024], got 0"),
    (t2v.main, ["--tags"], "--tags needs at least one tag"),
]


@pytest.mark.timeout(30)  # before the fix --lanes 0 and --events 200 300 never returned
@pytest.mark.parametrize("main,args,message", CASES, ids=[" ".join(c[1]) for c in CASES])
def test_bad_arguments_exit_2_naming_the_option(main, args, message, tmp_path, capsys):
    out = tmp_path / "out"
    argv = (["--out", str(out)] if main is t2i.main else [str(out)]) + args + (
        ["--n-train", "1", "--n-eval", "0"] if main is tvg.main and "--n-train" not in args else [])
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()  # nothing written


def test_the_limits_are_the_real_ones(tmp_path):
    """The CLI's bounds are what the generator can draw: 4 lanes of >= 14 px fit the 64 px frame (also with the
    8 px clock bar), 5 do not; 9 distinct colour-shape kinds."""
    assert grounding.max_lanes("bar") == grounding.max_lanes("none") == 4 == (64 - 8) // grounding.SHAPE_SIZE
    assert 64 // 5 < grounding.SHAPE_SIZE
    assert grounding.MAX_EVENTS == 3 * 3
    rng = np.random.default_rng(0)
    grounding.check_settings("bar", 4, (9, 9))
    spec = grounding.sample_spec(rng, "x", clock="bar", lanes=4, n_events=(9, 9))  # the extreme valid setting
    assert len({(e.colour, e.shape) for e in spec.events}) == 9
    assert tvg.main([str(tmp_path / "o"), "--version", "2", "--lanes", "4", "--events", "2", "2", "--n-train", "1",
                     "--n-eval", "0"]) == 0


@pytest.mark.timeout(30)
def test_the_library_refuses_settings_it_cannot_draw(tmp_path):
    for kw, msg in [({"lanes": 0}, r"lanes must be in \[1, 4\]"), ({"n_events": (200, 300)}, "max <= 9"),
                    ({"lanes": 5}, r"lanes must be in \[1, 4\]"), ({"n_events": (5, 3)}, "min <= max"),
                    ({"clock": "sun"}, "clock must be one of")]:
        with pytest.raises(ValueError, match=msg):
            grounding.generate(tmp_path / "g", n_train=1, n_eval=0, **kw)
        assert not (tmp_path / "g").exists()  # refused before anything is written


def test_the_shipped_checkpoints_fingerprint_is_unchanged():
    """The validation sits outside sample_spec / _draw_spec, whose source the shipped grounding base is
    fingerprinted with (tests/test_sft.py checks the fingerprint against the shipped report)."""
    import inspect

    assert "while True:" in inspect.getsource(grounding.sample_spec)
    assert "check_settings" not in inspect.getsource(grounding.sample_spec)
