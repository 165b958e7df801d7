"""Synthetic benchmarks with exactly known ground truth that import no front-end.

``t2i`` (Mini-GenEval prompts + programmatic verifier) and ``t2v`` (motion prompts + verifier) feed ``flow_grpo``'s
``mini_geneval`` / ``motion_verifier`` rewards; ``shapes`` holds the colours and shape masks that ``t2v`` shares with
the temporal-grounding benchmarks of the VLM front-end (:mod:`mmgrpo.vlm.synthetic`, which write the VLM's JSONL);
``look_again`` (the answer is only in a crop of the source) and ``think_or_not`` (a short thought is needed for half
the prompts: TON's task) are image benchmarks of the VLM front-end.
Pure numpy; importable from an installed wheel (no file-path loading).
"""
