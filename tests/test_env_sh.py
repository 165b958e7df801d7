"""scripts/env.sh, sourced by bash against fake venvs (no real install; each case is one short bash process).

Sourcing must leave the caller's shell options as they were (set -euo pipefail used to leak into an interactive
shell, where the next failing command closed the terminal), install with constraints.txt, key the venv on
setup.py + constraints.txt, and fail loudly, but without killing the caller, when the install fails."""
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV_SH = ROOT / "scripts" / "env.sh"
OPTS = ("errexit", "nounset", "pipefail")

# A stand-in for python3: `-m venv DIR` makes a venv whose bin/python is this same script; any other call (pip)
# appends its arguments to $FAKE_PIP_LOG and exits with $FAKE_PIP_RC.
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1" = -m ] && [ "$2" = venv ]; then
  mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && printf 'export VIRTUAL_ENV=%s\\n' "$3" > "$3/bin/activate"
  exit 0
fi
echo "$*" >> "$FAKE_PIP_LOG"
exit "${FAKE_PIP_RC:-0}"
"""

needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")


def _fake_python(tmp_path) -> Path:
    p = tmp_path / "fakepy"
    p.write_text(FAKE_PYTHON)
    p.chmod(0o755)
    return p


def _ready_venv(venv: Path, fake_python: Path) -> Path:
    """A venv folder env.sh takes as already installed: marker, bin/activate, a python shim."""
    (venv / "bin").mkdir(parents=True)
    (venv / ".mmgrpo-complete").touch()
    (venv / "bin" / "activate").write_text(f"export VIRTUAL_ENV={venv}\n")
    shutil.copy(fake_python, venv / "bin" / "python")
    return venv


def _source(tmp_path, set_opts: str, env: dict) -> subprocess.CompletedProcess:
    """bash with options `set_opts` sources env.sh, then reports the rc, its options and that it is still alive."""
    script = f"""{set_opts}
source {ENV_SH}
rc=$?
echo "rc=$rc"
for o in {' '.join(OPTS)}; do if [ -o $o ]; then echo "$o=on"; else echo "$o=off"; fi; done
echo "venv=${{VIRTUAL_ENV:-none}}"
echo alive
"""
    full_env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "FAKE_PIP_LOG": str(tmp_path / "pip.log")}
    full_env.update(env)
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=full_env, timeout=30,
                          cwd=tmp_path)


def _report(proc) -> dict:
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


@needs_bash
def test_sourcing_keeps_options_off(tmp_path):
    venv = _ready_venv(tmp_path / "v", _fake_python(tmp_path))
    proc = _source(tmp_path, "set +euo pipefail", {"MMGRPO_VENV": str(venv)})
    rep = _report(proc)
    assert proc.returncode == 0 and "alive" in proc.stdout, proc.stderr
    assert rep["rc"] == "0" and rep["venv"] == str(venv)
    assert [rep[o] for o in OPTS] == ["off"] * 3, proc.stdout


@needs_bash
def test_sourcing_keeps_options_on(tmp_path):
    venv = _ready_venv(tmp_path / "v", _fake_python(tmp_path))
    proc = _source(tmp_path, "set -euo pipefail", {"MMGRPO_VENV": str(venv)})
    rep = _report(proc)
    assert proc.returncode == 0, proc.stderr
    assert [rep[o] for o in OPTS] == ["on"] * 3, proc.stdout


@needs_bash
def test_failed_install_returns_nonzero_keeps_shell_and_options(tmp_path):
    """pip fails: env.sh says so, activates nothing, returns 1; the interactive-style caller carries on."""
    fake = _fake_python(tmp_path)
    proc = _source(tmp_path, "set +euo pipefail",
                   {"MMGRPO_VENV": str(tmp_path / "new"), "PYTHON": str(fake), "FAKE_PIP_RC": "1"})
    rep = _report(proc)
    assert "alive" in proc.stdout and rep["rc"] == "1"
    assert [rep[o] for o in OPTS] == ["off"] * 3
    assert rep["venv"] == "none"
    assert "ERROR: installing the virtualenv" in proc.stderr
    assert not (tmp_path / "new" / ".mmgrpo-complete").exists()
    # the first pip call failed, so strict mode inside the install stopped before the second
    assert len((tmp_path / "pip.log").read_text().splitlines()) == 1


@needs_bash
def test_failed_install_stops_a_strict_script(tmp_path):
    """scripts/test.sh & co. set -e before sourcing: a failed install stops them before pytest runs."""
    fake = _fake_python(tmp_path)
    proc = _source(tmp_path, "set -euo pipefail",
                   {"MMGRPO_VENV": str(tmp_path / "new"), "PYTHON": str(fake), "FAKE_PIP_RC": "1"})
    assert proc.returncode != 0 and "alive" not in proc.stdout


@needs_bash
@pytest.mark.parametrize("unpinned", [False, True])
def test_install_uses_constraints_unless_unpinned(tmp_path, unpinned):
    fake = _fake_python(tmp_path)
    env = {"MMGRPO_VENV": str(tmp_path / "new"), "PYTHON": str(fake)}
    if unpinned:
        env["MMGRPO_UNPINNED"] = "1"
    proc = _source(tmp_path, "set +euo pipefail", env)
    assert _report(proc)["rc"] == "0", proc.stderr
    assert (tmp_path / "new" / ".mmgrpo-complete").exists()
    calls = (tmp_path / "pip.log").read_text().splitlines()
    assert len(calls) == 2 and f"-e {ROOT}[dev]" in calls[1]
    pin = f"-c {ROOT}/constraints.txt"
    assert all((pin in c) != unpinned for c in calls), calls


@needs_bash
def test_default_venv_is_keyed_on_setup_py_and_constraints(tmp_path):
    """The default venv name carries sha256(setup.py + constraints.txt)[:16]: a new pin builds a new venv."""
    key = hashlib.sha256((ROOT / "setup.py").read_bytes() + (ROOT / "constraints.txt").read_bytes()).hexdigest()
    venv = _ready_venv(tmp_path / "home" / ".cache" / "mmgrpo" / f"venv-{key[:16]}", _fake_python(tmp_path))
    # PYTHON=false: had env.sh looked elsewhere it would try an install, fail, and report rc=1
    proc = _source(tmp_path, "set +euo pipefail", {"PYTHON": "false"})
    rep = _report(proc)
    assert rep["rc"] == "0" and rep["venv"] == str(venv), proc.stderr


def test_constraints_pin_exact_versions():
    """Every requirement line of constraints.txt is name==version (no ranges, no editable or URL lines)."""
    lines = [ln.split("#")[0].strip() for ln in (ROOT / "constraints.txt").read_text().splitlines()]
    reqs = [ln for ln in lines if ln]
    assert len(reqs) > 50
    bad = [r for r in reqs if r.count("==") != 1 or r.startswith("-") or "mmgrpo" in r.lower()]
    assert not bad, bad
    names = {r.split("==")[0].lower() for r in reqs}
    assert {"torch", "torchvision", "transformers", "diffusers", "dashscope", "tiktoken"} <= names
