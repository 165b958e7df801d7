"""GPU acceptance check (issue #36): one command that measures what only a GPU can show, section by section.

    bash scripts/gpu_check.sh OUT_DIR                 # on the GPU machine (installs .gpu_wheels/ first)
    bash scripts/gpu_check.sh OUT_DIR --dry-run       # CPU, tiny widths: the same sections (a test runs this)

Writes ``OUT_DIR/report.json`` (every figure, with how it was measured), ``OUT_DIR/gpu_check.log`` (the sections'
output) and ``OUT_DIR/summary.md`` (the figures against the targets, ready for docs/performance.md's "Verified on
GPU" table). docs/gpu_check.md says how to run it and what each figure means.

Layout: :mod:`.run` (the sections table, budgets, the total deadline, one subprocess per section), :mod:`.common`
(the section context, phase timers, memory probes, FLOP counts, the model folder builder), :mod:`.vlm` (Qwen2.5-VL
GRPO steps, TRL side by side), :mod:`.flow` (FLUX / SD3.5 / Wan2.1 epochs), :mod:`.envinfo` (environment and the
``pytest -m gpu`` tests).
"""
