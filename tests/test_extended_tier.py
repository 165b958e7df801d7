"""The opt-in ``extended`` tier (tests/conftest.py): a test marked ``extended`` is deselected by default and runs
with ``--full`` (``bash scripts/test.sh --full``) or when ``-m`` names the marker."""
from pathlib import Path

pytest_plugins = ["pytester"]

HOOKS = Path(__file__).with_name("conftest.py")


def _run(pytester, *args):
    pytester.makeconftest(HOOKS.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    extended: opt-in tier\n")
    pytester.makepyfile(test_tier="""
        import pytest

        def test_default():
            pass

        @pytest.mark.extended
        def test_variant():
            pass

        @pytest.mark.parametrize("x", [1, pytest.param(2, marks=pytest.mark.extended)])
        def test_param(x):
            pass
        """)
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)


def test_extended_tests_are_deselected_by_default(pytester):
    _run(pytester).assert_outcomes(passed=2, deselected=2)


def test_full_runs_them(pytester):
    _run(pytester, "--full").assert_outcomes(passed=4)


def test_selecting_the_marker_runs_only_them(pytester):
    _run(pytester, "-m", "extended").assert_outcomes(passed=2, deselected=2)
