"""Qwen-VL policies: per-family adapters (``adapters``), hub-free tiny builders (``tiny``), rollout backends and
token log-probs (``rollout``, ``vllm_backend``, ``prefix_group``, ``chunked``).

Import the submodules directly; this package imports nothing.
"""
