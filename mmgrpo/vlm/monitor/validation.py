"""Validation during VLM training: greedy decoding of a fixed validation set every ``validation.every`` steps.

The held-out metric of a GRPO run can move a lot between nearby steps while the training reward rises (issue #16:
42.0 -> 32.3 mIoU between steps 40 and 85 of one run), so the step whose weights are kept must be chosen on data
that is neither trained on nor reported: ``validation.file``. At step 0 (``validation.at_start``, a fresh run),
every ``validation.every`` steps and after the last step, the current policy decodes every validation prompt
greedily -- with :func:`mmgrpo.vlm.models.rollout.greedy_generate`, the function ``eval/generate_vlm.py`` uses, on
inputs prepared by the trainer's own :class:`~mmgrpo.vlm.data.task.TaskAdapter`, in fixed consecutive batches of
``validation.batch_size`` -- so a point of the curve equals an evaluation of the checkpoint saved at that step
with the same data settings and batch size.

Scores (percent): the trainer's reward functions on the greedy outputs (``val/reward/<name>``, means) and
``val/accuracy``; for temporal grounding also ``val/mIoU``, ``val/R1@0.3/0.5/0.7`` and ``val/parse_rate`` with
the training reward's parser (:func:`mmgrpo.vlm.sft.score_tvg_outputs`; an output without ``<answer>`` scores 0,
where the eval harness's lenient protocol may still read a span); ``val/well_formed``: the share of outputs that
are exactly the answer the prompt asks for (:func:`mmgrpo.vlm.rewards.format.well_formed`).

Written to ``<output_dir>/validation/``: ``curve.jsonl`` (one row per point), ``curve.png`` (headline metric
against step) and ``step-XXXXXXXX.jsonl`` (every output of that point); the ``val/*`` values also go to
``metrics.jsonl`` and tensorboard. ``validation.select_best`` keeps the best checkpoint by ``val/<metric>``
(checkpoints are written at every validation step). Validation draws no random numbers and the RNG state is
restored afterwards, so a run with validation trains exactly like one without.

The recipe builds one :class:`Validator` per run (its samples read and checked before the model loads) and calls
:meth:`Validator.run` with the run's task adapter, policy, rollout backend and reward scorer when a point is
:meth:`~Validator.due`. Every process decodes the whole set (identical greedy outputs; the main process writes):
simple and exact, at the cost of not splitting the work.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable, ContextManager

from mmgrpo.utils.checkpoint import capture_rng_state, restore_rng_state
from mmgrpo.utils.logging import get_logger, plot_curves
from mmgrpo.vlm.data.media import MediaScreen
from mmgrpo.vlm.data.task import BadSampleError, MissingMediaError, TaskAdapter, load_samples, sample_id
from mmgrpo.vlm.models.rollout import RolloutBackend, SamplingParams, greedy_generate
from mmgrpo.vlm.monitor.format_guard import well_formed_rows
from mmgrpo.vlm.rewards.scoring import RewardScorer
from mmgrpo.vlm.sft import sample_dict, score_tvg_outputs

log = get_logger(__name__)

TVG_KEYS = ("mIoU", "R1@0.3", "R1@0.5", "R1@0.7", "parse_rate")


def headline(cfg) -> str:
    """The curve's metric name (without ``val/``)."""
    return cfg.validation.metric or ("mIoU" if cfg.data.task == "tvg" else "accuracy")


class Validator:
    """Holds the validation samples of one run and appends points to its curve. ``cfg``: the run's config (the
    ``validation`` section, ``data`` for the media policy and answer format, ``rollout.max_new_tokens``,
    ``tools.enabled``, ``run.max_steps``); ``out_dir``: the run folder; ``main``: this process writes the files."""

    def __init__(self, cfg, out_dir: str | Path, main: bool) -> None:
        v = cfg.validation
        self.cfg = cfg
        self.samples = load_samples(v.file, v.max_samples, cfg.data.media_root,
                                    check_media=cfg.data.on_missing_media == "error",
                                    # unusable media stay in the set (scored as an empty answer, counted)
                                    screen=MediaScreen.from_config(cfg.data, drop=False))
        if not self.samples:
            raise ValueError(f"validation.file={v.file!r} has no samples")
        self.dir = Path(out_dir) / "validation"
        self.main = main
        self.done: set[int] = set()  # steps evaluated by this process (a resumed run does not repeat its step)
        self.media_errors = 0

    def due(self, step: int) -> bool:
        v = self.cfg.validation
        return step not in self.done and (step % v.every == 0 or step == self.cfg.run.max_steps)

    def decode(self, task: TaskAdapter, policy, backend: RolloutBackend,
               generation_context: Callable[[], ContextManager]) -> tuple[list[str], list[Any]]:
        """Greedy outputs for every validation sample (prepared by the run's ``task`` adapter, as in training) and
        their reward samples; ``generation_context()``: the context sampling runs in (sharded weights gathered)."""
        v = self.cfg.validation
        max_new = v.max_new_tokens or self.cfg.rollout.max_new_tokens
        texts: list[str] = []
        rsamples: list[Any] = []
        with generation_context():
            for s in range(0, len(self.samples), v.batch_size):
                preps = [self._prepare(task, x) for x in self.samples[s:s + v.batch_size]]
                ok = [p for p in preps if p is not None]
                out = iter(self._greedy(policy, backend, ok, max_new) if ok else [])
                texts += ["" if p is None else next(out) for p in preps]  # unreadable media: an empty answer
                rsamples += [sample_dict(x) if p is None else p.reward_sample
                             for x, p in zip(self.samples[s:s + v.batch_size], preps)]
        return texts, rsamples

    def _greedy(self, policy, backend: RolloutBackend, preps, max_new: int) -> list[str]:
        """Greedy answers; with ``tools.enabled`` through the run's multi-turn tool loop (as ``eval/generate_vlm.py``
        runs it), its last turn being the answer."""
        if not self.cfg.tools.enabled:
            return greedy_generate(policy, [p.item for p in preps], max_new)[0]
        raw = [{"text": p.text, "images": p.images, "clip": p.clip, "sample": p.sample} for p in preps]
        return backend.generate([p.item for p in preps], 1, SamplingParams(max_new_tokens=max_new, greedy=True),
                                seeds=[0] * len(preps), raw_prompts=raw).texts

    def _prepare(self, task: TaskAdapter, sample):
        """The sample as the trainer prepares it; None (scored as an empty answer, counted) if its media cannot be
        read and data.on_missing_media / on_bad_sample say skip -- the set stays fixed across points."""
        try:
            return task.prepare(sample)
        except (MissingMediaError, BadSampleError) as e:
            d = self.cfg.data
            if (d.on_missing_media if isinstance(e, MissingMediaError) else d.on_bad_sample) == "error":
                raise
            self.media_errors += 1
            log.warning("validation sample %s skipped (scored as an empty answer): %s", sample_id(sample), e)
            return None

    def score(self, scorer: RewardScorer, texts: list[str], rsamples: list[Any]) -> dict[str, float]:
        scored = scorer.score(texts, rsamples)
        failed = scored.pop("_failed").bool()
        scored.pop("parse_failed", None)
        m: dict[str, float] = {}
        ok = ~failed
        for k, t in scored.items():
            t = t.float()
            m[f"val/reward/{k}"] = float(t[ok].mean()) if bool(ok.any()) else float("nan")
        acc = scorer.accuracy(texts, rsamples, scored)
        m["val/accuracy"] = 100.0 * float(acc[ok].mean()) if bool(ok.any()) else float("nan")
        if self.cfg.data.task == "tvg":
            tv = score_tvg_outputs(texts, self.samples)
            m.update({f"val/{k}": float(tv[k]) for k in TVG_KEYS})
        wf = well_formed_rows(texts, self.cfg.data)  # exactly the answer the prompt asks for (the format guard's rule)
        m["val/well_formed"] = 100.0 * sum(wf) / max(1, len(wf))
        m["val/n"] = float(len(texts))
        m["val/media_errors"] = float(self.media_errors)
        return m

    def run(self, step: int, task: TaskAdapter, policy, backend: RolloutBackend, scorer: RewardScorer,
            generation_context: Callable[[], ContextManager]) -> dict[str, float]:
        """The point of ``step``: decode (:meth:`decode`), score with the run's ``scorer``, write the files; returns
        the ``val/*`` values."""
        t0 = time.perf_counter()
        self.media_errors = 0
        rng = capture_rng_state()  # greedy decoding draws nothing, but the training stream must not depend on it
        try:
            texts, rsamples = self.decode(task, policy, backend, generation_context)
            m = self.score(scorer, texts, rsamples)
        finally:
            restore_rng_state(rng)
        m["val/seconds"] = time.perf_counter() - t0
        self.done.add(step)
        if self.main:
            self._write(step, texts, m)
        key = "val/" + headline(self.cfg)
        log.info("validation at step %d: %s = %.2f (%d samples, %.1f s)", step, key, m.get(key, float("nan")),
                 len(texts), m["val/seconds"])
        return m

    def _write(self, step: int, texts: list[str], m: dict[str, float]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / f"step-{step:08d}.jsonl", "w", encoding="utf-8") as f:
            for s, t in zip(self.samples, texts):
                f.write(json.dumps({"id": sample_id(s), "output": t}) + "\n")
        curve = self.dir / "curve.jsonl"
        rows = [r for r in _read_rows(curve) if r.get("step") != step]  # a resumed run rewrites its own points
        rows.append({"step": step, **{k: (None if v != v else v) for k, v in m.items()}})
        rows.sort(key=lambda r: r["step"])
        curve.write_text("".join(json.dumps(r) + "\n" for r in rows))
        try:
            plot_curves(curve, ["val/" + headline(self.cfg)], self.dir / "curve.png", title="validation")
        except Exception as e:  # a plot must never stop training
            log.warning("could not plot %s: %s", curve, e)


def _read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


__all__ = ["Validator", "headline"]
