"""Crafted ``torch.distributed.checkpoint`` folders (a sharded checkpoint's ``state/``) never run code.

DCP reads a non-tensor ("bytes") entry with ``torch.load(weights_only=False)`` and, when ``.metadata`` is missing,
unpickles ``__<rank>.metadata`` with plain ``pickle.load``. Each folder here is built with ``dcp.save`` (or its
metadata rewritten) so that loading it as DCP would create a file; :func:`load_sharded` must refuse it, naming the
folder and the entry, and the file must not exist afterwards.
"""
import io
import os
import pickle
import shlex
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from mmgrpo.engine.checkpoint import load_sharded, save_sharded
from mmgrpo.utils.checkpoint import CheckpointError, UnsafeCheckpointError, refuse_unsafe_pickles


class _Evil:
    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.target)}",)


def _dcp_save(obj, folder):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group": a single-process save
        dcp.save(obj, checkpoint_id=str(folder))


def _template():
    return {"model": {"w": torch.zeros(3), "b": torch.zeros(2)}}


def test_a_genuine_folder_round_trips(tmp_path):
    src = {"model": {"w": torch.arange(3.0), "b": torch.tensor([5.0, 6.0])}}
    save_sharded(tmp_path / "st", src)
    got = load_sharded(tmp_path / "st", _template())
    assert torch.equal(got["model"]["w"], src["model"]["w"]) and torch.equal(got["model"]["b"], src["model"]["b"])


def test_a_bytes_entry_is_refused_before_dcp_reads_it(tmp_path):
    target = tmp_path / "pwned"
    _dcp_save({"model": {"w": _Evil(target), "b": torch.zeros(2)}}, tmp_path / "st")
    with pytest.raises(UnsafeCheckpointError, match=rf"{tmp_path / 'st'} refused: entry 'model\.w' is a "
                                                    r"BytesStorageMetadata item, not a tensor"):
        load_sharded(tmp_path / "st", _template())
    assert not target.exists()  # before the fix: DCP's torch.load(weights_only=False) ran os.system


def test_a_bytes_entry_nobody_asks_for_is_refused_too(tmp_path):
    target = tmp_path / "pwned"
    _dcp_save({"model": {"w": torch.zeros(3), "b": torch.zeros(2)}, "extra": {"x": _Evil(target)}}, tmp_path / "st")
    with pytest.raises(UnsafeCheckpointError, match=r"entry 'extra\.x'"):
        load_sharded(tmp_path / "st", _template())
    assert not target.exists()


@pytest.mark.parametrize("keep_global", [False, True], ids=["only-rank-metadata", "beside-.metadata"])
def test_a_rank_metadata_file_is_refused(tmp_path, keep_global):
    """``__0.metadata``: DCP unpickles it with plain pickle.load when ``.metadata`` is missing."""
    target = tmp_path / "pwned"
    st = tmp_path / "st"
    save_sharded(st, {"model": {"w": torch.zeros(3), "b": torch.zeros(2)}})
    if keep_global:
        (st / "__0.metadata").write_bytes(pickle.dumps(_Evil(target)))
    else:
        (st / ".metadata").rename(st / "__0.metadata")  # genuine content: refused by name, never unpickled
        (st / "__1.metadata").write_bytes(pickle.dumps(_Evil(target)))
    with pytest.raises(UnsafeCheckpointError, match=rf"{st} refused: metadata file\(s\) .*__0\.metadata.* other "
                                                    r"than '\.metadata'"):
        load_sharded(st, _template())
    assert not target.exists()  # before the fix: DCP fell back to __0.metadata and ran it


def test_a_crafted_rank_metadata_alone_never_runs(tmp_path):
    target = tmp_path / "pwned"
    st = tmp_path / "st"
    save_sharded(st, {"model": {"w": torch.zeros(3), "b": torch.zeros(2)}})
    (st / ".metadata").unlink()
    (st / "__0.metadata").write_bytes(pickle.dumps(_Evil(target)))
    with pytest.raises(UnsafeCheckpointError, match=r"__0\.metadata"):
        load_sharded(st, _template())
    assert not target.exists()


def test_missing_metadata_is_a_clear_error(tmp_path):
    (tmp_path / "st").mkdir()
    with pytest.raises(CheckpointError, match=r"has no \.metadata"):
        load_sharded(tmp_path / "st", _template())


def test_storage_outside_the_folder_is_refused(tmp_path):
    st = tmp_path / "st"
    save_sharded(st, {"model": {"w": torch.zeros(3), "b": torch.zeros(2)}})
    from torch.distributed.checkpoint import FileSystemReader

    md = FileSystemReader(str(st)).read_metadata()  # genuine, written just above
    for info in md.storage_data.values():
        info.relative_path = "../elsewhere.distcp"
    (st / ".metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(UnsafeCheckpointError, match=r"storage file '\.\./elsewhere\.distcp', outside the folder"):
        load_sharded(st, _template())


def test_earlier_format_folders_allow_plain_data_bytes_only(tmp_path):
    """Accelerate's FSDP optimizer folders hold ``param_groups`` as bytes entries: plain data passes, a pickle that
    would run code is refused (``refuse_unsafe_pickles`` runs before accelerate's own loader)."""
    target = tmp_path / "pwned"
    _dcp_save({"optimizer": {"state": {"w": torch.ones(2)}, "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99)}]}},
              tmp_path / "acc" / "optimizer_0")
    refuse_unsafe_pickles(tmp_path / "acc")
    with pytest.raises(UnsafeCheckpointError, match="BytesStorageMetadata"):
        load_sharded(tmp_path / "acc" / "optimizer_0", {"optimizer": {"state": {"w": torch.zeros(2)}}})
    _dcp_save({"optimizer": {"state": {"w": torch.ones(2)}, "param_groups": [_Evil(target)]}},
              tmp_path / "acc2" / "optimizer_0")
    with pytest.raises(UnsafeCheckpointError, match=r"bytes entry 'optimizer\.param_groups' would need unpickling "
                                                    r"beyond plain data.*posix\.system"):
        refuse_unsafe_pickles(tmp_path / "acc2")
    (tmp_path / "acc3" / "m").mkdir(parents=True)
    (tmp_path / "acc3" / "m" / "__0.metadata").write_bytes(pickle.dumps(_Evil(target)))
    with pytest.raises(UnsafeCheckpointError, match=r"__0\.metadata"):
        refuse_unsafe_pickles(tmp_path / "acc3")  # before the fix: only files named exactly .metadata were checked
    assert not target.exists()


def test_the_checked_metadata_is_what_dcp_plans_with(tmp_path, monkeypatch):
    """The reader hands DCP the object the restricted unpickler built: DCP's own pickle.load is never called."""
    save_sharded(tmp_path / "st", {"model": {"w": torch.arange(3.0), "b": torch.zeros(2)}})
    real_load = pickle.load

    def no_plain_unpickle(f, *a, **k):
        if isinstance(f, io.IOBase) and ".metadata" in str(getattr(f, "name", "")):
            raise AssertionError(f"plain pickle.load of {f.name}")
        return real_load(f, *a, **k)

    monkeypatch.setattr(pickle, "load", no_plain_unpickle)
    got = load_sharded(tmp_path / "st", _template())
    assert torch.equal(got["model"]["w"], torch.arange(3.0))
