"""`flow_grpo make-tiny DIR [KIND]` and `flow_grpo make-tiny-reward DIR [NAME]`: a tiny pipeline folder and a tiny
reward model in its release's layout, from the command line (issue 32 item 12), loadable by the trainer's paths."""
from flow_grpo.cli import main


def test_make_tiny_writes_a_pipeline_folder_the_loader_reads(tmp_path, capsys):
    from flow_grpo.models import load_adapter

    assert main(["make-tiny", str(tmp_path / "sd3"), "sd3"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "sd3")
    ad = load_adapter(str(tmp_path / "sd3"), max_sequence_length=8)
    assert ad.kind == "sd3"


def test_make_tiny_reward_writes_pickscore_in_two_folders_and_prints_its_settings(tmp_path, capsys):
    import numpy as np

    from flow_grpo.rewards import build_reward, check_reward_settings

    assert main(["make-tiny-reward", str(tmp_path / "pick")]) == 0
    line = capsys.readouterr().out.strip()
    kw = {"model_path": str(tmp_path / "pick" / "model"), "processor_path": str(tmp_path / "pick" / "processor")}
    assert line == f"reward.kwargs='{{pickscore: {{model_path: {kw['model_path']}, processor_path: {kw['processor_path']}}}}}'"
    assert check_reward_settings({"pickscore": 1.0}, {"pickscore": kw}) == []
    r = build_reward("pickscore", **kw)(np.zeros((2, 40, 40, 3), dtype=np.uint8), ["a", "b"])
    assert r["pickscore"].shape == (2,)
