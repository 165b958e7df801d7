"""Write failures (disk full, read-only output dir) name the output, its path and the cause (issue 14, item 6).

A real full disk cannot be made in a test without privileges: the writers are monkeypatched to fail the way the
real ones do (measured on a full 256 kB tmpfs: torch.save -> RuntimeError 'unexpected pos 576 vs 534', safetensors
-> SafetensorError '... No space left on device (os error 28)', Python file writes -> OSError(ENOSPC)). Tests run
as root, where chmod does not block writes, so read-only is monkeypatched too (the chmod test skips as root)."""
import errno
import os
import stat
import types
from pathlib import Path

import pytest
import torch

from mmgrpo.utils.checkpoint import CheckpointManager
from mmgrpo.utils.logging import MetricLogger
from mmgrpo.utils.write_errors import OutputWriteError, describe_write_failure, naming_write_errors


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_message_names_output_path_and_cause():
    err = describe_write_failure(OSError(errno.ENOSPC, "No space left on device"), "checkpoint", "/x/step-3")
    assert str(err).startswith("cannot write checkpoint to /x/step-3: No space left on device (errno 28)")
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC
    err = describe_write_failure(OSError(errno.EROFS, "Read-only file system", "/x/a.pt"), "checkpoint", "/x")
    assert str(err).startswith("cannot write checkpoint to /x: Read-only file system (errno 30) [file /x/a.pt]")
    # not write failures: passed through unchanged
    assert describe_write_failure(ValueError("bad"), "checkpoint", "/x") is None
    assert describe_write_failure(RuntimeError("CUDA error"), "checkpoint", "/x") is None
    with pytest.raises(KeyError):
        with naming_write_errors("checkpoint", "/x"):
            raise KeyError("k")


def test_checkpoint_disk_full_names_the_step_dir(tmp_path, monkeypatch):
    mgr = CheckpointManager(tmp_path / "ckpt")
    monkeypatch.setattr(torch, "save", _enospc)
    with pytest.raises(OutputWriteError) as ei:
        mgr.save(3, {"model": {"w": torch.ones(2)}})
    msg = str(ei.value)
    assert msg.startswith(f"cannot write checkpoint to {tmp_path / 'ckpt' / 'step-00000003'}: "
                          "No space left on device (errno 28)")
    assert "MB free there" in msg and ei.value.errno == errno.ENOSPC
    assert list((tmp_path / "ckpt").iterdir()) == []  # the partial checkpoint was removed


@pytest.mark.skipif(not (os.path.exists("/dev/full") and stat.S_ISCHR(os.stat("/dev/full").st_mode)),
                    reason="needs the /dev/full character device")
def test_checkpoint_torch_short_write_is_explained(tmp_path, monkeypatch):
    real_save = torch.save

    def save_to_full_device(obj, f, *a, **k):  # torch's own writer hitting ENOSPC (writes in place, no rename)
        return real_save(obj, "/dev/full", *a, **k)

    monkeypatch.setattr(torch, "save", save_to_full_device)
    with pytest.raises(OutputWriteError) as ei:
        CheckpointManager(tmp_path / "ckpt").save(1, {"model": {"w": torch.zeros(100_000)}})
    msg = str(ei.value)
    assert msg.startswith(f"cannot write checkpoint to {tmp_path / 'ckpt' / 'step-00000001'}: the write came up "
                          "short, the file system is probably full")
    assert "unexpected pos" in msg  # torch's own words are kept


def test_checkpoint_read_only_dir(tmp_path, monkeypatch):
    def erofs(self, *a, **k):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "mkdir", erofs)
    with pytest.raises(OutputWriteError, match=r"cannot write checkpoint to .*step-00000002: Read-only file system "
                                               r"\(errno 30\).*writable"):
        CheckpointManager(tmp_path / "ckpt").save(2, {"model": {}})


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories; covered by the monkeypatch")
def test_checkpoint_read_only_dir_chmod(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(OutputWriteError, match=r"cannot write checkpoint to .*ro/ckpt/step-00000002: Permission "
                                                   r"denied \(errno 13\)"):
            CheckpointManager(ro / "ckpt").save(2, {"model": {}})
    finally:
        ro.chmod(0o700)


def test_metrics_disk_full_and_read_only(tmp_path, monkeypatch):
    logger = MetricLogger(tmp_path / "run", use_tensorboard=False)
    real = logger._jsonl
    logger._jsonl = types.SimpleNamespace(write=_enospc, flush=real.flush, close=real.close)
    with pytest.raises(OutputWriteError, match=rf"cannot write metrics to {tmp_path / 'run' / 'metrics.jsonl'}: "
                                               r"No space left on device \(errno 28\)"):
        logger.log({"loss": 1.0}, step=1)
    logger._jsonl = real
    logger.close()
    monkeypatch.setattr("builtins.open", lambda *a, **k: (_ for _ in ()).throw(
        OSError(errno.EROFS, os.strerror(errno.EROFS), str(a[0]))))
    with pytest.raises(OutputWriteError, match=r"cannot write metrics to .*metrics.jsonl: Read-only file system"):
        MetricLogger(tmp_path / "run2", use_tensorboard=False)


def test_flow_final_export_disk_full_names_the_output_dir(tmp_path):
    from safetensors import SafetensorError

    from flow_grpo.checkpoint import export_final

    def save_lora(path):  # what safetensors raises on a full disk (measured on a full tmpfs)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    trained = types.SimpleNamespace(ema=None, sharded=False, lora=True,  # a flow_grpo.build.TrainedModel's fields
                                    accelerator=types.SimpleNamespace(is_main_process=True),
                                    adapter=types.SimpleNamespace(save_lora=save_lora))
    with pytest.raises(OutputWriteError) as ei:
        export_final(trained, tmp_path / "run", epoch=1, global_step=1, applied_steps=1, ema_update_every=1)
    assert str(ei.value).startswith(f"cannot write the final weights export to {tmp_path / 'run'}: "
                                    "No space left on device (errno 28) [safetensors:")
    assert ei.value.errno == errno.ENOSPC
