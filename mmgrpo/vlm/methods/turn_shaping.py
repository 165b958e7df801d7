r"""Per-turn shaping for multi-turn tool rollouts (:mod:`mmgrpo.vlm.tools.rollout`): a policy turn whose tool calls
failed (bad arguments, unknown tool, malformed block, over a budget: the tool turn after it holds the ``Error: ...``
texts :func:`mmgrpo.vlm.tools.base.call_tool` writes) is penalised on its own tokens, not on the whole rollout.

The final reward's group advantage :math:`A_i` stays as it is; turn k of row i gets a shaping value
:math:`s_{i,k} = -p \cdot f_{i,k}` (p = ``methods.turn_shaping.failure_penalty``, :math:`f_{i,k}` = failed calls
answered in the tool turn after turn k), applied through an extra policy-gradient term on that turn's tokens

.. math:: L_{shape} = -\frac{1}{N} \sum_i \sum_k \sum_{t \in \text{turn } k} s_{i,k}\,
          \frac{\pi_\theta(o_{i,t})}{\pi_{old}(o_{i,t})}

(N = the step's loss tokens over all processes, so the term is on the token-mean scale). In value the ratio is 1
on-policy; the gradient is :math:`-(s_{i,k}/N)\nabla\log\pi` on those tokens: a failed call makes the tokens that
wrote it less likely, whatever the answer's reward. Rows without failures are untouched. Our design (no paper's
formula): a minimal per-turn credit signal, separate from the group-normalised final reward.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from mmgrpo.vlm.methods.base import VLMMethod
from mmgrpo.vlm.tools.rollout import turn_spans

__all__ = ["turn_failures", "shaping_values", "token_pg_term", "TurnShaping"]

FAILURE_MARK = "Error: "  # how call_tool / the rollout begin a failed call's text


def turn_failures(ids: torch.Tensor, loss_mask: torch.Tensor, completion_mask: torch.Tensor,
                  decode: Callable[[list[int]], str]) -> list[tuple[tuple[int, int], int]]:
    """Per policy turn of one row: ((start, end), failed calls in the tool turn that follows it)."""
    spans = turn_spans(loss_mask)
    n = int(completion_mask.sum())
    out = []
    for k, (s, e) in enumerate(spans):
        nxt = spans[k + 1][0] if k + 1 < len(spans) else n
        tool = decode([int(x) for x in ids[e:nxt]]) if nxt > e else ""
        out.append(((s, e), tool.count(FAILURE_MARK)))
    return out


def shaping_values(turns: Sequence[tuple[tuple[int, int], int]], T: int, penalty: float) -> torch.Tensor:
    """(T,) float: -penalty x failures on the tokens of each turn, 0 elsewhere."""
    v = torch.zeros(T)
    for (s, e), f in turns:
        if f:
            v[s:e] = -penalty * f
    return v


def token_pg_term(logp: torch.Tensor, old_logp: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                  n_total: float) -> torch.Tensor:
    """:math:`-\\frac{1}{N}\\sum_{i,t} m_{i,t}\\, v_{i,t}\\, e^{\\log\\pi-\\log\\pi_{old}}` (scalar)."""
    m = mask.bool()
    ratio = torch.exp(torch.where(m, logp - old_logp, torch.zeros_like(logp)))
    return -(values.to(logp.dtype) * ratio * m.to(logp.dtype)).sum() / max(float(n_total), 1.0)


class TurnShaping(VLMMethod):
    """``methods.turn_shaping.enabled`` (see the module docstring)."""

    name = "turn_shaping"

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.turn_shaping
        if not o.enabled:
            return
        if not cfg.tools.enabled:
            raise ValueError("methods.turn_shaping needs tools.enabled=true (multi-turn tool rollouts)")
        if o.failure_penalty < 0:
            raise ValueError(f"methods.turn_shaping.failure_penalty must be >= 0, got {o.failure_penalty}")

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.o = cfg.methods.turn_shaping
        self._v, self._n, self._turns = None, 0.0, 0

    def on_logprobs(self, rb) -> None:
        from mmgrpo.engine.dist import global_sum

        tok = self.run.policy.processor.tokenizer
        N, T = rb.completion_ids.shape
        self._v = torch.zeros(N, T)
        self._turns = 0
        for i in range(N):
            turns = turn_failures(rb.completion_ids[i], rb.loss_mask[i], rb.completion_mask[i], tok.decode)
            self._v[i] = shaping_values(turns, T, self.o.failure_penalty)
            self._turns += sum(1 for _, f in turns if f)
        self._n = global_sum(float(rb.loss_mask.sum()))

    def on_loss(self, li, loss):
        if self._v is None or li.index is None or not bool(li.mask.any()):
            return loss
        T = li.logp.shape[1]
        v = self._v[li.index.cpu(), :T].to(li.logp.device)
        return loss + token_pg_term(li.logp, li.old_logp, v, li.mask, self._n)

    def end_of_step(self, rb, metrics: dict) -> None:
        metrics["turn_shaping/penalised_turns"] = float(self._turns)
