"""Truncated importance sampling against the vLLM engine (TRL's ``vllm_importance_sampling_correction``).

With ``rollout.backend=vllm`` the completions come from the engine, whose log-probs differ slightly from the
trainer's. Each on-policy token's loss is weighted by ``core.importance.truncated_is_weights``,
:math:`\\min(\\exp(\\log\\pi_{old} - \\log\\pi_{engine}), \\text{cap})` (``rollout.vllm_is_cap``), multiplied into
``rb.token_weights``; injected off-policy rows have no engine log-probs (weight 1). Logs ``rollout/is_*``.
"""
from __future__ import annotations

from mmgrpo.core.importance import is_weight_metrics, truncated_is_weights
from mmgrpo.vlm.methods.base import VLMMethod

__all__ = ["VLLMImportanceSampling"]


class VLLMImportanceSampling(VLMMethod):
    name = "vllm_is"
    needs_old_logp = True

    def on_logprobs(self, rb):
        cap = self.cfg.rollout.vllm_is_cap
        # the engine's tokens that enter the loss: a multi-turn row's tool turns have no engine log-probs
        mask = rb.completion_mask * rb.loss_mask.clamp(max=1) * (~rb.is_offpolicy).long().unsqueeze(1)
        w = truncated_is_weights(rb.old_logp, rb.rollout_logp, mask, cap)
        rb.token_weights = w if rb.token_weights is None else rb.token_weights * w
        rb.info.update(is_weight_metrics(w, mask, cap))

    def end_of_step(self, rb, m):
        for k, v in rb.info.items():
            if k.startswith("rollout/is_"):
                m[k] = v
