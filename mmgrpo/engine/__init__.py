"""Shared engine layer used by both trainers (``mmgrpo.train`` for Qwen-VL policies, ``flow_grpo`` for
flow-matching generators): functions and small classes, not a base trainer class.

So far: :mod:`mmgrpo.engine.errors` (one exception family for both trainers and both CLIs).
Kept import-light (no torch at package import) so the CLIs can use it before training starts.
"""
