"""The Qwen-VL front-end of mmgrpo: GRPO and its variants for Qwen2/2.5/3-VL video and image policies.

``train`` (the trainer loop and its pieces), ``models`` (family adapters, rollout, tiny models, vLLM), ``rewards``
(answer parsers and scores), ``methods`` (one module per method, hooks the loop calls), ``data`` (JSONL schema,
loaders, converters, prompt templates), ``config`` / ``cli`` (``mmgrpo train``), ``sft`` (answer-only SFT) and
``timeline`` (temporal-grounding pictures).  It builds on the shared top level of :mod:`mmgrpo`; ``flow_grpo`` does
not import it (except its Qwen-VL judge rewards and the tiny Qwen-Image text encoder, which are Qwen-VL models).
Nothing heavy is imported here.
"""
