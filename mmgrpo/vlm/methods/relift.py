r"""ReLIFT (Ma et al. 2025, "Learning What Reinforcement Learning Can't: Interleaved Online Fine-Tuning for Hardest
Questions", arXiv 2506.07527): RL, with supervised fine-tuning on the questions the policy keeps failing
(``methods.relift``).

After each step's advantages, every group whose pass rate (share of its on-policy rows with accuracy >=
``correct_threshold``; :func:`mmgrpo.vlm.methods.pass_rate_filter.group_pass_rates`) is at most ``hard_threshold``
(default 0: every answer wrong) puts its prompt in a buffer of hardest questions (once per sample; at most
``capacity``, oldest out). Whenever the buffer holds ``sft_batch`` prompts, the ``sft_batch`` oldest leave it (one
batch per update; the rest wait for the next) and their
demonstrations (the ground-truth completion as the prompt asks for it) join the *current* update as expert rows with
advantage 0, and that update's loss is

.. math:: \mathcal L = (1-\mu)\,\mathcal L_{RL} + \mu\,\mathcal L_{SFT}, \qquad
          \mathcal L_{SFT} = -\frac{1}{|E|}\sum_{t\in E}\log p_t

(:func:`mmgrpo.vlm.methods.chord.chord_loss` with ``token_weight="none"``; :math:`\mathcal L_{RL}` over the on-policy
rows' own counts, E the demonstration tokens, :math:`\mu` = ``sft_coef``); other updates are plain RL.

Deviation (stated): the paper interleaves separate SFT optimizer steps on the buffered questions; here the SFT step
is folded into the next RL update as the loss term above (one optimizer step, both terms), which needs no second
optimizer loop in the recipe. The demonstrations are the data's ground truths (the paper collects high-quality
solutions). The buffer is checkpointed (each process's own, its prompts as references to their samples:
:mod:`mmgrpo.vlm.data.buffer_state`). Metrics: ``relift/hard_groups`` (this step), ``relift/buffer``,
``relift/sft_rows``.
"""
from __future__ import annotations

import torch

from mmgrpo.vlm.data.task import sample_id
from mmgrpo.vlm.methods.base import LossInputs, PolicyLoss, VLMMethod
from mmgrpo.vlm.methods.chord import chord_loss
from mmgrpo.vlm.methods.pass_rate_filter import group_pass_rates
from mmgrpo.vlm.methods.tempsamp_r1 import ground_truth_row
from mmgrpo.vlm.data.batch import RolloutBatch, cat_batches
from mmgrpo.vlm.data.buffer_state import PromptCodec

__all__ = ["hardest_groups", "ReLIFT"]


def hardest_groups(rates: dict[int, float], threshold: float) -> list[int]:
    """Group ids whose pass rate is at most ``threshold`` (ascending id)."""
    return sorted(g for g, p in rates.items() if p <= threshold)


class ReLIFT(VLMMethod):
    name = "relift"
    needs_whole_groups = True
    state_per_process = True  # the buffer holds this process's hardest prompts

    @classmethod
    def check(cls, cfg) -> None:
        o = cfg.methods.relift
        if not o.enabled:
            return
        if o.sft_batch < 1 or o.capacity < o.sft_batch or not 0.0 <= o.sft_coef <= 1.0:
            raise ValueError("methods.relift: need sft_batch >= 1, capacity >= sft_batch, 0 <= sft_coef <= 1")
        clash = [n for n in ("tempsamp_r1", "luffy", "chord", "sample_buffer") if getattr(cfg.methods, n).enabled]
        if clash:
            raise ValueError(f"methods.relift trains its off-policy rows as demonstrations; it cannot run with "
                             f"methods.{clash[0]} (which adds off-policy rows of its own)")

    def __init__(self, cfg, run):
        super().__init__(cfg, run)
        self.o = cfg.methods.relift
        self.buffer: dict[str, object] = {}  # sample id -> prepared prompt (insertion order = age)
        self._mu = 0.0
        self._hard = self._sft_rows = 0
        self._next_id = -1

    def on_advantages(self, rb):
        if rb.n == 0 or rb.prompts is None:
            return rb
        acc = self.run.accuracy(rb.texts, rb.samples, rb.rewards)
        rows = ~rb.is_offpolicy & (rb.valid if rb.valid is not None else torch.ones(rb.n, dtype=torch.bool))
        rates = group_pass_rates(acc, rb.group_ids, rows, self.o.correct_threshold)
        hard = hardest_groups(rates, self.o.hard_threshold)
        self._hard += len(hard)
        gl = rb.group_ids.tolist()
        for g in hard:
            pp = rb.prompts[gl.index(g)]
            self.buffer.setdefault(sample_id(pp.sample), pp)
        while len(self.buffer) > self.o.capacity:
            self.buffer.pop(next(iter(self.buffer)))
        if len(self.buffer) < self.o.sft_batch:
            return rb
        keys = list(self.buffer)[:self.o.sft_batch]
        demo = self._demo_batch([self.buffer.pop(k) for k in keys], rb)
        self._mu, self._sft_rows = float(self.o.sft_coef), self._sft_rows + demo.n
        self.trains_without_advantages = self._mu > 0  # this update has an SFT term
        out = cat_batches([rb, demo], self.run.pad_id)
        out.info = dict(rb.info)
        return out

    def _demo_batch(self, prompts: list, like: RolloutBatch) -> RolloutBatch:
        """Expert rows (advantage 0, off-policy) holding the prompts' ground truths, each its own group."""
        rows = [ground_truth_row(self.run, pp) for pp in prompts]
        T = max(len(r["ids"]) for r in rows)
        pad = lambda x, v: torch.nn.functional.pad(x, (0, T - x.shape[0]), value=v)  # noqa: E731
        n = len(rows)
        ids = torch.stack([pad(r["ids"], self.run.pad_id) for r in rows])
        mask = torch.stack([pad(r["mask"].long(), 0) for r in rows])
        gids = torch.arange(self._next_id, self._next_id - n, -1, dtype=torch.long)
        self._next_id -= n
        no = torch.zeros(n, dtype=torch.bool)
        return RolloutBatch(items=[pp.item for pp in prompts], samples=[pp.sample for pp in prompts],
                            texts=[r["text"] for r in rows], completion_ids=ids, completion_mask=mask,
                            loss_mask=mask.clone(), group_ids=gids, is_offpolicy=torch.ones(n, dtype=torch.bool),
                            truncated=no, parse_failed=no.clone(),
                            rewards={k: torch.full((n,), float("nan"), dtype=v.dtype) for k, v in like.rewards.items()},
                            rollout_logp=torch.zeros(n, T), advantages=torch.zeros(n), reward_used=torch.zeros(n),
                            zero_std=no.clone(), valid=torch.ones(n, dtype=torch.bool), prompts=list(prompts))

    def loss(self) -> PolicyLoss:
        return PolicyLoss(fn=self._loss)

    def _loss(self, li: LossInputs):
        return chord_loss(li, self._mu, token_weight="none")

    def end_of_step(self, rb, metrics: dict) -> None:
        metrics["relift/hard_groups"] = float(self._hard)
        metrics["relift/buffer"] = float(len(self.buffer))
        metrics["relift/sft_rows"] = float(self._sft_rows)
        self._hard = self._sft_rows = 0
        self._mu, self.trains_without_advantages = 0.0, False  # the next step is plain RL unless it gets demos

    def state_dict(self) -> dict:
        codec = PromptCodec(self.run.all_samples, self.run.task)
        return {"buffer": [[key, codec.prompt_state(pp)] for key, pp in self.buffer.items()], "next_id": self._next_id}

    def load_state_dict(self, sd: dict) -> None:
        codec = PromptCodec(self.run.all_samples, self.run.task)
        self.buffer = {key: codec.prompt_from_state(ps) for key, ps in sd["buffer"]}  # in order: oldest first
        self._next_id = int(sd["next_id"])
