"""Shared engine layer used by both trainers (``mmgrpo.vlm.train`` for Qwen-VL policies, ``flow_grpo`` for
flow-matching generators): functions and small classes, not a base trainer class.

* :mod:`mmgrpo.engine.errors` - one exception family for both trainers and both CLIs;
* :mod:`mmgrpo.engine.dist` - cross-process reductions (sum / max / any / gather / broadcast), identities
  without a process group;
* :mod:`mmgrpo.engine.reward_calls` - reward calls with retries, per-attempt timeouts and exponential back-off;
* :mod:`mmgrpo.engine.groups` - valid members per group (degenerate-group counting).
* :mod:`mmgrpo.engine.parallel` - gradient exchange over accelerate (hand-summed or through the prepared
  engine: DDP / FSDP2 / DeepSpeed) and the sampling context for sharded parameters.
* :mod:`mmgrpo.engine.checkpoint` - the one checkpoint format (replicated entries + sharded tensors through
  torch.distributed.checkpoint, resumable on another process count) and the skip-and-halt state.

The time budget both trainers use is :class:`mmgrpo.utils.budget.TimeBudget`.
Kept import-light (no torch at package import) so the CLIs can use it before training starts.
"""
