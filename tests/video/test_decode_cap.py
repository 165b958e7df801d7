"""The decode cap (issue 31, item 12): a video whose container header claims frames larger than
``max_frame_pixels`` (default 8K UHD) raises VideoTooLarge from the header, before either backend opens the file (decord
decodes frame 0 when it opens one). The header probe reads size, fps, frame count and duration without decoding."""
import numpy as np
import pytest

from mmgrpo.video import (MAX_FRAME_PIXELS, VideoError, VideoTooLarge, load_video, probe_header, probe_video,
                          write_video)
from mmgrpo.video import decode as D


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    p = tmp_path_factory.mktemp("cap") / "clip.mp4"
    write_video(str(p), iter([np.full((64, 96, 3), 9 * k, np.uint8) for k in range(24)]), 8.0)  # 3.0 s
    return str(p)


def _no_backend(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a decoding backend opened the file")

    monkeypatch.setattr(D._DecordReader, "__init__", refuse)
    monkeypatch.setattr(D._PyAVReader, "__init__", refuse)


def test_a_huge_header_is_refused_before_decoding(tmp_path, monkeypatch):
    huge = tmp_path / "huge.y4m"  # 16000 x 9000 (144 MP) claimed by a 1 kB file
    huge.write_bytes(b"YUV4MPEG2 W16000 H9000 F25:1 Ip A1:1 C420jpeg\nFRAME\n" + b"\x80" * 1000)
    _no_backend(monkeypatch)
    with pytest.raises(VideoTooLarge, match=r"huge\.y4m: frames of 16000x9000 = 144,000,000 pixels exceed the decode "
                                            r"cap of 33,177,600 pixels \(data\.max_video_frame_pixels"):
        load_video(str(huge))
    assert MAX_FRAME_PIXELS == 7680 * 4320
    assert isinstance(VideoTooLarge("x", "y"), VideoError)  # callers that skip VideoError skip this too


def test_the_cap_is_a_setting(clip, monkeypatch):
    assert load_video(clip, max_frame_pixels=96 * 64).frames.shape[0] > 0  # exactly at the cap: fine
    with pytest.raises(VideoTooLarge, match=r"96x64 = 6,144 pixels exceed the decode cap of 6,143"):
        load_video(clip, max_frame_pixels=96 * 64 - 1)
    # without PyAV's header the backend's own size is checked after opening
    monkeypatch.setattr(D, "probe_header", lambda p: (_ for _ in ()).throw(VideoError(p, "no header")))
    with pytest.raises(VideoTooLarge):
        load_video(clip, max_frame_pixels=100)


def test_probe_header_agrees_with_the_decoders(clip):
    h, info = probe_header(clip), probe_video(clip)
    assert (h.width, h.height, h.fps, h.frames) == (info.width, info.height, info.fps, info.total_frames)
    assert (h.width, h.height, h.frames) == (96, 64, 24)
    assert h.duration == pytest.approx(24 / 8.0, abs=1 / 8.0)
