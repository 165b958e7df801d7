"""Tool interface, Qwen tool-call parsing and the built-in tools (crop / zoom / seek), against hand-computed
boxes, pixels and frame indices."""
import numpy as np
import pytest
from PIL import Image

from mmgrpo.vlm.tools import ToolContext, ToolsConfig, call_tool, format_tool_call, parse_tool_calls, register_tool
from mmgrpo.vlm.tools.base import TOOLS, ToolResult
from mmgrpo.vlm.tools.builtin import crop_size


# ------------------------------------------------------------------------------------------------ parsing
def test_parse_qwen_tool_calls():
    t = ('I look closer.\n<tool_call>\n{"name": "crop", "arguments": {"bbox_2d": [1, 2, 3, 4]}}\n</tool_call>'
         '<tool_call>{"name": "seek", "arguments": "{\\"start\\": 1, \\"end\\": 2}"}</tool_call>')
    calls = parse_tool_calls(t)
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("crop", {"bbox_2d": [1, 2, 3, 4]}, ""), ("seek", {"start": 1, "end": 2}, "")]
    assert parse_tool_calls("<answer>B</answer>") == []
    bad = parse_tool_calls("<tool_call>{crop}</tool_call> <tool_call>[1]</tool_call> <tool_call>{\"name\": 1")
    assert len(bad) == 3 and all(c.error for c in bad)
    assert "not valid JSON" in bad[0].error and "JSON object" in bad[1].error and "unterminated" in bad[2].error
    # the block the template writes parses back
    assert parse_tool_calls(format_tool_call("zoom", {"point_2d": [5, 6]}))[0].arguments == {"point_2d": [5, 6]}


# ------------------------------------------------------------------------------------------------ crop / zoom
def _gradient(W=400, H=200):
    a = np.zeros((H, W, 3), np.uint8)
    a[..., 0] = (np.arange(W) * 255 // (W - 1))[None, :]
    a[..., 1] = (np.arange(H) * 255 // (H - 1))[:, None]
    return Image.fromarray(a)


def _ctx(family="qwen2_5_vl", **opt):
    im = _gradient()
    return ToolContext(images=[im], family=family, resized_sizes=[(112, 56)], image_factor=28,
                       options=ToolsConfig(**opt)), im


def test_crop_box_frame_to_source_pixels():
    # Qwen2.5-VL writes pixels of the 112x56 model-input image: x * 400/112, y * 200/56 (= 25/7 both)
    ctx, im = _ctx(crop_pixels=56 * 56)
    r = call_tool("crop", ctx, {"bbox_2d": [28, 14, 56, 42]})
    assert r.ok and "[100, 50, 200, 150]" in r.text
    out = r.images[0]
    assert out.size == (56, 56)  # 100x100 source pixels scaled to the 56*56 budget
    want = im.crop((100, 50, 200, 150)).resize((56, 56), Image.BICUBIC)
    assert np.array_equal(np.asarray(out), np.asarray(want))
    # Qwen2-VL / Qwen3-VL: 0-1000 relative coordinates; corners in any order
    ctx3, _ = _ctx("qwen3_vl", crop_pixels=56 * 56)
    r3 = call_tool("crop", ctx3, {"bbox_2d": [500, 750, 250, 250]})
    assert r3.ok and "[100, 50, 200, 150]" in r3.text
    # default budget: the first view's model-input area (112 * 56)
    ctx0, _ = _ctx()
    assert call_tool("crop", ctx0, {"bbox_2d": [0, 0, 112, 56]}).images[0].size == (112, 56)


def test_crop_size_rounds_to_the_patch_grid():
    assert crop_size(100, 100, 56 * 56, 28) == (56, 56)
    assert crop_size(300, 100, 28 * 28 * 12, 28) == (168, 56)  # beta = sqrt(9408 / 30000) = 0.56
    assert crop_size(1, 1000, 784, 28) == (28, 868)  # one patch at least


@pytest.mark.parametrize("args,msg", [
    ({"bbox_2d": [1, 2, 3]}, "list of 4 numbers"),
    ({"bbox_2d": [0, 0, "a", 4]}, "finite numbers"),
    ({"bbox_2d": [500, 500, 600, 600]}, "covers 0x0"),  # entirely right of / below the 112x56 view
    ({"bbox_2d": [0, 0, 10, 10], "image": 3}, "index in [0, 1)"),
    ({}, "list of 4 numbers"),
])
def test_bad_arguments_are_a_failed_call_not_a_crash(args, msg):
    ctx, _ = _ctx()
    r = call_tool("crop", ctx, args)
    assert not r.ok and r.text.startswith("Error: crop:") and msg in r.text and not r.images


def test_unknown_tool_and_non_object_arguments():
    ctx, _ = _ctx()
    assert not call_tool("nope", ctx, {}).ok
    assert "available: crop" in call_tool("seek", ctx, {}, allowed=["crop"]).text
    assert not call_tool("crop", ctx, [1, 2]).ok


def test_zoom_centres_a_box_of_one_factor_of_the_image():
    ctx, im = _ctx(crop_pixels=28 * 28 * 4)
    # point (56, 28) of the 112x56 view = source (200, 100); factor 4 -> 100x50 box at [150, 75, 250, 125]
    r = call_tool("zoom", ctx, {"point_2d": [56, 28], "factor": 4})
    assert r.ok and "[150, 75, 250, 125]" in r.text
    # near a corner the box shifts inside the image
    r = call_tool("zoom", ctx, {"point_2d": [0, 0], "factor": 4})
    assert "[0, 0, 100, 50]" in r.text
    assert not call_tool("zoom", ctx, {"point_2d": [0, 0], "factor": 0.5}).ok


def test_register_a_user_tool():
    def echo(ctx, args):
        if "say" not in args:
            raise KeyError("say is required")
        return ToolResult(text=str(args["say"]))

    register_tool("echo_test", echo)
    try:
        ctx, _ = _ctx()
        assert call_tool("echo_test", ctx, {"say": "hi"}).text == "hi"
        bad = call_tool("echo_test", ctx, {})
        assert not bad.ok and "say is required" in bad.text
        with pytest.raises(ValueError, match="already registered"):
            register_tool("echo_test", lambda c, a: None)
    finally:
        TOOLS.pop("echo_test")


# ------------------------------------------------------------------------------------------------ seek
def test_seek_resamples_the_window_with_its_time_axis():
    from mmgrpo.video.clip import load_video
    from mmgrpo.video.testing import decode_frame_index, index_frame

    frames = np.stack([index_frame(i, 56, 56) for i in range(40)])  # 40 frames at 4 fps = 10 s
    first = load_video(frames, fps=0.5, video_fps=4.0, min_frames=2, image_factor=28, min_pixels=784,
                       max_pixels=56 * 56)
    assert first.num_frames == 4  # 10 s * 0.5 fps = 5, rounded down to even: the first view is sparse
    ctx = ToolContext(sample={"video": frames}, clip=first, image_factor=28,
                      options=ToolsConfig(seek_fps=2.0, seek_max_frames=8))
    r = call_tool("seek", ctx, {"start": 3.0, "end": 5.0})
    assert r.ok, r.text
    c = r.clips[0]
    # decoded frames 12..20 (3.0 s * 4 fps .. 5.0 s * 4 fps, inclusive): 9 frames = 2.25 s at 2 fps = 4.5 -> 4
    # frames, indices round(linspace(12, 20, 4)) = round(12, 14.67, 17.33, 20)
    assert c.frame_indices == [12, 15, 17, 20]
    assert [decode_frame_index(f.numpy()) for f in c.frames] == [12, 15, 17, 20]
    assert c.timestamps == [3.0, 3.75, 4.25, 5.0]
    assert "3.00, 3.75, 4.25, 5.00" in r.text
    for args in ({"start": 6, "end": 5}, {"start": 11, "end": 12}, {"start": "a", "end": 2}):
        assert not call_tool("seek", ctx, args).ok
    assert not call_tool("seek", ToolContext(options=ToolsConfig()), {"start": 0, "end": 1}).ok


def test_tools_modules_registers_user_tools_from_the_command_line(tmp_path, monkeypatch):
    """``tools.modules`` imports a module whose import registers a tool, so ``mmgrpo train`` key=value settings alone
    can offer it; a module that does not import or a name still unknown is a config error naming the field."""
    from mmgrpo.utils.config import load_config
    from mmgrpo.vlm.config import TrainConfig

    (tmp_path / "my_tools_mod37.py").write_text(
        "from mmgrpo.vlm.tools import register_tool, ToolResult\n"
        "register_tool('echo37', lambda ctx, args: ToolResult(text=str(args)))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "echo37" not in TOOLS
    over = ["tools.enabled=true", "tools.names=[echo37]", "tools.modules=[my_tools_mod37]"]
    try:
        cfg = load_config(TrainConfig, None, over)
        assert cfg.tools.modules == ["my_tools_mod37"]
        res = call_tool("echo37", ToolContext(sample={}), {"a": 1}, allowed=cfg.tools.names)
        assert res.ok and res.text == "{'a': 1}"
        with pytest.raises(ValueError, match=r"tools.names: \['nope37'\]"):
            ToolsConfig(enabled=True, names=["echo37", "nope37"], modules=["my_tools_mod37"]).check()
        with pytest.raises(ValueError, match="tools.modules: cannot import 'no_such_mod37'"):
            ToolsConfig(enabled=True, names=["echo37"], modules=["no_such_mod37"]).check()
    finally:
        TOOLS.pop("echo37", None)
