r"""Prompt Replay (``methods.prompt_replay``): on-policy reuse of high-signal prompts.

After each step, every group's pass rate :math:`p_g` (share of its on-policy rows with accuracy >=
``correct_threshold``, as :func:`mmgrpo.vlm.methods.pass_rate_filter.group_pass_rates`) decides its prompt's place in
a buffer: a prompt of medium difficulty (``low <= p_g <= high``) enters it (or has its pass rate updated) with
priority :math:`|p_g - 0.5|` (smallest first: the largest expected advantage); one outside the window leaves it.
Before each rollout, ``round(fraction x prompts)`` of the step's prompts are replaced by buffered ones, best priority
first, among those not replayed in the last ``cooldown`` steps and replayed fewer than ``max_reuse`` times (then they
leave the buffer). Only the *prompt* is replayed: its completions are sampled afresh by the current policy (new
seeds: the step is part of each row's seed), so training stays on-policy. The buffer holds at most ``capacity``
prompts (the worst priority leaves first).

Choices: the batch size stays fixed, so a replayed prompt takes the place of the stream's prompt at that position
(that prompt is not trained this epoch). The buffer is checkpointed (each process's own, its prompts as references
to their samples: :mod:`mmgrpo.vlm.data.buffer_state`), so a resumed run replays as the uninterrupted one would.
Metrics: ``prompt_replay/replayed`` (prompts replayed this step), ``prompt_replay/buffer`` (its size).
"""
from __future__ import annotations

import torch

from mmgrpo.vlm.data.task import sample_id
from mmgrpo.vlm.methods.base import VLMMethod
from mmgrpo.vlm.methods.pass_rate_filter import group_pass_rates
from mmgrpo.vlm.data.buffer_state import PromptCodec

__all__ = ["ReplayBuffer", "PromptReplay"]


class ReplayBuffer:
    """Prompts by key: ``{key: [priority, prompt, last_replayed_step, uses]}`` (pure bookkeeping, no torch)."""

    def __init__(self, capacity: int, cooldown: int, max_reuse: int):
        self.capacity, self.cooldown, self.max_reuse = capacity, cooldown, max_reuse
        self.entries: dict[str, list] = {}

    def update(self, key: str, rate: float, prompt, low: float, high: float) -> None:
        """A prompt just trained with pass rate ``rate``: in the buffer if medium, out otherwise."""
        if not (low <= rate <= high):
            self.entries.pop(key, None)
            return
        prio = abs(rate - 0.5)
        if key in self.entries:
            self.entries[key][0], self.entries[key][1] = prio, prompt
        else:
            self.entries[key] = [prio, prompt, None, 0]
        if len(self.entries) > self.capacity:  # the worst priority (then the oldest key) leaves
            worst = max(self.entries, key=lambda k: (self.entries[k][0], -list(self.entries).index(k)))
            del self.entries[worst]

    def take(self, n: int, step: int, exclude: set) -> list:
        """Up to ``n`` prompts to replay at ``step`` (best priority first; ties: insertion order)."""
        ok = [k for k, (p, _, last, uses) in self.entries.items()
              if k not in exclude and (last is None or step - last > self.cooldown)]
        ok.sort(key=lambda k: self.entries[k][0])  # stable: insertion order breaks ties
        out = []
        for k in ok[:n]:
            e = self.entries[k]
            e[2], e[3] = step, e[3] + 1
            out.append(e[1])
            if e[3] >= self.max_reuse:
                del self.entries[k]
        return out


class PromptReplay(VLMMethod):
    name = "prompt_replay"
    needs_whole_groups = True  # a group's pass rate
    state_per_process = True  # the buffer holds this process's groups' prompts

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.prompt_replay
        if o.enabled and not (0.0 <= o.fraction <= 1.0 and 0.0 <= o.low <= o.high <= 1.0):
            raise ValueError("methods.prompt_replay: need 0 <= fraction <= 1 and 0 <= low <= high <= 1")
        if o.enabled and (o.capacity < 1 or o.max_reuse < 1 or o.cooldown < 0):
            raise ValueError("methods.prompt_replay: need capacity >= 1, max_reuse >= 1, cooldown >= 0")

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.o = o = cfg.methods.prompt_replay
        self.buffer = ReplayBuffer(o.capacity, o.cooldown, o.max_reuse)
        self._replayed = 0

    def before_rollout(self, step: int, prompts: list) -> list:
        n = int(round(self.o.fraction * len(prompts)))
        if n == 0 or not self.buffer.entries:
            self._replayed = 0
            return prompts
        here = {sample_id(pp.sample) for _, pp, _ in prompts}
        got = self.buffer.take(n, step, here)
        self._replayed = len(got)
        out = list(prompts)
        for j, pp in enumerate(got):  # the last slots take the replayed prompts (their positions, fresh seeds)
            pos, _, gens = out[len(out) - len(got) + j]
            out[len(out) - len(got) + j] = (pos, pp, gens)
        return out

    def on_advantages(self, rb):
        if rb.n == 0 or rb.prompts is None:
            return rb
        acc = self.run.accuracy(rb.texts, rb.samples, rb.rewards)
        rows = ~rb.is_offpolicy & (rb.valid if rb.valid is not None else torch.ones(rb.n, dtype=torch.bool))
        rates = group_pass_rates(acc, rb.group_ids, rows, self.o.correct_threshold)
        first = {}
        for i, g in enumerate(rb.group_ids.tolist()):
            first.setdefault(g, i)
        for g, p in rates.items():
            pp = rb.prompts[first[g]]
            self.buffer.update(sample_id(pp.sample), p, pp, self.o.low, self.o.high)
        return rb

    def end_of_step(self, rb, metrics: dict) -> None:
        metrics["prompt_replay/replayed"] = float(self._replayed)
        metrics["prompt_replay/buffer"] = float(len(self.buffer.entries))

    def state_dict(self) -> dict:
        codec = PromptCodec(self.run.all_samples, self.run.task)
        return {"entries": [[key, prio, codec.prompt_state(pp), last, uses]
                            for key, (prio, pp, last, uses) in self.buffer.entries.items()]}

    def load_state_dict(self, sd: dict) -> None:
        codec = PromptCodec(self.run.all_samples, self.run.task)
        self.buffer.entries = {key: [float(prio), codec.prompt_from_state(ps), None if last is None else int(last),
                                     int(uses)] for key, prio, ps, last, uses in sd["entries"]}
