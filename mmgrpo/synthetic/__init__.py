"""Synthetic benchmarks with exactly known ground truth, shared by both front-ends.

``tvg`` (videos of moving shapes with known event spans, temporal grounding) and ``grounding`` (its multi-event
variant) feed the VLM front-end; ``t2i`` (Mini-GenEval prompts + programmatic verifier) and ``t2v`` (motion prompts +
verifier) feed ``flow_grpo``'s ``mini_geneval`` / ``motion_verifier`` rewards.  ``t2v`` reuses ``tvg``'s shapes.
Pure numpy; importable from an installed wheel (no file-path loading).
"""
