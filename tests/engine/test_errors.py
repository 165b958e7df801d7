"""One exception family (mmgrpo.engine.errors): each class derives from the builtin its meaning fits, and both CLIs
turn each into its exit code."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from mmgrpo.engine import errors as E
from mmgrpo.utils import exit_codes


def test_bases_are_kept_and_shared():
    for cls in (E.TrainingStopped, E.NothingTrained, E.RewardCallFailed, E.OutputDirLocked):
        assert issubclass(cls, E.MMGRPOError) and issubclass(cls, RuntimeError)
    assert issubclass(E.RewardTimeout, TimeoutError) and issubclass(E.RewardTimeout, E.MMGRPOError)
    assert issubclass(E.TrainingInterrupted, E.MMGRPOError) and not issubclass(E.TrainingInterrupted, RuntimeError)


def test_training_stopped_messages():
    e = E.TrainingStopped("bad reward", "/o/step-3")  # VLM form: the resume hint is appended
    assert str(e) == "bad reward; checkpoint written: /o/step-3 (resume with run.resume_from=auto)"
    assert e.reason == "bad reward" and e.checkpoint == "/o/step-3"
    e = E.TrainingStopped("halted; continue with run.resume_from=/o/halted", "/o/halted", resume_hint=False)  # flow
    assert str(e) == "halted; continue with run.resume_from=/o/halted" and e.checkpoint == "/o/halted"
    assert str(E.TrainingStopped("why")) == "why"


CASES = [(E.TrainingStopped("s", "/c"), exit_codes.STOPPED), (E.TrainingStopped("h", resume_hint=False), exit_codes.STOPPED),
         (E.NothingTrained("n"), exit_codes.NOTHING_TRAINED), (E.OutputDirLocked("l"), exit_codes.LOCKED),
         (E.TrainingInterrupted("SIGTERM", "step 2", "/c"), exit_codes.INTERRUPTED)]


@pytest.mark.parametrize("exc,code", CASES, ids=lambda x: type(x).__name__ if isinstance(x, Exception) else str(x))
def test_both_clis_map_each_error_to_its_exit_code(monkeypatch, capsys, tmp_path, exc, code):
    import flow_grpo.train.trainer as ft
    import mmgrpo.vlm.train.trainer as tm
    import mmgrpo.utils.config as uc
    from flow_grpo.cli import main as flow_main
    from mmgrpo.vlm.cli import main as vlm_main

    def raising(cfg):
        raise exc

    monkeypatch.setattr(ft, "train_from_config", raising)
    assert flow_main(["train", "model.tiny=flux"]) == code
    assert capsys.readouterr().err.startswith(f"flow_grpo train: {exc}")
    cfg = SimpleNamespace(run=SimpleNamespace(output_dir=str(tmp_path)))  # the CLI releases the run lock at the end
    monkeypatch.setattr(uc, "parse_config_cli", lambda *a, **k: cfg)
    monkeypatch.setattr(tm, "GRPOTrainer", raising)
    assert vlm_main(["train"]) == code
    assert capsys.readouterr().err.startswith(f"mmgrpo train: {exc}")
