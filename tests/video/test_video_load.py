"""load_video on real mp4 files written with PyAV: parity with qwen-vl-utils, frame indices read back from the
pixels, clips, both backends, frame lists and every error path."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmgrpo.video import VideoError, load_video, probe_video, write_video
from mmgrpo.video.testing import decode_frame_index, index_frame, write_index_video

F2 = 28 * 28
SMALL = dict(min_pixels=4 * F2, max_pixels=16 * F2)


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    d = tmp_path_factory.mktemp("videos")
    return {
        "v8": write_index_video(d / "v8.mp4", 48, 8.0),                      # 6 s
        "v7_5": write_index_video(d / "v7_5.mp4", 75, 7.5, 48, 96),          # 10 s, fractional fps
        "ntsc": write_index_video(d / "ntsc.mp4", 61, 30000 / 1001, 64, 64),  # 2.035 s at 29.97
        "dir": d,
    }


PARITY_CASES = [
    ("v8", dict(fps=2.0, **SMALL)),
    ("v8", dict(fps=0.5, **SMALL)),
    ("v8", dict(fps=1.0, video_start=1.0, video_end=4.3, total_pixels=40 * F2, min_pixels=4 * F2)),
    ("v8", dict(nframes=6, **SMALL)),
    ("v8", dict(fps=4.0, max_frames=8, min_frames=4, min_pixels=8 * F2)),
    ("v7_5", dict(fps=2.0, min_pixels=4 * F2, total_pixels=100 * F2)),
    ("v7_5", dict(fps=1.0, video_start=2.5, **SMALL)),
    ("ntsc", dict(fps=2.0, **SMALL)),
    ("ntsc", dict(fps=8.0, video_end=1.5, **SMALL)),
]


@pytest.mark.parametrize("name, kw", PARITY_CASES)
def test_parity_with_qwen_vl_utils(videos, name, kw, monkeypatch):
    qvu = pytest.importorskip("qwen_vl_utils.vision_process")
    monkeypatch.setattr(qvu, "get_video_reader_backend", lambda: "decord")
    path = videos[name]
    (ref, meta), ref_fps = qvu.fetch_video({"video": str(path), **kw}, return_video_sample_fps=True,
                                           return_video_metadata=True)
    clip = load_video(path, backend="decord", **kw)
    assert clip.frame_indices == list(meta["frames_indices"])
    assert clip.sample_fps == pytest.approx(ref_fps, rel=1e-12)
    assert clip.video_fps == pytest.approx(meta["fps"], rel=1e-12)
    ours = clip.frames.permute(0, 3, 1, 2).float()
    assert tuple(ours.shape) == tuple(ref.shape)
    assert bool((ours == ref).all()), "frames must be bit-identical to qwen-vl-utils'"


def test_full_video_time_axis_hand_values(videos):
    # 48 frames at 8 fps, 2 fps -> n = 12, indices round(linspace(0, 47, 12)), sample_fps = 12/48*8 = 2
    clip = load_video(videos["v8"], fps=2.0, **SMALL)
    exp = np.round(np.linspace(0, 47, 12)).astype(int).tolist()
    assert clip.frame_indices == exp
    assert clip.sample_fps == pytest.approx(2.0)
    assert clip.timestamps == pytest.approx([i / 8.0 for i in exp])
    assert (clip.total_frames, clip.video_fps, clip.duration) == (48, 8.0, 6.0)
    assert (clip.clip_start, clip.clip_end) == (0.0, 6.0)
    assert clip.num_frames / clip.sample_fps == pytest.approx(clip.covered_duration)
    assert clip.second_per_grid_ts() == pytest.approx(1.0)
    assert clip.frames.dtype.is_floating_point is False and clip.frames.shape[-1] == 3
    # the pixels say which frame was decoded (independent of the index arithmetic)
    assert [decode_frame_index(f) for f in clip.frames.numpy()] == exp


def test_clip_range_hand_values(videos):
    # start = ceil(1.0*8) = 8, end = floor(4.3*8) = 34, N = 27; n = max(27/8*1, 4) -> 4
    clip = load_video(videos["v8"], fps=1.0, video_start=1.0, video_end=4.3, **SMALL)
    assert clip.clip_frames == (8, 34)
    assert clip.frame_indices == [8, 17, 25, 34]
    assert clip.sample_fps == pytest.approx(4 / 27 * 8)
    assert clip.clip_start == pytest.approx(1.0) and clip.clip_end == pytest.approx(35 / 8)
    assert clip.timestamps == pytest.approx([1.0, 17 / 8, 25 / 8, 34 / 8])
    assert clip.duration == pytest.approx(6.0) and clip.total_frames == 48
    assert [decode_frame_index(f) for f in clip.frames.numpy()] == [8, 17, 25, 34]
    assert clip.video_metadata().sampled_fps == pytest.approx(clip.sample_fps)
    assert clip.video_metadata().timestamps == pytest.approx(clip.timestamps)


def test_fractional_fps(videos):
    clip = load_video(videos["ntsc"], fps=8.0, **SMALL)
    vfps = 30000 / 1001
    assert clip.video_fps == pytest.approx(vfps, rel=1e-6)
    n = math.floor(61 / vfps * 8 / 2) * 2  # 16.28 -> 16
    assert clip.num_frames == n
    assert clip.sample_fps == pytest.approx(n / 61 * vfps)
    assert [decode_frame_index(f) for f in clip.frames.numpy()] == clip.frame_indices


def test_pyav_backend_matches_decord(videos):
    for name in ("v8", "v7_5", "ntsc"):
        a = load_video(videos[name], backend="decord", fps=4.0, **SMALL)
        b = load_video(videos[name], backend="pyav", fps=4.0, **SMALL)
        assert (a.backend, b.backend) == ("decord", "pyav")
        assert a.frame_indices == b.frame_indices and a.total_frames == b.total_frames
        assert a.video_fps == pytest.approx(b.video_fps, rel=1e-9)
        assert bool((a.frames == b.frames).all())
    info = probe_video(videos["v7_5"], backend="pyav")
    assert (info.total_frames, info.height, info.width) == (75, 48, 96) and info.fps == pytest.approx(7.5)


def test_frame_list_same_rules(videos):
    frames = [index_frame(i, 48, 64) for i in range(48)]
    clip = load_video(frames, fps=2.0, video_fps=8.0, **SMALL)
    from_file = load_video(videos["v8"], fps=2.0, **SMALL)
    assert clip.backend == "frames" and clip.path is None
    assert clip.frame_indices == from_file.frame_indices and clip.sample_fps == from_file.sample_fps
    assert [decode_frame_index(f) for f in clip.frames.numpy()] == clip.frame_indices
    # (T, H, W, 3) array and PIL images are accepted too; default video_fps = fps (frames already sampled)
    from PIL import Image

    arr = np.stack(frames[:10])
    c2 = load_video(arr, fps=2.0, **SMALL)
    c3 = load_video([Image.fromarray(f) for f in frames[:10]], fps=2.0, **SMALL)
    assert c2.frame_indices == list(range(10)) == c3.frame_indices
    assert c2.sample_fps == 2.0 and c2.duration == 5.0 and bool((c2.frames == c3.frames).all())


def test_frame_list_errors():
    with pytest.raises(VideoError, match="zero frames"):
        load_video([], fps=2.0)
    with pytest.raises(VideoError, match="frame 1"):
        load_video([np.zeros((8, 8, 3), np.uint8), np.zeros((8, 9, 3), np.uint8)])
    with pytest.raises(VideoError, match=r"\(T, H, W, 3\)"):
        load_video(np.zeros((4, 8, 8), np.uint8))
    with pytest.raises(VideoError, match="cannot sample"):
        load_video([np.zeros((56, 56, 3), np.uint8)])  # one frame cannot fill a temporal patch


def _bad_files(d, good):
    data = open(good, "rb").read()
    (d / "trunc_half.mp4").write_bytes(data[: len(data) // 2])
    (d / "garbage.mp4").write_bytes(b"not a video at all " * 20)
    (d / "zero.mp4").write_bytes(b"")
    # a container with an audio stream and no video stream: zero video frames
    import av

    with av.open(str(d / "audio_only.mp4"), "w") as c:
        s = c.add_stream("aac", rate=16000)
        fr = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        fr.sample_rate = 16000
        for i in range(4):
            fr.pts = i * 1024
            for p in s.encode(fr):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return d


@pytest.mark.parametrize("backend", ["auto", "decord", "pyav"])
@pytest.mark.parametrize("fname, problem", [
    ("missing.mp4", "file not found"),
    ("zero.mp4", "empty file"),
    ("garbage.mp4", "cannot read video"),
    ("trunc_half.mp4", "cannot (read|decode)"),
    ("audio_only.mp4", "cannot read video"),
])
def test_errors_name_path_and_problem(videos, backend, fname, problem):
    d = videos["dir"]
    if not (d / "garbage.mp4").exists():
        _bad_files(d, videos["v7_5"])
    path = d / fname
    with pytest.raises(VideoError, match=problem) as ei:
        load_video(path, backend=backend, **SMALL)
    assert str(ei.value).startswith(str(path)) and ei.value.path == str(path)


def test_truncated_faststart_mid_stream(tmp_path):
    """moov atom first, mdat cut: the header promises frames the file does not hold."""
    import av

    p = tmp_path / "fs.mp4"
    rng = np.random.default_rng(0)
    with av.open(str(p), "w", options={"movflags": "faststart"}) as c:
        s = c.add_stream("libx264", rate=10)
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        for _ in range(40):
            for pk in s.encode(av.VideoFrame.from_ndarray(rng.integers(0, 255, (48, 64, 3), np.uint8), "rgb24")):
                c.mux(pk)
        for pk in s.encode():
            c.mux(pk)
    data = p.read_bytes()
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: int(len(data) * 0.7)])
    with pytest.raises(VideoError) as ei:
        load_video(cut, fps=2.0, **SMALL)
    assert str(cut) in str(ei.value) and ("truncated" in str(ei.value) or "corrupt" in str(ei.value))


def test_empty_clip_is_a_video_error(videos):
    with pytest.raises(VideoError, match="empty clip"):
        load_video(videos["v8"], video_start=5.0, video_end=2.0, **SMALL)


def test_write_video_rejects_nothing(tmp_path):
    with pytest.raises(ValueError, match="no frames"):
        write_video(tmp_path / "x.mp4", [], 4.0)


_FRAMES = [index_frame(i, 48, 64) for i in range(60)]


@given(total=st.integers(2, 60), vfps=st.sampled_from([4.0, 7.5, 10.0, 29.97]), fps=st.floats(0.2, 8.0),
       a=st.floats(0, 1), b=st.floats(0, 1), use_clip=st.booleans())
@settings(max_examples=20, deadline=None)
def test_frame_list_time_axis_properties(total, vfps, fps, a, b, use_clip):
    """Invariants of the contract on random frame lists; frame identity read back from the pixels."""
    dur = total / vfps
    start, end = (sorted((a * dur, b * dur)) if use_clip else (None, None))
    try:
        clip = load_video(_FRAMES[:total], fps=fps, video_fps=vfps, video_start=start, video_end=end, **SMALL)
    except VideoError as e:
        assert "empty clip" in str(e) or "cannot sample" in str(e)
        return
    n, (s0, e0) = clip.num_frames, clip.clip_frames
    assert n % 2 == 0 and n >= 2 and 0 <= s0 < e0 < total
    assert clip.frame_indices[0] == s0 and clip.frame_indices[-1] == e0
    assert all(q > p for p, q in zip(clip.frame_indices, clip.frame_indices[1:]))
    assert clip.timestamps == pytest.approx([i / vfps for i in clip.frame_indices])
    assert n / clip.sample_fps == pytest.approx(clip.covered_duration) == pytest.approx((e0 - s0 + 1) / vfps)
    if start is not None:
        assert clip.clip_start >= start - 1e-9 and clip.clip_start - start < 1 / vfps + 1e-9
    assert [decode_frame_index(f) for f in clip.frames.numpy()] == clip.frame_indices
