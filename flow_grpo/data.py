"""Prompt files and the per-epoch sample layout of the flow trainer."""
from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Optional

import torch

from mmgrpo.utils.json_records import JSONRecordError, parse_record


def load_prompts(path: str) -> tuple[list[str], list[dict]]:
    """``.txt``: one prompt per non-empty line. ``.jsonl``: one object per line with a string ``prompt`` (the rest
    is metadata, e.g. GenEval ``tag``/``include``). Errors name the file and line."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"prompt file not found: {path}")
    prompts, meta = [], []
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:  # name the line: a bare UnicodeDecodeError does not say which file
        before = data[:exc.start].decode("utf-8")  # valid up to the first bad byte
        ln = before.replace("\r\n", "\n").replace("\r", "\n").count("\n") + 1
        raise ValueError(f"{path}:{ln}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                         "save the prompt file as UTF-8") from None
    with io.StringIO(text, newline=None) as f:  # universal newlines, as open() in text mode
        for ln, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if p.suffix == ".jsonl":
                try:  # malformed, nested too deeply or an unreadable number: one message with file and line
                    obj = parse_record(line)
                except JSONRecordError as exc:
                    raise ValueError(f"{path}:{ln}: invalid JSON ({exc.reason})") from None
                if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
                    raise ValueError(f"{path}:{ln}: expected an object with a non-empty string field 'prompt'")
                prompts.append(obj["prompt"])
                meta.append({k: v for k, v in obj.items() if k != "prompt"})
            else:
                prompts.append(line.strip())
                meta.append({})
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts, meta




def train_prompts(d) -> tuple[list[str], list[dict]]:
    """``data.train_path`` or the inline ``data.prompts`` (with empty metadata)."""
    if d.train_path:
        return load_prompts(d.train_path)
    if d.prompts:
        return list(d.prompts), [{} for _ in d.prompts]
    raise ValueError("no prompts: set data.train_path or data.prompts")


def eval_prompts(d) -> tuple[list[str], list[dict]]:
    """``data.eval_path`` or the inline ``data.eval_prompts``, the first ``data.eval_num_prompts`` of them."""
    if d.eval_path:
        prompts, meta = load_prompts(d.eval_path)
    else:
        prompts, meta = list(d.eval_prompts), [{} for _ in d.eval_prompts]
    if d.eval_num_prompts > 0:
        prompts, meta = prompts[:d.eval_num_prompts], meta[:d.eval_num_prompts]
    return prompts, meta


def process_slice(d, rank: int, world: int) -> range:
    """The sample indices of an epoch that process ``rank`` of ``world`` draws (``d``: the ``data`` config): an equal
    contiguous share of the ``group_size * groups_per_epoch`` samples (a group may span processes)."""
    per = d.group_size * d.groups_per_epoch // world
    return range(rank * per, (rank + 1) * per)


def prompts_sha256(prompts: list[str]) -> str:
    """The hex SHA-256 of the prompt list (one per line): a checkpoint records it, a resume warns when it differs."""
    return hashlib.sha256("\n".join(prompts).encode()).hexdigest()


def prompt_keys(prompts) -> torch.Tensor:
    """(N,) int64: a stable (process- and run-independent) hash of each prompt text."""
    return torch.tensor([int.from_bytes(hashlib.sha256(p.encode()).digest()[:8], "little", signed=True)
                         for p in prompts], dtype=torch.int64)


def epoch_samples(cfg, prompts: list[str], metadata: list[dict], epoch: int, lo: int = 0, hi: Optional[int] = None):
    """Samples ``[lo, hi)`` of the epoch (default: all of them): prompts, metadata, global group ids and the three
    seed lists (x_T, SDE noise, step plan). A pure function of (seed, epoch, prompt list): the data-sampler position
    is the epoch counter."""
    from mmgrpo.utils.seeding import sample_seed

    c = cfg
    G, n_groups = c.data.group_size, c.data.groups_per_epoch
    hi = G * n_groups if hi is None else hi
    g = torch.Generator().manual_seed(sample_seed(c.run.seed, epoch, 0))
    order = torch.randperm(len(prompts), generator=g)
    out_p, meta, gids, xs, ns, ps = [], [], [], [], [], []
    for s in range(lo, hi):
        local_g = s // G
        gid = epoch * n_groups + local_g
        pi = int(order[local_g % len(order)])
        out_p.append(prompts[pi])
        meta.append(dict(metadata[pi]))
        gids.append(gid)
        xs.append(sample_seed(c.run.seed, 1, gid) if c.sample.same_noise_per_group
                  else sample_seed(c.run.seed, 2, epoch, s))
        ns.append(sample_seed(c.run.seed, 3, epoch, s))
        # plan seed: shared by the group (windows, single step) unless the method draws one per sample
        ps.append(sample_seed(c.run.seed, 5, epoch, s) if c.sample.plan_per_sample
                  else sample_seed(c.run.seed, 4, gid))
    return out_p, meta, gids, xs, ns, ps
