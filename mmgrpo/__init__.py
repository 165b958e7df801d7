"""mmgrpo: GRPO for multimodal models.

Layout -- the top level is what both front-ends share; each front-end is one subpackage:

* shared: :mod:`mmgrpo.core` (group advantages, losses, step credit), :mod:`mmgrpo.engine` (reward calls, errors,
  cross-process reductions, group counting), :mod:`mmgrpo.utils` (config, checkpoints, logging, seeding, budget,
  memory planner, ...), :mod:`mmgrpo.video` (decode / sample / write videos, Qwen-VL video inputs, also used by the
  flow video judge) and :mod:`mmgrpo.synthetic` (synthetic benchmarks with exact ground truth for both front-ends);
* :mod:`mmgrpo.vlm`: the Qwen-VL front-end (``train``, ``models``, ``rewards``, ``methods``, ``data``, ``config``,
  ``cli``, ``sft``);
* ``flow_grpo`` (a sibling package): the SD3 / FLUX front-end, built on the shared part only.
"""

__version__ = "0.1.0"
