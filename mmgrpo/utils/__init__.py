"""Generic helpers both trainers use: ``config`` (dataclass + YAML + key=value), ``checkpoint`` (atomic checkpoints,
RNG state), ``logging`` (tensorboard / JSONL / PNG), ``seeding``, ``budget``, ``schedule``, ``signals``, ``runlock``,
``export``, ``master_weights``, ``exit_codes``.

Import the submodules directly; this package imports nothing (``mmgrpo.utils.config`` never imports torch, so the
CLIs print ``--help`` at once).
"""
