"""Official benchmark layouts for ``eval/generate_t2i.py``: read each benchmark's prompt files and write the images
where the benchmark's own scorer looks for them, so that scorer runs unchanged on ``out_dir/<layout>/``.

Checked against the public code of each benchmark (facts only; nothing is copied):

``geneval`` (djghosh13/geneval)
    Prompts: ``prompts/evaluation_metadata.jsonl``, one JSON object per line (``tag``, ``include``,
    ``exclude``, ``prompt``, ...).  ``generation/diffusers_generate.py`` writes, for the prompt on line ``i``
    (0-based, blank lines not allowed), a folder ``{i:05d}/`` holding ``metadata.jsonl`` (that line's object
    written with ``json.dump``: one JSON object, no trailing newline), ``samples/{k:05d}.png`` for the k-th image,
    and an optional ``grid.png`` preview.  ``evaluation/evaluate_images.py IMAGEDIR`` visits every sub-folder
    whose name is all digits, reads ``metadata.jsonl`` with ``json.load`` and scores every ``samples/<digits>.png``
    -- so our other files never disturb it.  Here: ``out_dir/geneval/{i:05d}/...``; run
    ``python evaluation/evaluate_images.py OUT/geneval --outfile OUT/geneval_results.jsonl --model-path DETECTOR``
    then ``python evaluation/summary_scores.py OUT/geneval_results.jsonl``.

``dpgbench`` (TencentQQGYLab/ELLA, ``dpg_bench/``)
    Prompts: ``dpg_bench/prompts/<item_id>.txt`` (one prompt per file, keyed by its stem) or ``dpg_bench.csv``
    (columns ``item_id, text, keywords, proposition_id, dependency, category_broad, category_detailed, tuple,
    question_natural_language``; one row per question, so an item's prompt repeats: the first row of each item
    gives its ``text``).  ``compute_dpg_bench.py --image-root-path DIR --resolution R --pic-num N`` scores every
    file of DIR, keyed by the name before the first dot (``<item_id>.png``), and crops the first N of the tiles
    (0,0), (R,0), (0,R), (R,R) -- so the K images of a prompt go into ONE PNG as a 2-column grid of R x R tiles
    without padding.  Here: ``out_dir/dpgbench/<item_id>.png`` (square images required, K <= 4); run
    ``PIC_NUM=K bash dpg_bench/dist_eval.sh OUT/dpgbench R`` (R = height = width).

``t2icompbench`` (Karine-Huang/T2I-CompBench)
    Prompts: ``examples/dataset/<category>_val.txt``, one prompt per line; the release generator keeps the part
    before the first tab.  It saves image n (a running counter over all prompts and their images, from 0) as
    ``samples/{prompt}_{n:06d}.png``; the scorers (e.g. ``BLIPvqa_eval/BLIP_vqa.py --out_dir DIR``) list
    ``DIR/samples/``, sort by the number after the last ``_`` and read the prompt as the text before the first
    ``_``.  Here: ``out_dir/t2icompbench/samples/{prompt}_{p*K+k:06d}.png`` (the release's counter for a fresh
    folder); run ``python BLIPvqa_eval/BLIP_vqa.py --out_dir OUT/t2icompbench/`` (or the UniDet / CLIP / 3-in-1
    scorers with the same folder).  A prompt containing ``/`` cannot be a file name and is refused; one containing
    ``_`` is refused too, because the scorers would cut its question at that ``_``.

Deliberate deviations: blank lines of a T2I-CompBench file are skipped (the release generator would make
images for an empty prompt); sampling noise follows the harness's ``sample_seed(seed, p, k)`` rule, not the
release generators' seeding (the layout, not the sampler, is what the scorers read).
"""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any, Optional, Sequence

LAYOUTS = ("default", "geneval", "dpgbench", "t2icompbench")
LAYOUT_HELP = ("output layout for the benchmark's own scorer: default (images/NNNNNN.png) | geneval (prompts = "
               "evaluation_metadata.jsonl; writes out_dir/geneval/{i:05d}/metadata.jsonl + samples/{k:05d}.png) | "
               "dpgbench (prompts = dpg_bench/prompts folder or dpg_bench.csv; writes out_dir/dpgbench/<item_id>.png, "
               "a 2-column grid of the prompt's images) | t2icompbench (prompts = examples/dataset/*_val.txt; writes "
               "out_dir/t2icompbench/samples/{prompt}_{n:06d}.png); see eval/t2i_layouts.py and docs/benchmarks.md")
DPG_COLUMNS = ("item_id", "text")


# ------------------------------------------------------------------------------------------------ prompt files
def read_geneval(path: str | Path) -> tuple[list[str], list[dict]]:
    """GenEval metadata lines -> (prompts, the full line objects, key order kept for ``metadata.jsonl``).

    Blank lines are an error: the official generator numbers folders by line, so a skipped line would shift
    every folder after it."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"GenEval metadata file not found: {path}")
    lines = p.read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():  # trailing blank lines number nothing
        lines.pop()
    prompts, metas = [], []
    for ln, line in enumerate(lines, 1):
        if not line.strip():
            raise ValueError(f"{path}:{ln}: blank line (GenEval numbers prompt folders by line)")
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{ln}: invalid JSON ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
            raise ValueError(f"{path}:{ln}: expected an object with a non-empty string field 'prompt'")
        prompts.append(obj["prompt"])
        metas.append(obj)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts, metas


def _natural_key(s: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s))


def read_dpgbench(path: str | Path) -> tuple[list[str], list[dict]]:
    """DPG-Bench prompts folder (``<item_id>.txt``) or ``dpg_bench.csv`` -> (prompts, [{"item_id": ...}]).

    Folder: items sorted naturally by id ("2" before "10"); the prompt is the file's text, stripped.
    CSV: items in first-appearance order, the prompt from the item's first row (every row repeats it)."""
    p = Path(path)
    items: list[tuple[str, str]] = []
    if p.is_dir():
        files = sorted(p.glob("*.txt"), key=lambda f: _natural_key(f.stem))
        if not files:
            raise ValueError(f"{path}: no <item_id>.txt prompt files (expected DPG-Bench's dpg_bench/prompts/)")
        for f in files:
            text = f.read_text(encoding="utf-8").strip()
            if not text:
                raise ValueError(f"{f}: empty prompt")
            items.append((f.stem, text))
    elif p.is_file() and p.suffix == ".csv":
        with p.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in DPG_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise ValueError(f"{path}: missing column(s) {missing} (DPG-Bench csv header has item_id, text, ...)")
            seen: dict[str, str] = {}
            for ln, row in enumerate(reader, 2):
                iid, text = (row["item_id"] or "").strip(), (row["text"] or "").strip()
                if not iid or not text:
                    raise ValueError(f"{path}:{ln}: empty item_id or text")
                if iid not in seen:
                    seen[iid] = text
                    items.append((iid, text))
    else:
        raise FileNotFoundError(f"DPG-Bench prompts: {path} is neither a folder of <item_id>.txt nor a .csv file")
    if not items:
        raise ValueError(f"{path}: no prompts")
    for iid, _ in items:
        if "." in iid or "/" in iid:
            raise ValueError(f"{path}: item id {iid!r} contains '.' or '/' (the scorer keys images by the name "
                             "before the first dot)")
    return [t for _, t in items], [{"item_id": i} for i, _ in items]


def read_t2icompbench(path: str | Path) -> tuple[list[str], list[dict]]:
    """T2I-CompBench ``*_val.txt`` -> (prompts, [{"tag": file stem, "line": n}]); the text before the first tab,
    stripped; blank lines skipped.  Prompts that cannot round-trip through the ``{prompt}_{n:06d}.png`` names
    are refused with their line."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"T2I-CompBench prompt file not found: {path}")
    prompts, metas = [], []
    for ln, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        text = line.split("\t")[0].strip()
        if not text:
            continue
        for ch, why in (("/", "cannot be part of a file name"),
                        ("_", "the scorers read the prompt as the file name before the first '_'")):
            if ch in text:
                raise ValueError(f"{path}:{ln}: prompt contains {ch!r}, which {why}: {text!r}")
        if len(f"{text}_000000.png".encode("utf-8")) > 255:  # the file-name limit of common file systems
            raise ValueError(f"{path}:{ln}: prompt too long for a '{{prompt}}_{{n:06d}}.png' file name "
                             f"({len(text.encode('utf-8'))} bytes, at most 244)")
        prompts.append(text)
        metas.append({"tag": p.stem, "line": ln})
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts, metas


def read_prompts(path: str, layout: str) -> tuple[list[str], list[dict]]:
    """The prompt reader of ``layout`` (``default`` = the trainer's ``load_prompts``: .txt or .jsonl)."""
    if layout == "geneval":
        return read_geneval(path)
    if layout == "dpgbench":
        return read_dpgbench(path)
    if layout == "t2icompbench":
        return read_t2icompbench(path)
    if layout != "default":
        raise ValueError(f"layout={layout!r}: choose one of {LAYOUTS}")
    from flow_grpo.data import load_prompts

    return load_prompts(path)


def reward_metadata(layout: str, meta: dict) -> dict:
    """Metadata handed to the rewards: GenEval lines without the prompt itself (as ``load_prompts`` gives them)."""
    return {k: v for k, v in meta.items() if k != "prompt"} if layout == "geneval" else meta


# ------------------------------------------------------------------------------------------------ checks
def check_layout(layout: str, images_per_prompt: int, height: int, width: int) -> None:
    """Refuse settings the benchmark's scorer cannot read, before any generation."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: choose one of {LAYOUTS}")
    if layout == "dpgbench":
        if height != width:
            raise ValueError(f"layout=dpgbench needs square images (the scorer crops R x R tiles), got "
                             f"height={height} width={width}")
        if not 1 <= images_per_prompt <= 4:
            raise ValueError(f"layout=dpgbench: images_per_prompt must be 1..4 (the scorer reads at most 4 tiles), "
                             f"got {images_per_prompt}")


# ------------------------------------------------------------------------------------------------ paths
def image_relpath(layout: str, item: dict) -> str:
    """Where image ``item`` (``index``, ``prompt_index``, ``sample``, ``prompt``) is saved, relative to out_dir.

    dpgbench keeps the single images in ``images/`` and composes the per-item grid in :func:`finalize`."""
    if layout == "geneval":
        return f"geneval/{item['prompt_index']:05d}/samples/{item['sample']:05d}.png"
    if layout == "t2icompbench":
        return f"t2icompbench/samples/{item['prompt']}_{item['index']:06d}.png"
    return f"images/{item['index']:06d}.png"


def write_geneval_metadata(out_dir: Path, prompt_index: int, meta: dict) -> None:
    """``{i:05d}/metadata.jsonl``: the metadata line as the official generator writes it (``json.dump``)."""
    folder = out_dir / "geneval" / f"{prompt_index:05d}"
    (folder / "samples").mkdir(parents=True, exist_ok=True)
    (folder / "metadata.jsonl").write_text(json.dumps(meta), encoding="utf-8")


def layout_dirs(layout: str) -> tuple[str, ...]:
    """Folders under out_dir owned by ``layout`` (deleted by ``overwrite=true``)."""
    return () if layout == "default" else (layout,)


# ------------------------------------------------------------------------------------------------ finalize
def _tile(images: Sequence[Any], ncol: int, pad: int):
    """PIL image: ``images`` (same size) in rows of ``ncol`` with ``pad`` black pixels around every tile."""
    from PIL import Image

    w, h = images[0].size
    nrow = (len(images) + ncol - 1) // ncol
    cols = min(ncol, len(images))
    canvas = Image.new("RGB", (cols * (w + pad) + pad, nrow * (h + pad) + pad))
    for i, im in enumerate(images):
        canvas.paste(im.convert("RGB"), (pad + (i % ncol) * (w + pad), pad + (i // ncol) * (h + pad)))
    return canvas


def finalize(layout: str, out_dir: Path, rows: Sequence[dict], metas: Sequence[dict], images_per_prompt: int,
             grid_nrow: int) -> dict:
    """After the last image: compose what needs every image of a prompt.  Returns ``{"layout", "dir", "files"}``.

    geneval: ``grid.png`` per prompt folder (a preview like the release's; the scorer ignores it) when
    ``grid_nrow > 0``.  dpgbench: ``<item_id>.png`` = the prompt's images in a 2-column grid without padding
    (the scorer's crop boxes).  t2icompbench: nothing (the samples are already in place)."""
    from PIL import Image

    if layout == "default":
        return {"layout": layout, "dir": None, "files": 0}
    by_prompt: dict[int, list[dict]] = {}
    for r in rows:
        by_prompt.setdefault(int(r["prompt_index"]), []).append(r)
    n = 0
    for p, rs in sorted(by_prompt.items()):
        rs = sorted(rs, key=lambda r: r["sample"])
        if layout == "geneval" and grid_nrow > 0:
            ims = [Image.open(out_dir / r["image"]) for r in rs]
            _tile(ims, grid_nrow, 2).save(out_dir / "geneval" / f"{p:05d}" / "grid.png")
            n += 1
        elif layout == "dpgbench":
            if len(rs) != images_per_prompt:
                raise ValueError(f"dpgbench: prompt {p} has {len(rs)} images, expected {images_per_prompt}")
            ims = [Image.open(out_dir / r["image"]) for r in rs]
            (out_dir / "dpgbench").mkdir(exist_ok=True)
            _tile(ims, 2, 0).save(out_dir / "dpgbench" / f"{metas[p]['item_id']}.png")
            n += 1
        elif layout == "t2icompbench":
            n += len(rs)
    return {"layout": layout, "dir": str(out_dir / layout), "files": n}


def scorer_command(layout: str, out_dir: str, images_per_prompt: int, height: int) -> Optional[str]:
    """The benchmark scorer's command line for this output (printed in the log and docs)."""
    d = str(Path(out_dir) / layout)
    if layout == "geneval":
        return (f"python evaluation/evaluate_images.py {d} --outfile {d}_results.jsonl --model-path <detector dir> "
                f"&& python evaluation/summary_scores.py {d}_results.jsonl")
    if layout == "dpgbench":
        return f"PIC_NUM={images_per_prompt} bash dpg_bench/dist_eval.sh {d} {height}"
    if layout == "t2icompbench":
        return f"python BLIPvqa_eval/BLIP_vqa.py --out_dir {d}/"
    return None


def prompts_sha256(path: str) -> str:
    """sha256 of a prompt file, or of a DPG-Bench prompts folder (its ``*.txt`` names and contents, sorted)."""
    import hashlib

    from eval.harness import sha256_file

    p = Path(path)
    if not p.is_dir():
        return sha256_file(p)
    h = hashlib.sha256()
    for f in sorted(p.glob("*.txt")):
        h.update(f.name.encode("utf-8") + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()
