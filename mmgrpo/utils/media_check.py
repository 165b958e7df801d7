"""Header-level checks of media files, cheap enough to run on every file when the data is loaded (before step 1),
so that a file the run cannot use is skipped and counted, or refused with its location, instead of crashing the run
when its batch comes up (and again on every resume).

What is checked (and what is not):

* image (:func:`inspect_image`): Pillow opens the file and reads its header (format, size): not an image, an
  unknown format or a truncated header is ``unreadable``; more than ``max_pixels`` pixels is ``too_large`` (a
  24 kB PNG can claim 196 megapixels: Pillow's ``DecompressionBombError``, which is not an ``OSError``). Then
  ``Image.verify()``: for PNG it walks every chunk and checks its CRC (reads the file, does not inflate it), for other
  formats it is (nearly) a no-op. Pixel data is **not** decoded: a JPEG truncated mid-scan passes here and is caught
  at run time (a counted skip, ``data.on_missing_media``). Measured: ~0.02-0.2 ms per image (header), +1.5 ms for
  the PNG verify of a 1.4 MB file.
* video (:func:`inspect_video`): the container header through PyAV without decoding a frame (:func:`
  mmgrpo.video.decode.probe_header`): size, fps, frame count, duration; frames over ``max_frame_pixels`` are
  ``too_large``. ~1-4 ms CPU per file.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

# Pillow's own limit (Image.MAX_IMAGE_PIXELS, ~89.5 MP): above it Pillow warns, above twice it raises
# DecompressionBombError. The project's default cap is the same number.
DEFAULT_MAX_IMAGE_PIXELS = 89_478_485

__all__ = ["DEFAULT_MAX_IMAGE_PIXELS", "MediaProblem", "ImageHeader", "inspect_image", "inspect_video"]


class MediaProblem(ValueError):
    """A media file the run cannot use. ``kind``: ``missing`` | ``unreadable`` | ``too_large``; the message starts
    with the path."""

    def __init__(self, path: str, kind: str, reason: str):
        self.path, self.kind, self.reason = path, kind, reason
        super().__init__(f"{path}: {reason}")


@dataclass(frozen=True)
class ImageHeader:
    width: int
    height: int
    format: str


def inspect_image(path: str | os.PathLike, max_pixels: Optional[int] = DEFAULT_MAX_IMAGE_PIXELS,
                  verify: bool = True) -> ImageHeader:
    """Open ``path``'s header with Pillow and check it (module docstring); :class:`MediaProblem` otherwise."""
    from PIL import Image

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise MediaProblem(path, "missing", "file not found" if not os.path.exists(path) else "not a file")
    try:
        with Image.open(path) as im:
            w, h, fmt = int(im.width), int(im.height), str(im.format)
            if max_pixels and w * h > max_pixels:
                raise MediaProblem(path, "too_large", f"image of {w}x{h} = {w * h:,} pixels exceeds the cap of "
                                                      f"{max_pixels:,} pixels")
            if verify:
                im.verify()
    except MediaProblem:
        raise
    except Image.DecompressionBombError as e:  # over twice Pillow's limit: not an OSError
        raise MediaProblem(path, "too_large", f"image too large to open ({e})") from None
    except Exception as e:  # UnidentifiedImageError (an OSError), SyntaxError / ValueError of broken files, ...
        raise MediaProblem(path, "unreadable", f"not a readable image ({type(e).__name__}: "
                                               f"{' '.join(str(e).split())[:200]})") from None
    if w < 1 or h < 1:
        raise MediaProblem(path, "unreadable", f"empty image ({w}x{h})")
    return ImageHeader(w, h, fmt)


def inspect_video(path: str | os.PathLike, max_frame_pixels: Optional[int] = None):
    """The container header of a video (:class:`mmgrpo.video.decode.VideoHeader`), no frame decoded; frames over
    ``max_frame_pixels`` (default: the decode cap, 8K UHD) are ``too_large``. :class:`MediaProblem` otherwise."""
    from mmgrpo.video.decode import MAX_FRAME_PIXELS, VideoError, VideoTooLarge, check_frame_size, probe_header

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise MediaProblem(path, "missing", "file not found" if not os.path.exists(path) else "not a file")
    if os.path.getsize(path) == 0:
        raise MediaProblem(path, "unreadable", "empty file (0 bytes)")
    try:
        head = probe_header(path)
        check_frame_size(path, head.width, head.height,
                         MAX_FRAME_PIXELS if max_frame_pixels is None else max_frame_pixels)
    except VideoTooLarge as e:
        raise MediaProblem(path, "too_large", e.problem) from None
    except VideoError as e:
        raise MediaProblem(path, "unreadable", e.problem) from None
    if head.width < 1 or head.height < 1:
        raise MediaProblem(path, "unreadable", "no frame size in the header")
    return head
