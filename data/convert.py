"""Convert public annotation formats to the canonical JSONL schema.

    python data/convert.py FORMAT IN OUT [options]

FORMAT: charades_sta | dense_captions (= activitynet) | time_r1 (= tvgbench) | tempsamp | nextgqa | video_r1 |
refcoco | vsibench | qvhighlights | seed_bench_r1 | longvideobench | mmvu | clevrer.
See ``mmgrpo.vlm.data.converters`` for each format; prints a summary of converted / skipped / clamped records.
"""
import argparse
import json
import logging
import os
import sys

if __package__ in (None, ""):  # run as a script from a checkout: make the repo importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FORMATS = ("charades_sta", "dense_captions", "activitynet", "time_r1", "tvgbench", "tempsamp", "nextgqa", "video_r1",
           "refcoco", "vsibench", "qvhighlights", "seed_bench_r1", "longvideobench", "mmvu", "clevrer")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("format", choices=FORMATS)
    p.add_argument("input", help="annotation file (txt / json / jsonl)")
    p.add_argument("output", help="canonical JSONL to write")
    p.add_argument("--on-error", choices=("raise", "skip"), default="raise",
                   help="stop at the first bad record (default) or skip and count it")
    p.add_argument("--swap-reversed", action="store_true", help="swap reversed spans instead of failing")
    p.add_argument("--clamp-tolerance", type=float, default=5.0,
                   help="clamp span ends up to this many seconds past the duration (default 5)")
    p.add_argument("--video-dir", default=None, help="prefix for video paths written to the JSONL")
    p.add_argument("--video-template", default="{vid}.mp4", help="file name of a video id (default {vid}.mp4)")
    p.add_argument("--durations", default=None,
                   help="charades_sta: Charades CSV (id,length) or a JSON {vid: seconds}")
    p.add_argument("--probe-root", default=None, help="charades_sta: read durations from the videos here")
    p.add_argument("--timerft-videos", choices=("clip", "source"), default="clip",
                   help="time_r1: TimeRFT items with video_start/video_end: 'clip' = each file is the cut clip, its "
                        "timestamps are clip times (Time-R1's release; default); 'source' = the files are the full "
                        "source videos: crop [video_start, video_end] and shift the spans by video_start")
    p.add_argument("--query-from", choices=("event", "problem"), default="event",
                   help="tempsamp: the query is the quoted event of the release's prompt (default) or the whole "
                        "problem text")
    p.add_argument("--bbox-format", choices=("xyxy", "xywh"), default="xyxy", help="refcoco box layout")
    p.add_argument("--image-dir", default=None, help="refcoco/video_r1: prefix for media paths")
    p.add_argument("--read-sizes-from", default=None, help="refcoco: image folder to read missing sizes from")
    p.add_argument("--level", choices=("L1", "L2", "L3"), default=None,
                   help="seed_bench_r1: the level written to meta.level (default: from the file name)")
    p.add_argument("--seed", type=int, default=0, help="seed_bench_r1 training lines: seed of the option order")
    p.add_argument("--subset", choices=("all", "mc", "open", "mca", "na", "descriptive"), default="all",
                   help="mmvu: all questions, multiple-choice only (mc) or open-ended only (open); vsibench: all, "
                        "the multiple-choice half (mca) or the numerical half (na); clevrer: all, the choice "
                        "questions (mc) or the descriptive ones (descriptive)")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    a = parser.parse_args(argv)
    if a.format == "charades_sta" and a.durations is None and a.probe_root is None:  # before reading anything
        parser.error("charades_sta needs the videos' durations: --durations Charades_v1_{train,test}.csv (the "
                     "dataset's CSV: id,...,length) or a JSON {vid: seconds}, or --probe-root VIDEO_DIR to read them "
                     "from the videos")
    for flag, path in (("--durations", a.durations), ("--probe-root", a.probe_root)):
        if path is not None and not os.path.exists(path):
            parser.error(f"{flag} {path}: no such file or folder")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    from mmgrpo.vlm.data import write_jsonl
    from mmgrpo.vlm.data import converters as C

    span_kw = dict(on_error=a.on_error, swap_reversed=a.swap_reversed, clamp_tolerance=a.clamp_tolerance)
    if a.format == "charades_sta":
        durations = a.durations
        if durations is not None and durations.endswith(".json"):
            with open(durations, encoding="utf-8") as fh:
                durations = json.load(fh)
        samples, report = C.convert_charades_sta(a.input, durations=durations, video_dir=a.video_dir,
                                                 video_template=a.video_template, probe_root=a.probe_root,
                                                 **span_kw)
    elif a.format in ("dense_captions", "activitynet"):
        samples, report = C.convert_dense_captions(a.input, video_dir=a.video_dir, video_template=a.video_template,
                                                   **span_kw)
    elif a.format in ("time_r1", "tvgbench"):
        samples, report = C.convert_time_r1(a.input, video_dir=a.video_dir, timerft_videos=a.timerft_videos,
                                            **span_kw)
    elif a.format == "tempsamp":
        samples, report = C.convert_tempsamp(a.input, video_dir=a.video_dir, query_from=a.query_from, **span_kw)
    elif a.format == "nextgqa":
        samples, report = C.convert_nextgqa(a.input, video_dir=a.video_dir, video_template=a.video_template,
                                            **span_kw)
    elif a.format == "video_r1":
        samples, report = C.convert_video_r1(a.input, media_dir=a.image_dir or a.video_dir, on_error=a.on_error)
    elif a.format == "vsibench":
        if a.subset not in ("all", "mca", "na"):
            parser.error(f"vsibench: --subset all | mca | na, got {a.subset}")
        samples, report = C.convert_vsibench(a.input, video_dir=a.video_dir, subset=a.subset, on_error=a.on_error)
    elif a.format == "qvhighlights":
        samples, report = C.convert_qvhighlights(a.input, video_dir=a.video_dir, video_template=a.video_template,
                                                 **span_kw)
    elif a.format == "seed_bench_r1":
        samples, report = C.convert_seed_bench_r1(a.input, media_dir=a.video_dir or a.image_dir, level=a.level,
                                                  seed=a.seed, on_error=a.on_error)
    elif a.format == "longvideobench":
        samples, report = C.convert_longvideobench(a.input, video_dir=a.video_dir, on_error=a.on_error)
    elif a.format == "mmvu":
        if a.subset not in ("all", "mc", "open"):
            parser.error(f"mmvu: --subset all | mc | open, got {a.subset}")
        samples, report = C.convert_mmvu(a.input, video_dir=a.video_dir, subset=a.subset, on_error=a.on_error)
    elif a.format == "clevrer":
        if a.subset not in ("all", "mc", "descriptive"):
            parser.error(f"clevrer: --subset all | mc | descriptive, got {a.subset}")
        samples, report = C.convert_clevrer(a.input, video_dir=a.video_dir, subset=a.subset, on_error=a.on_error)
    else:
        samples, report = C.convert_refcoco(a.input, image_dir=a.image_dir, bbox_format=a.bbox_format,
                                            read_sizes_from=a.read_sizes_from, on_error=a.on_error)
    n = write_jsonl(samples, a.output)
    print(f"{report.summary()} -> wrote {n} to {a.output}")
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except Exception as e:  # a clean one-line error for data problems
        from mmgrpo.vlm.data import DataError

        if isinstance(e, DataError):
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(1)
        raise
