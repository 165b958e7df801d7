#!/usr/bin/env python
"""Build the demo's small base VLM: a hub-free tiny Qwen2.5-VL, supervised-fine-tuned on the synthetic TVG split.

    python scripts/build_tiny_vlm.py --out runs/tiny_vlm --seconds 240 --seed 0

1. generate the synthetic temporal-grounding benchmark (``data/synthetic_tvg.py``) into ``<out>/data`` (or use
   ``--data-dir`` with an existing ``train.jsonl`` / ``eval.jsonl``);
2. build a byte-level BPE tokenizer trained on the *training* prompts, with answer-friendly tokens (every
   integer 0..99, every fraction ``.d`` / ``.dd``, ``<answer>``, ``</answer>``, ``<think>``, ``</think>``), so
   ``<answer>12.54 to 17.83</answer><|im_end|>`` is 9 tokens; wrap it in the Qwen2.5-VL processor;
3. build a randomly initialised small Qwen2.5-VL (defaults: LLM hidden 96 x 3 layers, ViT 32 x 2 blocks);
4. SFT (``mmgrpo.vlm.sft``) for a FIXED number of steps (``--steps``; no held-out data is looked at to stop);
   ``--seconds`` is only a wall-clock guard: if it is hit, training stops early and ``stopped_by`` says so;
5. evaluate greedy decoding on the held-out split (mIoU, R1@0.3/0.5/0.7, parse rate, tokens/s);
6. ``save_pretrained`` model + processor into ``<out>`` (loads with ``from_pretrained`` / ``load_policy`` like any
   Qwen2.5-VL checkpoint), check the reload gives identical logits, and write ``<out>/sft_report.json`` with the
   settings the GRPO demo must reuse (video sampling, prompt mode, answer format) and every measurement.

Only ``--help`` is fast; everything heavy is imported inside functions.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `data/` is a folder of importable generator modules at the repo root
    sys.path.insert(0, str(REPO))

from mmgrpo.utils.portable import portable_argv, portable_path, portable_record  # noqa: E402

ANSWER_TOKENS = ["<answer>", "</answer>", "<think>", "</think>"]


# ------------------------------------------------------------------------------------------------------------
# tokenizer / processor / model
# ------------------------------------------------------------------------------------------------------------
def number_tokens(max_int: int = 99) -> list[str]:
    """Integers 0..max_int and the fractions .0-.9 / .00-.99: a time ``12.54`` is always ``12`` + ``.54``."""
    return ([str(i) for i in range(max_int + 1)] + [f".{i}" for i in range(10)]
            + [f".{i:02d}" for i in range(100)])


def build_tokenizer(corpus: list[str], vocab_size: int = 512, max_int: int = 99):
    """Qwen2 tokenizer around a byte-level BPE trained on ``corpus`` (deterministic), Qwen's special tokens and
    ChatML template (``mmgrpo.vlm.models.tiny``), plus :func:`number_tokens` and :data:`ANSWER_TOKENS` as *non-special*
    added tokens (matched leftmost-longest before BPE, kept by ``decode(skip_special_tokens=True)``).

    Digits are removed from the BPE corpus so no merge ever mixes digits: numbers tokenise only through the added
    integer/fraction tokens (and single digits beyond ``max_int``)."""
    import re

    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast

    from mmgrpo.vlm.models.tiny import CHAT_TEMPLATE, SPECIAL_TOKENS, vocab_and_merges

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    strip = re.compile(r"<\|[a-z_]+\|>|</?answer>|</?think>|\d")
    tk.train_from_iterator([strip.sub("", t) for t in corpus], trainer=trainer)
    vocab, merges = vocab_and_merges(tk)  # Qwen's own pre-tokenizer, as from_pretrained rebuilds it
    tok = Qwen2TokenizerFast(vocab=vocab, merges=merges, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                             unk_token=None, bos_token=None, additional_special_tokens=SPECIAL_TOKENS[1:],
                             padding_side="left")
    tok.add_tokens([AddedToken(t, normalized=False, single_word=False) for t in ANSWER_TOKENS + number_tokens(max_int)])
    tok.chat_template = CHAT_TEMPLATE
    for t in SPECIAL_TOKENS:
        assert tok.convert_tokens_to_ids(t) == SPECIAL_TOKENS.index(t), t
    return tok


FAMILIES = ("qwen2_5_vl", "qwen3_vl")


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")


def build_processor(tok, min_pixels: int, max_pixels: int, family: str = "qwen2_5_vl"):
    """The family's processor around ``tok``; pixel bounds per frame (multiples of 28^2 for Qwen2.5-VL, 32^2 for
    Qwen3-VL -- but frames are resized by ``load_video`` first, so these only matter for images)."""
    from transformers import Qwen2VLImageProcessor

    from mmgrpo.vlm.models.tiny import CHAT_TEMPLATE

    _check_family(family)
    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    if family == "qwen3_vl":
        from transformers import Qwen3VLProcessor, Qwen3VLVideoProcessor

        common = dict(size=size, patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3,
                      image_std=[0.5] * 3)
        return Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(**common), tokenizer=tok,
                                video_processor=Qwen3VLVideoProcessor(**common), chat_template=CHAT_TEMPLATE)
    from transformers import Qwen2_5_VLProcessor, Qwen2VLVideoProcessor

    ip = Qwen2VLImageProcessor(size=size, patch_size=14)
    vp = Qwen2VLVideoProcessor(size=size, patch_size=14)
    return Qwen2_5_VLProcessor(image_processor=ip, tokenizer=tok, video_processor=vp, chat_template=CHAT_TEMPLATE)


def model_config(tok, hidden: int = 128, layers: int = 4, heads: int = 4, kv_heads: int = 2,
                 intermediate: int = 384, vision_hidden: int = 64, vision_depth: int = 2,
                 rope_theta: float = 1e4, tokens_per_second: int = 2, family: str = "qwen2_5_vl"):
    """Qwen2.5-VL (or Qwen3-VL) config.  ``mrope_section`` splits head_dim/2 over (time, height, width) in the 7B
    model's proportions ([16, 24, 24] of 64): time gets the rest after 3/8 each to height and width."""
    from mmgrpo.vlm.models.tiny import SPECIAL_TOKENS

    _check_family(family)
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    head_dim = hidden // heads
    half = head_dim // 2
    hw = half * 3 // 8
    sections = [half - 2 * hw, hw, hw]
    text = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": rope_theta, "mrope_section": sections},
                bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                pad_token_id=ids["<|endoftext|>"], tie_word_embeddings=False)
    top = dict(image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
               vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
               tie_word_embeddings=False)
    vision = dict(depth=vision_depth, hidden_size=vision_hidden, intermediate_size=2 * vision_hidden,
                  num_heads=max(1, vision_hidden // 32), out_hidden_size=hidden, spatial_merge_size=2,
                  temporal_patch_size=2, in_channels=3)
    if family == "qwen3_vl":
        from transformers import Qwen3VLConfig

        text["head_dim"] = head_dim
        text["rope_parameters"]["mrope_interleaved"] = True
        vision.update(patch_size=16, deepstack_visual_indexes=[vision_depth - 1], num_position_embeddings=64)
        return Qwen3VLConfig(text_config=text, vision_config=vision, **top)
    from transformers import Qwen2_5_VLConfig

    vision.update(patch_size=14, window_size=112, fullatt_block_indexes=[vision_depth - 1],
                  tokens_per_second=tokens_per_second)
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **top)


def build_model(tok, seed: int = 0, family: str = "qwen2_5_vl", **dims):
    """Random model (float32, SDPA) whose generation config decodes greedily and never emits vision tokens."""
    import torch

    from mmgrpo.vlm.models.tiny import model_class, vision_token_ids

    cfg = model_config(tok, family=family, **dims)
    cfg._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(family)(cfg)
    gc = model.generation_config
    gc.suppress_tokens = vision_token_ids(tok)
    gc.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    gc.pad_token_id = tok.pad_token_id
    gc.bos_token_id = cfg.text_config.bos_token_id
    gc.do_sample = False
    gc.max_new_tokens = 24
    return model


def count_params(model) -> dict:
    tot = sum(p.numel() for p in model.parameters())
    vis = sum(p.numel() for n, p in model.named_parameters() if "visual" in n.split("."))
    return {"total": tot, "vision": vis, "language": tot - vis}


# ------------------------------------------------------------------------------------------------------------
# data
# ------------------------------------------------------------------------------------------------------------
def ensure_data(data_dir: Path, n_train: int, n_eval: int, seed: int, benchmark: str = "tvg",
                n_val: int = 0, clock: str = "none", lanes: int = 3,
                events: tuple[int, int] | None = None) -> tuple[Path, Path]:
    """``(train.jsonl, eval.jsonl)`` in ``data_dir``, generated if absent: ``benchmark="tvg"`` with
    ``mmgrpo.vlm.synthetic.tvg.generate`` (version 1), ``"grounding"`` with ``mmgrpo.vlm.synthetic.grounding.generate``
    (version 2, also ``val.jsonl`` when ``n_val``)."""
    tr, ev = data_dir / "train.jsonl", data_dir / "eval.jsonl"
    if benchmark == "grounding":
        if not (tr.exists() and ev.exists()):
            from mmgrpo.vlm.synthetic.grounding import generate as generate_v2

            from mmgrpo.vlm.synthetic.grounding import N_EVENTS

            generate_v2(str(data_dir), n_train=n_train, n_eval=n_eval, seed=seed, n_val=n_val, clock=clock, lanes=lanes,
                        n_events=tuple(events) if events else N_EVENTS)
    elif not (tr.exists() and ev.exists()):
        try:
            from mmgrpo.vlm.synthetic.tvg import generate
        except ImportError:  # older layout: a repo-root generator module
            from mmgrpo.vlm.synthetic.tvg import generate

        res = generate(str(data_dir), n_train=n_train, n_eval=n_eval, seed=seed)
        # accept either our default names or whatever paths the generator reports
        if isinstance(res, dict):
            tr = Path(res.get("train", tr))
            ev = Path(res.get("eval", res.get("test", ev)))
        elif isinstance(res, (tuple, list)) and len(res) >= 2:
            tr, ev = Path(res[0]), Path(res[1])
    for p in (tr, ev):
        if not p.exists():
            raise FileNotFoundError(f"{p}: expected the synthetic TVG split here (mmgrpo.vlm.synthetic.tvg.generate)")
    return tr, ev


def prior_baselines(train: list, held: list) -> dict:
    """Video-blind reference points: the constant span ``[s, e]`` (seconds, clipped to the video) and the
    duration-relative span ``[a*D, b*D]`` with the best mean IoU on the *training* split (grid search, 0.25 s /
    0.05 steps), scored on the held-out split with the same parser and IoU as the model.  A model that does not
    look at the video cannot beat these by much: they say how much of an mIoU is the span-length prior."""
    import numpy as np

    from mmgrpo.vlm.sft import score_tvg_outputs

    def arrays(xs):
        return (np.array([x.duration for x in xs]), np.array([x.spans[0][0] for x in xs]),
                np.array([x.spans[0][1] for x in xs]))

    D, gs, ge = arrays(train)

    def miou(ps, pe):  # vectorised tIoU over the training samples (pred clipped to [0, D])
        ps, pe = np.clip(ps, 0, D), np.clip(pe, 0, D)
        inter = np.clip(np.minimum(pe, ge) - np.maximum(ps, gs), 0, None)
        union = np.maximum(pe, ge) - np.minimum(ps, gs)
        return float(np.mean(inter / np.maximum(union, 1e-9)))

    const = max(((s / 4, e / 4) for s in range(0, 48) for e in range(s + 1, 81)),
                key=lambda c: miou(np.full_like(D, c[0]), np.full_like(D, c[1])))
    rel = max(((a / 20, b / 20) for a in range(0, 20) for b in range(a + 1, 21)),
              key=lambda c: miou(c[0] * D, c[1] * D))
    out = {}
    for name, c, fn in (("constant_span", const, lambda x: (const[0], min(const[1], x.duration))),
                        ("duration_relative_span", rel, lambda x: (rel[0] * x.duration, rel[1] * x.duration))):
        m = score_tvg_outputs([f"<answer>{fn(x)[0]:.2f} to {fn(x)[1]:.2f}</answer>" for x in held], held)
        out[name] = {"span": list(c), **{k: round(v, 2) for k, v in m.items() if k != "ious"}}
    return out


def noisy_labels(samples: list, noise: float, seed: int, round_to: float = 0.0) -> list:
    """Copies of ``samples`` whose span boundaries move by independent U(-noise, noise) seconds (one draw per
    sample from ``seed``), clipped to ``[0, duration]`` and kept at least 0.25 s long, then (``round_to`` > 0) widened
    to multiples of ``round_to`` (start down, end up; end capped at the duration): labels that point at the right
    event but with imprecise boundaries -- the weakness an IoU reward can fix."""
    import dataclasses

    import numpy as np

    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(7,)))
    out = []
    for s in samples:
        (a, b), = s.spans
        da, db = rng.uniform(-noise, noise, size=2) if noise > 0 else (0.0, 0.0)
        a2 = float(np.clip(a + da, 0.0, s.duration - 0.25))
        b2 = float(np.clip(b + db, a2 + 0.25, s.duration))
        if round_to > 0:
            a2 = float(np.floor(a2 / round_to + 1e-9) * round_to)
            b2 = float(min(np.ceil(b2 / round_to - 1e-9) * round_to, s.duration))
        out.append(dataclasses.replace(s, spans=[[a2, b2]]))
    return out


def shifted_labels(samples: list, shift: float) -> list:
    """Copies of ``samples`` whose span moves by ``shift`` seconds (start and end), clipped to ``[0, duration]`` and
    kept at least 0.25 s long: annotations with a systematic lag (``shift`` > 0: marked late)."""
    import dataclasses

    out = []
    for s in samples:
        (a, b), = s.spans
        a2 = min(max(a + shift, 0.0), s.duration - 0.25)
        b2 = min(max(b + shift, a2 + 0.25), s.duration)
        out.append(dataclasses.replace(s, spans=[[a2, b2]]))
    return out


def first_event_labels(samples: list, rate: float, seed: int) -> list:
    """Copies of ``samples`` in which, for a fixed random ``rate`` share of the samples (one draw per sample from
    ``seed``), the label is the span of the **earliest** event of the same video (the earliest-starting span among
    that video's samples; ties: the shorter), whatever the query asks: annotations with a first-event bias. A sample
    whose query already names the earliest event keeps its label, so the share of labels that *change* is ``rate``
    times the share of queries about a later event. The base learns the query *and* a shortcut towards the first
    event -- the weakness an IoU reward on correct labels can remove (docs/demo_models.md, issue #16)."""
    import dataclasses

    import numpy as np

    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"first-event label rate must be in [0, 1], got {rate}")
    first: dict = {}
    for s in samples:
        span = tuple(s.spans[0])
        cur = first.get(s.video)
        if cur is None or (span[0], span[1] - span[0]) < (cur[0], cur[1] - cur[0]):
            first[s.video] = span
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(11,)))
    draws = rng.random(len(samples))
    return [dataclasses.replace(s, spans=[list(first[s.video])]) if d < rate else s
            for s, d in zip(samples, draws)]


def fingerprint(benchmark: str = "tvg") -> dict:
    """Short hashes of what the checkpoint depends on besides its weights: the rendered TVG prompt + ground-truth
    answer (``mmgrpo.vlm.data.prompts`` with the tiny ChatML template) and the synthetic generator's rules
    (``mmgrpo.vlm.synthetic.tvg``: constants and the sampling / rendering / sample-writing functions).  A shipped
    checkpoint whose fingerprint differs from the current code's must be rebuilt.  ``benchmark="grounding"`` adds
    ``synthetic_grounding``: the same for ``mmgrpo.vlm.synthetic.grounding`` (version 2)."""
    import hashlib
    import inspect

    from mmgrpo.vlm.data import prompts
    from mmgrpo.vlm.synthetic import tvg as syn
    from mmgrpo.vlm.models.tiny import build_tiny_tokenizer

    s = {"id": "fp", "task": "tvg", "video": "v.mp4", "duration": 9.5, "query": "When does the red circle appear?",
         "spans": [[1.25, 4.5]]}
    kw = {"mode": "no_think", "answer_format": "seconds"}
    text = build_tiny_tokenizer().apply_chat_template(prompts.build_messages(s, **kw), tokenize=False,
                                                      add_generation_prompt=True)
    text += prompts.format_ground_truth_answer(s, **kw)
    gen = repr([syn.COLOURS, syn.SHAPES, syn.BACKGROUND, syn.SIZES, syn.FPS_CHOICES, syn.SHAPE_SIZE,
                syn.QUERY_TEMPLATES]) + "".join(inspect.getsource(f) for f in (
                    syn._shape_mask, syn.render_frame, syn.sample_spec, syn.tvg_samples, syn.Event.span))

    def h(x: str) -> str:
        return hashlib.sha256(x.encode()).hexdigest()[:16]

    out = {"prompts": h(text), "synthetic_tvg": h(gen)}
    if benchmark == "grounding":
        from mmgrpo.vlm.synthetic import grounding as g2

        src = repr([g2.DURATION, g2.EVENT_SECONDS, g2.N_EVENTS, g2.N_LANES, g2.MIN_MOVE, g2.CLOCK_ROWS,
                    g2.CLOCK_PX_PER_S, g2.CLOCK_RGB, g2.LIGHT_START, g2.LIGHT_PER_S, g2.APPEAR_TEMPLATES,
                    g2.MOVE_TEMPLATES]) + "".join(inspect.getsource(f) for f in (
                        g2.render_frame, g2._x_at, g2._place, g2._motion, g2.sample_spec, g2._draw_spec,
                        g2.event_query, g2.tvg_samples, g2.MovingEvent.span))
        out["synthetic_grounding"] = h(src)
    return out


def _read_info(data_dir: Path) -> dict:
    p = data_dir / "info.json"
    return json.loads(p.read_text()) if p.exists() else {}


def load_split(path: Path) -> list:
    from mmgrpo.vlm.data.jsonl import load_jsonl

    samples, report = load_jsonl(path, on_error="raise")
    print(f"[data] {report.summary()}", flush=True)
    return samples


# ------------------------------------------------------------------------------------------------------------
# main
# ------------------------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="runs/tiny_vlm", help="output folder (model + processor + sft_report.json)")
    p.add_argument("--seconds", type=float, default=240.0, help="wall-clock guard for the SFT loop (0 = none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default="", help="folder with train.jsonl / eval.jsonl (default: <out>/data)")
    p.add_argument("--benchmark", default="tvg", choices=("tvg", "grounding"),
                   help="tvg: synthetic TVG version 1 (data/synthetic_tvg.py); grounding: version 2 "
                        "(mmgrpo/vlm/synthetic/grounding.py: short moving events, distractors, motion queries)")
    p.add_argument("--n-val", type=int, default=0, help="grounding: validation videos (val.jsonl, stream 2)")
    p.add_argument("--lanes", type=int, default=3, help="grounding: horizontal lanes of the shapes")
    p.add_argument("--events", type=int, nargs=2, default=None, metavar=("MIN", "MAX"),
                   help="grounding: events per video before the optional twin (default: the generator's 3 5); "
                        "ignored with an existing --data-dir (sft_report.json's data.info records that data's own settings)")
    p.add_argument("--clock", default="none", choices=("none", "bar", "light"),
                   help="grounding: show each frame's time in its pixels (bar: progress bar; light: the background "
                        "brightens with time); see mmgrpo/vlm/synthetic/grounding.py")
    p.add_argument("--eval-split", default="eval", choices=("eval", "val"),
                   help="split evaluated after SFT (val = validation, for choosing settings without the held-out)")
    p.add_argument("--label-noise", type=float, default=0.0,
                   help="boundary-noisy SFT labels: each training answer's start and end move by an independent "
                        "uniform offset in [-x, x] seconds (fixed per sample; clipped to [0, duration], start < end)")
    p.add_argument("--first-event-labels", type=float, default=0.0, metavar="RATE",
                   help="grounding: biased SFT labels: for this share of the training samples (fixed per sample) the "
                        "answer is the span of the video's earliest event, whatever the query asks (applied before "
                        "--label-noise / --label-round); the held-out and validation labels are never changed")
    p.add_argument("--label-shift", type=float, default=0.0, metavar="SECONDS",
                   help="late SFT labels: move every training answer's start and end by this many seconds (clipped "
                        "to [0, duration], at least 0.25 s long; applied before --label-noise / --label-round)")
    p.add_argument("--label-round", type=float, default=0.0,
                   help="coarse SFT labels: round each training answer's start down and end up to a multiple of x "
                        "seconds (after --label-noise); the answer's fraction digits then carry no frame-rate noise")
    p.add_argument("--init", default="",
                   help="start from this checkpoint of build_tiny_vlm.py (weights, tokenizer, processor) instead of a "
                        "random model, e.g. for a curriculum; the architecture options are then ignored")
    p.add_argument("--n-train", type=int, default=400, help="training videos (1-3 queries each)")
    p.add_argument("--n-eval", type=int, default=100, help="held-out videos (1-3 queries each)")
    p.add_argument("--steps", type=int, default=250, help="SFT steps: the (held-out-free) stopping rule")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--mode", default="no_think", help="prompt mode (mmgrpo.vlm.data.prompts.MODES)")
    p.add_argument("--answer-format", default="seconds", help="answer format (mmgrpo.vlm.data.prompts.ANSWER_FORMATS)")
    p.add_argument("--include-duration", action="store_true", help="state the video length in the prompt")
    p.add_argument("--query-position", default="after", choices=("after", "before"),
                   help="task text after (default) or before the video in the prompt; 'before' lets the video "
                        "tokens attend to the query (causal attention). GRPO and eval must use the same "
                        "(data.query_position, listed in sft_report.json's trainer_overrides)")
    p.add_argument("--fps", type=float, default=2.0)
    p.add_argument("--max-frames", type=int, default=16)
    p.add_argument("--family", default="qwen2_5_vl", choices=FAMILIES,
                   help="qwen3_vl writes '<t seconds>' text before every frame pair (an experiment, see docs)")
    p.add_argument("--min-pixels", type=int, default=0, help="per-frame min pixels (0 = 4 F^2, F = 28 | 32)")
    p.add_argument("--max-pixels", type=int, default=0, help="per-frame max pixels (0 = 6 F^2: 64x64 -> 56x56, "
                   "96x64 -> 84x56 for F = 28)")
    p.add_argument("--hidden", type=int, default=96)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=256)
    p.add_argument("--vision-hidden", type=int, default=32)
    p.add_argument("--vision-depth", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=512, help="BPE vocabulary before the number tokens")
    p.add_argument("--vision-pretrain-steps", type=int, default=0,
                   help="grounding: before SFT, pre-train the vision tower for this many steps to tag which "
                        "colour+shape each temporal block shows (mmgrpo.vlm.sft.pretrain_vision_tags; 0 = off)")
    p.add_argument("--vision-pretrain-lr", type=float, default=2e-3, help="learning rate of that stage")
    p.add_argument("--freeze-vision", action="store_true",
                   help="keep the vision tower fixed during SFT (e.g. after --vision-pretrain-steps)")
    p.add_argument("--eval-batch-size", type=int, default=50)
    p.add_argument("--ship", default="", help="also copy the model files + sft_report.json (not the data) here, "
                   "e.g. data/checkpoints/tiny_vlm (the checkpoint shipped with the repo, used by scripts/demo.py)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (0 = torch default); 1 because two threads per process were 2-20x "
                        "slower whenever other processes shared the 2 cores")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    t_start = time.perf_counter()
    import torch

    from mmgrpo.vlm import sft
    from mmgrpo.vlm.data import prompts
    from mmgrpo.vlm.models.tiny import build_tiny_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data_dir = Path(args.data_dir) if args.data_dir else out / "data"
    t0 = time.perf_counter()
    tr_path, ev_path = ensure_data(data_dir, args.n_train, args.n_eval, args.seed, args.benchmark, args.n_val,
                                   args.clock, args.lanes, args.events)
    if args.eval_split == "val":
        ev_path = data_dir / "val.jsonl"
    train, held = load_split(tr_path), load_split(ev_path)
    train_clean = train
    if args.first_event_labels > 0:
        train = first_event_labels(train, args.first_event_labels, args.seed)
        changed = sum(a.spans != b.spans for a, b in zip(train, train_clean))
        print(f"[data] first-event labels: {changed} of {len(train)} training answers now point at the video's "
              f"earliest event", flush=True)
    if args.label_shift:
        train = shifted_labels(train, args.label_shift)
    if args.label_noise > 0 or args.label_round > 0:
        train = noisy_labels(train, args.label_noise, args.seed, args.label_round)
    t_data = time.perf_counter() - t0

    kw = {"mode": args.mode, "answer_format": args.answer_format}
    messages_fn = lambda s: prompts.build_messages(s, include_duration=args.include_duration,  # noqa: E731
                                                   query_position=args.query_position, **kw)
    answer_fn = lambda s: prompts.format_ground_truth_answer(s, **kw)  # noqa: E731

    # tokenizer corpus: the training prompts and answers only (rendered with the same ChatML template)
    t0 = time.perf_counter()
    tmp_tok = build_tiny_tokenizer()
    corpus = [tmp_tok.apply_chat_template(messages_fn(s), tokenize=False, add_generation_prompt=True)
              + answer_fn(s) for s in train]
    f2 = (32 if args.family == "qwen3_vl" else 28) ** 2
    args.min_pixels = args.min_pixels or 4 * f2
    args.max_pixels = args.max_pixels or 6 * f2
    dims = dict(hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
                intermediate=args.intermediate, vision_hidden=args.vision_hidden, vision_depth=args.vision_depth)
    if args.init:  # continue from a checkpoint of this script (curriculum): its tokenizer, processor and weights
        from transformers import AutoProcessor

        from mmgrpo.vlm.models.tiny import model_class

        processor = AutoProcessor.from_pretrained(args.init)
        tok = processor.tokenizer
        model = model_class(args.family).from_pretrained(args.init, dtype=torch.float32, attn_implementation="sdpa")
        dims = {"init": args.init}
    else:
        tok = build_tokenizer(corpus, vocab_size=args.vocab_size)
        processor = build_processor(tok, args.min_pixels, args.max_pixels, args.family)
        model = build_model(tok, seed=args.seed, family=args.family, **dims)
    params = count_params(model)
    print(f"[model] params {params}  vocab {len(tok)}", flush=True)

    video = sft.VideoSettings(fps=args.fps, max_frames=args.max_frames, min_pixels=args.min_pixels,
                              max_pixels=args.max_pixels)
    prep = dict(model_family=args.family, video=video, messages_fn=messages_fn, answer_fn=answer_fn)
    ex_train = sft.prepare_examples(train, processor, **prep)
    ex_eval = sft.prepare_examples(held, processor, **prep)
    t_prep = time.perf_counter() - t0
    e0 = ex_train[0]
    print(f"[prep] {len(ex_train)} train / {len(ex_eval)} eval examples in {t_prep:.1f}s; prompt "
          f"{e0.prompt['input_ids'].shape[-1]} tokens (video grid {e0.prompt['video_grid_thw'].tolist()}), "
          f"answer {len(e0.answer_ids)} tokens: {e0.answer_text!r}", flush=True)

    vis_res = None
    if args.vision_pretrain_steps:
        vis_res = vision_pretrain(model, ex_train, args)
    before = sft.evaluate_tvg(model, processor, ex_eval, batch_size=args.eval_batch_size)
    print(f"[eval before] mIoU {before['mIoU']:.1f} parse {before['parse_rate']:.0f}%", flush=True)

    cfg = sft.SFTConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup_steps,
                        seed=args.seed, max_seconds=args.seconds, log_every=25, train_vision=not args.freeze_vision)
    res = sft.train_sft(model, ex_train, cfg, tok.pad_token_id,
                        log=lambda r: print(f"[sft] step {r['step']:4d} loss {r['loss']:.3f} lr {r['lr']:.2e} "
                                            f"{r['seconds']:.0f}s", flush=True))
    if res["stopped_by"] != "steps":
        print(f"[sft] WARNING: wall-clock guard hit after {res['steps_done']}/{args.steps} steps", flush=True)

    after = sft.evaluate_tvg(model, processor, ex_eval, batch_size=args.eval_batch_size)
    train_sub = ex_train[:len(ex_eval)]
    after_train = sft.evaluate_tvg(model, processor, train_sub, batch_size=args.eval_batch_size)
    print(f"[eval after] held-out mIoU {after['mIoU']:.1f} R1@0.5 {after['R1@0.5']:.1f} parse "
          f"{after['parse_rate']:.0f}% | train-subset mIoU {after_train['mIoU']:.1f} | "
          f"{after['tokens_per_s']:.0f} tok/s", flush=True)
    qs = after["query_swap"]
    if qs["n"]:
        print(f"[eval after] query-swap probe: own-query mIoU {qs['own_mIoU']:.1f} vs another event of the same "
              f"video {qs['other_mIoU']:.1f} (equal = the model ignores the query)", flush=True)

    baselines = prior_baselines(train_clean, held)
    print(f"[baselines] video-blind spans fitted on train, held-out mIoU: constant "
          f"{baselines['constant_span']['mIoU']:.1f}, duration-relative "
          f"{baselines['duration_relative_span']['mIoU']:.1f}", flush=True)

    model.save_pretrained(out)
    processor.save_pretrained(out)
    reload_diff = check_reload(out, model, ex_eval[:4], tok.pad_token_id, args.family)
    anchor = Path(out).resolve().parent  # paths outside the repository are recorded relative to this folder
    report = {
        "command": " ".join(["python"] + portable_argv(sys.argv, anchor)),
        "args": portable_record(vars(args), anchor),
        "video": vars(video), "prompt": dict(kw, include_duration=args.include_duration, query_position=args.query_position),
        # what a GRPO run / the eval harness must set to see the inputs this model was trained on
        "trainer_overrides": trainer_overrides(video, args),
        "data": {"train": portable_path(tr_path, anchor), "eval": portable_path(ev_path, anchor), "n_train": len(train), "n_eval": len(held),
                 # the generator's settings as written by it (version 2: clock, lanes, n_events, seed ...)
                 "info": {k: v for k, v in _read_info(data_dir).items() if k != "checks"}},
        "params": params, "dims": dims, "vocab_size": len(tok),
        "sft": {k: v for k, v in res.items() if k != "history"},
        "vision_pretrain": None if vis_res is None else {
            **{k: v for k, v in vis_res.items() if k != "history"},
            "curve": [(h["step"], round(h["loss"], 4), round(h["recall"], 3), round(h["false_pos"], 4))
                      for h in vis_res["history"][:: max(1, len(vis_res["history"]) // 20)]]},
        "loss_curve": [(h["step"], round(h["loss"], 4)) for h in res["history"][:: max(1, len(res["history"]) // 40)]],
        "final_loss": res["history"][-1]["loss"] if res["history"] else None,
        "fingerprint": fingerprint(args.benchmark),
        "video_blind_baselines": baselines,
        "eval_before": _metrics(before), "eval_heldout": _metrics(after), "eval_train_subset": _metrics(after_train),
        "examples": [{"id": e.id, "gt": e.answer_text, "pred": t} for e, t in zip(ex_eval[:8], after["texts"][:8])],
        "reload_max_abs_logit_diff": reload_diff,
        "seconds": {"data": t_data, "prepare": t_prep, "sft": res["seconds"], "total": time.perf_counter() - t_start},
        "torch_threads": torch.get_num_threads(),
    }
    with open(out / "sft_report.json", "w") as f:
        json.dump(report, f, indent=1)
    if args.ship:
        ship(out, Path(args.ship))
    print(f"[done] saved {out} in {report['seconds']['total']:.0f}s (reload logit diff {reload_diff})", flush=True)
    return report


def vision_pretrain(model, examples, args) -> dict:
    """The tagging stage (``--vision-pretrain-steps``): one item per training video, labels from the renderer's
    ground truth (``synthetic_grounding.block_tags``) over the frames the processor actually sampled."""
    from mmgrpo.vlm import sft
    from mmgrpo.vlm.synthetic.grounding import TAG_CLASSES, block_tags

    if args.benchmark != "grounding":
        raise SystemExit("--vision-pretrain-steps needs --benchmark grounding (the labels come from its renderer)")
    by_video: dict = {}
    for e in examples:
        by_video.setdefault(sft.sample_dict(e.sample)["video"], []).append(e)
    items = []
    for exs in by_video.values():
        tags = block_tags([e.sample for e in exs], exs[0].clip.frame_indices)
        items.append((exs[0].prompt, tags))
    print(f"[vision] tagging pre-training on {len(items)} videos, {len(TAG_CLASSES)} classes", flush=True)
    return sft.pretrain_vision_tags(
        model, items, len(TAG_CLASSES), steps=args.vision_pretrain_steps, lr=args.vision_pretrain_lr,
        seed=args.seed, log=lambda r: print(f"[vision] step {r['step']:4d} loss {r['loss']:.4f} recall "
                                           f"{r['recall']:.2f} false-pos {r['false_pos']:.3f} {r['seconds']:.0f}s",
                                           flush=True))


SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "processor_config.json",
                 "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "sft_report.json")


def ship(src: Path, dst: Path) -> None:
    """Copy the files a ``from_pretrained`` load needs (and the report) from ``src`` to ``dst``."""
    import shutil

    dst.mkdir(parents=True, exist_ok=True)
    for f in SHIPPED_FILES:
        shutil.copyfile(src / f, dst / f)
    print(f"[ship] copied {len(SHIPPED_FILES)} files to {dst}", flush=True)


def trainer_overrides(video, args) -> list[str]:
    """``key=value`` overrides of ``mmgrpo train`` / ``eval/generate_vlm.py`` (DataConfig) for this model."""
    if args.include_duration:
        print("[warn] --include-duration: the trainer's prompts do not state the duration", flush=True)
    return [f"data.prompt_mode={args.mode}", f"data.answer_format={args.answer_format}",
            f"data.query_position={getattr(args, 'query_position', 'after')}",
            f"data.video_fps={video.fps}", f"data.min_frames={video.min_frames}", f"data.max_frames={video.max_frames}",
            f"data.video_min_pixels={video.min_pixels}", f"data.video_max_pixels={video.max_pixels}"]


def _metrics(m: dict) -> dict:
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in m.items() if k not in ("ious", "texts")}


def check_reload(path: Path, model, examples, pad_token_id: int, family: str = "qwen2_5_vl") -> float:
    """Reload with ``from_pretrained`` + ``AutoProcessor`` and return the max |logit difference| on a batch."""
    import torch
    from transformers import AutoProcessor

    from mmgrpo.vlm.models.tiny import model_class

    from mmgrpo.vlm.sft import collate_sft

    AutoProcessor.from_pretrained(path)  # must load
    m2 = model_class(family).from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    m2.eval()
    model.eval()
    batch, _ = collate_sft(examples, pad_token_id)
    with torch.no_grad():
        a = model(**batch).logits
        b = m2(**batch).logits
    return float((a - b).abs().max())


if __name__ == "__main__":
    main()
