"""The Qwen-VL family registry (``mmgrpo.vlm.models.adapters.ADAPTERS``) is the only list of families: the configs
accept exactly its families (an unknown one is named with the registered ones and the nearest), and the tiny builders
build any registered family from its adapter alone."""
import dataclasses
import inspect

import pytest

from mmgrpo.utils.config import load_config
from mmgrpo.vlm.config import TrainConfig
from mmgrpo.vlm.models import tiny
from mmgrpo.vlm.models.adapters import ADAPTERS


def test_config_accepts_the_registered_families(monkeypatch):
    for family in ["auto", *ADAPTERS]:
        assert load_config(TrainConfig, None, [f"model.family={family}"]).model.family == family
    # a family registered once (its ADAPTERS entry) is accepted: the config keeps no list of its own
    monkeypatch.setitem(ADAPTERS, "my_vl", dataclasses.replace(ADAPTERS["qwen3_vl"], family="my_vl"))
    assert load_config(TrainConfig, None, ["model.family=my_vl"]).model.family == "my_vl"


@pytest.mark.parametrize("value,nearest", [("qwen3vl", "qwen3_vl"), ("qwen2.5_vl", "qwen2_5_vl"), ("llava", None)])
def test_an_unknown_family_is_named_with_the_registered_ones(value, nearest):
    with pytest.raises(ValueError) as ei:
        load_config(TrainConfig, None, [f"model.family={value}"])
    msg = str(ei.value)
    assert f"config key 'model.family': unknown model family '{value}'" in msg
    assert str(["auto", *ADAPTERS]) in msg
    assert (f"did you mean '{nearest}'?" in msg) if nearest else "did you mean" not in msg


def test_help_lists_the_registered_families():
    from mmgrpo.utils.config import fields_help

    text = fields_help(TrainConfig)
    assert all(f in text for f in ADAPTERS)


def test_the_tiny_builders_name_no_family():
    """Everything family-specific is in the adapter: tiny.py builds what its entry declares."""
    src = inspect.getsource(tiny).replace('family: str = "qwen2_5_vl"', "")  # the default family is no branch
    named = {f'"{f}"' for f in ADAPTERS} | {n for a in ADAPTERS.values() for n in (
        a.model_class_name, a.config_class_name, a.processor_class_name, a.image_processor_class_name,
        a.video_processor_class_name)}
    assert not [n for n in named if n in src]


def test_a_registered_family_gets_its_tiny_checkpoint_from_the_adapter(monkeypatch):
    """A new entry (here: Qwen3-VL's declarations under another name) builds with no change to tiny.py, and the
    builder reads what the entry declares: its classes, vision tower and processor settings."""
    monkeypatch.setitem(ADAPTERS, "my_vl", dataclasses.replace(ADAPTERS["qwen3_vl"], family="my_vl"))
    proc = tiny.build_tiny_processor("my_vl")
    assert type(proc).__name__ == "Qwen3VLProcessor" and type(proc.video_processor).__name__ == "Qwen3VLVideoProcessor"
    assert proc.image_processor.patch_size == 16 and list(proc.image_processor.image_mean) == [0.5] * 3
    cfg = tiny.tiny_config("my_vl", proc.tokenizer)
    assert type(cfg).__name__ == "Qwen3VLConfig" and cfg.vision_config.deepstack_visual_indexes == [1]
    assert cfg.text_config.head_dim == 16 and cfg.text_config.vocab_size == len(proc.tokenizer)
    # the builder copies the declaration: a config that changes what it got leaves the registry as it was
    cfg.vision_config.deepstack_visual_indexes.append(0)
    assert ADAPTERS["qwen3_vl"].tiny_vision["deepstack_visual_indexes"] == [1]
    assert tiny.model_class("my_vl").__name__ == "Qwen3VLForConditionalGeneration"
    with pytest.raises(ValueError, match=r"unknown model family 'qwen9'.*did you mean"):
        tiny.build_tiny_processor("qwen9")


def test_every_entry_declares_what_the_shared_code_reads(monkeypatch):
    """The box frame and video time contract of each entry are ones the reward and video code know, and the video
    code's processor classes follow the contract the entry declares; a family's name is an alias of its box frame."""
    from mmgrpo.video.processor import PROCESSOR_TIME, TIME_CONTRACTS
    from mmgrpo.vlm.data.prompts import build_messages
    from mmgrpo.vlm.rewards.box import FRAMES, resolve_box_frame

    for family, a in ADAPTERS.items():
        assert a.family == family and a.box_frame in FRAMES and a.video_time in TIME_CONTRACTS
        assert [t for p, t in PROCESSOR_TIME.items() if a.processor_class_name.startswith(p)] == [a.video_time]
    monkeypatch.setitem(ADAPTERS, "my_vl", dataclasses.replace(ADAPTERS["qwen2_5_vl"], family="my_vl"))
    assert resolve_box_frame("my_vl") == "resized_abs"
    rec = {"id": "r", "task": "rec", "query": "the cup", "image": "x.png", "boxes": [[1, 2, 3, 4]],
           "image_size": [10, 10]}
    assert build_messages(rec, box_frame="my_vl") == build_messages(rec, box_frame="qwen2_5_vl") != \
        build_messages(rec, box_frame="norm1000")
    with pytest.raises(ValueError, match="unknown box frame 'my_vl2'"):
        resolve_box_frame("my_vl2")


def test_make_tiny_names_the_registered_families(tmp_path, capsys):
    from mmgrpo.vlm.cli import main

    assert main(["make-tiny", str(tmp_path / "t"), "qwen3vl"]) == 2
    err = capsys.readouterr().err
    assert "unknown model family 'qwen3vl' (did you mean 'qwen3_vl'?)" in err and str(list(ADAPTERS)) in err
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("nested", [True, False])
def test_a_registry_error_names_the_yaml_file_that_set_the_key(tmp_path, nested):
    """The family is checked after the config is built (in __post_init__); the error still names the file, as a
    parse error does, unless a key=value override replaced the file's value."""
    from flow_grpo.config import TrainConfig as FlowConfig

    y = tmp_path / "bad.yaml"
    y.write_text("model:\n  family: qwen3vl\n" if nested else "model.family: qwen3vl\n")
    with pytest.raises(ValueError) as e:
        load_config(TrainConfig, y)
    assert str(e.value).startswith(f"{y}: config key 'model.family': unknown model family 'qwen3vl'")
    with pytest.raises(ValueError) as e:  # the bad value comes from the command line: no file to name
        load_config(TrainConfig, y, ["model.family=qwen9"])
    assert str(e.value).startswith("config key 'model.family': unknown model family 'qwen9'")
    # the flow front-end's registry check gets the same
    y.write_text("model:\n  kind: sd33\n" if nested else "model.kind: sd33\n")
    with pytest.raises(ValueError) as e:
        load_config(FlowConfig, y)
    assert str(e.value).startswith(f"{y}: config key 'model.kind': unknown generator 'sd33'")
