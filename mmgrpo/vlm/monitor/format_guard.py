"""Format-collapse guard of the VLM trainer (``format_guard.*``).

A GRPO run can learn to write garbage around a correct-looking answer: issue #41's demo kept its span but appended
``.00`` until the 24-token cap (``<answer>2.00 to 4.00.00.00…``), because its reward (IoU read by a tolerant
parser) did not care, and nothing flagged it while the training reward fell. The guard watches, per step, the
share of the on-policy completions that are **well formed** (:func:`mmgrpo.vlm.rewards.format.well_formed`: the
whole output is exactly the answer the prompt asks for, for every task: tvg, mcq, gqa, rec) and the share that
ran to ``rollout.max_new_tokens`` (``completions/clipped_ratio``). Both are always logged
(``completions/well_formed``, ``completions/clipped_ratio``, with ``completions/mean_length`` / ``max_length``;
metrics.jsonl, tensorboard, the progress bar). When their mean over the last ``format_guard.window`` steps
crosses ``min_well_formed`` / ``max_at_cap``, the guard logs a warning naming the values and a sample output
(once per episode: again only after the values recovered), sets ``guard/format_alarm`` to 1, and with
``format_guard.action=stop`` stops the run (a checkpoint is written first; ``mmgrpo train`` exits with code 3).

The rule follows ``data.prompt_mode`` (methods that switch the mode per prompt, hybrid CoT, are measured against
it) and ``data.answer_format``. A free-text answer (the OCR reward) has no grammar to check: turn the guard off
(``format_guard.action=off``) for such runs. The window is not checkpointed: a resumed run fills it again.
"""
from __future__ import annotations

from collections import deque
from typing import Optional, Sequence

from mmgrpo.utils.logging import get_logger
from mmgrpo.vlm.rewards.format import well_formed

log = get_logger("mmgrpo.train")

__all__ = ["well_formed_rows", "progress_fields", "FormatGuard"]


def well_formed_rows(texts: Sequence[Optional[str]], data_cfg) -> list[bool]:
    """Per completion: is it exactly the answer the run's prompt asks for (``data_cfg``: the ``data`` section;
    ``task``, ``prompt_mode``, ``answer_format``)?"""
    d = data_cfg
    return [well_formed(t, d.task, mode=d.prompt_mode, answer_format=d.answer_format) for t in texts]


def progress_fields(m: dict[str, float]) -> dict[str, str]:
    """The progress bar's postfix of a step: reward, share of well-formed completions, mean length, share at the
    token cap (the guard's signals, so a collapse is visible while it happens)."""
    out = {}
    if m.get("reward/total/mean") is not None:
        out["reward"] = f"{m['reward/total/mean']:.3f}"
    if "completions/well_formed" in m:
        out.update(wf=f"{m['completions/well_formed']:.0%}", len=f"{m['completions/mean_length']:.1f}",
                   cap=f"{m['completions/clipped_ratio']:.0%}")
    return out


class FormatGuard:
    """Windowed check of ``completions/well_formed`` and ``completions/clipped_ratio`` after each step.
    ``options``: the ``format_guard`` config section; ``max_new_tokens``: the rollout's token cap (for the message)."""

    def __init__(self, options, max_new_tokens: int) -> None:
        self.o = options
        self.cap = max_new_tokens
        self.wf: deque[float] = deque(maxlen=max(1, self.o.window))
        self.at_cap: deque[float] = deque(maxlen=max(1, self.o.window))
        self.alarm = False

    def update(self, step: int, m: dict[str, float], texts: Sequence[str] = (), data_cfg=None) -> Optional[str]:
        """Add this step's values (from the step's metrics ``m``; adds ``guard/format_alarm``); returns the reason
        to stop the run, or None. Every process gets the same reduced metrics, so all decide alike; ``texts`` (this
        process's completions) and ``data_cfg`` (the ``data`` section) only provide an example of a malformed one
        for the message."""
        if self.o.action == "off" or "completions/well_formed" not in m:
            return None
        self.wf.append(m["completions/well_formed"])
        self.at_cap.append(m.get("completions/clipped_ratio", 0.0))
        if len(self.wf) < self.wf.maxlen:  # not enough steps for a windowed mean yet
            m["guard/format_alarm"] = 0.0
            return None
        wf, cap = sum(self.wf) / len(self.wf), sum(self.at_cap) / len(self.at_cap)
        problems = []
        if wf < self.o.min_well_formed:
            problems.append(f"only {100 * wf:.0f} % of the completions are well formed (format_guard.min_well_formed"
                            f"={100 * self.o.min_well_formed:.0f} %)")
        if cap > self.o.max_at_cap:
            problems.append(f"{100 * cap:.0f} % ran to the {self.cap}-token cap (format_guard.max_at_cap="
                            f"{100 * self.o.max_at_cap:.0f} %)")
        m["guard/format_alarm"] = float(bool(problems))
        if not problems:
            if self.alarm:
                log.info("step %d: format guard: the completions are well formed again (%.0f %%, %.0f %% at the cap, "
                         "mean of the last %d steps)", step, 100 * wf, 100 * cap, len(self.wf))
            self.alarm = False
            return None
        example = (next((t for t, ok in zip(texts, well_formed_rows(texts, data_cfg)) if not ok), None)
                   if data_cfg else None)
        reason = (f"format collapse at step {step}: " + " and ".join(problems) + f", mean of the last {len(self.wf)} "
                  f"steps; mean length {m.get('completions/mean_length', float('nan')):.1f} tokens"
                  + (f"; e.g. {example!r}" if example is not None else ""))
        if not self.alarm:
            log.warning("%s. The policy may be learning to write around its answer: check the format reward "
                        "(reward.weights), KL and rollout.max_new_tokens (format_guard.action=stop stops such a run)",
                        reason)
        self.alarm = True
        return reason if self.o.action == "stop" else None
