"""Pre-train a Qwen-VL vision tower to count what each region of an image shows (the tiny stand-in for a real
VLM's image-text pre-training; the video twin is :func:`mmgrpo.vlm.sft.pretrain_vision_tags`).

Why: a randomly initialised tiny vision tower trained only through an answer's one verdict token never learns to
tell two images apart (the trained-judge loop of issue #40 item 4 stayed at exactly 50 % even after SFT,
``docs/results.md``). A real Qwen-VL tower has seen image-text data before any judging; this gives the tiny tower
the same head start on what the judge needs -- which shapes, colours and how many -- and nothing about the
judgement itself (no caption, no pair, no answer is seen).

Loss: the image's merged visual tokens (``get_image_features``, row-major over the merged grid) are split into
``regions`` (token index lists, e.g. the two halves of a judge composite); each region's tokens are pooled
(mean and max, concatenated) and a linear head (discarded afterwards) gives ``n_heads`` softmaxes over
``n_levels`` count levels; loss = cross-entropy with the region's counts, mean over regions and heads.  AdamW,
constant ``lr``, gradient norm clipped at 1; only the vision tower (and the head) change.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

__all__ = ["grid_columns", "pretrain_region_counts"]


def grid_columns(grid_thw: Sequence[int], merge: int, cols: Sequence[int]) -> list[int]:
    """Indices of the merged tokens in columns ``cols`` of one image with patch grid ``grid_thw`` (t, h, w):
    merged tokens are row-major over (h / merge, w / merge)."""
    t, h, w = (int(x) for x in grid_thw)
    if t != 1 or h % merge or w % merge:
        raise ValueError(f"grid_columns takes one image whose grid divides by merge={merge}, got {grid_thw}")
    mh, mw = h // merge, w // merge
    bad = [c for c in cols if not 0 <= c < mw]
    if bad:
        raise ValueError(f"columns {bad} outside the {mw} merged columns of grid {grid_thw}")
    return [r * mw + c for r in range(mh) for c in cols]


def pretrain_region_counts(model, items: Sequence[tuple[dict, Any]], regions: Sequence[Sequence[int]],
                           n_heads: int, n_levels: int, *, steps: int, batch_size: int = 16, lr: float = 2e-3,
                           seed: int = 0, log: Callable[[dict], None] | None = None) -> dict:
    """Train ``model``'s vision tower on ``items`` = ``(inputs, counts)`` per image: ``inputs`` with
    ``pixel_values`` and ``image_grid_thw`` (one image), ``counts`` an int (len(regions), n_heads) array with values
    in ``[0, n_levels)``. Module docstring for the loss.

    Returns ``{"history": [{step, loss, acc, seconds}], "steps_done", "seconds", "predict"}`` (``acc``: share of
    (region, head) counts the head gets exactly right in that batch; ``predict(inputs)``: the (len(regions),
    n_heads) counts the trained head reads from one image, for held-out probes)."""
    import torch
    import torch.nn.functional as F

    from .sft import batch_order

    inner = getattr(model, "model", model)
    visual = inner.visual
    out_dim = int(getattr(visual.config, "out_hidden_size", 0) or model.config.text_config.hidden_size)
    g = torch.Generator().manual_seed(int(seed))
    head = torch.nn.Linear(2 * out_dim, n_heads * n_levels)
    with torch.no_grad():
        head.weight.normal_(0.0, (2 * out_dim) ** -0.5, generator=g)
        head.bias.zero_()
    idx_regions = [torch.as_tensor(list(r), dtype=torch.long) for r in regions]
    params = list(visual.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    visual.train()
    history: list[dict] = []
    t0 = time.perf_counter()
    for step, idx in enumerate(batch_order(len(items), steps, batch_size, seed)):
        pv = torch.cat([items[i][0]["pixel_values"] for i in idx])
        grid = torch.cat([items[i][0]["image_grid_thw"] for i in idx])
        feats = inner.get_image_features(pv, grid).pooler_output
        pooled, ys = [], []
        for f, i in zip(feats, idx):
            for k, r in enumerate(idx_regions):
                tok = f[r]
                pooled.append(torch.cat([tok.mean(0), tok.amax(0)]))
            ys.append(torch.as_tensor(items[i][1], dtype=torch.long).view(len(idx_regions), n_heads))
        logits = head(torch.stack(pooled)).view(-1, n_levels)
        y = torch.stack(ys).view(-1)
        if int(y.min()) < 0 or int(y.max()) >= n_levels:
            raise ValueError(f"counts must lie in [0, {n_levels}), got {int(y.min())}..{int(y.max())}")
        loss = F.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        rec = {"step": step + 1, "loss": float(loss.detach()),
               "acc": float((logits.detach().argmax(-1) == y).float().mean()), "seconds": time.perf_counter() - t0}
        history.append(rec)
        if log is not None and (step % 25 == 0 or step == steps - 1):
            log(rec)
    visual.eval()

    @torch.no_grad()
    def predict(inputs: dict):
        f = inner.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output[0]
        x = torch.stack([torch.cat([f[r].mean(0), f[r].amax(0)]) for r in idx_regions])
        return head(x).view(len(idx_regions), n_heads, n_levels).argmax(-1).numpy()

    return {"history": history, "steps_done": len(history), "seconds": time.perf_counter() - t0,
            "predict": predict}
