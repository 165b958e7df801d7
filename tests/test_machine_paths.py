"""No tracked file names a folder of the machine it was built on (issue #35 item 4), and build scripts record paths
relative to the repository or to the folder that holds their output (``mmgrpo.utils.portable``)."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from mmgrpo.utils.portable import portable_argv, portable_path, portable_record

REPO = Path(__file__).resolve().parents[1]
# Home and work folders of build machines: a top-level "work" folder, root's home, home/<user>, Users/<user>
# (built from pieces so that this file does not match itself)
_HOMES = re.compile("(?<![\\w.])/(?:" + "|".join(["wo" + "rk/", "ro" + "ot/", "ho" + r"me/[A-Za-z_][\w.-]*/",
                                                   "Use" + r"rs/[A-Za-z_][\w.-]*/"]) + ")")
# scratch folders recorded by a build (a /tmp path in a JSON record is where the file was built)
_SCRATCH = re.compile("(?<![\\w.])/" + "tmp/")
_RECORD_SUFFIXES = {".json", ".jsonl"}


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (e.g. an unpacked sdist): walk the tree
        names = [str(p.relative_to(REPO)) for p in REPO.rglob("*") if p.is_file()
                 and not any(part.startswith(".") or part in {"runs", "site", "__pycache__"}
                             for part in p.relative_to(REPO).parts)]
    return [REPO / n for n in names]


def _text(path: Path):
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None  # binary (weights, images)
    return data.decode("utf-8", errors="replace")


def test_no_tracked_file_holds_a_machine_path():
    offenders = []
    for path in _tracked_files():
        text = _text(path)
        if text is None:
            continue
        for lineno, line in enumerate(text.splitlines(), start=1):
            hit = _HOMES.search(line)
            if hit is None and path.suffix in _RECORD_SUFFIXES:
                hit = _SCRATCH.search(line)
            if hit:
                context = line[max(0, hit.start() - 40):hit.end() + 40]
                offenders.append(f"{path.relative_to(REPO)}:{lineno}: ...{context}...")
    assert not offenders, "machine paths in tracked files:\n" + "\n".join(offenders[:40])


def test_the_pattern_catches_what_it_should():
    home = "/" + "ho" + "me/alice/x"
    assert _HOMES.search(f"python a.py --out {home}") and _HOMES.search("/" + "wo" + "rk/g16/L4")
    assert _HOMES.search('"cmd": "/' + 'ro' + 'ot/.cache/venv/bin/python"')
    assert not _HOMES.search("runs/work/a") and not _HOMES.search("data/home/x")
    assert not _HOMES.search("https://a.b/root/")
    assert _SCRATCH.search('"out": "/' + 'tmp/t2/f30"') and not _SCRATCH.search("out/tmp/x")


def test_portable_path_rules(tmp_path):
    repo = tmp_path / "repo"
    work = tmp_path / "scratch" / "g16"
    assert portable_path(repo / "data" / "x.json", anchor=work, repo=repo) == os.path.join("data", "x.json")
    assert portable_path(repo, anchor=work, repo=repo) == "."
    assert portable_path(work / "L4", anchor=work, repo=repo) == "L4"
    assert portable_path(work / "g3k" / "train.jsonl", anchor=work, repo=repo) == os.path.join("g3k", "train.jsonl")
    assert portable_path(tmp_path / "other", anchor=work, repo=repo) == os.path.join("..", "..", "other")
    assert portable_path("rel/path", anchor=work, repo=repo) == "rel/path"  # relative paths are kept
    # a sibling folder whose name starts like the repository's is not inside it
    assert portable_path(tmp_path / "repo2" / "a", anchor=tmp_path, repo=repo) == os.path.join("repo2", "a")


def test_portable_argv_and_record(tmp_path):
    repo = tmp_path / "repo"
    work = tmp_path / "w"
    argv = [str(tmp_path / "venv" / "bin" / "python3"), str(repo / "eval" / "perf" / "x.py"), "--quick",
            "--json", str(work / "result.json"), f"--init={work / 'S2'}", "--lr", "1e-3"]
    assert portable_argv(argv, anchor=work, repo=repo) == [
        "python", os.path.join("eval", "perf", "x.py"), "--quick", "--json", "result.json", "--init=S2", "--lr", "1e-3"]
    rec = {"out": str(work / "L4"), "init": work / "S2", "steps": 400, "lr": 1e-3, "tags": [str(work / "a"), "b"],
           "note": "a text that mentions /x/y", "flag": None}
    got = portable_record(rec, anchor=work, repo=repo)
    assert got == {"out": "L4", "init": "S2", "steps": 400, "lr": 1e-3, "tags": ["a", "b"],
                   "note": "a text that mentions /x/y", "flag": None}


@pytest.mark.parametrize("script", ["build_tiny_vlm.py", "build_tiny_flow.py", "build_tiny_t2v.py"])
def test_build_scripts_record_portable_paths(script):
    """Every builder of a shipped base passes what it records through mmgrpo.utils.portable."""
    src = (REPO / "scripts" / script).read_text()
    assert "portable_argv(" in src and "portable_record(vars(args)" in src
    assert "sys.executable.split" not in src
