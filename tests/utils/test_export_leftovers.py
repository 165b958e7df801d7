"""Folders left by an export killed half-way (``.tmp-<name>-<pid>``, ``.old-<name>-<pid>``) are cleaned on the
next start; those of live processes and the export itself are never touched (issue 31 item 16)."""
import subprocess
import sys

import pytest

from mmgrpo.utils.export import clean_stale_exports, export_problem, publish_dir


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _export(target, text, meta=None):
    return publish_dir(target, lambda d: (d / "w.safetensors").write_text(text), meta or {"epoch": 1})


def _files(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_dead_leftovers_are_removed_live_ones_and_the_export_are_kept(tmp_path):
    final = _export(tmp_path / "lora_final", "current")
    before = _files(final)
    dead = _dead_pid()
    for kind in ("tmp", "old"):  # two full copies of the weights, forever, before the fix
        _export(tmp_path / f".{kind}-lora_final-{dead}", "stale")
        _export(tmp_path / f".{kind}-transformer_final-{dead}", "stale")
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as live:
        try:
            (tmp_path / f".tmp-lora_final-{live.pid}").mkdir()  # a live writer's folder
            removed = clean_stale_exports(tmp_path)
            assert (tmp_path / f".tmp-lora_final-{live.pid}").is_dir()
        finally:
            live.kill()
    # transformer_final itself was missing (killed between the renames): its complete new copy was put back
    assert export_problem(tmp_path / "transformer_final") is None
    assert sorted(p.name for p in removed) == sorted([f".tmp-lora_final-{dead}", f".old-lora_final-{dead}",
                                                      f".old-transformer_final-{dead}"])
    assert not any(p.exists() for p in removed)
    assert _files(final) == before  # the live export is never touched


@pytest.mark.parametrize("tmp_complete", [True, False])
def test_a_kill_between_the_renames_restores_the_newest_complete_export(tmp_path, tmp_complete):
    dead = _dead_pid()
    _export(tmp_path / f".old-lora_final-{dead}", "previous", {"epoch": 1})
    new = _export(tmp_path / f".tmp-lora_final-{dead}", "new", {"epoch": 2})
    if not tmp_complete:  # killed before its manifest was written
        (new / "export.json").unlink()
    clean_stale_exports(tmp_path)
    final = tmp_path / "lora_final"
    assert export_problem(final) is None
    assert (final / "w.safetensors").read_text() == ("new" if tmp_complete else "previous")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lora_final"]


def test_our_own_pid_and_unrelated_folders_are_left_alone(tmp_path):
    import os

    (tmp_path / f".tmp-lora_final-{os.getpid()}").mkdir()
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / ".tmp-notes").mkdir()  # no pid: not an export leftover
    assert clean_stale_exports(tmp_path) == []
    assert clean_stale_exports(tmp_path / "missing") == []
    assert len(list(tmp_path.iterdir())) == 3
