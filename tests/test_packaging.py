"""Packaging: an installed (non-editable) wheel works without the source checkout.

The Mini-GenEval reward used to load ``<repo>/data/synthetic_t2i.py`` by file path, which does not exist in a
wheel; the benchmark is now :mod:`mmgrpo.synthetic.t2i` and ``data/synthetic_t2i.py`` its command line in a checkout.  The wheel
also carries the ``mmgrpo.vlm`` front-end and the ``mmgrpo`` console script.
Manual equivalent of the wheel test::

    pip wheel --no-deps --no-build-isolation -w /tmp/wheel .
    pip install --no-deps --no-index --target /tmp/site /tmp/wheel/mmgrpo-*.whl
    cd /tmp && PYTHONPATH=/tmp/site python -c "import flow_grpo.rewards.mini_geneval as m; m.MiniGenEvalReward()"
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

_CHECK = """
import sys
import numpy as np
import flow_grpo.rewards.mini_geneval as m
import mmgrpo
bench = m.load_synthetic_t2i()
target = sys.argv[1]
for mod in (mmgrpo, bench, m):  # every module comes from the installed copy, none from a checkout
    assert mod.__file__.startswith(target), mod.__file__
assert "data" not in sys.modules  # nothing imported the checkout's top-level data/ folder
import importlib.metadata as md
import mmgrpo.vlm.cli as cli, mmgrpo.vlm.synthetic.tvg as tvg
assert cli.__file__.startswith(target) and tvg.__file__.startswith(target)
eps = [e.value for e in md.distribution("mmgrpo").entry_points if e.name == "mmgrpo"]
assert eps == ["mmgrpo.vlm.cli:main"], eps  # the console script of the wheel is the moved CLI
meta = bench.make_prompts(2, 0, "train")
imgs = np.stack([bench.render(x, 64, seed=i) for i, x in enumerate(meta)])
out = m.MiniGenEvalReward()(imgs, [x["prompt"] for x in meta], meta)
assert out["mini_geneval"].tolist() == [1.0, 1.0], out  # a correct render verifies
print("ok")
"""


def test_mini_geneval_reward_imports_from_an_installed_wheel(tmp_path):
    """Build a wheel of the package sources (copied, so the checkout gets no build/ folder), install it into a
    --target folder and import the reward with only that folder + site-packages on the path (~10 s)."""
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(REPO / "setup.py", src)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for pkg in ("mmgrpo", "flow_grpo"):
        shutil.copytree(REPO / pkg, src / pkg, ignore=ignore)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    pip = [sys.executable, "-m", "pip", "-q"]
    subprocess.run(pip[:-1] + ["wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-w",
                                str(tmp_path / "wheel"), str(src)], check=True, env=env, cwd=tmp_path, timeout=120)
    (whl,) = (tmp_path / "wheel").glob("mmgrpo-*.whl")
    site = tmp_path / "site"
    subprocess.run(pip[:-1] + ["install", "-q", "--no-deps", "--no-index", "--target", str(site), str(whl)],
                   check=True, env=env, cwd=tmp_path, timeout=120)
    env["PYTHONPATH"] = str(site)  # before site-packages (and before the editable install's finder)
    r = subprocess.run([sys.executable, "-c", _CHECK, str(site)], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]


def test_data_synthetic_t2i_cli_writes_prompts(tmp_path):
    """The checkout's command line ``python data/synthetic_t2i.py`` runs :mod:`mmgrpo.synthetic.t2i`."""
    out = tmp_path / "p.jsonl"
    r = subprocess.run([sys.executable, str(REPO / "data" / "synthetic_t2i.py"), "--n", "3", "--out", str(out)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert out.read_text().count("\n") == 3
