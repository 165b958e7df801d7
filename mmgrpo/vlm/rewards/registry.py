"""Task-level reward registry: named rewards → a batched reward function for the trainer.

>>> fn = build_reward_fn({"iou": 1.0, "format": 0.5}, task="tvg")
>>> out = fn(completions, samples)          # dict[str, torch.Tensor (N,)]
>>> out["iou"], out["format"], out["total"], out["parse_failed"]

``out[name]`` is the *unweighted* reward of each named reward (float32), ``out["total"]`` = Σ_k w_k · r_k
(float32) and ``out["parse_failed"]`` (bool) marks completions whose task answer could not be parsed (TVG: span;
MCQ: letter, or number for ``numeric``; GQA: letter or evidence span; REC: box).

Composition: ``total`` is the simple weighted sum ("sum then normalise" in the group-advantage core). To
normalise each reward within its group before summing (GDPO), pass the per-reward tensors and the same weights
to ``mmgrpo.core.multi_reward_advantages(..., mode="normalize_then_sum")`` and ignore ``total``.

Samples are canonical-schema dicts aligned with the completions (the trainer repeats each prompt's sample G
times); see :mod:`mmgrpo.vlm.rewards.tasks` for the fields, the clip-relative time convention and the multi-GT rule.
Non-finite rewards never leak: one raises ``ValueError`` naming the reward and the sample id.

Torch is imported only when the function is called; :meth:`RewardFn.score` returns plain Python lists.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Callable, Mapping, Optional, Sequence

from .choice import mcq_exact, mcq_soft
from .format import format_reward, well_formed
from .box import frame_scale, resolve_box_frame
from .length import length_bonus
from .multibox import confidence_reward, greedy_match, multibox_iou_reward, parse_scored_boxes
from .numeric import mean_relative_accuracy, numeric_reward
from .ocr import ocr_answer, ocr_wer_reward
from .parsing import completion_text
from .tasks import (
    ParseConfig,
    box_best_iou,
    gt_letters,
    gt_number,
    numeric_correct,
    _err,
    _size_field,
    gt_boxes,
    prepare_box,
    prepare_choice,
    prepare_number,
    prepare_temporal,
    sample_id,
    span_boundary_iou,
    span_gaussian,
    span_iop,
    span_iou,
    span_multi_iou,
)
from .protocols import check_parse_mode, is_strict, release_format
from .temporal import threshold_reward
from .video_r1 import make_stemmer, sample_problem_type, video_r1_accuracy

__all__ = ["REWARDS", "TASKS", "build_reward_fn", "RewardFn", "build_rewards", "accuracy_key"]

TASKS = ("tvg", "mcq", "gqa", "rec", "qa")

# reward name -> (tasks it applies to, one-line description)
REWARDS: dict[str, tuple[tuple[str, ...], str]] = {
    "format": (TASKS, "strict <think>…</think><answer>…</answer>, nothing else (1/0); in a release parse mode, "
                      "that release's format check"),
    "format_loose": (TASKS, "a closed <answer>…</answer> block exists (1/0)"),
    "format_exact": (TASKS, "the whole output is exactly the answer the prompt asks for (think block per prompt_mode, "
                            "one answer block, its content in the task's answer grammar, nothing else; 1/0; "
                            "mmgrpo.vlm.rewards.format.well_formed)"),
    "length": (TASKS, "Video-R1 bonus: correct and lo ≤ tokens ≤ hi, >1 correct in the group"),
    "iou": (("tvg", "gqa"), "temporal IoU (max over GT spans)"),
    "iou_boundary": (("tvg", "gqa"), "Time-R1 tIoU·(1−|Δs|/D)(1−|Δe|/D)"),
    "iou_gaussian": (("tvg", "gqa"), "exp(−(Δs²+Δe²)/(2σ²D²))"),
    "iou_threshold": (("tvg", "gqa"), "mean over θ of 1[tIoU ≥ θ]"),
    "iou_multi": (("tvg", "gqa"), "merged multi-interval IoU of all spans"),
    "iop": (("gqa", "tvg"), "intersection over prediction (max over GT spans)"),
    "mcq": (("mcq", "gqa"), "exact option-letter set match"),
    "mcq_soft": (("mcq", "gqa"), "TW-GRPO |P|/|G| if P ⊆ G"),
    "numeric": (("mcq",), "numeric answer: 1[rel_err ≤ numeric_rel_tol] or continuous"),
    "numeric_mra": (("mcq",), "VSI-Bench mean relative accuracy"),
    "box_iou": (("rec",), "box IoU in original-image pixels"),
    "box_acc": (("rec",), "1[box IoU ≥ box_threshold]"),
    "box_iou_multi": (("rec",), "Visual-RFT: Σ IoU of greedy matches (IoU > 0.5, by confidence) / max(#GT, #pred)"),
    "box_confidence": (("rec",), "Visual-RFT: mean of c (matched box) or 1 − c (unmatched), answer JSON list"),
    "ocr_wer": (("mcq",), "Video-R1 OCR: clip(1 − word error rate, 0, 1) of the <answer> text vs answer string"),
    "video_r1_accuracy": (("mcq", "qa"), "Video-R1's accuracy by problem type (mcq samples: multiple choice; qa: "
                                         "meta.problem_type): exact letter | numerical exact to 2 decimals | OCR "
                                         "1 − WER | free-form mean ROUGE-1/2/L F | regression 1 − relative error"),
}

_DEFAULT_CFG: dict[str, Any] = {
    # parsing: "lenient" (the project parser, options below) or a release's rules (protocols.PARSE_MODES)
    "parse_mode": "lenient",
    "fallback_to_text": False,
    "allow_unclosed": True,
    "which": "auto",
    "clip_relative": True,
    "span_tags": ("glue", "evidence"),
    # temporal
    "sigma": 0.1,
    "iou_thresholds": (0.3, 0.5, 0.7),
    # format
    "think_in_prompt": False,
    "strict_format": False,  # parse_mode tempsamp_r1: the release's strict format check (TIMELENS_STRICT_FORMAT)
    "prompt_mode": "think",  # format_exact: which structure the prompt asks for (think | no_think | hybrid)
    "answer_format": "seconds",  # format_exact: how the prompt asks for a span (seconds | json)
    # numeric
    "numeric_rel_tol": 0.0,
    "numeric_mode": "binary",
    # boxes
    "box_frame": None,
    "box_inclusive": False,
    "box_threshold": 0.5,
    # length
    "token_counter": None,
    "length_lo": 320,
    "length_hi": 512,
    "length_bonus": 0.2,
    "length_group_condition": True,
    "correct_threshold": 0.5,
    # Video-R1 free-form ROUGE: "none" or "porter" (nltk; the release stems)
    "rouge_stemmer": "none",
}

def _answer_text(sample: Mapping[str, Any]) -> str:
    """The free-text ground truth (``answer``) of an OCR sample."""
    ans = sample.get("answer")
    if not isinstance(ans, str):
        raise _err(sample, "answer", f"reward 'ocr_wer' needs the reference text as a string, got {ans!r}")
    return ans


def _box_scale(sample: Mapping[str, Any], frame: str) -> tuple[float, float]:
    """(sx, sy) from the model's box frame to original-image pixels for this sample."""
    size = _size_field(sample, "image_size")
    resized = sample.get("resized_image_size")
    if resolve_box_frame(frame) == "resized_abs":
        if resized is None:
            raise _err(sample, "resized_image_size", f"required for box frame {frame!r}")
        resized = _size_field(sample, "resized_image_size")
    return frame_scale(frame, image_size=size, resized_size=resized)


_PRIMARY = {"tvg": "iou", "gqa": "mcq", "rec": "box_iou"}  # mcq: "mcq" or "numeric", see _primary()


class RewardFn:
    """Callable ``(completions, samples) -> dict[str, torch.Tensor(N)]``; build with :func:`build_reward_fn`."""

    def __init__(self, weights: Mapping[str, float], task: str, cfg: Mapping[str, Any]):
        self.weights = dict(weights)
        self.task = task
        self.cfg = dict(cfg)
        self.parse_cfg = ParseConfig(
            fallback_to_text=bool(cfg["fallback_to_text"]),
            allow_unclosed=bool(cfg["allow_unclosed"]),
            which=cfg["which"],
            clip_relative=bool(cfg["clip_relative"]),
            span_tags=tuple(cfg["span_tags"]),
            parse_mode=cfg["parse_mode"],
        )
        self.stem = make_stemmer(cfg["rouge_stemmer"])

    @property
    def names(self) -> list[str]:
        return list(self.weights)

    # -- per-sample -------------------------------------------------------------------------------------------
    def _score_one(self, text: Optional[str], sample: Mapping[str, Any]) -> tuple[dict[str, float], bool, float]:
        """Rewards (without length), parse_failed, and the primary accuracy used by the length bonus."""
        c, pc, task, want = self.cfg, self.parse_cfg, self.task, self.weights
        r: dict[str, float] = {}
        failed = False
        primary = 0.0
        if "format" in want:
            if is_strict(pc.parse_mode):  # the release's own format check
                r["format"] = release_format(text, pc.parse_mode, strict=bool(c["strict_format"]))
            else:
                r["format"] = format_reward(text, strict=True, think_in_prompt=c["think_in_prompt"])
        if "format_loose" in want:
            r["format_loose"] = format_reward(text, strict=False)
        if "format_exact" in want:
            r["format_exact"] = 1.0 if well_formed(text, task, mode=c["prompt_mode"],
                                                   answer_format=c["answer_format"]) else 0.0

        if sample.get("task") == "qa" or "video_r1_accuracy" in want:
            # Video-R1's five problem types; an open-answer (qa) sample in an mcq run has no letters to parse
            acc, found = video_r1_accuracy(text, sample.get("answer"), sample_problem_type(sample), self.stem)
            r["video_r1_accuracy"] = primary = acc
            if sample.get("task") == "qa":
                missing = sorted(set(want) - {"format", "format_loose", "length", "video_r1_accuracy"})
                if missing:
                    raise _err(sample, "task", f"an open-answer (qa) sample has no {missing} reward; weight "
                                               "video_r1_accuracy (+ format, length) for Video-R1's mixed data")
                return {k: v for k, v in r.items() if k in want}, not found, primary

        # the task's answer is always parsed (even if only "format" is weighted) so parse_failed is meaningful
        if task in ("tvg", "gqa"):
            tp = prepare_temporal(text, sample, pc, evidence=(task == "gqa"))
            failed |= not tp.parsed
            iou = span_iou(tp)
            if task == "tvg":
                primary = iou
            if "iou" in want:
                r["iou"] = iou
            if "iou_boundary" in want:
                r["iou_boundary"] = span_boundary_iou(tp)
            if "iou_gaussian" in want:
                r["iou_gaussian"] = span_gaussian(tp, c["sigma"])
            if "iou_threshold" in want:
                r["iou_threshold"] = threshold_reward(iou, c["iou_thresholds"])
            if "iou_multi" in want:
                r["iou_multi"] = span_multi_iou(tp)
            if "iop" in want:
                r["iop"] = span_iop(tp)

        numeric_wanted = bool({"numeric", "numeric_mra"} & set(want))
        letters_wanted = bool({"mcq", "mcq_soft"} & set(want))
        ocr_wanted = "ocr_wer" in want
        video_r1_wanted = "video_r1_accuracy" in want
        if task == "mcq" and video_r1_wanted and not letters_wanted:
            failed |= prepare_choice(text, sample, pc).value is None
        if task == "mcq" and ocr_wanted:  # free-text answer (Video-R1 "OCR"): no letters to parse
            failed |= ocr_answer(text) is None
            r["ocr_wer"] = primary = ocr_wer_reward(text, _answer_text(sample))
        if task == "gqa" or (task == "mcq" and (letters_wanted or not (numeric_wanted or ocr_wanted
                                                                       or video_r1_wanted))):
            p = prepare_choice(text, sample, pc)
            gt = gt_letters(sample)
            failed |= not p.ok
            exact = mcq_exact(p.value, gt)
            primary = exact
            if "mcq" in want:
                r["mcq"] = exact
            if "mcq_soft" in want:
                r["mcq_soft"] = mcq_soft(p.value, gt)

        if task == "mcq" and numeric_wanted:
            p = prepare_number(text, sample, pc)
            gt = gt_number(sample)
            failed |= not p.ok
            if "numeric" in want:
                if is_strict(pc.parse_mode) and c["numeric_mode"] == "binary":  # Video-R1's decimal-mark rule
                    r["numeric"] = numeric_correct(text, sample, pc)
                else:
                    r["numeric"] = numeric_reward(p.value, gt, rel_tol=c["numeric_rel_tol"], mode=c["numeric_mode"])
                primary = r["numeric"]
            if "numeric_mra" in want:
                r["numeric_mra"] = mean_relative_accuracy(p.value, gt)

        multi_wanted = bool({"box_iou_multi", "box_confidence"} & set(want))
        if task == "rec" and multi_wanted:
            boxes = parse_scored_boxes(text, allow_unclosed=pc.allow_unclosed)
            failed |= boxes is None
            gts = gt_boxes(sample)
            scale = _box_scale(sample, c["box_frame"])
            preds = [((b[0] * scale[0], b[1] * scale[1], b[2] * scale[0], b[3] * scale[1]), conf)
                     for b, conf in boxes or []]
            matches = greedy_match(gts, preds)
            if "box_iou_multi" in want:
                r["box_iou_multi"] = primary = multibox_iou_reward(matches, len(gts))
            if "box_confidence" in want:
                r["box_confidence"] = confidence_reward(matches)
        if task == "rec" and ({"box_iou", "box_acc"} & set(want) or not multi_wanted):
            bp = prepare_box(text, sample, pc, frame=c["box_frame"], inclusive=c["box_inclusive"])
            failed |= bp.pred is None
            biou = box_best_iou(bp, inclusive=c["box_inclusive"])
            primary = biou
            if "box_iou" in want:
                r["box_iou"] = biou
            if "box_acc" in want:
                # VLM-R1 counts IoU > θ (strictly); the project counts IoU >= θ
                hit = biou > c["box_threshold"] if is_strict(pc.parse_mode) else biou >= c["box_threshold"]
                r["box_acc"] = 1.0 if hit else 0.0
        return r, failed, primary

    def score(self, completions: Sequence[Any], samples: Sequence[Mapping[str, Any]]) -> dict[str, list]:
        """Same as ``__call__`` but returns plain Python lists (no torch)."""
        if len(completions) != len(samples):
            raise ValueError(f"{len(completions)} completions but {len(samples)} samples")
        texts = [completion_text(c) for c in completions]
        rows, failed, primary = [], [], []
        for text, sample in zip(texts, samples):
            r, f, p = self._score_one(text, sample)
            rows.append(r)
            failed.append(f)
            primary.append(p)
        if "length" in self.weights:
            correct = [p >= self.cfg["correct_threshold"] for p in primary]
            n_correct: dict[str, int] = defaultdict(int)
            for s, ok in zip(samples, correct):
                n_correct[sample_id(s)] += int(ok)
            counter = self.cfg["token_counter"]
            for i, (text, s) in enumerate(zip(texts, samples)):
                group_ok = n_correct[sample_id(s)] > 1 or not self.cfg["length_group_condition"]
                n_tok = int(counter(text or ""))
                rows[i]["length"] = length_bonus(
                    n_tok,
                    correct[i] and group_ok,
                    lo=self.cfg["length_lo"],
                    hi=self.cfg["length_hi"],
                    bonus=self.cfg["length_bonus"],
                )
        out: dict[str, list] = {name: [] for name in self.weights}
        out["total"] = []
        for r, s in zip(rows, samples):
            total = 0.0
            for name, w in self.weights.items():
                v = r[name]
                if not math.isfinite(v):
                    raise ValueError(f"reward {name!r} is non-finite ({v}) for sample id={sample_id(s)}")
                out[name].append(v)
                total += w * v
            if not math.isfinite(total):
                raise ValueError(f"total reward is non-finite ({total}) for sample id={sample_id(s)}")
            out["total"].append(total)
        out["parse_failed"] = failed
        return out

    def __call__(self, completions: Sequence[Any], samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        from .open import score_tensors

        return score_tensors(self.score(completions, samples))

    def __repr__(self) -> str:
        return f"RewardFn(task={self.task!r}, weights={self.weights})"


def build_reward_fn(names_and_weights: Mapping[str, float], task: str, **cfg: Any) -> RewardFn:
    """Build the batched reward function for ``task`` ∈ {tvg, mcq, gqa, rec}.

    names_and_weights: reward name → weight in ``total`` (see ``REWARDS`` for names and the tasks they apply to).
    cfg (all optional unless noted): parse_mode ("lenient": the project parser, or a released method's parsing and
    measuring rules, see ``mmgrpo.vlm.rewards.protocols.PARSE_MODES``: time_r1 / time_r1_eval / tempsamp_r1 (tvg),
    video_r1 / video_r1_eval (mcq), vlm_r1 / vlm_r1_eval (rec), nextgqa (gqa); a release mode ignores
    fallback_to_text / allow_unclosed / which), fallback_to_text (False), allow_unclosed (True), which ("auto"),
    clip_relative (True), span_tags (("glue", "evidence")), sigma (0.1, Gaussian width as a fraction of D),
    iou_thresholds ((0.3, 0.5, 0.7)), think_in_prompt (False), strict_format (False: with parse_mode tempsamp_r1,
    True = the release's strict format check), prompt_mode ("think") and answer_format ("seconds") (what
    ``format_exact`` checks), numeric_rel_tol (0.0), numeric_mode ("binary" |
    "continuous"), box_frame (**required for REC**: qwen2_vl | qwen2_5_vl | qwen3_vl | norm1000 | resized_abs |
    abs | norm1), box_inclusive (False = the continuous IoU, VLM-R1's; True = +1 pixel-index areas),
    box_threshold (0.5), token_counter (**required for "length"**: callable str → int, e.g.
    ``lambda s: len(tok(s, add_special_tokens=False).input_ids)``), length_lo (320),
    length_hi (512), length_bonus (0.2), length_group_condition (True), correct_threshold (0.5: a completion is
    "correct" for the length bonus when the task's primary reward — IoU, exact MCQ, numeric, box IoU — reaches it).
    Unknown names, tasks or cfg keys raise immediately (typos do not silently drop a reward).
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {TASKS}")
    if not names_and_weights:
        raise ValueError("names_and_weights is empty")
    weights: dict[str, float] = {}
    for name, w in names_and_weights.items():
        if name not in REWARDS:
            raise ValueError(f"unknown reward {name!r}; available: {sorted(REWARDS)}")
        if task not in REWARDS[name][0]:
            raise ValueError(f"reward {name!r} does not apply to task {task!r} (tasks: {REWARDS[name][0]})")
        wf = float(w)
        if not math.isfinite(wf):
            raise ValueError(f"weight of {name!r} must be finite, got {w!r}")
        weights[name] = wf
    unknown = set(cfg) - set(_DEFAULT_CFG)
    if unknown:
        raise TypeError(f"unknown reward cfg keys {sorted(unknown)}; allowed: {sorted(_DEFAULT_CFG)}")
    full = {**_DEFAULT_CFG, **cfg}
    check_parse_mode(full["parse_mode"], task)
    if full["prompt_mode"] not in ("think", "no_think", "hybrid"):
        raise ValueError(f"prompt_mode must be 'think', 'no_think' or 'hybrid', got {full['prompt_mode']!r}")
    if full["answer_format"] not in ("seconds", "json"):
        raise ValueError(f"answer_format must be 'seconds' or 'json', got {full['answer_format']!r}")
    if full["strict_format"] and full["parse_mode"] != "tempsamp_r1":
        raise ValueError("strict_format=True is TempSamp-R1's strict format check: it needs parse_mode='tempsamp_r1' "
                         f"(got {full['parse_mode']!r}); for the project's exact rule weight 'format_exact'")
    if full["which"] not in ("auto", "first", "last"):
        raise ValueError(f"which must be 'auto', 'first' or 'last', got {full['which']!r}")
    if task == "rec":
        if full["box_frame"] is None:
            raise ValueError("task 'rec' needs box_frame= (qwen2_vl | qwen2_5_vl | qwen3_vl | norm1000 | ...)")
        from .box import resolve_box_frame

        resolve_box_frame(full["box_frame"])
    if "length" in weights and not callable(full["token_counter"]):
        raise ValueError("reward 'length' needs token_counter= (a callable str -> number of tokens)")
    if (task in ("mcq", "qa") and not ({"mcq", "mcq_soft", "numeric", "numeric_mra", "video_r1_accuracy"}
                                       & set(weights)) and "length" in weights):
        raise ValueError("'length' on task 'mcq' needs an accuracy reward (mcq, mcq_soft, numeric, video_r1_accuracy) "
                         "to define correct")
    make_stemmer(full["rouge_stemmer"])  # a typo / missing nltk fails now
    if full["numeric_mode"] not in ("binary", "continuous"):
        raise ValueError(f"numeric_mode must be 'binary' or 'continuous', got {full['numeric_mode']!r}")
    return RewardFn(weights, task, full)


# ------------------------------------------------------------------------------------------- trainer config
def build_rewards(reward_cfg, task: str, family: str, tokenizer, prompt_mode: str = "think",
                  answer_format: str = "seconds"):
    """(reward_fn, accuracy_fn | None): the registry's batched reward function for the configured weights, and
    one for the accuracy reward (T-GRPO) when it is not among the weighted rewards. ``format_exact`` checks the
    structure ``prompt_mode`` and ``answer_format`` ask for (data.prompt_mode / data.answer_format)."""
    answer_only_format = getattr(reward_cfg, "parse_mode", "lenient") == "tempsamp_r1"  # its check needs no <think>
    if prompt_mode == "no_think" and reward_cfg.weights.get("format") and not answer_only_format:
        # strict "format" requires a <think> block, which this prompt tells the model not to write: the reward
        # would be 0 for every completion and silently shift every total
        raise ValueError("reward.weights has 'format' (strict: <think>...</think><answer>...</answer>) but "
                         "data.prompt_mode=no_think asks for a direct <answer>: it would score 0 for every "
                         "completion. Use 'format_loose' (a closed <answer> block) or drop it, e.g. "
                         "reward.weights='{iou: 1.0, format_loose: 0.5}'")
    opts = dict(reward_cfg.options)
    mode = getattr(reward_cfg, "parse_mode", "lenient")
    if mode != "lenient":
        if opts.get("parse_mode", mode) != mode:
            raise ValueError(f"reward.parse_mode={mode!r} but reward.options sets parse_mode="
                             f"{opts['parse_mode']!r}: set it in one place")
        opts["parse_mode"] = mode
    if task == "rec":
        opts.setdefault("box_frame", family)
    if "format_exact" in reward_cfg.weights:  # the prompt's own structure, unless the options say otherwise
        opts.setdefault("prompt_mode", prompt_mode)
        opts.setdefault("answer_format", answer_format)
    if "length" in reward_cfg.weights:
        opts.setdefault("token_counter", lambda s: len(tokenizer(s, add_special_tokens=False).input_ids))
    from .open import OpenRewardFn, build_open_rewards, split_weights

    builtin, open_w = split_weights(reward_cfg.weights)
    kwargs = dict(getattr(reward_cfg, "kwargs", None) or {})
    if not open_w and kwargs:
        raise ValueError(f"reward.kwargs has {sorted(kwargs)} but reward.weights weights no open reward (judge or "
                         "'package.module:factory')")
    fn = build_reward_fn(builtin, task, **opts) if builtin else None
    if open_w:  # the judge and rewards by import path (mmgrpo.vlm.rewards.open): imports and runs their code
        fn = OpenRewardFn(fn, build_open_rewards(list(open_w), kwargs), dict(reward_cfg.weights))
    key = accuracy_key(reward_cfg, task)
    acc_fn = None if key in reward_cfg.weights or key == "total" else build_reward_fn({key: 1.0}, task, **{
        k: v for k, v in opts.items() if k != "token_counter"})
    return fn, acc_fn


def accuracy_key(reward_cfg, task: str) -> str:
    if reward_cfg.accuracy_key != "auto":
        return reward_cfg.accuracy_key
    from .open import split_weights

    builtin, open_w = split_weights(reward_cfg.weights)
    if open_w and not builtin:  # only open rewards: the judge's score, else the weighted total
        return "judge" if "judge" in open_w else "total"
    # free-text (OCR) and multi-box samples have no letter / single box: their own reward is the accuracy
    for name, t in (("video_r1_accuracy", "mcq"), ("ocr_wer", "mcq"), ("box_iou_multi", "rec")):
        if task == t and name in reward_cfg.weights:
            return name
    return {"tvg": "iou", "mcq": "mcq", "gqa": "mcq", "rec": "box_iou"}.get(task, "total")
