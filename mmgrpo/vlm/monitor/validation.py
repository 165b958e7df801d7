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

Every process decodes the whole set (identical greedy outputs; the main process writes): simple and exact,
at the cost of not splitting the work.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from mmgrpo.utils.checkpoint import capture_rng_state, restore_rng_state
from mmgrpo.utils.logging import get_logger

log = get_logger(__name__)

TVG_KEYS = ("mIoU", "R1@0.3", "R1@0.5", "R1@0.7", "parse_rate")


def headline(cfg) -> str:
    """The curve's metric name (without ``val/``)."""
    return cfg.validation.metric or ("mIoU" if cfg.data.task == "tvg" else "accuracy")


class Validator:
    """Holds the validation samples of one run and appends points to its curve."""

    def __init__(self, trainer) -> None:
        from mmgrpo.vlm.data.task import load_samples

        v = trainer.cfg.validation
        self.cfg = trainer.cfg
        from mmgrpo.vlm.data.media import MediaScreen

        self.samples = load_samples(v.file, v.max_samples, trainer.cfg.data.media_root,
                                    check_media=trainer.cfg.data.on_missing_media == "error",
                                    # unusable media stay in the set (scored as an empty answer, counted)
                                    screen=MediaScreen.from_config(trainer.cfg.data, drop=False))
        if not self.samples:
            raise ValueError(f"validation.file={v.file!r} has no samples")
        self.dir = Path(trainer.run_dir) / "validation"
        self.main = trainer.accelerator.is_main_process
        self.done: set[int] = set()  # steps evaluated by this process (a resumed run does not repeat its step)
        self.media_errors = 0

    def due(self, step: int) -> bool:
        v = self.cfg.validation
        return step not in self.done and (step % v.every == 0 or step == self.cfg.run.max_steps)

    def decode(self, trainer) -> tuple[list[str], list[Any]]:
        """Greedy outputs for every validation sample (prepared as in training) and their reward samples."""
        from mmgrpo.vlm.sft import sample_dict

        v = self.cfg.validation
        max_new = v.max_new_tokens or self.cfg.rollout.max_new_tokens
        texts: list[str] = []
        rsamples: list[Any] = []
        from mmgrpo.vlm.train.distributed import generation_context

        with generation_context(trainer):
            for s in range(0, len(self.samples), v.batch_size):
                preps = [self._prepare(trainer, x) for x in self.samples[s:s + v.batch_size]]
                ok = [p for p in preps if p is not None]
                out = iter(self._greedy(trainer, ok, max_new) if ok else [])
                texts += ["" if p is None else next(out) for p in preps]  # unreadable media: an empty answer
                rsamples += [sample_dict(x) if p is None else p.reward_sample
                             for x, p in zip(self.samples[s:s + v.batch_size], preps)]
        return texts, rsamples

    @staticmethod
    def _greedy(trainer, preps, max_new: int) -> list[str]:
        """Greedy answers; with ``tools.enabled`` through the run's multi-turn tool loop (as ``eval/generate_vlm.py``
        runs it), its last turn being the answer."""
        from mmgrpo.vlm.models.rollout import SamplingParams, greedy_generate

        if not trainer.cfg.tools.enabled:
            return greedy_generate(trainer.policy, [p.item for p in preps], max_new)[0]
        raw = [{"text": p.text, "images": p.images, "clip": p.clip, "sample": p.sample} for p in preps]
        return trainer.backend.generate([p.item for p in preps], 1, SamplingParams(max_new_tokens=max_new, greedy=True),
                                        seeds=[0] * len(preps), raw_prompts=raw).texts

    def _prepare(self, trainer, sample):
        """The sample as the trainer prepares it; None (scored as an empty answer, counted) if its media cannot be
        read and data.on_missing_media / on_bad_sample say skip -- the set stays fixed across points."""
        from mmgrpo.vlm.data.task import BadSampleError, MissingMediaError, sample_id

        try:
            return trainer.task.prepare(sample)
        except (MissingMediaError, BadSampleError) as e:
            d = self.cfg.data
            if (d.on_missing_media if isinstance(e, MissingMediaError) else d.on_bad_sample) == "error":
                raise
            self.media_errors += 1
            log.warning("validation sample %s skipped (scored as an empty answer): %s", sample_id(sample), e)
            return None

    def score(self, trainer, texts: list[str], rsamples: list[Any]) -> dict[str, float]:
        from mmgrpo.vlm.train.steps import accuracy, score

        scored = score(trainer, texts, rsamples)
        failed = scored.pop("_failed").bool()
        scored.pop("parse_failed", None)
        m: dict[str, float] = {}
        ok = ~failed
        for k, t in scored.items():
            t = t.float()
            m[f"val/reward/{k}"] = float(t[ok].mean()) if bool(ok.any()) else float("nan")
        acc = accuracy(trainer, texts, rsamples, scored)
        m["val/accuracy"] = 100.0 * float(acc[ok].mean()) if bool(ok.any()) else float("nan")
        if self.cfg.data.task == "tvg":
            from mmgrpo.vlm.sft import score_tvg_outputs

            tv = score_tvg_outputs(texts, self.samples)
            m.update({f"val/{k}": float(tv[k]) for k in TVG_KEYS})
        from mmgrpo.vlm.monitor.format_guard import well_formed_rows

        wf = well_formed_rows(texts, self.cfg)  # exactly the answer the prompt asks for (the format guard's rule)
        m["val/well_formed"] = 100.0 * sum(wf) / max(1, len(wf))
        m["val/n"] = float(len(texts))
        m["val/media_errors"] = float(self.media_errors)
        return m

    def run(self, trainer, step: int) -> dict[str, float]:
        t0 = time.perf_counter()
        self.media_errors = 0
        rng = capture_rng_state()  # greedy decoding draws nothing, but the training stream must not depend on it
        try:
            texts, rsamples = self.decode(trainer)
            m = self.score(trainer, texts, rsamples)
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
        from mmgrpo.vlm.data.task import sample_id

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
            from mmgrpo.utils.logging import plot_curves

            plot_curves(curve, ["val/" + headline(self.cfg)], self.dir / "curve.png", title="validation")
        except Exception as e:  # a plot must never stop training
            log.warning("could not plot %s: %s", curve, e)


def _read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


# ------------------------------------------------------------------------------------------- trainer hooks
def load(trainer) -> Validator | None:
    """The run's validator (its samples read and checked now), or None without ``validation.every``."""
    return Validator(trainer) if trainer.cfg.validation.every else None


def _validator(trainer) -> Validator | None:
    if not trainer.cfg.validation.every:
        return None
    if trainer.validator is None:
        trainer.validator = Validator(trainer)
    return trainer.validator


def on_train_start(trainer, resumed: bool) -> None:
    """Step-0 point of a fresh run (the starting weights)."""
    val = _validator(trainer)
    if val is None or resumed or not trainer.cfg.validation.at_start or trainer.state.step != 0:
        return
    m = val.run(trainer, 0)
    trainer.logger.log(m, 0)


def on_step_end(trainer, metrics: dict[str, float], logged: bool) -> dict[str, float]:
    """After optimizer step ``trainer.state.step``: a validation point when one is due. The ``val/*`` values are added
    to ``metrics`` (the step's row, and what ``run.best_metric`` reads); logged here when the step's row is not."""
    val = _validator(trainer)
    step = trainer.state.step
    if val is None or not val.due(step):
        return metrics
    m = val.run(trainer, step)
    metrics.update(m)
    if not logged:
        trainer.logger.log(m, step)
    c = trainer.cfg
    # select_best: the weights of every validation step are kept as a checkpoint (the loop saves the others)
    loop_saves = (c.run.save_every and step % c.run.save_every == 0) or step >= c.run.max_steps
    if c.validation.select_best and not loop_saves:
        trainer.save()
    return metrics


__all__ = ["Validator", "load", "on_train_start", "on_step_end", "headline"]
